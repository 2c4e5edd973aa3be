//! Q5_1: ggml's 5-bit format with an offset, 32-element blocks of 24 bytes: F16 `d`, F16
//! `m`, `qh[4]` (bit j of the little-endian u32 is the fifth bit of element j), then 16
//! bytes `qs` (element j < 16 the low nibble of qs[j], element j + 16 its high nibble); the
//! value is q·d + m. Pairs with Q8_1 activations. Layout and sources: docs/FORMATS.md.

use super::act::Q8_0_BLOCK;
use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q5_1, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The 5-bit codes of one block, in element order.
fn codes(block: &[u8]) -> [u8; BLOCK_ELEMS] {
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let mut v = [0u8; BLOCK_ELEMS];
    for (j, &b) in block[8..].iter().enumerate() {
        let hi = |e: usize| (((qh >> e) & 1) << 4) as u8;
        v[j] = (b & 0x0F) | hi(j);
        v[j + 16] = (b >> 4) | hi(j + 16);
    }
    v
}

/// Dequantizes a row of whole blocks: element = q·d + m.
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
        for (o, &q) in out.iter_mut().zip(codes(block).iter()) {
            *o = f32::from(q) * d + m;
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q5_1_ref`): min and max of the block,
/// d = (max − min)/31, q = trunc((x − min)·(1/d) + 0.5) as u8, without a clamp (0 when
/// d = 0); d and min stored as F16, the codes use the f32 values.
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        block[2..4].copy_from_slice(&f16_bytes(min));
        let code = |v: f32| ((v - min) * id + 0.5) as u8;
        let mut qh = 0u32;
        for j in 0..16 {
            let (c0, c1) = (code(x[j]), code(x[j + 16]));
            block[8 + j] = (c0 & 0x0F) | ((c1 & 0x0F) << 4);
            qh |= u32::from((c0 & 0x10) >> 4) << j;
            qh |= u32::from((c1 & 0x10) >> 4) << (j + 16);
        }
        block[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Dot product against Q8_1 activations (`q` int8, `d` and `s` per 32 as from
/// [`super::act::quantize_q8_1`]): Σ over blocks, in order, of
/// (d_w·d_a)·(Σ q_w·q as f32) + m_w·s_a, as ggml's generic `vec_dot_q5_1_q8_1`.
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or `d`, `s` are
/// not `q.len()/32` long.
pub fn dot_q8_1(row: &[u8], q: &[i8], d: &[f32], s: &[f32]) -> f32 {
    check(row.len(), q.len());
    let nb = q.len() / Q8_0_BLOCK;
    assert!(
        d.len() == nb && s.len() == nb,
        "Q5_1: activation scale count"
    );
    let mut sum = 0f32;
    for (((block, qb), &da), &sa) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
        .zip(s)
    {
        let sumi: i32 = codes(block)
            .iter()
            .zip(qb)
            .map(|(&w, &a)| i32::from(w) * i32::from(a))
            .sum();
        sum += (f16_at(block, 0) * da) * sumi as f32 + f16_at(block, 2) * sa;
    }
    sum
}

block_format!(
    /// The Q5_1 format for the registry ([`super::format`]).
    Q5_1,
    Q5_1,
    RefDot::Q8_1(dot_q8_1),
    Some(quantize_row),
    Some(include_str!("wgsl/q5_1.wgsl"))
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
        block[4..8].copy_from_slice(&(1u32 << 16).to_le_bytes()); // element 16: +16
        block[8] = 0x2F; // element 0: 15 → 13; element 16: 2 | 16 = 18 → 16
        let mut out = [9f32; 32];
        dequantize_row(&block, &mut out);
        assert_eq!((out[0], out[16], out[1]), (13.0, 16.0, -2.0));
    }

    #[test]
    fn quantize_spans_min_to_max() {
        let mut x = [0f32; 32];
        x[0] = -1.0; // min → 0
        x[9] = 2.1; // max → 31; d = 0.1
        x[25] = 0.52; // 15.2 + 0.5 → 15
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        let c = codes(&b);
        assert_eq!((c[0], c[9], c[25]), (0, 31, 15));
        assert_eq!(f16_at(&b, 2), -1.0);
    }

    #[test]
    fn round_trip_and_dot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(61);
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
