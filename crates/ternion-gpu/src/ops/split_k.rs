//! The K blocks of a matrix with few row tiles shared out evenly among the GPU's SMs
//! (`ternary_coop.wgsl` `#if SPLIT`: `matmul_split`, then `split_sum`). A 2,560-row o or
//! down projection has 20 row tiles, so a 512-token step has 80 coop tiles for a 132-SM GPU,
//! each walking all of K. Laid end to end, the tiles' blocks are cut into one equal chunk
//! per SM ("stream-K"): a workgroup walks its chunk's pieces of one tile or two, storing
//! each piece's sums, and `split_sum` adds a tile's pieces. The pieces' integer sums add up
//! exactly, so the result is the unsplit launch's bit for bit. Where the SM count is unknown
//! the blocks are shared among three workgroups a tile.

use super::narrow::tile_bindings;
use super::{Dispatch, QuantAct, StepUniform, TernaryWeights, MM_TILE_TOKENS};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Epilogue, Kernel, PipelineKey, Variant};
use crate::Result;

/// Weight rows and tokens of a coop tile.
const TILE: u32 = 2 * MM_TILE_TOKENS;

/// The split runs while the unsplit launch would have fewer workgroups than this (about a
/// round on a large GPU: 132 SMs on an H100, one 48 KiB tile workgroup each).
const SPLIT_BELOW_TILES: u32 = 128;

/// Floats of one piece's sums: a 128 × 128 tile.
const PIECE: u64 = (TILE * TILE) as u64;

/// `matmul_split` and `split_sum` of one matrix, over a scratch of the pieces' sums.
pub struct SplitK {
    sms: u32,
    row_tiles: u32,
    blocks: u32,
    max_tiles: u32,
    split: Dispatch,
    sum: Dispatch,
}

/// `ternary_coop.wgsl` `stream_chunk`: (blocks a workgroup walks, workgroups that walk
/// any) for `tiles` tiles of `blocks` blocks shared among `sms` workgroups (0: three a
/// tile).
pub(crate) fn stream_plan(tiles: u32, blocks: u32, sms: u32) -> (u32, u32) {
    let groups = if sms == 0 { 3 * tiles } else { sms };
    let chunk = (tiles * blocks).div_ceil(groups);
    (chunk, (tiles * blocks).div_ceil(chunk))
}

/// Pieces of at most `tiles` tiles shared among `sms` workgroups (0: three a tile): a
/// workgroup's first, plus one for each tile it starts.
fn pieces(tiles: u32, sms: u32) -> u32 {
    tiles + if sms == 0 { 3 * tiles } else { sms }
}

/// Tiles of the largest step the split runs for a matrix of `row_tiles` row tiles and
/// steps of up to `max_batch` tokens (0: none).
fn max_tiles(row_tiles: u32, max_batch: usize) -> u32 {
    let token_tiles = (SPLIT_BELOW_TILES - 1) / row_tiles.max(1);
    let tokens = (max_batch as u32).min(token_tiles * TILE);
    if tokens > MM_TILE_TOKENS {
        row_tiles * tokens.div_ceil(TILE)
    } else {
        0
    }
}

impl SplitK {
    /// Scratch bytes the split of a `rows × k` matrix needs for steps of up to
    /// `max_batch` tokens on an adapter of `sms` SMs, or `None` where it never runs (too
    /// many row tiles, or a K of fewer than two I2_S blocks).
    pub fn scratch_bytes(rows: usize, k: usize, max_batch: usize, sms: Option<u32>) -> Option<u64> {
        let tiles = max_tiles((rows as u32).div_ceil(TILE), max_batch);
        let useful = tiles > 0 && k / 128 >= 2;
        useful.then(|| u64::from(pieces(tiles, sms.unwrap_or(0))) * PIECE * 4)
    }

    /// The split of `w · act` into `out` (`epilogue`) among `sms` workgroups (the
    /// adapter's SMs; None: three a tile), its pieces in `scratch` (sized by
    /// [`SplitK::scratch_bytes`] for the same `sms`), `params` the unsplit launch's uniform.
    pub fn new(
        ctx: &GpuContext,
        (w, act, out): (&TernaryWeights, &QuantAct, &GpuBuffer),
        (scratch, params): (&GpuBuffer, &GpuBuffer),
        (epilogue, sms): (Epilogue, Option<u32>),
        step: &StepUniform,
    ) -> Result<SplitK> {
        let sms = sms.unwrap_or(0);
        let key = |sum| PipelineKey {
            kernel: Kernel::TernaryCoopSplit { sms, epilogue, sum },
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
        // The most tiles whose pieces the scratch holds (`pieces`, inverted).
        let held = (scratch.size / (PIECE * 4)) as u32;
        let max_tiles = if sms == 0 {
            held / 4
        } else {
            held.saturating_sub(sms)
        };
        Ok(SplitK {
            sms,
            row_tiles,
            blocks: (w.k / 128) as u32,
            max_tiles,
            split,
            sum,
        })
    }

    /// Whether a step of `n_tokens` tokens (more than [`MM_TILE_TOKENS`]) runs split.
    pub fn takes(&self, n_tokens: u32) -> bool {
        let tiles = self.row_tiles * n_tokens.div_ceil(TILE);
        tiles <= self.max_tiles && tiles < SPLIT_BELOW_TILES
    }

    /// Records the pieces and their sum for `n_tokens` tokens (the value in the step
    /// uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let tiles = self.row_tiles * n_tokens.div_ceil(TILE);
        let (_, groups) = stream_plan(tiles, self.blocks, self.sms);
        self.split.record_grid(pass, [groups, 1, 1]);
        self.sum.record(pass, n_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::{pieces, stream_plan};

    /// The split of an H100's 512-token o and down projections, and for every small
    /// shape: each block walked by exactly one workgroup, each workgroup's piece of a tile
    /// stored at a distinct index below the scratch's piece count (`pieces`), and a tile's
    /// pieces at consecutive indices (what `split_sum` reads).
    #[test]
    fn stream_plan_covers_every_block_once() {
        assert_eq!(stream_plan(80, 20, 132), (13, 124));
        assert_eq!(stream_plan(80, 54, 132), (33, 131));
        assert_eq!(stream_plan(80, 20, 0), (7, 229));
        for sms in [0, 1, 5, 132, 1000] {
            for tiles in 1..40 {
                for blocks in 2..30 {
                    let (chunk, groups) = stream_plan(tiles, blocks, sms);
                    let total = tiles * blocks;
                    assert!(chunk >= 1 && (groups - 1) * chunk < total && groups * chunk >= total);
                    let mut seen = vec![false; (pieces(tiles, sms)) as usize];
                    for i in 0..tiles {
                        let first = i * blocks / chunk;
                        let last = ((i + 1) * blocks - 1) / chunk;
                        for g in first..=last {
                            let at = (g + i) as usize;
                            assert!(at < seen.len() && !seen[at], "{sms} {tiles} {blocks}");
                            seen[at] = true;
                        }
                    }
                }
            }
        }
    }
}
