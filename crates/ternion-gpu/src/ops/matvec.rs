//! Matrix × activation products: I2_S ternary weights (int8 activations) and F16 weights.

use super::{check_tpr, uniform, Dispatch, QuantAct, StepUniform, WG};
use crate::buffers::{GpuBuffer, Sharded};
use crate::context::{GpuContext, PrefillKernel};
use crate::pipelines::{Epilogue, F16Rows, GluAct, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// An I2_S weight matrix on the GPU: the codes as stored in the file, and the scale.
#[derive(Clone, Debug)]
pub struct TernaryWeights {
    /// `rows × k/4` bytes of codes.
    pub codes: GpuBuffer,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of 128).
    pub k: usize,
    /// Per-tensor scale.
    pub scale: f32,
}

impl TernaryWeights {
    /// Uploads an I2_S tensor (`data` = codes then the 32-byte tail, as in the file) of
    /// `rows` rows of `k` elements.
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        data: &[u8],
        k: usize,
        rows: usize,
    ) -> Result<TernaryWeights> {
        let mut w = Self::zeroed(ctx, name, k, rows)?;
        w.fill(ctx, name, data)?;
        Ok(w)
    }

    /// Room for `rows` rows of `k` (a multiple of 128) elements, filled by
    /// [`TernaryWeights::fill`]; the scale is 0 until then.
    pub fn zeroed(ctx: &GpuContext, name: &str, k: usize, rows: usize) -> Result<TernaryWeights> {
        if k == 0 || !k.is_multiple_of(crate::quant::i2s::BLOCK_ELEMS) {
            return Err(Error::KernelArgs(format!(
                "{name}: I2_S rows of {k} elements (the GPU kernel needs a multiple of 128)"
            )));
        }
        Ok(TernaryWeights {
            codes: GpuBuffer::zeroed(ctx, name, (k * rows / 4) as u64)?,
            rows,
            k,
            scale: 0.0,
        })
    }

    /// Queues the upload of the tensor's bytes (codes then the 32-byte tail, as in the
    /// file) and takes the scale from the tail.
    pub fn fill(&mut self, ctx: &GpuContext, name: &str, data: &[u8]) -> Result<()> {
        let codes = self.k * self.rows / 4;
        if data.len() < codes + 4 {
            return Err(Error::KernelArgs(format!(
                "{name}: I2_S tensor of {} bytes does not hold {} rows of {} plus the scale",
                data.len(),
                self.rows,
                self.k
            )));
        }
        self.scale = crate::quant::i2s::tensor_scale(data, self.k * self.rows);
        self.codes.write(ctx, 0, &data[..codes]);
        Ok(())
    }
}

/// `out (= or +=) W · dequant(act)` for I2_S `W`: a matvec per token (decode) and, when a
/// [`StepUniform`] is given, the 4-tokens-per-workgroup batch kernel (prefill).
pub struct TernaryMatvec {
    single: Dispatch,
    batch: Option<Dispatch>,
    _params: GpuBuffer,
}

impl TernaryMatvec {
    /// Binds `w`, `act` and `out` (f32, `w.rows` per token); `tpr` lanes per row.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &TernaryWeights,
        act: &QuantAct,
        out: &GpuBuffer,
        epilogue: Epilogue,
        step: Option<&StepUniform>,
    ) -> Result<TernaryMatvec> {
        check_tpr(tpr)?;
        if act.k != w.k {
            return Err(Error::KernelArgs(format!(
                "ternary matvec: activations of width {} for weights of width {}",
                act.k, w.k
            )));
        }
        let words = (w.k / 16) as u32;
        let params = uniform(
            ctx,
            "ternary.params",
            &[w.rows as u32, words, w.scale.to_bits(), 0],
        )?;
        let groups = (w.rows as u32).div_ceil(WG / tpr);
        let mut bindings = vec![
            (0, params.binding()),
            (1, w.codes.binding()),
            (2, act.q.binding()),
            (3, act.meta.binding()),
            (4, out.binding()),
        ];
        let key = |batch| PipelineKey {
            kernel: Kernel::Ternary {
                tpr,
                epilogue,
                batch,
            },
            variant,
        };
        let single = Dispatch::new(ctx, key(false), "ternary", &bindings, groups)?;
        let batch = match step {
            Some(s) => {
                bindings.push((5, s.buf.binding()));
                Some(Dispatch::new(
                    ctx,
                    key(true),
                    "ternary4",
                    &bindings,
                    groups,
                )?)
            }
            None => None,
        };
        Ok(TernaryMatvec {
            single,
            batch,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` tokens: the matvec per token, or (when built
    /// with a step uniform holding `n_tokens`, and `batched`) the batch kernel.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32, batched: bool) {
        match (&self.batch, batched) {
            (Some(b), true) => b.record(pass, n_tokens.div_ceil(4)),
            _ => self.single.record(pass, n_tokens),
        }
    }
}

/// The fused gated FFN for I2_S weights: `out = act(W_gate·a) · (W_up·a)` in one dispatch
/// (`ternary.wgsl` `matvec_glu`), one token per workgroup row.
pub struct TernaryGlu {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl TernaryGlu {
    /// Binds `gate` and `up` (same shape), `act` and `out` (f32, `gate.rows` per token).
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        gate: &TernaryWeights,
        up: &TernaryWeights,
        act: &QuantAct,
        out: &GpuBuffer,
        glu: GluAct,
    ) -> Result<TernaryGlu> {
        check_tpr(tpr)?;
        if (gate.k, gate.rows) != (up.k, up.rows) || act.k != gate.k {
            return Err(Error::KernelArgs(format!(
                "fused GLU: gate {}×{}, up {}×{}, activations of width {}",
                gate.rows, gate.k, up.rows, up.k, act.k
            )));
        }
        let params = uniform(
            ctx,
            "ternary_glu.params",
            &[
                gate.rows as u32,
                (gate.k / 16) as u32,
                gate.scale.to_bits(),
                up.scale.to_bits(),
            ],
        )?;
        let key = PipelineKey {
            kernel: Kernel::TernaryGlu { tpr, act: glu },
            variant,
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "ternary_glu",
            &[
                (0, params.binding()),
                (1, gate.codes.binding()),
                (2, act.q.binding()),
                (3, act.meta.binding()),
                (4, out.binding()),
                (6, up.codes.binding()),
            ],
            (gate.rows as u32).div_ceil(WG / tpr),
        )?;
        Ok(TernaryGlu {
            dispatch,
            _params: params,
        })
    }

    /// Records the fused product for `n_tokens` tokens.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}

/// Three I2_S matvecs over the same activations (q, k, v) as one launch over their stacked
/// rows (`ternary.wgsl` `matvec3`), one token per workgroup row; each result is stored.
pub struct Ternary3 {
    dispatch: Dispatch,
    _params: Vec<GpuBuffer>,
}

impl Ternary3 {
    /// Binds the three matrices (same K), `act`, and their outputs (f32, rows per token).
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: [&TernaryWeights; 3],
        act: &QuantAct,
        out: [&GpuBuffer; 3],
    ) -> Result<Ternary3> {
        check_tpr(tpr)?;
        if w.iter().any(|m| m.k != act.k) {
            return Err(Error::KernelArgs(format!(
                "matvec3: activations of width {} for weights of widths {}, {}, {}",
                act.k, w[0].k, w[1].k, w[2].k
            )));
        }
        let (rows, params, parts) = Self::uniforms(ctx, w)?;
        let key = PipelineKey {
            kernel: Kernel::Ternary3 { tpr },
            variant,
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "ternary3",
            &[
                (0, params.binding()),
                (1, w[0].codes.binding()),
                (2, act.q.binding()),
                (3, act.meta.binding()),
                (4, out[0].binding()),
                (6, w[1].codes.binding()),
                (10, w[2].codes.binding()),
                (11, out[1].binding()),
                (12, out[2].binding()),
                (13, parts.binding()),
            ],
            (rows as u32).div_ceil(WG / tpr),
        )?;
        Ok(Ternary3 {
            dispatch,
            _params: vec![params, parts],
        })
    }

    /// Records the three products for `n_tokens` tokens.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }

    /// The stacked row count and the `Params` and `Parts` uniforms of three matrices
    /// (shared with `ternary_decode.wgsl`'s `matvec3_n`).
    pub(crate) fn uniforms(
        ctx: &GpuContext,
        w: [&TernaryWeights; 3],
    ) -> Result<(usize, GpuBuffer, GpuBuffer)> {
        let rows = w[0].rows + w[1].rows + w[2].rows;
        let params = uniform(
            ctx,
            "ternary3.params",
            &[rows as u32, (w[0].k / 16) as u32, w[0].scale.to_bits(), 0],
        )?;
        let parts = uniform(
            ctx,
            "ternary3.parts",
            &[
                w[0].rows as u32,
                w[1].rows as u32,
                w[1].scale.to_bits(),
                w[2].scale.to_bits(),
            ],
        )?;
        Ok((rows, params, parts))
    }
}

/// Rows per workgroup of the one-token F16 kernel (`f16_matvec.wgsl` DECODE_ROWS).
const F16_DECODE_ROWS: u32 = 64;
/// Widest row it holds in workgroup memory (4 · DECODE_K4).
const F16_DECODE_MAX_K: u32 = 3072;

/// `out[t][row0 + j] = W_shard[j] · x[t]` over every shard of an F16 matrix (LM head).
pub struct F16Matvec {
    dispatches: Vec<Dispatch>,
    rows: F16Rows,
    _params: Vec<GpuBuffer>,
}

impl F16Matvec {
    /// `w`: F16 rows of `k` (a multiple of 4); `x`: f32, `k` per token; `out`: f32,
    /// `w.rows` per token.
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
    ) -> Result<F16Matvec> {
        Self::build(ctx, variant, tpr, w, x, out, round_x, None, F16Rows::Each)
    }

    /// Like [`F16Matvec::new`] for one token, the hidden state held in workgroup memory
    /// (`decode`, rows up to 3,072 wide; `main` for wider ones): the same sums, bit for bit.
    pub fn one_token(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
    ) -> Result<F16Matvec> {
        let rows = if w.row_bytes / 2 <= F16_DECODE_MAX_K as usize {
            F16Rows::Decode
        } else {
            F16Rows::Each
        };
        Self::build(ctx, variant, tpr, w, x, out, round_x, None, rows)
    }

    /// Like [`F16Matvec::new`] (unrounded input) with eight token rows per workgroup: each
    /// weight row is read once per eight tokens; the token count is read from `step`. Each
    /// row's sums are those of [`F16Matvec::new`], bit for bit.
    pub fn rows8(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        step: &StepUniform,
    ) -> Result<F16Matvec> {
        Self::build(
            ctx,
            variant,
            tpr,
            w,
            x,
            out,
            false,
            Some(step),
            F16Rows::Eight,
        )
    }

    /// Like [`F16Matvec::rows8`] on cooperative matrices, 32 token rows at a time (each
    /// weight row read once for 32 tokens), the token rows rounded to F16; `None` unless
    /// the adapter's prefill kernel is the coop one, rows are a multiple of 64 wide and
    /// every shard holds a multiple of 16 rows.
    pub fn rows32(
        ctx: &GpuContext,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        step: &StepUniform,
    ) -> Result<Option<F16Matvec>> {
        let shards_fit = (0..w.shards.len()).all(|i| w.shard_rows(i).1.is_multiple_of(16));
        let k = w.row_bytes / 2;
        if ctx.caps().prefill != PrefillKernel::Coop || !k.is_multiple_of(64) || !shards_fit {
            return Ok(None);
        }
        let variant = Variant {
            f16: true,
            subgroups: true,
            ..Variant::default()
        };
        Self::build(
            ctx,
            variant,
            1,
            w,
            x,
            out,
            false,
            Some(step),
            F16Rows::Coop32,
        )
        .map(Some)
    }

    /// Like [`F16Matvec::new`] but multiplies only the last token row of the step (row
    /// `n_tokens − 1` of `x`, read from `step`) into row 0 of `out`.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn last_row(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
        step: &StepUniform,
    ) -> Result<F16Matvec> {
        Self::build(
            ctx,
            variant,
            tpr,
            w,
            x,
            out,
            round_x,
            Some(step),
            F16Rows::Last,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
        step: Option<&StepUniform>,
        rows: F16Rows,
    ) -> Result<F16Matvec> {
        check_tpr(tpr)?;
        let k = (w.row_bytes / 2) as u32;
        if !k.is_multiple_of(4) {
            return Err(Error::KernelArgs(format!(
                "f16 matvec: row width {k} is not a multiple of 4"
            )));
        }
        let per_group = match rows {
            F16Rows::Decode => F16_DECODE_ROWS,
            F16Rows::Coop32 => 128,
            _ => WG / tpr,
        };
        let key = PipelineKey {
            kernel: Kernel::F16Matvec { tpr, round_x, rows },
            variant,
        };
        let mut dispatches = Vec::new();
        let mut params = Vec::new();
        for (i, shard) in w.shards.iter().enumerate() {
            let (r0, rows) = w.shard_rows(i);
            let u = uniform(
                ctx,
                "f16_matvec.params",
                &[rows as u32, k, r0 as u32, w.rows as u32],
            )?;
            let mut bindings = vec![
                (0, u.binding()),
                (1, shard.binding()),
                (2, x.binding()),
                (3, out.binding()),
            ];
            if let Some(s) = step {
                bindings.push((4, s.buf.binding()));
            }
            dispatches.push(Dispatch::new(
                ctx,
                key,
                "f16_matvec",
                &bindings,
                (rows as u32).div_ceil(per_group),
            )?);
            params.push(u);
        }
        Ok(F16Matvec {
            dispatches,
            rows,
            _params: params,
        })
    }

    /// Records every shard's dispatch for `n_tokens` tokens (one row when built with
    /// [`F16Matvec::last_row`]; for [`F16Matvec::rows8`] the step uniform must hold
    /// `n_tokens`).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let groups = match self.rows {
            F16Rows::Each => n_tokens,
            F16Rows::Last | F16Rows::Decode => 1,
            F16Rows::Eight => n_tokens.div_ceil(8),
            F16Rows::Coop32 => n_tokens.div_ceil(32),
        };
        for d in &self.dispatches {
            d.record(pass, groups);
        }
    }

    /// Dispatches per record (one per shard).
    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len()
    }
}
