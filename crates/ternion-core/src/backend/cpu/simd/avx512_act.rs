//! AVX-512 activation quantizers, equal bit for bit to their references in
//! [`crate::quant::act`] (same float operations lane by lane, same integer rounding trick).

use std::arch::x86_64::*;

use crate::quant::act::{self, PerToken};

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
        *qi = act::round_clamp_i8(xi * scale);
        total += i32::from(*qi);
    }
    PerToken { scale, sum: total }
}

/// [`crate::quant::act::quantize_q8k`] of one row, with each block's Σq into `bsum`: per
/// block of 256, `max` is the first element of largest |x| (NaNs never are), an all-zero
/// block gives d = 0 and q = 0, else `iscale = −127 / max`, `q = min(127,
/// nearest_int(iscale · x))` and `d = 1 / iscale`.
///
/// # Panics
/// If `x.len()` is not `256 · d.len()` or `q`, `bsum` do not match it.
///
/// # Safety
/// AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], bsum: &mut [i32]) {
    const BLOCK: usize = 256;
    assert!(
        x.len() == BLOCK * d.len() && q.len() == x.len() && bsum.len() == d.len(),
        "Q8_K: lengths"
    );
    let abs = _mm512_set1_epi32(0x7fff_ffff);
    let magic = _mm512_set1_ps(12_582_912.0);
    let (mant, half) = (
        _mm512_set1_epi32(0x007f_ffff),
        _mm512_set1_epi32(0x0040_0000),
    );
    let top = _mm512_set1_epi32(127);
    for (b, (db, sb)) in d.iter_mut().zip(bsum.iter_mut()).enumerate() {
        let xb = x.as_ptr().add(BLOCK * b);
        let qb = q.as_mut_ptr().add(BLOCK * b);
        let mut amax = _mm512_setzero_ps();
        for i in (0..BLOCK).step_by(16) {
            let v = _mm512_castps_si512(_mm512_loadu_ps(xb.add(i)));
            amax = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(v, abs)), amax);
        }
        let amax = _mm512_reduce_max_ps(amax);
        if amax == 0.0 {
            (*db, *sb) = (0.0, 0);
            std::ptr::write_bytes(qb, 0, BLOCK);
            continue;
        }
        // The first element whose |x| is the maximum (a NaN never compares equal), sixteen
        // compared at a time.
        let target = _mm512_set1_ps(amax);
        let mut at = None;
        for i in (0..BLOCK).step_by(16) {
            let v = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(xb.add(i))), abs);
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_castsi512_ps(v), target);
            if hit != 0 {
                at = Some(i + hit.trailing_zeros() as usize);
                break;
            }
        }
        let max = *xb.add(at.expect("the maximum is one of the block's values"));
        let iscale = -127.0 / max;
        let s = _mm512_set1_ps(iscale);
        let mut sum = _mm512_setzero_si512();
        for i in (0..BLOCK).step_by(16) {
            let v = _mm512_add_ps(_mm512_mul_ps(s, _mm512_loadu_ps(xb.add(i))), magic);
            let r = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), mant), half);
            let r = _mm512_min_epi32(r, top);
            sum = _mm512_add_epi32(sum, _mm512_cvtepi8_epi32(_mm512_cvtepi32_epi8(r)));
            _mm_storeu_si128(qb.add(i).cast(), _mm512_cvtepi32_epi8(r));
        }
        (*db, *sb) = (1.0 / iscale, _mm512_reduce_add_epi32(sum));
    }
}
