//! AVX2 + FMA + F16C kernels. Callers guarantee the features (see `Level::detect`).

use std::arch::x86_64::*;

/// Bytes ahead of its read position that a decode kernel (one weight row or group against
/// one token, memory-bound) asks the core to fetch into L1. The hardware prefetchers alone
/// kept a 2-vCPU Xeon's 2B-4T decode at ~68 % of the streaming rate its two threads reach;
/// 4 KiB ahead took it to ~86 % (BENCHMARKS.md, session 19). A prefetch never faults, so
/// reading past a row's or a buffer's end is harmless.
pub(super) const PREFETCH_AHEAD: usize = 4096;

/// How far ahead [`f16_dot`] asks for its row where it asks at all ([`head_prefetch`]):
/// the exact F16 LM head (half of a 2B-4T token's bytes) does the most arithmetic per byte
/// of the decode kernels, and on a Zen 5 EPYC at 4 KiB it streamed 70.5 GB/s where the
/// probe read 77–83 (the host's fast state); 8 KiB took it to 74.2 and the step-by-step
/// share from 85.8 to 87.5 % at 16 positions, 81.8 to 85.6 % at 128, for about 1–1.5
/// points less in the slow state (still 97–99 %; BENCHMARKS.md, session 30). The ternary
/// kernels keep 4 KiB.
const F16_PREFETCH_AHEAD: usize = 8192;

/// Whether the LM head's kernels prefetch (detected once): the F16 row ([`f16_dot`]) and
/// the requantized Q6_K head's quads (`avx512_kq::q6_k_dot4_q8k`). Not on AMD family 19h
/// with AVX-512 (Zen 4), where both heads streamed best on the hardware prefetchers alone:
/// beside each decode step, the F16 head's share of the probe went 85–88 → 97 % in the
/// host's slow state, 63–68 → 74–82 % in its fast one, the token's 86–89 → 94 % (slow;
/// BENCHMARKS.md, session 34); with the Q6_K head the token's went 73–77 → 90–91 % with
/// the threads on one L3, 54–62 → 58–77 % on two (session 35). Every other CPU
/// prefetches: there the F16 loop without it lost 13 points (Zen 5, session 30).
/// `TERNION_HEAD_PREFETCH=0` or `=1` overrides the choice (for measuring).
pub(super) fn head_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("TERNION_HEAD_PREFETCH").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => !is_zen4(),
    })
}

/// Whether this CPU is a Zen 4 ([`zen4_signature`] of its CPUID).
fn is_zen4() -> bool {
    let (vendor, sig) = (__cpuid(0), __cpuid(1));
    zen4_signature(
        [vendor.ebx, vendor.edx, vendor.ecx],
        sig.eax,
        is_x86_feature_detected!("avx512f"),
    )
}

/// Whether CPUID's vendor (leaf 0's EBX, EDX, ECX), signature (leaf 1's EAX) and AVX-512 F
/// name a Zen 4: "AuthenticAMD", family 19h (base family 0Fh plus extended family 0Ah),
/// with AVX-512 (Zen 3, the same family, has none).
fn zen4_signature(vendor: [u32; 3], eax: u32, avx512f: bool) -> bool {
    let mut name = [0u8; 12];
    for (bytes, reg) in name.chunks_exact_mut(4).zip(vendor) {
        bytes.copy_from_slice(&reg.to_le_bytes());
    }
    let base = (eax >> 8) & 0xf;
    let family = if base == 0xf {
        base + ((eax >> 20) & 0xff)
    } else {
        base
    };
    &name == b"AuthenticAMD" && family == 0x19 && avx512f
}

/// Asks for the cache line at `p` + [`PREFETCH_AHEAD`] (no effect on any value).
#[inline]
#[target_feature(enable = "sse")]
pub(super) fn prefetch_ahead(p: *const u8) {
    prefetch_at::<PREFETCH_AHEAD>(p);
}

/// Asks for the cache line `AHEAD` bytes past `p` (no effect on any value).
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_at<const AHEAD: usize>(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD).cast());
}

/// [`prefetch_ahead`] for block `b` (`bytes` long, at `blk`) of a row a kernel reads block
/// by block: about one prefetch a cache line, i.e. every ⌈64 / bytes⌉-th block of blocks
/// under 64 bytes (one per block cost GPT-2's Q4_0 decode 5 %, BENCHMARKS.md, session
/// 19), every line of a larger one.
#[inline]
#[target_feature(enable = "sse")]
pub(super) fn prefetch_block(blk: *const u8, b: usize, bytes: usize) {
    if bytes >= 64 {
        for off in (0..bytes).step_by(64) {
            prefetch_ahead(blk.wrapping_add(off));
        }
    } else if b.is_multiple_of(64usize.div_ceil(bytes)) {
        prefetch_ahead(blk);
    }
}

/// Horizontal sum of eight i32 lanes.
#[target_feature(enable = "avx2")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Horizontal sum of eight f32 lanes.
#[target_feature(enable = "avx2")]
fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ w_i·x_i for `x.len()` little-endian F16 values at `w`.
///
/// # Safety
/// `w` must point at `2 · x.len()` readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_dot(w: *const u8, x: &[f32]) -> f32 {
    if head_prefetch() {
        f16_dot_ahead::<F16_PREFETCH_AHEAD, false>(w, x)
    } else {
        f16_dot_ahead::<0, true>(w, x)
    }
}

/// [`f16_dot`] asking for the line `AHEAD` bytes past each one it reads (0: never), its
/// halves loaded 16 bytes at a time, or (`WIDE`) 32 bytes at a time, each load's two
/// halves converted apart: the same conversions and fused multiply-adds in the same order
/// either way, so the same sum bit for bit. The exact LM head (half of a 2B-4T decode
/// token's bytes) streams on the hardware prefetchers alone on Zen 4 ([`head_prefetch`]),
/// and there the wide loads raised the token's share of the probe by 0.37 points with the
/// threads on one L3 and by 1.98 on separate L3s, where each core's own streaming rate is
/// the limit (28 runs switched step by step; loads of 64 bytes, or 64 halves a step, read
/// less: BENCHMARKS.md, session 38).
///
/// # Safety
/// As [`f16_dot`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot_ahead<const AHEAD: usize, const WIDE: bool>(w: *const u8, x: &[f32]) -> f32 {
    let n = x.len();
    let w = w.cast::<u16>();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        if AHEAD > 0 {
            prefetch_at::<AHEAD>(w.add(i).cast());
        }
        // The step's 32 halves as four vectors of eight, however they were loaded.
        let halves = if WIDE {
            let (a, b) = (
                _mm256_loadu_si256(w.add(i).cast()),
                _mm256_loadu_si256(w.add(i + 16).cast()),
            );
            [
                _mm256_castsi256_si128(a),
                _mm256_extracti128_si256::<1>(a),
                _mm256_castsi256_si128(b),
                _mm256_extracti128_si256::<1>(b),
            ]
        } else {
            [0, 8, 16, 24].map(|o| _mm_loadu_si128(w.add(i + o).cast()))
        };
        for (j, (a, h)) in acc.iter_mut().zip(halves).enumerate() {
            let wv = _mm256_cvtph_ps(h);
            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i + 8 * j)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        let wv = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i).cast()));
        acc[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
        i += 8;
    }
    let mut sum = hsum_f32(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        sum += half::f16::from_bits(w.add(i).read_unaligned()).to_f32() * x[i];
        i += 1;
    }
    sum
}

/// [`f16_dot`] of one F16 row against two activation rows: each weight vector is
/// converted once and used twice; each result keeps `f16_dot`'s four accumulators and
/// order, so it equals `f16_dot` of that row bit for bit. (Eight named accumulators stay in
/// registers; four rows at once would spill.)
///
/// # Safety
/// `w` must point at `x0.len()` readable halves, and `x1.len() == x0.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot2(w: *const u16, x0: &[f32], x1: &[f32]) -> [f32; 2] {
    let n = x0.len();
    let (p, q) = (x0.as_ptr(), x1.as_ptr());
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
    let mut i = 0;
    while i + 32 <= n {
        prefetch_ahead(w.add(i).cast());
        let w0 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i).cast()));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(p.add(i)), a0);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(q.add(i)), b0);
        let w1 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i + 8).cast()));
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(p.add(i + 8)), a1);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(q.add(i + 8)), b1);
        let w2 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i + 16).cast()));
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(p.add(i + 16)), a2);
        b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(q.add(i + 16)), b2);
        let w3 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i + 24).cast()));
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(p.add(i + 24)), a3);
        b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(q.add(i + 24)), b3);
        i += 32;
    }
    while i + 8 <= n {
        let w0 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i).cast()));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(p.add(i)), a0);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(q.add(i)), b0);
        i += 8;
    }
    let mut sa = hsum_f32(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    let mut sb = hsum_f32(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    while i < n {
        let wv = half::f16::from_bits(w.add(i).read_unaligned()).to_f32();
        sa += wv * x0[i];
        sb += wv * x1[i];
        i += 1;
    }
    [sa, sb]
}

/// [`f16_dot`] of one F16 row against four activation rows (two [`f16_dot2`] passes);
/// each result equals `f16_dot` of that row bit for bit.
///
/// # Safety
/// `w` must point at `2 · n` readable bytes, where every `x[t]` holds `n` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_dot4(w: *const u8, x: [&[f32]; 4]) -> [f32; 4] {
    let w = w.cast::<u16>();
    let [a, b] = f16_dot2(w, x[0], x[1]);
    let [c, d] = f16_dot2(w, x[2], x[3]);
    [a, b, c, d]
}

/// `out_i += a · v_i` for `out.len()` F16 values at `v`.
///
/// # Safety
/// `v` must point at `2 · out.len()` readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_axpy(out: &mut [f32], a: f32, v: *const u8) {
    let n = out.len();
    let v = v.cast::<u16>();
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.add(i).cast()));
        let o = out.as_mut_ptr().add(i);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(av, vv, _mm256_loadu_ps(o)));
        i += 8;
    }
    while i < n {
        out[i] += a * half::f16::from_bits(v.add(i).read_unaligned()).to_f32();
        i += 1;
    }
}

/// Q8_0 row (34-byte blocks: F16 scale, 32 × i8) against Q8_0 activations: per block the
/// exact integer dot (sign trick: |w| · (q·sign w) through `maddubs`), converted to f32 and
/// accumulated with FMA by `d_w · d_act` (ggml's AVX2 order, not the scalar one).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 34;
    let nb = row.len() / BLOCK_BYTES;
    assert!(q.len() == nb * 32 && d.len() == nb, "q8_0_dot: lengths");
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, &da) in d.iter().enumerate() {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        prefetch_block(blk, b, BLOCK_BYTES);
        let w = _mm256_loadu_si256(blk.add(2).cast());
        let x = _mm256_loadu_si256(q.as_ptr().add(32 * b).cast());
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let sumi = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        let dw = half::f16::from_bits(u16::from_le_bytes([*blk, *blk.add(1)])).to_f32();
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), sumi, acc);
    }
    hsum_f32(acc)
}

/// Q4_0 row (18-byte blocks: F16 scale, 16 bytes of nibbles) against Q8_0 activations:
/// nibbles − 8 widened to 32 signed bytes, then as [`q8_0_dot`]. Activations must avoid
/// −128 (ggml's Q8_0 quantizer never produces it).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 18;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 32,
        "q4_0_dot: lengths"
    );
    let ones = _mm256_set1_epi16(1);
    let mask = _mm256_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for (b, &da) in d.iter().enumerate() {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        prefetch_block(blk, b, BLOCK_BYTES);
        let qs = _mm_loadu_si128(blk.add(2).cast());
        let both = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
        let w = _mm256_sub_epi8(_mm256_and_si256(both, mask), eight);
        let x = _mm256_loadu_si256(q.as_ptr().add(32 * b).cast());
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let sumi = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        let dw = half::f16::from_bits(u16::from_le_bytes([*blk, *blk.add(1)])).to_f32();
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), sumi, acc);
    }
    hsum_f32(acc)
}

/// Q5_0 row against Q8_0 activations: as [`q4_0_dot`], with the fifth bits of `qh`
/// spread to bit 4 of each element's byte (byte i takes bit i, the order of the nibbles:
/// low nibbles are elements 0..15, high nibbles 16..31).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0_dot(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 22;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 32,
        "q5_0_dot: lengths"
    );
    let ones = _mm256_set1_epi16(1);
    let mask = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    // Byte i of the broadcast qh picks byte i / 8 of qh; OR-ing all bits but bit i % 8
    // leaves 0xFF exactly where bit i is set.
    let pick = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let all = _mm256_set1_epi8(-1);
    let mut acc = _mm256_setzero_ps();
    for (b, &da) in d.iter().enumerate() {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        prefetch_block(blk, b, BLOCK_BYTES);
        let qh = u32::from_le_bytes([*blk.add(2), *blk.add(3), *blk.add(4), *blk.add(5)]);
        let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), pick);
        let high = _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_or_si256(bits, others), all),
            sixteen,
        );
        let qs = _mm_loadu_si128(blk.add(6).cast());
        let both = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
        let w = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(both, mask), high), sixteen);
        let x = _mm256_loadu_si256(q.as_ptr().add(32 * b).cast());
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let sumi = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        let dw = half::f16::from_bits(u16::from_le_bytes([*blk, *blk.add(1)])).to_f32();
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), sumi, acc);
    }
    hsum_f32(acc)
}

/// Q4_K row against Q8_K activations: the same integer sums as the scalar reference
/// (nibble·q through `maddubs`, times the 6-bit scales through `madd`; Σq times the mins),
/// then the same float combination, so the result is bit-identical to it.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k_dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 144;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256,
        "q4_k_dot_q8k: lengths"
    );
    let mask = _mm256_set1_epi8(0x0F);
    let ones8 = _mm256_set1_epi8(1);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = &row[b * BLOCK_BYTES..][..BLOCK_BYTES];
        prefetch_block(blk.as_ptr(), b, BLOCK_BYTES);
        let scales = &blk[4..16];
        let qa = q.as_ptr().add(256 * b);
        let mut acc = _mm256_setzero_si256();
        let mut accm = _mm256_setzero_si256();
        for c in 0..4 {
            let bytes = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * c).cast());
            let lo = _mm256_and_si256(bytes, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
            let xl = _mm256_loadu_si256(qa.add(64 * c).cast());
            let xh = _mm256_loadu_si256(qa.add(64 * c + 32).cast());
            let (s0, m0) = crate::quant::q4_k::scale_min(scales, 2 * c);
            let (s1, m1) = crate::quant::q4_k::scale_min(scales, 2 * c + 1);
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(s0.into()));
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(s1.into()));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
            let ml = _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones8, xl),
                _mm256_set1_epi16(m0.into()),
            );
            let mh = _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones8, xh),
                _mm256_set1_epi16(m1.into()),
            );
            accm = _mm256_add_epi32(accm, _mm256_add_epi32(ml, mh));
        }
        let (ss, sm) = (hsum_i32(acc), hsum_i32(accm));
        let f16_at =
            |i: usize| half::f16::from_bits(u16::from_le_bytes([blk[i], blk[i + 1]])).to_f32();
        sum += da * f16_at(0) * ss as f32 - da * f16_at(2) * sm as f32;
    }
    sum
}

/// Q6_K row against Q8_K activations: the 6-bit codes unpacked 32 at a time, (q − 32)·x as
/// `maddubs(q, x) − maddubs(32, x)`, times the per-16 scales through `madd`; the integer
/// sum and the float combination equal the scalar reference's (bit-identical).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    const BLOCK_BYTES: usize = 210;
    let nb = d.len();
    assert!(
        row.len() == nb * BLOCK_BYTES && q.len() == nb * 256,
        "q6_k_dot_q8k: lengths"
    );
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let c32 = _mm256_set1_epi8(32);
    let mut sum = 0f32;
    for (b, &da) in d.iter().enumerate() {
        let blk = &row[b * BLOCK_BYTES..][..BLOCK_BYTES];
        let p = blk.as_ptr();
        prefetch_block(p, b, BLOCK_BYTES);
        let qa = q.as_ptr().add(256 * b);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
            let high = |s: i32| {
                let v = match s {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
            };
            let v = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
            ];
            for (k, &vk) in v.iter().enumerate() {
                let x = _mm256_loadu_si256(qa.add(128 * h + 32 * k).cast());
                let prod =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(vk, x), _mm256_maddubs_epi16(c32, x));
                let sc = 192 + 8 * h + 2 * k;
                let scales = _mm256_set_m128i(
                    _mm_set1_epi16((blk[sc + 1] as i8).into()),
                    _mm_set1_epi16((blk[sc] as i8).into()),
                );
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, scales));
            }
        }
        let dw = half::f16::from_bits(u16::from_le_bytes([blk[208], blk[209]])).to_f32();
        sum += dw * da * hsum_i32(acc) as f32;
    }
    sum
}

/// [`q8_0_dot`] of one row against four activation rows: |w| is formed once per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_dot4(row: &[u8], q: [&[i8]; 4], d: [&[f32]; 4]) -> [f32; 4] {
    const BLOCK_BYTES: usize = 34;
    let nb = row.len() / BLOCK_BYTES;
    for t in 0..4 {
        assert!(
            q[t].len() == nb * 32 && d[t].len() == nb,
            "q8_0_dot4: lengths"
        );
    }
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        let blk = row.as_ptr().add(BLOCK_BYTES * b);
        prefetch_block(blk, b, BLOCK_BYTES);
        let w = _mm256_loadu_si256(blk.add(2).cast());
        let aw = _mm256_sign_epi8(w, w);
        let dw = half::f16::from_bits(u16::from_le_bytes([*blk, *blk.add(1)])).to_f32();
        for t in 0..4 {
            let x = _mm256_loadu_si256(q[t].as_ptr().add(32 * b).cast());
            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
            let sumi = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * *d[t].get_unchecked(b)), sumi, acc[t]);
        }
    }
    std::array::from_fn(|t| hsum_f32(acc[t]))
}

#[cfg(test)]
mod tests {
    use super::{f16_dot_ahead, zen4_signature, F16_PREFETCH_AHEAD};

    /// The F16 row dot with 32-byte loads (Zen 4's) equals the 16-byte one with the
    /// prefetch (the other CPUs') and without it, bit for bit, for widths ending after
    /// whole 32-half steps, 8-wide steps or single halves.
    #[test]
    fn wide_f16_loads_give_the_same_sums() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("skipped: this CPU has no AVX2/FMA/F16C, which the kernels need");
            return;
        }
        let mut s = 0x2545_f491_u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for n in [0, 1, 7, 8, 31, 32, 33, 40, 64, 150, 2560, 2563, 2600] {
            let w: Vec<u8> = (0..n)
                .flat_map(|_| {
                    let v = (next() % 20_001) as f32 / 10_000.0 - 1.0;
                    half::f16::from_f32(v).to_le_bytes()
                })
                .collect();
            let x: Vec<f32> = (0..n)
                .map(|_| (next() % 60_001) as f32 / 10_000.0 - 3.0)
                .collect();
            // SAFETY: the features are detected above; `w` holds n halves.
            let (narrow, wide, ahead) = unsafe {
                (
                    f16_dot_ahead::<0, false>(w.as_ptr(), &x),
                    f16_dot_ahead::<0, true>(w.as_ptr(), &x),
                    f16_dot_ahead::<F16_PREFETCH_AHEAD, false>(w.as_ptr(), &x),
                )
            };
            assert_eq!(wide.to_bits(), narrow.to_bits(), "n={n}");
            assert_eq!(ahead.to_bits(), narrow.to_bits(), "n={n}");
        }
    }

    /// Leaf 0's EBX, EDX, ECX for a vendor name.
    fn vendor(name: &[u8; 12]) -> [u32; 3] {
        std::array::from_fn(|i| u32::from_le_bytes(name[4 * i..4 * i + 4].try_into().unwrap()))
    }

    /// Zen 4 by its signature (family 19h with AVX-512); not Zen 3 (family 19h without),
    /// Zen 2, Zen 5 (family 1Ah), an Intel core, another vendor's family 19h, or a base
    /// family other than 0Fh whose extended-family bits would add up to 19h.
    #[test]
    fn zen4_is_told_from_its_cpuid() {
        let (amd, intel) = (b"AuthenticAMD", b"GenuineIntel");
        let cases = [
            (amd, 0x00a1_0f11, true, true, "EPYC 9004 (Genoa)"),
            (amd, 0x00a6_0f12, true, true, "Ryzen 7000 (Raphael)"),
            (amd, 0x00a0_0f11, false, false, "EPYC 7003 (Milan)"),
            (amd, 0x0083_0f10, false, false, "EPYC 7002 (Rome)"),
            (amd, 0x00b0_0f21, true, false, "EPYC 9005 (Turin)"),
            (amd, 0x0100_0900, true, false, "base 09h, ext 10h"),
            (intel, 0x0008_06f8, true, false, "Xeon (Sapphire Rapids)"),
            (intel, 0x00a1_0f11, true, false, "Intel, Genoa bits"),
        ];
        for (name, eax, avx512f, want, cpu) in cases {
            assert_eq!(zen4_signature(vendor(name), eax, avx512f), want, "{cpu}");
        }
    }
}
