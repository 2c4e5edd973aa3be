//! Q4_1: ggml's 4-bit format with an offset, 32-element blocks of 20 bytes: F16 `d`, F16
//! `m`, then 16 bytes `qs`; element j < 16 is the low nibble of qs[j], element j + 16 its
//! high nibble; the value is nibble·d + m. Pairs with Q8_1 activations. Layout and sources:
//! docs/FORMATS.md.

use super::act::Q8_0_BLOCK;
use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q4_1, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The nibbles of one block, in element order.
fn nibbles(block: &[u8]) -> [u8; BLOCK_ELEMS] {
    let mut v = [0u8; BLOCK_ELEMS];
    let (lo, hi) = v.split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(&block[4..]) {
        *l = b & 0x0F;
        *h = b >> 4;
    }
    v
}

/// Dequantizes a row of whole blocks: element = nibble·d + m (ggml's
/// `dequantize_row_q4_1`).
///
/// # Panics
/// If `dst.len()` is not a multiple of 32 or `src` is not `dst.len()/32` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        for (o, &n) in out.iter_mut().zip(nibbles(block).iter()) {
            *o = f32::from(n) * d + m;
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q4_1_ref`): min and max of the block,
/// d = (max − min)/15, nibble = min(15, trunc((x − min)·(1/d) + 0.5)) (0 when d = 0); d and
/// min are stored as F16, the codes use the f32 values.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst` is not `src.len()/32` blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len());
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        block[2..4].copy_from_slice(&f16_bytes(min));
        let nibble = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        for (j, b) in block[4..].iter_mut().enumerate() {
            *b = nibble(x[j]) | (nibble(x[j + 16]) << 4);
        }
    }
}

/// Dot product against Q8_1 activations (`q` int8, `d` and `s` per 32 as from
/// [`super::act::quantize_q8_1`]): Σ over blocks, in order, of
/// (d_w·d_a)·(Σ nibble·q as f32) + m_w·s_a, as ggml's generic `vec_dot_q4_1_q8_1`.
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or `d`, `s` are
/// not `q.len()/32` long.
pub fn dot_q8_1(row: &[u8], q: &[i8], d: &[f32], s: &[f32]) -> f32 {
    check(row.len(), q.len());
    let nb = q.len() / Q8_0_BLOCK;
    assert!(
        d.len() == nb && s.len() == nb,
        "Q4_1: activation scale count"
    );
    let mut sum = 0f32;
    for (((block, qb), &da), &sa) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
        .zip(s)
    {
        let sumi: i32 = nibbles(block)
            .iter()
            .zip(qb)
            .map(|(&w, &a)| i32::from(w) * i32::from(a))
            .sum();
        sum += (f16_at(block, 0) * da) * sumi as f32 + f16_at(block, 2) * sa;
    }
    sum
}

block_format!(
    /// The Q4_1 format for the registry ([`super::format`]).
    Q4_1,
    Q4_1,
    RefDot::Q8_1(dot_q8_1),
    Some(quantize_row),
    Some(include_str!("wgsl/q4_1.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8_1;
    use rand::{Rng, SeedableRng};

    #[test]
    fn known_block() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1.0
        block[2..4].copy_from_slice(&[0x00, 0xC0]); // m = −2.0
        block[4] = 0xF3; // element 0: 3 → 1; element 16: 15 → 13
        block[19] = 0x10; // element 15: 0 → −2; element 31: 1 → −1
        let mut out = [9f32; 32];
        dequantize_row(&block, &mut out);
        assert_eq!(
            (out[0], out[16], out[15], out[31], out[1]),
            (1.0, 13.0, -2.0, -1.0, -2.0)
        );
    }

    #[test]
    fn quantize_spans_min_to_max() {
        let mut x = [0.5f32; 32];
        x[0] = -1.0; // min → nibble 0
        x[7] = 2.0; // max → nibble 15; d = 0.2
        x[20] = 0.41; // (1.41)·5 + 0.5 = 7.55 → 7
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        assert_eq!(f16_at(&b, 2), -1.0);
        let n = nibbles(&b);
        assert_eq!((n[0], n[7], n[20]), (0, 15, 7));
        let mut zb = [0u8; BLOCK_BYTES];
        quantize_row(&[3.0; 32], &mut zb);
        assert_eq!((f16_at(&zb, 0), f16_at(&zb, 2)), (0.0, 3.0));
        assert!(zb[4..].iter().all(|&v| v == 0));
    }

    #[test]
    fn round_trip_and_dot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        let n = 96;
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.5)).collect();
        let mut row = vec![0u8; n / 32 * BLOCK_BYTES];
        quantize_row(&w, &mut row);
        let mut back = vec![0f32; n];
        dequantize_row(&row, &mut back);
        for (i, (&a, &b)) in back.iter().zip(&w).enumerate() {
            let d = f16_at(&row, i / 32 * BLOCK_BYTES);
            assert!((a - b).abs() <= 0.5 * d + 2e-3, "i{i}: {a} vs {b}");
        }
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let (mut q, mut d, mut s) = (vec![0i8; n], vec![0f32; 3], vec![0f32; 3]);
        quantize_q8_1(&x, &mut q, &mut d, &mut s);
        let want: f32 = back
            .iter()
            .zip(&q)
            .enumerate()
            .map(|(i, (&wv, &qv))| wv * f32::from(qv) * d[i / 32])
            .sum();
        let got = dot_q8_1(&row, &q, &d, &s);
        assert!(
            (got - want).abs() <= 1e-2 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
