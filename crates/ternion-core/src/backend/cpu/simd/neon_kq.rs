//! aarch64 NEON kernels of the K-quants against Q8_K activations. Callers guarantee the
//! feature (see `Level::detect`).
//!
//! Layouts (docs/FORMATS.md), 256-element super-blocks:
//! - Q4_K (144 bytes): F16 `d`, F16 `dmin`, 12 bytes of packed 6-bit scales and mins, then
//!   128 bytes; byte m of chunk c (32 bytes) holds element 64c + m (low nibble, scale 2c)
//!   and 64c + 32 + m (high nibble, scale 2c + 1).
//! - Q6_K (210 bytes): 128 bytes `ql`, 64 bytes `qh`, 16 i8 scales (one per 16 elements),
//!   F16 `d`; in half h, byte l of `ql[64h..]` / `ql[64h + 32..]` gives elements 128h + l /
//!   128h + 32 + l (low nibbles) and 128h + 64 + l / 128h + 96 + l (high nibbles), the two
//!   high bits coming from `qh[32h + l]` at shifts 0, 2, 4, 6; value = q6 − 32.
//!
//! The integer sums are exact (i16 products of at most four terms, scaled into i32) and the
//! float combination is the reference's, so the results equal it bit for bit.

use std::arch::aarch64::*;

use super::neon::f16_at;

/// Σ over pairs of lanes of w·x (16 lanes into 8 i16 sums; exact while |w·x| < 2¹⁴).
#[inline]
#[target_feature(enable = "neon")]
fn prod16(w: int8x16_t, x: int8x16_t) -> int16x8_t {
    vaddq_s16(
        vmull_s8(vget_low_s8(w), vget_low_s8(x)),
        vmull_high_s8(w, x),
    )
}

/// `acc + s · p` lane by lane (eight i16 products widened into four i32 lanes).
#[inline]
#[target_feature(enable = "neon")]
fn mla_scaled(acc: int32x4_t, p: int16x8_t, s: i16) -> int32x4_t {
    vmlal_high_n_s16(vmlal_n_s16(acc, vget_low_s16(p), s), p, s)
}

/// Q4_K row against Q8_K activations, as [`crate::quant::q4_k::dot_q8k`].
#[target_feature(enable = "neon")]
pub unsafe fn q4_k_dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 144;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256,
        "q4_k_dot_q8k: lengths"
    );
    let mask = vdupq_n_u8(0x0F);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = &row[b * BLOCK_BYTES..][..BLOCK_BYTES];
        let scales = &blk[4..16];
        let qa = q.as_ptr().add(256 * b);
        let mut acc = vdupq_n_s32(0);
        let mut accm = vdupq_n_s32(0);
        for c in 0..4 {
            let (mut pl, mut ph) = (vdupq_n_s16(0), vdupq_n_s16(0));
            let (mut xsl, mut xsh) = (vdupq_n_s16(0), vdupq_n_s16(0));
            for i in 0..2 {
                let bytes = vld1q_u8(blk.as_ptr().add(16 + 32 * c + 16 * i));
                let lo = vreinterpretq_s8_u8(vandq_u8(bytes, mask));
                let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(bytes));
                let xl = vld1q_s8(qa.add(64 * c + 16 * i));
                let xh = vld1q_s8(qa.add(64 * c + 32 + 16 * i));
                pl = vaddq_s16(pl, prod16(lo, xl));
                ph = vaddq_s16(ph, prod16(hi, xh));
                xsl = vaddq_s16(xsl, vpaddlq_s8(xl));
                xsh = vaddq_s16(xsh, vpaddlq_s8(xh));
            }
            let (s0, m0) = crate::quant::q4_k::scale_min(scales, 2 * c);
            let (s1, m1) = crate::quant::q4_k::scale_min(scales, 2 * c + 1);
            acc = mla_scaled(mla_scaled(acc, pl, s0.into()), ph, s1.into());
            accm = mla_scaled(mla_scaled(accm, xsl, m0.into()), xsh, m1.into());
        }
        let (sum_scaled, sum_mins) = (vaddvq_s32(acc), vaddvq_s32(accm));
        let dd = da * f16_at(blk.as_ptr());
        let dm = da * f16_at(blk.as_ptr().add(2));
        sum += dd * sum_scaled as f32 - dm * sum_mins as f32;
    }
    sum
}

/// Q6_K row against Q8_K activations, as [`crate::quant::q6_k::dot_q8k`].
#[target_feature(enable = "neon")]
pub unsafe fn q6_k_dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 210;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256,
        "q6_k_dot_q8k: lengths"
    );
    let m4 = vdupq_n_u8(0x0F);
    let m2 = vdupq_n_u8(3);
    let c32 = vdupq_n_s8(32);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = &row[b * BLOCK_BYTES..][..BLOCK_BYTES];
        let p = blk.as_ptr();
        let qa = q.as_ptr().add(256 * b);
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            for l in [0, 16] {
                let ql0 = vld1q_u8(p.add(64 * h + l));
                let ql1 = vld1q_u8(p.add(64 * h + 32 + l));
                let qh = vld1q_u8(p.add(128 + 32 * h + l));
                let high = [
                    vandq_u8(qh, m2),
                    vandq_u8(vshrq_n_u8::<2>(qh), m2),
                    vandq_u8(vshrq_n_u8::<4>(qh), m2),
                    vshrq_n_u8::<6>(qh),
                ];
                let low = [
                    vandq_u8(ql0, m4),
                    vandq_u8(ql1, m4),
                    vshrq_n_u8::<4>(ql0),
                    vshrq_n_u8::<4>(ql1),
                ];
                for k in 0..4 {
                    let v = vorrq_u8(low[k], vshlq_n_u8::<4>(high[k]));
                    let w = vsubq_s8(vreinterpretq_s8_u8(v), c32);
                    let x = vld1q_s8(qa.add(128 * h + 32 * k + l));
                    let s = blk[192 + 8 * h + 2 * k + l / 16] as i8;
                    acc = mla_scaled(acc, prod16(w, x), s.into());
                }
            }
        }
        sum += f16_at(p.add(208)) * da * vaddvq_s32(acc) as f32;
    }
    sum
}
