//! TQ2_0: ggml's 2-bit ternary format, 256-element blocks of 66 bytes: `qs[64]`, F16 `d`.
//!
//! In each 128-element half h (bytes 32h..32h+32), byte 32h+m holds element 128h + m + 32n
//! at bits 2n (n = 0..3, low bits first). The value is (code − 1)·d. Code 3 never comes out
//! of the quantizer; it reads as +2, as in ggml's dequantizer and dot product.
//! Sources: docs/FORMATS.md.

use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 66;
/// Bytes of packed codes per block (the F16 scale follows).
const QS_BYTES: usize = 64;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::TQ2_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The ternary codes of one block, t = code − 1, in element order.
fn ternary(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut t = [0i8; BLOCK_ELEMS];
    for (half, qs) in t
        .chunks_exact_mut(128)
        .zip(block[..QS_BYTES].chunks_exact(32))
    {
        for (n, group) in half.chunks_exact_mut(32).enumerate() {
            for (v, &b) in group.iter_mut().zip(qs) {
                *v = ((b >> (2 * n)) & 3) as i8 - 1;
            }
        }
    }
    t
}

/// The codes (t + 1, 0..=3) of a row of whole blocks in element order, and the block
/// scales: element = (code − 1)·scale of its block.
///
/// # Panics
/// If `codes.len()` is not a multiple of 256, `src` is not `codes.len()/256` blocks or
/// `scales` does not hold one value per block.
pub fn codes_row(src: &[u8], codes: &mut [u8], scales: &mut [f32]) {
    check(src.len(), codes.len());
    ternary_codes(src, BLOCK_BYTES, QS_BYTES, ternary, codes, scales);
}

/// The codes t + 1 and the f32 scale of each 256-element block of `src` (blocks of
/// `block_bytes`, the F16 scale at `d_offset`, `ternary` unpacking one block), for the
/// TQ formats' `codes_row`.
pub(super) fn ternary_codes(
    src: &[u8],
    block_bytes: usize,
    d_offset: usize,
    ternary: fn(&[u8]) -> [i8; BLOCK_ELEMS],
    codes: &mut [u8],
    scales: &mut [f32],
) {
    assert_eq!(scales.len(), codes.len() / BLOCK_ELEMS, "block scale count");
    for ((block, out), s) in src
        .chunks_exact(block_bytes)
        .zip(codes.chunks_exact_mut(BLOCK_ELEMS))
        .zip(scales.iter_mut())
    {
        *s = f16_at(block, d_offset);
        for (o, &t) in out.iter_mut().zip(ternary(block).iter()) {
            *o = (t + 1) as u8;
        }
    }
}

/// Dequantizes a row of whole blocks: element = (code − 1)·d.
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, QS_BYTES);
        for (o, &t) in out.iter_mut().zip(ternary(block).iter()) {
            *o = f32::from(t) * d;
        }
    }
}

/// ggml's reference quantizer: per block d = max|x| (stored as F16), code =
/// round(x/d) + 1 with rounding half away from zero, computed as x·(1/d) with the f32 d
/// (all codes 1 when d = 0).
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst` is not `src.len()/256` blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len());
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let d = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (qs, scale) = block.split_at_mut(QS_BYTES);
        for (half, xs) in qs.chunks_exact_mut(32).zip(x.chunks_exact(128)) {
            for (m, b) in half.iter_mut().enumerate() {
                *b = (0..4).fold(0u8, |q, n| {
                    let code = (xs[m + 32 * n] * id).round() as i32 + 1;
                    q | (((code & 3) as u8) << (2 * n))
                });
            }
        }
        scale.copy_from_slice(&f16_bytes(d));
    }
}

/// Dot product against Q8_K activations (`q` int8, `d` one scale per 256): Σ over blocks, in
/// order, of (Σ t·q as i32) as f32 · (d_act·d_w), as ggml's generic `vec_dot_tq2_0_q8_K`.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "TQ2_0: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let t = ternary(block);
        let sumi: i32 = t
            .iter()
            .zip(qb)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum();
        sum += sumi as f32 * (da * f16_at(block, QS_BYTES));
    }
    sum
}

block_format!(
    /// The TQ2_0 format for the registry ([`super::format`]).
    TQ2_0,
    TQ2_0,
    RefDot::Q8K(dot_q8k),
    Some(quantize_row),
    Some(include_str!("wgsl/tq2_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8k;
    use rand::{Rng, SeedableRng};

    #[test]
    fn known_block() {
        // All codes 1 (0x55) except byte 0 = 0b11_10_01_00 and byte 33 = 0b00_00_00_10.
        // Byte 0 (half 0, m = 0): element 0 → code 0 (−1), 32 → 1, 64 → 2 (+1), 96 → 3 (+2).
        // Byte 33 (half 1, m = 1): element 129 → code 2, 161, 193, 225 → code 0 (−1).
        let mut block = [0x55u8; BLOCK_BYTES];
        block[0] = 0b11_10_01_00;
        block[33] = 0b00_00_00_10;
        block[64..].copy_from_slice(&f16_bytes(0.25));
        let mut out = [0f32; 256];
        dequantize_row(&block, &mut out);
        let mut want = [0f32; 256];
        want[0] = -0.25;
        want[64] = 0.25;
        want[96] = 0.5;
        want[129] = 0.25;
        want[161] = -0.25;
        want[193] = -0.25;
        want[225] = -0.25;
        assert_eq!(out, want);
    }

    #[test]
    fn quantize_rounding() {
        // d = 2; x/d = 0.5 rounds away from zero to 1, -0.5 to -1, 0.49 to 0.
        let mut x = [0f32; 256];
        x[0] = 2.0;
        x[1] = 1.0;
        x[2] = -1.0;
        x[3] = 0.98;
        x[200] = -2.0;
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        let mut out = [0f32; 256];
        dequantize_row(&b, &mut out);
        assert_eq!(&out[..4], &[2.0, 2.0, -2.0, 0.0]);
        assert_eq!(out[200], -2.0);
        assert_eq!(f16_at(&b, 64), 2.0);
        let mut zb = [0u8; BLOCK_BYTES];
        quantize_row(&[0.0; 256], &mut zb);
        assert!(zb[..64].iter().all(|&v| v == 0x55));
        assert_eq!(f16_at(&zb, 64), 0.0);
    }

    fn ternary_rows(rng: &mut impl Rng, rows: usize, blocks: usize) -> Vec<f32> {
        // One F16-exact scale per block, values in {−s, 0, +s}, and each block hits ±s.
        let mut w = Vec::with_capacity(rows * blocks * 256);
        for _ in 0..rows * blocks {
            let s = f32::from(rng.random_range(1u16..2000)) / 1024.0;
            let mut b: Vec<f32> = (0..256)
                .map(|_| (rng.random_range(0..3) - 1) as f32 * s)
                .collect();
            b[rng.random_range(0..256)] = -s;
            w.extend(b);
        }
        w
    }

    #[test]
    fn ternary_round_trip_is_exact() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (rows, blocks) = (5, 3);
        let w = ternary_rows(&mut rng, rows, blocks);
        let mut t = vec![0u8; rows * blocks * BLOCK_BYTES];
        for (x, dst) in w
            .chunks_exact(blocks * 256)
            .zip(t.chunks_exact_mut(blocks * BLOCK_BYTES))
        {
            quantize_row(x, dst);
        }
        let mut back = vec![0f32; w.len()];
        for (src, dst) in t
            .chunks_exact(blocks * BLOCK_BYTES)
            .zip(back.chunks_exact_mut(blocks * 256))
        {
            dequantize_row(src, dst);
        }
        assert_eq!(back, w);
    }

    #[test]
    fn dot_matches_block_formula() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        // Random bytes (code 3 included) and random scales.
        let mut row = vec![0u8; 3 * BLOCK_BYTES];
        rng.fill(&mut row[..]);
        for b in row.chunks_exact_mut(BLOCK_BYTES) {
            b[64..].copy_from_slice(&f16_bytes(rng.random_range(0.01..1.0)));
        }
        let x: Vec<f32> = (0..768).map(|_| rng.random_range(-2.0..2.0)).collect();
        let mut q = vec![0i8; 768];
        let mut d = vec![0f32; 3];
        quantize_q8k(&x, &mut q, &mut d);
        let mut w = vec![0f32; 768];
        dequantize_row(&row, &mut w);
        let mut want = 0f32;
        for b in 0..3 {
            let dw = f16_at(&row[b * BLOCK_BYTES..], 64);
            // t ∈ {−1, 0, 1, 2}, so t·dw is exact and w/dw gives t back exactly.
            let sumi: i32 = (b * 256..(b + 1) * 256)
                .map(|i| (w[i] / dw) as i32 * i32::from(q[i]))
                .sum();
            want += sumi as f32 * (d[b] * dw);
        }
        assert_eq!(dot_q8k(&row, &q, &d), want);
        // And it approximates the float dot of the dequantized operands.
        let float: f32 = (0..768).map(|i| w[i] * f32::from(q[i]) * d[i / 256]).sum();
        assert!((dot_q8k(&row, &q, &d) - float).abs() <= 1e-3 * float.abs().max(1.0));
    }
}
