//! aarch64 NEON kernels of F16 rows (little-endian halves) against f32 values: dots for
//! the F16 weights and the KV cache, and the attention's value accumulation. Callers
//! guarantee the feature (see `Level::detect`).
//!
//! Halves widen exactly with `fcvtl` / `fcvtl2` (every value, subnormals, infinities and
//! NaNs included); products accumulate with FMA in four four-lane sums over 16 elements,
//! then four lanes at a time, then one by one: float results differ from the scalar sum
//! in the last bits (another order), never with the number of tokens or threads.

use std::arch::aarch64::*;
use std::arch::asm;

/// The eight halves of `h` widened to f32: lanes 0..4, then 4..8.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn widen(h: uint16x8_t) -> [float32x4_t; 2] {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register-only conversions (base aarch64 FP/SIMD), no memory or flags.
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    [lo, hi]
}

/// The half at `w` (element `i`) as f32.
///
/// # Safety
/// `w.add(i)` must be readable.
#[inline]
unsafe fn half_at(w: *const u16, i: usize) -> f32 {
    half::f16::from_bits(w.add(i).read_unaligned()).to_f32()
}

/// Σ w_i·x_i for `x.len()` halves at `w`, against T rows `x` of the same length; each
/// result equals the T = 1 result for that row bit for bit.
///
/// # Safety
/// `w` must point at `2 · n` readable bytes, where every `x[t]` holds `n` values.
#[target_feature(enable = "neon")]
pub unsafe fn f16_dots<const T: usize>(w: *const u8, x: [&[f32]; T]) -> [f32; T] {
    let n = x[0].len();
    for xt in &x {
        assert_eq!(xt.len(), n, "f16_dots: length mismatch");
    }
    let w = w.cast::<u16>();
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    let mut i = 0;
    while i + 16 <= n {
        let h = [vld1q_u16(w.add(i)), vld1q_u16(w.add(i + 8))];
        let [w0, w1] = widen(h[0]);
        let [w2, w3] = widen(h[1]);
        for (a, xt) in acc.iter_mut().zip(&x) {
            let p = xt.as_ptr().add(i);
            a[0] = vfmaq_f32(a[0], w0, vld1q_f32(p));
            a[1] = vfmaq_f32(a[1], w1, vld1q_f32(p.add(4)));
            a[2] = vfmaq_f32(a[2], w2, vld1q_f32(p.add(8)));
            a[3] = vfmaq_f32(a[3], w3, vld1q_f32(p.add(12)));
        }
        i += 16;
    }
    while i + 4 <= n {
        let [wv, _] = widen(vcombine_u16(vld1_u16(w.add(i)), vdup_n_u16(0)));
        for (a, xt) in acc.iter_mut().zip(&x) {
            a[0] = vfmaq_f32(a[0], wv, vld1q_f32(xt.as_ptr().add(i)));
        }
        i += 4;
    }
    let mut sum: [f32; T] = std::array::from_fn(|t| {
        let a = &acc[t];
        vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])))
    });
    while i < n {
        let wv = half_at(w, i);
        for (s, xt) in sum.iter_mut().zip(&x) {
            *s += wv * xt[i];
        }
        i += 1;
    }
    sum
}

/// `out_i += a · v_i` for `out.len()` halves at `v`.
///
/// # Safety
/// `v` must point at `2 · out.len()` readable bytes.
#[target_feature(enable = "neon")]
pub unsafe fn f16_axpy(out: &mut [f32], a: f32, v: *const u8) {
    let n = out.len();
    let v = v.cast::<u16>();
    let av = vdupq_n_f32(a);
    let mut i = 0;
    while i + 8 <= n {
        let [v0, v1] = widen(vld1q_u16(v.add(i)));
        let o = out.as_mut_ptr().add(i);
        vst1q_f32(o, vfmaq_f32(vld1q_f32(o), av, v0));
        vst1q_f32(o.add(4), vfmaq_f32(vld1q_f32(o.add(4)), av, v1));
        i += 8;
    }
    while i < n {
        out[i] += a * half_at(v, i);
        i += 1;
    }
}
