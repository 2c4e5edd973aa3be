//! Sliding-window attention over the paged KV cache (`window_attention.wgsl`): Gemma 3's
//! local layers, where a query sees only the last `window` positions.

use super::{uniform, AttnDims, Dispatch, GpuKv, KvIndex, StepUniform};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Kernel, PipelineKey};
use crate::{Error, Result};

/// Windowed attention of one layer, built once and recorded per step.
pub struct WindowAttention {
    dispatch: Dispatch,
    _params: GpuBuffer,
    _probs: GpuBuffer,
}

impl WindowAttention {
    /// `q`: rotated f32 queries, `n_head·head_dim` per token; `out`: f32, same shape; each
    /// query sees its sequence's last `window` positions (itself included).
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        window: usize,
        step: &StepUniform,
        q: &GpuBuffer,
        (kv, index): (&GpuKv, &KvIndex),
        out: &GpuBuffer,
    ) -> Result<WindowAttention> {
        let hd = dims.head_dim;
        if dims.n_head_kv == 0
            || !dims.n_head.is_multiple_of(dims.n_head_kv)
            || !hd.is_multiple_of(2)
            || hd > 512
            || window == 0
        {
            return Err(Error::KernelArgs(format!(
                "window attention: unsupported geometry {dims:?}, window {window} (need \
                 n_head_kv | n_head, even head_dim ≤ 512, window ≥ 1)"
            )));
        }
        let window = window.min(index.n_ctx.max(1));
        let scale = 1.0 / (hd as f32).sqrt();
        let params = uniform(
            ctx,
            "window_attention.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                hd as u32,
                window as u32,
                scale.to_bits(),
                index.pps as u32,
                0,
                0,
            ],
        )?;
        let probs = GpuBuffer::zeroed(
            ctx,
            "window_attention.probs",
            (index.max_batch.max(1) * dims.n_head * window * 4) as u64,
        )?;
        let key = PipelineKey {
            kernel: Kernel::WindowAttention,
            variant: kv.variant(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "window_attention",
            &[
                (0, params.binding()),
                (1, step.buf.binding()),
                (2, q.binding()),
                (3, kv.k.binding()),
                (4, kv.v.binding()),
                (5, out.binding()),
                (6, probs.binding()),
                (9, index.attn_toks().binding()),
                (10, index.pages.binding()),
            ],
            dims.n_head as u32,
        )?;
        Ok(WindowAttention {
            dispatch,
            _params: params,
            _probs: probs,
        })
    }

    /// Records the attention of the step's `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}
