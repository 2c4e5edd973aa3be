//! AVX-512 (F, BW, VNNI) kernel of Q1_0 and Q2_0 weights repacked into the interleaved
//! ternary layout of [`super::vnni`] (Q2_0: 2-bit codes 0..=3, value = code − 1; Q1_0:
//! one bit per weight, expanded to codes 0 / 2 by a masked byte move), against Q8_0
//! activations. Callers guarantee the features and the lengths (see
//! [`super::vnni::Vnni::q8_0_dots`]).
//!
//! A 32-element sub-block (one Q8_0 activation block) is two 2-bit chunks or one 1-bit
//! chunk; its exact integer sums (one lane per weight row) become floats in the
//! reference dot's order.

use std::arch::x86_64::*;

use half::f16;

use super::avx512::{masked_planes, plane_dots, planes, scales16, sum4, tile_dots, unscale4, Dst};
use super::vnni::Chunk;

/// The weights of one group of 16 rows: `n_blocks` blocks of `subs` sub-blocks (2·subs
/// chunks each) at `w`, and their scales, 16 per block, at `scales`.
#[derive(Clone, Copy)]
pub struct Shape {
    /// The group's chunks.
    pub w: *const Chunk,
    /// The group's block scales, block-major.
    pub scales: *const f16,
    /// Weight blocks per row.
    pub n_blocks: usize,
    /// 32-element sub-blocks per weight block.
    pub subs: usize,
}

/// The four code planes of 16 elements (half `h` of sub-block `k`): 2-bit codes from
/// chunk 2k + h ([`planes`]), or (`BITS` = 1) bytes 0 / 2 from the four 64-bit masks of
/// half h of chunk k.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn half_planes<const BITS: usize>(w: *const Chunk, k: usize, h: usize) -> [__m512i; 4] {
    if BITS == 1 {
        let masks = w.add(k).cast::<u64>().add(4 * h);
        let two = _mm512_set1_epi8(2);
        std::array::from_fn(|s| _mm512_maskz_mov_epi8(masks.add(s).read(), two))
    } else {
        planes(w.add(2 * k + h))
    }
}

/// Σ code·q over sub-block `k` (elements 32k..32k + 32) for a tile of T tokens laid out
/// by [`super::vnni::interleave_tokens`] at `q`, one lane per row (one token: four
/// accumulators, one per plane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sub_block<const T: usize, const BITS: usize>(
    w: *const Chunk,
    k: usize,
    q: *const i8,
) -> [__m512i; T] {
    let mut acc = [_mm512_setzero_si512(); T];
    if T == 1 {
        // 2-bit codes as masked planes (no shifts), 1-bit ones as bytes 0 / 2.
        let mut a4 = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let u = match BITS {
                1 => half_planes::<1>(w, k, h),
                _ => masked_planes(w.add(2 * k + h)),
            };
            plane_dots(&u, q.add(32 * k + 16 * h), &mut a4);
        }
        acc[0] = match BITS {
            1 => sum4(&a4),
            _ => unscale4(&a4),
        };
    } else {
        for h in 0..2 {
            tile_dots(&half_planes::<BITS>(w, k, h), q, 2 * k + h, &mut acc);
        }
    }
    acc
}

/// Q1_0 / Q2_0 products of the 16 rows of a group with a tile of T tokens (their
/// activations laid out by [`super::vnni::interleave_tokens`] at `q`, token t's
/// per-sub-block scales and Σq at `d`, `sum` + t·(sub-blocks per row)): per block,
/// s = Σ over its sub-blocks in order, from 0, of d·f32(Σ code·q − Σq); the row sum adds
/// scale·s block after block; `out[t] = row sum · post`. The operations
/// and their order are the reference dot's, lane by lane.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `shape` describes readable weights and scales, `q` holds the tile's
/// `32 · subs · n_blocks · T` bytes, `d` and `sum` hold T rows of
/// `subs · n_blocks` values and `out` T rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn sub_block_dots<const T: usize, const BITS: usize>(
    shape: Shape,
    q: *const i8,
    d: *const f32,
    sum: *const i32,
    post: f32,
    out: Dst,
) {
    let mut total = [_mm512_setzero_ps(); T];
    for b in 0..shape.n_blocks {
        let mut s = [_mm512_setzero_ps(); T];
        for k in b * shape.subs..(b + 1) * shape.subs {
            let acc = sub_block::<T, BITS>(shape.w, k, q);
            // The tile's values of sub-block k, token after token (fixed offsets).
            let (dk, sk) = (d.add(k * T), sum.add(k * T));
            for (t, (st, a)) in s.iter_mut().zip(&acc).enumerate() {
                let sumi = _mm512_cvtepi32_ps(_mm512_sub_epi32(*a, _mm512_set1_epi32(*sk.add(t))));
                *st = _mm512_add_ps(*st, _mm512_mul_ps(_mm512_set1_ps(*dk.add(t)), sumi));
            }
        }
        let dw = scales16(shape.scales.add(16 * b));
        for (tot, st) in total.iter_mut().zip(&s) {
            *tot = _mm512_add_ps(*tot, _mm512_mul_ps(dw, *st));
        }
    }
    for (t, tot) in total.iter().enumerate() {
        out.store(t, _mm512_mul_ps(*tot, _mm512_set1_ps(post)));
    }
}
