use std::sync::atomic::AtomicU32;

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

/// Values whose f32 sum depends on the order they are added in (magnitudes from 2⁻²⁰ to
/// 2²⁰, both signs).
fn order_sensitive_rows(rows: usize, len: usize) -> Vec<Vec<f32>> {
    let mut x = 0x9e37_79b9_u32;
    (0..rows)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let mag = 2f32.powi((x % 41) as i32 - 20);
                    if x & 1 << 31 == 0 {
                        mag
                    } else {
                        -mag * 1.5
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn results_do_not_depend_on_which_thread_runs_a_chunk() {
    let rows = order_sensitive_rows(96, 257);
    let serial: Vec<f32> = rows.iter().map(|r| r.iter().sum()).collect();
    // The data detects a changed order: summing each row backwards differs somewhere.
    let reversed: Vec<f32> = rows.iter().map(|r| r.iter().rev().sum()).collect();
    assert_ne!(bits(&serial), bits(&reversed));
    for n_threads in [1, 2, 3, 4] {
        let pool = Pool::new(n_threads);
        let mut assignments = std::collections::HashSet::new();
        for round in 0..60u64 {
            if round % 20 == 19 {
                // The solo path too (the policy's choice under load).
                pool.busy.lock().unwrap().force_solo(1);
            }
            let out: Vec<AtomicU32> = (0..rows.len()).map(|_| AtomicU32::new(0)).collect();
            let by: Vec<AtomicUsize> = (0..rows.len()).map(|_| AtomicUsize::new(0)).collect();
            pool.run(rows.len(), &|c, t| {
                // Uneven delays move chunks between threads from round to round.
                if (c as u64 * 7 + round * 3 + t as u64).is_multiple_of(11) {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                let s: f32 = rows[c].iter().sum();
                out[c].store(s.to_bits(), Ordering::Relaxed);
                by[c].store(t, Ordering::Relaxed);
            });
            let out: Vec<u32> = out.iter().map(|v| v.load(Ordering::Relaxed)).collect();
            assert_eq!(out, bits(&serial), "{n_threads} threads, round {round}");
            assignments.insert(
                by.iter()
                    .map(|t| t.load(Ordering::Relaxed))
                    .collect::<Vec<_>>(),
            );
        }
        if n_threads > 1 {
            assert!(
                assignments.len() > 1,
                "{n_threads} threads: the chunks always ran on the same threads"
            );
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_caller_waiting_for_a_slow_worker_sleeps_and_is_woken() {
    let pool = Pool::new(2);
    let worker_started = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    pool.run(2, &|c, t| {
        if t == 0 {
            // Give the worker (range [1, 2)) time to join and take chunk 1.
            let t0 = std::time::Instant::now();
            while !worker_started.load(Ordering::Acquire) && t0.elapsed().as_secs() < 5 {
                std::thread::yield_now();
            }
        } else {
            worker_started.store(true, Ordering::Release);
            // Far longer than the caller's spins: it must sleep and be woken.
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        done.fetch_add(1 + c, Ordering::Relaxed);
    });
    assert!(worker_started.load(Ordering::Acquire));
    assert_eq!(done.load(Ordering::Relaxed), 3);
    // The pool still runs ops afterwards.
    let n = AtomicUsize::new(0);
    pool.run(100, &|_, _| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 100);
}

/// The opt-in counters count only between start and stop: parallel ops with their wall
/// and busy time, ops of one chunk as run on the caller alone.
#[test]
fn stats_count_parallel_and_inline_ops_between_start_and_stop() {
    let pool = Pool::new(2);
    let sleep = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
    pool.run(8, &|_, _| sleep(1));
    pool.stats_start();
    pool.run(4, &|_, _| sleep(2));
    pool.run(1, &|_, _| sleep(1));
    let s = pool.stats_stop();
    assert_eq!(
        (s.parallel_ops, s.inline_ops, s.threads),
        (1, 1, 2),
        "{s:?}"
    );
    // Four chunks of 2 ms: at least 8 ms of chunks, at least 4 ms of wall on two threads,
    // and the chunks fit in the threads' time.
    assert!(s.busy_s >= 0.008, "{s:?}");
    assert!(s.parallel_s >= 0.004, "{s:?}");
    assert!(s.busy_s <= 2.0 * s.parallel_s, "{s:?}");
    assert!((0.0..=1.0).contains(&s.idle_share()), "{s:?}");
    assert!(s.inline_s >= 0.001, "{s:?}");
    // Stopped: nothing more is counted.
    pool.run(4, &|_, _| sleep(1));
    let none = pool.stats_stop();
    assert_eq!((none.parallel_ops, none.inline_ops), (0, 0), "{none:?}");
    assert_eq!(PoolStats::default().idle_share(), 0.0);
}
