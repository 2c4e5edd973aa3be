//! Ternary and 1-bit weights (I2_S, TQ2_0, TQ1_0, Q2_0, Q1_0), Q8_0 and Q4_0, repacked
//! once (by [`super::Linear`], at the matrix's first CPU product) into the 16-row
//! interleaved layout of the AVX-512 VNNI kernels, and the 2-bit I2_S, TQ2_0, TQ1_0 and
//! Q2_0 also where only AVX2 runs ([`Tiles`]; docs/FORMATS.md, "CPU ternary layout"). The repacking is lossless: every
//! product equals the file format's reference dot bit for bit.
//!
//! A product walks groups of 16 weight rows in parallel; within a group, the codes of a
//! chunk are unpacked once per tile of up to 16 tokens (prompt processing) or once for the
//! single token of a decode step, and the kernels store each token's 16 columns straight
//! into the output.

use std::ops::Range;

use half::f16;

use super::huge::HugeBuf;
use super::pool::{self, SharedMut};
use super::simd::{Chunk, Codes, OutCols, Q80Rows, Q8kRows, Tiles, CHUNK_ELEMS, GROUP_ROWS};
use crate::quant::{self, GgmlType};

/// A ternary weight matrix in the interleaved layout.
pub struct TernaryPack {
    tiles: Tiles,
    /// Groups of 16 rows one after the other, `k / 16` chunks each (the last group padded
    /// with code 1, i.e. zeros).
    chunks: HugeBuf<Chunk>,
    /// Per-block weight scales of the formats that have them: per group, per block of
    /// `scale_block` elements, the 16 rows' F16 scales (0 for padding rows; the files'
    /// values, so exact); empty for I2_S.
    scales: HugeBuf<f16>,
    /// Elements per scaled block (256 for TQ2_0 / TQ1_0, 64 for Q2_0, 128 for Q1_0, 32 for
    /// Q8_0 / Q4_0; 0 for I2_S, whose scale is per tensor).
    scale_block: u32,
    /// How the chunks hold the codes (Q1_0: one bit per weight; Q8_0: one byte; Q4_0: one
    /// nibble).
    layout: Codes,
    /// The largest token tile of the prompt activations it reads ([`Self::token_tile`]).
    token_tile: usize,
    k: usize,
    m: usize,
}

/// Bytes of rows packed between two calls of `release` ([`TernaryPack::new`]).
const SLAB_BYTES: usize = 16 << 20;

/// The codes (and block scales) of one row, in element order.
type RowCodes = fn(&[u8], &mut [u8], &mut [f32]);

impl TernaryPack {
    /// `data` (the tensor's rows, `m` of `k` elements, stored as `ty`) repacked, when `ty`
    /// is a format the layout and `tiles` take at this width; None otherwise. `release` is told each
    /// byte range of `data` once it has been packed (a mapped file drops those pages), so
    /// that the rows and their copy are never both resident whole.
    pub fn new(
        tiles: Tiles,
        ty: GgmlType,
        data: &[u8],
        (k, m): (usize, usize),
        release: &dyn Fn(Range<usize>),
    ) -> Option<TernaryPack> {
        if !tiles.take(ty) {
            return None;
        }
        let (codes, scale_block): (RowCodes, usize) = match ty {
            GgmlType::I2_S => (|row, c, _| quant::i2s::codes_row(row, c), 0),
            GgmlType::TQ2_0 => (quant::tq2_0::codes_row, quant::tq2_0::BLOCK_ELEMS),
            GgmlType::TQ1_0 => (quant::tq1_0::codes_row, quant::tq1_0::BLOCK_ELEMS),
            GgmlType::Q2_0 => (quant::q2_0::codes_row, quant::q2_0::BLOCK_ELEMS),
            GgmlType::Q1_0 => (quant::q1_0::codes_row, quant::q1_0::BLOCK_ELEMS),
            GgmlType::Q8_0 => (quant::q8_0::codes_row, quant::q8_0::BLOCK_ELEMS),
            GgmlType::Q4_0 => (quant::q4_0::codes_row, quant::q4_0::BLOCK_ELEMS),
            _ => return None,
        };
        let layout = match ty {
            GgmlType::Q1_0 => Codes::OneBit,
            GgmlType::Q8_0 => Codes::Bytes,
            GgmlType::Q4_0 => Codes::Nibbles,
            _ => Codes::TwoBit,
        };
        let token_tile = match ty {
            GgmlType::I2_S | GgmlType::TQ2_0 | GgmlType::TQ1_0 => tiles.token_tile(),
            _ => tiles.q8_0_token_tile(layout),
        };
        let chunk_elems = layout.chunk_elems();
        if !k.is_multiple_of(chunk_elems) || (scale_block > 0 && !k.is_multiple_of(scale_block)) {
            return None;
        }
        let row_bytes = ty.row_bytes(k as u64)? as usize;
        let n_chunks = k / chunk_elems;
        let nb = k.checked_div(scale_block).unwrap_or(0);
        let groups = m.div_ceil(GROUP_ROWS);
        // Padding rows hold zeros: code 1 (2-bit), 128 (bytes), 8 (nibbles); 1-bit rows
        // hold −1 (any value would do: the row is dropped).
        let fill = match layout {
            Codes::TwoBit => 0x55,
            Codes::OneBit => 0,
            Codes::Bytes => 0x80,
            Codes::Nibbles => 0x88,
        };
        let mut chunks = HugeBuf::filled(groups * n_chunks, Chunk([fill; 64]));
        let mut scales = HugeBuf::filled(groups * nb * GROUP_ROWS, f16::ZERO);
        let scales_ptr = SharedMut(scales.as_mut_ptr());
        // Slabs of groups whose rows span about SLAB_BYTES, each released once packed.
        let slab_groups = (SLAB_BYTES / (row_bytes * GROUP_ROWS)).max(1);
        for (s, slab) in chunks.chunks_mut(slab_groups * n_chunks).enumerate() {
            let g0 = s * slab_groups;
            pool::global().for_each_chunk_mut(slab, n_chunks, |i, group, _| {
                let (scales_ptr, g) = (&scales_ptr, g0 + i);
                let (mut row_codes, mut row_scales) = (vec![0u8; k], vec![0f32; nb]);
                for r in 0..GROUP_ROWS.min(m - g * GROUP_ROWS) {
                    let j = g * GROUP_ROWS + r;
                    codes(
                        &data[j * row_bytes..(j + 1) * row_bytes],
                        &mut row_codes,
                        &mut row_scales,
                    );
                    match layout {
                        Codes::TwoBit => pack_row(group, r, &row_codes),
                        Codes::OneBit => pack_row_bits(group, r, &row_codes),
                        Codes::Bytes => pack_row_bytes(group, r, &row_codes),
                        Codes::Nibbles => pack_row_nibbles(group, r, &row_codes),
                    }
                    for (b, &s) in row_scales.iter().enumerate() {
                        // SAFETY: index (g·nb + b)·16 + r < groups·nb·16 = scales.len(),
                        // and group g is packed by one task only: no two writes alias.
                        unsafe {
                            *scales_ptr.0.add((g * nb + b) * GROUP_ROWS + r) = f16::from_f32(s)
                        };
                    }
                }
            });
            let rows = (g0 * GROUP_ROWS).min(m)..((g0 + slab.len() / n_chunks) * GROUP_ROWS).min(m);
            release(rows.start * row_bytes..rows.end * row_bytes);
        }
        Some(TernaryPack {
            tiles,
            chunks,
            scales,
            // At most 256 (the match above).
            scale_block: scale_block as u32,
            layout,
            token_tile,
            k,
            m,
        })
    }

    /// The token tile of the activations this matrix reads: for the per-token and Q8_K
    /// forms its kernels' [`Tiles::token_tile`], for Q8_0 their
    /// [`Tiles::q8_0_token_tile`] of its codes.
    pub fn token_tile(&self) -> usize {
        self.token_tile
    }

    /// Bytes read by one product (codes and scales).
    pub fn bytes(&self) -> u64 {
        (std::mem::size_of_val(&*self.chunks) + 2 * self.scales.len()) as u64
    }

    fn scale_block(&self) -> usize {
        self.scale_block as usize
    }

    /// The chunks of group `g`.
    fn codes(&self, g: usize) -> &[Chunk] {
        let n = self.k / self.layout.chunk_elems();
        &self.chunks[g * n..(g + 1) * n]
    }

    /// The product with `x` (whose form must be the one the format pairs with: per-token
    /// for I2_S, Q8_K for TQ2_0 / TQ1_0, Q8_0 for Q2_0 / Q1_0 / Q8_0 / Q4_0):
    /// `out[t][j] = dot · post`
    /// in the reference dot's order (I2_S: `((Σ (code − 1)·q) as f32 / scale[t]) · post`,
    /// the order of the AVX2 and scalar paths).
    pub fn forward(&self, x: PackInput<'_>, post: f32, out: &mut [f32]) {
        Self::forward_fused(
            x,
            [Product {
                pack: self,
                post,
                out,
            }],
        );
    }

    /// Several products with the same input as one parallel op (one synchronisation point
    /// where there would be N): each output equals its own [`TernaryPack::forward`] bit for
    /// bit (a group of 16 rows is computed the same way whatever task runs it; a task runs
    /// [`groups_per_task`] consecutive groups of one product).
    pub fn forward_fused<const N: usize>(x: PackInput<'_>, products: [Product<'_>; N]) {
        let rows = products
            .first()
            .map_or(0, |p| p.out.len() / p.pack.m.max(1));
        let pool = pool::global();
        let groups: usize = products.iter().map(|p| p.pack.m.div_ceil(GROUP_ROWS)).sum();
        let per_task = groups_per_task(groups, rows, pool.n_threads());
        let mut first = [0usize; N];
        let mut n_chunks = 0;
        for (f, p) in first.iter_mut().zip(&products) {
            *f = n_chunks;
            n_chunks += p.pack.m.div_ceil(GROUP_ROWS).div_ceil(per_task);
        }
        let parts = products.map(|p| (p.pack, p.post, SharedMut(p.out.as_mut_ptr())));
        pool.run(n_chunks, &|c, _| {
            // The product whose tasks hold chunk c (the last one starting at or before it:
            // a product without rows starts where the next one does).
            let i = first.iter().rposition(|&f| f <= c).unwrap_or(0);
            let (pack, post, out) = &parts[i];
            let g0 = (c - first[i]) * per_task;
            for g in g0..(g0 + per_task).min(pack.m.div_ceil(GROUP_ROWS)) {
                pack.group(x, *post, g, rows, out);
            }
        });
    }

    /// Group `g`'s columns of the product for all `rows` token rows, stored straight into
    /// `out` (`rows × m`, row-major; padding rows dropped).
    fn group(&self, x: PackInput<'_>, post: f32, g: usize, rows: usize, out: &SharedMut<f32>) {
        let k = self.k;
        let codes = self.codes(g);
        let j0 = g * GROUP_ROWS;
        // SAFETY: columns j0..j0 + n < m of the rows × m output belong to group g alone,
        // and every row t < rows lies inside it.
        let o = unsafe { OutCols::new(out.0.add(j0), self.m, rows, GROUP_ROWS.min(self.m - j0)) };
        match x {
            PackInput::PerToken { q, scale, sum } => {
                self.tiles.per_token_dots(codes, q, sum, scale, post, o);
            }
            PackInput::Q8K(x) => {
                let per_group = k / self.scale_block() * GROUP_ROWS;
                let scales = &self.scales[g * per_group..(g + 1) * per_group];
                self.tiles.block_dots(codes, scales, x, post, o);
            }
            PackInput::Q8_0(x) => {
                let per_group = k / self.scale_block() * GROUP_ROWS;
                let scales = &self.scales[g * per_group..(g + 1) * per_group];
                let shape = (self.layout, self.scale_block());
                self.tiles.q8_0_dots(codes, shape, scales, x, post, o);
            }
        }
    }
}

/// Groups of 16 rows one parallel task of a product runs. A decode step's group is 10–28
/// KiB of weights, a few hundred nanoseconds of streaming, so claiming and setting up a
/// task costs a visible share of it: up to eight groups a task where that still leaves at
/// least eight tasks a thread (2B-4T decode on 2 threads: q/k/v 15 % faster, gate/up 8 %,
/// o and down 7 % than one group a task; BENCHMARKS.md, session 26). A prompt's group
/// already carries a tile of tokens: one.
fn groups_per_task(groups: usize, rows: usize, threads: usize) -> usize {
    const MOST: usize = 8;
    if rows > 1 {
        return 1;
    }
    (groups / (8 * threads.max(1))).clamp(1, MOST)
}

/// The quantized activation rows a product reads, in the form its format pairs with.
#[derive(Clone, Copy)]
pub enum PackInput<'a> {
    /// I2_S: per-token int8 values (rows of `k`, in token tiles of the matrix's
    /// [`TernaryPack::token_tile`]), the tokens' scales and Σq.
    PerToken {
        /// Int8 values.
        q: &'a [i8],
        /// Per-token scales.
        scale: &'a [f32],
        /// Per-token sums of `q`.
        sum: &'a [i32],
    },
    /// TQ2_0 / TQ1_0: Q8_K rows, values, block scales and sums in token tiles of the
    /// matrix's [`TernaryPack::token_tile`].
    Q8K(Q8kRows<'a>),
    /// Q2_0 / Q1_0 / Q8_0 / Q4_0: Q8_0 rows, values, block scales and sums in token tiles
    /// of the matrix's [`TernaryPack::token_tile`].
    Q8_0(Q80Rows<'a>),
}

/// One product of [`TernaryPack::forward_fused`].
pub struct Product<'a> {
    /// The weights.
    pub pack: &'a TernaryPack,
    /// The scale multiplied into every output.
    pub post: f32,
    /// The output, `rows × m`, row-major.
    pub out: &'a mut [f32],
}

/// Writes the codes of row `r` (0..16) of a group into its chunks.
fn pack_row(group: &mut [Chunk], r: usize, codes: &[u8]) {
    for (chunk, c) in group.iter_mut().zip(codes.chunks_exact(CHUNK_ELEMS)) {
        for i in 0..4 {
            chunk.0[4 * r + i] = (0..4).fold(0u8, |b, s| b | (c[4 * s + i] << (2 * s)));
        }
    }
}

/// Writes the byte codes of row `r` (0..16) of a group into its chunks: byte 4r + i of
/// chunk c is element 4c + i.
fn pack_row_bytes(group: &mut [Chunk], r: usize, codes: &[u8]) {
    for (chunk, c) in group.iter_mut().zip(codes.chunks_exact(4)) {
        chunk.0[4 * r..4 * r + 4].copy_from_slice(c);
    }
}

/// Writes the nibble codes of row `r` (0..16) of a group into its chunks: byte 4r + i of
/// chunk c holds element 8c + i (low nibble) and 8c + 4 + i (high).
fn pack_row_nibbles(group: &mut [Chunk], r: usize, codes: &[u8]) {
    for (chunk, c) in group.iter_mut().zip(codes.chunks_exact(8)) {
        for i in 0..4 {
            chunk.0[4 * r + i] = c[i] | (c[4 + i] << 4);
        }
    }
}

/// Writes the codes (0 or 2) of row `r` (0..16) of a group into its one-bit chunks: bit
/// 4r + i of 64-bit word 4h + s of chunk c is set when element 32c + 16h + 4s + i is +1.
fn pack_row_bits(group: &mut [Chunk], r: usize, codes: &[u8]) {
    for (chunk, c) in group
        .iter_mut()
        .zip(codes.chunks_exact(Codes::OneBit.chunk_elems()))
    {
        for (word, plane) in chunk.0.chunks_exact_mut(8).zip(c.chunks_exact(4)) {
            let mut w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            for (i, &code) in plane.iter().enumerate() {
                w |= u64::from(code == 2) << (4 * r + i);
            }
            word.copy_from_slice(&w.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests;
