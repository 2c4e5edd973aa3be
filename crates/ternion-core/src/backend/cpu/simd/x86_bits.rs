//! AVX2 kernel of the 1-bit format Q1_0 (18-byte blocks: F16 scale, 16 bytes of codes, 128
//! elements) against Q8_0 activations, on the file's rows (Q2_0 is repacked for the tile
//! kernels of [`super::avx2_tile`]). Callers guarantee the features (see `Level::detect`).
//!
//! Every 32-element sub-block (one Q8_0 activation block) gives the exact integer
//! Σ (code − 1)·q as `maddubs(code, q)` summed, minus Σq; the float combination then runs
//! in the reference dot's order, so the results equal it bit for bit.

use std::arch::x86_64::*;

use super::vnni::Q80Rows;

/// Bytes per Q1_0 / Q2_0 block.
const BLOCK_BYTES: usize = 18;

/// The 32 codes (unsigned bytes) of sub-block `j` of a row, in element order: 2 for a set
/// bit, 0 otherwise.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes(row: *const u8, j: usize) -> __m256i {
    // Byte e of the result takes byte e / 8 of the four, then tests bit e % 8.
    let x = row.add(BLOCK_BYTES * (j / 4) + 2 + 4 * (j % 4));
    let v = _mm256_set1_epi32(x.cast::<i32>().read_unaligned());
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(2))
}

/// Σ code·q over 32 elements as eight i32 partial sums.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn products(codes: __m256i, q: *const i8) -> __m256i {
    let p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(q.cast()));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// The sums of the i32 lanes of each of four vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum4(p: &[__m256i; 4]) -> __m128i {
    let ab = _mm256_hadd_epi32(p[0], p[1]);
    let cd = _mm256_hadd_epi32(p[2], p[3]);
    let abcd = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(
        _mm256_castsi256_si128(abcd),
        _mm256_extracti128_si256::<1>(abcd),
    )
}

/// d_k · f32(sums_k − qsum_k) for the four sub-blocks at `qsum`, `d`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scaled(sums: __m128i, qsum: *const i32, d: *const f32) -> [f32; 4] {
    let (qs, dv) = (_mm_loadu_si128(qsum.cast()), _mm_loadu_ps(d));
    let v = _mm_mul_ps(dv, _mm_cvtepi32_ps(_mm_sub_epi32(sums, qs)));
    std::mem::transmute::<__m128, [f32; 4]>(v)
}

/// The F16 scale of block `b` of a row.
#[inline]
unsafe fn scale(row: *const u8, b: usize) -> f32 {
    let p = row.add(BLOCK_BYTES * b);
    half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32()
}

/// Q1_0 row against T token rows of Q8_0 activations: per 128-element block, s = Σ over
/// its four sub-blocks, in order, of d·(Σ code·q − Σq) as f32, then Σ over blocks of d_w·s
/// (`vec_dot_q1_0_q8_0`). A block's codes are unpacked once for all T tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q1_0_dots<const T: usize>(row: &[u8], x: [Q80Rows<'_>; T]) -> [f32; T] {
    let ns = row.len() / BLOCK_BYTES * 4;
    for xt in &x {
        assert!(
            row.len().is_multiple_of(BLOCK_BYTES)
                && xt.q.len() == 32 * ns
                && xt.d.len() == ns
                && xt.sum.len() == ns,
            "q1_0_dots: lengths"
        );
    }
    let w = row.as_ptr();
    let mut total = [0f32; T];
    for j0 in (0..ns).step_by(4) {
        let c: [__m256i; 4] = std::array::from_fn(|i| codes(w, j0 + i));
        for (xt, tot) in x.iter().zip(total.iter_mut()) {
            let q = xt.q.as_ptr().add(32 * j0);
            let p = std::array::from_fn(|i| products(c[i], q.add(32 * i)));
            let v = scaled(hsum4(&p), xt.sum.as_ptr().add(j0), xt.d.as_ptr().add(j0));
            let s = v.iter().fold(0f32, |s, &vi| s + vi);
            *tot += scale(w, j0 / 4) * s;
        }
    }
    total
}
