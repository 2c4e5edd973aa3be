//! AVX-512 (F, BW, VNNI) kernel of Q1_0 and Q2_0 weights repacked into the interleaved
//! ternary layout of [`super::vnni`] (codes 0..=3, value = code − 1; Q1_0's bits as 0 or
//! 2), against Q8_0 activations. Callers guarantee the features and the lengths (see
//! [`super::vnni::Vnni::sub_block_dots`]).
//!
//! A 32-element sub-block (one Q8_0 activation block) is two chunks; its exact integer
//! sums (one lane per weight row) become floats in the reference dot's order.

use std::arch::x86_64::*;

use half::f16;

use super::avx512::{chunk_dots, plane_dots, planes, scales16, sum4};
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

/// Σ code·q over sub-block `k` (chunks 2k, 2k + 1) for T tokens at `q + t·stride`, one
/// lane per row (one token: four accumulators, one per plane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sub_block<const T: usize>(
    w: *const Chunk,
    k: usize,
    q: *const i8,
    stride: usize,
) -> [__m512i; T] {
    let mut acc = [_mm512_setzero_si512(); T];
    if T == 1 {
        let mut a4 = [_mm512_setzero_si512(); 4];
        for c in 2 * k..2 * k + 2 {
            plane_dots(&planes(w.add(c)), q.add(16 * c), &mut a4);
        }
        acc[0] = sum4(&a4);
    } else {
        for c in 2 * k..2 * k + 2 {
            chunk_dots(&planes(w.add(c)), q.add(16 * c), stride, &mut acc);
        }
    }
    acc
}

/// Q1_0 / Q2_0 products of the 16 rows of a group with T tokens (token t's activations at
/// `q + t·stride`, its per-sub-block scales and Σq at `d`, `sum` + t·(sub-blocks per
/// row)): per block, s = Σ over its sub-blocks in order, from 0, of d·f32(Σ code·q − Σq);
/// the row sum adds scale·s block after block; `out[t] = row sum · post`. The operations
/// and their order are the reference dot's, lane by lane.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `shape` describes readable weights and scales, every token row at
/// `q` holds `32 · subs · n_blocks` bytes, `d` and `sum` hold T rows of
/// `subs · n_blocks` values and `out` T rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn sub_block_dots<const T: usize>(
    shape: Shape,
    q: *const i8,
    stride: usize,
    d: *const f32,
    sum: *const i32,
    post: f32,
    out: *mut [f32; 16],
) {
    let ns = shape.n_blocks * shape.subs;
    let mut total = [_mm512_setzero_ps(); T];
    for b in 0..shape.n_blocks {
        let mut s = [_mm512_setzero_ps(); T];
        for k in b * shape.subs..(b + 1) * shape.subs {
            let acc = sub_block::<T>(shape.w, k, q, stride);
            for (t, (st, a)) in s.iter_mut().zip(&acc).enumerate() {
                let i = t * ns + k;
                let sumi = _mm512_cvtepi32_ps(_mm512_sub_epi32(*a, _mm512_set1_epi32(*sum.add(i))));
                *st = _mm512_add_ps(*st, _mm512_mul_ps(_mm512_set1_ps(*d.add(i)), sumi));
            }
        }
        let dw = scales16(shape.scales.add(16 * b));
        for (tot, st) in total.iter_mut().zip(&s) {
            *tot = _mm512_add_ps(*tot, _mm512_mul_ps(dw, *st));
        }
    }
    for (t, tot) in total.iter().enumerate() {
        _mm512_storeu_ps(out.add(t).cast(), _mm512_mul_ps(*tot, _mm512_set1_ps(post)));
    }
}
