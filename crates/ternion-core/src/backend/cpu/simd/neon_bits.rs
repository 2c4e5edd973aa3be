//! aarch64 NEON kernels of the 1- and 2-bit formats Q1_0 and Q2_0 (18-byte blocks: F16
//! scale, 16 bytes of codes; 128 and 64 elements) against Q8_0 activations, on the file's
//! rows. Callers guarantee the feature (see `Level::detect`).
//!
//! Q1_0: bit j % 8 of byte j / 8 is element j (set: +d, clear: −d). Q2_0: bits 2s..2s+1
//! of byte i are the code (value + 1) of element 4i + s. Every 32-element sub-block (one
//! Q8_0 activation block) gives the exact integer Σ (code − 1)·q as Σ code·q − Σq (codes 2
//! and 0 for Q1_0); the float combination then runs in the reference dot's order, so the
//! results equal it bit for bit.

use std::arch::aarch64::*;

use super::neon::{bit_mask, dot32, f16_at};
use super::vnni::Q80Rows;

/// Bytes per Q1_0 / Q2_0 block.
const BLOCK_BYTES: usize = 18;

/// The 32 codes, in element order, of the sub-block whose code bytes start at `p`.
///
/// # Safety
/// `p` must point at 4 (`BITS` = 1) or 8 (`BITS` = 2) readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn codes<const BITS: usize>(p: *const u8) -> [int8x16_t; 2] {
    if BITS == 1 {
        let two = vdupq_n_u8(2);
        let b = [*p, *p.add(1), *p.add(2), *p.add(3)];
        [bit_mask(b[0], b[1]), bit_mask(b[2], b[3])].map(|m| vreinterpretq_s8_u8(vandq_u8(m, two)))
    } else {
        // Plane s holds the codes of elements 4i + s; zipping bytes, then byte pairs,
        // restores element order.
        let v = vld1_u8(p);
        let m = vdup_n_u8(3);
        let s = [
            vand_u8(v, m),
            vand_u8(vshr_n_u8::<2>(v), m),
            vand_u8(vshr_n_u8::<4>(v), m),
            vshr_n_u8::<6>(v),
        ];
        let s01 = vreinterpretq_u16_u8(vcombine_u8(vzip1_u8(s[0], s[1]), vzip2_u8(s[0], s[1])));
        let s23 = vreinterpretq_u16_u8(vcombine_u8(vzip1_u8(s[2], s[3]), vzip2_u8(s[2], s[3])));
        [vzip1q_u16(s01, s23), vzip2q_u16(s01, s23)].map(|c| vreinterpretq_s8_u16(c))
    }
}

/// Q1_0 (`BITS` = 1) or Q2_0 (`BITS` = 2) row against T token rows of Q8_0 activations
/// (`q`, `d`, `sum` read): per block, s = Σ over its sub-blocks, in order, of
/// d·(Σ code·q − Σq) as f32, then Σ over blocks of d_w·s. The codes of each sub-block are
/// unpacked once for all T tokens.
#[target_feature(enable = "neon")]
pub unsafe fn bits_dots<const BITS: usize, const T: usize>(
    row: &[u8],
    x: [Q80Rows<'_>; T],
) -> [f32; T] {
    let per_block = if BITS == 1 { 4 } else { 2 };
    let nb = row.len() / BLOCK_BYTES;
    let ns = nb * per_block;
    for xt in &x {
        assert!(
            row.len().is_multiple_of(BLOCK_BYTES)
                && xt.q.len() == 32 * ns
                && xt.d.len() == ns
                && xt.sum.len() == ns,
            "bits_dots: lengths"
        );
    }
    let mut total = [0f32; T];
    for b in 0..nb {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        let dw = f16_at(blk);
        let mut c = [[vdupq_n_s8(0); 2]; 4];
        for (k, ck) in c.iter_mut().enumerate().take(per_block) {
            *ck = codes::<BITS>(blk.add(2 + 4 * BITS * k));
        }
        for (xt, tot) in x.iter().zip(total.iter_mut()) {
            let mut s = 0f32;
            for (k, &ck) in c.iter().enumerate().take(per_block) {
                let j = b * per_block + k;
                let sumi = dot32(ck, xt.q.as_ptr().add(32 * j)) - xt.sum[j];
                s += xt.d[j] * sumi as f32;
            }
            *tot += dw * s;
        }
    }
    total
}
