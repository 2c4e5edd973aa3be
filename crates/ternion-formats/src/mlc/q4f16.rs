//! `q4f16_1` → GGUF blocks, losslessly.
//!
//! A `q4f16_1` weight of `out × in` is two records: `q_weight`, `uint32[out][in/8]` (eight
//! 4-bit codes per word, element `8w + k` in bits `4k..4k+4` of word `w`), and `q_scale`,
//! `float16[out][in/32]` (one scale per group of 32 along `in`); the value is
//! `(code − 7)·scale`. Read as little-endian bytes, byte `b` of a group's 16 bytes holds
//! element `2b` in its low nibble and `2b + 1` in its high nibble.
//!
//! GGUF Q4_0 stores the same group as `d` (F16) and 16 bytes whose byte `j` holds element
//! `j` (low nibble) and `j + 16` (high), valued `(nibble − 8)·d`. With `d = scale` and
//! `nibble = code + 1` every value is the same f32 product, for codes 0..=14 (all that MLC's
//! quantizer writes: it clamps to `2·7`). A tensor that holds code 15 goes to Q8_0 instead
//! (`d = scale`, `int8 = code − 7`), also exact.

use crate::quant::{q4_0, q8_0};

/// Elements per group (one Q4_0 or Q8_0 block).
pub const GROUP: usize = 32;
/// Bytes of packed codes per group (four `uint32`).
pub const GROUP_CODE_BYTES: usize = GROUP / 2;
/// Bytes of scale per group (one `float16`).
pub const GROUP_SCALE_BYTES: usize = 2;
/// The code that stands for zero.
pub const ZERO_CODE: u8 = 7;

/// The 32 codes of one group's 16 packed bytes, in element order.
fn codes(packed: &[u8]) -> [u8; GROUP] {
    let mut c = [0u8; GROUP];
    for (pair, &b) in c.chunks_exact_mut(2).zip(packed) {
        pair[0] = b & 0x0F;
        pair[1] = b >> 4;
    }
    c
}

/// Whether any code is 15 (which Q4_0 cannot hold).
pub fn has_code_15(q_weight: &[u8]) -> bool {
    q_weight.iter().any(|&b| b & 0x0F == 0x0F || b >> 4 == 0x0F)
}

/// Groups in a pair of records, when their lengths agree on one.
pub fn groups(q_weight: &[u8], q_scale: &[u8]) -> Option<usize> {
    let n = q_scale.len() / GROUP_SCALE_BYTES;
    (q_scale.len().is_multiple_of(GROUP_SCALE_BYTES) && q_weight.len() == n * GROUP_CODE_BYTES)
        .then_some(n)
}

/// Q4_0 blocks of the same values. The lengths must agree ([`groups`]) and no code may
/// be 15 ([`has_code_15`]).
pub fn to_q4_0(q_weight: &[u8], q_scale: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q_scale.len() / GROUP_SCALE_BYTES * q4_0::BLOCK_BYTES);
    for (packed, scale) in q_weight
        .chunks_exact(GROUP_CODE_BYTES)
        .zip(q_scale.chunks_exact(GROUP_SCALE_BYTES))
    {
        let c = codes(packed);
        out.extend_from_slice(scale);
        let (lo, hi) = c.split_at(GROUP / 2);
        out.extend(lo.iter().zip(hi).map(|(&l, &h)| (l + 1) | ((h + 1) << 4)));
    }
    out
}

/// Q8_0 blocks of the same values (any code). The lengths must agree ([`groups`]).
pub fn to_q8_0(q_weight: &[u8], q_scale: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q_scale.len() / GROUP_SCALE_BYTES * q8_0::BLOCK_BYTES);
    for (packed, scale) in q_weight
        .chunks_exact(GROUP_CODE_BYTES)
        .zip(q_scale.chunks_exact(GROUP_SCALE_BYTES))
    {
        out.extend_from_slice(scale);
        out.extend(
            codes(packed)
                .iter()
                .map(|&c| (c as i8 - ZERO_CODE as i8) as u8),
        );
    }
    out
}

/// The reference dequantization `(code − 7)·scale` in f32, one value per element.
pub fn dequantize(q_weight: &[u8], q_scale: &[u8]) -> Vec<f32> {
    q_weight
        .chunks_exact(GROUP_CODE_BYTES)
        .zip(q_scale.chunks_exact(GROUP_SCALE_BYTES))
        .flat_map(|(packed, scale)| {
            let s = half::f16::from_le_bytes([scale[0], scale[1]]).to_f32();
            codes(packed).map(|c| f32::from(c as i8 - ZERO_CODE as i8) * s)
        })
        .collect()
}
