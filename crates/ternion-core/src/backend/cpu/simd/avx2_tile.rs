//! AVX2 kernels of 2-bit weights in the interleaved ternary layout of [`super::vnni`]
//! (16 rows a group), for CPUs without AVX-512: I2_S against per-token int8 activations,
//! TQ2_0 / TQ1_0 against Q8_K ones, Q2_0 against Q8_0 ones. Callers guarantee the
//! features and the lengths (see [`super::vnni::Tiles`]).
//!
//! A chunk (16 elements of each of 16 rows) is two 32-byte halves, rows 0..7 and 8..15.
//! Its four code planes (bits 2s..2s+1 of each byte: byte 4r + i of plane s is row r's code
//! at element 4s + i) are unpacked to one byte a code; `vpmaddubsw` multiplies a plane by
//! four activations of one token broadcast to every lane, giving each row two 16-bit sums
//! of two products (it saturates, but |2 · 3 · 128| cannot). Those sums add up in 16 bits
//! for [`RUN_CHUNKS`] chunks, then widen into one 32-bit lane a row (`vpmaddwd` by ones).
//! A pass over the group takes T ≤ 4 tokens (four tokens' accumulators fill AVX2's 16
//! registers); a tile of more tokens takes several passes, so each run of
//! [`BUF_CHUNKS`] chunks is unpacked once into a buffer in L1 and read by all of them
//! (16-token tiles: 1.15–1.2× the kernel's rate when each pass unpacked its own planes).
//! Where the CPU has AVX-VNNI ([`Dot`]), `vpdpbusd` on 256-bit vectors replaces the
//! multiply, add and widening with one instruction into 32-bit lanes, and each pass
//! unpacks in registers (on ports the dot leaves free). All sums are exact integers, so
//! every output equals the reference dot's.

use std::arch::x86_64::*;

use super::avx512::Dst;
use super::vnni::{Chunk, Dot};
use super::x86::prefetch_ahead;

/// Chunks whose products add up in 16 bits before they widen: a lane gains at most
/// 4 planes · 2 products · 3 · 128 = 3,072 a chunk (codes ≤ 3: I2_S reads code 3 as +2;
/// |q| ≤ 128), and 10 · 3,072 = 30,720 stays under 2^15.
const RUN_CHUNKS: usize = 10;

/// Chunks the tile kernels unpack at a time (one TQ2_0 block; 4 KiB, held in L1).
const BUF_CHUNKS: usize = 16;

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

/// A chunk's four code planes unpacked, one byte a code (plane s's halves at 2s and
/// 2s + 1), so that a group read for several runs of tokens is unpacked once.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Unpacked([[u8; 32]; 8]);

/// Room for [`BUF_CHUNKS`] unpacked chunks, written by [`unpack`] before they are read
/// (left uninitialized: zeroing 4 KiB a group cost a decode kernel 16 %).
type Buf = [std::mem::MaybeUninit<Unpacked>; BUF_CHUNKS];

/// Where a run of sums reads its planes from: the packed chunks, or chunks unpacked once.
/// Its methods need AVX2 and a chunk `c` that the source holds.
trait PlaneSrc: Copy {
    /// The planes of chunk `c`.
    unsafe fn planes(self, c: usize) -> [(__m256i, __m256i); 4];
    /// Asks for what chunk `c` reads a little ahead (decode streams packed weights).
    unsafe fn prefetch(self, _c: usize) {}
}

impl PlaneSrc for *const Chunk {
    #[inline(always)]
    unsafe fn planes(self, c: usize) -> [(__m256i, __m256i); 4] {
        planes(self.add(c))
    }
    #[inline(always)]
    unsafe fn prefetch(self, c: usize) {
        prefetch_ahead(self.add(c).cast());
    }
}

/// Chunks `first..` unpacked at `p`.
#[derive(Clone, Copy)]
struct UnpackedRun {
    p: *const Unpacked,
    first: usize,
}

impl PlaneSrc for UnpackedRun {
    #[inline(always)]
    unsafe fn planes(self, c: usize) -> [(__m256i, __m256i); 4] {
        let p = self.p.add(c - self.first).cast::<__m256i>();
        [
            (_mm256_load_si256(p), _mm256_load_si256(p.add(1))),
            (_mm256_load_si256(p.add(2)), _mm256_load_si256(p.add(3))),
            (_mm256_load_si256(p.add(4)), _mm256_load_si256(p.add(5))),
            (_mm256_load_si256(p.add(6)), _mm256_load_si256(p.add(7))),
        ]
    }
}

/// Unpacks chunks `run` (at most [`BUF_CHUNKS`]) of the group at `w` into `buf`.
///
/// # Safety
/// AVX2; `w` points at the group's chunks, `run` among them.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack(w: *const Chunk, run: std::ops::Range<usize>, buf: &mut Buf) -> UnpackedRun {
    debug_assert!(
        run.len() <= BUF_CHUNKS,
        "unpack: a run longer than the buffer"
    );
    for (c, o) in run.clone().zip(buf.iter_mut()) {
        let o = o.as_mut_ptr().cast::<__m256i>();
        for (s, (l, h)) in planes(w.add(c)).into_iter().enumerate() {
            _mm256_store_si256(o.add(2 * s), l);
            _mm256_store_si256(o.add(2 * s + 1), h);
        }
    }
    UnpackedRun {
        p: buf.as_ptr().cast(),
        first: run.start,
    }
}

/// `acc[t][h] += plane_s(half h) · q_t[4s..4s+4]` over the four planes of a chunk,
/// token t's 16 activations of the chunk at `q + t·16`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn chunk_sums<const T: usize>(
    planes: [(__m256i, __m256i); 4],
    q: *const i8,
    acc: &mut [[__m256i; 2]; T],
) {
    for (s, (pl, ph)) in planes.into_iter().enumerate() {
        for (t, a) in acc.iter_mut().enumerate() {
            let x = quad(q.add(16 * t + 4 * s));
            a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(pl, x));
            a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(ph, x));
        }
    }
}

/// Where a tile's sums go: token t's two halves at `p + t`, written, or added to the
/// sums there when `add` (which the first write of every token must precede).
#[derive(Clone, Copy)]
struct Out {
    p: *mut [__m256i; 2],
    add: bool,
}

impl Out {
    /// Token t's sums `s`.
    ///
    /// # Safety
    /// AVX2; token t's place is valid (and written, when adding).
    #[inline(always)]
    unsafe fn put(self, t: usize, s: [__m256i; 2]) {
        let o = self.p.add(t);
        if self.add {
            let old = o.read();
            o.write([
                _mm256_add_epi32(old[0], s[0]),
                _mm256_add_epi32(old[1], s[1]),
            ]);
        } else {
            o.write(s);
        }
    }
}

/// Token t's `Σ code·q_t` over chunks `run` of the 16 rows at `w`, put into `out` for the
/// TN tokens of a tile (a multiple of T), T at a time, by `dot` (see [`run_sums`]).
///
/// # Safety
/// AVX2, and the extension `dot` names; the pointers as [`run_sums`], `out` as
/// [`Out::put`] for the TN tokens.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sums<const T: usize, const TN: usize, W: PlaneSrc>(
    dot: Dot,
    w: W,
    q: *const i8,
    run: std::ops::Range<usize>,
    out: Out,
) {
    match dot {
        Dot::Maddubs => {
            for t0 in (0..TN).step_by(T) {
                let s = run_sums::<T, W>(w, q.add(16 * t0), TN, run.clone());
                for (t, s) in s.into_iter().enumerate() {
                    out.put(t0 + t, s);
                }
            }
        }
        Dot::AvxVnni => vex_sums::<T, TN, W>(w, q, run, out),
        Dot::Evex => evex_sums::<T, TN, W>(w, q, run, out),
    }
}

/// Defines a `vpdpbusd` variant of [`sums`] (exact 32-bit sums, nothing to widen), all
/// the tile's passes in one call (a call cannot be inlined across target features): per
/// token and half, 4 / T accumulators taking the planes in turn (one token: four
/// independent chains per half, which hide the instruction's latency, as the AVX-512
/// one-token kernel does), added up at the end.
macro_rules! dpbusd_sums {
    ($name:ident, $features:literal, $dpbusd:ident) => {
        /// [`sums`] with `vpdpbusd`.
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: usize, const TN: usize, W: PlaneSrc>(
            w: W,
            q: *const i8,
            run: std::ops::Range<usize>,
            out: Out,
        ) {
            let chains = 4 / T.clamp(1, 4);
            for t0 in (0..TN).step_by(T) {
                let mut acc = [[[_mm256_setzero_si256(); 4]; 2]; T];
                for c in run.clone() {
                    if T == 1 {
                        w.prefetch(c);
                    }
                    let qc = q.add(16 * (TN * c + t0));
                    for (s, (pl, ph)) in w.planes(c).into_iter().enumerate() {
                        for (t, a) in acc.iter_mut().enumerate() {
                            let x = quad(qc.add(16 * t + 4 * s));
                            let k = s % chains;
                            a[0][k] = $dpbusd(a[0][k], pl, x);
                            a[1][k] = $dpbusd(a[1][k], ph, x);
                        }
                    }
                }
                // Loops, not `array::map`, whose closures were not inlined here (a call each).
                for (t, halves) in acc.iter().enumerate() {
                    let mut s = [_mm256_setzero_si256(); 2];
                    for (s, [a, b, c, d]) in s.iter_mut().zip(halves) {
                        *s = _mm256_add_epi32(_mm256_add_epi32(*a, *b), _mm256_add_epi32(*c, *d));
                    }
                    out.put(t0 + t, s);
                }
            }
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
unsafe fn run_sums<const T: usize, W: PlaneSrc>(
    w: W,
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
                w.prefetch(c);
            }
            chunk_sums(w.planes(c), q.add(16 * tn * c), &mut narrow);
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

/// Sums of a tile of TN tokens: rows 0..7 and 8..15 of each (filled in place, without
/// zeroing first: a 1 KiB `memset` a group and tile read 1.7 % of a prompt).
type TileSums<const TN: usize> = std::mem::MaybeUninit<[[__m256i; 2]; TN]>;

/// Whether a tile of TN tokens taken T at a time unpacks each run once for all its
/// passes: with `vpmaddubsw` (where unpacking is a fifth of the work a token) and more
/// than one pass. `vpdpbusd` leaves the unpacking to other ports and reads the chunks.
fn unpacks<const T: usize, const TN: usize>(dot: Dot) -> bool {
    dot == Dot::Maddubs && TN > T
}

/// Token t's `Σ code·q_t` over chunks `run` of the group at `w`, put into `out` for the
/// tile's TN tokens (a multiple of T), T at a time: from `buf`, unpacked once, where
/// [`unpacks`] says so.
///
/// # Safety
/// AVX2 and the extension `dot` names; `w` points at the group's chunks, `run` among
/// them (at most [`BUF_CHUNKS`] when unpacking), `q` at the tile's activations.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tile_sums<const T: usize, const TN: usize>(
    dot: Dot,
    w: *const Chunk,
    run: std::ops::Range<usize>,
    q: *const i8,
    buf: &mut Buf,
    out: Out,
) {
    if unpacks::<T, TN>(dot) {
        let u = unpack(w, run.clone(), buf);
        sums::<T, TN, _>(Dot::Maddubs, u, q, run, out);
    } else {
        sums::<T, TN, _>(dot, w, q, run, out);
    }
}

/// I2_S products of the 16 rows of `n_chunks` chunks at `w` with the TN tokens of a tile
/// (a multiple of T; laid out as [`run_sums`] reads them), token t's Σq at `sum[t]` and
/// scale at `scale[t]`: `out[t][r] = ((Σ_e (code(r, e) − 1)·q_t[e]) as f32 / scale[t]) ·
/// post`, the AVX-512 kernel's operations. Unpacking, in runs of [`BUF_CHUNKS`] chunks;
/// else in one run.
///
/// # Safety
/// AVX2 and the extension `dot` names; `w` points at `n_chunks` chunks, `q` at the tile's
/// activations, `sum` and `scale` at TN values, `out` TN token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn per_token_dots<const T: usize, const TN: usize>(
    dot: Dot,
    w: *const Chunk,
    n_chunks: usize,
    q: *const i8,
    sum: *const i32,
    scale: *const f32,
    post: f32,
    out: &Dst,
) {
    let step = if unpacks::<T, TN>(dot) {
        BUF_CHUNKS
    } else {
        n_chunks.max(1)
    };
    let mut wide = TileSums::<TN>::uninit();
    let mut buf: Buf = [const { std::mem::MaybeUninit::uninit() }; BUF_CHUNKS];
    for first in (0..n_chunks.max(1)).step_by(step) {
        let run = first..(first + step).min(n_chunks);
        let out = Out {
            p: wide.as_mut_ptr().cast(),
            add: first > 0,
        };
        tile_sums::<T, TN>(dot, w, run, q, &mut buf, out);
    }
    // Every token's sums were written by the first run (an empty one for no chunks).
    let wide = wide.assume_init_ref();
    let (p, mut v) = (_mm256_set1_ps(post), [_mm256_setzero_ps(); 2]);
    for (t, h) in wide.iter().enumerate() {
        let (s, d) = (
            _mm256_set1_epi32(*sum.add(t)),
            _mm256_set1_ps(*scale.add(t)),
        );
        for (v, h) in v.iter_mut().zip(h) {
            *v = _mm256_mul_ps(
                _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(*h, s)), d),
                p,
            );
        }
        store(out, t, v);
    }
}

/// Per-block scaled dots against Q8_K activations (TQ2_0, TQ1_0) for the TN tokens of a
/// tile (a multiple of T): for every 256-element block b, `sum_t += ((Σ code·q −
/// bsum[t][b]) as f32) · (d[t][b] · scale[b][r])`, block after block (a product, then a
/// sum: the reference dots' roundings); `out[t] = sum_t · post`. Token t's block values
/// sit at `d + b·TN + t` and `bsum + b·TN + t` (laid out by
/// [`super::vnni::interleave_blocks`]).
///
/// # Safety
/// AVX2, F16C and the extension `dot` names; `w` points at `16 · n_blocks` chunks,
/// `scales` at `16 · n_blocks` F16 values, `q`, `d` and `bsum` at the tile's values, `out`
/// TN token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn block_dots<const T: usize, const TN: usize>(
    dot: Dot,
    w: *const Chunk,
    scales: *const half::f16,
    n_blocks: usize,
    q: *const i8,
    (d, bsum): (*const f32, *const i32),
    post: f32,
    out: &Dst,
) {
    let mut sum = [[_mm256_setzero_ps(); 2]; TN];
    let mut buf: Buf = [const { std::mem::MaybeUninit::uninit() }; BUF_CHUNKS];
    let mut wide = TileSums::<TN>::uninit();
    for b in 0..n_blocks {
        let out = Out {
            p: wide.as_mut_ptr().cast(),
            add: false,
        };
        tile_sums::<T, TN>(dot, w, 16 * b..16 * (b + 1), q, &mut buf, out);
        let wide = wide.assume_init_ref();
        let dw = scales16(scales.add(16 * b));
        for (t, (st, wt)) in sum.iter_mut().zip(wide).enumerate() {
            let (db, bb) = (*d.add(b * TN + t), _mm256_set1_epi32(*bsum.add(b * TN + t)));
            for ((s, h), dw) in st.iter_mut().zip(wt).zip(dw) {
                let scale = _mm256_mul_ps(_mm256_set1_ps(db), dw);
                let sumi = _mm256_cvtepi32_ps(_mm256_sub_epi32(*h, bb));
                *s = _mm256_add_ps(*s, _mm256_mul_ps(sumi, scale));
            }
        }
    }
    store_scaled(out, &sum, post);
}

/// Q2_0 products against Q8_0 activations for the TN tokens of a tile (a multiple of T):
/// per weight block b (`subs` 32-element sub-blocks of two chunks), `s_t = Σ_k d[t][k] ·
/// f32(Σ_{e∈k} code·q − sum[t][k])` from 0 over its sub-blocks in order, then `total_t +=
/// scale[b][r] · s_t`; `out[t] = total_t · post`: the reference dot's operations, lane by
/// lane. Token t's sub-block values sit at `d + k·TN + t` and `sum + k·TN + t` (laid out
/// by [`super::vnni::interleave_blocks`]). Always `vpmaddubsw`: a sub-block is two chunks,
/// too short a run for a call into the `vpdpbusd` kernels, which cannot be inlined here
/// (other target features; such calls read 36 against 92 tok/s in a Q2_0 prompt).
///
/// # Safety
/// AVX2 and F16C; `w` points at `2 · subs · n_blocks` chunks, `scales` at `16 · n_blocks`
/// F16 values, `q`, `d` and `sum` at the tile's values, `out` TN token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn sub_block_dots<const T: usize, const TN: usize>(
    w: *const Chunk,
    scales: *const half::f16,
    (n_blocks, subs): (usize, usize),
    q: *const i8,
    (d, sum): (*const f32, *const i32),
    post: f32,
    out: &Dst,
) {
    let mut total = [[_mm256_setzero_ps(); 2]; TN];
    let mut buf: Buf = [const { std::mem::MaybeUninit::uninit() }; BUF_CHUNKS];
    let mut wide = TileSums::<TN>::uninit();
    for b in 0..n_blocks {
        let mut s = [[_mm256_setzero_ps(); 2]; TN];
        for k in b * subs..(b + 1) * subs {
            let out = Out {
                p: wide.as_mut_ptr().cast(),
                add: false,
            };
            tile_sums::<T, TN>(Dot::Maddubs, w, 2 * k..2 * k + 2, q, &mut buf, out);
            let wide = wide.assume_init_ref();
            for (t, (st, wt)) in s.iter_mut().zip(wide).enumerate() {
                let (dk, sk) = (_mm256_set1_ps(*d.add(k * TN + t)), *sum.add(k * TN + t));
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
    store_scaled(out, &total, post);
}

/// Stores `v[t] · post` as token t's row, for every token.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_scaled(out: &Dst, v: &[[__m256; 2]], post: f32) {
    let p = _mm256_set1_ps(post);
    for (t, v) in v.iter().enumerate() {
        store(out, t, [_mm256_mul_ps(v[0], p), _mm256_mul_ps(v[1], p)]);
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
