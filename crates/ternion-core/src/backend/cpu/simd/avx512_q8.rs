//! AVX-512 (F, BW, VNNI) kernel of Q8_0 and Q4_0 weights repacked into the interleaved
//! layout of [`super::vnni`] ([`super::vnni::Codes::Bytes`]: each Q8_0 weight's value +
//! 128 as an unsigned byte, chunk c holding elements 4c..4c + 4 of the group's 16 rows;
//! [`super::vnni::Codes::Nibbles`]: each Q4_0 weight's nibble, chunk c holding elements
//! 8c..8c + 8), against Q8_0 activations. Callers guarantee the features and the lengths
//! (see [`super::vnni::Vnni::q8_0_dots`]).
//!
//! A byte chunk is itself the unsigned operand of `vpdpbusd`; a nibble chunk gives two
//! (its low and high nibbles). Four such operands cover one 16-element unit of the
//! activations' token tiles. Each 32-element block's sum starts at −offset·Σq (offset
//! 128 or 8), so that it ends at the exact Σ w·q, and becomes a float in the reference
//! dot's order.

use std::arch::x86_64::*;

use half::f16;

use super::avx512::{scaled, scales16, tile_dots, Dst};
use super::vnni::Chunk;

/// The four `vpdpbusd` operands of 16-element unit `u` (elements 16u..16u + 16 of the
/// 16 rows, four consecutive elements of each row per operand): four byte chunks, or the
/// low and high nibbles of two nibble chunks (`Q4`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unit<const Q4: bool>(w: *const Chunk, u: usize) -> [__m512i; 4] {
    if Q4 {
        let m = _mm512_set1_epi8(0x0F);
        let (a, b) = (
            _mm512_load_si512(w.add(2 * u).cast()),
            _mm512_load_si512(w.add(2 * u + 1).cast()),
        );
        [
            _mm512_and_si512(a, m),
            _mm512_and_si512(_mm512_srli_epi16::<4>(a), m),
            _mm512_and_si512(b, m),
            _mm512_and_si512(_mm512_srli_epi16::<4>(b), m),
        ]
    } else {
        std::array::from_fn(|s| _mm512_load_si512(w.add(4 * u + s).cast()))
    }
}

/// Q8_0 (`Q4` false) or Q4_0 (`Q4`) products of the 16 rows of `n_blocks` blocks at `w`
/// with a tile of T tokens (their activations laid out by
/// [`super::vnni::interleave_tokens`] at `q`, token t's per-block scales and Σq at `d`,
/// `sum` + b·T + t, laid out by [`super::vnni::interleave_blocks`]): per block b in order, Q8_0 `y += f32(Σ w·q) · (scale[b][r] · d)`,
/// Q4_0 `y += (f32(Σ w·q) · scale[b][r]) · d`; `out[t] = y · post`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `w` points at the group's chunks (32 bytes or 16 bytes of codes per
/// row and block), `scales` at `16 · n_blocks` values, `q` at the tile's `32 · T ·
/// n_blocks` bytes, `d` / `sum` at `T · n_blocks` values, `out` T token rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block32_dots<const T: usize, const Q4: bool>(
    w: *const Chunk,
    scales: *const f16,
    n_blocks: usize,
    q: *const i8,
    d: *const f32,
    sum: *const i32,
    post: f32,
    out: Dst,
) {
    let offset = if Q4 { 8 } else { 128 };
    let mut y = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        // The tile's values of block b, token after token (fixed offsets).
        let (db, sb) = (d.add(b * T), sum.add(b * T));
        let mut acc: [__m512i; T] =
            std::array::from_fn(|t| _mm512_set1_epi32(-offset * *sb.add(t)));
        for u in 2 * b..2 * b + 2 {
            tile_dots(&unit::<Q4>(w, u), q, u, &mut acc);
        }
        let dw = scales16(scales.add(16 * b));
        for (t, (yt, a)) in y.iter_mut().zip(&acc).enumerate() {
            let da = *db.add(t);
            *yt = if Q4 {
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(*a), dw);
                _mm512_add_ps(*yt, _mm512_mul_ps(v, _mm512_set1_ps(da)))
            } else {
                scaled(*yt, *a, da, dw)
            };
        }
    }
    for (t, yt) in y.iter().enumerate() {
        out.store(t, _mm512_mul_ps(*yt, _mm512_set1_ps(post)));
    }
}
