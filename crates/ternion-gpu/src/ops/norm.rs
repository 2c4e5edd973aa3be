//! RMSNorm, optionally fused with the int8 activation quantization of the ternary matmuls.

use super::{uniform, Dispatch};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Packed int8 activations and per-token (scale, Σq) written by [`RmsNorm`] in quant mode
/// and read by [`TernaryMatvec`].
#[derive(Clone, Debug)]
pub struct QuantAct {
    /// `max_tokens × k/4` words of packed int8.
    pub q: GpuBuffer,
    /// `max_tokens` pairs (f32 scale bits, i32 Σq bits).
    pub meta: GpuBuffer,
    /// Row width.
    pub k: usize,
}

impl QuantAct {
    /// Buffers for up to `max_tokens` rows of `k` (a multiple of 4).
    pub fn new(ctx: &GpuContext, k: usize, max_tokens: usize) -> Result<QuantAct> {
        Ok(QuantAct {
            q: GpuBuffer::zeroed(ctx, "act.q", (max_tokens * k) as u64)?,
            meta: GpuBuffer::zeroed(ctx, "act.meta", (max_tokens * 8) as u64)?,
            k,
        })
    }
}

/// Where [`RmsNorm`] writes.
pub enum NormOut<'a> {
    /// f32 rows.
    F32(&'a GpuBuffer),
    /// Per-token int8 quantization for the ternary matmuls.
    Quant(&'a QuantAct),
}

/// RMSNorm × weight of each token row, to f32 or quantized to int8.
pub struct RmsNorm {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl RmsNorm {
    /// Normalises rows of `x` (f32, `n` per token) with weight `w` (`n` f32).
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        x: &GpuBuffer,
        w: &GpuBuffer,
        n: usize,
        eps: f32,
        out: NormOut<'_>,
    ) -> Result<RmsNorm> {
        let params = uniform(ctx, "rmsnorm.params", &[n as u32, eps.to_bits()])?;
        let quant = matches!(out, NormOut::Quant(_));
        if quant && !n.is_multiple_of(4) {
            return Err(Error::KernelArgs(format!(
                "rmsnorm_quant: row width {n} is not a multiple of 4"
            )));
        }
        let mut bindings = vec![(0, params.binding()), (1, x.binding()), (2, w.binding())];
        match &out {
            NormOut::F32(o) => bindings.push((3, o.binding())),
            NormOut::Quant(a) => {
                bindings.push((3, a.q.binding()));
                bindings.push((4, a.meta.binding()));
            }
        }
        let key = PipelineKey {
            kernel: Kernel::RmsNorm { quant },
            variant,
        };
        let dispatch = Dispatch::new(ctx, key, "rmsnorm", &bindings, 0)?;
        Ok(RmsNorm {
            dispatch,
            _params: params,
        })
    }

    /// Records the norm of the first `n_tokens` rows (one workgroup each).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record_grid(pass, [n_tokens, 1, 1]);
    }
}
