//! Q5_0: ggml's 5-bit format, 32-element blocks of 22 bytes: F16 `d`, `qh[4]` (bit j of the
//! little-endian u32 is the fifth bit of element j), then 16 bytes `qs` (element j < 16 the
//! low nibble of qs[j], element j + 16 its high nibble); the value is (q − 16)·d. Pairs with
//! Q8_0 activations. Layout and sources: docs/FORMATS.md.

use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 22;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q5_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The signed values q − 16 of one block, in element order.
fn values(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let mut v = [0i8; BLOCK_ELEMS];
    for (j, &b) in block[6..].iter().enumerate() {
        let hi = |e: usize| (((qh >> e) & 1) << 4) as u8;
        v[j] = ((b & 0x0F) | hi(j)) as i8 - 16;
        v[j + 16] = ((b >> 4) | hi(j + 16)) as i8 - 16;
    }
    v
}

/// Dequantizes a row of whole blocks: element = (q − 16)·d.
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
            *o = f32::from(v) * d;
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q5_0_ref`): `max` is the first element of
/// largest |x| (sign kept), d = max/−16 (stored as F16), q = min(31, trunc(x·(1/d) + 16.5))
/// (0 codes → 16 when d = 0); the codes use the f32 d.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst` is not `src.len()/32` blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len());
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        let code = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
        let mut qh = 0u32;
        for j in 0..16 {
            let (c0, c1) = (code(x[j]), code(x[j + 16]));
            block[6 + j] = (c0 & 0x0F) | ((c1 & 0x0F) << 4);
            qh |= u32::from(c0 >> 4) << j;
            qh |= u32::from(c1 >> 4) << (j + 16);
        }
        block[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32, as
/// from [`super::act::quantize_q8_0`]): Σ over blocks, in order, of
/// (d_w·d_a)·(Σ (q_w − 16)·q as f32), as ggml's generic `vec_dot_q5_0_q8_0`.
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q5_0: activation scale count"
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
        sum += (f16_at(block, 0) * da) * sumi as f32;
    }
    sum
}

block_format!(
    /// The Q5_0 format for the registry ([`super::format`]).
    Q5_0,
    Q5_0,
    RefDot::Q8_0(dot_q8_0),
    Some(quantize_row),
    Some(include_str!("wgsl/q5_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8_0;
    use rand::{Rng, SeedableRng};

    #[test]
    fn known_block() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1.0
                                                   // Fifth bits: element 0 and element 31.
        block[2..6].copy_from_slice(&(1u32 | 1 << 31).to_le_bytes());
        block[6] = 0x2F; // element 0: 15 | 16 = 31 → 15; element 16: 2 → −14
        block[21] = 0xF0; // element 15: 0 → −16; element 31: 15 | 16 = 31 → 15
        let mut out = [9f32; 32];
        dequantize_row(&block, &mut out);
        assert_eq!(
            (out[0], out[16], out[15], out[31], out[1]),
            (15.0, -14.0, -16.0, 15.0, -16.0)
        );
    }

    #[test]
    fn quantize_uses_signed_max() {
        // max = −8 (first of largest |x|), d = 0.5, id = 2.
        let mut x = [0f32; 32];
        x[2] = -8.0; // −16 + 16.5 = 0.5 → 0 → −16·0.5 = −8
        x[3] = 8.0; // 32.5 → 32 → clamped to 31 → 7.5
        x[18] = 1.3; // 2.6 + 16.5 = 19.1 → 19 → 1.5
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 0.5);
        let mut out = [0f32; 32];
        dequantize_row(&b, &mut out);
        assert_eq!((out[2], out[3], out[18], out[0]), (-8.0, 7.5, 1.5, 0.0));
    }

    #[test]
    fn round_trip_and_dot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(51);
        let n = 96;
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut row = vec![0u8; n / 32 * BLOCK_BYTES];
        quantize_row(&w, &mut row);
        let mut back = vec![0f32; n];
        dequantize_row(&row, &mut back);
        for (i, (&a, &b)) in back.iter().zip(&w).enumerate() {
            let d = f16_at(&row, i / 32 * BLOCK_BYTES).abs();
            assert!((a - b).abs() <= d * (1.0 + 2e-3), "i{i}: {a} vs {b}");
        }
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let (mut q, mut d) = (vec![0i8; n], vec![0f32; 3]);
        quantize_q8_0(&x, &mut q, &mut d);
        let mut want = 0f32;
        for (b, &da) in d.iter().enumerate() {
            let dw = f16_at(&row, b * BLOCK_BYTES);
            let sumi: i32 = (b * 32..(b + 1) * 32)
                .map(|i| (back[i] / dw).round() as i32 * i32::from(q[i]))
                .sum();
            want += (dw * da) * sumi as f32;
        }
        assert_eq!(dot_q8_0(&row, &q, &d), want);
    }
}
