//! Q4_0: ggml's 4-bit format, 32-element blocks of 18 bytes: F16 `d`, then 16 bytes `qs`.
//! Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the value is
//! (nibble − 8)·d.
//! Sources: docs/FORMATS.md.

use super::float::{f16_at, f16_bytes};
use super::format::{block_codes, block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q4_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The signed values nibble − 8 of one block, in element order.
fn values(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut v = [0i8; BLOCK_ELEMS];
    let (lo, hi) = v.split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(&block[2..]) {
        *l = (b & 0x0F) as i8 - 8;
        *h = (b >> 4) as i8 - 8;
    }
    v
}

/// Dequantizes a row of whole blocks: element = (nibble − 8)·d.
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

/// ggml's reference quantizer: `max` is the first element of largest |x| (sign kept),
/// d = max/−8 (stored as F16), nibble = min(15, trunc(x·(1/d) + 8.5)) (0 codes → 8 when
/// d = 0). The codes use the f32 d, not the F16 one.
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
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        let nibble = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for (j, b) in block[2..].iter_mut().enumerate() {
            *b = nibble(x[j]) | (nibble(x[j + 16]) << 4);
        }
    }
}

/// The codes (nibbles, 0..=15) of a row of whole blocks in element order, and the block
/// scales: element = (code − 8)·scale of its block.
///
/// # Panics
/// If `codes.len()` is not a multiple of 32, `src` is not `codes.len()/32` blocks or
/// `scales` does not hold one value per block.
pub fn codes_row(src: &[u8], codes: &mut [u8], scales: &mut [f32]) {
    check(src.len(), codes.len());
    let code = |block: &[u8], j: usize| (block[2 + j % 16] >> (4 * (j / 16))) & 0x0F;
    block_codes(src, (BLOCK_BYTES, BLOCK_ELEMS), code, codes, scales);
}

/// Dot product against Q8_0 activations (`q` int8, `d` one F16-rounded scale per 32, as
/// from [`super::act::quantize_q8_0`]): Σ over blocks, in order, of
/// ((Σ (nibble − 8)·q as i32) as f32 · d_w) · d_act, as ggml's generic `vec_dot_q4_0_q8_0`
/// (which multiplies left to right, unlike the Q8_0 kernel).
///
/// # Panics
/// If `q.len()` is not a multiple of 32, `row` is not `q.len()/32` blocks or
/// `d.len() != q.len()/32`.
pub fn dot_q8_0(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q4_0: activation scale count"
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
        sum += sumi as f32 * f16_at(block, 0) * da;
    }
    sum
}

block_format!(
    /// The Q4_0 format for the registry ([`super::format`]).
    Q4_0,
    Q4_0,
    RefDot::Q8_0(dot_q8_0),
    Some(quantize_row),
    Some(include_str!("wgsl/q4_0.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8_0;
    use rand::{Rng, SeedableRng};

    /// A block of scale 1 whose elements are 0 but for 0 (−8), 16 (+7), 15 (+1), 31 (−5).
    fn known() -> [u8; BLOCK_BYTES] {
        let mut block = [0x88u8; BLOCK_BYTES]; // every nibble 8 → 0
        block[..2].copy_from_slice(&[0x00, 0x3C]); // F16 1.0
        block[2] = 0xF0; // element 0: nibble 0 → −8; element 16: nibble 15 → +7
        block[17] = 0x39; // element 15: nibble 9 → +1; element 31: nibble 3 → −5
        block
    }

    #[test]
    fn codes_are_the_nibbles_in_element_order() {
        let (mut codes, mut scales) = ([0u8; 32], [0f32; 1]);
        codes_row(&known(), &mut codes, &mut scales);
        assert_eq!(scales, [1.0]);
        let mut want = [8u8; 32];
        (want[0], want[16], want[15], want[31]) = (0, 15, 9, 3);
        assert_eq!(codes, want);
    }

    #[test]
    fn known_block() {
        let block = known();
        let mut out = [9f32; 32];
        dequantize_row(&block, &mut out);
        let mut want = [0f32; 32];
        want[0] = -8.0;
        want[16] = 7.0;
        want[15] = 1.0;
        want[31] = -5.0;
        assert_eq!(out, want);
    }

    #[test]
    fn quantize_uses_signed_max() {
        // max = +4 (first of largest |x|), d = −0.5, id = −2.
        let mut x = [0f32; 32];
        x[3] = 4.0; // 4·−2 + 8.5 = 0.5 → 0 → −8·−0.5 = 4
        x[4] = -4.0; // 16.5 → 16 → clamped to 15 → 7·−0.5 = −3.5
        x[5] = 0.3; // −0.6 + 8.5 = 7.9 → 7 → −1·−0.5 = 0.5
        x[20] = -1.0; // 10.5 → 10 → 2·−0.5 = −1
        let mut b = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut b);
        assert_eq!(f16_at(&b, 0), -0.5);
        let mut out = [0f32; 32];
        dequantize_row(&b, &mut out);
        assert_eq!((out[3], out[4], out[5], out[20]), (4.0, -3.5, 0.5, -1.0));
        assert_eq!(out[0], 0.0);
        let mut zb = [0u8; BLOCK_BYTES];
        quantize_row(&[0.0; 32], &mut zb);
        assert!(zb[2..].iter().all(|&v| v == 0x88));
    }

    #[test]
    fn round_trip_error_within_one_step() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (rows, n) = (3, 64);
        let x: Vec<f32> = (0..rows * n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let row_bytes = n / 32 * BLOCK_BYTES;
        let mut t = vec![0u8; rows * row_bytes];
        for (xr, tr) in x.chunks_exact(n).zip(t.chunks_exact_mut(row_bytes)) {
            quantize_row(xr, tr);
        }
        let mut back = vec![0f32; n];
        for (r, tr) in t.chunks_exact(row_bytes).enumerate() {
            dequantize_row(tr, &mut back);
            for (i, (&a, &b)) in back.iter().zip(&x[r * n..]).enumerate() {
                let d = f16_at(tr, i / 32 * BLOCK_BYTES).abs();
                // Half a step inside the range, one step at the clamped end, plus F16 rounding.
                assert!(
                    (a - b).abs() <= d * (1.0 + 8.0 * 2f32.powi(-11)),
                    "r{r} i{i}"
                );
            }
        }
    }

    #[test]
    fn dot_matches_block_formula() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let w: Vec<f32> = (0..64).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..64).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut row = vec![0u8; 2 * BLOCK_BYTES];
        quantize_row(&w, &mut row);
        let mut q = vec![0i8; 64];
        let mut d = vec![0f32; 2];
        quantize_q8_0(&x, &mut q, &mut d);
        let mut wd = vec![0f32; 64];
        dequantize_row(&row, &mut wd);
        let mut want = 0f32;
        for (b, &da) in d.iter().enumerate() {
            let dw = f16_at(&row, b * BLOCK_BYTES);
            let sumi: i32 = (b * 32..(b + 1) * 32)
                .map(|i| (wd[i] / dw) as i32 * i32::from(q[i]))
                .sum();
            want += sumi as f32 * dw * da;
        }
        assert_eq!(dot_q8_0(&row, &q, &d), want);
    }
}
