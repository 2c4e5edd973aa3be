//! The gated-FFN product.

use super::{uniform, Dispatch, WG};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{GluAct, Kernel, PipelineKey, Variant};
use crate::Result;

/// `gate = act(gate) · up` elementwise (`glu.wgsl`).
pub struct Glu {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl Glu {
    /// `gate` (in place) and `up`: f32, `n` per token.
    pub fn new(
        ctx: &GpuContext,
        act: GluAct,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        n: usize,
    ) -> Result<Glu> {
        let params = uniform(ctx, "glu.params", &[n as u32, 0, 0, 0])?;
        let key = PipelineKey {
            kernel: Kernel::Glu { act },
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "glu",
            &[
                (0, params.binding()),
                (1, gate.binding()),
                (2, up.binding()),
            ],
            (n as u32).div_ceil(WG),
        )?;
        Ok(Glu {
            dispatch,
            _params: params,
        })
    }

    /// Records the product over `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}
