//! Hot inner loops with runtime CPU-feature dispatch: AVX2 (+FMA, F16C) on x86-64, NEON on
//! aarch64 (with the `dotprod` extension's `sdot` where the CPU has it), and the scalar
//! reference kernels of [`crate::quant`] everywhere else.
//!
//! Every kernel returns exactly what its scalar reference returns for integer dots; float
//! dots may differ in the last bits (another summation order), never in a way that depends
//! on the number of threads.

use half::f16;

use crate::quant;

#[cfg(target_arch = "x86_64")]
mod avx2_act;
#[cfg(target_arch = "x86_64")]
mod avx2_tile;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_act;
#[cfg(target_arch = "x86_64")]
mod avx512_attn;
#[cfg(target_arch = "x86_64")]
mod avx512_bits;
#[cfg(target_arch = "x86_64")]
mod avx512_kq;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
mod exp;
mod heads;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_bits;
#[cfg(target_arch = "aarch64")]
mod neon_dot;
#[cfg(target_arch = "aarch64")]
mod neon_float;
#[cfg(target_arch = "aarch64")]
mod neon_kq;
#[cfg(target_arch = "aarch64")]
mod neon_kq2;
#[cfg(target_arch = "aarch64")]
mod neon_q80;
#[cfg(target_arch = "aarch64")]
mod neon_q81;
mod q6_k;
mod squares;
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_bits;

pub use exp::{exp_f32, exp_shifted, max};
pub use heads::{f16_scores_heads, f16_weighted_sum_heads, MAX_HEADS};
pub use q6_k::{q6_k_dot4_q8k, q6_k_dot_q8k, q6_k_interleave, QUAD_ROWS};
pub use squares::{mean_squares, SQUARE_ROWS};
pub use vnni::{
    interleave_blocks, interleave_tokens, Avx2, Chunk, Codes, Dot, OutCols, Q80Rows, Q8kRows,
    Tiles, Vnni, AVX2_TOKEN_TILE, CHUNK_ELEMS, GROUP_ROWS, SCALE_BLOCK, SUB_TILE, TOKEN_TILE,
};

/// The instruction set the kernels use on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Portable Rust.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX2 (as above) plus AVX-512 F, BW and VNNI: the ternary formats run the
    /// kernels of [`Vnni`] on weights repacked at load; every other kernel is the AVX2 one.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

/// `TERNION_SIMD` as set (read once; empty when unset): the kernels the user asked for,
/// which [`Level::detect`] and the AVX2 kernels' [`Dot`] both follow.
fn simd_cap() -> &'static str {
    static CAP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CAP.get_or_init(|| std::env::var("TERNION_SIMD").unwrap_or_default())
}

impl Level {
    /// The best level this CPU supports (detected once). `TERNION_SIMD=scalar` forces the
    /// portable kernels, `TERNION_SIMD=avx2` the AVX2 ones (without AVX-VNNI),
    /// `TERNION_SIMD=avxvnni` the AVX2 ones with 256-bit `vpdpbusd` ([`Dot`]),
    /// `TERNION_SIMD=neon` the NEON ones without the `dotprod` extension (for testing and
    /// comparison).
    pub fn detect() -> Level {
        static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            let cap = simd_cap();
            if cap == "scalar" {
                return Level::Scalar;
            }
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                if cap != "avx2"
                    && cap != "avxvnni"
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    return Level::Avx512;
                }
                return Level::Avx2;
            }
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Level::Neon;
            }
            Level::Scalar
        })
    }

    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Neon => "neon",
        }
    }
}

/// Σ t_i·q_i over one I2_S row (t = code − 1); `q_sum` = Σ q_i. x86 repacks I2_S for the
/// tile kernels ([`Tiles`]): its row runs the reference here.
#[inline]
pub fn i2s_dot(level: Level, row: &[u8], q: &[i8], q_sum: i32) -> i32 {
    match level {
        // SAFETY: Neon is only returned when the CPU has NEON.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon::i2s_dot(row, q, q_sum) },
        _ => {
            let _ = q_sum;
            quant::i2s::dot(row, q)
        }
    }
}

/// [`i2s_dot`] of one weight row against four token rows at once (prefill): the codes are
/// unpacked once for all four.
#[inline]
pub fn i2s_dot4(level: Level, row: &[u8], q: [&[i8]; 4], q_sum: [i32; 4]) -> [i32; 4] {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon::i2s_dot4(row, q, q_sum) },
        _ => std::array::from_fn(|i| i2s_dot(level, row, q[i], q_sum[i])),
    }
}

/// TQ2_0 row · Q8_K activations (`d`: per-block scales, `bsums`: per-block Σq), equal to
/// [`quant::tq2_0::dot_q8k`] (x86 repacks TQ2_0 for the tile kernels: the reference here).
#[inline]
pub fn tq2_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32], bsums: &[i32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon::tq2_dot_q8k(row, q, d, bsums) },
        _ => {
            let _ = bsums;
            quant::tq2_0::dot_q8k(row, q, d)
        }
    }
}

/// TQ1_0 row · Q8_K activations (`d`: per-block scales, `bsums`: per-block Σq), equal to
/// [`quant::tq1_0::dot_q8k`] bit for bit (x86 runs the reference: the AVX-512 level
/// repacks TQ1_0 at load instead).
#[inline]
pub fn tq1_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32], bsums: &[i32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon::tq1_dot_q8k(row, q, d, bsums) },
        _ => {
            let _ = bsums;
            quant::tq1_0::dot_q8k(row, q, d)
        }
    }
}

/// Q8_0 row · Q8_0 activations (`d`: per-block scales); equal to
/// [`quant::q8_0::dot_q8_0`] up to float summation order.
#[inline]
pub fn q8_0_dot(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::q8_0_dot(row, q, d) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_q80::q8_0_dot(row, q, d) },
        _ => quant::q8_0::dot_q8_0(row, q, d),
    }
}

/// Q4_0 row · Q8_0 activations (`d`: per-block scales); equal to
/// [`quant::q4_0::dot_q8_0`] up to float summation order.
#[inline]
pub fn q4_0_dot(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::q4_0_dot(row, q, d) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_q80::q4_0_dot(row, q, d) },
        _ => quant::q4_0::dot_q8_0(row, q, d),
    }
}

/// Q5_0 row · Q8_0 activations (`d`: per-block scales); equal to
/// [`quant::q5_0::dot_q8_0`] up to float summation order (NEON: bit for bit).
#[inline]
pub fn q5_0_dot(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::q5_0_dot(row, q, d) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_q80::q5_0_dot(row, q, d) },
        _ => quant::q5_0::dot_q8_0(row, q, d),
    }
}

/// Q4_K row · Q8_K activations; equal to [`quant::q4_k::dot_q8k`] up to float summation
/// order.
#[inline]
pub fn q4_k_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::q4_k_dot_q8k(row, q, d) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_kq::q4_k_dot_q8k(row, q, d) },
        _ => quant::q4_k::dot_q8k(row, q, d),
    }
}

/// Q4_1 row · Q8_1 activations (`d`: per-block scales, `s`: per-block d·Σq), equal to
/// [`quant::q4_1::dot_q8_1`] bit for bit (x86 runs the reference).
#[inline]
pub fn q4_1_dot(level: Level, row: &[u8], q: &[i8], d: &[f32], s: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_dot::run::<neon_q81::Q4_1>(row, neon_dot::Act { q, d, s }) },
        _ => quant::q4_1::dot_q8_1(row, q, d, s),
    }
}

/// Q5_1 row · Q8_1 activations (`d`: per-block scales, `s`: per-block d·Σq), equal to
/// [`quant::q5_1::dot_q8_1`] bit for bit (x86 runs the reference).
#[inline]
pub fn q5_1_dot(level: Level, row: &[u8], q: &[i8], d: &[f32], s: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_dot::run::<neon_q81::Q5_1>(row, neon_dot::Act { q, d, s }) },
        _ => quant::q5_1::dot_q8_1(row, q, d, s),
    }
}

/// IQ4_NL row · Q8_0 activations (`d`: per-block scales), equal to
/// [`quant::iq4_nl::dot_q8_0`] bit for bit (x86 runs the reference).
#[inline]
pub fn iq4_nl_dot(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_dot::run::<neon_q81::Iq4Nl>(row, neon_dot::Act { q, d, s: &[] })
        },
        _ => quant::iq4_nl::dot_q8_0(row, q, d),
    }
}

/// Q2_K row · Q8_K activations, equal to [`quant::q2_k::dot_q8k`] bit for bit (x86 runs
/// the reference).
#[inline]
pub fn q2_k_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_dot::run::<neon_kq2::Q2K>(row, neon_dot::Act { q, d, s: &[] })
        },
        _ => quant::q2_k::dot_q8k(row, q, d),
    }
}

/// Q3_K row · Q8_K activations, equal to [`quant::q3_k::dot_q8k`] bit for bit (x86 runs
/// the reference).
#[inline]
pub fn q3_k_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_dot::run::<neon_kq2::Q3K>(row, neon_dot::Act { q, d, s: &[] })
        },
        _ => quant::q3_k::dot_q8k(row, q, d),
    }
}

/// Q5_K row · Q8_K activations, equal to [`quant::q5_k::dot_q8k`] bit for bit (x86 runs
/// the reference).
#[inline]
pub fn q5_k_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_dot::run::<neon_kq2::Q5K>(row, neon_dot::Act { q, d, s: &[] })
        },
        _ => quant::q5_k::dot_q8k(row, q, d),
    }
}

/// IQ4_XS row · Q8_K activations, equal to [`quant::iq4_xs::dot_q8k`] bit for bit (x86
/// runs the reference).
#[inline]
pub fn iq4_xs_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_dot::run::<neon_kq2::Iq4Xs>(row, neon_dot::Act { q, d, s: &[] })
        },
        _ => quant::iq4_xs::dot_q8k(row, q, d),
    }
}

/// [`q8_0_dot`] of one weight row against four activation rows (prefill); each result
/// equals `q8_0_dot` of that row bit for bit.
#[inline]
pub fn q8_0_dot4(level: Level, row: &[u8], q: [&[i8]; 4], d: [&[f32]; 4]) -> [f32; 4] {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::q8_0_dot4(row, q, d) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_q80::q8_0_dot4(row, q, d) },
        _ => std::array::from_fn(|t| q8_0_dot(level, row, q[t], d[t])),
    }
}

/// Q1_0 row · T token rows of Q8_0 activations (one token each; `q`, `d`, `sum` read),
/// equal to [`quant::q1_0::dot_q8_0`] bit for bit.
#[inline]
pub fn q1_0_dots<const T: usize>(level: Level, row: &[u8], x: [Q80Rows<'_>; T]) -> [f32; T] {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86_bits::q1_0_dots::<T>(row, x) },
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_bits::bits_dots::<1, T>(row, x) },
        _ => x.map(|x| quant::q1_0::dot_q8_0(row, x.q, x.d)),
    }
}

/// Q2_0 row · T token rows of Q8_0 activations (one token each), equal to
/// [`quant::q2_0::dot_q8_0`] bit for bit (x86 repacks Q2_0 for the tile kernels: the
/// reference here).
#[inline]
pub fn q2_0_dots<const T: usize>(level: Level, row: &[u8], x: [Q80Rows<'_>; T]) -> [f32; T] {
    match level {
        // SAFETY: as in `f16_dot`; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_bits::bits_dots::<2, T>(row, x) },
        _ => x.map(|x| quant::q2_0::dot_q8_0(row, x.q, x.d)),
    }
}

/// Σ w_i·x_i for a little-endian F16 row `w` (as bytes) and f32 `x`.
#[inline]
pub fn f16_dot(level: Level, w: &[u8], x: &[f32]) -> f32 {
    // The AVX2 and NEON kernels read x.len() halves through a raw pointer: without this
    // check a short `w` would be read out of bounds (the scalar kernel checks the same).
    assert_eq!(w.len(), 2 * x.len(), "f16_dot: length mismatch");
    match level {
        // SAFETY: Avx2 and Avx512 are only returned by `detect` when the CPU has AVX2, FMA
        // and F16C; `w` holds x.len() halves (asserted).
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::f16_dot(w.as_ptr(), x) },
        // SAFETY: Neon is only returned when the CPU has NEON; `w` holds x.len() halves
        // (asserted).
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_float::float_dots::<neon_float::F16, 1>(w.as_ptr(), [x])[0] },
        _ => quant::float::dot_f16(w, x),
    }
}

/// [`f16_dot`] of one F16 row against four activation rows; each result equals
/// `f16_dot` of that row bit for bit.
#[inline]
pub fn f16_dot4(level: Level, w: &[u8], x: [&[f32]; 4]) -> [f32; 4] {
    for xt in x {
        assert_eq!(w.len(), 2 * xt.len(), "f16_dot4: length mismatch");
    }
    match level {
        // SAFETY: as in `f16_dot`; `w` holds n halves for every x[t] of n values (asserted).
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::f16_dot4(w.as_ptr(), x) },
        // SAFETY: as in `f16_dot`; `w` holds n halves for every x[t] of n values (asserted).
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_float::float_dots::<neon_float::F16, 4>(w.as_ptr(), x) },
        _ => x.map(|xt| f16_dot(level, w, xt)),
    }
}

/// Σ w_i·x_i for a little-endian BF16 row `w` (as bytes) and f32 `x` (already rounded to
/// BF16); equal to [`quant::float::dot_bf16`] up to float summation order (x86 runs it).
#[inline]
pub fn bf16_dot(level: Level, w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * x.len(), "bf16_dot: length mismatch");
    match level {
        // SAFETY: as in `f16_dot`; `w` holds x.len() halves (asserted).
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_float::float_dots::<neon_float::Bf16, 1>(w.as_ptr(), [x])[0] },
        _ => quant::float::dot_bf16(w, x),
    }
}

/// Σ w_i·x_i for a little-endian F32 row `w` (as bytes) and f32 `x`; equal to
/// [`quant::float::dot_f32`] up to float summation order (x86 runs it).
#[inline]
pub fn f32_dot(level: Level, w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 4 * x.len(), "f32_dot: length mismatch");
    match level {
        // SAFETY: as in `f16_dot`; `w` holds x.len() f32 values (asserted).
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_float::float_dots::<neon_float::F32, 1>(w.as_ptr(), [x])[0] },
        _ => quant::float::dot_f32(w, x),
    }
}

/// Σ k_i·q_i for an F16 key row and an f32 query.
#[inline]
pub fn f16_dot_halves(level: Level, k: &[f16], q: &[f32]) -> f32 {
    assert_eq!(k.len(), q.len(), "f16_dot_halves: length mismatch");
    match level {
        // SAFETY: as in `f16_dot`; `k` holds q.len() halves (asserted).
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::f16_dot(k.as_ptr().cast(), q) },
        // SAFETY: as in `f16_dot`; `k` holds q.len() halves (asserted).
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe {
            neon_float::float_dots::<neon_float::F16, 1>(k.as_ptr().cast(), [q])[0]
        },
        _ => k.iter().zip(q).map(|(a, b)| a.to_f32() * b).sum(),
    }
}

/// `out[i] = `[`f16_dot_halves`]`(k_i, q)` for the key rows `k_i = keys[i·stride..][..q.len()]`,
/// one per entry of `out` (the same value, bit for bit, on every path).
///
/// # Panics
/// If `keys` is too short for `out.len()` rows.
pub fn f16_scores(level: Level, q: &[f32], keys: &[f16], stride: usize, out: &mut [f32]) {
    let hd = q.len();
    if let Some(last) = out.len().checked_sub(1) {
        assert!(
            keys.len() >= last * stride + hd,
            "f16_scores: keys too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && hd.is_multiple_of(32) {
        // SAFETY: the level proves AVX-512 F; every row lies inside `keys` (asserted).
        return unsafe { avx512_attn::f16_scores(q, keys.as_ptr(), stride, out) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_dot_halves(level, &keys[i * stride..][..hd], q);
    }
}

/// `out += Σ_i w[i]·v_i` over the value rows `v_i = values[i·stride..][..out.len()]` in
/// order of i: [`f16_axpy`] row after row (the same sums, bit for bit, on every path).
///
/// # Panics
/// If `values` is too short for `w.len()` rows.
pub fn f16_weighted_sum(level: Level, w: &[f32], values: &[f16], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    if let Some(last) = w.len().checked_sub(1) {
        assert!(
            values.len() >= last * stride + hd,
            "f16_weighted_sum: values too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && hd.is_multiple_of(16) {
        // SAFETY: the level proves AVX-512 F; every row lies inside `values` (asserted).
        return unsafe { avx512_attn::f16_weighted_sum(w, values.as_ptr(), stride, out) };
    }
    for (i, &wi) in w.iter().enumerate() {
        f16_axpy(level, out, wi, &values[i * stride..][..hd]);
    }
}

/// BitNet's per-token int8 quantization of `x` into `q`, equal to
/// [`quant::act::quantize_per_token`] bit for bit.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn quantize_per_token(level: Level, x: &[f32], q: &mut [i8]) -> quant::act::PerToken {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: the level proves AVX-512 F/BW; the kernel asserts the lengths.
        return unsafe { avx512_act::quantize_per_token(x, q) };
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 {
        // SAFETY: the level proves AVX2; the kernel asserts the lengths.
        return unsafe { avx2_act::quantize_per_token(x, q) };
    }
    quant::act::quantize_per_token(x, q)
}

/// ggml's Q8_K quantization of one row `x` into `q` and the block scales `d`, equal to
/// [`quant::act::quantize_q8k`] bit for bit, with each block's Σq into `bsum`.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn quantize_q8k(level: Level, x: &[f32], q: &mut [i8], d: &mut [f32], bsum: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: the level proves AVX-512 F/BW; the kernel asserts the lengths.
        return unsafe { avx512_act::quantize_q8k(x, q, d, bsum) };
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 {
        // SAFETY: the level proves AVX2; the kernel asserts the lengths.
        return unsafe { avx2_act::quantize_q8k(x, q, d, bsum) };
    }
    quant::act::quantize_q8k(x, q, d);
    for (b, qb) in bsum.iter_mut().zip(q.chunks_exact(quant::act::Q8K_BLOCK)) {
        *b = qb.iter().map(|&v| i32::from(v)).sum();
    }
}

/// Every value rounded to F16 and back (`f16::from_f32(v).to_f32()`, bit for bit).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn round_f16(level: Level, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: the level proves AVX-512 F.
        return unsafe { avx512_attn::round_f16(v) };
    }
    v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
}

/// Asks the core for the first rows (up to the attention loops' prefetch distance) of the
/// `hd`-half rows at `rows`, `stride` apart: a run of cached keys or values about to be read,
/// whose first rows the loops' own prefetch never covers (no effect on any value; no-op off
/// x86-64).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn prefetch_f16_rows(rows: &[f16], stride: usize, hd: usize) {
    #[cfg(target_arch = "x86_64")]
    for r in rows.chunks(stride.max(1)).take(avx512_attn::ROWS_AHEAD) {
        // SAFETY: SSE is part of x86-64.
        unsafe { avx512_attn::prefetch_row(r.as_ptr(), r.len().min(hd)) };
    }
}

/// Asks the core for every cache line of `data` (no effect on any value; no-op off
/// x86-64).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn prefetch_all(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in data.chunks(16) {
        // SAFETY: SSE is part of x86-64; a prefetch never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
}

/// `out_i += w · v_i` for an F16 value row.
#[inline]
pub fn f16_axpy(level: Level, out: &mut [f32], w: f32, v: &[f16]) {
    assert_eq!(out.len(), v.len(), "f16_axpy: length mismatch");
    match level {
        // SAFETY: as in `f16_dot`; lengths asserted equal.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { x86::f16_axpy(out, w, v.as_ptr().cast()) },
        // SAFETY: as in `f16_dot`; lengths asserted equal.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { neon_float::f16_axpy(out, w, v.as_ptr().cast()) },
        _ => out
            .iter_mut()
            .zip(v)
            .for_each(|(o, x)| *o += w * x.to_f32()),
    }
}

#[cfg(test)]
mod tests;
