//! I2_S: BitNet's 2-bit ternary format, x86 layout (QK = 128), one f32 scale per tensor.
//!
//! Layout (docs/FORMATS.md, I2_S): rows are contiguous, K/4 bytes each, in 32-byte blocks of 128
//! elements. Byte i of a block holds elements i, i+32, i+64 and i+96 at bit shifts 6, 4, 2
//! and 0. Codes mean 0 → −1, 1 → 0, 2 → +1; the value is (code − 1)·scale. Code 3 never
//! occurs in files; like bitnet.cpp's kernel (which computes Σ code·q − Σ q) it is read as
//! +2. The tensor ends with a 32-byte tail whose first 4 bytes hold the f32 scale.

use super::format::{BlockFormat, Quantizer, RefDot};
use super::GgmlType;
/// Bytes after the packed codes: the f32 scale, then 28 ignored bytes (written as zeros).
pub const TAIL_BYTES: usize = 32;
/// Elements per block.
pub const BLOCK_ELEMS: usize = 128;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 32;

/// Bit shift of the 2-bit code of element group g (elements 32g..32g+32 of a block).
const SHIFTS: [u32; 4] = [6, 4, 2, 0];

/// The per-tensor scale of an I2_S tensor of `n_elements` elements: the little-endian f32 at
/// byte `n_elements / 4`.
///
/// # Panics
/// If `n_elements` is not a multiple of 128 or `tensor` is too short to hold the scale.
pub fn tensor_scale(tensor: &[u8], n_elements: usize) -> f32 {
    assert_eq!(
        n_elements % BLOCK_ELEMS,
        0,
        "I2_S: {n_elements} elements is not a multiple of {BLOCK_ELEMS}"
    );
    let at = n_elements / 4;
    assert!(
        tensor.len() >= at + 4,
        "I2_S: tensor of {} bytes has no scale at byte {at}",
        tensor.len()
    );
    f32::from_le_bytes([tensor[at], tensor[at + 1], tensor[at + 2], tensor[at + 3]])
}

fn check_row(row_bytes: usize, elems: usize) {
    assert_eq!(
        row_bytes % BLOCK_BYTES,
        0,
        "I2_S: row of {row_bytes} bytes is not whole blocks"
    );
    assert_eq!(
        row_bytes * 4,
        elems,
        "I2_S: row of {row_bytes} bytes does not hold {elems} elements"
    );
}

/// Dequantizes one row: element j = (code_j − 1)·`scale`.
///
/// # Panics
/// If `row` is not whole 32-byte blocks or `dst.len() != 4 * row.len()`.
pub fn dequantize_row(row: &[u8], scale: f32, dst: &mut [f32]) {
    check_row(row.len(), dst.len());
    for (block, out) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        for (group, &shift) in out.chunks_exact_mut(BLOCK_BYTES).zip(&SHIFTS) {
            for (o, &b) in group.iter_mut().zip(block) {
                *o = (i32::from((b >> shift) & 3) - 1) as f32 * scale;
            }
        }
    }
}

/// The codes (0..=3; the value is code − 1) of one row, in element order.
///
/// # Panics
/// If `row` is not whole 32-byte blocks or `codes.len() != 4 * row.len()`.
pub fn codes_row(row: &[u8], codes: &mut [u8]) {
    check_row(row.len(), codes.len());
    for (block, out) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(codes.chunks_exact_mut(BLOCK_ELEMS))
    {
        for (group, &shift) in out.chunks_exact_mut(BLOCK_BYTES).zip(&SHIFTS) {
            for (o, &b) in group.iter_mut().zip(block) {
                *o = (b >> shift) & 3;
            }
        }
    }
}

/// Quantizes a whole tensor (all rows, then the tail) the way bitnet.cpp's `quantize_i2_s`
/// does: scale = max|w| over the tensor (in f64, stored as f32); code 1 where |w| < 1e-6,
/// else 2 for positive and 0 for negative w. Only the sign is kept, so the result is exact
/// for inputs that are already ternary {−s, 0, +s}. The 28 unused tail bytes are zeroed.
///
/// # Panics
/// If `w.len()` is not a multiple of 128 or `dst.len() != w.len()/4 + 32`.
pub fn quantize_tensor(w: &[f32], dst: &mut [u8]) {
    assert_eq!(
        w.len() % BLOCK_ELEMS,
        0,
        "I2_S: {} elements is not a multiple of {BLOCK_ELEMS}",
        w.len()
    );
    let packed = w.len() / 4;
    assert_eq!(
        dst.len(),
        packed + TAIL_BYTES,
        "I2_S: output must be n/4 + {TAIL_BYTES} bytes"
    );
    let max = w.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let (codes, tail) = dst.split_at_mut(packed);
    for (block, src) in codes
        .chunks_exact_mut(BLOCK_BYTES)
        .zip(w.chunks_exact(BLOCK_ELEMS))
    {
        block.fill(0);
        for (group, &shift) in src.chunks_exact(BLOCK_BYTES).zip(&SHIFTS) {
            for (b, &v) in block.iter_mut().zip(group) {
                let code: u8 = if f64::from(v).abs() < 1e-6 {
                    1
                } else if f64::from(v) * max > 0.0 {
                    2
                } else {
                    0
                };
                *b |= code << shift;
            }
        }
    }
    tail.fill(0);
    tail[..4].copy_from_slice(&(max as f32).to_le_bytes());
}

/// Exact Σ t_i·q_i over one row, t = code − 1, against int8 activations `q` (K = 128·n).
///
/// Per 32-byte block the four products of each byte lane are summed in i16 (at most
/// 4·2·128 in magnitude, code 3 included), then widened into 32 i32 lanes. The arithmetic
/// is written as wrapping (it cannot overflow for rows under 2^22 elements) so that builds
/// with overflow checks still vectorise.
///
/// # Panics
/// If `row` is not whole 32-byte blocks or `q.len() != 4 * row.len()`.
pub fn dot(row: &[u8], q: &[i8]) -> i32 {
    check_row(row.len(), q.len());
    let mut acc = [0i32; BLOCK_BYTES];
    for (block, qb) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
    {
        let block: &[u8; BLOCK_BYTES] = block.try_into().expect("32-byte chunk");
        let mut part = [0i16; BLOCK_BYTES];
        for (qg, &shift) in qb.chunks_exact(BLOCK_BYTES).zip(&SHIFTS) {
            let qg: &[i8; BLOCK_BYTES] = qg.try_into().expect("32-element chunk");
            for ((p, &b), &qv) in part.iter_mut().zip(block).zip(qg) {
                let t = i16::from((b >> shift) & 3).wrapping_sub(1);
                *p = p.wrapping_add(t.wrapping_mul(i16::from(qv)));
            }
        }
        for (a, &p) in acc.iter_mut().zip(&part) {
            *a = a.wrapping_add(i32::from(p));
        }
    }
    acc.iter().sum()
}

/// The I2_S format for the registry ([`super::format`]).
/// (Dequantized rows are codes − 1: the per-tensor scale is applied by the caller; the
/// GPU has its own ternary kernels for I2_S.)
pub struct I2S;

impl BlockFormat for I2S {
    const TYPE: GgmlType = GgmlType::I2_S;
    const BLOCK_ELEMS: usize = BLOCK_ELEMS;
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    const DOT: RefDot = RefDot::PerToken(dot);
    const QUANTIZE: Option<Quantizer> = None;
    const WGSL: Option<&'static str> = None;
    fn dequantize_row(src: &[u8], dst: &mut [f32]) {
        dequantize_row(src, 1.0, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Element j of a block, read with docs/FORMATS.md's formula.
    fn code_of(block: &[u8], j: usize) -> u8 {
        (block[j % 32] >> (6 - 2 * (j / 32))) & 3
    }

    #[test]
    fn known_block() {
        // Byte 0 = 0b00_01_10_11: element 0 → code 0 (−1), 32 → 1 (0), 64 → 2 (+1),
        // 96 → 3 (read as +2). Byte 5 = 0b10_10_00_01: elements 5, 37 → +1, 69 → −1, 101 → 0.
        // Every other byte is 0x55 (all codes 1 → 0).
        let mut row = [0x55u8; 32];
        row[0] = 0b00_01_10_11;
        row[5] = 0b10_10_00_01;
        let mut out = [9f32; 128];
        dequantize_row(&row, 0.5, &mut out);
        let mut want = [0f32; 128];
        want[0] = -0.5;
        want[64] = 0.5;
        want[96] = 1.0;
        want[5] = 0.5;
        want[37] = 0.5;
        want[69] = -0.5;
        assert_eq!(out, want);
        for (j, &v) in out.iter().enumerate() {
            assert_eq!(v, (f32::from(code_of(&row, j)) - 1.0) * 0.5, "j = {j}");
        }
    }

    #[test]
    fn tensor_scale_reads_first_tail_bytes() {
        let mut t = vec![0u8; 64 + TAIL_BYTES];
        t[64..68].copy_from_slice(&0.7f32.to_le_bytes());
        t[68..].fill(0xAB); // garbage after the scale is ignored
        assert_eq!(tensor_scale(&t, 256), 0.7);
    }

    #[test]
    fn quantize_ternary_tensor_is_exact() {
        // 3 rows of 256: ternary values of one scale, as the converters produce.
        let s = 0.8125f32;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let w: Vec<f32> = (0..768)
            .map(|_| (rng.random_range(0..3) - 1) as f32 * s)
            .collect();
        let mut t = vec![0xFFu8; 768 / 4 + TAIL_BYTES];
        quantize_tensor(&w, &mut t);
        assert_eq!(tensor_scale(&t, 768), s);
        assert!(t[768 / 4 + 4..].iter().all(|&b| b == 0));
        let mut back = vec![0f32; 256];
        for r in 0..3 {
            dequantize_row(&t[r * 64..(r + 1) * 64], s, &mut back);
            assert_eq!(back, &w[r * 256..(r + 1) * 256], "row {r}");
        }
        // Codes sit where docs/FORMATS.md's formula says.
        for (e, &v) in w.iter().enumerate() {
            let code = code_of(&t[(e / 128) * 32..], e % 128);
            assert_eq!(f32::from(code) - 1.0, v / s, "element {e}");
        }
    }

    #[test]
    fn quantize_keeps_signs_only() {
        let mut w = vec![0f32; 128];
        w[0] = 3.0;
        w[1] = -0.1;
        w[2] = 5e-7; // below 1e-6: zero
        w[3] = -2e-6;
        let mut t = vec![0u8; 32 + TAIL_BYTES];
        quantize_tensor(&w, &mut t);
        let mut back = vec![0f32; 128];
        dequantize_row(&t[..32], tensor_scale(&t, 128), &mut back);
        assert_eq!(&back[..4], &[3.0, -3.0, 0.0, -3.0]);
        assert!(back[4..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn all_zero_tensor() {
        let mut t = vec![0u8; 32 + TAIL_BYTES];
        quantize_tensor(&[0.0; 128], &mut t);
        assert!(t[..32].iter().all(|&b| b == 0x55));
        assert_eq!(tensor_scale(&t, 128), 0.0);
    }

    #[test]
    fn dot_equals_dequantized_dot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        for blocks in [1usize, 3, 20] {
            // Random bytes include code 3; extreme activations stress the i16 partials.
            let row: Vec<u8> = (0..blocks * 32).map(|_| rng.random()).collect();
            let mut q: Vec<i8> = (0..blocks * 128).map(|_| rng.random()).collect();
            q[0] = -128;
            let mut t = vec![0f32; blocks * 128];
            dequantize_row(&row, 1.0, &mut t);
            let want: i64 = t.iter().zip(&q).map(|(&a, &b)| a as i64 * b as i64).sum();
            assert_eq!(i64::from(dot(&row, &q)), want, "{blocks} blocks");
        }
        // Worst case for the i16 partials: all codes 3 (+2) against −128.
        let row = [0xFFu8; 32];
        let q = [-128i8; 128];
        assert_eq!(dot(&row, &q), 2 * -128 * 128);
    }

    #[test]
    #[should_panic(expected = "does not hold")]
    fn dot_length_mismatch_panics() {
        dot(&[0u8; 32], &[0i8; 127]);
    }
}
