//! Products with weights in a GGUF storage format (`qmatvec.wgsl`) and the activation
//! quantizers they pair with (`quant_act.wgsl`), as in backend/cpu/linear.rs.

use super::{check_tpr, uniform, Dispatch, StepUniform, WG};
use crate::backend::gpu::buffers::{GpuBuffer, Sharded};
use crate::backend::gpu::context::GpuContext;
use crate::backend::gpu::pipelines::{Epilogue, Kernel, PipelineKey, Variant};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// A weight format [`QMatvec`] multiplies (named as ggml names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QFormat {
    /// f32.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q8_0 (32 per block).
    Q8_0,
    /// ggml Q4_0 (32 per block).
    Q4_0,
    /// ggml Q4_K (256 per super-block).
    Q4_K,
    /// ggml Q6_K (256 per super-block).
    Q6_K,
    /// ggml TQ2_0 ternary (256 per block).
    TQ2_0,
}

/// The activation quantizers of `quant_act.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActQuant {
    /// ggml Q8_0: int8 per 32 with an F16-rounded scale (for Q8_0, Q4_0 weights).
    Q8_0,
    /// ggml Q8_K: int8 per 256 with an f32 scale (for Q4_K, Q6_K, TQ2_0 weights).
    Q8K,
}

impl ActQuant {
    /// Elements per scale.
    pub fn block(self) -> usize {
        match self {
            ActQuant::Q8_0 => 32,
            ActQuant::Q8K => 256,
        }
    }

    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            ActQuant::Q8_0 => "q8_0",
            ActQuant::Q8K => "q8_k",
        }
    }
}

impl QFormat {
    /// The format of a GGUF tensor type, if [`QMatvec`] handles it.
    pub fn from_ggml(ty: GgmlType) -> Option<QFormat> {
        Some(match ty {
            GgmlType::F32 => QFormat::F32,
            GgmlType::F16 => QFormat::F16,
            GgmlType::BF16 => QFormat::BF16,
            GgmlType::Q8_0 => QFormat::Q8_0,
            GgmlType::Q4_0 => QFormat::Q4_0,
            GgmlType::Q4_K => QFormat::Q4_K,
            GgmlType::Q6_K => QFormat::Q6_K,
            GgmlType::TQ2_0 => QFormat::TQ2_0,
            _ => return None,
        })
    }

    /// The activation quantizer this format multiplies against (`None`: f32 activations).
    pub fn act(self) -> Option<ActQuant> {
        match self {
            QFormat::F32 | QFormat::F16 | QFormat::BF16 => None,
            QFormat::Q8_0 | QFormat::Q4_0 => Some(ActQuant::Q8_0),
            QFormat::Q4_K | QFormat::Q6_K | QFormat::TQ2_0 => Some(ActQuant::Q8K),
        }
    }

    /// (elements, bytes) of one storage block.
    fn block(self) -> (usize, usize) {
        match self {
            QFormat::F32 => (1, 4),
            QFormat::F16 | QFormat::BF16 => (1, 2),
            QFormat::Q8_0 => (32, 34),
            QFormat::Q4_0 => (32, 18),
            QFormat::Q4_K => (256, 144),
            QFormat::Q6_K => (256, 210),
            QFormat::TQ2_0 => (256, 66),
        }
    }

    /// Elements per unit of work of one lane (4 for float formats, else 32).
    fn unit(self) -> usize {
        if self.act().is_none() {
            4
        } else {
            32
        }
    }

    /// The `FMT` constant of `qmatvec.wgsl`.
    pub(crate) fn kernel_id(self) -> u32 {
        self as u32
    }
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
            Error::Gpu(format!(
                "{name}: no GPU matmul kernel for weights of type {ty}"
            ))
        })?;
        let (be, bb) = fmt.block();
        let row_bytes = k / be * bb;
        if k == 0 || !k.is_multiple_of(be.max(fmt.unit())) || data.len() != rows * row_bytes {
            return Err(Error::Gpu(format!(
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
            return Err(Error::Gpu(format!(
                "{kind:?} activations: width {k} is not a multiple of {}",
                kind.block()
            )));
        }
        Ok(QAct {
            q: GpuBuffer::zeroed(ctx, "qact.q", (max_tokens * k) as u64)?,
            d: GpuBuffer::zeroed(ctx, "qact.d", (max_tokens * k / kind.block() * 4) as u64)?,
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

/// `out (= or +=) W · x` for a [`QWeights`] matrix: a matvec per token (decode) and, when
/// a [`StepUniform`] is given, the 4-tokens-per-workgroup kernel (prefill); one dispatch
/// per shard.
pub struct QMatvec {
    single: Vec<Dispatch>,
    batch: Vec<Dispatch>,
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
                (&a.q, &a.d, w.k / 4, w.k / kind.block())
            }
            _ => {
                return Err(Error::Gpu(format!(
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
                round_x: opts.round_x && !batch && w.fmt == QFormat::F16,
            },
            variant: Variant {
                f16: false,
                subgroups: variant.subgroups,
            },
        };
        let units = (w.k / w.fmt.unit()) as u32;
        let (mut single, mut batch, mut params) = (Vec::new(), Vec::new(), Vec::new());
        for (i, shard) in w.data.shards.iter().enumerate() {
            let (r0, rows) = w.data.shard_rows(i);
            let u = uniform(
                ctx,
                "qmatvec.params",
                &[
                    rows as u32,
                    units,
                    r0 as u32,
                    w.rows as u32,
                    w.data.row_bytes as u32,
                    act_stride as u32,
                    nb as u32,
                    opts.post_scale.to_bits(),
                ],
            )?;
            let mut bindings = vec![
                (0, u.binding()),
                (1, shard.binding()),
                (2, act.binding()),
                (3, act_d.binding()),
                (4, out.binding()),
            ];
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
            }
            params.push(u);
        }
        Ok(QMatvec {
            single,
            batch,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` tokens: the matvec per token, or (when built
    /// with a step uniform holding `n_tokens`, and `batched`) the 4-token kernel.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32, batched: bool) {
        if batched && !self.batch.is_empty() {
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
            let u = uniform(
                ctx,
                "qgather.params",
                &[
                    rows as u32,
                    units,
                    r0 as u32,
                    table.k as u32,
                    table.data.row_bytes as u32,
                    0,
                    0,
                    0,
                ],
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
