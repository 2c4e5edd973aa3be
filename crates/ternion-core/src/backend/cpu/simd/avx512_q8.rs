//! AVX-512 (F, BW, VNNI) kernel of Q8_0 weights repacked into the interleaved layout of
//! [`super::vnni`] ([`super::vnni::Codes::Bytes`]: each weight's value + 128 as an
//! unsigned byte, chunk c holding elements 4c..4c + 4 of the group's 16 rows), against
//! Q8_0 activations. Callers guarantee the features and the lengths (see
//! [`super::vnni::Vnni::q8_0_dots`]).
//!
//! A chunk is itself the unsigned operand of `vpdpbusd` (no unpacking), and four chunks
//! cover one 16-element unit of the activations' token tiles. Each 32-element block's sum
//! starts at −128·Σq, so that it ends at the exact Σ w·q, and becomes a float in the
//! reference dot's order.

use std::arch::x86_64::*;

use half::f16;

use super::avx512::{scaled, scales16, tile_dots, Dst};
use super::vnni::Chunk;

/// Q8_0 products of the 16 rows of `n_blocks` blocks (8 chunks each) at `w` with a tile of
/// T tokens (their activations laid out by [`super::vnni::interleave_tokens`] at `q`,
/// token t's per-block scales and Σq at `d`, `sum` + t·n_blocks): per block b in order,
/// `y += f32(Σ w·q) · (scale[b][r] · d)`; `out[t] = y · post`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `w` points at `8 · n_blocks` chunks, `scales` at `16 · n_blocks`
/// values, `q` at the tile's `32 · T · n_blocks` bytes, `d` / `sum` at `T · n_blocks`
/// values, `out` T token rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn q8_0_dots<const T: usize>(
    w: *const Chunk,
    scales: *const f16,
    n_blocks: usize,
    q: *const i8,
    d: *const f32,
    sum: *const i32,
    post: f32,
    out: Dst,
) {
    let mut y = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        let mut acc: [__m512i; T] =
            std::array::from_fn(|t| _mm512_set1_epi32(-128 * *sum.add(t * n_blocks + b)));
        for h in 0..2 {
            let c = w.add(8 * b + 4 * h);
            let u = std::array::from_fn(|s| _mm512_load_si512(c.add(s).cast()));
            tile_dots(&u, q, 2 * b + h, &mut acc);
        }
        let dw = scales16(scales.add(16 * b));
        for (t, (yt, a)) in y.iter_mut().zip(&acc).enumerate() {
            *yt = scaled(*yt, *a, *d.add(t * n_blocks + b), dw);
        }
    }
    for (t, yt) in y.iter().enumerate() {
        out.store(t, _mm512_mul_ps(*yt, _mm512_set1_ps(post)));
    }
}
