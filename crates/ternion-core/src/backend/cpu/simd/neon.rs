//! aarch64 NEON kernels of the ternary formats, and the integer helpers the other NEON
//! modules share. Callers guarantee the feature (see `Level::detect`).
//!
//! Layouts (docs/FORMATS.md), codes c = t + 1:
//! - I2_S: 32 bytes per 128 elements; byte m holds elements m, 32 + m, 64 + m, 96 + m at
//!   shifts 6, 4, 2, 0.
//! - TQ2_0: 66-byte blocks of 256; byte m of half h (32 bytes) holds element 128h + 32n + m
//!   at shift 2n; then the F16 scale.
//! - TQ1_0: 54-byte blocks of 256; bytes 0..32 hold elements 32n + m (n = 0..5), bytes
//!   32..48 elements 160 + 16n + m, bytes 48..52 elements 240 + 4n + m (n = 0..4), trit n
//!   of byte b being ((b · 3ⁿ mod 256) · 3) >> 8; then the F16 scale.
//!
//! Every kernel forms exact i32 sums Σ c·q (widening i8 × i8 → i16 products, added in
//! pairs into i32), subtracts Σq, and combines the block sums in the reference dot's float
//! order, so the results equal the scalar references bit for bit.

use std::arch::aarch64::*;

/// `acc` plus Σ c_i·q_i over 16 lanes, in pairs into the four i32 lanes (exact for any
/// i8 values).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn mla16(acc: int32x4_t, c: int8x16_t, q: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(c), vget_low_s8(q));
    vpadalq_s16(vpadalq_s16(acc, lo), vmull_high_s8(c, q))
}

/// Σ c_i·q_i over 32 elements (codes in two halves) against the activations at `q`.
///
/// # Safety
/// `q` must point at 32 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot32(c: [int8x16_t; 2], q: *const i8) -> i32 {
    let acc = mla16(vdupq_n_s32(0), c[0], vld1q_s8(q));
    vaddvq_s32(mla16(acc, c[1], vld1q_s8(q.add(16))))
}

/// 0xFF in lane e where bit e % 8 of `lo` (lanes 0..8) or `hi` (lanes 8..16) is set.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn bit_mask(lo: u8, hi: u8) -> uint8x16_t {
    let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vtstq_u8(vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi)), bits)
}

/// The little-endian F16 at `p`, as f32.
///
/// # Safety
/// `p` must point at 2 readable bytes.
#[inline]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([*p, p.add(1).read()])).to_f32()
}

/// The four 16-code groups of 16 I2_S (or TQ2_0) bytes, at shifts 6, 4, 2, 0.
#[inline]
#[target_feature(enable = "neon")]
fn unpack(w: uint8x16_t) -> [int8x16_t; 4] {
    let mask = vdupq_n_u8(3);
    [
        vandq_u8(vshrq_n_u8::<6>(w), mask),
        vandq_u8(vshrq_n_u8::<4>(w), mask),
        vandq_u8(vshrq_n_u8::<2>(w), mask),
        vandq_u8(w, mask),
    ]
    .map(|c| vreinterpretq_s8_u8(c))
}

/// Σ (code_i − 1)·q_i over one I2_S row; `q_sum` = Σ q_i.
#[target_feature(enable = "neon")]
pub unsafe fn i2s_dot(row: &[u8], q: &[i8], q_sum: i32) -> i32 {
    i2s_dots(row, [q], [q_sum])[0]
}

/// [`i2s_dot`] of one row against four activation rows: the codes are unpacked once.
#[target_feature(enable = "neon")]
pub unsafe fn i2s_dot4(row: &[u8], q: [&[i8]; 4], q_sum: [i32; 4]) -> [i32; 4] {
    i2s_dots(row, q, q_sum)
}

/// [`i2s_dot`] against T activation rows.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn i2s_dots<const T: usize>(row: &[u8], q: [&[i8]; T], q_sum: [i32; T]) -> [i32; T] {
    for qt in q {
        assert_eq!(
            row.len() * 4,
            qt.len(),
            "i2s_dot: row and activations differ in length"
        );
    }
    let mut acc = [vdupq_n_s32(0); T];
    for b in 0..row.len() / 32 {
        for half in 0..2 {
            let codes = unpack(vld1q_u8(row.as_ptr().add(32 * b + 16 * half)));
            for (a, qt) in acc.iter_mut().zip(q) {
                let qp = qt.as_ptr().add(128 * b + 16 * half);
                for (g, &c) in codes.iter().enumerate() {
                    *a = mla16(*a, c, vld1q_s8(qp.add(32 * g)));
                }
            }
        }
    }
    std::array::from_fn(|t| vaddvq_s32(acc[t]) - q_sum[t])
}

/// TQ2_0 row against Q8_K activations: per block Σ (code − 1)·q exactly, then
/// `sumi · (d_act · d_w)` summed in block order (the reference's float order).
#[target_feature(enable = "neon")]
pub unsafe fn tq2_dot_q8k(row: &[u8], q: &[i8], d: &[f32], bsums: &[i32]) -> f32 {
    const BLOCK_BYTES: usize = 66;
    let nb = row.len() / BLOCK_BYTES;
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256 && d.len() == nb && bsums.len() == nb,
        "tq2_dot_q8k: lengths"
    );
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let qb = q.as_ptr().add(256 * b);
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            for half in 0..2 {
                // `unpack` yields shifts 6, 4, 2, 0: groups n = 3, 2, 1, 0.
                let codes = unpack(vld1q_u8(blk.add(32 * h + 16 * half)));
                for (g, &c) in codes.iter().enumerate() {
                    let qp = qb.add(128 * h + 32 * (3 - g) + 16 * half);
                    acc = mla16(acc, c, vld1q_s8(qp));
                }
            }
        }
        let sumi = vaddvq_s32(acc) - bsums[b];
        sum += sumi as f32 * (d[b] * f16_at(blk.add(64)));
    }
    sum
}

/// The trits (as codes 0..=2) at position n of 16 TQ1_0 bytes, `pow` holding 3ⁿ per lane.
#[inline]
#[target_feature(enable = "neon")]
fn trits(w: uint8x16_t, pow: uint8x16_t) -> int8x16_t {
    let v = vmulq_u8(w, pow);
    let three = vdup_n_u8(3);
    let lo = vshrn_n_u16::<8>(vmull_u8(vget_low_u8(v), three));
    let hi = vshrn_n_u16::<8>(vmull_high_u8(v, vdupq_n_u8(3)));
    vreinterpretq_s8_u8(vcombine_u8(lo, hi))
}

/// TQ1_0 row against Q8_K activations: per block Σ (trit code − 1)·q exactly, then
/// `sumi · (d_w · d_act)` summed in block order, as [`crate::quant::tq1_0::dot_q8k`].
#[target_feature(enable = "neon")]
pub unsafe fn tq1_dot_q8k(row: &[u8], q: &[i8], d: &[f32], bsums: &[i32]) -> f32 {
    const BLOCK_BYTES: usize = 54;
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let nb = row.len() / BLOCK_BYTES;
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256 && d.len() == nb && bsums.len() == nb,
        "tq1_dot_q8k: lengths"
    );
    // Lane 4n + m of the tail vector is byte 48 + m times 3ⁿ.
    let tail_pow = vreinterpretq_u8_u64(vcombine_u64(
        vcreate_u64(0x0303_0303_0101_0101),
        vcreate_u64(0x1b1b_1b1b_0909_0909),
    ));
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let qb = q.as_ptr().add(256 * b);
        let w = [vld1q_u8(blk), vld1q_u8(blk.add(16)), vld1q_u8(blk.add(32))];
        let mut acc = vdupq_n_s32(0);
        for (n, &p) in POW3.iter().enumerate() {
            let pow = vdupq_n_u8(p);
            acc = mla16(acc, trits(w[0], pow), vld1q_s8(qb.add(32 * n)));
            acc = mla16(acc, trits(w[1], pow), vld1q_s8(qb.add(32 * n + 16)));
            acc = mla16(acc, trits(w[2], pow), vld1q_s8(qb.add(160 + 16 * n)));
        }
        let tail = vreinterpretq_u8_u32(vdupq_n_u32(blk.add(48).cast::<u32>().read_unaligned()));
        acc = mla16(acc, trits(tail, tail_pow), vld1q_s8(qb.add(240)));
        let sumi = vaddvq_s32(acc) - bsums[b];
        sum += sumi as f32 * (f16_at(blk.add(52)) * d[b]);
    }
    sum
}
