//! Float rows: F32, F16 and BF16, little-endian, one element per 4 or 2 bytes.
//!
//! Conversions to F16/BF16 round to nearest, ties to even (ggml's F16C and BF16 rounding).
//! Sources: docs/FORMATS.md.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::format::{BlockFormat, Quantizer, RefDot};
use super::GgmlType;

/// Bytes per F32 element.
pub const F32_BYTES: usize = 4;
/// Bytes per F16 or BF16 element.
pub const HALF_BYTES: usize = 2;

/// Elements converted per step by the batched F16 paths.
const CHUNK: usize = 64;

/// The F16 value stored little-endian at `bytes[off..off + 2]`, as f32.
pub(crate) fn f16_at(bytes: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([bytes[off], bytes[off + 1]]).to_f32()
}

/// `v` rounded to F16, little-endian (how ggml stores block scales).
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn check_len(src_bytes: usize, dst_elems: usize, elem_bytes: usize) {
    assert_eq!(
        src_bytes,
        dst_elems * elem_bytes,
        "float row: {src_bytes} bytes do not hold {dst_elems} elements of {elem_bytes} bytes"
    );
}

/// Copies an F32 row out of little-endian bytes.
///
/// # Panics
/// If `src.len() != 4 * dst.len()`.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    check_len(src.len(), dst.len(), F32_BYTES);
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(F32_BYTES)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Writes an F32 row as little-endian bytes.
///
/// # Panics
/// If `dst.len() != 4 * src.len()`.
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    check_len(dst.len(), src.len(), F32_BYTES);
    for (b, v) in dst.chunks_exact_mut(F32_BYTES).zip(src) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// Decodes up to `CHUNK` F16 elements from `src` into `dst` (same element count).
fn f16_chunk(src: &[u8], dst: &mut [f32]) {
    let mut halves = [f16::ZERO; CHUNK];
    let halves = &mut halves[..dst.len()];
    for (h, b) in halves.iter_mut().zip(src.chunks_exact(HALF_BYTES)) {
        *h = f16::from_le_bytes([b[0], b[1]]);
    }
    halves.convert_to_f32_slice(dst);
}

/// Converts an F16 row to f32 (exact).
///
/// # Panics
/// If `src.len() != 2 * dst.len()`.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    check_len(src.len(), dst.len(), HALF_BYTES);
    for (d, s) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK * HALF_BYTES)) {
        f16_chunk(s, d);
    }
}

/// Rounds an f32 row to F16 (nearest, ties to even), little-endian.
///
/// # Panics
/// If `dst.len() != 2 * src.len()`.
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    check_len(dst.len(), src.len(), HALF_BYTES);
    for (b, &v) in dst.chunks_exact_mut(HALF_BYTES).zip(src) {
        b.copy_from_slice(&f16_bytes(v));
    }
}

/// Converts a BF16 row to f32 (exact).
///
/// # Panics
/// If `src.len() != 2 * dst.len()`.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    check_len(src.len(), dst.len(), HALF_BYTES);
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(HALF_BYTES)) {
        *d = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Rounds an f32 row to BF16 (nearest, ties to even; NaN stays a quiet NaN), little-endian.
///
/// # Panics
/// If `dst.len() != 2 * src.len()`.
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    check_len(dst.len(), src.len(), HALF_BYTES);
    for (b, &v) in dst.chunks_exact_mut(HALF_BYTES).zip(src) {
        b.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
    }
}

/// Σ w_i·x_i of an F16 row `row` against f32 activations `x`, accumulated in f32 over eight
/// interleaved lanes (lane i%8), then summed lane 0 to 7. The activations are not rounded
/// to F16 first (ggml does that; the difference is activation-rounding noise).
///
/// # Panics
/// If `row.len() != 2 * x.len()`.
pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    check_len(row.len(), x.len(), HALF_BYTES);
    let mut lanes = [0f32; 8];
    let mut w = [0f32; CHUNK];
    for (s, xs) in row.chunks(CHUNK * HALF_BYTES).zip(x.chunks(CHUNK)) {
        let w = &mut w[..xs.len()];
        f16_chunk(s, w);
        for (i, (wv, xv)) in w.iter().zip(xs).enumerate() {
            lanes[i % 8] += wv * xv;
        }
    }
    lanes.iter().sum()
}

/// Σ w_i·x_i of an F32 row against f32 activations, summed in element order.
///
/// # Panics
/// If `row.len() != 4 * x.len()`.
pub fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    check_len(row.len(), x.len(), F32_BYTES);
    row.chunks_exact(F32_BYTES)
        .zip(x)
        .map(|(b, &v)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v)
        .sum()
}

/// Σ w_i·x_i of a BF16 row against activations already rounded to BF16 (ggml's
/// `vec_dot_type`), f32 products summed in element order.
///
/// # Panics
/// If `row.len() != 2 * x.len()`.
pub fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    check_len(row.len(), x.len(), HALF_BYTES);
    row.chunks_exact(HALF_BYTES)
        .zip(x)
        .map(|(b, &v)| bf16::from_le_bytes([b[0], b[1]]).to_f32() * v)
        .sum()
}

/// Declares the registry entry of a float format (one element per block).
macro_rules! float_format {
    ($name:ident, $ty:ident, $bytes:expr, $dot:expr, $quant:expr, $deq:expr) => {
        #[doc = concat!("The ", stringify!($ty), " format for the registry ([`super::format`]).")]
        pub struct $name;

        impl BlockFormat for $name {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK_ELEMS: usize = 1;
            const BLOCK_BYTES: usize = $bytes;
            const DOT: RefDot = $dot;
            const QUANTIZE: Option<Quantizer> = Some($quant);
            const WGSL: Option<&'static str> = Some(include_str!("wgsl/float.wgsl"));
            fn dequantize_row(src: &[u8], dst: &mut [f32]) {
                $deq(src, dst)
            }
        }
    };
}

float_format!(
    F32,
    F32,
    F32_BYTES,
    RefDot::F32(dot_f32),
    quantize_row_f32,
    dequantize_row_f32
);
float_format!(
    F16,
    F16,
    HALF_BYTES,
    RefDot::F16(dot_f16),
    quantize_row_f16,
    dequantize_row_f16
);
float_format!(
    BF16,
    BF16,
    HALF_BYTES,
    RefDot::BF16(dot_bf16),
    quantize_row_bf16,
    dequantize_row_bf16
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_bytes() {
        // 0x3C00 = 1.0, 0xC000 = -2.0, 0x7BFF = 65504 (max), 0x0001 = 2^-24 (smallest subnormal).
        let src = [0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00];
        let mut dst = [0f32; 4];
        dequantize_row_f16(&src, &mut dst);
        assert_eq!(dst, [1.0, -2.0, 65504.0, 2f32.powi(-24)]);
        let mut back = [0u8; 8];
        quantize_row_f16(&dst, &mut back);
        assert_eq!(back, src);
    }

    #[test]
    fn f16_rounds_ties_to_even() {
        // 1 + 2^-11 lies halfway between 1.0 (even mantissa) and 1 + 2^-10.
        let mut b = [0u8; 2];
        quantize_row_f16(&[1.0 + 2f32.powi(-11)], &mut b);
        assert_eq!(b, [0x00, 0x3C]);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
        quantize_row_f16(&[1.0 + 3.0 * 2f32.powi(-11)], &mut b);
        assert_eq!(u16::from_le_bytes(b), 0x3C02);
    }

    #[test]
    fn bf16_known_bytes_and_rounding() {
        // 0x3F80 = 1.0, 0xC040 = -3.0.
        let src = [0x80, 0x3F, 0x40, 0xC0];
        let mut dst = [0f32; 2];
        dequantize_row_bf16(&src, &mut dst);
        assert_eq!(dst, [1.0, -3.0]);
        let mut b = [0u8; 2];
        // 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7: ties to even gives 1.0.
        quantize_row_bf16(&[1.0 + 2f32.powi(-8)], &mut b);
        assert_eq!(u16::from_le_bytes(b), 0x3F80);
        quantize_row_bf16(&[1.0 + 3.0 * 2f32.powi(-8)], &mut b);
        assert_eq!(u16::from_le_bytes(b), 0x3F82);
    }

    #[test]
    fn f32_round_trip() {
        let v = [0.0f32, -1.5, f32::MAX, 1e-40];
        let mut b = [0u8; 16];
        quantize_row_f32(&v, &mut b);
        assert_eq!(&b[4..8], &(-1.5f32).to_le_bytes());
        let mut back = [0f32; 4];
        dequantize_row_f32(&b, &mut back);
        assert_eq!(back, v);
    }

    #[test]
    fn dot_f16_matches_dequantized_dot() {
        // 131 elements: two full chunks and a partial one.
        let w: Vec<f32> = (0..131)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 8.0)
            .collect();
        let x: Vec<f32> = (0..131)
            .map(|i| ((i * 11 % 17) as f32 - 8.0) / 4.0)
            .collect();
        let mut row = vec![0u8; 262];
        quantize_row_f16(&w, &mut row);
        // Every product and partial sum is a small multiple of 1/32: the f32 sum is exact.
        let want: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert_eq!(dot_f16(&row, &x), want);
        assert_ne!(want, 0.0);
    }

    #[test]
    #[should_panic(expected = "do not hold")]
    fn length_mismatch_panics() {
        dequantize_row_f16(&[0u8; 3], &mut [0f32; 2]);
    }
}
