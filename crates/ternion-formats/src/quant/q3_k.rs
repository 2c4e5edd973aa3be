//! Q3_K: ggml's 3-bit k-quant, 256-element super-blocks of 110 bytes: `hmask[32]`,
//! `qs[64]`, `scales[12]` (sixteen 6-bit scales), F16 `d`. Element 128h + 32j + l (l < 32)
//! has low bits (qs[32h + l] >> 2j) & 3 and high bit (hmask[l] >> (4h + j)) & 1; its
//! value is q = low − (high ? 0 : 4) ∈ [−4, 3]. Scale i (one per 16 elements) is
//! (i < 8 ? scales[i] & 15 : scales[i − 8] >> 4) | ((scales[8 + i % 4] >> 2(i / 4)) & 3) << 4,
//! used as scale − 32. Element value = d·(scale − 32)·q. Pairs with Q8_K activations.
//! Layout and sources: docs/FORMATS.md.

use super::float::f16_at;
use super::format::{block_format, RefDot};
use super::GgmlType;

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 110;

fn check(bytes: usize, elems: usize) {
    super::format::check_row(GgmlType::Q3_K, BLOCK_ELEMS, BLOCK_BYTES, bytes, elems);
}

/// Scale i − 32 (i = 0..16) of a super-block (`block`: its 110 bytes).
pub fn scale(block: &[u8], i: usize) -> i32 {
    let sc = &block[96..108];
    let lo = if i < 8 { sc[i] & 15 } else { sc[i - 8] >> 4 };
    let hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    i32::from(lo | (hi << 4)) - 32
}

/// The signed 3-bit values of one super-block, in element order.
fn values(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut v = [0i8; BLOCK_ELEMS];
    for (e, o) in v.iter_mut().enumerate() {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((block[32 + 32 * h + l] >> (2 * j)) & 3) as i8;
        let high = (block[l] >> (4 * h + j)) & 1;
        *o = if high == 1 { low } else { low - 4 };
    }
    v
}

/// Dequantizes a row of whole super-blocks (ggml's `dequantize_row_q3_K`).
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 108);
        let v = values(block);
        for (g, (o, vg)) in out.chunks_exact_mut(16).zip(v.chunks_exact(16)).enumerate() {
            let dl = d * scale(block, g) as f32;
            for (y, &q) in o.iter_mut().zip(vg) {
                *y = dl * f32::from(q);
            }
        }
    }
}

/// Dot product against Q8_K activations: per super-block isum = Σ_g (scale_g − 32)·Σ q·a
/// over the sixteen 16-element groups, then (d·d_a)·f32(isum), summed in order (ggml's
/// `vec_dot_q3_K_q8_K` up to float summation order).
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    check(row.len(), q.len());
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q3_K: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let v = values(block);
        let isum: i32 = v
            .chunks_exact(16)
            .zip(qb.chunks_exact(16))
            .enumerate()
            .map(|(g, (vg, ag))| {
                scale(block, g)
                    * vg.iter()
                        .zip(ag)
                        .map(|(&w, &a)| i32::from(w) * i32::from(a))
                        .sum::<i32>()
            })
            .sum();
        sum += (f16_at(block, 108) * da) * isum as f32;
    }
    sum
}

block_format!(
    /// The Q3_K format for the registry ([`super::format`]).
    Q3K,
    Q3_K,
    RefDot::Q8K(dot_q8k),
    None,
    Some(include_str!("wgsl/q3_k.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[0] = 0b0000_0001; // hmask[0]: the high bit of element 0 (h 0, j 0)
        b[32] = 0b00_00_00_11; // element 0: low 3 → 3
        b[96] = 0x0F; // scale 0 low nibble 15
        b[104] = 0b10; // scale 0 high bits 2 → 47 → 15
        b[108..110].copy_from_slice(&[0x00, 0x3C]); // d = 1
        let mut out = [0f32; 256];
        dequantize_row(&b, &mut out);
        // Element 0: 15·3; element 1: 15·(0 − 4); element 16 (scale 1 = 0 − 32): −32·−4.
        assert_eq!((out[0], out[1], out[16]), (45.0, -60.0, 128.0));
        let mut q = [0i8; 256];
        q[0] = 1;
        q[16] = 1;
        assert_eq!(dot_q8k(&b, &q, &[0.5]), 0.5 * (45.0 + 128.0));
    }
}
