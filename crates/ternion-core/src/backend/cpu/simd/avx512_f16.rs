//! AVX-512 F kernel of a matrix-vector product over F16 rows (an exact LM head, F16
//! models' matrices): one row against one or two f32 activation rows.
//!
//! Layout and order: a row of `n` halves is read 128 at a time (four cache lines) into
//! [`ACCS`] accumulators of 16 lanes, accumulator `a` taking halves `128i + 16a ..`; what
//! is left is read 16 at a time into accumulator 0, then one at a time into the scalar
//! sum. The accumulators are added pairwise ((0+1)+(2+3))+((4+5)+(6+7)), reduced across
//! lanes, and the scalar tail added last. Eight independent FMA chains keep a core ahead of
//! the memory stream where the AVX2 kernel's four (of 8 lanes) made it wait on the FMA
//! latency (BENCHMARKS.md, session 26). The two-row form keeps each row's order, so every
//! result equals the one-row kernel's bit for bit, whatever the batch.
//!
//! Callers guarantee the features and the lengths (see [`super::f16_dot`]).

use std::arch::x86_64::*;

use super::x86::prefetch_ahead;

/// Independent accumulators of one row.
const ACCS: usize = 8;
/// Halves one step of the main loop reads.
const STEP: usize = 16 * ACCS;

/// Σ w_i·x_i for the `x.len()` little-endian F16 values at `w`.
///
/// # Safety
/// AVX-512 F; `w` points at `x.len()` readable halves.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_dot(w: *const u16, x: &[f32]) -> f32 {
    let [s] = dots(w, [x]);
    s
}

/// [`f16_dot`] of one row against four activation rows (two passes of two), each result
/// equal to `f16_dot` of that row bit for bit.
///
/// # Safety
/// AVX-512 F; `w` points at `n` readable halves, where every `x[t]` holds `n` values.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_dot4(w: *const u16, x: [&[f32]; 4]) -> [f32; 4] {
    let [a, b] = dots(w, [x[0], x[1]]);
    let [c, d] = dots(w, [x[2], x[3]]);
    [a, b, c, d]
}

/// The row at `w` against the `R` rows of `x` (R ≤ 2: 8·R accumulators stay in registers),
/// each in the order the module header gives.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dots<const R: usize>(w: *const u16, x: [&[f32]; R]) -> [f32; R] {
    let n = x[0].len();
    let mut acc = [[_mm512_setzero_ps(); ACCS]; R];
    let mut i = 0;
    while i + STEP <= n {
        for line in (0..STEP).step_by(32) {
            prefetch_ahead(w.add(i + line).cast());
        }
        for a in 0..ACCS {
            let wv = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(i + 16 * a).cast()));
            for (acc, xr) in acc.iter_mut().zip(&x) {
                let xv = _mm512_loadu_ps(xr.as_ptr().add(i + 16 * a));
                acc[a] = _mm512_fmadd_ps(wv, xv, acc[a]);
            }
        }
        i += STEP;
    }
    while i + 16 <= n {
        let wv = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(i).cast()));
        for (acc, xr) in acc.iter_mut().zip(&x) {
            acc[0] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xr.as_ptr().add(i)), acc[0]);
        }
        i += 16;
    }
    let mut sums = acc.map(|a| {
        let lo = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        let hi = _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7]));
        _mm512_reduce_add_ps(_mm512_add_ps(lo, hi))
    });
    while i < n {
        let wv = half::f16::from_bits(w.add(i).read_unaligned()).to_f32();
        for (s, xr) in sums.iter_mut().zip(&x) {
            *s += wv * xr[i];
        }
        i += 1;
    }
    sums
}
