//! The CPU worker pool: threads started once, woken for each parallel op, never spawned per
//! token, and no heap allocation per op.
//!
//! An op is split into numbered chunks (blocks of weight rows, attention heads). Each thread
//! owns a contiguous range of chunks (a static row partition: every thread streams its own
//! stretch of the weights, which keeps the hardware prefetchers effective) and takes them
//! in order; a thread that finishes early takes the remaining chunks of the others. Every
//! output element is computed inside exactly one chunk by the same code whatever thread
//! runs it, so results are identical for any thread count and any chunk assignment.
//!
//! Robust under load (another process competing for the cores):
//! - a worker joins an op through a gate the caller closes once every chunk is claimed, so
//!   the caller waits only for workers that hold a chunk, never for one that was
//!   descheduled before it joined;
//! - the caller waits for those by spinning briefly, then sleeping (its core goes to
//!   whoever needs it, the late worker included);
//! - [`adapt`] measures whether the workers save time and runs the ops on the caller alone
//!   while they do not (a worker descheduled while holding a chunk stalls the op until the
//!   scheduler runs it again), probing again now and then.

mod adapt;
mod stats;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Instant;

use adapt::{Adapt, Sample};
pub use stats::PoolStats;
use stats::Stats;

/// Spins before a waiting worker parks (each spin is one `spin_loop` hint).
const SPINS_BEFORE_PARK: u32 = 20_000;
/// Spins before the caller, waiting for workers still running a chunk, sleeps.
const SPINS_BEFORE_SLEEP: u32 = 2_000;

/// The gate's fields: joined workers still running (low bits), whether workers may still
/// join, whether the caller sleeps until they finish, and the op's generation (high bits).
const COUNT: u64 = 0xffff;
const OPEN: u64 = 1 << 16;
const SLEEPER: u64 = 1 << 17;
const GEN_SHIFT: u32 = 18;

/// A type-erased reference to the running op.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize, usize) + Sync),
}

/// One thread's range of chunks: the next unclaimed one and the end (own cache line).
#[repr(align(64))]
struct Range {
    next: AtomicUsize,
    end: AtomicUsize,
}

struct Shared {
    gate: AtomicU64,
    job: UnsafeCell<Job>,
    ranges: Vec<Range>,
    panicked: AtomicBool,
    workers: OnceLock<Vec<Thread>>,
    /// The caller sleeping until the joined workers finish (see `SLEEPER`).
    sleeper: Mutex<Option<Thread>>,
    /// The opt-in counters of [`Pool::stats_start`].
    stats: Stats,
}

// SAFETY: `job` is written only by the thread inside `Pool::run` while no worker reads it
// (the gate is closed and every joined worker has left), and read by a worker only after
// it joined the open gate that publishes it (Release/Acquire).
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw closure pointer is only dereferenced while `run` keeps it alive.
unsafe impl Send for Shared {}

/// A fixed set of worker threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    n_threads: usize,
    /// One op at a time; the policy that decides whether workers help.
    busy: Mutex<Adapt>,
}

static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// The op a pool holds before its first `run` (never called).
static NOOP: fn(usize, usize) = |_, _| {};

/// Sets the number of threads of the global pool (call before the first parallel op);
/// returns false if the pool already exists with another size.
pub fn init(n_threads: usize) -> bool {
    let n = n_threads.max(1);
    GLOBAL.get_or_init(|| Pool::new(n)).n_threads == n
}

/// The global pool (the cores this process may use, per its CPU affinity and cgroup quota,
/// unless [`init`] said otherwise).
pub fn global() -> &'static Pool {
    GLOBAL.get_or_init(|| Pool::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
}

impl Pool {
    /// A pool of `n_threads` (the caller counts as one; `n_threads - 1` workers start).
    /// On wasm32, which has no threads, every op runs inline on the caller.
    pub fn new(n_threads: usize) -> Pool {
        let n_threads = if cfg!(target_arch = "wasm32") {
            1
        } else {
            n_threads.max(1)
        };
        let shared = Arc::new(Shared {
            gate: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: &NOOP as &(dyn Fn(usize, usize) + Sync),
            }),
            ranges: (0..n_threads)
                .map(|_| Range {
                    next: AtomicUsize::new(0),
                    end: AtomicUsize::new(0),
                })
                .collect(),
            panicked: AtomicBool::new(false),
            workers: OnceLock::new(),
            sleeper: Mutex::new(None),
            stats: Stats::default(),
        });
        // Every worker has started (and made its thread's own allocations) before `new`
        // returns: nothing of their start-up lands in a later op.
        let started = Arc::new(std::sync::Barrier::new(n_threads));
        let workers = (1..n_threads)
            .map(|i| {
                let (s, started) = (shared.clone(), started.clone());
                std::thread::Builder::new()
                    .name(format!("ternion-worker-{i}"))
                    .spawn(move || {
                        started.wait();
                        worker(&s, i)
                    })
                    .expect("starting a worker thread")
                    .thread()
                    .clone()
            })
            .collect();
        started.wait();
        shared.workers.set(workers).ok();
        Pool {
            shared,
            n_threads,
            busy: Mutex::new(Adapt::default()),
        }
    }

    /// Starts counting this pool's ops ([`PoolStats`]), from zero.
    pub fn stats_start(&self) {
        self.shared.stats.start();
    }

    /// Stops counting; what the ops took since [`Pool::stats_start`].
    pub fn stats_stop(&self) -> PoolStats {
        self.shared.stats.stop(self.n_threads)
    }

    /// Threads that work on an op (workers plus the caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(chunk, thread)` for every chunk in `0..n_chunks`, in parallel, and returns
    /// when all are done; `thread` (in `0..n_threads()`) names the thread running the chunk,
    /// so callers can give each thread its own scratch. A panic inside `f` is re-raised here.
    pub fn run(&self, n_chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let stats = &self.shared.stats;
        if self.n_threads == 1 || n_chunks <= 1 {
            let t = stats.clock();
            (0..n_chunks).for_each(|c| f(c, 0));
            stats.inline(t);
            return;
        }
        // One op at a time (sessions on several threads share the pool).
        let mut adapt = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if adapt.solo() {
            let t = stats.clock();
            (0..n_chunks).for_each(|c| f(c, 0));
            stats.inline(t);
            return;
        }
        let start = Instant::now();
        let (mine, own_chunks, own_end) = self.parallel(n_chunks, f);
        let end = Instant::now();
        stats.parallel(end - start);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if self.shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a worker thread panicked inside a parallel op");
        }
        adapt.record(Sample {
            total: end - start,
            own: own_end - start,
            own_chunks,
            chunks: n_chunks,
            threads: self.n_threads,
        });
    }

    /// One op on the caller and the workers that join in time: the caller's result, how
    /// many chunks it ran and when it had finished them.
    fn parallel(
        &self,
        n_chunks: usize,
        f: &(dyn Fn(usize, usize) + Sync),
    ) -> (std::thread::Result<usize>, usize, Instant) {
        let s = &*self.shared;
        let workers = s.workers.get().expect("set in new");
        // SAFETY: no worker reads `job` now: the gate is closed and every worker that
        // joined the previous op has left it; the next read follows the opening below.
        // The pointer's lifetime is erased; `f` outlives its use because we wait below.
        unsafe {
            *s.job.get() = Job {
                f: std::mem::transmute::<
                    &(dyn Fn(usize, usize) + Sync),
                    *const (dyn Fn(usize, usize) + Sync),
                >(f),
            };
        }
        let t = s.ranges.len();
        for (i, r) in s.ranges.iter().enumerate() {
            r.next.store(i * n_chunks / t, Ordering::Relaxed);
            r.end.store((i + 1) * n_chunks / t, Ordering::Relaxed);
        }
        let generation = (s.gate.load(Ordering::Relaxed) >> GEN_SHIFT) + 1;
        s.gate
            .store(generation << GEN_SHIFT | OPEN, Ordering::Release);
        for t in workers {
            t.unpark();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, 0)));
        let own_end = Instant::now();
        let own_chunks = *mine.as_ref().unwrap_or(&0);
        // Every chunk is claimed: later workers need not join, earlier ones may still run.
        let mut gate = s.gate.fetch_and(!OPEN, Ordering::AcqRel);
        let mut spins = 0u32;
        while gate & COUNT != 0 {
            if spins < SPINS_BEFORE_SLEEP {
                spins += 1;
                std::hint::spin_loop();
                gate = s.gate.load(Ordering::Acquire);
            } else {
                sleep_until_done(s);
                break;
            }
        }
        (mine, own_chunks, own_end)
    }
}

/// Sleeps until the workers still in the op have left it (the last one wakes us).
fn sleep_until_done(s: &Shared) {
    *s.sleeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
    let mut gate = s.gate.fetch_or(SLEEPER, Ordering::AcqRel);
    while gate & COUNT != 0 {
        std::thread::park();
        gate = s.gate.load(Ordering::Acquire);
    }
}

impl Pool {
    /// Runs `f(i, chunk, thread)` over the consecutive `chunk_len`-element chunks of `data`
    /// (the last may be shorter), in parallel.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        f: impl Fn(usize, &mut [T], usize) + Sync,
    ) {
        let len = data.len();
        let base = SharedMut(data.as_mut_ptr());
        self.run(len.div_ceil(chunk_len.max(1)), &|c, thread| {
            let base = &base;
            let start = c * chunk_len;
            let n = chunk_len.min(len - start);
            // SAFETY: chunk c covers [start, start + n) within `data`; chunks are disjoint and
            // each index c is run exactly once, so no two `&mut` slices alias.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
            f(c, chunk, thread)
        });
    }
}

/// A pointer into a slice that parallel chunks write at disjoint places.
pub(crate) struct SharedMut<T>(pub(crate) *mut T);
// SAFETY: users write disjoint elements only (see the SAFETY notes where it is used).
unsafe impl<T: Send> Sync for SharedMut<T> {}

/// Runs the chunks of this thread's range in order, then any left in the others' ranges;
/// returns how many it ran.
fn claim(s: &Shared, f: &(dyn Fn(usize, usize) + Sync), thread: usize) -> usize {
    let t = s.ranges.len();
    let mut ran = 0;
    for k in 0..t {
        let r = &s.ranges[(thread + k) % t];
        let end = r.end.load(Ordering::Relaxed);
        loop {
            let c = r.next.fetch_add(1, Ordering::Relaxed);
            if c >= end {
                break;
            }
            let t = s.stats.clock();
            f(c, thread);
            s.stats.chunk(t);
            ran += 1;
        }
    }
    ran
}

fn worker(s: &Shared, thread: usize) {
    let mut seen = 0u64;
    loop {
        join(s, &mut seen);
        // SAFETY: published by the opening of the gate we joined; `run` keeps the closure
        // alive until every joined worker has left.
        let job = unsafe { *s.job.get() };
        let f = unsafe { &*job.f };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, thread))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        let gate = s.gate.fetch_sub(1, Ordering::AcqRel);
        if gate & COUNT == 1 && gate & SLEEPER != 0 {
            if let Some(t) = &*s.sleeper.lock().unwrap_or_else(|e| e.into_inner()) {
                t.unpark();
            }
        }
    }
}

/// Waits (spinning, then parked) for an op after generation `seen` and joins it while its
/// gate is open; a closed one is skipped (the caller ran its chunks).
fn join(s: &Shared, seen: &mut u64) {
    let mut spins = 0u32;
    loop {
        let gate = s.gate.load(Ordering::Acquire);
        if gate >> GEN_SHIFT != *seen {
            if gate & OPEN == 0 {
                *seen = gate >> GEN_SHIFT;
            } else if s
                .gate
                .compare_exchange_weak(gate, gate + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                *seen = gate >> GEN_SHIFT;
                return;
            } else {
                continue;
            }
        }
        if spins < SPINS_BEFORE_PARK {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests;
