//! AVX-512 F kernels of attention over F16 key and value rows: the scores of one query
//! against a run of keys, and the probability-weighted sum of a run of values held in
//! registers. Each result equals what the AVX2 [`super::x86::f16_dot`] /
//! [`super::x86::f16_axpy`] calls it replaces return, bit for bit: a 512-bit accumulator
//! holds two of the AVX2 kernel's 256-bit ones side by side, fed the same products in the
//! same order, and they are reduced in the AVX2 kernel's order.
//!
//! Callers guarantee the features and the lengths (see [`super::f16_scores`]).

use std::arch::x86_64::*;

use half::f16;

/// Sixteen halves at `p` as f32 (exact).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn halves16(p: *const f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// `x86::f16_dot` of the `hd` halves at `k` with the `hd` floats at `q`, for `hd` a multiple
/// of 32: accumulator `a` is AVX2's `acc[0] | acc[1]` (elements 32i..32i+16), `b` its
/// `acc[2] | acc[3]`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot(k: *const f16, q: *const f32, hd: usize) -> f32 {
    let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in (0..hd).step_by(32) {
        a = _mm512_fmadd_ps(halves16(k.add(i)), _mm512_loadu_ps(q.add(i)), a);
        b = _mm512_fmadd_ps(halves16(k.add(i + 16)), _mm512_loadu_ps(q.add(i + 16)), b);
    }
    reduce(a, b)
}

/// The sum of [`dot`]'s two accumulators: (acc0 + acc1) + (acc2 + acc3), then AVX2's
/// horizontal sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce(a: __m512, b: __m512) -> f32 {
    let ab = _mm256_add_ps(_mm512_castps512_ps256(a), high(a));
    let cd = _mm256_add_ps(_mm512_castps512_ps256(b), high(b));
    let v = _mm256_add_ps(ab, cd);
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The upper eight lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn high(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// `out[i] = f16_dot(k_i, q)` for the `out.len()` keys `k_i` of `hd = q.len()` halves at
/// `keys + i·stride`.
///
/// # Safety
/// AVX-512 F; `hd` a multiple of 32; every key row readable.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_scores(q: &[f32], keys: *const f16, stride: usize, out: &mut [f32]) {
    let hd = q.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot(keys.add(i * stride), q.as_ptr(), hd);
    }
}

/// [`f16_scores`] of the G queries at `q` (rows of `hd` floats, `hd` a multiple of 32)
/// against the `n` keys at `keys + i·stride`: `out[g·out_stride + i] = dot(k_i, q_g)`, each
/// key converted once for the G queries, each score computed as [`dot`] computes it.
///
/// # Safety
/// AVX-512 F; `q` holds `G·hd` floats, every key row `hd` halves, `out` every written
/// position.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_scores_heads<const G: usize>(
    q: *const f32,
    hd: usize,
    (keys, stride, n): (*const f16, usize, usize),
    out: *mut f32,
    out_stride: usize,
) {
    for i in 0..n {
        let k = keys.add(i * stride);
        prefetch_row(k.wrapping_add(ROWS_AHEAD * stride), hd);
        let mut a = [_mm512_setzero_ps(); G];
        let mut b = [_mm512_setzero_ps(); G];
        for e in (0..hd).step_by(32) {
            let (k0, k1) = (halves16(k.add(e)), halves16(k.add(e + 16)));
            for (g, (a, b)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
                let qg = q.add(g * hd + e);
                *a = _mm512_fmadd_ps(k0, _mm512_loadu_ps(qg), *a);
                *b = _mm512_fmadd_ps(k1, _mm512_loadu_ps(qg.add(16)), *b);
            }
        }
        for (g, (a, b)) in a.iter().zip(&b).enumerate() {
            *out.add(g * out_stride + i) = reduce(*a, *b);
        }
    }
}

/// Cache rows ahead of the one being read that the attention loops ask the core for (the
/// first rows of a page's run are asked for before the run: `simd::prefetch_f16_rows`).
/// A decode step's rows come from memory (the weights stream evicts them between layers)
/// and a row's work is short, so 4 rows ahead left the loops waiting; 12 took a 2B-4T
/// decode's attention op 5-18 % faster (median 9 %) at 20-270 positions (BENCHMARKS.md,
/// session 26, rows then `kv_dim` apart); with a head's rows contiguous, 24 measured the
/// same as 12 (session 28).
pub const ROWS_AHEAD: usize = 12;

/// Asks for the cache lines of the `len` halves at `p` (no effect on any value; a
/// prefetch never faults, so one past the last row is harmless).
#[inline]
#[target_feature(enable = "sse")]
pub fn prefetch_row(p: *const f16, len: usize) {
    for off in (0..len).step_by(32) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
    }
}

/// Floats of each query's output one pass of [`f16_weighted_sum_heads`] holds in registers.
const HEADS_BLOCK: usize = 64;

/// [`f16_weighted_sum`] of G queries over the same `n` value rows (at `values + i·stride`):
/// `out_g += Σ_i w[g·w_stride + i]·v_i` for the G rows `out_g` of `hd` floats at `out`
/// (`hd` a multiple of 16), each value converted once for the G queries, each element
/// summed as [`f16_weighted_sum`] sums it.
///
/// # Safety
/// AVX-512 F; `w` holds every read weight, every value row `hd` readable halves, `out`
/// `G·hd` floats.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_weighted_sum_heads<const G: usize>(
    (w, w_stride): (*const f32, usize),
    (values, stride, n): (*const f16, usize, usize),
    out: *mut f32,
    hd: usize,
) {
    let rows = (w, w_stride, values, stride, n);
    for c0 in (0..hd).step_by(HEADS_BLOCK) {
        let o = (out.add(c0), hd);
        match (hd - c0).min(HEADS_BLOCK) / 16 {
            4 => heads_block::<G, 4>(rows, c0, o),
            3 => heads_block::<G, 3>(rows, c0, o),
            2 => heads_block::<G, 2>(rows, c0, o),
            _ => heads_block::<G, 1>(rows, c0, o),
        }
    }
}

/// [`f16_weighted_sum_heads`] of the `16 · N` columns from `c0` (each query's at `o.0 +
/// g·o.1`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn heads_block<const G: usize, const N: usize>(
    (w, w_stride, values, stride, n): (*const f32, usize, *const f16, usize, usize),
    c0: usize,
    (o, o_stride): (*mut f32, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); N]; G];
    for (g, acc) in acc.iter_mut().enumerate() {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(o.add(g * o_stride + 16 * j));
        }
    }
    for i in 0..n {
        let v = values.add(i * stride + c0);
        prefetch_row(v.wrapping_add(ROWS_AHEAD * stride), 16 * N);
        let vs: [__m512; N] = std::array::from_fn(|j| halves16(v.add(16 * j)));
        for (g, acc) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(*w.add(g * w_stride + i));
            for (a, vj) in acc.iter_mut().zip(&vs) {
                *a = _mm512_fmadd_ps(wv, *vj, *a);
            }
        }
    }
    for (g, acc) in acc.iter().enumerate() {
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.add(g * o_stride + 16 * j), *a);
        }
    }
}

/// Every value of `v` rounded to the nearest F16 (ties to even, as F16C's `vcvtps2ph`, which
/// the `half` crate uses) and back to f32.
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
pub unsafe fn round_f16(v: &mut [f32]) {
    let mut chunks = v.chunks_exact_mut(16);
    for c in &mut chunks {
        let x = _mm512_loadu_ps(c.as_ptr());
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
    }
    for x in chunks.into_remainder() {
        *x = f16::from_f32(*x).to_f32();
    }
}

/// Floats of `out` one pass over the values holds in registers (16 per register).
const BLOCK: usize = 128;

/// `out += Σ_i w[i]·v_i` over the `w.len()` value rows `v_i` at `values + i·stride`, in
/// order of i, each element by a fused multiply-add (as `f16_axpy`, one row after the
/// other), with up to 128 floats of `out` held in registers.
///
/// # Safety
/// AVX-512 F; `out.len()` a multiple of 16; every value row holds `out.len()` readable
/// halves.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_weighted_sum(w: &[f32], values: *const f16, stride: usize, out: &mut [f32]) {
    for c0 in (0..out.len()).step_by(BLOCK) {
        let (o, v) = (out.as_mut_ptr().add(c0), values.add(c0));
        match (out.len() - c0).min(BLOCK) / 16 {
            8 => weighted_block::<8>(w, v, stride, o),
            7 => weighted_block::<7>(w, v, stride, o),
            6 => weighted_block::<6>(w, v, stride, o),
            5 => weighted_block::<5>(w, v, stride, o),
            4 => weighted_block::<4>(w, v, stride, o),
            3 => weighted_block::<3>(w, v, stride, o),
            2 => weighted_block::<2>(w, v, stride, o),
            _ => weighted_block::<1>(w, v, stride, o),
        }
    }
}

/// [`f16_weighted_sum`] of `16 · N` floats at `o`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_block<const N: usize>(
    w: &[f32],
    values: *const f16,
    stride: usize,
    o: *mut f32,
) {
    let mut acc = [_mm512_setzero_ps(); N];
    for (j, a) in acc.iter_mut().enumerate() {
        *a = _mm512_loadu_ps(o.add(16 * j));
    }
    for (i, &wi) in w.iter().enumerate() {
        let (wv, v) = (_mm512_set1_ps(wi), values.add(i * stride));
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(wv, halves16(v.add(16 * j)), *a);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(o.add(16 * j), *a);
    }
}
