//! Products with weights in a GGUF storage format (`qmatvec.wgsl`) and the activation
//! quantizers they pair with (`quant_act.wgsl`), as in backend/cpu/linear.rs.

use super::{check_tpr, uniform, uniform_pod, Dispatch, StepUniform, WG};
use crate::buffers::{GpuBuffer, Sharded};
use crate::context::GpuContext;
use crate::pipelines::{Epilogue, Kernel, PipelineKey, Variant};
use crate::quant::{self, ActFormat, Format, GgmlType};
use crate::{Error, Result};

/// A weight format [`QMatvec`] multiplies: a registry format ([`quant::format`]) that has
/// a WGSL include.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QFormat(GgmlType);

/// The activation quantizers of `quant_act.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActQuant {
    /// ggml Q8_0: int8 per 32 with an F16-rounded scale.
    Q8_0,
    /// ggml Q8_1: Q8_0 plus the F16-rounded `d·Σq` of each block.
    Q8_1,
    /// ggml Q8_K: int8 per 256 with an f32 scale.
    Q8K,
}

impl ActQuant {
    /// The quantizer of an activation format (`None`: f32 activations, or I2_S's
    /// per-token int8, which the ternary kernels compute themselves).
    pub fn of(act: ActFormat) -> Option<ActQuant> {
        match act {
            ActFormat::F32 | ActFormat::F16 | ActFormat::BF16 | ActFormat::PerToken => None,
            ActFormat::Q8_0 => Some(ActQuant::Q8_0),
            ActFormat::Q8_1 => Some(ActQuant::Q8_1),
            ActFormat::Q8K => Some(ActQuant::Q8K),
        }
    }

    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            ActQuant::Q8_0 | ActQuant::Q8_1 => 32,
            ActQuant::Q8K => 256,
        }
    }

    /// f32 scale words per block (`d`, and `s` for Q8_1).
    pub fn scales(self) -> usize {
        match self {
            ActQuant::Q8_0 | ActQuant::Q8K => 1,
            ActQuant::Q8_1 => 2,
        }
    }

    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            ActQuant::Q8_0 => "q8_0",
            ActQuant::Q8_1 => "q8_1",
            ActQuant::Q8K => "q8_k",
        }
    }
}

impl QFormat {
    /// The format of a GGUF tensor type, if [`QMatvec`] handles it.
    pub fn from_ggml(ty: GgmlType) -> Option<QFormat> {
        quant::format(ty)
            .filter(|f| f.wgsl.is_some() && f.act() != ActFormat::PerToken)
            .map(|f| QFormat(f.ty))
    }

    /// The ggml type.
    pub fn ggml(self) -> GgmlType {
        self.0
    }

    fn format(self) -> &'static Format {
        quant::format(self.0).expect("QFormat holds registry types only")
    }

    /// The activation quantizer this format multiplies against (`None`: f32 activations).
    pub fn act(self) -> Option<ActQuant> {
        ActQuant::of(self.format().act())
    }

    /// (elements, bytes) of one storage block.
    fn block(self) -> (usize, usize) {
        let f = self.format();
        (f.block_elems, f.block_bytes)
    }

    /// Elements per unit of work of one lane (4 for float formats, else 32).
    fn unit(self) -> usize {
        if self.act().is_none() {
            4
        } else {
            32
        }
    }

    /// The `FMT` constant of `formats/float.wgsl` (0 for block formats, which do not read
    /// it).
    pub(crate) fn kernel_id(self) -> u32 {
        match self.format().act() {
            ActFormat::F16 => 1,
            ActFormat::BF16 => 2,
            ActFormat::F32
            | ActFormat::PerToken
            | ActFormat::Q8_0
            | ActFormat::Q8_1
            | ActFormat::Q8K => 0,
        }
    }

    /// The WGSL includes appended to `qmatvec.wgsl` for this format.
    pub(crate) fn includes(self) -> [&'static str; 2] {
        let own = self.format().wgsl.expect("QFormat has a WGSL include");
        match self.act() {
            None => ["", own],
            Some(_) => [include_str!("../kernels/formats/block.wgsl"), own],
        }
    }
}

/// The `qmatvec.wgsl` parameter block (binding 0; see the kernel header).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct QMatvecParams {
    rows: u32,
    units: u32,
    row0: u32,
    out_stride: u32,
    row_bytes: u32,
    act_stride: u32,
    nb: u32,
    post: f32,
}

/// A weight matrix on the GPU in its file format: `rows` rows of `k` values, row-sharded
/// to fit the binding limit.
#[derive(Clone, Debug)]
pub struct QWeights {
    /// Storage format.
    pub fmt: QFormat,
    /// Input features.
    pub k: usize,
    /// Output features.
    pub rows: usize,
    /// The rows' bytes as stored in the GGUF.
    pub data: Sharded,
}

impl QWeights {
    /// Uploads a tensor of type `ty` holding `rows` rows of `k` values (`data` = its bytes
    /// in the file) in shards of at most `max_shard_bytes` (default: the device limits).
    /// `k` must be a multiple of the format's block (and of 4 for float formats).
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        ty: GgmlType,
        data: &[u8],
        k: usize,
        rows: usize,
        max_shard_bytes: Option<u64>,
    ) -> Result<QWeights> {
        let fmt = QFormat::from_ggml(ty).ok_or_else(|| {
            Error::unsupported(
                format!("tensor '{name}': GPU matmul weight type"),
                ty,
                GgmlType::all().filter(|&t| QFormat::from_ggml(t).is_some()),
                "",
            )
        })?;
        let (be, bb) = fmt.block();
        let row_bytes = k / be * bb;
        if k == 0 || !k.is_multiple_of(be.max(fmt.unit())) || data.len() != rows * row_bytes {
            return Err(Error::KernelArgs(format!(
                "{name}: {ty} tensor of {} bytes does not hold {rows} rows of {k} (K must be \
                 a multiple of {})",
                data.len(),
                be.max(fmt.unit())
            )));
        }
        Ok(QWeights {
            fmt,
            k,
            rows,
            data: Sharded::from_rows_unaligned(ctx, name, data, row_bytes, max_shard_bytes)?,
        })
    }
}

/// Quantized activations: packed int8 and block scales, written by [`QuantizeAct`].
#[derive(Clone, Debug)]
pub struct QAct {
    /// `max_tokens × k/4` words of packed int8.
    pub q: GpuBuffer,
    /// `max_tokens × k/block` f32 scales.
    pub d: GpuBuffer,
    /// Row width.
    pub k: usize,
    /// The quantizer.
    pub kind: ActQuant,
}

impl QAct {
    /// Buffers for up to `max_tokens` rows of `k` (a multiple of the quantizer's block).
    pub fn new(ctx: &GpuContext, kind: ActQuant, k: usize, max_tokens: usize) -> Result<QAct> {
        if k == 0 || !k.is_multiple_of(kind.block()) {
            return Err(Error::KernelArgs(format!(
                "{kind:?} activations: width {k} is not a multiple of {}",
                kind.block()
            )));
        }
        Ok(QAct {
            q: GpuBuffer::zeroed(ctx, "qact.q", (max_tokens * k) as u64)?,
            d: GpuBuffer::zeroed(
                ctx,
                "qact.d",
                (max_tokens * k / kind.block() * kind.scales() * 4) as u64,
            )?,
            k,
            kind,
        })
    }
}

/// Quantizes f32 rows into a [`QAct`] (`quant_act.wgsl`).
pub struct QuantizeAct {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl QuantizeAct {
    /// `x`: f32, `act.k` per token.
    pub fn new(ctx: &GpuContext, x: &GpuBuffer, act: &QAct) -> Result<QuantizeAct> {
        let params = uniform(ctx, "quant_act.params", &[act.k as u32, 0, 0, 0])?;
        let key = PipelineKey {
            kernel: Kernel::QuantAct { kind: act.kind },
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "quant_act",
            &[
                (0, params.binding()),
                (1, x.binding()),
                (2, act.q.binding()),
                (3, act.d.binding()),
            ],
            (act.k as u32).div_ceil(WG),
        )?;
        Ok(QuantizeAct {
            dispatch,
            _params: params,
        })
    }

    /// Records the quantization of `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}

/// The input of a [`QMatvec`]: f32 rows for float formats, a [`QAct`] of the format's
/// quantizer otherwise.
#[derive(Clone, Copy)]
pub enum MatIn<'a> {
    /// f32, `k` per token.
    F32(&'a GpuBuffer),
    /// Quantized by [`QuantizeAct`].
    Quant(&'a QAct),
}

/// Options of a [`QMatvec`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QMatvecOpts {
    /// Store or add into `out`.
    pub epilogue: Epilogue,
    /// Round f32 activations to F16 first in the per-token `matvec` dispatches (F16
    /// weights; ggml's single-token numerics, which the CPU applies when a step has one
    /// token). The 4-token batch kernel never rounds, as the CPU's multi-token steps.
    pub round_x: bool,
    /// Scale multiplied into every output (1bitLLM `.scale`; 1.0 otherwise).
    pub post_scale: f32,
}

impl Default for QMatvecOpts {
    fn default() -> Self {
        QMatvecOpts {
            epilogue: Epilogue::Store,
            round_x: false,
            post_scale: 1.0,
        }
    }
}

/// Steps of at least this many tokens take `matmul_tiled` (block formats): below it the
/// 4-token kernel, whose workgroups cover 32 rows, keeps more of the GPU busy (H100, 32
/// sequences decoded together: Bonsai Q2_0 823 tok/s with the tile from 16 tokens, 1,070
/// from 64; BENCHMARKS.md).
pub(crate) const TILED_MIN_TOKENS: u32 = 64;

/// Tokens per `matmul_tiled` workgroup, and weight rows per workgroup.
const TILE_TOKENS: u32 = 64;
const TILE_ROWS: u32 = 64;

/// `out (= or +=) W · x` for a [`QWeights`] matrix: a matvec per token (decode) and, when
/// a [`StepUniform`] is given, the 4-tokens-per-workgroup kernel and (block formats) the
/// 64-token tiled kernel (prefill); one dispatch per shard.
pub struct QMatvec {
    single: Vec<Dispatch>,
    batch: Vec<Dispatch>,
    tiled: Vec<Dispatch>,
    _params: Vec<GpuBuffer>,
}

impl QMatvec {
    /// Binds `w`, `input` and `out` (f32, `w.rows` per token); `tpr` lanes per row.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &QWeights,
        input: MatIn<'_>,
        out: &GpuBuffer,
        opts: QMatvecOpts,
        step: Option<&StepUniform>,
    ) -> Result<QMatvec> {
        check_tpr(tpr)?;
        let (act, act_d, act_stride, nb) = match (w.fmt.act(), input) {
            (None, MatIn::F32(x)) => (x, x, w.k, 0),
            (Some(kind), MatIn::Quant(a)) if a.kind == kind && a.k == w.k => {
                (&a.q, &a.d, w.k / 4, w.k / kind.block() * kind.scales())
            }
            _ => {
                return Err(Error::KernelArgs(format!(
                    "qmatvec: {:?} weights of width {} need {} input",
                    w.fmt,
                    w.k,
                    match w.fmt.act() {
                        None => "f32".to_owned(),
                        Some(kind) => format!("{kind:?}-quantized activations of that width"),
                    }
                )))
            }
        };
        let key = |batch| PipelineKey {
            kernel: Kernel::QMatvec {
                fmt: w.fmt,
                tpr,
                epilogue: opts.epilogue,
                batch,
                round_x: opts.round_x && !batch && w.fmt.ggml() == GgmlType::F16,
            },
            variant: Variant {
                f16: false,
                subgroups: variant.subgroups,
                kv_f32: false,
            },
        };
        let units = (w.k / w.fmt.unit()) as u32;
        let (mut single, mut batch, mut tiled, mut params) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, shard) in w.data.shards.iter().enumerate() {
            let (r0, rows) = w.data.shard_rows(i);
            let u = uniform_pod(
                ctx,
                "qmatvec.params",
                &QMatvecParams {
                    rows: rows as u32,
                    units,
                    row0: r0 as u32,
                    out_stride: w.rows as u32,
                    row_bytes: w.data.row_bytes as u32,
                    act_stride: act_stride as u32,
                    nb: nb as u32,
                    post: opts.post_scale,
                },
            )?;
            let mut bindings = vec![
                (0, u.binding()),
                (1, shard.binding()),
                (2, act.binding()),
                (4, out.binding()),
            ];
            if w.fmt.act().is_some() {
                bindings.push((3, act_d.binding()));
            }
            let groups = (rows as u32).div_ceil(WG / tpr);
            single.push(Dispatch::new(
                ctx,
                key(false),
                "qmatvec",
                &bindings,
                groups,
            )?);
            if let Some(s) = step {
                bindings.push((5, s.buf.binding()));
                batch.push(Dispatch::new(
                    ctx,
                    key(true),
                    "qmatmul4",
                    &bindings,
                    groups,
                )?);
                if w.fmt.act().is_some() {
                    let key = PipelineKey {
                        kernel: Kernel::QMatmulTiled {
                            fmt: w.fmt,
                            epilogue: opts.epilogue,
                        },
                        variant: Variant::default(),
                    };
                    let groups = (rows as u32).div_ceil(TILE_ROWS);
                    tiled.push(Dispatch::new(ctx, key, "qmatmul_tiled", &bindings, groups)?);
                }
            }
            params.push(u);
        }
        Ok(QMatvec {
            single,
            batch,
            tiled,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` tokens: the matvec per token, or (when built
    /// with a step uniform holding `n_tokens`, and `batched`) the tiled kernel from
    /// [`TILED_MIN_TOKENS`] tokens on, else the 4-token kernel.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32, batched: bool) {
        if batched && n_tokens >= TILED_MIN_TOKENS && !self.tiled.is_empty() {
            for d in &self.tiled {
                d.record(pass, n_tokens.div_ceil(TILE_TOKENS));
            }
        } else if batched && !self.batch.is_empty() {
            for d in &self.batch {
                d.record(pass, n_tokens.div_ceil(4));
            }
        } else {
            for d in &self.single {
                d.record(pass, n_tokens);
            }
        }
    }

    /// Dispatches per record (one per shard).
    pub fn dispatch_count(&self) -> usize {
        self.single.len()
    }
}

/// `out[t] = row ids[t]` of a [`QWeights`] matrix, dequantized to f32 as the CPU does
/// (`qmatvec.wgsl` `gather`; token embeddings stored as Q4_K, Q6_K, Q8_0, …): one dispatch
/// per shard, each writing the tokens whose row it holds.
pub struct QEmbed {
    dispatches: Vec<Dispatch>,
    _params: Vec<GpuBuffer>,
}

impl QEmbed {
    /// `ids`: u32 token ids (each < `table.rows`: the caller checks); `out`: f32,
    /// `table.k` per token.
    pub fn new(
        ctx: &GpuContext,
        table: &QWeights,
        ids: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<QEmbed> {
        let key = PipelineKey {
            kernel: Kernel::QGather { fmt: table.fmt },
            variant: Variant::default(),
        };
        let units = (table.k / table.fmt.unit()) as u32;
        let (mut dispatches, mut params) = (Vec::new(), Vec::new());
        for (i, shard) in table.data.shards.iter().enumerate() {
            let (r0, rows) = table.data.shard_rows(i);
            let u = uniform_pod(
                ctx,
                "qgather.params",
                &QMatvecParams {
                    rows: rows as u32,
                    units,
                    row0: r0 as u32,
                    out_stride: table.k as u32,
                    row_bytes: table.data.row_bytes as u32,
                    act_stride: 0,
                    nb: 0,
                    post: 1.0,
                },
            )?;
            dispatches.push(Dispatch::new(
                ctx,
                key,
                "qgather",
                &[
                    (0, u.binding()),
                    (1, shard.binding()),
                    (4, out.binding()),
                    (6, ids.binding()),
                ],
                units.div_ceil(WG),
            )?);
            params.push(u);
        }
        Ok(QEmbed {
            dispatches,
            _params: params,
        })
    }

    /// Records the gather of `n_tokens` ids.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        for d in &self.dispatches {
            d.record(pass, n_tokens);
        }
    }
}
