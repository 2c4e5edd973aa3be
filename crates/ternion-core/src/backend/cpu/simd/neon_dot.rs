//! The int8 dot step of the aarch64 kernels in [`super::neon_q81`] and
//! [`super::neon_kq2`], in two forms: plain NEON (widening i8 × i8 → i16 products added in
//! pairs into i32 lanes) and the `dotprod` extension's `sdot` (four products into each
//! i32 lane), chosen at run time. Both are exact, so a kernel's integer sums, and with
//! them its results, are the same under either.
//!
//! `sdot` is written as inline assembly: its intrinsic (`vdotq_s32`) is not stable Rust.

use std::arch::aarch64::*;
use std::arch::asm;

use super::neon::mla16;

/// One activation row: int8 values, one scale per block and, for Q8_1 only, the per-block
/// `s = d·Σq` (empty otherwise).
#[derive(Clone, Copy)]
pub(super) struct Act<'a> {
    /// The int8 values.
    pub q: &'a [i8],
    /// One scale per block.
    pub d: &'a [f32],
    /// Q8_1's d·Σq per block (empty for Q8_0 and Q8_K).
    pub s: &'a [f32],
}

/// `acc` plus the products of 16 int8 lanes, summed into the four i32 lanes (how the
/// products are grouped into lanes is the implementation's; their total is exact).
pub(super) trait Dot {
    /// `acc` + Σ w_i·x_i spread over the lanes.
    ///
    /// # Safety
    /// The CPU must have the features the implementation names.
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t;
}

/// Plain NEON: `smull` / `smull2` and pairwise adds.
pub(super) struct Plain;

impl Dot for Plain {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        mla16(acc, w, x)
    }
}

/// The `dotprod` extension's `sdot`.
pub(super) struct Sdot;

impl Dot for Sdot {
    #[inline]
    #[target_feature(enable = "neon,dotprod")]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: `sdot` reads and writes only these registers; the caller guarantees the
        // `dotprod` feature.
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// Σ w_i·x_i over 32 lanes (two registers of weights) against the activations at `x`.
///
/// # Safety
/// `x` must point at 32 readable bytes; the CPU must have what `D` needs.
#[inline(always)]
pub(super) unsafe fn dot32<D: Dot>(w: [int8x16_t; 2], x: *const i8) -> i32 {
    let acc = D::dot16(vdupq_n_s32(0), w[0], vld1q_s8(x));
    vaddvq_s32(D::dot16(acc, w[1], vld1q_s8(x.add(16))))
}

/// One weight format's dot of a row against an activation row, generic over the dot step.
pub(super) trait RowDot {
    /// The format's dot, equal to its scalar reference bit for bit.
    ///
    /// # Safety
    /// The CPU must have NEON and what `D` needs. Implementations check the lengths.
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32;
}

/// Whether the kernels use `sdot`: the CPU has the `dotprod` extension and
/// `TERNION_SIMD` is not `neon` (which keeps them on plain NEON, for comparison). Decided
/// once.
fn dotprod() -> bool {
    static SDOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SDOT.get_or_init(|| {
        super::simd_cap() != "neon" && std::arch::is_aarch64_feature_detected!("dotprod")
    })
}

/// `K`'s dot with `sdot` where [`dotprod`] says so, else with plain NEON.
///
/// # Safety
/// The CPU must have NEON.
pub(super) unsafe fn run<K: RowDot>(row: &[u8], x: Act<'_>) -> f32 {
    if dotprod() {
        run_sdot::<K>(row, x)
    } else {
        run_plain::<K>(row, x)
    }
}

/// `K`'s dot with plain NEON.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(super) unsafe fn run_plain<K: RowDot>(row: &[u8], x: Act<'_>) -> f32 {
    K::dot::<Plain>(row, x)
}

/// `K`'s dot with `sdot`.
///
/// # Safety
/// The CPU must have NEON and `dotprod`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn run_sdot<K: RowDot>(row: &[u8], x: Act<'_>) -> f32 {
    K::dot::<Sdot>(row, x)
}

/// Checks that `row` holds `x.d.len()` blocks of `block_bytes` and `x.q` their
/// `block_elems` elements each, and that `x.s` has `s_len` entries.
pub(super) fn check(row: &[u8], x: Act<'_>, fmt: (usize, usize), s_len: usize, what: &str) {
    let (block_elems, block_bytes) = fmt;
    let nb = x.d.len();
    assert!(
        row.len() == nb * block_bytes && x.q.len() == nb * block_elems && x.s.len() == s_len,
        "{what}: lengths"
    );
}
