//! Q4_K: ggml's 4-bit k-quant (dequantization, and the dot product against Q8_K). 256-element super-blocks of 144
//! bytes: F16 `d`, F16 `dmin`, `scales[12]` (eight 6-bit scales and eight 6-bit mins), then
//! `qs[128]`. Each 64-element chunk c uses bytes qs[32c..32c+32]: its first 32 elements are
//! the low nibbles, the next 32 the high nibbles, with sub-block scales 2c and 2c + 1.
//! Element value = d·scale·nibble − dmin·min.
//! Sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 144;

/// The 6-bit scale and min of sub-block j (0..8) from the packed `scales[12]`: for j < 4
/// the low 6 bits of bytes j and j + 4; for j ≥ 4 the nibbles of byte j + 4 with the top two
/// bits of bytes j − 4 and j as high bits.
pub fn scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Dequantizes a row of whole super-blocks.
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        dst.len() % BLOCK_ELEMS,
        0,
        "Q4_K: {} elements is not whole blocks",
        dst.len()
    );
    assert_eq!(
        src.len(),
        dst.len() / BLOCK_ELEMS * BLOCK_BYTES,
        "Q4_K: {} bytes do not hold {} elements",
        src.len(),
        dst.len()
    );
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let scales = &block[4..16];
        let qs = &block[16..];
        for (c, (chunk, q)) in out
            .chunks_exact_mut(64)
            .zip(qs.chunks_exact(32))
            .enumerate()
        {
            let (lo, hi) = chunk.split_at_mut(32);
            let (s0, m0) = scale_min(scales, 2 * c);
            let (s1, m1) = scale_min(scales, 2 * c + 1);
            let (d0, min0) = (d * f32::from(s0), dmin * f32::from(m0));
            let (d1, min1) = (d * f32::from(s1), dmin * f32::from(m1));
            for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
                *l = d0 * f32::from(b & 0x0F) - min0;
                *h = d1 * f32::from(b >> 4) - min1;
            }
        }
    }
}

/// Dot product against Q8_K activations (`q` int8, `d` one f32 scale per 256, as from
/// [`super::act::quantize_q8k`]), as ggml's `vec_dot_q4_K_q8_K`: per super-block, the
/// integer sums Σ_j scale_j·Σ nibble·q and Σ_j min_j·Σ q over the eight 32-element
/// sub-blocks, then `d_act·d·Σscale − d_act·dmin·Σmin`, summed over super-blocks.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    assert_eq!(q.len() % BLOCK_ELEMS, 0, "Q4_K: length not whole blocks");
    assert_eq!(
        row.len(),
        q.len() / BLOCK_ELEMS * BLOCK_BYTES,
        "Q4_K: row bytes"
    );
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q4_K: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let scales = &block[4..16];
        let (mut sum_scaled, mut sum_mins) = (0i32, 0i32);
        for (c, (qs, qa)) in block[16..]
            .chunks_exact(32)
            .zip(qb.chunks_exact(64))
            .enumerate()
        {
            let (lo, hi) = qa.split_at(32);
            let (mut s_lo, mut s_hi, mut q_lo, mut q_hi) = (0i32, 0i32, 0i32, 0i32);
            for ((&b, &l), &h) in qs.iter().zip(lo).zip(hi) {
                s_lo += i32::from(b & 0x0F) * i32::from(l);
                s_hi += i32::from(b >> 4) * i32::from(h);
                q_lo += i32::from(l);
                q_hi += i32::from(h);
            }
            let (s0, m0) = scale_min(scales, 2 * c);
            let (s1, m1) = scale_min(scales, 2 * c + 1);
            sum_scaled += i32::from(s0) * s_lo + i32::from(s1) * s_hi;
            sum_mins += i32::from(m0) * q_lo + i32::from(m1) * q_hi;
        }
        let dd = da * f16_at(block, 0);
        let dm = da * f16_at(block, 2);
        sum += dd * sum_scaled as f32 - dm * sum_mins as f32;
    }
    sum
}

block_format!(
    /// The Q4_K format for the registry ([`super::format`]).
    Q4K,
    Q4_K,
    RefDot::Q8K(dot_q8k),
    None,
    Some(include_str!("wgsl/q4_k.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float::f16_bytes;

    #[test]
    fn dot_matches_dequantized_product() {
        use crate::quant::act::quantize_q8k;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        let n = 512;
        let row: Vec<u8> = (0..n / BLOCK_ELEMS * BLOCK_BYTES)
            .enumerate()
            .map(|(i, _)| match i % BLOCK_BYTES {
                0 | 2 => 0,
                1 => 0x2C, // F16 d ≈ 0.0625
                3 => 0x28, // F16 dmin ≈ 0.03
                _ => rng.random(),
            })
            .collect();
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let mut q = vec![0i8; n];
        let mut d = vec![0f32; n / 256];
        quantize_q8k(&x, &mut q, &mut d);
        let mut w = vec![0f32; n];
        dequantize_row(&row, &mut w);
        let want: f64 = (0..n)
            .map(|i| f64::from(w[i]) * f64::from(q[i]) * f64::from(d[i / 256]))
            .sum();
        let got = f64::from(dot_q8k(&row, &q, &d));
        assert!(
            (got - want).abs() < 1e-3 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    }

    #[test]
    fn scale_min_unpacking() {
        // Sub-block 5: scale = low nibble of byte 9 | (byte 1 >> 6) << 4,
        //              min = high nibble of byte 9 | (byte 5 >> 6) << 4.
        let mut s = [0u8; 12];
        s[1] = 0b10_000011; // scale 1 = 3, top bits 2
        s[5] = 0b01_000111; // min 1 = 7, top bits 1
        s[9] = 0xA6; // scale 5 low = 6, min 5 low = 10
        assert_eq!(scale_min(&s, 1), (3, 7));
        assert_eq!(scale_min(&s, 5), (6 | (2 << 4), 10 | (1 << 4)));
    }

    #[test]
    fn known_block() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        block[2..4].copy_from_slice(&f16_bytes(0.25));
        // Sub-block 0: scale 2, min 4; sub-block 1: scale 3, min 0; the rest 0.
        block[4] = 2;
        block[5] = 3;
        block[8] = 4;
        block[16] = 0x5A; // element 0: nibble 10, element 32: nibble 5
        let mut out = [0f32; 256];
        dequantize_row(&block, &mut out);
        assert_eq!(out[0], 0.5 * 2.0 * 10.0 - 0.25 * 4.0);
        assert_eq!(out[1], -1.0);
        assert_eq!(out[32], 0.5 * 3.0 * 5.0);
        assert_eq!(out[33], 0.0);
        assert!(out[64..].iter().all(|&v| v == 0.0));
    }
}
