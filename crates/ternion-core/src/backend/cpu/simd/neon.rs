//! aarch64 NEON kernels. Callers guarantee the feature (see `Level::detect`).

use std::arch::aarch64::*;

/// Σ (code_i − 1)·q_i over one I2_S row: codes are unpacked per 32-byte block (shifts
/// 6, 4, 2, 0), multiplied with the activations in widening i8×i8→i16 products and
/// accumulated pairwise into i32; Σq is subtracted at the end.
#[target_feature(enable = "neon")]
pub unsafe fn i2s_dot(row: &[u8], q: &[i8], q_sum: i32) -> i32 {
    assert_eq!(
        row.len() * 4,
        q.len(),
        "i2s_dot: row and activations differ in length"
    );
    let mask = vdupq_n_u8(3);
    let mut acc = vdupq_n_s32(0);
    for b in 0..row.len() / 32 {
        let p = row.as_ptr().add(32 * b);
        let qp = q.as_ptr().add(128 * b);
        for half in 0..2 {
            let w = vld1q_u8(p.add(16 * half));
            let codes = [
                vandq_u8(vshrq_n_u8::<6>(w), mask),
                vandq_u8(vshrq_n_u8::<4>(w), mask),
                vandq_u8(vshrq_n_u8::<2>(w), mask),
                vandq_u8(w, mask),
            ];
            for (g, c) in codes.iter().enumerate() {
                let c = vreinterpretq_s8_u8(*c);
                let qv = vld1q_s8(qp.add(32 * g + 16 * half));
                let lo = vmull_s8(vget_low_s8(c), vget_low_s8(qv));
                let hi = vmull_s8(vget_high_s8(c), vget_high_s8(qv));
                acc = vpadalq_s16(acc, lo);
                acc = vpadalq_s16(acc, hi);
            }
        }
    }
    vaddvq_s32(acc) - q_sum
}
