//! aarch64 NEON kernels of the 32-element block formats with an offset or a non-linear grid:
//! Q4_1 and Q5_1 against Q8_1 activations, IQ4_NL against Q8_0. Callers guarantee NEON
//! (see `Level::detect`); [`super::neon_dot::run`] picks `sdot` where the CPU has `dotprod`.
//!
//! Layouts (docs/FORMATS.md), element j < 16 the low nibble of `qs[j]`, j + 16 its high:
//! - Q4_1 (20 bytes): F16 `d`, F16 `m`, `qs[16]`; value nibble·d + m.
//! - Q5_1 (24 bytes): F16 `d`, F16 `m`, `qh[4]` (bit j: fifth bit of element j), `qs[16]`;
//!   value (nibble | fifth bit · 16)·d + m.
//! - IQ4_NL (18 bytes): F16 `d`, `qs[16]`; value d·`KVALUES[nibble]`.
//!
//! Each block's integer dot is exact and the block terms are combined in the scalar
//! reference's float order, so the results equal it bit for bit.

use std::arch::aarch64::*;

use super::neon::{bit_mask, f16_at};
use super::neon_dot::{check, dot32, Act, Dot, RowDot};
use super::neon_q80::nibbles;
use crate::quant::iq4_nl::KVALUES;

/// Σ over the blocks of Q4_1 or Q5_1 (`FIFTH`: the block has `qh`) against Q8_1
/// activations, as the references: (d·d_a)·Σ code·q + m·s_a per block.
///
/// # Safety
/// NEON and what `D` needs.
#[inline(always)]
unsafe fn q8_1_dot<D: Dot, const FIFTH: bool>(row: &[u8], x: Act<'_>, what: &str) -> f32 {
    let block_bytes = if FIFTH { 24 } else { 20 };
    check(row, x, (32, block_bytes), x.d.len(), what);
    let sixteen = vdupq_n_u8(16);
    let mut sum = 0f32;
    for (b, (&da, &sa)) in x.d.iter().zip(x.s).enumerate() {
        let blk = row.as_ptr().add(block_bytes * b);
        let mut w = nibbles(blk.add(block_bytes - 16));
        if FIFTH {
            let high = [
                bit_mask(*blk.add(4), *blk.add(5)),
                bit_mask(*blk.add(6), *blk.add(7)),
            ];
            w = [0, 1].map(|i| vorrq_u8(w[i], vandq_u8(high[i], sixteen)));
        }
        let sumi = dot32::<D>(w.map(|v| vreinterpretq_s8_u8(v)), x.q.as_ptr().add(32 * b));
        sum += (f16_at(blk) * da) * sumi as f32 + f16_at(blk.add(2)) * sa;
    }
    sum
}

/// Q4_1 · Q8_1, as [`crate::quant::q4_1::dot_q8_1`].
pub(super) struct Q4_1;

impl RowDot for Q4_1 {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        q8_1_dot::<D, false>(row, x, "q4_1_dot")
    }
}

/// Q5_1 · Q8_1, as [`crate::quant::q5_1::dot_q8_1`].
pub(super) struct Q5_1;

impl RowDot for Q5_1 {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        q8_1_dot::<D, true>(row, x, "q5_1_dot")
    }
}

/// The IQ4 grid values (`KVALUES`) of 32 nibbles.
#[inline(always)]
pub(super) unsafe fn iq4_grid(n: [uint8x16_t; 2]) -> [int8x16_t; 2] {
    let table = vld1q_s8(KVALUES.as_ptr());
    n.map(|i| vqtbl1q_s8(table, i))
}

/// IQ4_NL · Q8_0, as [`crate::quant::iq4_nl::dot_q8_0`].
pub(super) struct Iq4Nl;

impl RowDot for Iq4Nl {
    #[inline(always)]
    unsafe fn dot<D: Dot>(row: &[u8], x: Act<'_>) -> f32 {
        const BLOCK_BYTES: usize = 18;
        check(row, x, (32, BLOCK_BYTES), 0, "iq4_nl_dot");
        let mut sum = 0f32;
        for (b, &da) in x.d.iter().enumerate() {
            let blk = row.as_ptr().add(BLOCK_BYTES * b);
            let sumi = dot32::<D>(iq4_grid(nibbles(blk.add(2))), x.q.as_ptr().add(32 * b));
            sum += (da * f16_at(blk)) * sumi as f32;
        }
        sum
    }
}
