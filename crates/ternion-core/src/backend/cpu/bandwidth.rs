//! The CPU's streaming read bandwidth, measured: the ceiling of single-sequence decode, which
//! reads every weight once a token (`ternion bench` prints decode's share of it).
//!
//! The probe reads as decode does: on the global pool's threads (decode's threads, its
//! scheduling and work sharing), in parallel tasks over one buffer far larger than the
//! last-level cache, on transparent huge pages like the repacked weights
//! ([`super::huge`]), with the widest vector loads the CPU has; the best of several passes
//! counts (a shared machine's neighbours only ever slow a pass down).

use std::time::Instant;

use super::huge::HugeBuf;
use super::pool;
#[cfg(target_arch = "x86_64")]
use super::simd::Level;

/// Bytes of the probe buffer: 16 times a 32 MiB last-level cache.
const PROBE_BYTES: usize = 512 << 20;

/// Bytes one parallel task reads (a decode task reads 16 rows: 10–40 KiB of ternary rows,
/// 33 KiB of a Q6_K head; larger tasks here only cut the scheduling cost).
const TASK_BYTES: usize = 1 << 20;

/// Passes over the buffer; the best counts.
const PASSES: usize = 10;

/// One cache line of the probe buffer.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// A buffer far larger than the last-level cache, on huge pages, that the global pool's
/// threads read in parallel tasks (one pass: [`ReadProbe::pass`]).
pub struct ReadProbe {
    buf: HugeBuf<Line>,
}

impl ReadProbe {
    /// The probe's buffer of [`PROBE_BYTES`], written once so that its pages exist before
    /// the first pass.
    pub fn new() -> ReadProbe {
        ReadProbe {
            buf: HugeBuf::filled(PROBE_BYTES / 64, Line([1; 8])),
        }
    }

    /// Read bandwidth in GB/s (10⁹ bytes a second) of one pass over the buffer.
    pub fn pass(&self) -> f64 {
        let per_task = TASK_BYTES / 64;
        let tasks = self.buf.len().div_ceil(per_task);
        let t = Instant::now();
        pool::global().run(tasks, &|c, _| {
            let lines = &self.buf[c * per_task..((c + 1) * per_task).min(self.buf.len())];
            std::hint::black_box(sum(lines));
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

/// Wrapping sum of the words of `lines`, with the 64-byte loads of the AVX-512 kernels where
/// decode runs them ([`Level::detect`], so `TERNION_SIMD` caps the probe as it caps decode).
fn sum(lines: &[Line]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if Level::detect() == Level::Avx512 {
        // SAFETY: Level::Avx512 is only detected where the CPU has AVX-512 F (and BW, VNNI).
        return unsafe { sum_avx512(lines) };
    }
    sum_lanes(lines)
}

/// [`sum_lanes`] with one 64-byte load a line, four lines at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(lines: &[Line]) -> u64 {
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

    #[test]
    fn lanes_sum_every_word() {
        let lines: Vec<Line> = (0..3u64)
            .map(|i| Line(std::array::from_fn(|j| 8 * i + j as u64 + 1)))
            .collect();
        assert_eq!(sum(&lines), 300);
        let many: Vec<Line> = (0..11u64).map(|i| Line([i; 8])).collect();
        assert_eq!(sum(&many), 8 * 55);
        assert_eq!(sum(&[Line([u64::MAX, 2, 0, 0, 0, 0, 0, 0])]), 1);
        assert_eq!(sum(&[]), 0);
    }
}
