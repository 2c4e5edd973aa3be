//! AVX-512 (F, BW, VNNI) K-quant row kernels against Q8_K activations. Each returns what
//! its scalar reference returns, bit for bit: the per-block integer sums are exact (any
//! order gives the same integer) and combine into the float result in the reference's
//! order. Callers guarantee the features and the lengths (see [`super::q6_k_dot_q8k`]).

use std::arch::x86_64::*;

use super::x86::{head_prefetch, prefetch_block};

/// Bytes of a Q6_K block (256 weights): 128 of low nibbles, 64 of high bit pairs, 16 int8
/// scales (one per 16 weights) and the F16 block scale.
const Q6_K_BYTES: usize = 210;

/// `Σ` of each 128-bit lane of each of four vectors: lane `4L + k` of the result is the
/// sum of the four 32-bit lanes of 128-bit lane `L` of `v[k]` (an exact integer sum).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn lane_sums(v: [__m512i; 4]) -> __m512i {
    let s01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[0], v[1]),
        _mm512_unpackhi_epi32(v[0], v[1]),
    );
    let s23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[2], v[3]),
        _mm512_unpackhi_epi32(v[2], v[3]),
    );
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(s01, s23),
        _mm512_unpackhi_epi64(s01, s23),
    )
}

/// The activations of one Q6_K block, ready for [`q6_k_groups`]: its 256 values as four
/// 64-byte vectors, and `32 · Σ x` of each 16-value scale group in [`lane_sums`]' order
/// (the codes' offset: a weight is `code − 32`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8k_block(x: *const i8) -> ([__m512i; 4], __m512i) {
    let c32 = _mm512_set1_epi8(32);
    let mut xv = [_mm512_setzero_si512(); 4];
    let mut off = [_mm512_setzero_si512(); 4];
    for k in 0..4 {
        xv[k] = _mm512_loadu_si512(x.add(64 * k).cast());
        off[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c32, xv[k]);
    }
    (xv, lane_sums(off))
}

/// The 16 scale groups of the Q6_K block at `p` against its activations: lane `4L + k`
/// holds `scale_g · Σ (code − 32) · x` of group `g = 4k + L`; the lanes add up to the
/// block's integer sum.
///
/// Chunk `k` (weights 64k..64k+63) is unpacked into bytes: its low nibbles (half `k / 2`,
/// low or high nibble by `k % 2`) and two high bits from the half's 32 `qh` bytes (bit
/// pair 0, 1 for the low nibbles of bytes 0..31, 32..63; 2, 3 for the high ones), shifted
/// into bits 4-5 per 256-bit half. `vpdpbusd` then adds four products a lane, so 128-bit
/// lane `L` of chunk `k` is group `4k + L`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q6_k_groups(p: *const u8, xv: &[__m512i; 4], off: __m512i) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // Low nibbles take bit pair 0 (bytes 0..31) or 1 (bytes 32..63): left by 4 or 2.
    let shift_lo = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
    // High nibbles take bit pair 2 (in place) or 3: right by 0 or 2.
    let shift_hi = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    // Scale g goes to lane 4 · (g % 4) + g / 4.
    let order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut dots = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let ql = _mm512_loadu_si512(p.add(64 * h).cast());
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h).cast()));
        let hi_lo = _mm512_and_si512(_mm512_sllv_epi64(qh, shift_lo), m30);
        let hi_hi = _mm512_and_si512(_mm512_srlv_epi64(qh, shift_hi), m30);
        // (a & 0x0F) | b
        let lo = _mm512_ternarylogic_epi32::<0xEA>(ql, m4, hi_lo);
        let hi = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(ql), m4, hi_hi);
        dots[2 * h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xv[2 * h]);
        dots[2 * h + 1] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xv[2 * h + 1]);
    }
    let scales = _mm_shuffle_epi8(_mm_loadu_si128(p.add(192).cast()), order);
    _mm512_mullo_epi32(
        _mm512_sub_epi32(lane_sums(dots), off),
        _mm512_cvtepi8_epi32(scales),
    )
}

/// The F16 block scale's bits of the Q6_K block at `p`.
#[inline]
unsafe fn q6_k_scale_bits(p: *const u8) -> i16 {
    p.add(208).cast::<i16>().read_unaligned()
}

/// The F16 block scale of the Q6_K block at `p`, as f32.
#[inline]
unsafe fn q6_k_scale(p: *const u8) -> f32 {
    half::f16::from_bits(q6_k_scale_bits(p) as u16).to_f32()
}

/// Q6_K row against Q8_K activations: per block, the scale groups of [`q6_k_groups`]
/// summed into the block's integer sum, then `sum += d_w · d_x · isum` block after block,
/// as the reference.
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
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let p = row.as_ptr().add(b * Q6_K_BYTES);
        prefetch_block(p, b, Q6_K_BYTES);
        let (xv, off) = q8k_block(q.as_ptr().add(256 * b));
        let isum = _mm512_reduce_add_epi32(q6_k_groups(p, &xv, off));
        sum += q6_k_scale(p) * da * isum as f32;
    }
    sum
}

/// [`q6_k_dot_q8k`] of the four rows of a quad ([`super::q6_k_interleave`]: block `b` of
/// row `r` at block index `4b + r`) against the same activations (an LM head's matvec):
/// the quad is read front to back, each activation block is loaded and its offsets
/// summed once for the four rows, and the four rows' integer sums come out of one
/// reduction, in the lanes of one vector whose float combination is the reference's
/// operations lane by lane (the four block scales converted by one F16C instruction).
/// Prefetches where [`head_prefetch`] says so.
///
/// # Panics
/// If `quad` does not hold `4 · d.len()` blocks or `q` `256 · d.len()` values.
///
/// # Safety
/// AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q6_k_dot4_q8k(quad: &[u8], q: &[i8], d: &[f32]) -> [f32; 4] {
    assert!(
        quad.len() == 4 * d.len() * Q6_K_BYTES && q.len() == d.len() * 256,
        "q6_k_dot4_q8k: lengths"
    );
    let mut sum = _mm_setzero_ps();
    let prefetch = head_prefetch();
    for (b, &da) in d.iter().enumerate() {
        let (xv, off) = q8k_block(q.as_ptr().add(256 * b));
        let p = quad.as_ptr().add(4 * b * Q6_K_BYTES);
        if prefetch {
            prefetch_block(p, b, 4 * Q6_K_BYTES);
        }
        let mut groups = [_mm512_setzero_si512(); 4];
        for (r, g) in groups.iter_mut().enumerate() {
            *g = q6_k_groups(p.add(r * Q6_K_BYTES), &xv, off);
        }
        // Lane 4L + r: row r's part of 128-bit lane L; then the four L added.
        let parts = lane_sums(groups);
        let half = _mm256_add_epi32(
            _mm512_castsi512_si256(parts),
            _mm512_extracti64x4_epi64::<1>(parts),
        );
        let isum = _mm_add_epi32(
            _mm256_castsi256_si128(half),
            _mm256_extracti128_si256::<1>(half),
        );
        let dw = _mm_cvtph_ps(_mm_setr_epi16(
            q6_k_scale_bits(p),
            q6_k_scale_bits(p.add(Q6_K_BYTES)),
            q6_k_scale_bits(p.add(2 * Q6_K_BYTES)),
            q6_k_scale_bits(p.add(3 * Q6_K_BYTES)),
            0,
            0,
            0,
            0,
        ));
        let scale = _mm_mul_ps(dw, _mm_set1_ps(da));
        sum = _mm_add_ps(sum, _mm_mul_ps(scale, _mm_cvtepi32_ps(isum)));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sum);
    out
}
