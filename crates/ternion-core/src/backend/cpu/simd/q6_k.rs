//! Q6_K rows against Q8_K activations at each level: one row, or the four rows of a quad
//! (four rows interleaved block by block, the layout of an LM head requantized at load
//! where AVX-512 runs). Every level returns the scalar reference's bits: the integer sums
//! are exact and the float combination is the reference's.

use super::Level;
use crate::quant;

/// Q6_K row · Q8_K activations; equal to [`quant::q6_k::dot_q8k`] bit for bit.
#[inline]
pub fn q6_k_dot_q8k(level: Level, row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    match level {
        // SAFETY: Avx2 is only returned by `Level::detect` when the CPU has AVX2, FMA and
        // F16C; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { super::x86::q6_k_dot_q8k(row, q, d) },
        // SAFETY: Avx512 proves AVX-512 F/BW/VNNI; the kernel asserts the lengths it reads.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { super::avx512_kq::q6_k_dot_q8k(row, q, d) },
        // SAFETY: Neon is only returned when the CPU has NEON; the kernel asserts the
        // lengths it reads.
        #[cfg(target_arch = "aarch64")]
        Level::Neon => unsafe { super::neon_kq::q6_k_dot_q8k(row, q, d) },
        _ => quant::q6_k::dot_q8k(row, q, d),
    }
}

/// Bytes of a Q6_K block (256 weights).
const BLOCK_BYTES: usize = quant::q6_k::BLOCK_BYTES;

/// Rows of a quad.
pub const QUAD_ROWS: usize = 4;

/// Interleaves `rows` (whole Q6_K rows of `row_bytes`) into quads in place: the four rows
/// from `4g` on become quad `g`, in the same bytes, with block `b` of row `4g + r` at block
/// index `4b + r` of the quad, so a four-row product reads its weights front to back. Rows
/// past the last whole quad stay as they are.
pub fn q6_k_interleave(rows: &mut [u8], row_bytes: usize) {
    let mut quad = vec![0u8; QUAD_ROWS * row_bytes];
    for dst in rows.chunks_exact_mut(QUAD_ROWS * row_bytes) {
        for (r, row) in dst.chunks_exact(row_bytes).enumerate() {
            for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
                let at = (QUAD_ROWS * b + r) * BLOCK_BYTES;
                quad[at..at + BLOCK_BYTES].copy_from_slice(block);
            }
        }
        dst.copy_from_slice(&quad);
    }
}

/// [`q6_k_dot_q8k`] of the four rows of a quad ([`q6_k_interleave`]) against the same
/// activations, equal to four single-row dots bit for bit. AVX-512 reads the quad in
/// one pass; the other levels take it block by block: each block's term is the one-block
/// dot (`0 + term`, which only turns −0 into +0) added to the running sum, which starts at
/// +0 and so never is −0: the reference's additions.
///
/// # Panics
/// If `quad` does not hold `4 · d.len()` blocks or `q` `256 · d.len()` values.
#[inline]
pub fn q6_k_dot4_q8k(level: Level, quad: &[u8], q: &[i8], d: &[f32]) -> [f32; 4] {
    assert!(
        quad.len() == QUAD_ROWS * d.len() * BLOCK_BYTES && q.len() == d.len() * 256,
        "q6_k_dot4_q8k: lengths"
    );
    match level {
        // SAFETY: Avx512 proves AVX-512 F/BW/VNNI; the lengths are checked above.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { super::avx512_kq::q6_k_dot4_q8k(quad, q, d) },
        _ => {
            let mut sum = [0f32; QUAD_ROWS];
            let blocks = quad.chunks_exact(QUAD_ROWS * BLOCK_BYTES);
            for (b, (rows, qb)) in blocks.zip(q.chunks_exact(256)).enumerate() {
                for (s, w) in sum.iter_mut().zip(rows.chunks_exact(BLOCK_BYTES)) {
                    *s += q6_k_dot_q8k(level, w, qb, &d[b..b + 1]);
                }
            }
            sum
        }
    }
}
