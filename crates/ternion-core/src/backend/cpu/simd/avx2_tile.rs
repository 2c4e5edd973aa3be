//! AVX2 kernels of 2-bit weights in the interleaved ternary layout of [`super::vnni`]
//! (16 rows a group), for CPUs without AVX-512: I2_S against per-token int8 activations,
//! TQ2_0 / TQ1_0 against Q8_K ones, Q2_0 against Q8_0 ones. Callers guarantee the features and the lengths (see
//! [`super::vnni::Tiles`]).
//!
//! A chunk (16 elements of each of 16 rows) is two 32-byte halves, rows 0..7 and 8..15.
//! Its four code planes (bits 2s..2s+1 of each byte: byte 4r + i of plane s is row r's code
//! at element 4s + i) are unpacked once for up to [`RUN_TOKENS`] tokens; `vpmaddubsw`
//! multiplies a plane by four activations of one token broadcast to every lane, giving
//! each row two 16-bit sums of two products (it saturates, but |2 · 3 · 128| cannot).
//! Those sums add up in 16 bits for [`RUN_CHUNKS`] chunks, then widen into one 32-bit lane
//! a row (`vpmaddwd` by ones). Where the CPU has AVX-VNNI ([`Dot`]), `vpdpbusd` on 256-bit
//! vectors does the same in one instruction, into 32-bit lanes. All sums are exact
//! integers, so every output equals the reference dot's.

use std::arch::x86_64::*;

use super::avx512::Dst;
use super::vnni::{Chunk, Dot};
use super::x86::prefetch_ahead;

/// Tokens whose accumulators one pass over a group keeps in registers (AVX2 has 16
/// vector registers: four tokens take eight 16-bit and eight 32-bit accumulators).
pub(super) const RUN_TOKENS: usize = 4;

/// Chunks whose products add up in 16 bits before they widen: a lane gains at most
/// 4 planes · 2 products · 3 · 128 = 3,072 a chunk (codes ≤ 3: I2_S reads code 3 as +2;
/// |q| ≤ 128), and 10 · 3,072 = 30,720 stays under 2^15.
const RUN_CHUNKS: usize = 10;

/// Four activations at `q`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn quad(q: *const i8) -> __m256i {
    _mm256_set1_epi32(q.cast::<i32>().read_unaligned())
}

/// Plane `S` of a chunk half: bits 2S..2S+1 of each byte.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn plane<const S: i32>(w: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srli_epi16::<S>(w), _mm256_set1_epi8(3))
}

/// The four code planes of the chunk at `p`, each as its halves (rows 0..7, 8..15).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn planes(p: *const Chunk) -> [(__m256i, __m256i); 4] {
    let p = p.cast::<__m256i>();
    let (lo, hi) = (_mm256_load_si256(p), _mm256_load_si256(p.add(1)));
    [
        (plane::<0>(lo), plane::<0>(hi)),
        (plane::<2>(lo), plane::<2>(hi)),
        (plane::<4>(lo), plane::<4>(hi)),
        (plane::<6>(lo), plane::<6>(hi)),
    ]
}

/// `acc[t][h] += plane_s(half h) · q_t[4s..4s+4]` over the four planes of the chunk at
/// `p`, token t's 16 activations of the chunk at `q + t·16`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn chunk_sums<const T: usize>(p: *const Chunk, q: *const i8, acc: &mut [[__m256i; 2]; T]) {
    for (s, (pl, ph)) in planes(p).into_iter().enumerate() {
        for (t, a) in acc.iter_mut().enumerate() {
            let x = quad(q.add(16 * t + 4 * s));
            a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(pl, x));
            a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(ph, x));
        }
    }
}

/// `Σ code·q` over chunks `run` of the 16 rows at `w` for T tokens, by `dot` (see
/// [`run_sums`]).
///
/// # Safety
/// AVX2, and the extension `dot` names; the pointers as [`run_sums`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sums<const T: usize>(
    dot: Dot,
    w: *const Chunk,
    q: *const i8,
    tn: usize,
    run: std::ops::Range<usize>,
) -> [[__m256i; 2]; T] {
    match dot {
        Dot::Maddubs => run_sums(w, q, tn, run),
        Dot::AvxVnni => vex_sums(w, q, tn, run),
        Dot::Evex => evex_sums(w, q, tn, run),
    }
}

/// Defines a `vpdpbusd` variant of [`run_sums`]: per token and half, 4 / T accumulators
/// taking the planes in turn (one token: four independent chains per half, which hide the
/// instruction's latency, as the AVX-512 one-token kernel does), added up at the end.
macro_rules! dpbusd_sums {
    ($name:ident, $features:literal, $dpbusd:ident) => {
        /// [`run_sums`] with `vpdpbusd` (exact 32-bit sums, nothing to widen).
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: usize>(
            w: *const Chunk,
            q: *const i8,
            tn: usize,
            run: std::ops::Range<usize>,
        ) -> [[__m256i; 2]; T] {
            let chains = 4 / T.clamp(1, 4);
            let mut acc = [[[_mm256_setzero_si256(); 4]; 2]; T];
            for c in run {
                if T == 1 {
                    prefetch_ahead(w.add(c).cast());
                }
                let qc = q.add(16 * tn * c);
                for (s, (pl, ph)) in planes(w.add(c)).into_iter().enumerate() {
                    for (t, a) in acc.iter_mut().enumerate() {
                        let x = quad(qc.add(16 * t + 4 * s));
                        let k = s % chains;
                        a[0][k] = $dpbusd(a[0][k], pl, x);
                        a[1][k] = $dpbusd(a[1][k], ph, x);
                    }
                }
            }
            acc.map(|halves| {
                halves.map(|[a, b, c, d]| {
                    _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d))
                })
            })
        }
    };
}

dpbusd_sums!(vex_sums, "avx2,avxvnni", _mm256_dpbusd_avx_epi32);
dpbusd_sums!(evex_sums, "avx2,avx512vl,avx512vnni", _mm256_dpbusd_epi32);

/// `Σ code·q` over chunks `run` of the 16 rows at `w` for T tokens of a token tile of `tn`
/// laid out by [`super::vnni::interleave_tokens`] (token t's 16 activations of chunk c at
/// `q + c·16·tn + t·16`; `q` points at the first of the T): per token, rows 0..7 and
/// 8..15, one 32-bit lane a row, exact. With one token (decode) each chunk's line 4 KiB
/// ahead is asked for.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn run_sums<const T: usize>(
    w: *const Chunk,
    q: *const i8,
    tn: usize,
    run: std::ops::Range<usize>,
) -> [[__m256i; 2]; T] {
    let ones = _mm256_set1_epi16(1);
    let mut wide = [[_mm256_setzero_si256(); 2]; T];
    let mut c = run.start;
    while c < run.end {
        let end = (c + RUN_CHUNKS).min(run.end);
        let mut narrow = [[_mm256_setzero_si256(); 2]; T];
        for c in c..end {
            if T == 1 {
                prefetch_ahead(w.add(c).cast());
            }
            chunk_sums(w.add(c), q.add(16 * tn * c), &mut narrow);
        }
        for (wt, nt) in wide.iter_mut().zip(&narrow) {
            for (a, n) in wt.iter_mut().zip(nt) {
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(*n, ones));
            }
        }
        c = end;
    }
    wide
}

/// I2_S products of the 16 rows of `n_chunks` chunks at `w` with T tokens (laid out as
/// [`run_sums`] reads them), token t's Σq at `sum[t]` and scale at `scale[t]`:
/// `out[t][r] = ((Σ_e (code(r, e) − 1)·q_t[e]) as f32 / scale[t]) · post`, the AVX-512
/// kernel's operations.
///
/// # Safety
/// AVX2 and the extension `dot` names; `w` points at `n_chunks` chunks, `q` at the tile's
/// activations, `sum` and `scale` at T values, `out` T token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn per_token_dots<const T: usize>(
    dot: Dot,
    w: *const Chunk,
    n_chunks: usize,
    q: *const i8,
    tn: usize,
    sum: *const i32,
    scale: *const f32,
    post: f32,
    out: &Dst,
) {
    let wide = sums::<T>(dot, w, q, tn, 0..n_chunks);
    for (t, halves) in wide.iter().enumerate() {
        let (s, d) = (
            _mm256_set1_epi32(*sum.add(t)),
            _mm256_set1_ps(*scale.add(t)),
        );
        let v = halves.map(|h| {
            let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(h, s));
            _mm256_mul_ps(_mm256_div_ps(v, d), _mm256_set1_ps(post))
        });
        store(out, t, v);
    }
}

/// Per-block scaled dots against Q8_K activations (TQ2_0, TQ1_0): for every 256-element
/// block b, `sum_t += ((Σ code·q − bsum[t][b]) as f32) · (d[t][b] · scale[b][r])`, block
/// after block (a product, then a sum: the reference dots' roundings); `out[t] = sum_t ·
/// post`. Token t's block values sit at `d + b·tn + t` and `bsum + b·tn + t` (laid out
/// by [`super::vnni::interleave_blocks`]; the pointers at the first of the T).
///
/// # Safety
/// AVX2, F16C and the extension `dot` names; `w` points at `16 · n_blocks` chunks,
/// `scales` at `16 · n_blocks` F16 values, `q`, `d` and `bsum` at the tile's values, `out`
/// T token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn block_dots<const T: usize>(
    dot: Dot,
    w: *const Chunk,
    scales: *const half::f16,
    n_blocks: usize,
    q: *const i8,
    tn: usize,
    (d, bsum): (*const f32, *const i32),
    post: f32,
    out: &Dst,
) {
    let mut sum = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..n_blocks {
        let wide = sums::<T>(dot, w, q, tn, 16 * b..16 * (b + 1));
        let dw = scales16(scales.add(16 * b));
        for (t, (st, wt)) in sum.iter_mut().zip(&wide).enumerate() {
            let (db, bb) = (*d.add(b * tn + t), _mm256_set1_epi32(*bsum.add(b * tn + t)));
            for ((s, h), dw) in st.iter_mut().zip(wt).zip(dw) {
                let scale = _mm256_mul_ps(_mm256_set1_ps(db), dw);
                let sumi = _mm256_cvtepi32_ps(_mm256_sub_epi32(*h, bb));
                *s = _mm256_add_ps(*s, _mm256_mul_ps(sumi, scale));
            }
        }
    }
    for (t, st) in sum.iter().enumerate() {
        store(out, t, st.map(|s| _mm256_mul_ps(s, _mm256_set1_ps(post))));
    }
}

/// Q2_0 products against Q8_0 activations: per weight block b (`subs` 32-element
/// sub-blocks of two chunks), `s_t = Σ_k d[t][k] · f32(Σ_{e∈k} code·q − sum[t][k])` from 0
/// over its sub-blocks in order, then `total_t += scale[b][r] · s_t`; `out[t] = total_t ·
/// post`: the reference dot's operations, lane by lane. Token t's sub-block values sit at
/// `d + k·tn + t` and `sum + k·tn + t` (laid out by [`super::vnni::interleave_blocks`];
/// the pointers at the first of the T). Always `vpmaddubsw`: a sub-block is two chunks,
/// too short a run for a call into the `vpdpbusd` kernels, which cannot be inlined here
/// (other target features; such calls read 36 against 92 tok/s in a Q2_0 prompt).
///
/// # Safety
/// AVX2 and F16C; `w` points at `2 · subs · n_blocks` chunks, `scales` at `16 · n_blocks`
/// F16 values, `q`, `d` and `sum` at the tile's values, `out` T token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn sub_block_dots<const T: usize>(
    w: *const Chunk,
    scales: *const half::f16,
    (n_blocks, subs): (usize, usize),
    q: *const i8,
    tn: usize,
    (d, sum): (*const f32, *const i32),
    post: f32,
    out: &Dst,
) {
    let mut total = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..n_blocks {
        let mut s = [[_mm256_setzero_ps(); 2]; T];
        for k in b * subs..(b + 1) * subs {
            let wide = run_sums::<T>(w, q, tn, 2 * k..2 * k + 2);
            for (t, (st, wt)) in s.iter_mut().zip(&wide).enumerate() {
                let (dk, sk) = (_mm256_set1_ps(*d.add(k * tn + t)), *sum.add(k * tn + t));
                for (sh, h) in st.iter_mut().zip(wt) {
                    let sumi = _mm256_cvtepi32_ps(_mm256_sub_epi32(*h, _mm256_set1_epi32(sk)));
                    *sh = _mm256_add_ps(*sh, _mm256_mul_ps(dk, sumi));
                }
            }
        }
        let dw = scales16(scales.add(16 * b));
        for (tt, st) in total.iter_mut().zip(&s) {
            for ((th, sh), dw) in tt.iter_mut().zip(st).zip(dw) {
                *th = _mm256_add_ps(*th, _mm256_mul_ps(dw, *sh));
            }
        }
    }
    for (t, tt) in total.iter().enumerate() {
        store(out, t, tt.map(|v| _mm256_mul_ps(v, _mm256_set1_ps(post))));
    }
}

/// The 16 F16 scales at `p` as f32, rows 0..7 and 8..15 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scales16(p: *const half::f16) -> [__m256; 2] {
    let p = p.cast::<__m128i>();
    [
        _mm256_cvtph_ps(_mm_loadu_si128(p)),
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(1))),
    ]
}

/// Stores token t's 16 lanes (two halves of 8) into the masked columns of `out`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store(out: &Dst, t: usize, v: [__m256; 2]) {
    let dst = out.ptr.add(t * out.stride);
    if out.mask == u16::MAX {
        _mm256_storeu_ps(dst, v[0]);
        _mm256_storeu_ps(dst.add(8), v[1]);
        return;
    }
    let mut all = [0f32; 16];
    _mm256_storeu_ps(all.as_mut_ptr(), v[0]);
    _mm256_storeu_ps(all.as_mut_ptr().add(8), v[1]);
    let cols = out.mask.trailing_ones() as usize;
    std::ptr::copy_nonoverlapping(all.as_ptr(), dst, cols);
}
