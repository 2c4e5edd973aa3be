//! The pipeline cache, keyed by a typed [`PipelineKey`]; kernels go through
//! [`preprocess`](super::preprocess::preprocess) first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::context::GpuContext;
use super::ops::{ActQuant, ElemKind, MatmulKind, QFormat, RowOpKind};
use super::preprocess::preprocess;
use crate::Result;

/// Feature-dependent variant of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Variant {
    /// Use `enable f16;` and `f16` loads.
    pub f16: bool,
    /// Use subgroup reductions instead of workgroup shared memory.
    pub subgroups: bool,
    /// The KV cache holds F32 instead of F16 (`kv_type.wgsl`'s `#if KV_F32`; only the
    /// kernels that store or read the cache look at it).
    pub kv_f32: bool,
}

/// What a ternary or float matvec does with its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `out = y`.
    Store,
    /// `out += y` (residual add for the o- and down-projections).
    Add,
}

impl Epilogue {
    /// The kernels' `EPILOGUE` override: 0 stores, 1 adds.
    fn constant(self) -> (&'static str, f64) {
        ("EPILOGUE", if self == Epilogue::Add { 1.0 } else { 0.0 })
    }
}

/// The token rows an F16 matvec launch multiplies (`f16_matvec.wgsl` entry points).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum F16Rows {
    /// `main`: one token row per workgroup row (y).
    Each,
    /// `last`: only the step's last token row, into output row 0.
    Last,
    /// `main8`: eight token rows per workgroup (each weight row read once for eight tokens);
    /// the token count comes from the step uniform.
    Eight,
    /// `decode`: one token row held in workgroup memory, 64 weight rows per workgroup
    /// (the same sums as `main`).
    Decode,
    /// `f16_coop.wgsl` `rows32`: 128 weight rows × 32 token rows per workgroup on
    /// cooperative matrices, the token rows rounded to F16 (needs the coop variant).
    Coop32,
}

/// The kernels and their small integer specialisations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `embed.wgsl`: F16 embedding rows → f32.
    Embed,
    /// `rmsnorm.wgsl`: RMSNorm, then int8 quantization (`quant`) or f32 output.
    RmsNorm {
        /// Quantize to packed int8 + per-token scale instead of writing f32.
        quant: bool,
    },
    /// `ternary.wgsl`: I2_S × int8.
    Ternary {
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
        /// Store or add.
        epilogue: Epilogue,
        /// The 4-tokens-per-workgroup prefill entry point.
        batch: bool,
    },
    /// `ternary_mm.wgsl` / `ternary_coop.wgsl`: the tiled I2_S × int8 prompt-batch product.
    TernaryMatmul {
        /// Portable or cooperative-matrix kernel.
        kind: MatmulKind,
        /// Store or add.
        epilogue: Epilogue,
        /// The coop kernel's 128-token entry point (`matmul_wide`).
        wide: bool,
    },
    /// `ternary_coop.wgsl` `matmul_wide3` (`#if FUSED3`): the 128-token coop tiles of three
    /// I2_S matrices that read the same activations (q, k, v), in one launch.
    TernaryCoop3,
    /// `ternary_sgmat.wgsl` `matmul_tiled` with `#if FUSED3`: the subgroup-matrix tiles of
    /// q, k and v in one launch (browser builds).
    TernarySgmat3,
    /// `ternary_coop.wgsl` `matmul_wide_glu` (`#if GLU`): the 128-token coop tiles of gate
    /// and up rows together, `act(gate) · up` in the epilogue.
    TernaryCoopGlu {
        /// The gate activation (ReLU² or SiLU).
        act: GluAct,
    },
    /// `ternary_coop.wgsl` `#if SPLIT`: the 128-token coop tiles' K blocks shared out among
    /// `sms` workgroups (`matmul_split`), or the sum and scaling of each tile's segments
    /// (`split_sum`).
    TernaryCoopSplit {
        /// The workgroups the blocks are shared among (0: three a tile).
        sms: u32,
        /// Store or add (`split_sum`).
        epilogue: Epilogue,
        /// `split_sum` rather than `matmul_split`.
        sum: bool,
    },
    /// `ternary_mm.wgsl` `matmul_narrow3` / `matmul_narrow_glu`: the narrow tiles of several
    /// I2_S matrices that read the same activations, in one launch.
    TernaryNarrowFused {
        /// The gate activation (`matmul_narrow_glu`), or none (`matmul_narrow3`: q, k, v).
        glu: Option<GluAct>,
    },
    /// `ternary.wgsl` `matvec_glu`: gate and up I2_S matvecs and `act(g)·u`, fused (decode).
    TernaryGlu {
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
        /// The gate activation.
        act: GluAct,
    },
    /// `ternary_decode.wgsl`: the fast single-token path (norm + int8 quantization in the
    /// matvec's prologue), and its standalone norm for steps of several tokens.
    TernaryDecode {
        /// Which entry point.
        entry: DecodeEntry,
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
        /// Store or add (`matvec_n`).
        epilogue: Epilogue,
        /// The gate activation (`glu_n`).
        act: GluAct,
        /// The row width, the kernel's constant `K`.
        k: u32,
    },
    /// `ternary.wgsl` `matvec3`: three I2_S matvecs sharing their input (q, k, v), one launch.
    Ternary3 {
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
    },
    /// `f16_matvec.wgsl`: F16 weight shard × f32 hidden (LM head).
    F16Matvec {
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
        /// Round the hidden state to F16 first (single-token decode numerics).
        round_x: bool,
        /// Which token rows (entry point).
        rows: F16Rows,
    },
    /// `rope_kv.wgsl`: NEOX RoPE of q and k, then k and v stored in the F16 KV cache.
    RopeKv,
    /// `rope_table.wgsl`: (cos θ, sin θ) of every rotation pair at every cache position.
    RopeTable,
    /// `attention.wgsl`: causal GQA attention over the F16 KV cache.
    Attention {
        /// Which entry point.
        stage: AttnStage,
        /// Round the probabilities to F16 before P·V (single-token decode numerics; only
        /// [`AttnStage::ProbsPv`] reads it).
        round_p: bool,
        /// The "fast" numerics policy: `prefill` leaves decode rows to [`Kernel::AttentionFast`].
        fast: bool,
        /// `prefill` leaves every other row to [`Kernel::AttentionPrompt`].
        tiled: bool,
    },
    /// `attention_prompt.wgsl`: a prompt step's attention over 32 × 32 tiles.
    AttentionPrompt {
        /// P·V on cooperative matrices (`#if COOP_PV`).
        coop: bool,
        /// The head width (64 or 128), the kernel's constant `HD`.
        head_dim: u32,
    },
    /// `attention_fast.wgsl`: decode rows, split over KV pages and merged in one launch.
    AttentionFast {
        /// `split` rotates q and k and stores the new key and value itself (a single-token
        /// step; `rope_kv.wgsl` does not run).
        rope: bool,
        /// The head width, the kernel's constant `HD`.
        head_dim: u32,
        /// Query heads a kv head, the kernel's constant `GQ`.
        group: u32,
    },
    /// `glu.wgsl`: `gate = act(gate) · up`.
    Glu {
        /// The activation.
        act: GluAct,
    },
    /// `select.wgsl`: top-k (argmax is k = 1); `partial` is the per-chunk pass.
    Select {
        /// Candidates kept (1..=64).
        k: u32,
        /// First pass (per chunk) or second pass (over the candidates).
        partial: bool,
    },
    /// `read_bw.wgsl`: the read-bandwidth probe.
    ReadProbe,
    /// `qmatvec.wgsl`: GGUF-format weights × f32 / Q8_0 / Q8_K activations.
    QMatvec {
        /// Weight format.
        fmt: QFormat,
        /// Threads per weight row (power of two, 1..=256).
        tpr: u32,
        /// Store or add.
        epilogue: Epilogue,
        /// The 4-tokens-per-workgroup prefill entry point.
        batch: bool,
        /// Round f32 activations through F16 first (F16 weights only).
        round_x: bool,
    },
    /// `qmatvec.wgsl` `matmul_tiled` (`#if TILED`): block-format weights × 64-token tiles
    /// of Q8 activations, each weight unit decoded once a tile (prompts).
    QMatmulTiled {
        /// Weight format (a block format: its activations are Q8_0, Q8_1 or Q8_K).
        fmt: QFormat,
        /// Store or add.
        epilogue: Epilogue,
    },
    /// `qmatvec.wgsl` `gather`: rows of a GGUF-format matrix dequantized to f32.
    QGather {
        /// Weight format.
        fmt: QFormat,
    },
    /// `quant_act.wgsl`: Q8_0 or Q8_K activation quantization.
    QuantAct {
        /// Which quantizer.
        kind: ActQuant,
    },
    /// `rowops.wgsl`: LayerNorm, bias, GELU, position embeddings, slices.
    RowOp {
        /// Which entry point.
        op: RowOpKind,
    },
    /// `window_attention.wgsl`: sliding-window attention.
    WindowAttention,
    /// `elementwise.wgsl`: per-head RMSNorm, scale, residual add.
    Elementwise {
        /// Which entry point.
        op: ElemKind,
    },
}

/// The entry points of `ternary_decode.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeEntry {
    /// `norm_quant`: norm + int8 quantization of each token row, written out.
    NormQuant,
    /// `matvec_n`: one matrix.
    Matvec,
    /// `glu_n`: gate and up matrices and `act(g)·u`.
    Glu,
    /// `matvec3_n`: three matrices (q, k, v).
    Matvec3,
}

/// The entry points of `attention.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnStage {
    /// Decode pass 1: scores and per-chunk (max, Σexp).
    Scores,
    /// Decode pass 2: global softmax from the chunk stats, P·V per chunk.
    ProbsPv,
    /// Decode pass 3: sum of the chunks' partial outputs.
    Merge,
    /// Prompt batch: one workgroup per (head, token), online softmax.
    Prefill,
}

/// The activation of the gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluAct {
    /// `relu(g)²` (BitNet b1.58).
    ReluSqr,
    /// `g·sigmoid(g)` (1bitLLM BitNet).
    Silu,
    /// GELU, tanh form (Gemma 3's GEGLU).
    GeluTanh,
}

/// A compiled pipeline's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// Which kernel, with its specialisations.
    pub kernel: Kernel,
    /// Feature variant.
    pub variant: Variant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    Embed,
    RmsNorm,
    Ternary,
    TernaryDecode,
    TernaryMm,
    TernaryCoop,
    /// ternary_sgmat.wgsl (browser builds only).
    TernarySgmat,
    /// ternary_sgmat.wgsl with `#if FUSED3` on.
    TernarySgmat3,
    /// ternary_coop.wgsl with `#if FUSED3` on.
    TernaryCoop3,
    /// ternary_coop.wgsl with `#if SPLIT` on.
    TernaryCoopSplit,
    /// ternary_coop.wgsl with `#if GLU` on.
    TernaryCoopGlu,
    F16Matvec,
    F16Coop,
    RopeKv,
    RopeTable,
    Attention,
    AttentionFast,
    /// attention_fast.wgsl with `#if ROPE` on.
    AttentionFastRope,
    AttentionPrompt,
    /// attention_prompt.wgsl with `#if COOP_PV` (and `F32_TILES`) on.
    AttentionPromptCoop,
    Glu,
    Select,
    ReadProbe,
    QMatvec(QFormat),
    /// qmatvec.wgsl with `#if TILED` on.
    QMatvecTiled(QFormat),
    QuantAct,
    RowOps,
    Elementwise,
    WindowAttention,
}

impl Source {
    fn text(self) -> (&'static str, &'static str) {
        match self {
            Source::Embed => ("embed.wgsl", include_str!("kernels/embed.wgsl")),
            Source::RmsNorm => ("rmsnorm.wgsl", include_str!("kernels/rmsnorm.wgsl")),
            Source::Ternary => ("ternary.wgsl", include_str!("kernels/ternary.wgsl")),
            Source::TernaryDecode => (
                "ternary_decode.wgsl",
                include_str!("kernels/ternary_decode.wgsl"),
            ),
            Source::TernaryMm => ("ternary_mm.wgsl", include_str!("kernels/ternary_mm.wgsl")),
            Source::TernaryCoop
            | Source::TernaryCoop3
            | Source::TernaryCoopSplit
            | Source::TernaryCoopGlu => (
                "ternary_coop.wgsl",
                include_str!("kernels/ternary_coop.wgsl"),
            ),
            Source::F16Matvec => ("f16_matvec.wgsl", include_str!("kernels/f16_matvec.wgsl")),
            Source::TernarySgmat | Source::TernarySgmat3 => (
                "ternary_sgmat.wgsl",
                include_str!("kernels/ternary_sgmat.wgsl"),
            ),
            Source::F16Coop => ("f16_coop.wgsl", include_str!("kernels/f16_coop.wgsl")),
            Source::RopeKv => ("rope_kv.wgsl", include_str!("kernels/rope_kv.wgsl")),
            Source::RopeTable => ("rope_table.wgsl", include_str!("kernels/rope_table.wgsl")),
            Source::Attention => ("attention.wgsl", include_str!("kernels/attention.wgsl")),
            Source::AttentionPrompt | Source::AttentionPromptCoop => (
                "attention_prompt.wgsl",
                include_str!("kernels/attention_prompt.wgsl"),
            ),
            Source::AttentionFast | Source::AttentionFastRope => (
                "attention_fast.wgsl",
                include_str!("kernels/attention_fast.wgsl"),
            ),
            Source::Glu => ("glu.wgsl", include_str!("kernels/glu.wgsl")),
            Source::Select => ("select.wgsl", include_str!("kernels/select.wgsl")),
            Source::ReadProbe => ("read_bw.wgsl", include_str!("kernels/read_bw.wgsl")),
            Source::QMatvec(_) | Source::QMatvecTiled(_) => {
                ("qmatvec.wgsl", include_str!("kernels/qmatvec.wgsl"))
            }
            Source::QuantAct => ("quant_act.wgsl", include_str!("kernels/quant_act.wgsl")),
            Source::RowOps => ("rowops.wgsl", include_str!("kernels/rowops.wgsl")),
            Source::Elementwise => ("elementwise.wgsl", include_str!("kernels/elementwise.wgsl")),
            Source::WindowAttention => (
                "window_attention.wgsl",
                include_str!("kernels/window_attention.wgsl"),
            ),
        }
    }
}

impl Kernel {
    fn source(self) -> Source {
        match self {
            Kernel::Embed => Source::Embed,
            Kernel::RmsNorm { .. } => Source::RmsNorm,
            Kernel::Ternary { .. } | Kernel::TernaryGlu { .. } | Kernel::Ternary3 { .. } => {
                Source::Ternary
            }
            Kernel::TernaryDecode { .. } => Source::TernaryDecode,
            Kernel::TernaryNarrowFused { .. } => Source::TernaryMm,
            Kernel::TernaryCoop3 => Source::TernaryCoop3,
            Kernel::TernarySgmat3 => Source::TernarySgmat3,
            Kernel::TernaryCoopSplit { .. } => Source::TernaryCoopSplit,
            Kernel::TernaryCoopGlu { .. } => Source::TernaryCoopGlu,
            Kernel::TernaryMatmul { kind, .. } => match kind {
                MatmulKind::Portable | MatmulKind::Narrow => Source::TernaryMm,
                MatmulKind::Coop => Source::TernaryCoop,
                MatmulKind::SubgroupMatrix => Source::TernarySgmat,
            },
            Kernel::F16Matvec {
                rows: F16Rows::Coop32,
                ..
            } => Source::F16Coop,
            Kernel::F16Matvec { .. } => Source::F16Matvec,
            Kernel::RopeKv => Source::RopeKv,
            Kernel::RopeTable => Source::RopeTable,
            Kernel::Attention { .. } => Source::Attention,
            Kernel::AttentionFast { rope: true, .. } => Source::AttentionFastRope,
            Kernel::AttentionFast { .. } => Source::AttentionFast,
            Kernel::AttentionPrompt { coop: false, .. } => Source::AttentionPrompt,
            Kernel::AttentionPrompt { coop: true, .. } => Source::AttentionPromptCoop,
            Kernel::Glu { .. } => Source::Glu,
            Kernel::Select { .. } => Source::Select,
            Kernel::ReadProbe => Source::ReadProbe,
            Kernel::QMatvec { fmt, .. } | Kernel::QGather { fmt } => Source::QMatvec(fmt),
            Kernel::QMatmulTiled { fmt, .. } => Source::QMatvecTiled(fmt),
            Kernel::QuantAct { .. } => Source::QuantAct,
            Kernel::RowOp { .. } => Source::RowOps,
            Kernel::Elementwise { .. } => Source::Elementwise,
            Kernel::WindowAttention => Source::WindowAttention,
        }
    }

    fn entry_point(self) -> &'static str {
        match self {
            Kernel::Embed => "main",
            Kernel::RmsNorm { quant: true } => "rmsnorm_quant",
            Kernel::RmsNorm { quant: false } => "rmsnorm",
            Kernel::Ternary { batch: false, .. } => "matvec",
            Kernel::Ternary { batch: true, .. } => "matmul4",
            Kernel::TernaryMatmul {
                kind: MatmulKind::Narrow,
                ..
            } => "matmul_narrow",
            Kernel::TernaryMatmul { wide: false, .. } => "matmul_tiled",
            Kernel::TernaryMatmul { wide: true, .. } => "matmul_wide",
            Kernel::TernaryGlu { .. } => "matvec_glu",
            Kernel::Ternary3 { .. } => "matvec3",
            Kernel::TernaryCoop3 => "matmul_wide3",
            Kernel::TernarySgmat3 => "matmul_tiled",
            Kernel::TernaryCoopSplit { sum: false, .. } => "matmul_split",
            Kernel::TernaryCoopSplit { sum: true, .. } => "split_sum",
            Kernel::TernaryCoopGlu { .. } => "matmul_wide_glu",
            Kernel::TernaryNarrowFused { glu: None } => "matmul_narrow3",
            Kernel::TernaryNarrowFused { glu: Some(_) } => "matmul_narrow_glu",
            Kernel::TernaryDecode { entry, .. } => match entry {
                DecodeEntry::NormQuant => "norm_quant",
                DecodeEntry::Matvec => "matvec_n",
                DecodeEntry::Glu => "glu_n",
                DecodeEntry::Matvec3 => "matvec3_n",
            },
            Kernel::F16Matvec { rows, .. } => match rows {
                F16Rows::Each => "main",
                F16Rows::Last => "last",
                F16Rows::Eight => "main8",
                F16Rows::Decode => "decode",
                F16Rows::Coop32 => "rows32",
            },
            Kernel::RopeKv
            | Kernel::RopeTable
            | Kernel::Glu { .. }
            | Kernel::ReadProbe
            | Kernel::AttentionPrompt { .. }
            | Kernel::WindowAttention => "main",
            Kernel::Attention { stage, .. } => match stage {
                AttnStage::Scores => "scores_main",
                AttnStage::ProbsPv => "probs_pv",
                AttnStage::Merge => "merge",
                AttnStage::Prefill => "prefill",
            },
            Kernel::AttentionFast { .. } => "split",
            Kernel::Select { partial: true, .. } => "partial",
            Kernel::Select { partial: false, .. } => "merge",
            Kernel::QMatvec { batch: false, .. } => "matvec",
            Kernel::QMatvec { batch: true, .. } => "matmul4",
            Kernel::QGather { .. } => "gather",
            Kernel::QMatmulTiled { .. } => "matmul_tiled",
            Kernel::QuantAct { kind } => kind.entry_point(),
            Kernel::RowOp { op } => op.entry_point(),
            Kernel::Elementwise { op } => op.entry_point(),
        }
    }

    fn constants(self) -> Vec<(&'static str, f64)> {
        match self {
            Kernel::Embed
            | Kernel::RmsNorm { .. }
            | Kernel::RopeKv
            | Kernel::RopeTable
            | Kernel::ReadProbe => vec![],
            Kernel::Attention {
                stage,
                round_p,
                fast,
                tiled,
            } => match stage {
                AttnStage::ProbsPv => vec![("ROUND_P", if round_p { 1.0 } else { 0.0 })],
                AttnStage::Prefill => vec![
                    ("FAST", if fast { 1.0 } else { 0.0 }),
                    ("TILED", if tiled { 1.0 } else { 0.0 }),
                ],
                AttnStage::Scores | AttnStage::Merge => vec![],
            },
            Kernel::Glu { act } => vec![(
                "ACT",
                match act {
                    GluAct::ReluSqr => 0.0,
                    GluAct::Silu => 1.0,
                    GluAct::GeluTanh => 2.0,
                },
            )],
            Kernel::Ternary3 { tpr } => vec![("TPR", f64::from(tpr))],
            Kernel::TernaryNarrowFused { glu: None }
            | Kernel::TernaryCoop3
            | Kernel::TernarySgmat3 => vec![],
            Kernel::TernaryNarrowFused { glu: Some(act) } | Kernel::TernaryCoopGlu { act } => {
                vec![("ACT", if act == GluAct::Silu { 1.0 } else { 0.0 })]
            }
            Kernel::TernaryDecode {
                entry,
                tpr,
                epilogue,
                act,
                k,
            } => {
                let k = ("K", f64::from(k));
                match entry {
                    DecodeEntry::NormQuant => vec![k],
                    DecodeEntry::Matvec => vec![("TPR", f64::from(tpr)), epilogue.constant(), k],
                    DecodeEntry::Glu => vec![
                        ("TPR", f64::from(tpr)),
                        ("ACT", if act == GluAct::Silu { 1.0 } else { 0.0 }),
                        k,
                    ],
                    DecodeEntry::Matvec3 => vec![("TPR", f64::from(tpr)), k],
                }
            }
            Kernel::TernaryMatmul { epilogue, .. } => vec![epilogue.constant()],
            Kernel::TernaryCoopSplit { sms, epilogue, .. } => {
                vec![("SMS", f64::from(sms)), epilogue.constant()]
            }
            Kernel::TernaryGlu { tpr, act } => vec![
                ("TPR", f64::from(tpr)),
                ("ACT", if act == GluAct::Silu { 1.0 } else { 0.0 }),
            ],
            Kernel::Ternary { tpr, epilogue, .. } => {
                vec![("TPR", f64::from(tpr)), epilogue.constant()]
            }
            Kernel::F16Matvec {
                rows: F16Rows::Coop32,
                ..
            } => vec![],
            Kernel::F16Matvec { tpr, round_x, .. } => vec![
                ("TPR", f64::from(tpr)),
                ("ROUND_X", if round_x { 1.0 } else { 0.0 }),
            ],
            Kernel::Select { k, .. } => vec![("K", f64::from(k))],
            Kernel::QMatvec {
                fmt,
                tpr,
                epilogue,
                round_x,
                ..
            } => vec![
                ("FMT", f64::from(fmt.kernel_id())),
                ("TPR", f64::from(tpr)),
                epilogue.constant(),
                ("ROUND_X", if round_x { 1.0 } else { 0.0 }),
            ],
            Kernel::QGather { fmt } => vec![("FMT", f64::from(fmt.kernel_id()))],
            Kernel::AttentionPrompt { head_dim, .. } => vec![("HD", f64::from(head_dim))],
            Kernel::AttentionFast {
                head_dim, group, ..
            } => vec![("HD", f64::from(head_dim)), ("GQ", f64::from(group))],
            Kernel::QMatmulTiled { epilogue, .. } => vec![epilogue.constant()],
            Kernel::QuantAct { .. }
            | Kernel::RowOp { .. }
            | Kernel::Elementwise { .. }
            | Kernel::WindowAttention => vec![],
        }
    }
}

/// A compiled module and the workgroup memory in bytes of each of its entry points.
type Module = (wgpu::ShaderModule, Arc<HashMap<String, u32>>);

/// Compiled shader modules and pipelines, created once and reused.
#[derive(Default)]
pub struct PipelineCache {
    /// Each module with its entry points' workgroup memory in bytes (native builds; empty
    /// in a browser, whose WebGPU checks the limit itself).
    modules: Mutex<HashMap<(Source, Variant), Module>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
}

impl PipelineCache {
    /// Number of pipelines held.
    pub fn len(&self) -> usize {
        self.pipelines.lock().expect("pipeline lock").len()
    }

    /// True when no pipeline was compiled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl GpuContext {
    /// The pipeline for `key`, compiled on first use. Shader or pipeline errors (for
    /// instance a variant the device cannot run) are returned with naga's message.
    pub fn pipeline(&self, key: PipelineKey) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = self.pipelines.pipelines.lock().expect("lock").get(&key) {
            return Ok(p.clone());
        }
        let src = key.kernel.source();
        let (file, text) = src.text();
        #[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
        let dev = kernel_override(file);
        #[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
        let text = dev.as_deref().unwrap_or(text);
        #[cfg(not(target_arch = "wasm32"))]
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let (module, usage) = {
            let mut modules = self.pipelines.modules.lock().expect("lock");
            match modules.get(&(src, key.variant)) {
                Some(m) => m.clone(),
                None => {
                    let f32_tiles = self.device.limits().max_compute_workgroup_storage_size
                        >= crate::ops::ATTN_PROMPT_F32_BYTES;
                    let code = kernel_code(src, key.variant, (file, text), f32_tiles)?;
                    #[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
                    dump_module(src, key.variant, &code);
                    #[cfg(not(target_arch = "wasm32"))]
                    let usage = Arc::new(super::workgroup_mem::entry_bytes(&code));
                    #[cfg(target_arch = "wasm32")]
                    let usage = Arc::new(HashMap::new());
                    let desc = wgpu::ShaderModuleDescriptor {
                        label: Some(file),
                        source: wgpu::ShaderSource::Wgsl(code.into()),
                    };
                    // SAFETY: the kernels are this crate's own WGSL (or, in a `kernel-dev`
                    // build, a developer's edit of one, held to the same rules). Every loop is bounded by
                    // construction (constant strides, host-validated limits, no workgroup
                    // waits on another), every divisor is a constant or a host-checked
                    // non-zero size, every workgroup/function array index is below its
                    // constant size by construction: naga's loop counters, division guards
                    // and index clamps add only instructions (decode 1.22× and 1.02×
                    // faster without them on an H200, BENCHMARKS.md 2026-11-26). Buffer
                    // accesses stay bounded: by naga, or on Vulkan (`Caps::robust_buffers`)
                    // by the driver's robustBufferAccess, which wgpu enables.
                    let m = unsafe {
                        let mut checks = wgpu::ShaderRuntimeChecks::checked();
                        checks.force_loop_bounding = false;
                        checks.int_div_checks = false;
                        checks.bounds_checks = !self.caps().robust_buffers;
                        self.device.create_shader_module_trusted(desc, checks)
                    };
                    modules.insert((src, key.variant), (m.clone(), usage.clone()));
                    (m, usage)
                }
            }
        };
        let entry = key.kernel.entry_point();
        let limit = self.device.limits().max_compute_workgroup_storage_size;
        let name = &self.caps().name;
        if let Some(message) = super::workgroup_mem::overflow(&usage, entry, limit, name) {
            #[cfg(not(target_arch = "wasm32"))]
            drop(pollster::block_on(scope.pop()));
            return Err(crate::Error::Shader {
                kernel: format!("{file} ({key:?})"),
                message,
            });
        }
        let constants = key.kernel.constants();
        #[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
        dump_pipeline(src, key.variant, entry, &constants);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(file),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        // A browser resolves error scopes only asynchronously: there, compile errors reach
        // `GpuContext::check` through the uncaptured-error handler instead.
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            // Forget a module that failed to compile so the error repeats rather than hides.
            self.pipelines
                .modules
                .lock()
                .expect("lock")
                .remove(&(src, key.variant));
            return Err(crate::Error::Shader {
                kernel: format!("{file} ({key:?})"),
                message: e.to_string(),
            });
        }
        self.count_pipeline();
        self.pipelines
            .pipelines
            .lock()
            .expect("lock")
            .insert(key, pipeline.clone());
        Ok(pipeline)
    }
}

/// Workgroup memory in bytes of `kernel`'s entry point built for `variant` (the prompt
/// attention with its f32 tiles where `f32_tiles`), as the pipeline cache measures it.
#[cfg(test)]
pub(crate) fn workgroup_bytes(kernel: Kernel, variant: Variant, f32_tiles: bool) -> u32 {
    let src = kernel.source();
    let code = kernel_code(src, variant, src.text(), f32_tiles).expect("kernel code");
    super::workgroup_mem::entry_bytes(&code)[kernel.entry_point()]
}

/// The WGSL of kernel source `src` for `variant` from its text `file`, `text`: the
/// preprocessed file with the defines the variant and source imply (`F32_TILES` for the
/// prompt attention where `f32_tiles`: the device allows its workgroup memory), then the
/// files it includes (and, in a browser, the subgroup directives `web.rs` adds).
fn kernel_code(
    src: Source,
    variant: Variant,
    (file, text): (&str, &str),
    f32_tiles: bool,
) -> Result<String> {
    let mut defines = Vec::new();
    if variant.f16 {
        defines.push("F16");
    }
    if variant.subgroups {
        defines.push("SUBGROUPS");
    }
    if variant.kv_f32 {
        defines.push("KV_F32");
    }
    if src == Source::AttentionFastRope {
        defines.push("ROPE");
    }
    if matches!(src, Source::TernaryCoop3 | Source::TernarySgmat3) {
        defines.push("FUSED3");
    }
    if src == Source::TernaryCoopSplit {
        defines.push("SPLIT");
    }
    if src == Source::TernaryCoopGlu {
        defines.push("GLU");
    }
    if src == Source::AttentionPromptCoop || (src == Source::AttentionPrompt && f32_tiles) {
        defines.push("F32_TILES");
    }
    if src == Source::AttentionPromptCoop {
        defines.push("COOP_PV");
    }
    if matches!(src, Source::QMatvecTiled(_)) {
        defines.push("TILED");
    }
    let mut code = preprocess(file, text, &defines)?;
    if let Source::QMatvec(fmt) | Source::QMatvecTiled(fmt) = src {
        for part in fmt.includes() {
            code.push_str(part);
        }
    }
    if matches!(src, Source::RopeKv | Source::AttentionFastRope) {
        code.push_str(include_str!("kernels/rope.wgsl"));
    }
    let paged = matches!(
        src,
        Source::Attention
            | Source::AttentionFast
            | Source::AttentionFastRope
            | Source::AttentionPrompt
            | Source::AttentionPromptCoop
            | Source::WindowAttention
    );
    if paged {
        code.push_str(include_str!("kernels/paged_kv.wgsl"));
    }
    let prompt = matches!(src, Source::AttentionPrompt | Source::AttentionPromptCoop);
    if (paged && !prompt) || src == Source::RopeKv {
        let kv = include_str!("kernels/kv_type.wgsl");
        code.push_str(&preprocess("kv_type.wgsl", kv, &defines)?);
    }
    code.push_str(include_str!("kernels/common.wgsl"));
    #[cfg(target_arch = "wasm32")]
    super::web::directives(&mut code, variant);
    Ok(code)
}

/// Feature `kernel-dev`: where `TERNION_DUMP_KERNELS` names a folder, the file name there of
/// the WGSL of source `src` built for `variant`.
#[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
fn dump_path(src: Source, variant: Variant) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("TERNION_DUMP_KERNELS")?;
    let name: String = format!("{src:?}-{variant:?}")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    Some(std::path::Path::new(&dir).join(format!("{name}.wgsl")))
}

/// Feature `kernel-dev`: writes a module's WGSL into the `TERNION_DUMP_KERNELS` folder (when
/// set), so a tool outside the engine can compile exactly what the engine compiles (for
/// instance to read a driver's register counts).
#[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
fn dump_module(src: Source, variant: Variant, code: &str) {
    if let Some(path) = dump_path(src, variant) {
        if let Err(e) = std::fs::write(&path, code) {
            eprintln!("TERNION_DUMP_KERNELS: {}: {e}", path.display());
        }
    }
}

/// Feature `kernel-dev`: appends a pipeline (module file, entry point, override constants)
/// as a line `file<TAB>entry<TAB>NAME=value,...` to `pipelines.txt` in the
/// `TERNION_DUMP_KERNELS` folder.
#[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
fn dump_pipeline(src: Source, variant: Variant, entry: &str, constants: &[(&str, f64)]) {
    use std::io::Write;
    let Some(path) = dump_path(src, variant) else {
        return;
    };
    let consts: Vec<String> = constants.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    let line = format!(
        "{}\t{entry}\t{}\n",
        file.unwrap_or_default(),
        consts.join(",")
    );
    let list = path.with_file_name("pipelines.txt");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&list)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("TERNION_DUMP_KERNELS: {}: {e}", list.display());
    }
}

/// Feature `kernel-dev`: the text of kernel file `file` from the folder that
/// `TERNION_KERNEL_DIR` names, when it holds that file, so kernel variants can be timed on a
/// GPU machine without rebuilding (docs/ARCHITECTURE.md, "Adding a kernel"). Never in a
/// release build: such a file is compiled as trusted, like the crate's own kernels.
#[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
fn kernel_override(file: &str) -> Option<String> {
    let dir = std::env::var_os("TERNION_KERNEL_DIR")?;
    std::fs::read_to_string(std::path::Path::new(&dir).join(file)).ok()
}
