//! Q2_0 (ggml type 42): 2-bit codes, 64-element blocks of 18 bytes: F16 `d`, then 16 bytes
//! `qs`; element j is bits 2(j % 4) .. of qs[j / 4]; the value is (code − 1)·d (codes 0..3
//! → −d, 0, +d, +2d). Pairs with Q8_0 activations. No quantizer here (the files carry
//! ternary weights made elsewhere). Layout and sources: docs/FORMATS.md.

use super::act::Q8_0_BLOCK;
use super::float::f16_at;
use super::format::{block_codes, block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 64;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q2_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The 2-bit code (0..=3) of element j of a block.
fn code(block: &[u8], j: usize) -> u8 {
    (block[2 + j / 4] >> (2 * (j % 4))) & 3
}

/// code − 1 of element j of a block.
fn value(block: &[u8], j: usize) -> i32 {
    i32::from(code(block, j)) - 1
}

/// The codes (0..=3, element = (code − 1)·scale) of a row of whole blocks in element
/// order, and the block scales (the CPU's repacked ternary layout reads them).
///
/// # Panics
/// If `codes.len()` is not a multiple of 64, `src` is not `codes.len()/64` blocks or
/// `scales` does not hold one value per block.
pub fn codes_row(src: &[u8], codes: &mut [u8], scales: &mut [f32]) {
    check(src.len(), codes.len());
    block_codes(src, (BLOCK_BYTES, BLOCK_ELEMS), code, codes, scales);
}

/// Dequantizes a row of whole blocks: element = (code − 1)·d.
///
/// # Panics
/// If `dst.len()` is not a multiple of 64 or `src` is not `dst.len()/64` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (j, o) in out.iter_mut().enumerate() {
            *o = value(block, j) as f32 * d;
        }
    }
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32):
/// per block, s = Σ over its two Q8_0 blocks, in order, of d_a·(Σ (code − 1)·q as f32),
/// then Σ over blocks of d_w·s, as ggml's generic `vec_dot_q2_0_q8_0`.
///
/// # Panics
/// If `q.len()` is not a multiple of 64, `row` is not `q.len()/64` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / Q8_0_BLOCK,
        "Q2_0: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), db) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d.chunks_exact(BLOCK_ELEMS / Q8_0_BLOCK))
    {
        let mut s = 0f32;
        for (k, (qk, &da)) in qb.chunks_exact(Q8_0_BLOCK).zip(db).enumerate() {
            let sumi: i32 = qk
                .iter()
                .enumerate()
                .map(|(j, &a)| value(block, k * Q8_0_BLOCK + j) * i32::from(a))
                .sum();
            s += da * sumi as f32;
        }
        sum += f16_at(block, 0) * s;
    }
    sum
}

block_format!(
    /// The Q2_0 format for the registry ([`super::format`]).
    Q2_0,
    Q2_0,
    RefDot::Q8_0(dot_q8_0),
    None,
    Some(include_str!("wgsl/q2_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block_and_dot() {
        let mut b = [0x55u8; BLOCK_BYTES]; // every code 1 → 0
        b[..2].copy_from_slice(&[0x00, 0x40]); // d = 2.0
        b[2] = 0b11_10_01_00; // elements 0..3: codes 0, 1, 2, 3 → −1, 0, 1, 2
        b[17] = 0b10_01_01_01; // element 63: code 2 → +1
        let mut out = [9f32; 64];
        dequantize_row(&b, &mut out);
        assert_eq!(&out[..4], &[-2.0, 0.0, 2.0, 4.0]);
        assert_eq!((out[4], out[63]), (0.0, 2.0));
        let mut q = [0i8; 64];
        q[0] = 3; // −3
        q[3] = 1; // +2
        q[63] = 5; // +5 in the second Q8_0 block
        assert_eq!(dot_q8_0(&b, &q, &[0.5, 0.25]), 2.0 * (-0.5 + 0.25 * 5.0));
    }
}
