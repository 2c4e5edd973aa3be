//! aarch64 NEON kernels of the 32-element block formats against Q8_0 activations. Callers
//! guarantee the feature (see `Level::detect`).
//!
//! Layouts (docs/FORMATS.md): Q8_0 blocks are an F16 scale and 32 × i8 (34 bytes); Q4_0 an
//! F16 scale and 16 bytes whose low nibbles are elements 0..16 and high nibbles 16..32,
//! value nibble − 8 (18 bytes); Q5_0 an F16 scale, 32 fifth bits `qh` (bit j: element j),
//! then Q4_0's nibbles, value (nibble | fifth bit · 16) − 16 (22 bytes).
//!
//! Each block's integer dot is exact ([`dot32`]); the block sums are scaled and added in
//! the scalar reference's float order, so the results equal it bit for bit.

use std::arch::aarch64::*;

use super::neon::{bit_mask, dot32, f16_at};

/// Checks that `row` holds `d.len()` blocks of `block_bytes` and `q` their elements.
fn check(row: &[u8], q: &[i8], d: &[f32], block_bytes: usize, what: &str) {
    assert!(
        row.len() == d.len() * block_bytes && q.len() == d.len() * 32,
        "{what}: lengths"
    );
}

/// Q8_0 row against Q8_0 activations, as [`crate::quant::q8_0::dot_q8_0`].
#[target_feature(enable = "neon")]
pub unsafe fn q8_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    q8_0_dots(row, [q], [d])[0]
}

/// [`q8_0_dot`] of one row against four activation rows; each result equals `q8_0_dot`.
#[target_feature(enable = "neon")]
pub unsafe fn q8_0_dot4(row: &[u8], q: [&[i8]; 4], d: [&[f32]; 4]) -> [f32; 4] {
    q8_0_dots(row, q, d)
}

/// [`q8_0_dot`] against T activation rows, each block's weights loaded once.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q8_0_dots<const T: usize>(row: &[u8], q: [&[i8]; T], d: [&[f32]; T]) -> [f32; T] {
    const BLOCK_BYTES: usize = 34;
    for (qt, dt) in q.iter().zip(d) {
        check(row, qt, dt, BLOCK_BYTES, "q8_0_dot");
    }
    let mut sum = [0f32; T];
    for b in 0..row.len() / BLOCK_BYTES {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let w = [vld1q_s8(blk.add(2).cast()), vld1q_s8(blk.add(18).cast())];
        let dw = f16_at(blk);
        for ((s, qt), dt) in sum.iter_mut().zip(q).zip(d) {
            let sumi = dot32(w, qt.as_ptr().add(32 * b));
            *s += sumi as f32 * (dw * dt[b]);
        }
    }
    sum
}

/// The 32 nibbles of 16 bytes at `p` (low nibbles first), as unsigned bytes.
///
/// # Safety
/// `p` must point at 16 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn nibbles(p: *const u8) -> [uint8x16_t; 2] {
    let qs = vld1q_u8(p);
    [vandq_u8(qs, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(qs)]
}

/// Q4_0 row against Q8_0 activations, as [`crate::quant::q4_0::dot_q8_0`].
#[target_feature(enable = "neon")]
pub unsafe fn q4_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 18;
    check(row, q, d, BLOCK_BYTES, "q4_0_dot");
    let eight = vdupq_n_s8(8);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let w = nibbles(blk.add(2)).map(|n| vsubq_s8(vreinterpretq_s8_u8(n), eight));
        let sumi = dot32(w, q.as_ptr().add(32 * b));
        sum += sumi as f32 * f16_at(blk) * da;
    }
    sum
}

/// Q5_0 row against Q8_0 activations, as [`crate::quant::q5_0::dot_q8_0`].
#[target_feature(enable = "neon")]
pub unsafe fn q5_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 22;
    check(row, q, d, BLOCK_BYTES, "q5_0_dot");
    let sixteen = vdupq_n_u8(16);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let qh = [*blk.add(2), *blk.add(3), *blk.add(4), *blk.add(5)];
        let high = [bit_mask(qh[0], qh[1]), bit_mask(qh[2], qh[3])];
        let n = nibbles(blk.add(6));
        let w: [int8x16_t; 2] = std::array::from_fn(|i| {
            let v = vorrq_u8(n[i], vandq_u8(high[i], sixteen));
            vreinterpretq_s8_u8(vsubq_u8(v, sixteen))
        });
        let sumi = dot32(w, q.as_ptr().add(32 * b));
        sum += (f16_at(blk) * da) * sumi as f32;
    }
    sum
}
