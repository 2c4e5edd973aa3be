//! AVX-512 (F, BW, VNNI) kernels over the interleaved ternary layout of [`super::vnni`].
//! Callers guarantee the features and the lengths (see [`super::vnni::Vnni`]).
//!
//! Each 32-bit lane of an accumulator is one weight row; `vpdpbusd` multiplies four codes
//! of that row (unsigned bytes 0..=3) by four activations of one token (signed bytes,
//! broadcast to every lane) and adds the four products into the lane, exactly.

use std::arch::x86_64::*;

use half::f16;

use super::vnni::Chunk;
use super::x86::prefetch_ahead;

/// Where a kernel stores token t's 16 lanes: the masked lanes of the 16 floats at
/// `ptr + t·stride` ([`super::vnni::OutCols`]).
pub(super) struct Dst {
    pub ptr: *mut f32,
    pub stride: usize,
    pub mask: u16,
}

impl Dst {
    /// Stores token t's lanes.
    ///
    /// # Safety
    /// AVX-512 F; token t's masked floats are valid for writes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn store(&self, t: usize, v: __m512) {
        _mm512_mask_storeu_ps(self.ptr.add(t * self.stride), self.mask, v);
    }
}

/// The four code planes of one chunk: byte 4r + i of plane s is the code of row r at
/// element 4s + i of the chunk.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn planes(p: *const Chunk) -> [__m512i; 4] {
    let w = _mm512_load_si512(p.cast());
    let m = _mm512_set1_epi8(3);
    [
        _mm512_and_si512(w, m),
        _mm512_and_si512(_mm512_srli_epi16::<2>(w), m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(w), m),
        _mm512_and_si512(_mm512_srli_epi16::<6>(w), m),
    ]
}

/// The four code planes of one chunk left in place: plane s is `w & (3 << 2s)`, byte
/// 4r + i holding 4^s · code (at most 192, still an unsigned byte) of row r at element
/// 4s + i. One mask each, no shifts: for one-token kernels, whose four `vpdpbusd` per
/// chunk the plane extraction would otherwise outweigh. Accumulators of plane s then hold
/// 4^s times the plane's sum, exactly (|4^s · Σ code·q| ≤ 64 · 2 · 128 · K/4 < 2^31 for
/// K < 2^19); [`unscale4`] adds them back.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn masked_planes(p: *const Chunk) -> [__m512i; 4] {
    let w = _mm512_load_si512(p.cast());
    [
        _mm512_and_si512(w, _mm512_set1_epi8(0x03)),
        _mm512_and_si512(w, _mm512_set1_epi8(0x0c)),
        _mm512_and_si512(w, _mm512_set1_epi8(0x30)),
        _mm512_and_si512(w, _mm512_set1_epi8(0xc0_u8 as i8)),
    ]
}

/// The lane-wise sum of per-plane accumulators of [`masked_planes`]: plane s's divided by
/// 4^s first (an exact arithmetic shift: it is a multiple of 4^s).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn unscale4(acc: &[__m512i; 4]) -> __m512i {
    _mm512_add_epi32(
        _mm512_add_epi32(acc[0], _mm512_srai_epi32::<2>(acc[1])),
        _mm512_add_epi32(
            _mm512_srai_epi32::<4>(acc[2]),
            _mm512_srai_epi32::<6>(acc[3]),
        ),
    )
}

/// Four activations at `q`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn quad(q: *const i8) -> __m512i {
    _mm512_set1_epi32(q.cast::<i32>().read_unaligned())
}

/// `acc[t] += Σ_s planes[s] · q_t[4s..4s+4]` for the T tokens at `q + t·stride`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn chunk_dots<const T: usize>(
    u: &[__m512i; 4],
    q: *const i8,
    stride: usize,
    acc: &mut [__m512i; T],
) {
    for (t, a) in acc.iter_mut().enumerate() {
        let qt = q.add(t * stride);
        for (s, us) in u.iter().enumerate() {
            *a = _mm512_dpbusd_epi32(*a, *us, quad(qt.add(4 * s)));
        }
    }
}

/// The I2_S epilogue of a token: `((acc − sum) as f32 / scale) · post` per lane (the
/// scalar path's operations, so the same roundings).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn per_token(acc: __m512i, sum: i32, scale: f32, post: f32) -> __m512 {
    let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(sum)));
    _mm512_mul_ps(
        _mm512_div_ps(v, _mm512_set1_ps(scale)),
        _mm512_set1_ps(post),
    )
}

/// `acc[t] += Σ_s planes[s] · q_t[4s..4s+4]` for chunk `c` of a tile of T tokens laid out
/// by [`super::vnni::interleave_tokens`] at `q` (token t's 16 activations of the chunk at
/// `q + (c·T + t)·16`): every broadcast a fixed offset from one pointer, so each
/// `vpdpbusd` keeps its load fused (an indexed address costs a second micro-op).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_dots<const T: usize>(
    u: &[__m512i; 4],
    q: *const i8,
    c: usize,
    acc: &mut [__m512i; T],
) {
    let mut addr = q.add(16 * T * c).addr();
    // An empty asm hides where the address came from, so that the compiler addresses the
    // broadcasts from it directly instead of from `q` plus its loop counter.
    std::arch::asm!(
        "/* {a} */",
        a = inout(reg) addr,
        options(pure, nomem, nostack, preserves_flags)
    );
    chunk_dots(u, q.with_addr(addr), 16, acc);
}

/// I2_S products of the 16 rows of `n_chunks` chunks at `w` with a tile of T tokens (their
/// activations laid out by [`super::vnni::interleave_tokens`] at `q`, token t's Σq at
/// `sum[t]`, its scale at `scale[t]`):
/// `out[t][r] = ((Σ_e (code(r, e) − 1)·q_t[e]) as f32 / scale[t]) · post`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `w` points at `n_chunks` chunks, `q` at `16 · T · n_chunks`
/// readable bytes, `sum` and `scale` at T values, `out` T token rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn per_token_dots<const T: usize>(
    w: *const Chunk,
    n_chunks: usize,
    q: *const i8,
    sum: *const i32,
    scale: *const f32,
    post: f32,
    out: Dst,
) {
    let mut acc = [_mm512_setzero_si512(); T];
    for c in 0..n_chunks {
        tile_dots(&planes(w.add(c)), q, c, &mut acc);
    }
    for (t, a) in acc.iter().enumerate() {
        out.store(t, per_token(*a, *sum.add(t), *scale.add(t), post));
    }
}

/// [`per_token_dots`] for one token, with accumulators per plane over [`masked_planes`]
/// ([`masked_run`]: eight independent `vpdpbusd` chains instead of one).
///
/// # Safety
/// As [`per_token_dots`] with T = 1.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn per_token_dot1(
    w: *const Chunk,
    n_chunks: usize,
    q: *const i8,
    sum: i32,
    scale: f32,
    post: f32,
    out: Dst,
) {
    let acc = masked_run(w, q, 0..n_chunks);
    out.store(0, per_token(unscale4(&acc), sum, scale, post));
}

/// Σ over chunks `run` of one token's masked-plane products ([`masked_planes`]), one
/// accumulator per plane: chunks taken in pairs into two sets of accumulators added at the
/// end (exact integers), so eight `vpdpbusd` chains hide the instruction's latency, where
/// four kept a core waiting on them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn masked_run(w: *const Chunk, q: *const i8, run: std::ops::Range<usize>) -> [__m512i; 4] {
    let mut even = [_mm512_setzero_si512(); 4];
    let mut odd = [_mm512_setzero_si512(); 4];
    let mut c = run.start;
    while c + 1 < run.end {
        prefetch_ahead(w.add(c).cast());
        prefetch_ahead(w.add(c + 1).cast());
        plane_dots(&masked_planes(w.add(c)), q.add(16 * c), &mut even);
        plane_dots(&masked_planes(w.add(c + 1)), q.add(16 * (c + 1)), &mut odd);
        c += 2;
    }
    if c < run.end {
        prefetch_ahead(w.add(c).cast());
        plane_dots(&masked_planes(w.add(c)), q.add(16 * c), &mut even);
    }
    std::array::from_fn(|s| _mm512_add_epi32(even[s], odd[s]))
}

/// `acc[s] += planes[s] · q[4s..4s+4]`: one token, one accumulator per plane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn plane_dots(u: &[__m512i; 4], q: *const i8, acc: &mut [__m512i; 4]) {
    for (s, a) in acc.iter_mut().enumerate() {
        *a = _mm512_dpbusd_epi32(*a, u[s], quad(q.add(4 * s)));
    }
}

/// The lane-wise sum of four accumulators.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum4(acc: &[__m512i; 4]) -> __m512i {
    _mm512_add_epi32(
        _mm512_add_epi32(acc[0], acc[1]),
        _mm512_add_epi32(acc[2], acc[3]),
    )
}

/// Per-block scaled dots against Q8_K activations: for every 256-element block b,
/// `sum_t += ((Σ code·q − bsum[t][b]) as f32) · (d[t][b] · scale[b][r])`, block after
/// block, the float order of the TQ2_0 / TQ1_0 reference dots; `out[t] = sum_t · post`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `w` points at `16 · n_blocks` chunks, `scales` at `16 · n_blocks`
/// floats, `q` at the tile's `256 · T · n_blocks` bytes (laid out by
/// [`super::vnni::interleave_tokens`]), `d` / `bsum` at the tile's `T · n_blocks` values
/// (laid out by [`super::vnni::interleave_blocks`]: token t's of block b at `b·T + t`),
/// `out` T token rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block_dots<const T: usize>(
    w: *const Chunk,
    scales: *const f16,
    n_blocks: usize,
    q: *const i8,
    d: *const f32,
    bsum: *const i32,
    post: f32,
    out: Dst,
) {
    let mut sum = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        // Each sum starts at −Σq: the block's exact Σ (code − 1)·q without a subtraction.
        // The tile's values of block b, token after token: a fixed offset from one
        // pointer each (an indexed address would split the broadcast's multiply in two).
        let (db, bb) = (d.add(b * T), bsum.add(b * T));
        let mut acc: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(-*bb.add(t)));
        for c in 16 * b..16 * (b + 1) {
            tile_dots(&planes(w.add(c)), q, c, &mut acc);
        }
        let dw = scales16(scales.add(16 * b));
        for (t, (s, a)) in sum.iter_mut().zip(&acc).enumerate() {
            *s = scaled(*s, *a, *db.add(t), dw);
        }
    }
    for (t, s) in sum.iter().enumerate() {
        out.store(t, _mm512_mul_ps(*s, _mm512_set1_ps(post)));
    }
}

/// [`block_dots`] for one token, with accumulators per plane over [`masked_planes`]
/// ([`masked_run`]).
///
/// # Safety
/// As [`block_dots`] with T = 1.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block_dot1(
    w: *const Chunk,
    scales: *const f16,
    n_blocks: usize,
    q: *const i8,
    d: *const f32,
    bsum: *const i32,
    post: f32,
    out: Dst,
) {
    let mut sum = _mm512_setzero_ps();
    for b in 0..n_blocks {
        let acc = masked_run(w, q, 16 * b..16 * (b + 1));
        let dw = scales16(scales.add(16 * b));
        let sumi = _mm512_sub_epi32(unscale4(&acc), _mm512_set1_epi32(*bsum.add(b)));
        sum = scaled(sum, sumi, *d.add(b), dw);
    }
    out.store(0, _mm512_mul_ps(sum, _mm512_set1_ps(post)));
}

/// The 16 F16 scales at `p` as f32 (exact).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scales16(p: *const f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// `sum + (sumi as f32) · (d · dw)`, lane by lane, rounding as the scalar code.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scaled(sum: __m512, sumi: __m512i, d: f32, dw: __m512) -> __m512 {
    let scale = _mm512_mul_ps(_mm512_set1_ps(d), dw);
    _mm512_add_ps(sum, _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), scale))
}
