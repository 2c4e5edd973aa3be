//! IQ4_NL: ggml's non-linear 4-bit format, 32-element blocks of 18 bytes: F16 `d`, then 16
//! bytes `qs`; element j < 16 is the low nibble of qs[j], element j + 16 its high nibble;
//! the value is d·KVALUES[nibble] (a fixed non-uniform grid). Pairs with Q8_0 activations.
//! No quantizer here (ggml's searches scales per block against an importance matrix).
//! Layout and sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// ggml's `kvalues_iq4nl`: the value of each 4-bit code.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::IQ4_NL, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The grid values of one block's codes, in element order.
fn values(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut v = [0i8; BLOCK_ELEMS];
    let (lo, hi) = v.split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(&block[2..]) {
        *l = KVALUES[usize::from(b & 0x0F)];
        *h = KVALUES[usize::from(b >> 4)];
    }
    v
}

/// Dequantizes a row of whole blocks: element = d·KVALUES[nibble].
///
/// # Panics
/// If `dst.len()` is not a multiple of 32 or `src` is not `dst.len()/32` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (o, &v) in out.iter_mut().zip(values(block).iter()) {
            *o = d * f32::from(v);
        }
    }
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32):
/// Σ over blocks, in order, of (d_a·d_w)·(Σ KVALUES[nibble]·q as f32), as ggml's generic
/// `vec_dot_iq4_nl_q8_0`.
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "IQ4_NL: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let sumi: i32 = values(block)
            .iter()
            .zip(qb)
            .map(|(&w, &a)| i32::from(w) * i32::from(a))
            .sum();
        sum += (da * f16_at(block, 0)) * sumi as f32;
    }
    sum
}

block_format!(
    /// The IQ4_NL format for the registry ([`super::format`]).
    IQ4NL,
    IQ4_NL,
    RefDot::Q8_0(dot_q8_0),
    None,
    Some(include_str!("wgsl/iq4_nl.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block_and_dot() {
        let mut block = [0x88u8; BLOCK_BYTES]; // every code 8 → 1
        block[..2].copy_from_slice(&[0x00, 0x40]); // d = 2.0
        block[2] = 0xF0; // element 0: code 0 → −127; element 16: code 15 → 113
        let mut out = [0f32; 32];
        dequantize_row(&block, &mut out);
        assert_eq!((out[0], out[16], out[1]), (-254.0, 226.0, 2.0));
        let mut q = [0i8; 32];
        q[0] = 1;
        q[16] = 2;
        q[5] = -3;
        // Σ = −127 + 226 − 3 = 96; (0.5·2)·96.
        assert_eq!(dot_q8_0(&block, &q, &[0.5]), 96.0);
    }
}
