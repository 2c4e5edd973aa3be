//! `exp` of f32 values for the softmax, computed in f64 and rounded once to f32, the same
//! operations at every SIMD level (bit for bit, scalar included) and on every platform (the
//! system's `expf` differs between C libraries).
//!
//! x (clamped to [−200, 100]; NaN passes through) is reduced to r = x − n·ln 2 with
//! n = round(x·log₂e) (ties to even) and ln 2 in two parts (Cody–Waite, by fused
//! multiply-adds); eˣ = 2ⁿ · Σ_{k≤11} rᵏ/k! by Horner's rule in fused multiply-adds
//! (|r| ≤ 0.347: truncation below 2⁻⁴⁷ relative), 2ⁿ made from its exponent bits. The f64
//! result is within ~2⁻⁴⁵ of eˣ, so its rounding to f32 is the correctly rounded value but
//! for x within that distance of a midpoint between two f32; results below f32's range
//! round to its subnormals or 0, above it to +∞.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::Level;

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 to 32 significant bits (n·LN2_HI is exact for |n| < 2²¹), and the rest.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// 1/k! for k = 11 down to 0 (Horner's order).
const POLY: [f64; 12] = [
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];
/// x is clamped to [LO, HI]: e^LO rounds to 0 in f32, e^HI to +∞, and 2ⁿ stays a normal
/// f64.
const LO: f64 = -200.0;
const HI: f64 = 100.0;
/// 1.5 · 2⁵²: adding it to an integer-valued f64 below 2⁵¹ leaves the integer in the low
/// bits of the sum's representation.
const MAGIC: f64 = 6_755_399_441_055_744.0;

/// eˣ as described in the module header.
pub fn exp_f32(x: f32) -> f32 {
    let x = f64::from(x);
    let x = if x.is_nan() { x } else { x.clamp(LO, HI) };
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let scale = f64::from_bits((n + 1023.0 + MAGIC).to_bits() << 52);
    (p * scale) as f32
}

/// `v_i = e^(v_i − shift)` for every value (the difference taken in f32), by [`exp_f32`]
/// at every level.
pub fn exp_shifted(level: Level, v: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the levels prove AVX-512 F, and AVX2 with FMA.
        Level::Avx512 => return unsafe { exp_shifted_avx512(v, shift) },
        Level::Avx2 => return unsafe { exp_shifted_avx2(v, shift) },
        _ => {}
    }
    let _ = level;
    v.iter_mut().for_each(|x| *x = exp_f32(*x - shift));
}

/// The largest value of `v`, NaN values ignored (as a fold of `f32::max` from −∞; which
/// zero of two is not specified either way); −∞ for an empty or all-NaN slice.
pub fn max(level: Level, v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: the level proves AVX-512 F.
        return unsafe { max_avx512(v) };
    }
    let _ = level;
    v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// [`max`] sixteen lanes at a time.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_avx512(v: &[f32]) -> f32 {
    let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut blocks = v.chunks_exact(16);
    for b in &mut blocks {
        // The second operand is returned when either is NaN: a NaN value leaves acc.
        acc = _mm512_max_ps(_mm512_loadu_ps(b.as_ptr()), acc);
    }
    let m = _mm512_reduce_max_ps(acc);
    blocks.remainder().iter().fold(m, |m, &x| m.max(x))
}

/// [`exp_f32`] of four f64 lanes (f32 values widened), as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp4(x: __m256d) -> __m128 {
    // max/min return their second operand when either is NaN: NaN passes through.
    let x = _mm256_min_pd(_mm256_set1_pd(HI), _mm256_max_pd(_mm256_set1_pd(LO), x));
    let n = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(
        x,
        _mm256_set1_pd(LOG2E),
    ));
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), x);
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
    let mut p = _mm256_set1_pd(POLY[0]);
    for &c in &POLY[1..] {
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
    }
    let e = _mm256_add_pd(n, _mm256_set1_pd(1023.0 + MAGIC));
    let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_castpd_si256(e)));
    _mm256_cvtpd_ps(_mm256_mul_pd(p, scale))
}

/// [`exp_shifted`] with AVX2 and FMA, four values at a time.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(v: &mut [f32], shift: f32) {
    let s = _mm_set1_ps(shift);
    let mut quads = v.chunks_exact_mut(4);
    for q in &mut quads {
        let x = _mm_sub_ps(_mm_loadu_ps(q.as_ptr()), s);
        _mm_storeu_ps(q.as_mut_ptr(), exp4(_mm256_cvtps_pd(x)));
    }
    for x in quads.into_remainder() {
        *x = exp_f32(*x - shift);
    }
}

/// [`exp_f32`] of eight f64 lanes, as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp8(x: __m512d) -> __m256 {
    let x = _mm512_min_pd(_mm512_set1_pd(HI), _mm512_max_pd(_mm512_set1_pd(LO), x));
    let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_pd(x, _mm512_set1_pd(LOG2E)),
    );
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_HI), x);
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_LO), r);
    let mut p = _mm512_set1_pd(POLY[0]);
    for &c in &POLY[1..] {
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
    }
    let e = _mm512_add_pd(n, _mm512_set1_pd(1023.0 + MAGIC));
    let scale = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_castpd_si512(e)));
    _mm512_cvtpd_ps(_mm512_mul_pd(p, scale))
}

/// [`exp_shifted`] with AVX-512 F, sixteen values at a time (two sets of eight lanes).
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(v: &mut [f32], shift: f32) {
    let s = _mm512_set1_ps(shift);
    let mut blocks = v.chunks_exact_mut(16);
    for b in &mut blocks {
        let x = _mm512_sub_ps(_mm512_loadu_ps(b.as_ptr()), s);
        let lo = exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
        let hi = exp8(_mm512_cvtps_pd(_mm256_castpd_ps(
            _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)),
        )));
        _mm256_storeu_ps(b.as_mut_ptr(), lo);
        _mm256_storeu_ps(b.as_mut_ptr().add(8), hi);
    }
    for x in blocks.into_remainder() {
        *x = exp_f32(*x - shift);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values across the softmax's range and the edges: zeros, the subnormal and
    /// underflow range, overflow, infinities and NaN.
    fn samples() -> Vec<f32> {
        let mut v: Vec<f32> = (0..20_000)
            .map(|i| -110.0 + i as f32 * 0.0061 + (i % 7) as f32 * 1e-4)
            .collect();
        v.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            -87.33,
            -87.34,
            -103.9,
            -104.0,
            -150.0,
            -1e30,
            88.72,
            88.73,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
        ]);
        v
    }

    #[test]
    fn every_level_equals_the_scalar_exp() {
        let xs = samples();
        // Every level this CPU runs (the kernels take the level given, not the detected one).
        #[cfg(target_arch = "x86_64")]
        let x86 = [
            (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
                .then_some(Level::Avx2),
            is_x86_feature_detected!("avx512f").then_some(Level::Avx512),
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let x86: [Option<Level>; 0] = [];
        let levels = [Level::Scalar, Level::detect()];
        for level in levels.into_iter().chain(x86.into_iter().flatten()) {
            for shift in [0.0f32, 2.5, -1.25] {
                let mut got = xs.clone();
                exp_shifted(level, &mut got, shift);
                for (&x, &g) in xs.iter().zip(&got) {
                    let want = exp_f32(x - shift);
                    let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                    assert!(same, "{level:?}: exp({x} − {shift}) = {g}, scalar {want}");
                }
            }
        }
    }

    #[test]
    fn exp_is_the_rounded_f64_exp() {
        for x in samples() {
            let (got, want) = (exp_f32(x), f64::from(x).exp() as f32);
            if want.is_nan() {
                assert!(got.is_nan(), "exp({x}) = {got}");
                continue;
            }
            // Within an ulp of the f64 libm's value rounded to f32 (equal but for values
            // next to a midpoint between two f32).
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 1, "exp({x}) = {got}, f64 exp rounded {want}");
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert!(exp_f32(-100.0) > 0.0, "subnormal results are kept");
    }

    #[test]
    fn max_ignores_nan_at_every_level() {
        let mut v: Vec<f32> = (0..37).map(|i| ((i * 7) % 23) as f32 - 30.0).collect();
        for level in [Level::Scalar, Level::detect()] {
            assert_eq!(max(level, &v), -8.0);
            assert_eq!(max(level, &[]), f32::NEG_INFINITY);
            assert_eq!(max(level, &[f32::NAN; 20]), f32::NEG_INFINITY);
        }
        v[3] = f32::NAN;
        v[20] = 5.0;
        v[36] = f32::NAN;
        for level in [Level::Scalar, Level::detect()] {
            assert_eq!(max(level, &v), 5.0, "{level:?}");
        }
    }
}
