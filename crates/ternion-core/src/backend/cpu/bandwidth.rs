//! The CPU's streaming read bandwidth, measured: the ceiling of single-sequence decode, which
//! reads every weight once a token (`ternion bench` prints decode's share of it).

use std::time::Instant;

/// Bytes of the probe buffer: several times any last-level cache.
const PROBE_BYTES: usize = 256 << 20;

/// Read bandwidth in GB/s (10⁹ bytes a second) of `threads` threads each summing an equal
/// share of a buffer larger than the caches: the best of three passes over it (the buffer
/// is written first, so its pages exist before the first pass).
pub fn measure_read_bandwidth(threads: usize) -> f64 {
    let words = PROBE_BYTES / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads.max(1));
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let total = std::thread::scope(|s| {
            let parts: Vec<_> = buf.chunks(chunk).map(|c| s.spawn(|| sum(c))).collect();
            parts
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max(PROBE_BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Wrapping sum of `words` in eight independent lanes (the loop vectorizes and keeps many
/// loads in flight).
fn sum(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut blocks = words.chunks_exact(8);
    for b in &mut blocks {
        for (l, w) in lanes.iter_mut().zip(b) {
            *l = l.wrapping_add(*w);
        }
    }
    blocks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(0u64, |a, &w| a.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_sum_every_word() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(sum(&words), 231);
        assert_eq!(sum(&[u64::MAX, 2]), 1);
        assert_eq!(sum(&[]), 0);
    }
}
