//! The CPU worker pool: threads started once, woken for each parallel op, never spawned per
//! token, and no heap allocation per op.
//!
//! An op is split into numbered chunks (blocks of weight rows, attention heads). Each thread
//! owns a contiguous range of chunks (a static row partition: every thread streams its own
//! stretch of the weights, which keeps the hardware prefetchers effective) and takes them
//! in order; a thread that finishes early takes the remaining chunks of the others, so a
//! descheduled thread does not stall the op. Every output element is computed inside
//! exactly one chunk by the same code whatever thread runs it, so results are identical for
//! any thread count.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

/// Spins before a waiting worker parks (each spin is one `spin_loop` hint).
const SPINS_BEFORE_PARK: u32 = 20_000;

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
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    ranges: Vec<Range>,
    active: AtomicUsize,
    panicked: AtomicBool,
    workers: OnceLock<Vec<Thread>>,
}

// SAFETY: `job` is written only by the thread inside `Pool::run` while no worker reads it
// (all workers have finished the previous generation), and read by workers only after the
// generation bump that publishes it (Release/Acquire).
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw closure pointer is only dereferenced while `run` keeps it alive.
unsafe impl Send for Shared {}

/// A fixed set of worker threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    n_threads: usize,
    busy: std::sync::Mutex<()>,
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

/// The global pool (all available cores unless [`init`] said otherwise).
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
            n_threads
        };
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: &NOOP as &(dyn Fn(usize, usize) + Sync),
            }),
            ranges: (0..n_threads.max(1))
                .map(|_| Range {
                    next: AtomicUsize::new(0),
                    end: AtomicUsize::new(0),
                })
                .collect(),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            workers: OnceLock::new(),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ternion-worker-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("starting a worker thread")
                    .thread()
                    .clone()
            })
            .collect();
        shared.workers.set(workers).ok();
        Pool {
            shared,
            n_threads: n_threads.max(1),
            busy: std::sync::Mutex::new(()),
        }
    }

    /// Threads that work on an op (workers plus the caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(chunk, thread)` for every chunk in `0..n_chunks`, in parallel, and returns
    /// when all are done; `thread` (in `0..n_threads()`) names the thread running the chunk,
    /// so callers can give each thread its own scratch. A panic inside `f` is re-raised here.
    pub fn run(&self, n_chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n_threads == 1 || n_chunks <= 1 {
            (0..n_chunks).for_each(|c| f(c, 0));
            return;
        }
        // One op at a time (sessions on several threads share the pool).
        let _guard = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let workers = s.workers.get().expect("set in new");
        // SAFETY: no worker reads `job` now: each finished the previous generation (we
        // waited for `active == 0`), and the next read happens after the bump below.
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
        s.active.store(workers.len(), Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        for t in workers {
            t.unpark();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, 0)));
        let mut spins = 0u32;
        while s.active.load(Ordering::Acquire) != 0 {
            if spins < SPINS_BEFORE_PARK {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a worker thread panicked inside a parallel op");
        }
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

/// Runs the chunks of this thread's range in order, then any left in the others' ranges.
fn claim(s: &Shared, f: &(dyn Fn(usize, usize) + Sync), thread: usize) {
    let t = s.ranges.len();
    for k in 0..t {
        let r = &s.ranges[(thread + k) % t];
        let end = r.end.load(Ordering::Relaxed);
        loop {
            let c = r.next.fetch_add(1, Ordering::Relaxed);
            if c >= end {
                break;
            }
            f(c, thread);
        }
    }
}

fn worker(s: &Shared, thread: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if spins < SPINS_BEFORE_PARK {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
        // SAFETY: published by the generation bump we just observed; `run` keeps the
        // closure alive until `active` reaches zero.
        let job = unsafe { *s.job.get() };
        let f = unsafe { &*job.f };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, thread))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.active.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once() {
        let pool = Pool::new(3);
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|c, t| {
                    assert!(t < 3);
                    hits[c].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                "n={n}"
            );
        }
    }

    #[test]
    fn panics_reach_the_caller() {
        let pool = Pool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, &|c, _| assert!(c != 63, "boom"));
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(10, &|_, _| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }
}
