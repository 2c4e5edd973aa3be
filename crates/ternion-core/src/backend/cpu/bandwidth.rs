//! The CPU's streaming read bandwidth, measured: the ceiling of single-sequence decode, which
//! reads every weight once a token (`ternion bench` prints decode's share of it).
//!
//! The probe reads as decode does: on the global pool's threads (decode's threads, its
//! scheduling and work sharing), in parallel tasks over one buffer far larger than the
//! last-level cache, on transparent huge pages like the repacked weights
//! ([`super::huge`]), with whichever of the CPU's vector loads reads fastest there
//! (measured when the probe is made: 32-byte loads read 1–7 % more than 64-byte ones on a
//! Zen 4 EPYC, BENCHMARKS.md, session 35); the best of several passes counts (a shared
//! machine's neighbours only ever slow a pass down).

use std::time::Instant;

use super::huge::HugeBuf;
use super::pool;
#[cfg(target_arch = "x86_64")]
use super::simd::Level;

/// Bytes of the probe buffer: 16 times a 32 MiB last-level cache.
const PROBE_BYTES: usize = 512 << 20;

/// Bytes one parallel task reads (a 2B-4T decode task reads 80–220 KiB of ternary rows,
/// 256–320 KiB of the LM head; larger tasks here only cut the scheduling cost).
const TASK_BYTES: usize = 1 << 20;

/// Passes over the buffer; the best counts.
const PASSES: usize = 10;

/// Passes of each load width when the probe chooses its loop.
const TRIAL_PASSES: usize = 2;

/// One cache line of the probe buffer.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// A buffer far larger than the last-level cache, on huge pages, that the global pool's
/// threads read in parallel tasks (one pass: [`ReadProbe::pass`]).
pub struct ReadProbe {
    buf: HugeBuf<Line>,
    /// The loop every pass reads with, and its load width in bytes: the fastest of
    /// [`loops`] when the probe was made.
    read: (SumFn, usize),
}

/// A loop that reads every word of its lines (returning their wrapping sum, so that no
/// load can be left out).
type SumFn = fn(&[Line]) -> u64;

/// The plain loop, written with u64 words (eight lanes, vectorized as far as the baseline
/// target allows): its width is given as the word's 8 bytes.
const PLAIN: (SumFn, usize) = (sum_lanes, 8);

impl ReadProbe {
    /// The probe's buffer of [`PROBE_BYTES`], written once so that its pages exist before
    /// the first pass, and its loop: of the loops this CPU runs ([`loops`]), the one whose
    /// best of [`TRIAL_PASSES`] passes (taken in turns) read fastest.
    pub fn new() -> ReadProbe {
        let mut probe = ReadProbe {
            buf: HugeBuf::filled(PROBE_BYTES / 64, Line([1; 8])),
            read: PLAIN,
        };
        let candidates = loops();
        let mut best = vec![0f64; candidates.len()];
        for _ in 0..TRIAL_PASSES {
            for (b, &read) in best.iter_mut().zip(&candidates) {
                probe.read = read;
                *b = b.max(probe.pass());
            }
        }
        let fastest = (0..candidates.len()).max_by(|&i, &j| best[i].total_cmp(&best[j]));
        probe.read = candidates[fastest.unwrap_or(0)];
        probe
    }

    /// The bytes of each load of the probe's loop.
    pub fn load_bytes(&self) -> usize {
        self.read.1
    }

    /// Read bandwidth in GB/s (10⁹ bytes a second) of one pass over the buffer.
    pub fn pass(&self) -> f64 {
        let per_task = TASK_BYTES / 64;
        let tasks = self.buf.len().div_ceil(per_task);
        let read = self.read.0;
        let t = Instant::now();
        pool::global().run(tasks, &|c, _| {
            let lines = &self.buf[c * per_task..((c + 1) * per_task).min(self.buf.len())];
            std::hint::black_box(read(lines));
        });
        PROBE_BYTES as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    /// The best of [`PASSES`] passes, in GB/s.
    pub fn best(&self) -> f64 {
        (0..PASSES).map(|_| self.pass()).fold(0f64, f64::max)
    }
}

impl Default for ReadProbe {
    fn default() -> Self {
        ReadProbe::new()
    }
}

/// Read bandwidth in GB/s of the global pool's threads: [`ReadProbe::best`] of a probe
/// whose buffer is freed on return.
pub fn measure_read_bandwidth() -> f64 {
    ReadProbe::new().best()
}

/// The read loops of this CPU, as far as [`Level::detect`] allows (`TERNION_SIMD` caps the
/// probe as it caps decode): 64-byte and 32-byte loads where AVX-512 runs, 32-byte ones
/// where AVX2 does, else the plain loop.
fn loops() -> Vec<(SumFn, usize)> {
    #[cfg(target_arch = "x86_64")]
    match Level::detect() {
        Level::Avx512 => return vec![(sum_avx512, 64), (sum_avx2, 32)],
        Level::Avx2 => return vec![(sum_avx2, 32)],
        _ => {}
    }
    vec![PLAIN]
}

/// [`sum_lanes`] with one 64-byte load a line, four lines at a time.
#[cfg(target_arch = "x86_64")]
fn sum_avx512(lines: &[Line]) -> u64 {
    // SAFETY: chosen by `loops` only where Level::Avx512 (AVX-512 F, BW, VNNI) was detected.
    unsafe { sum_zmm(lines) }
}

/// [`sum_lanes`] with two 32-byte loads a line, two lines at a time.
#[cfg(target_arch = "x86_64")]
fn sum_avx2(lines: &[Line]) -> u64 {
    // SAFETY: chosen by `loops` only where Level::Avx2 or Level::Avx512 was detected.
    unsafe { sum_ymm(lines) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_zmm(lines: &[Line]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut quads = lines.chunks_exact(4);
    for q in &mut quads {
        for (a, line) in acc.iter_mut().zip(q) {
            *a = _mm512_add_epi64(*a, _mm512_load_si512(line.0.as_ptr().cast()));
        }
    }
    let v = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    (_mm512_reduce_add_epi64(v) as u64).wrapping_add(sum_lanes(quads.remainder()))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_ymm(lines: &[Line]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut pairs = lines.chunks_exact(2);
    for pair in &mut pairs {
        let p = pair.as_ptr().cast::<__m256i>();
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_load_si256(p.add(i)));
        }
    }
    let v = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut words = [0u64; 4];
    _mm256_storeu_si256(words.as_mut_ptr().cast(), v);
    words
        .iter()
        .fold(sum_lanes(pairs.remainder()), |a, &w| a.wrapping_add(w))
}

/// Wrapping sum of the words of `lines` in eight independent lanes.
fn sum_lanes(lines: &[Line]) -> u64 {
    let mut lanes = [0u64; 8];
    for line in lines {
        for (l, w) in lanes.iter_mut().zip(&line.0) {
            *l = l.wrapping_add(*w);
        }
    }
    lanes.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every loop this CPU runs reads every word, whole groups and remainders alike.
    #[test]
    fn every_loop_sums_every_word() {
        let lines: Vec<Line> = (0..3u64)
            .map(|i| Line(std::array::from_fn(|j| 8 * i + j as u64 + 1)))
            .collect();
        let many: Vec<Line> = (0..11u64).map(|i| Line([i; 8])).collect();
        let candidates = loops();
        assert!(!candidates.is_empty());
        for (sum, _) in candidates.into_iter().chain([PLAIN]) {
            assert_eq!(sum(&lines), 300);
            assert_eq!(sum(&many), 8 * 55);
            assert_eq!(sum(&many[..4]), 8 * 6);
            assert_eq!(sum(&[Line([u64::MAX, 2, 0, 0, 0, 0, 0, 0])]), 1);
            assert_eq!(sum(&[]), 0);
        }
    }
}
