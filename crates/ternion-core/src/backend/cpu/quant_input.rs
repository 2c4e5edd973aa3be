//! [`QuantInput`]: the activation rows of one product in the quantized forms the weight
//! formats read ([`crate::quant::act`]), each computed once per input.

use super::pool::{self, SharedMut};
use super::simd;
use crate::quant::act;

/// The activation rows of one product in the quantized forms the weight formats need,
/// computed at most once per input and reused by every weight that reads the same input
/// (q, k and v; gate and up). Buffers are kept between calls so the hot path does not
/// allocate once warm.
#[derive(Default)]
pub struct QuantInput {
    fresh: [bool; 11],
    pub(super) q: Vec<i8>,
    pub(super) token_scale: Vec<f32>,
    pub(super) token_sum: Vec<i32>,
    pub(super) q8k: Vec<i8>,
    pub(super) q8k_d: Vec<f32>,
    pub(super) q8k_bsum: Vec<i32>,
    /// `q`, `q8k` and `q80` laid out in token tiles for the prompt kernels
    /// ([`simd::interleave_tokens`]; filled only for inputs of several rows); `q80` in
    /// tiles of 8 and of 16, as the weights read it.
    q_tiles: Vec<i8>,
    q8k_tiles: BlockTiles,
    /// The token tiles `q_tiles`, `q8k_tiles` and `q80_tiles` were laid out in.
    tile_caps: [usize; 4],
    q80_tiles: [BlockTiles; 2],
    pub(super) x16: Vec<f32>,
    pub(super) xbf: Vec<f32>,
    pub(super) q80: Vec<i8>,
    pub(super) q80_d: Vec<f32>,
    /// Per Q8_0 block: Σq.
    pub(super) q80_sum: Vec<i32>,
    pub(super) q81: Vec<i8>,
    pub(super) q81_d: Vec<f32>,
    pub(super) q81_s: Vec<f32>,
    /// Per input row: round its float activations to F16 before F16 products (rows of a
    /// single-token decode step).
    pub(super) round_f16: Vec<bool>,
}

impl QuantInput {
    /// Forgets the cached forms: call whenever the input changes.
    pub fn reset(&mut self) {
        self.fresh = [false; 11];
    }

    /// Sets, row by row, which input rows are rounded to F16 before F16 products (rows
    /// past the end are not).
    pub fn set_round_f16(&mut self, rows: impl Iterator<Item = bool>) {
        self.round_f16.clear();
        self.round_f16.extend(rows);
        self.fresh[2] = false;
    }

    pub(super) fn ensure_per_token(&mut self, x: &[f32], k: usize) {
        if std::mem::replace(&mut self.fresh[0], true) {
            return;
        }
        let rows = x.len() / k;
        let level = simd::Level::detect();
        self.q.resize(x.len(), 0);
        self.token_scale.resize(rows, 0.0);
        self.token_sum.resize(rows, 0);
        let (scale, sum) = (
            SharedMut(self.token_scale.as_mut_ptr()),
            SharedMut(self.token_sum.as_mut_ptr()),
        );
        // One token row per task: the rows are independent, so any thread count gives the
        // same values.
        pool::global().for_each_chunk_mut(&mut self.q, k, |t, qr, _| {
            let (scale, sum) = (&scale, &sum);
            let p = simd::quantize_per_token(level, &x[t * k..(t + 1) * k], qr);
            // SAFETY: t < rows = the length of both buffers, and row t belongs to this
            // task alone.
            unsafe {
                *scale.0.add(t) = p.scale;
                *sum.0.add(t) = p.sum;
            }
        });
    }

    /// The per-token values in the prompt kernels' token tiles of at most `tile` (the row
    /// itself for a single row), with the tokens' scales and sums.
    pub(super) fn per_token_tiles(
        &mut self,
        x: &[f32],
        k: usize,
        tile: usize,
    ) -> (&[i8], &[f32], &[i32]) {
        self.ensure_per_token(x, k);
        if std::mem::replace(&mut self.tile_caps[0], tile) != tile {
            self.fresh[7] = false;
        }
        let q = tiles(&self.q, (k, tile), &mut self.q_tiles, &mut self.fresh[7]);
        (q, &self.token_scale, &self.token_sum)
    }

    /// The Q8_K rows with their values in the prompt kernels' token tiles of at most
    /// `tile` (the row itself for a single row).
    pub(super) fn q8k_tiles(&mut self, x: &[f32], k: usize, tile: usize) -> simd::Q8kRows<'_> {
        self.ensure_q8k(x, k);
        if std::mem::replace(&mut self.tile_caps[1], tile) != tile {
            self.fresh[8] = false;
        }
        let (q, d, bsum) = self.q8k_tiles.fill(
            (&self.q8k, &self.q8k_d, &self.q8k_bsum),
            (k, act::Q8K_BLOCK, tile),
            &mut self.fresh[8],
        );
        simd::Q8kRows { q, d, bsum }
    }

    pub(super) fn ensure_q8k(&mut self, x: &[f32], k: usize) {
        if std::mem::replace(&mut self.fresh[1], true) {
            return;
        }
        let (nb, rows) = (k / act::Q8K_BLOCK, x.len() / k);
        let level = simd::Level::detect();
        self.q8k.resize(x.len(), 0);
        self.q8k_d.resize(rows * nb, 0.0);
        self.q8k_bsum.resize(rows * nb, 0);
        let (d, bsum) = (
            SharedMut(self.q8k_d.as_mut_ptr()),
            SharedMut(self.q8k_bsum.as_mut_ptr()),
        );
        // One token row per task, as `ensure_per_token`.
        pool::global().for_each_chunk_mut(&mut self.q8k, k, |t, qr, _| {
            let (d, bsum) = (&d, &bsum);
            // SAFETY: t < rows; row t's nb scales and sums lie inside both buffers
            // (rows · nb long) and belong to this task alone.
            let (dr, br) = unsafe {
                (
                    std::slice::from_raw_parts_mut(d.0.add(t * nb), nb),
                    std::slice::from_raw_parts_mut(bsum.0.add(t * nb), nb),
                )
            };
            simd::quantize_q8k(level, &x[t * k..(t + 1) * k], qr, dr, br);
        });
    }

    pub(super) fn ensure_q8_0(&mut self, x: &[f32], k: usize) {
        if std::mem::replace(&mut self.fresh[3], true) {
            return;
        }
        let nb = k / act::Q8_0_BLOCK;
        self.q80.resize(x.len(), 0);
        self.q80_d.resize(x.len() / k * nb, 0.0);
        act::quantize_q8_0(x, &mut self.q80, &mut self.q80_d);
    }

    /// The Q8_0 form with the block sums, for the Q1_0 / Q2_0 row kernels.
    pub(super) fn ensure_q8_0_rows(&mut self, x: &[f32], k: usize) -> simd::Q80Rows<'_> {
        self.ensure_q8_0(x, k);
        if !std::mem::replace(&mut self.fresh[6], true) {
            self.q80_sum.clear();
            self.q80_sum.extend(
                self.q80
                    .chunks_exact(act::Q8_0_BLOCK)
                    .map(|b| b.iter().map(|&v| i32::from(v)).sum::<i32>()),
            );
        }
        simd::Q80Rows {
            q: &self.q80,
            d: &self.q80_d,
            sum: &self.q80_sum,
        }
    }

    /// The Q8_0 rows with their values in the prompt kernels' token tiles of at
    /// most `tile` (8, 16 or 32; the row itself for a single row; no plane order).
    pub(super) fn q8_0_tiles(&mut self, x: &[f32], k: usize, tile: usize) -> simd::Q80Rows<'_> {
        self.ensure_q8_0_rows(x, k);
        let i = usize::from(tile > simd::SUB_TILE);
        if std::mem::replace(&mut self.tile_caps[2 + i], tile) != tile {
            self.fresh[9 + i] = false;
        }
        let (q, d, sum) = self.q80_tiles[i].fill(
            (&self.q80, &self.q80_d, &self.q80_sum),
            (k, act::Q8_0_BLOCK, tile),
            &mut self.fresh[9 + i],
        );
        simd::Q80Rows { q, d, sum }
    }

    pub(super) fn ensure_q8_1(&mut self, x: &[f32], k: usize) {
        if std::mem::replace(&mut self.fresh[5], true) {
            return;
        }
        let nb = x.len() / k * (k / act::Q8_0_BLOCK);
        self.q81.resize(x.len(), 0);
        self.q81_d.resize(nb, 0.0);
        self.q81_s.resize(nb, 0.0);
        act::quantize_q8_1(x, &mut self.q81, &mut self.q81_d, &mut self.q81_s);
    }

    pub(super) fn ensure_bf16(&mut self, x: &[f32]) {
        if std::mem::replace(&mut self.fresh[4], true) {
            return;
        }
        self.xbf.clear();
        self.xbf
            .extend(x.iter().map(|&v| half::bf16::from_f32(v).to_f32()));
    }

    pub(super) fn ensure_f16(&mut self, x: &[f32], k: usize) {
        if std::mem::replace(&mut self.fresh[2], true) {
            return;
        }
        self.x16.clear();
        for (t, row) in x.chunks_exact(k).enumerate() {
            if self.round_f16.get(t).copied().unwrap_or(false) {
                self.x16
                    .extend(row.iter().map(|&v| half::f16::from_f32(v).to_f32()));
            } else {
                self.x16.extend_from_slice(row);
            }
        }
    }
}

/// Block-scaled activations in the token tiles of the AVX-512 prompt kernels: the values
/// ([`simd::interleave_tokens`]) with their per-block scales and sums beside them
/// ([`simd::interleave_blocks`]).
#[derive(Default)]
struct BlockTiles {
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
}

impl BlockTiles {
    /// The rows `q` of `k` values with their scales `d` and sums `sum` (one per `block`
    /// values) in token tiles of at most `cap`, laid out here unless `fresh` says they are;
    /// a single row as it is.
    fn fill<'a>(
        &'a mut self,
        (q, d, sum): (&'a [i8], &'a [f32], &'a [i32]),
        (k, block, cap): (usize, usize, usize),
        fresh: &mut bool,
    ) -> (&'a [i8], &'a [f32], &'a [i32]) {
        if q.len() <= k {
            return (q, d, sum);
        }
        if !std::mem::replace(fresh, true) {
            let nb = k / block;
            self.q.resize(q.len(), 0);
            simd::interleave_tokens(q, k, cap, &mut self.q);
            self.d.resize(d.len(), 0.0);
            simd::interleave_blocks(d, nb, cap, &mut self.d);
            self.sum.resize(sum.len(), 0);
            simd::interleave_blocks(sum, nb, cap, &mut self.sum);
        }
        (&self.q, &self.d, &self.sum)
    }
}

/// `q` (rows of `k`) in token tiles of at most `cap`, laid out into `buf` unless `fresh`
/// says it holds them.
fn tiles<'a>(
    q: &'a [i8],
    (k, cap): (usize, usize),
    buf: &'a mut Vec<i8>,
    fresh: &mut bool,
) -> &'a [i8] {
    if q.len() <= k {
        return q;
    }
    if !std::mem::replace(fresh, true) {
        buf.resize(q.len(), 0);
        simd::interleave_tokens(q, k, cap, buf);
    }
    buf
}
