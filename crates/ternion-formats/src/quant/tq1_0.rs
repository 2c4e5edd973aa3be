//! TQ1_0: ggml's 1.6875-bit ternary format, 256-element blocks of 54 bytes: `qs[48]`,
//! `qh[4]`, F16 `d`.
//!
//! Trits (code = t + 1 ∈ {0, 1, 2}) are packed in base 3, first trit most significant, and
//! each byte stores ⌈v·256/3^5⌉ for its 5-trit number v (4 trits and a trailing 0 in `qh`).
//! Trit n of a byte b is read as ((b·3^n mod 256)·3) >> 8. Element order:
//! - `qs[0..32]`: element 32n + m is trit n of `qs[m]` (n = 0..5);
//! - `qs[32..48]`: element 160 + 16n + m is trit n of `qs[32 + m]` (n = 0..5);
//! - `qh[0..4]`: element 240 + 4n + j is trit n of `qh[j]` (n = 0..4).
//!
//! Sources: docs/FORMATS.md.

use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 54;
/// Bytes of 5-trit groups per block.
const QS_BYTES: usize = 48;
/// Bytes of 4-trit groups per block (after `qs`); the F16 scale follows them.
const QH_BYTES: usize = 4;
/// Offset of the F16 scale in a block.
const D_OFFSET: usize = QS_BYTES + QH_BYTES;
/// 3^n for n = 0..5, as in ggml's unpacking.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Where the trits of each byte go: (first byte, byte count, trits per byte, first element).
/// Within a run, element = first element + byte count·n + (byte − first byte).
const RUNS: [(usize, usize, usize, usize); 3] = [(0, 32, 5, 0), (32, 16, 5, 160), (48, 4, 4, 240)];

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::TQ1_0, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// Trit n (0 = most significant) of a packed byte, as t = code − 1.
fn trit(b: u8, n: usize) -> i8 {
    let q = b.wrapping_mul(POW3[n]);
    ((u16::from(q) * 3) >> 8) as i8 - 1
}

/// The ternary values of one block, t ∈ {−1, 0, 1}, in element order.
fn ternary(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut t = [0i8; BLOCK_ELEMS];
    for (first, count, trits, base) in RUNS {
        for n in 0..trits {
            let out = &mut t[base + count * n..base + count * (n + 1)];
            for (o, &b) in out.iter_mut().zip(&block[first..first + count]) {
                *o = trit(b, n);
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
    super::tq2_0::ternary_codes(src, BLOCK_BYTES, D_OFFSET, ternary, codes, scales);
}

/// Dequantizes a row of whole blocks: element = t·d.
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, D_OFFSET);
        for (o, &t) in out.iter_mut().zip(ternary(block).iter()) {
            *o = f32::from(t) * d;
        }
    }
}

/// ggml's reference quantizer: per block d = max|x| (stored as F16), code =
/// round(x·(1/d)) + 1 with rounding half away from zero (all codes 1 when d = 0), packed
/// as described in the module docs with the ceiling division by 3^5.
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
        for (first, count, trits, base) in RUNS {
            for (m, b) in block[first..first + count].iter_mut().enumerate() {
                let mut q = (0..trits).fold(0u8, |q, n| {
                    let code = (x[base + count * n + m] * id).round() as i32 + 1;
                    q.wrapping_mul(3).wrapping_add(code as u8)
                });
                // A 4-trit group is shifted up so that its first trit is the most significant.
                for _ in trits..5 {
                    q = q.wrapping_mul(3);
                }
                *b = (u16::from(q) * 256).div_ceil(243) as u8;
            }
        }
        block[D_OFFSET..].copy_from_slice(&f16_bytes(d));
    }
}

/// The same ternary values re-encoded as TQ2_0 (lossless: the trits and the per-block F16
/// scale carry over), for kernels that read TQ2_0 only (the GPU backend).
///
/// # Panics
/// If `src.len()` is not a multiple of the block size.
pub fn repack_tq2_0(src: &[u8]) -> Vec<u8> {
    assert!(
        src.len().is_multiple_of(BLOCK_BYTES),
        "TQ1_0 bytes not whole blocks"
    );
    let mut out = vec![0u8; src.len() / BLOCK_BYTES * super::tq2_0::BLOCK_BYTES];
    let mut vals = [0f32; BLOCK_ELEMS];
    for (b, o) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(super::tq2_0::BLOCK_BYTES))
    {
        dequantize_row(b, &mut vals);
        super::tq2_0::quantize_row(&vals, o);
    }
    out
}

/// Dot product against Q8_K activations (`q` int8, `d` one scale per 256): Σ over blocks, in
/// order, of (Σ t·q as i32) as f32 · (d_w·d_act), as ggml's generic `vec_dot_tq1_0_q8_K`.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "TQ1_0: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let sumi: i32 = ternary(block)
            .iter()
            .zip(qb)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum();
        sum += sumi as f32 * (f16_at(block, D_OFFSET) * da);
    }
    sum
}

block_format!(
    /// The TQ1_0 format for the registry ([`super::format`]).
    /// (The GPU reads TQ1_0 repacked to TQ2_0, [`repack_tq2_0`].)
    TQ1_0,
    TQ1_0,
    RefDot::Q8K(dot_q8k),
    Some(quantize_row),
    None
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::quantize_q8k;
    use rand::{Rng, SeedableRng};

    #[test]
    fn trits_of_known_bytes() {
        // Trits (2, 0, 1, 2, 1) → v = 2·81 + 0·27 + 1·9 + 2·3 + 1 = 178, byte ⌈178·256/243⌉ = 188.
        let b = 188u8;
        let got: Vec<i8> = (0..5).map(|n| trit(b, n)).collect();
        assert_eq!(got, [1, -1, 0, 1, 0]);
        // All-zero trits (code 1 each): v = 121, byte ⌈121·256/243⌉ = 128.
        assert!((0..5).all(|n| trit(128, n) == 0));
    }

    #[test]
    fn known_block() {
        // Every element 0 (bytes 128 in qs, qh = ⌈(40·3)·256/243⌉ = 127), except:
        // qs[0] = 188 → elements 0, 32, 64, 96, 128 = (+1, −1, 0, +1, 0);
        // qs[40] = 188 → elements 168, 184, 200, 216, 232 = (+1, −1, 0, +1, 0);
        // qh[2] = trits (2, 1, 1, 0) → v = (2·27 + 9 + 3 + 0)·3 = 198, byte ⌈198·256/243⌉ = 209
        //   → elements 242, 246, 250, 254 = (+1, 0, 0, −1).
        let mut block = [128u8; BLOCK_BYTES];
        block[48..52].fill(127);
        block[0] = 188;
        block[40] = 188;
        block[50] = 209;
        block[52..].copy_from_slice(&f16_bytes(1.5));
        let mut out = [0f32; 256];
        dequantize_row(&block, &mut out);
        let mut want = [0f32; 256];
        for (i, v) in [(0, 1.5), (32, -1.5), (96, 1.5)] {
            want[i] = v;
        }
        for (i, v) in [(168, 1.5), (184, -1.5), (216, 1.5), (242, 1.5), (254, -1.5)] {
            want[i] = v;
        }
        assert_eq!(out, want);
        // The quantizer writes exactly these bytes back.
        let mut again = [0u8; BLOCK_BYTES];
        quantize_row(&out, &mut again);
        assert_eq!(again, block);
    }

    #[test]
    fn every_5_trit_group_round_trips() {
        // All 243 values of a 5-trit group, in qs[0], and all 81 of a 4-trit group, in qh[0].
        for v in 0..243u32 {
            let mut x = [0f32; 256];
            x[1] = 1.0; // fixes d = 1 (element 1 is trit 0 of qs[1])
            let mut digits = v;
            for n in (0..5).rev() {
                x[32 * n] = (digits % 3) as f32 - 1.0;
                digits /= 3;
            }
            let mut digits = v % 81;
            for n in (0..4).rev() {
                x[240 + 4 * n] = (digits % 3) as f32 - 1.0;
                digits /= 3;
            }
            let mut b = [0u8; BLOCK_BYTES];
            quantize_row(&x, &mut b);
            let mut back = [0f32; 256];
            dequantize_row(&b, &mut back);
            assert_eq!(back, x, "v = {v}");
        }
    }

    #[test]
    fn ternary_round_trip_is_exact() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (rows, blocks) = (3, 2);
        let mut w = Vec::new();
        for _ in 0..rows * blocks {
            let s = f32::from(rng.random_range(1u16..2000)) / 512.0;
            let mut b: Vec<f32> = (0..256)
                .map(|_| (rng.random_range(0..3) - 1) as f32 * s)
                .collect();
            b[rng.random_range(0..256)] = s;
            w.extend(b);
        }
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
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..512)
            .map(|_| (rng.random_range(0..3) - 1) as f32 * 0.375)
            .collect();
        let mut row = vec![0u8; 2 * BLOCK_BYTES];
        quantize_row(&w, &mut row);
        let mut q = vec![0i8; 512];
        let mut d = vec![0f32; 2];
        quantize_q8k(&x, &mut q, &mut d);
        let mut want = 0f32;
        for (b, &da) in d.iter().enumerate() {
            let sumi: i32 = (b * 256..(b + 1) * 256)
                .map(|i| (w[i] / 0.375) as i32 * i32::from(q[i]))
                .sum();
            want += sumi as f32 * (0.375 * da);
        }
        assert_eq!(dot_q8k(&row, &q, &d), want);
    }

    #[test]
    fn repack_to_tq2_0_keeps_every_value() {
        let mut r = 7u32;
        let vals: Vec<f32> = (0..3 * BLOCK_ELEMS)
            .map(|i| {
                r = r.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let t = (r >> 16) % 3;
                (t as f32 - 1.0) * [0.5, 0.031, 0.0][i / BLOCK_ELEMS]
            })
            .collect();
        let mut t1 = vec![0u8; 3 * BLOCK_BYTES];
        quantize_row(&vals, &mut t1);
        let t2 = repack_tq2_0(&t1);
        let (mut a, mut b) = (vec![0f32; vals.len()], vec![0f32; vals.len()]);
        dequantize_row(&t1, &mut a);
        super::super::tq2_0::dequantize_row(&t2, &mut b);
        assert_eq!(a, b);
    }
}
