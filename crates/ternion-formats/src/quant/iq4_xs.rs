//! IQ4_XS: ggml's non-linear 4-bit k-format, 256-element super-blocks of 136 bytes: F16
//! `d`, `scales_h` (u16), `scales_l[4]`, `qs[128]`. Sub-block ib (32 elements) has the
//! 6-bit scale ls = (nibble ib % 2 of scales_l[ib / 2]) | ((scales_h >> 2ib) & 3) << 4 and
//! uses qs[16ib..16ib+16] as IQ4_NL does (low nibbles first); the value is
//! d·(ls − 32)·KVALUES[nibble]. Pairs with Q8_K activations. No quantizer here. Layout and
//! sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};
use super::iq4_nl::KVALUES;
use super::GgmlType;

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 136;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::IQ4_XS, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// ls − 32 of sub-block ib (0..8) of a super-block (`block`: its 136 bytes).
pub fn scale(block: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([block[2], block[3]]);
    let lo = (block[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    i32::from(lo | ((((h >> (2 * ib)) & 3) as u8) << 4)) - 32
}

/// The grid values of sub-block ib, in element order.
fn values(block: &[u8], ib: usize) -> [i8; 32] {
    let mut v = [0i8; 32];
    let (lo, hi) = v.split_at_mut(16);
    for ((l, h), &b) in lo
        .iter_mut()
        .zip(hi.iter_mut())
        .zip(&block[8 + 16 * ib..8 + 16 * ib + 16])
    {
        *l = KVALUES[usize::from(b & 0x0F)];
        *h = KVALUES[usize::from(b >> 4)];
    }
    v
}

/// Dequantizes a row of whole super-blocks: element = (d·(ls − 32))·KVALUES[nibble].
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * scale(block, ib) as f32;
            for (y, &v) in o.iter_mut().zip(values(block, ib).iter()) {
                *y = dl * f32::from(v);
            }
        }
    }
}

/// Dot product against Q8_K activations, as ggml's generic `vec_dot_iq4_xs_q8_K`: per
/// sub-block, ((d·d_a)·(ls − 32))·f32(Σ KVALUES[nibble]·q), summed in order.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "IQ4_XS: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let d4d8 = f16_at(block, 0) * da;
        for (ib, qj) in qb.chunks_exact(32).enumerate() {
            let sumi: i32 = values(block, ib)
                .iter()
                .zip(qj)
                .map(|(&w, &a)| i32::from(w) * i32::from(a))
                .sum();
            sum += (d4d8 * scale(block, ib) as f32) * sumi as f32;
        }
    }
    sum
}

block_format!(
    /// The IQ4_XS format for the registry ([`super::format`]).
    IQ4XS,
    IQ4_XS,
    RefDot::Q8K(dot_q8k),
    None,
    Some(include_str!("wgsl/iq4_xs.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_and_values() {
        let mut b = [0x88u8; BLOCK_BYTES]; // every code 8 → 1
        b[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1
                                               // Sub-block 0: ls = 0x3 | 2 << 4 = 35 → 3; sub-block 1: ls = 0x1 | 1 << 4 = 17 → −15.
        b[2..4].copy_from_slice(&(0b0110u16).to_le_bytes());
        b[4] = 0x13;
        b[8] = 0xF0; // element 0: code 0 → −127; element 16: code 15 → 113
        let mut out = [0f32; 256];
        dequantize_row(&b, &mut out);
        assert_eq!(
            (out[0], out[16], out[1], out[32]),
            (-381.0, 339.0, 3.0, -15.0)
        );
        let mut q = [0i8; 256];
        q[0] = 1;
        q[32] = 2;
        assert_eq!(
            dot_q8k(&b, &q, &[0.5]),
            0.5 * 3.0 * -127.0 + 0.5 * -15.0 * 2.0
        );
    }
}
