//! Q5_K: ggml's 5-bit k-quant, 256-element super-blocks of 176 bytes: F16 `d`, F16 `dmin`,
//! `scales[12]` (eight 6-bit scales and mins, packed as Q4_K's), `qh[32]`, `qs[128]`. Each
//! 64-element chunk c uses qs[32c..32c+32]: its first 32 elements are the low nibbles with
//! bit 2c of qh[l] as fifth bit, the next 32 the high nibbles with bit 2c + 1; sub-block
//! scales 2c and 2c + 1. Element value = d·scale·q − dmin·min. Pairs with Q8_K
//! activations. Layout and sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};
use super::q4_k::scale_min;
use super::GgmlType;

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 176;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q5_K, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The 5-bit codes of one super-block, in element order.
fn codes(block: &[u8]) -> [u8; BLOCK_ELEMS] {
    let (qh, qs) = (&block[16..48], &block[48..]);
    let mut v = [0u8; BLOCK_ELEMS];
    for (c, (chunk, q)) in v.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
        let (lo, hi) = chunk.split_at_mut(32);
        for (l, (&b, &h)) in q.iter().zip(qh).enumerate() {
            lo[l] = (b & 0x0F) | (((h >> (2 * c)) & 1) << 4);
            hi[l] = (b >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
    }
    v
}

/// Dequantizes a row of whole super-blocks (ggml's `dequantize_row_q5_K`).
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let q = codes(block);
        for (j, (o, qj)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (s, m) = scale_min(&block[4..16], j);
            let (dl, ml) = (d * f32::from(s), dmin * f32::from(m));
            for (y, &c) in o.iter_mut().zip(qj) {
                *y = dl * f32::from(c) - ml;
            }
        }
    }
}

/// Dot product against Q8_K activations, as Q4_K's: per super-block the integer sums
/// Σ_j scale_j·Σ q·a and Σ_j min_j·Σ a, then `d_a·d·Σscale − d_a·dmin·Σmin`, summed over
/// super-blocks (ggml's `vec_dot_q5_K_q8_K` up to float summation order).
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q5_K: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let codes = codes(block);
        let (mut sum_scaled, mut sum_mins) = (0i32, 0i32);
        for (j, (cj, qj)) in codes.chunks_exact(32).zip(qb.chunks_exact(32)).enumerate() {
            let (s, m) = scale_min(&block[4..16], j);
            let dot: i32 = cj
                .iter()
                .zip(qj)
                .map(|(&c, &a)| i32::from(c) * i32::from(a))
                .sum();
            let sa: i32 = qj.iter().map(|&a| i32::from(a)).sum();
            sum_scaled += i32::from(s) * dot;
            sum_mins += i32::from(m) * sa;
        }
        sum += da * f16_at(block, 0) * sum_scaled as f32 - da * f16_at(block, 2) * sum_mins as f32;
    }
    sum
}

block_format!(
    /// The Q5_K format for the registry ([`super::format`]).
    Q5K,
    Q5_K,
    RefDot::Q8K(dot_q8k),
    None,
    Some(include_str!("wgsl/q5_k.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1
        b[2..4].copy_from_slice(&[0x00, 0x38]); // dmin = 0.5
        b[4] = 2; // sub-block 0: scale 2
        b[8] = 3; // sub-block 0: min 3
        b[5] = 1; // sub-block 1: scale 1, min 0
        b[16] = 0b11; // qh[0]: fifth bits of elements 0 and 32
        b[48] = 0x7A; // element 0: 10 | 16 = 26; element 32: 7 | 16 = 23
        let mut out = [0f32; 256];
        dequantize_row(&b, &mut out);
        assert_eq!(out[0], 2.0 * 26.0 - 1.5);
        assert_eq!(out[1], -1.5);
        assert_eq!(out[32], 23.0);
        let mut q = [0i8; 256];
        q[0] = 1;
        q[32] = 2;
        q[1] = 4;
        // Σscale = 2·(26 + 0·4) + 1·(23·2) = 98; Σmin = 3·(1 + 4) = 15.
        assert_eq!(dot_q8k(&b, &q, &[0.25]), 0.25 * 98.0 - 0.25 * 0.5 * 15.0);
    }
}
