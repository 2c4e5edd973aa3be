//! AVX-512 activation quantizers, equal bit for bit to their references in
//! [`crate::quant::act`] (same float operations lane by lane, same integer rounding trick).

use std::arch::x86_64::*;

use crate::quant::act::PerToken;

/// [`crate::quant::act::quantize_per_token`]: `m = max(1e-5, max |x|)` (in f64; the f32
/// maximum of |x| converts exactly, and NaNs are skipped as `f64::max` skips them), `s =
/// (127 / m) as f32`, `q = clamp(nearest_int(x · s))` by ggml's `+ 1.5·2^23` trick, Σq.
///
/// # Panics
/// If `q.len() != x.len()`.
///
/// # Safety
/// AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize_per_token(x: &[f32], q: &mut [i8]) -> PerToken {
    assert_eq!(q.len(), x.len(), "per-token quantizer: output length");
    let n16 = x.len() / 16 * 16;
    let abs = _mm512_set1_epi32(0x7fff_ffff);
    let mut amax = _mm512_setzero_ps();
    for i in (0..n16).step_by(16) {
        let v = _mm512_loadu_ps(x.as_ptr().add(i));
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs));
        // A NaN |x| is the first operand: the maximum so far is kept.
        amax = _mm512_max_ps(a, amax);
    }
    let tail = x[n16..].iter().fold(0f32, |m, &v| m.max(v.abs()));
    let m = 1e-5f64
        .max(f64::from(_mm512_reduce_max_ps(amax)))
        .max(f64::from(tail));
    let scale = (127.0 / m) as f32;
    let (s, magic) = (_mm512_set1_ps(scale), _mm512_set1_ps(12_582_912.0));
    let (mant, half) = (
        _mm512_set1_epi32(0x007f_ffff),
        _mm512_set1_epi32(0x0040_0000),
    );
    let (lo, hi) = (_mm512_set1_epi32(-128), _mm512_set1_epi32(127));
    let mut sum = _mm512_setzero_si512();
    for i in (0..n16).step_by(16) {
        let v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(i)), s), magic);
        let r = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), mant), half);
        let r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
        sum = _mm512_add_epi32(sum, r);
        _mm_storeu_si128(q.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(r));
    }
    let mut total = _mm512_reduce_add_epi32(sum);
    for (qi, &xi) in q[n16..].iter_mut().zip(&x[n16..]) {
        let val = xi * scale + 12_582_912.0;
        *qi = ((val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000).clamp(-128, 127) as i8;
        total += i32::from(*qi);
    }
    PerToken { scale, sum: total }
}
