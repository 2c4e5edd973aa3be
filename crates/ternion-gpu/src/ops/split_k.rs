//! K walked in parts by the 128-token coop tiles of a matrix with few row tiles
//! (`ternary_coop.wgsl` `#if SPLIT`: `matmul_split`, then `split_sum`). A 2,560-row o or
//! down projection has 20 row tiles, so a 512-token step fills 80 workgroups of a 132-SM
//! GPU, each walking all of K; in three parts it fills 240, each walking a third. The
//! parts' integer sums add up exactly, so the result is the unsplit launch's bit for bit.

use super::narrow::tile_bindings;
use super::{Dispatch, QuantAct, StepUniform, TernaryWeights, MM_TILE_TOKENS};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Epilogue, Kernel, PipelineKey, Variant};
use crate::Result;

/// Parts K is split into.
const PARTS: u32 = 3;

/// Weight rows and tokens of a coop tile.
const TILE: u32 = 2 * MM_TILE_TOKENS;

/// The split runs while the unsplit launch would have fewer workgroups than this (about a
/// round on a large GPU: 132 SMs on an H100, one 48 KiB tile workgroup each).
const SPLIT_BELOW_TILES: u32 = 128;

/// `matmul_split` and `split_sum` of one matrix, over a scratch of the parts' sums.
pub struct SplitK {
    parts: u32,
    row_tiles: u32,
    max_tokens: u32,
    split: Dispatch,
    sum: Dispatch,
}

/// The parts K is split into (`TERNION_SPLIT_PARTS` overrides it in `kernel-dev` builds).
fn parts() -> u32 {
    #[cfg(all(feature = "kernel-dev", not(target_arch = "wasm32")))]
    if let Some(p) = std::env::var("TERNION_SPLIT_PARTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return p;
    }
    PARTS
}

impl SplitK {
    /// Scratch bytes the split of a `rows × k` matrix needs for steps of up to
    /// `max_batch` tokens, or `None` where it never runs (too many row tiles, or too few
    /// I2_S blocks of K for every part to get one).
    pub fn scratch_bytes(rows: usize, k: usize, max_batch: usize) -> Option<u64> {
        let parts = parts() as usize;
        let row_tiles = rows.div_ceil(TILE as usize);
        let blocks = k / 128;
        let token_tiles = (SPLIT_BELOW_TILES as usize - 1) / row_tiles.max(1);
        let tokens = max_batch.min(token_tiles * TILE as usize);
        let useful = parts > 1 && blocks > parts * (parts - 1) && tokens > MM_TILE_TOKENS as usize;
        useful.then(|| (parts * tokens * rows * 4) as u64)
    }

    /// The split of `w · act` into `out` (`epilogue`), its parts in `scratch` (sized by
    /// [`SplitK::scratch_bytes`]), `params` the unsplit launch's uniform.
    pub fn new(
        ctx: &GpuContext,
        (w, act, out): (&TernaryWeights, &QuantAct, &GpuBuffer),
        (scratch, params): (&GpuBuffer, &GpuBuffer),
        epilogue: Epilogue,
        step: &StepUniform,
    ) -> Result<SplitK> {
        let parts = parts();
        let key = |sum| PipelineKey {
            kernel: Kernel::TernaryCoopSplit {
                parts,
                epilogue,
                sum,
            },
            variant: Variant {
                f16: true,
                subgroups: true,
                kv_f32: false,
            },
        };
        let row_tiles = (w.rows as u32).div_ceil(TILE);
        let split = Dispatch::new(
            ctx,
            key(false),
            "ternary_coop_split",
            // Binding 3 (the token scales) is bound for the layout: the shared epilogue
            // names it, the parts never read it.
            &tile_bindings(params, w, act, scratch, step),
            row_tiles,
        )?;
        let sum = Dispatch::new(
            ctx,
            key(true),
            "ternary_coop_split_sum",
            &[
                (0, params.binding()),
                (3, act.meta.binding()),
                (4, out.binding()),
                (5, step.buf.binding()),
                (6, scratch.binding()),
            ],
            (w.rows as u32).div_ceil(256),
        )?;
        Ok(SplitK {
            parts,
            row_tiles,
            max_tokens: (scratch.size / (u64::from(parts) * w.rows as u64 * 4)) as u32,
            split,
            sum,
        })
    }

    /// Whether a step of `n_tokens` tokens (more than [`MM_TILE_TOKENS`]) runs split.
    pub fn takes(&self, n_tokens: u32) -> bool {
        n_tokens <= self.max_tokens && self.row_tiles * n_tokens.div_ceil(TILE) < SPLIT_BELOW_TILES
    }

    /// Records the parts and their sum for `n_tokens` tokens (the value in the step uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.split
            .record_grid(pass, [self.row_tiles, n_tokens.div_ceil(TILE), self.parts]);
        self.sum.record(pass, n_tokens);
    }
}
