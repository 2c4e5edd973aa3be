//! The 128-token cooperative-matrix tiles of q, k and v in one launch for prompt steps
//! (`ternary_coop.wgsl` `matmul_wide3`): the three matrices' row tiles side by side along
//! x, so a 2B-4T step fills 120 workgroups instead of 80 + 40 + 40 in three launches
//! (the 640-row k and v on 64-token tiles); the same values as the separate launches.

use super::narrow::{check_widths, three_bindings, three_parts};
use super::{uniform, Dispatch, QuantAct, StepUniform, TernaryWeights, MM_TILE_TOKENS};
use crate::buffers::GpuBuffer;
use crate::context::{GpuContext, PrefillKernel};
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::Result;

/// Weight rows of a coop tile.
const TILE_ROWS: u32 = 128;

/// One launch of q/k/v's coop tiles for steps of more than [`MM_TILE_TOKENS`] tokens.
pub struct CoopQkv {
    dispatch: Dispatch,
    _params: [GpuBuffer; 2],
}

impl CoopQkv {
    /// `w[i] · act` into `out[i]` (f32, `w[i].rows` per token); `None` where the adapter's
    /// prompt kernel is not the coop one.
    pub fn new(
        ctx: &GpuContext,
        w: [&TernaryWeights; 3],
        act: &QuantAct,
        out: [&GpuBuffer; 3],
        step: &StepUniform,
    ) -> Result<Option<CoopQkv>> {
        if ctx.caps().prefill != PrefillKernel::Coop {
            return Ok(None);
        }
        check_widths("coop q/k/v", &w, act)?;
        let rows = w.map(|m| m.rows as u32);
        let params = uniform(
            ctx,
            "ternary_coop3.params",
            &[rows[0], (act.k / 16) as u32, w[0].scale.to_bits(), 0],
        )?;
        let parts = uniform(ctx, "ternary_coop3.parts", &three_parts(w))?;
        let key = PipelineKey {
            kernel: Kernel::TernaryCoop3,
            variant: Variant {
                f16: true,
                subgroups: true,
                kv_f32: false,
            },
        };
        let mut bindings = vec![
            (0, params.binding()),
            (1, w[0].codes.binding()),
            (2, act.q.binding()),
            (3, act.meta.binding()),
            (4, out[0].binding()),
            (5, step.buf.binding()),
            (10, parts.binding()),
        ];
        bindings.extend(three_bindings(w, out));
        let tiles = rows.iter().map(|r| r.div_ceil(TILE_ROWS)).sum();
        let dispatch = Dispatch::new(ctx, key, "ternary_coop3", &bindings, tiles)?;
        Ok(Some(CoopQkv {
            dispatch,
            _params: [params, parts],
        }))
    }

    /// Records the products for `n_tokens` tokens (the value in the step uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch
            .record(pass, n_tokens.div_ceil(2 * MM_TILE_TOKENS));
    }
}
