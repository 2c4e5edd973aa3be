//! The 128-token cooperative-matrix tiles of several I2_S matrices that read the same
//! activations, in one launch for prompt steps: q, k and v side by side
//! (`ternary_coop.wgsl` `matmul_wide3`: a 2B-4T step fills 120 workgroups instead of
//! 80 + 40 + 40 in three launches, the 640-row k and v on 64-token tiles), and gate and up
//! with the GLU in the epilogue (`matmul_wide_glu`: no up product or GLU pass through
//! memory). The same values as the separate launches (and `glu.wgsl`).

use super::narrow::{check_widths, glu_parts, three_bindings, three_parts, tile_bindings};
use super::{uniform, Dispatch, QuantAct, StepUniform, TernaryWeights, MM_TILE_TOKENS};
use crate::buffers::GpuBuffer;
use crate::context::{GpuContext, PrefillKernel};
use crate::pipelines::{GluAct, Kernel, PipelineKey, Variant};
use crate::Result;

/// Weight rows of a coop tile.
const TILE_ROWS: u32 = 128;

/// One launch of several matrices' coop tiles for steps of more than [`MM_TILE_TOKENS`]
/// tokens.
pub struct CoopFused {
    dispatch: Dispatch,
    _params: [GpuBuffer; 2],
}

impl CoopFused {
    /// q, k, v: `w[i] · act` into `out[i]` (f32, `w[i].rows` per token); `None` where the
    /// adapter's prompt kernel is not the coop one.
    pub fn qkv(
        ctx: &GpuContext,
        w: [&TernaryWeights; 3],
        act: &QuantAct,
        out: [&GpuBuffer; 3],
        step: &StepUniform,
    ) -> Result<Option<CoopFused>> {
        check_widths("coop q/k/v", &w, act)?;
        let tiles = w.iter().map(|m| (m.rows as u32).div_ceil(TILE_ROWS)).sum();
        let bind = three_bindings(w, out);
        let kernel = Kernel::TernaryCoop3;
        let parts = three_parts(w);
        Self::new(
            ctx,
            (w[0], act, out[0], step),
            kernel,
            (parts, &bind),
            tiles,
        )
    }

    /// Gate and up: `act(gate · x) · (up · x)` into `out` (f32, `gate.rows` per token), 64
    /// rows of each a tile; `None` where the adapter's prompt kernel is not the coop one.
    pub fn glu(
        ctx: &GpuContext,
        (gate, up): (&TernaryWeights, &TernaryWeights),
        act: &QuantAct,
        out: &GpuBuffer,
        glu: GluAct,
        step: &StepUniform,
    ) -> Result<Option<CoopFused>> {
        let parts = glu_parts("coop gate/up", (gate, up), glu)?;
        check_widths("coop gate/up", &[gate, up], act)?;
        let tiles = (gate.rows as u32).div_ceil(TILE_ROWS / 2);
        let kernel = Kernel::TernaryCoopGlu { act: glu };
        let bind = [(6, up.codes.binding())];
        Self::new(ctx, (gate, act, out, step), kernel, (parts, &bind), tiles)
    }

    fn new(
        ctx: &GpuContext,
        (w, act, out, step): (&TernaryWeights, &QuantAct, &GpuBuffer, &StepUniform),
        kernel: Kernel,
        (parts, extra): ([u32; 4], &[(u32, wgpu::BufferBinding<'_>)]),
        tiles: u32,
    ) -> Result<Option<CoopFused>> {
        if ctx.caps().prefill != PrefillKernel::Coop {
            return Ok(None);
        }
        let params = uniform(
            ctx,
            "ternary_coop_fused.params",
            &[w.rows as u32, (act.k / 16) as u32, w.scale.to_bits(), 0],
        )?;
        let parts = uniform(ctx, "ternary_coop_fused.parts", &parts)?;
        let key = PipelineKey {
            kernel,
            variant: Variant {
                f16: true,
                subgroups: true,
                kv_f32: false,
            },
        };
        let mut bindings = tile_bindings(&params, w, act, out, step);
        bindings.push((10, parts.binding()));
        bindings.extend(extra.iter().cloned());
        let dispatch = Dispatch::new(ctx, key, "ternary_coop_fused", &bindings, tiles)?;
        Ok(Some(CoopFused {
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
