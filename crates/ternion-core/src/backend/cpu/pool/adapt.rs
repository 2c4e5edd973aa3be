//! When the pool's workers pay: each parallel op measures what it cost against what the
//! calling thread alone would have needed, and a stretch of ops where the workers did not
//! pay (the CPU is contended: a descheduled worker holds a chunk, or never got to join) is
//! followed by ops the caller runs alone, with a parallel probe now and then.
//!
//! A parallel pool goes solo when two of its last three windows did not pay: a shared
//! host sometimes deschedules a worker once for a few milliseconds (one stalled op
//! outweighs a whole window), and a solo stretch of hundreds of ops on one thread costs far
//! more than that stall; a competing busy process stalls window after window, or every
//! other one. A probe during a solo stretch that does not pay starts the next, longer
//! stretch at once; one that pays returns to parallel ops, counted as one window that did
//! not pay (the contention that caused the stretch may well go on).
//!
//! The estimate needs no second run: the caller times its own chunks, so an op of `n`
//! chunks of which the caller ran `c` in `t_own` would have taken about `t_own · n / c`
//! alone (an over-estimate on an idle machine, where one thread streams faster than each of
//! two sharing the memory bus: the bias keeps an idle machine parallel).

use std::time::Duration;

/// Parallel ops judged together.
const WINDOW: u32 = 32;
/// Ops run alone after the first window that did not pay; doubled after each failed probe.
const MIN_SOLO: u32 = 256;
/// The longest solo stretch between probes.
const MAX_SOLO: u32 = 8192;

/// The policy's state (owned by the thread inside `Pool::run`).
#[derive(Default)]
pub(super) struct Adapt {
    /// Ops left to run on the caller alone.
    solo_left: u32,
    /// The next solo stretch's length (0 while parallel: before the first, or after a
    /// probe that paid).
    backoff: u32,
    /// The last three parallel windows, one bit each (1: did not pay), newest lowest; a
    /// probe that paid after a solo stretch leaves a single 1.
    recent: u8,
    /// The current window: its parallel ops, their cost and the caller-alone estimate.
    ops: u32,
    parallel: Duration,
    alone: Duration,
}

/// What one parallel op measured.
pub(super) struct Sample {
    /// From the op's start to its end (all chunks done).
    pub(super) total: Duration,
    /// The caller's time running its own chunks.
    pub(super) own: Duration,
    /// Chunks the caller ran, and in all.
    pub(super) own_chunks: usize,
    pub(super) chunks: usize,
    /// Threads of the pool.
    pub(super) threads: usize,
}

impl Adapt {
    /// Whether the next op runs on the caller alone (counts it as run).
    pub(super) fn solo(&mut self) -> bool {
        if self.solo_left == 0 {
            return false;
        }
        self.solo_left -= 1;
        true
    }

    /// Runs the next `n` ops on the caller alone (tests: the solo path on demand).
    #[cfg(test)]
    pub(super) fn force_solo(&mut self, n: u32) {
        self.solo_left = n;
    }

    /// Records a parallel op; at the end of a window, starts a solo stretch when the
    /// workers did not save a fifth of the caller-alone estimate: in this probe window, or
    /// (while parallel) in two of the last three windows.
    pub(super) fn record(&mut self, s: Sample) {
        // At most `threads` times the op's time: a caller descheduled inside its own
        // chunks would otherwise inflate the estimate without bound.
        let alone = if s.own_chunks == 0 {
            s.total
        } else {
            let scaled = s.own.mul_f64(s.chunks as f64 / s.own_chunks as f64);
            scaled.min(s.total * s.threads as u32)
        };
        self.ops += 1;
        self.parallel += s.total;
        self.alone += alone;
        if self.ops < WINDOW {
            return;
        }
        let paid = self.parallel.as_secs_f64() < 0.8 * self.alone.as_secs_f64();
        if self.backoff > 0 {
            // A probe after a solo stretch.
            self.recent = u8::from(paid);
        } else {
            self.recent = (self.recent << 1 | u8::from(!paid)) & 0b111;
        }
        if paid {
            self.backoff = 0;
        } else if self.backoff > 0 || self.recent.count_ones() >= 2 {
            self.recent = 0;
            self.backoff = (self.backoff * 2).clamp(MIN_SOLO, MAX_SOLO);
            self.solo_left = self.backoff;
        }
        (self.ops, self.parallel, self.alone) = (0, Duration::ZERO, Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(total_us: u64, own_us: u64, own_chunks: usize) -> Sample {
        Sample {
            total: Duration::from_micros(total_us),
            own: Duration::from_micros(own_us),
            own_chunks,
            chunks: 100,
            threads: 2,
        }
    }

    fn window(a: &mut Adapt, s: impl Fn(u32) -> Sample) {
        for i in 0..WINDOW {
            assert!(!a.solo());
            a.record(s(i));
        }
    }

    fn solo_run(a: &mut Adapt) -> u32 {
        let mut n = 0;
        while a.solo() {
            n += 1;
        }
        n
    }

    #[test]
    fn workers_that_pay_keep_the_pool_parallel() {
        let mut a = Adapt::default();
        // Half the chunks each, no wait: half the caller-alone time.
        for _ in 0..10 {
            window(&mut a, |_| op(100, 100, 50));
        }
        assert_eq!(solo_run(&mut a), 0);
    }

    #[test]
    fn one_stalled_window_keeps_the_pool_parallel() {
        let mut a = Adapt::default();
        // A worker descheduled for 4 ms in one op: the window does not pay.
        window(&mut a, |i| match i {
            0 => op(4000, 100, 50),
            _ => op(100, 100, 50),
        });
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(100, 100, 50));
        window(&mut a, |_| op(100, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
        // Another isolated stall, three windows after the first: still parallel.
        window(&mut a, |i| match i {
            5 => op(4000, 100, 50),
            _ => op(100, 100, 50),
        });
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(100, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
    }

    #[test]
    fn late_workers_send_the_pool_solo_with_growing_stretches() {
        let mut a = Adapt::default();
        // The caller ran half the chunks in 100 µs, then waited 300 µs for a worker: one
        // such window is a strike, two in a row start a solo stretch.
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), MIN_SOLO);
        // A probe that does not pay starts the next, longer stretch at once.
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), 2 * MIN_SOLO);
        // A worker that never joins saves nothing either.
        window(&mut a, |_| op(200, 200, 100));
        assert_eq!(solo_run(&mut a), 4 * MIN_SOLO);
        for _ in 0..10 {
            window(&mut a, |_| op(400, 100, 50));
            solo_run(&mut a);
        }
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), MAX_SOLO);
        // A caller descheduled inside its own chunks makes them look slow, but the workers
        // cannot have saved more than all but 1/threads of the op.
        // One such op in a window of late workers does not make the window pay.
        window(&mut a, |i| match i {
            0 => op(1000, 990, 1),
            _ => op(400, 100, 50),
        });
        assert_eq!(solo_run(&mut a), MAX_SOLO);
        // A probe that pays ends the backoff; the next window that does not pay goes
        // solo again at once.
        window(&mut a, |_| op(100, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), MIN_SOLO);
        // Late windows every other one: solo at the second.
        window(&mut a, |_| op(100, 100, 50));
        window(&mut a, |_| op(100, 100, 50));
        window(&mut a, |_| op(100, 100, 50));
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(100, 100, 50));
        assert_eq!(solo_run(&mut a), 0);
        window(&mut a, |_| op(400, 100, 50));
        assert_eq!(solo_run(&mut a), MIN_SOLO);
    }
}
