//! The 128-token cooperative-matrix tiles of several I2_S matrices that read the same
//! activations, in one launch for prompt steps: q, k and v side by side
//! (`ternary_coop.wgsl` `matmul_wide3`: a 2B-4T step fills 120 workgroups instead of
//! 80 + 40 + 40 in three launches, the 640-row k and v on 64-token tiles), and gate and up
//! with the GLU in the epilogue (`matmul_wide_glu`: no up product or GLU pass through
//! memory). The same values as the separate launches (and `glu.wgsl`).
//!
//! The gate/up tiles run one workgroup an SM on an H100, so the tiles of a last, partial
//! wave took as long as a full wave (432 tiles of a 512-token 2B-4T step on 132 SMs: 36 in
//! the fourth). Where the SM count is known, those tiles are split along K into parts that
//! run side by side, the last part of each adding them up (`ternary_coop.wgsl`
//! `tail_plan`; BENCHMARKS.md, session 19).
//!
//! In a browser with subgroup matrices, q/k/v run the same way on `ternary_sgmat.wgsl`
//! (`#if FUSED3`: 128 × 128 tiles, the launch shape of `matmul_wide3`); its gate and up
//! stay separate launches.

use super::narrow::{check_widths, glu_parts, three_bindings, three_parts, tile_bindings};
use super::{
    prompt_kind, uniform, Dispatch, MatmulKind, QuantAct, StepUniform, TernaryWeights,
    MM_TILE_TOKENS,
};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{GluAct, Kernel, PipelineKey, Variant};
use crate::Result;

/// Weight rows of a coop tile.
const TILE_ROWS: u32 = 128;

/// Floats of one split part's raw sums: a 128 × 128 tile.
const PART_FLOATS: u64 = 128 * 128;

/// One launch of several matrices' coop tiles for steps of more than [`MM_TILE_TOKENS`]
/// tokens.
pub struct CoopFused {
    dispatch: Dispatch,
    _params: [GpuBuffer; 2],
    /// Gate/up: the last wave's split (row tiles, K/128 blocks, SMs); None for q/k/v.
    tail: Option<[u32; 3]>,
}

/// `ternary_coop.wgsl` `tail_plan`: (whole tiles, split tiles r, parts p) for `tiles` tiles
/// of `blocks` I2_S blocks on `sms` SMs (0: unknown; p = 1: nothing split).
pub(crate) fn tail_plan(tiles: u32, blocks: u32, sms: u32) -> (u32, u32, u32) {
    if sms == 0 || blocks < 8 || tiles.is_multiple_of(sms) {
        return (tiles, 0, 1);
    }
    let r = tiles % sms;
    let p = (sms / r).min(3);
    if p < 2 {
        (tiles, 0, 1)
    } else {
        (tiles - r, r, p)
    }
}

/// The scratch of the gate/up launches' split last wave (`tail_plan`) for `sms` SMs: each
/// part's raw sums (`sms` tiles of f32 at most) and per split tile the parts finished (zero
/// between launches). The gate/up launches of a plan share one (they run one after
/// another), as the split-K linears share theirs.
#[derive(Clone)]
pub struct GluTail {
    sms: u32,
    sums: GpuBuffer,
    done: GpuBuffer,
}

impl GluTail {
    /// The scratch for `sms` SMs; None: nothing is split, and the two bindings the kernel
    /// declares get placeholders of a word each.
    pub fn new(ctx: &GpuContext, sms: Option<u32>) -> Result<GluTail> {
        let sms = sms.unwrap_or(0);
        Ok(GluTail {
            sms,
            sums: GpuBuffer::zeroed(ctx, "coop_glu.tail_sums", u64::from(sms) * PART_FLOATS * 4)?,
            done: GpuBuffer::zeroed(ctx, "coop_glu.tail_done", u64::from(sms / 2 + 1) * 4)?,
        })
    }
}

impl CoopFused {
    /// q, k, v: `w[i] · act` into `out[i]` (f32, `w[i].rows` per token); `None` where the
    /// adapter's prompt kernel is neither the coop nor the subgroup-matrix one.
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
        let kernel = match prompt_kind(ctx.caps().prefill, act.k) {
            Some(MatmulKind::SubgroupMatrix) => Kernel::TernarySgmat3,
            _ => Kernel::TernaryCoop3,
        };
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
    /// rows of each a tile, the last wave split for the SMs of `tail` (made for the
    /// context's [`Caps::sms`](crate::Caps)); `None` where the adapter's prompt kernel is
    /// not the coop one.
    pub fn glu(
        ctx: &GpuContext,
        (gate, up): (&TernaryWeights, &TernaryWeights),
        act: &QuantAct,
        out: &GpuBuffer,
        glu: GluAct,
        step: &StepUniform,
        tail: &GluTail,
    ) -> Result<Option<CoopFused>> {
        let mut parts = glu_parts("coop gate/up", (gate, up), glu)?;
        check_widths("coop gate/up", &[gate, up], act)?;
        parts[1] = tail.sms;
        let tiles = (gate.rows as u32).div_ceil(TILE_ROWS / 2);
        let kernel = Kernel::TernaryCoopGlu { act: glu };
        let bind = [
            (6, up.codes.binding()),
            (7, tail.sums.binding()),
            (8, tail.done.binding()),
        ];
        let fused = Self::new(ctx, (gate, act, out, step), kernel, (parts, &bind), tiles)?;
        let blocks = (act.k / 128) as u32;
        Ok(fused.map(|f| CoopFused {
            tail: Some([tiles, blocks, tail.sms]),
            ..f
        }))
    }

    fn new(
        ctx: &GpuContext,
        (w, act, out, step): (&TernaryWeights, &QuantAct, &GpuBuffer, &StepUniform),
        kernel: Kernel,
        (parts, extra): ([u32; 4], &[(u32, wgpu::BufferBinding<'_>)]),
        tiles: u32,
    ) -> Result<Option<CoopFused>> {
        // The subgroup-matrix tiles fuse q/k/v only (their 128 × 128 tiles and launch
        // shape are the coop ones).
        let sgmat = kernel == Kernel::TernarySgmat3;
        if !sgmat && prompt_kind(ctx.caps().prefill, act.k) != Some(MatmulKind::Coop) {
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
                f16: !sgmat,
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
            tail: None,
        }))
    }

    /// Records the products for `n_tokens` tokens (the value in the step uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let token_tiles = n_tokens.div_ceil(2 * MM_TILE_TOKENS);
        if let Some([row_tiles, blocks, sms]) = self.tail {
            let (full, r, p) = tail_plan(row_tiles * token_tiles, blocks, sms);
            if p > 1 {
                // One workgroup per whole tile and per part, in rows of at most 65,535.
                let n = full + r * p;
                let x = n.min(u32::from(u16::MAX));
                self.dispatch.record_grid(pass, [x, n.div_ceil(x), 1]);
                return;
            }
        }
        self.dispatch.record(pass, token_tiles);
    }
}
