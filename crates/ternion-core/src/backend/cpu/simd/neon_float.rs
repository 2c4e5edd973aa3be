//! aarch64 NEON kernels of float rows against f32 values: dots for the F16, BF16 and F32
//! weights and the F16 KV cache, and the attention's value accumulation. Callers guarantee
//! the feature (see `Level::detect`).
//!
//! Rows are little-endian F16, BF16 or F32 elements ([`Elem`]). Halves widen exactly with
//! `fcvtl` / `fcvtl2` (every value, subnormals, infinities and NaNs included), BF16 with a
//! 16-bit left shift (`shll`); products accumulate with FMA in four four-lane sums over 16
//! elements, then four lanes at a time, then one by one: float results differ from the
//! scalar sum in the last bits (another order), never with the number of tokens or threads.

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

/// A float element of a weight row, as NEON widens it to f32.
pub(super) trait Elem {
    /// Elements i..i + 8 of the row at `w`, as f32 (lanes 0..4, then 4..8).
    ///
    /// # Safety
    /// NEON; those elements must be readable.
    unsafe fn load8(w: *const u8, i: usize) -> [float32x4_t; 2];
    /// Elements i..i + 4.
    ///
    /// # Safety
    /// NEON; those elements must be readable.
    unsafe fn load4(w: *const u8, i: usize) -> float32x4_t;
    /// Element i.
    ///
    /// # Safety
    /// It must be readable.
    unsafe fn at(w: *const u8, i: usize) -> f32;
}

/// Little-endian F16.
pub(super) struct F16;

impl Elem for F16 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        widen(vld1q_u16(w.cast::<u16>().add(i)))
    }
    #[inline(always)]
    unsafe fn load4(w: *const u8, i: usize) -> float32x4_t {
        widen(vcombine_u16(
            vld1_u16(w.cast::<u16>().add(i)),
            vdup_n_u16(0),
        ))[0]
    }
    #[inline(always)]
    unsafe fn at(w: *const u8, i: usize) -> f32 {
        half_at(w.cast(), i)
    }
}

/// Little-endian BF16 (the high half of an f32).
pub(super) struct Bf16;

impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        let h = vld1q_u16(w.cast::<u16>().add(i));
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
        ]
    }
    #[inline(always)]
    unsafe fn load4(w: *const u8, i: usize) -> float32x4_t {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(w.cast::<u16>().add(i))))
    }
    #[inline(always)]
    unsafe fn at(w: *const u8, i: usize) -> f32 {
        f32::from_bits(u32::from(w.cast::<u16>().add(i).read_unaligned()) << 16)
    }
}

/// Little-endian F32.
pub(super) struct F32;

impl Elem for F32 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        let p = w.cast::<f32>().add(i);
        [vld1q_f32(p), vld1q_f32(p.add(4))]
    }
    #[inline(always)]
    unsafe fn load4(w: *const u8, i: usize) -> float32x4_t {
        vld1q_f32(w.cast::<f32>().add(i))
    }
    #[inline(always)]
    unsafe fn at(w: *const u8, i: usize) -> f32 {
        w.cast::<f32>().add(i).read_unaligned()
    }
}

/// Σ w_i·x_i for `x.len()` elements `E` at `w`, against T rows `x` of the same length;
/// each result equals the T = 1 result for that row bit for bit.
///
/// # Safety
/// `w` must point at `x[0].len()` readable elements, and every `x[t]` hold as many values.
#[target_feature(enable = "neon")]
pub unsafe fn float_dots<E: Elem, const T: usize>(w: *const u8, x: [&[f32]; T]) -> [f32; T] {
    let n = x[0].len();
    for xt in &x {
        assert_eq!(xt.len(), n, "float_dots: length mismatch");
    }
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    let mut i = 0;
    while i + 16 <= n {
        let [w0, w1] = E::load8(w, i);
        let [w2, w3] = E::load8(w, i + 8);
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
        let wv = E::load4(w, i);
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
        let wv = E::at(w, i);
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
