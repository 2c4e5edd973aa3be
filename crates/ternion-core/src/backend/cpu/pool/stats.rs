//! Opt-in counters of a pool's ops (`ternion bench --profile` on the CPU): how much of a
//! decode step runs in parallel ops, how long the threads sit idle inside them (a thread
//! done with its chunks waits for the last one), and, by difference with the step's wall
//! time, how long the caller works alone between them (norms, quantization, residual adds:
//! the memory bus idles then). Off, the default, an op pays one relaxed load per chunk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a pool's ops took between [`super::Pool::stats_start`] and
/// [`super::Pool::stats_stop`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// Ops that woke the workers.
    pub parallel_ops: u64,
    /// Their wall time in seconds, from the caller's start to the last chunk's end.
    pub parallel_s: f64,
    /// Seconds the threads spent running chunks of those ops, summed over the threads.
    pub busy_s: f64,
    /// Ops run on the caller alone (a single chunk, a pool of one thread, or a stretch
    /// where the workers did not pay).
    pub inline_ops: u64,
    /// Their seconds.
    pub inline_s: f64,
    /// Threads of the pool (the caller included).
    pub threads: usize,
}

impl PoolStats {
    /// The share of the threads' time inside parallel ops spent waiting, not running a
    /// chunk (0 without parallel ops).
    pub fn idle_share(&self) -> f64 {
        let capacity = self.parallel_s * self.threads as f64;
        match capacity > 0.0 {
            true => (1.0 - self.busy_s / capacity).max(0.0),
            false => 0.0,
        }
    }
}

/// The counters (nanoseconds and counts) and whether they count.
#[derive(Default)]
pub(super) struct Stats {
    on: AtomicBool,
    parallel_ops: AtomicU64,
    parallel_ns: AtomicU64,
    busy_ns: AtomicU64,
    inline_ops: AtomicU64,
    inline_ns: AtomicU64,
}

impl Stats {
    /// Zeroes the counters and starts counting.
    pub(super) fn start(&self) {
        for c in self.counters() {
            c.store(0, Ordering::Relaxed);
        }
        self.on.store(true, Ordering::Relaxed);
    }

    /// Stops counting; what was counted since [`Stats::start`] (zeros if nothing was), the
    /// counters zeroed.
    pub(super) fn stop(&self, threads: usize) -> PoolStats {
        self.on.store(false, Ordering::Relaxed);
        let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        let secs = |c: &AtomicU64| take(c) as f64 / 1e9;
        PoolStats {
            parallel_ops: take(&self.parallel_ops),
            parallel_s: secs(&self.parallel_ns),
            busy_s: secs(&self.busy_ns),
            inline_ops: take(&self.inline_ops),
            inline_s: secs(&self.inline_ns),
            threads,
        }
    }

    /// The time now while counting.
    pub(super) fn clock(&self) -> Option<Instant> {
        self.on.load(Ordering::Relaxed).then(Instant::now)
    }

    /// Counts a chunk that started at `start` (from [`Stats::clock`]).
    pub(super) fn chunk(&self, start: Option<Instant>) {
        if let Some(s) = start {
            add(&self.busy_ns, s.elapsed());
        }
    }

    /// Counts an op run on the caller alone that started at `start`.
    pub(super) fn inline(&self, start: Option<Instant>) {
        if let Some(s) = start {
            add(&self.inline_ns, s.elapsed());
            self.inline_ops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a parallel op of `wall` time.
    pub(super) fn parallel(&self, wall: Duration) {
        if self.on.load(Ordering::Relaxed) {
            add(&self.parallel_ns, wall);
            self.parallel_ops.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counters(&self) -> [&AtomicU64; 5] {
        [
            &self.parallel_ops,
            &self.parallel_ns,
            &self.busy_ns,
            &self.inline_ops,
            &self.inline_ns,
        ]
    }
}

fn add(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}
