//! AVX-512 (F, BW, VNNI) K-quant row kernels against Q8_K activations. Each returns what
//! its scalar reference returns, bit for bit: the per-block integer sums are exact (any
//! order gives the same integer) and combine into the float result in the reference's
//! order. Callers guarantee the features and the lengths (see [`super::q6_k_dot_q8k`]).

use std::arch::x86_64::*;

/// Bytes of a Q6_K block (256 weights): 128 of low nibbles, 64 of high bit pairs, 16 int8
/// scales (one per 16 weights) and the F16 block scale.
const Q6_K_BYTES: usize = 210;

/// Q6_K row against Q8_K activations: per block, the 6-bit codes u (0..=63) of 64
/// consecutive weights at a time multiply the activations by `vpdpbusd` (four products per
/// 32-bit lane, so lanes 4j..4j+3 hold scale group j's partial sums), `32 · Σx` comes off
/// (the codes' offset), the lanes are multiplied by their group's scale and summed; then
/// `sum += d_w · d_x · isum` block after block, as the reference.
///
/// # Panics
/// If `row` does not hold `d.len()` blocks and `q` `256 · d.len()` values.
///
/// # Safety
/// AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q6_k_dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    assert!(
        row.len() == d.len() * Q6_K_BYTES && q.len() == d.len() * 256,
        "q6_k_dot_q8k: lengths"
    );
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(3);
    let c32 = _mm512_set1_epi8(32);
    // High bit pairs of weights 0..31 sit in bits 0-1 of the 32 qh bytes, of weights
    // 32..63 in bits 2-3 (and 4-5, 6-7 for weights 64..127): per-half shift counts.
    let shift_lo = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    let shift_hi = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
    // Lane l of a 64-weight product belongs to scale group l / 4 of its four.
    let groups = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let p = row.as_ptr().add(b * Q6_K_BYTES);
        let x = q.as_ptr().add(256 * b);
        let scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(192).cast()));
        let mut acc = _mm512_setzero_si512();
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h).cast()));
            let hi = |shift: __m512i| {
                let v = _mm512_and_si512(_mm512_srlv_epi64(qh, shift), m2);
                _mm512_slli_epi16::<4>(v)
            };
            let codes = [
                _mm512_or_si512(_mm512_and_si512(ql, m4), hi(shift_lo)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    hi(shift_hi),
                ),
            ];
            for (k, u) in codes.into_iter().enumerate() {
                let xv = _mm512_loadu_si512(x.add(128 * h + 64 * k).cast());
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);
                let offset = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c32, xv);
                let first = _mm512_set1_epi32((8 * h + 4 * k) as i32);
                let sc = _mm512_permutexvar_epi32(_mm512_add_epi32(groups, first), scales);
                let v = _mm512_mullo_epi32(_mm512_sub_epi32(dot, offset), sc);
                acc = _mm512_add_epi32(acc, v);
            }
        }
        let dw = half::f16::from_bits(u16::from_le_bytes([*p.add(208), *p.add(209)])).to_f32();
        sum += dw * da * _mm512_reduce_add_epi32(acc) as f32;
    }
    sum
}
