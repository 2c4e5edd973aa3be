//! AVX2 activation quantizers for CPUs without AVX-512, equal bit for bit to their
//! references in [`crate::quant::act`] (the operations of [`super::avx512_act`], eight
//! lanes at a time).

use std::arch::x86_64::*;

use super::x86::hsum_i32;
use crate::quant::act::{self, PerToken};

/// The largest of the eight lanes of `v` (none is NaN).
#[inline]
#[target_feature(enable = "avx2")]
fn max8(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
}

/// The low bytes of `r`'s eight lanes (`as i8`) stored at `q`; returns them widened back
/// to 32 bits, sign-extended (what a sum of the stored bytes adds).
///
/// # Safety
/// AVX2; `q` has room for 8 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store8(q: *mut i8, r: __m256i) -> __m256i {
    let low = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    // Bytes 0..3 of each 128-bit half hold lanes 0..3 and 4..7.
    let b = _mm256_shuffle_epi8(r, low);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    let b = _mm256_castsi256_si128(b);
    _mm_storel_epi64(q.cast(), b);
    _mm256_cvtepi8_epi32(b)
}

/// [`crate::quant::act::quantize_per_token`]: `m = max(1e-5, max |x|)` (in f64; the f32
/// maximum of |x| converts exactly, and NaNs are skipped as `f64::max` skips them), `s =
/// (127 / m) as f32`, `q = clamp(nearest_int(x · s))` by ggml's `+ 1.5·2^23` trick, Σq.
///
/// # Panics
/// If `q.len() != x.len()`.
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_per_token(x: &[f32], q: &mut [i8]) -> PerToken {
    assert_eq!(q.len(), x.len(), "per-token quantizer: output length");
    let n8 = x.len() / 8 * 8;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut amax = _mm256_setzero_ps();
    for i in (0..n8).step_by(8) {
        let a = _mm256_and_ps(_mm256_loadu_ps(x.as_ptr().add(i)), abs);
        // A NaN |x| is the first operand: the maximum so far is kept.
        amax = _mm256_max_ps(a, amax);
    }
    let tail = x[n8..].iter().fold(0f32, |m, &v| m.max(v.abs()));
    let m = 1e-5f64.max(f64::from(max8(amax))).max(f64::from(tail));
    let scale = (127.0 / m) as f32;
    let (s, magic) = (_mm256_set1_ps(scale), _mm256_set1_ps(12_582_912.0));
    let (mant, half) = (
        _mm256_set1_epi32(0x007f_ffff),
        _mm256_set1_epi32(0x0040_0000),
    );
    let (lo, hi) = (_mm256_set1_epi32(-128), _mm256_set1_epi32(127));
    let mut sum = _mm256_setzero_si256();
    for i in (0..n8).step_by(8) {
        let v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s), magic);
        let r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), half);
        let r = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
        sum = _mm256_add_epi32(sum, store8(q.as_mut_ptr().add(i), r));
    }
    let mut total = hsum_i32(sum);
    for (qi, &xi) in q[n8..].iter_mut().zip(&x[n8..]) {
        *qi = act::round_clamp_i8(xi * scale);
        total += i32::from(*qi);
    }
    PerToken { scale, sum: total }
}

/// [`crate::quant::act::quantize_q8k`] of one row, with each block's Σq into `bsum`: per
/// block of 256, `max` is the first element of largest |x| (NaNs never are), an all-zero
/// block gives d = 0 and q = 0, else `iscale = −127 / max`, `q = min(127,
/// nearest_int(iscale · x))` (as `i8`) and `d = 1 / iscale`.
///
/// # Panics
/// If `x.len()` is not `256 · d.len()` or `q`, `bsum` do not match it.
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], bsum: &mut [i32]) {
    const BLOCK: usize = 256;
    assert!(
        x.len() == BLOCK * d.len() && q.len() == x.len() && bsum.len() == d.len(),
        "Q8_K: lengths"
    );
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let magic = _mm256_set1_ps(12_582_912.0);
    let (mant, half) = (
        _mm256_set1_epi32(0x007f_ffff),
        _mm256_set1_epi32(0x0040_0000),
    );
    let top = _mm256_set1_epi32(127);
    for (b, (db, sb)) in d.iter_mut().zip(bsum.iter_mut()).enumerate() {
        let xb = x.as_ptr().add(BLOCK * b);
        let qb = q.as_mut_ptr().add(BLOCK * b);
        let mut amax = _mm256_setzero_ps();
        for i in (0..BLOCK).step_by(8) {
            amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb.add(i)), abs), amax);
        }
        let amax = max8(amax);
        if amax == 0.0 {
            (*db, *sb) = (0.0, 0);
            std::ptr::write_bytes(qb, 0, BLOCK);
            continue;
        }
        // The first element whose |x| is the maximum (a NaN never compares equal), eight
        // compared at a time.
        let target = _mm256_set1_ps(amax);
        let mut at = None;
        for i in (0..BLOCK).step_by(8) {
            let v = _mm256_and_ps(_mm256_loadu_ps(xb.add(i)), abs);
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, target));
            if hit != 0 {
                at = Some(i + hit.trailing_zeros() as usize);
                break;
            }
        }
        let max = *xb.add(at.expect("the maximum is one of the block's values"));
        let iscale = -127.0 / max;
        let s = _mm256_set1_ps(iscale);
        let mut sum = _mm256_setzero_si256();
        for i in (0..BLOCK).step_by(8) {
            let v = _mm256_add_ps(_mm256_mul_ps(s, _mm256_loadu_ps(xb.add(i))), magic);
            let r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), half);
            sum = _mm256_add_epi32(sum, store8(qb.add(i), _mm256_min_epi32(r, top)));
        }
        (*db, *sb) = (1.0 / iscale, hsum_i32(sum));
    }
}
