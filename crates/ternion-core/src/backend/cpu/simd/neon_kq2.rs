//! aarch64 NEON kernels of Q2_K, Q3_K, Q5_K and IQ4_XS against Q8_K activations. Callers
//! guarantee NEON (see `Level::detect`); [`super::neon_dot::run`] picks `sdot` where the
//! CPU has `dotprod`.
//!
//! Layouts (docs/FORMATS.md), 256-element super-blocks:
//! - Q2_K (84 bytes): 16 scale bytes (low nibble scale, high nibble min, one per 16
//!   elements), `qs[64]`, F16 `d`, F16 `dmin`; element 128h + 32j + l is bits 2j of
//!   `qs[32h + l]`.
//! - Q3_K (110 bytes): `hmask[32]`, `qs[64]`, 12 bytes of sixteen 6-bit scales, F16 `d`;
//!   element 128h + 32j + l has low bits 2j of `qs[32h + l]` and high bit 4h + j of
//!   `hmask[l]`, value low − (high ? 0 : 4).
//! - Q5_K (176 bytes): F16 `d`, F16 `dmin`, Q4_K's 12 bytes of scales and mins, `qh[32]`,
//!   `qs[128]`; element 64c + l / 64c + 32 + l is the low / high nibble of `qs[32c + l]`
//!   with bit 2c / 2c + 1 of `qh[l]` as fifth bit.
//! - IQ4_XS (136 bytes): F16 `d`, `scales_h`, `scales_l[4]`, `qs[128]`; sub-block ib is
//!   IQ4_NL's nibble layout over `qs[16ib..16ib + 16]`.
//!
//! The integer sums are exact (per 16 or 32 elements, scaled in i32) and the float
//! combination is the reference's, so the results equal it bit for bit.

use std::arch::aarch64::*;

use super::neon::f16_at;
use super::neon_dot::{check, dot32, Act, Dot, RowDot};
use super::neon_q80::nibbles;
use super::neon_q81::iq4_grid;
use crate::quant::{iq4_xs, q3_k, q4_k::scale_min};

/// Checks a Q8_K product's lengths for blocks of `block_bytes`.
fn check_q8k(row: &[u8], x: Act<'_>, block_bytes: usize, what: &str) {
    check(row, x, (256, block_bytes), 0, what);
}

/// The 2-bit field at bits 2j of every byte of `bytes`.
#[inline(always)]
unsafe fn crumbs(bytes: uint8x16_t, j: usize) -> uint8x16_t {
    let right = vdupq_n_s8(-2 * j as i8);
    vandq_u8(vshlq_u8(bytes, right), vdupq_n_u8(3))
}

/// Σ of the 16 int8 lanes of `x` into four i32 lanes.
#[inline(always)]
unsafe fn sum16(x: int8x16_t) -> int32x4_t {
    vpaddlq_s16(vpaddlq_s8(x))
}

/// Q2_K · Q8_K, as [`crate::quant::q2_k::dot_q8k`].
pub(super) struct Q2K;

impl RowDot for Q2K {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        const BLOCK_BYTES: usize = 84;
        check_q8k(row, x, BLOCK_BYTES, "q2_k_dot_q8k");
        let mut sum = 0f32;
        for (b, &da) in x.d.iter().enumerate() {
            let blk = row.as_ptr().add(BLOCK_BYTES * b);
            let qa = x.q.as_ptr().add(256 * b);
            let (mut isum, mut summs) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for (h, l) in [(0, 0), (0, 16), (1, 0), (1, 16)] {
                let bytes = vld1q_u8(blk.add(16 + 32 * h + l));
                for j in 0..4 {
                    let w = vreinterpretq_s8_u8(crumbs(bytes, j));
                    let xv = vld1q_s8(qa.add(128 * h + 32 * j + l));
                    let sc = *blk.add(8 * h + 2 * j + l / 16);
                    let dot = D::dot16(vdupq_n_s32(0), w, xv);
                    isum = vmlaq_n_s32(isum, dot, i32::from(sc & 0x0F));
                    summs = vmlaq_n_s32(summs, sum16(xv), i32::from(sc >> 4));
                }
            }
            let (isum, summs) = (vaddvq_s32(isum), vaddvq_s32(summs));
            sum += (da * f16_at(blk.add(80))) * isum as f32
                - (da * f16_at(blk.add(82))) * summs as f32;
        }
        sum
    }
}

/// Q3_K · Q8_K, as [`crate::quant::q3_k::dot_q8k`].
pub(super) struct Q3K;

impl RowDot for Q3K {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        const BLOCK_BYTES: usize = 110;
        check_q8k(row, x, BLOCK_BYTES, "q3_k_dot_q8k");
        let four = vdupq_n_u8(4);
        let mut sum = 0f32;
        for (b, &da) in x.d.iter().enumerate() {
            let block = &row[BLOCK_BYTES * b..][..BLOCK_BYTES];
            let blk = block.as_ptr();
            let qa = x.q.as_ptr().add(256 * b);
            let scales: [i32; 16] = std::array::from_fn(|g| q3_k::scale(block, g));
            let mut isum = vdupq_n_s32(0);
            for (h, l) in [(0, 0), (0, 16), (1, 0), (1, 16)] {
                let bytes = vld1q_u8(blk.add(32 + 32 * h + l));
                let hmask = vld1q_u8(blk.add(l));
                for j in 0..4 {
                    let high = vtstq_u8(hmask, vdupq_n_u8(1 << (4 * h + j)));
                    let w = vsubq_u8(crumbs(bytes, j), vbicq_u8(four, high));
                    let xv = vld1q_s8(qa.add(128 * h + 32 * j + l));
                    let dot = D::dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(w), xv);
                    isum = vmlaq_n_s32(isum, dot, scales[8 * h + 2 * j + l / 16]);
                }
            }
            sum += (f16_at(blk.add(108)) * da) * vaddvq_s32(isum) as f32;
        }
        sum
    }
}

/// Q5_K · Q8_K, as [`crate::quant::q5_k::dot_q8k`].
pub(super) struct Q5K;

impl RowDot for Q5K {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        const BLOCK_BYTES: usize = 176;
        check_q8k(row, x, BLOCK_BYTES, "q5_k_dot_q8k");
        let sixteen = vdupq_n_u8(16);
        let mut sum = 0f32;
        for (b, &da) in x.d.iter().enumerate() {
            let block = &row[BLOCK_BYTES * b..][..BLOCK_BYTES];
            let blk = block.as_ptr();
            let qa = x.q.as_ptr().add(256 * b);
            let (mut acc, mut accm) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for c in 0..4 {
                let mut dots = [vdupq_n_s32(0); 2];
                let mut sums = [vdupq_n_s32(0); 2];
                for l in [0, 16] {
                    let low = nibbles(blk.add(48 + 32 * c + l));
                    let qh = vld1q_u8(blk.add(16 + l));
                    for (i, n) in low.into_iter().enumerate() {
                        let fifth = vtstq_u8(qh, vdupq_n_u8(1 << (2 * c + i)));
                        let w = vorrq_u8(n, vandq_u8(fifth, sixteen));
                        let xv = vld1q_s8(qa.add(64 * c + 32 * i + l));
                        dots[i] = D::dot16(dots[i], vreinterpretq_s8_u8(w), xv);
                        sums[i] = vaddq_s32(sums[i], sum16(xv));
                    }
                }
                for i in 0..2 {
                    let (s, m) = scale_min(&block[4..16], 2 * c + i);
                    acc = vmlaq_n_s32(acc, dots[i], s.into());
                    accm = vmlaq_n_s32(accm, sums[i], m.into());
                }
            }
            let (sum_scaled, sum_mins) = (vaddvq_s32(acc), vaddvq_s32(accm));
            sum += da * f16_at(blk) * sum_scaled as f32 - da * f16_at(blk.add(2)) * sum_mins as f32;
        }
        sum
    }
}

/// IQ4_XS · Q8_K, as [`crate::quant::iq4_xs::dot_q8k`].
pub(super) struct Iq4Xs;

impl RowDot for Iq4Xs {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        const BLOCK_BYTES: usize = 136;
        check_q8k(row, x, BLOCK_BYTES, "iq4_xs_dot_q8k");
        let mut sum = 0f32;
        for (b, &da) in x.d.iter().enumerate() {
            let block = &row[BLOCK_BYTES * b..][..BLOCK_BYTES];
            let qa = x.q.as_ptr().add(256 * b);
            let d4d8 = f16_at(block.as_ptr()) * da;
            for ib in 0..8 {
                let w = iq4_grid(nibbles(block.as_ptr().add(8 + 16 * ib)));
                let sumi = dot32::<D>(w, qa.add(32 * ib));
                sum += (d4d8 * iq4_xs::scale(block, ib) as f32) * sumi as f32;
            }
        }
        sum
    }
}
