//! The narrow ternary tiles of several I2_S matrices that read the same activations, in one
//! launch for steps of a few tokens (`ternary_mm.wgsl` `matmul_narrow3`, `matmul_narrow_glu`):
//! q/k/v together, and gate/up with the GLU in the epilogue — the same values as the
//! separate narrow launches and `glu.wgsl`, in one launch instead of three.

use super::{uniform, Dispatch, QuantAct, StepUniform, TernaryWeights};
use crate::buffers::GpuBuffer;
use crate::context::{GpuContext, PrefillKernel};
use crate::pipelines::{GluAct, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Weight rows (and tokens) of a narrow tile.
const TILE: u32 = 32;

/// The `Parts` uniform of the kernels that run three matrices in one launch
/// (`ternary_mm.wgsl` `matmul_narrow3`, `ternary_coop.wgsl` `matmul_wide3`): the 2nd and
/// 3rd matrices' rows and I2_S scales.
pub(super) fn three_parts(w: [&TernaryWeights; 3]) -> [u32; 4] {
    [
        w[1].rows as u32,
        w[2].rows as u32,
        w[1].scale.to_bits(),
        w[2].scale.to_bits(),
    ]
}

/// Those kernels' bindings 6–9: the 2nd and 3rd matrices and their outputs.
pub(super) fn three_bindings<'a>(
    w: [&'a TernaryWeights; 3],
    out: [&'a GpuBuffer; 3],
) -> [(u32, wgpu::BufferBinding<'a>); 4] {
    [
        (6, w[1].codes.binding()),
        (7, w[2].codes.binding()),
        (8, out[1].binding()),
        (9, out[2].binding()),
    ]
}

/// The `Parts` uniform of the fused gate/up kernels (`ternary_mm.wgsl`
/// `matmul_narrow_glu`, `ternary_coop.wgsl` `matmul_wide_glu`): the up matrix's rows and
/// I2_S scale; an error naming `what` unless gate and up have as many rows and the
/// activation is ReLU² or SiLU.
pub(super) fn glu_parts(
    what: &str,
    (gate, up): (&TernaryWeights, &TernaryWeights),
    glu: GluAct,
) -> Result<[u32; 4]> {
    if up.rows != gate.rows || glu == GluAct::GeluTanh {
        return Err(Error::KernelArgs(format!(
            "{what}: {} gate rows and {} up rows, activation {glu:?} (needs equal rows and \
             ReLU² or SiLU)",
            gate.rows, up.rows
        )));
    }
    Ok([up.rows as u32, 0, up.scale.to_bits(), 0])
}

/// Bindings 0–5 of the tiled I2_S kernels: `params`, the codes of `w`, the activations and
/// their token scales, `out` and the step uniform.
pub(super) fn tile_bindings<'a>(
    params: &'a GpuBuffer,
    w: &'a TernaryWeights,
    act: &'a QuantAct,
    out: &'a GpuBuffer,
    step: &'a StepUniform,
) -> Vec<(u32, wgpu::BufferBinding<'a>)> {
    vec![
        (0, params.binding()),
        (1, w.codes.binding()),
        (2, act.q.binding()),
        (3, act.meta.binding()),
        (4, out.binding()),
        (5, step.buf.binding()),
    ]
}

/// An error naming `what` unless every matrix of `w` is as wide as the activations.
pub(super) fn check_widths(what: &str, w: &[&TernaryWeights], act: &QuantAct) -> Result<()> {
    if w.iter().all(|m| m.k == act.k) {
        return Ok(());
    }
    let widths: Vec<usize> = w.iter().map(|m| m.k).collect();
    Err(Error::KernelArgs(format!(
        "{what}: activations of width {} for weights of widths {widths:?}",
        act.k
    )))
}

/// One launch of the narrow tiles of several matrices.
pub struct NarrowFused {
    dispatch: Dispatch,
    _params: [GpuBuffer; 2],
}

impl NarrowFused {
    /// q/k/v: `w[i] · act` into `out[i]` (f32, `w[i].rows` per token). `None` where the
    /// adapter runs no tiled kernels.
    pub fn qkv(
        ctx: &GpuContext,
        w: [&TernaryWeights; 3],
        act: &QuantAct,
        out: [&GpuBuffer; 3],
        step: &StepUniform,
    ) -> Result<Option<NarrowFused>> {
        let tiles = w.iter().map(|m| (m.rows as u32).div_ceil(TILE)).sum();
        let bind = three_bindings(w, out);
        Self::new(
            ctx,
            (&w, act, out[0], step),
            None,
            three_parts(w),
            &bind,
            tiles,
        )
    }

    /// Gate and up: `act(gate · x) · (up · x)` into `out` (f32, `gate.rows` per token).
    pub fn glu(
        ctx: &GpuContext,
        (gate, up): (&TernaryWeights, &TernaryWeights),
        act: &QuantAct,
        out: &GpuBuffer,
        glu: GluAct,
        step: &StepUniform,
    ) -> Result<Option<NarrowFused>> {
        let parts = glu_parts("narrow gate/up", (gate, up), glu)?;
        let tiles = (gate.rows as u32).div_ceil(TILE);
        // The walk's code loader names a 3rd matrix too (`wq`); this entry reads two.
        let bind = [(6, up.codes.binding()), (7, up.codes.binding())];
        Self::new(
            ctx,
            (&[gate, up], act, out, step),
            Some(glu),
            parts,
            &bind,
            tiles,
        )
    }

    fn new(
        ctx: &GpuContext,
        (w, act, out, step): (&[&TernaryWeights], &QuantAct, &GpuBuffer, &StepUniform),
        glu: Option<GluAct>,
        parts: [u32; 4],
        extra: &[(u32, wgpu::BufferBinding<'_>)],
        tiles: u32,
    ) -> Result<Option<NarrowFused>> {
        if ctx.caps().prefill == PrefillKernel::Batch4 {
            return Ok(None);
        }
        check_widths("narrow tiles", w, act)?;
        let params = uniform(
            ctx,
            "ternary_narrow.params",
            &[
                w[0].rows as u32,
                (w[0].k / 16) as u32,
                w[0].scale.to_bits(),
                0,
            ],
        )?;
        let parts = uniform(ctx, "ternary_narrow.parts", &parts)?;
        let key = PipelineKey {
            kernel: Kernel::TernaryNarrowFused { glu },
            variant: Variant {
                f16: false,
                subgroups: false,
                kv_f32: false,
            },
        };
        let mut bindings = tile_bindings(&params, w[0], act, out, step);
        bindings.push((10, parts.binding()));
        bindings.extend(extra.iter().cloned());
        let dispatch = Dispatch::new(ctx, key, "ternary_narrow", &bindings, tiles)?;
        Ok(Some(NarrowFused {
            dispatch,
            _params: [params, parts],
        }))
    }

    /// Records the products for `n_tokens` tokens (the value in the step uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens.div_ceil(TILE));
    }
}
