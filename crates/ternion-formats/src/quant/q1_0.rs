//! Q1_0 (ggml type 41): 1-bit signs, 128-element blocks of 18 bytes: F16 `d`, then 16
//! bytes `qs`; element j is bit j % 8 of qs[j / 8]; the value is +d for a set bit, −d
//! otherwise. Pairs with Q8_0 activations. Layout and sources: docs/FORMATS.md.

use super::act::Q8_0_BLOCK;
use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 128;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q1_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// Whether element j of a block is positive.
fn bit(block: &[u8], j: usize) -> bool {
    (block[2 + j / 8] >> (j % 8)) & 1 == 1
}

/// Dequantizes a row of whole blocks: element = ±d.
///
/// # Panics
/// If `dst.len()` is not a multiple of 128 or `src` is not `dst.len()/128` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (j, o) in out.iter_mut().enumerate() {
            *o = if bit(block, j) { d } else { -d };
        }
    }
}

/// The codes of a row of whole blocks in element order, 2 for a set bit and 0 otherwise
/// (element = (code − 1)·scale, as the 2-bit ternary codes), and the block scales (the
/// CPU's repacked ternary layout reads them).
///
/// # Panics
/// If `codes.len()` is not a multiple of 128, `src` is not `codes.len()/128` blocks or
/// `scales` does not hold one value per block.
pub fn codes_row(src: &[u8], codes: &mut [u8], scales: &mut [f32]) {
    check(src.len(), codes.len());
    let code = |block: &[u8], j| 2 * u8::from(bit(block, j));
    super::format::block_codes(src, (BLOCK_BYTES, BLOCK_ELEMS), code, codes, scales);
}

/// ggml's reference quantizer (`quantize_row_q1_0_ref`): d = Σ|x| / 128 (summed in
/// order, stored as F16), bit j set when x_j ≥ 0.
///
/// # Panics
/// If `src.len()` is not a multiple of 128 or `dst` is not `src.len()/128` blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len());
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let sum_abs = x.iter().fold(0f32, |s, v| s + v.abs());
        block[..2].copy_from_slice(&f16_bytes(sum_abs / BLOCK_ELEMS as f32));
        block[2..].fill(0);
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                block[2 + j / 8] |= 1 << (j % 8);
            }
        }
    }
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32):
/// per block, s = Σ over its four Q8_0 blocks, in order, of d_a·(Σ ±q as f32), then
/// Σ over blocks of d_w·s, as ggml's generic `vec_dot_q1_0_q8_0`.
///
/// # Panics
/// If `q.len()` is not a multiple of 128, `row` is not `q.len()/128` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / Q8_0_BLOCK,
        "Q1_0: activation scale count"
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
                .map(|(j, &a)| {
                    let a = i32::from(a);
                    if bit(block, k * Q8_0_BLOCK + j) {
                        a
                    } else {
                        -a
                    }
                })
                .sum();
            s += da * sumi as f32;
        }
        sum += f16_at(block, 0) * s;
    }
    sum
}

block_format!(
    /// The Q1_0 format for the registry ([`super::format`]).
    Q1_0,
    Q1_0,
    RefDot::Q8_0(dot_q8_0),
    Some(quantize_row),
    Some(include_str!("wgsl/q1_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_scale_and_dot() {
        let mut x = [0.5f32; 128];
        x[3] = -1.5;
        x[127] = -0.5;
        x[64] = 0.0; // ≥ 0 → +d
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        let d = f16_at(&b, 0);
        assert_eq!(
            d,
            half::f16::from_f32((125.0 * 0.5 + 1.5 + 0.5) / 128.0).to_f32()
        );
        let mut out = [0f32; 128];
        dequantize_row(&b, &mut out);
        assert_eq!((out[0], out[3], out[64], out[127]), (d, -d, d, -d));
        let mut q = [0i8; 128];
        q[3] = 10; // −10
        q[40] = 4; // +4, second Q8_0 block
        let ds = [1.0f32, 0.5, 2.0, 2.0];
        assert_eq!(dot_q8_0(&b, &q, &ds), d * (-10.0 + 0.5 * 4.0));
    }
}
