//! Q2_K: ggml's 2-bit k-quant, 256-element super-blocks of 84 bytes: `scales[16]` (low
//! nibble: scale, high nibble: min, one per 16 elements), `qs[64]`, F16 `d`, F16 `dmin`.
//! Each 128-element half h uses qs[32h..32h+32]: element 128h + 32j + l (l < 32) is bits
//! 2j of qs[32h + l]. Element value = d·scale·q − dmin·min, scale and min of group
//! element / 16. Pairs with Q8_K activations. Layout and sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 84;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q2_K, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// The 2-bit codes of one super-block, in element order.
fn codes(block: &[u8]) -> [u8; BLOCK_ELEMS] {
    let mut v = [0u8; BLOCK_ELEMS];
    for (e, c) in v.iter_mut().enumerate() {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        *c = (block[16 + 32 * h + l] >> (2 * j)) & 3;
    }
    v
}

/// Dequantizes a row of whole super-blocks (ggml's `dequantize_row_q2_K`).
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
        let q = codes(block);
        for (g, (o, qg)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let sc = block[g];
            let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
            for (y, &c) in o.iter_mut().zip(qg) {
                *y = dl * f32::from(c) - ml;
            }
        }
    }
}

/// Dot product against Q8_K activations, as ggml's generic `vec_dot_q2_K_q8_K`: per
/// super-block isum = Σ_g scale_g·Σ q·a and summs = Σ_g min_g·Σ a over the sixteen
/// 16-element groups, then (d_a·d)·f32(isum) − (d_a·dmin)·f32(summs), summed in order.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q2_K: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let codes = codes(block);
        let (mut isum, mut summs) = (0i32, 0i32);
        for (g, (cg, ag)) in codes.chunks_exact(16).zip(qb.chunks_exact(16)).enumerate() {
            let dot: i32 = cg
                .iter()
                .zip(ag)
                .map(|(&c, &a)| i32::from(c) * i32::from(a))
                .sum();
            let bsum: i32 = ag.iter().map(|&a| i32::from(a)).sum();
            isum += i32::from(block[g] & 0x0F) * dot;
            summs += i32::from(block[g] >> 4) * bsum;
        }
        sum += (da * f16_at(block, 80)) * isum as f32 - (da * f16_at(block, 82)) * summs as f32;
    }
    sum
}

block_format!(
    /// The Q2_K format for the registry ([`super::format`]).
    Q2K,
    Q2_K,
    RefDot::Q8K(dot_q8k),
    None,
    Some(include_str!("wgsl/q2_k.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[0] = 0x32; // group 0: scale 2, min 3
        b[15] = 0x01; // group 15: scale 1, min 0
        b[16] = 0b11_00_00_10; // element 0: code 2; element 96: code 3
        b[16 + 32 + 31] = 0b11_00_00_00; // element 128 + 96 + 31 = 255: code 3
        b[80..82].copy_from_slice(&[0x00, 0x3C]); // d = 1
        b[82..84].copy_from_slice(&[0x00, 0x38]); // dmin = 0.5
        let mut out = [0f32; 256];
        dequantize_row(&b, &mut out);
        assert_eq!((out[0], out[1], out[255]), (2.0 * 2.0 - 1.5, -1.5, 3.0));
        let mut q = [0i8; 256];
        q[0] = 2;
        q[255] = 1;
        // isum = 2·(2·2) + 1·(3·1) = 11; summs = 3·2 = 6.
        assert_eq!(dot_q8k(&b, &q, &[0.5]), 0.5 * 11.0 - 0.25 * 6.0);
    }
}
