//! Q8_0: ggml's 8-bit format, 32-element blocks of 34 bytes: F16 `d`, then 32 i8 `qs`.
//! The value of element j is qs[j]·d.
//! Sources: docs/FORMATS.md.

use super::float::{f16_at, f16_bytes};
use super::format::{block_codes, block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q8_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// Dequantizes a row of whole blocks: element = qs·d.
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
        for (o, &b) in out.iter_mut().zip(&block[2..]) {
            *o = f32::from(b as i8) * d;
        }
    }
}

/// ggml's reference quantizer: d = max|x|/127 (stored as F16), qs = round(x·(1/d)) with
/// rounding half away from zero (0 when d = 0). The codes use the f32 d, not the F16 one.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst` is not `src.len()/32` blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len());
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        for (b, &v) in block[2..].iter_mut().zip(x) {
            *b = (v * id).round() as i8 as u8;
        }
    }
}

/// The codes (qs + 128, 0..=255: unsigned bytes for `vpdpbusd`) of a row of whole blocks
/// in element order, and the block scales: element = (code − 128)·scale of its block.
///
/// # Panics
/// If `codes.len()` is not a multiple of 32, `src` is not `codes.len()/32` blocks or
/// `scales` does not hold one value per block.
pub fn codes_row(src: &[u8], codes: &mut [u8], scales: &mut [f32]) {
    check(src.len(), codes.len());
    let code = |block: &[u8], j: usize| block[2 + j] ^ 0x80;
    block_codes(src, (BLOCK_BYTES, BLOCK_ELEMS), code, codes, scales);
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32, as
/// from [`super::act::quantize_q8_0`]): Σ over blocks, in order, of
/// (Σ qs·q as i32) as f32 · (d_w·d_act), as ggml's generic `vec_dot_q8_0_q8_0`.
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q8_0: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let sumi: i32 = block[2..]
            .iter()
            .zip(qb)
            .map(|(&w, &a)| i32::from(w as i8) * i32::from(a))
            .sum();
        sum += sumi as f32 * (f16_at(block, 0) * da);
    }
    sum
}

block_format!(
    /// The Q8_0 format for the registry ([`super::format`]).
    Q8_0,
    Q8_0,
    RefDot::Q8_0(dot_q8_0),
    Some(quantize_row),
    Some(include_str!("wgsl/q8_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8_0;
    use rand::{Rng, SeedableRng};

    /// A block of scale 0.5 and values 1, −1, −128, 0…, 127.
    fn known() -> [u8; BLOCK_BYTES] {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&[0x00, 0x38]); // F16 0.5
        block[2] = 1;
        block[3] = 0xFF; // -1
        block[4] = 0x80; // -128
        block[33] = 127;
        block
    }

    #[test]
    fn known_block() {
        let block = known();
        let mut out = [9f32; 32];
        dequantize_row(&block, &mut out);
        assert_eq!(&out[..3], &[0.5, -0.5, -64.0]);
        assert_eq!(out[31], 63.5);
        assert!(out[3..31].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn codes_are_the_values_plus_128() {
        let block = known();
        let (mut codes, mut scales) = ([0u8; 32], [0f32; 1]);
        codes_row(&block, &mut codes, &mut scales);
        assert_eq!(scales, [0.5]);
        assert_eq!(&codes[..3], &[129, 127, 0]);
        assert_eq!(codes[31], 255);
        assert!(codes[3..31].iter().all(|&c| c == 128));
    }

    #[test]
    fn quantize_rounding_and_zero_block() {
        let mut x = [0f32; 64];
        x[0] = -127.0; // d = 1
        x[1] = 0.5; // half away from zero → 1
        x[2] = -1.5; // → -2
        x[3] = 2.4;
        let mut b = [0u8; 2 * BLOCK_BYTES];
        quantize_row(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        assert_eq!(&b[2..6], &[(-127i8) as u8, 1, (-2i8) as u8, 2]);
        assert_eq!(&b[BLOCK_BYTES..], &[0u8; BLOCK_BYTES]);
    }

    #[test]
    fn round_trip_error_within_half_step() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (rows, n) = (5, 96);
        let x: Vec<f32> = (0..rows * n).map(|_| rng.random_range(-4.0..4.0)).collect();
        let mut t = vec![0u8; rows * n / 32 * BLOCK_BYTES];
        for (xr, tr) in x
            .chunks_exact(n)
            .zip(t.chunks_exact_mut(n / 32 * BLOCK_BYTES))
        {
            quantize_row(xr, tr);
        }
        let mut back = vec![0f32; n];
        for (r, tr) in t.chunks_exact(n / 32 * BLOCK_BYTES).enumerate() {
            dequantize_row(tr, &mut back);
            for (i, (&a, &b)) in back.iter().zip(&x[r * n..]).enumerate() {
                let d = f16_at(tr, i / 32 * BLOCK_BYTES);
                // Half a step, plus the F16 rounding of d times at most 127.
                assert!(
                    (a - b).abs() <= 0.5 * d + 127.0 * d * 2f32.powi(-11),
                    "r{r} i{i}"
                );
            }
        }
    }

    #[test]
    fn dot_matches_block_formula() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let w: Vec<f32> = (0..96).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..96).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut row = vec![0u8; 3 * BLOCK_BYTES];
        quantize_row(&w, &mut row);
        let mut q = vec![0i8; 96];
        let mut d = vec![0f32; 3];
        quantize_q8_0(&x, &mut q, &mut d);
        let mut want = 0f32;
        for b in 0..3 {
            let blk = &row[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            let sumi: i32 = (0..32)
                .map(|j| i32::from(blk[2 + j] as i8) * i32::from(q[b * 32 + j]))
                .sum();
            want += sumi as f32 * (f16_at(blk, 0) * d[b]);
        }
        assert_eq!(dot_q8_0(&row, &q, &d), want);
        let mut wd = vec![0f32; 96];
        dequantize_row(&row, &mut wd);
        let float: f32 = (0..96).map(|i| wd[i] * f32::from(q[i]) * d[i / 32]).sum();
        assert!((dot_q8_0(&row, &q, &d) - float).abs() <= 1e-4 * float.abs().max(1.0));
    }
}
