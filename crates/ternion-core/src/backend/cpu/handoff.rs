//! How far apart decode's threads run: the time one cache line takes to pass from one of
//! the global pool's threads to another and back, halved (`ternion bench` prints it beside
//! the read bandwidth).
//!
//! Threads that share a last-level cache hand a line over in tens of nanoseconds; across
//! AMD CCDs or sockets it takes 100–200 ns. A VM's vCPUs may move between the two
//! placements while it runs, and they read memory differently: on a 2-vCPU Zen 4 EPYC the
//! probe read ~31–33 GB/s with its threads 34 ns apart and ~50 GB/s with them 162 ns apart
//! (two memory paths), where every handoff of a decode step (an op's start and end, the
//! outputs the other thread reads) costs five times more (BENCHMARKS.md, session 35).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::pool::{self, Pool};

/// Round trips of one measurement (each two handoffs).
const TRIPS: u64 = 2_000;
/// Measurements; the median counts.
const ROUNDS: usize = 5;
/// How long one thread waits for the other before the measurement is abandoned (the pool
/// ran both turns on one thread, or the other was descheduled).
const PATIENCE: Duration = Duration::from_millis(50);

/// The median over [`ROUNDS`] of the nanoseconds a cache line takes to pass between two
/// of the global pool's threads; `None` with one thread, or where the two did not run at
/// the same time.
pub fn handoff_ns() -> Option<f64> {
    let pool = pool::global();
    if pool.n_threads() < 2 {
        return None;
    }
    let mut ns = (0..ROUNDS)
        .map(|_| handoff_round(pool))
        .collect::<Option<Vec<f64>>>()?;
    ns.sort_by(f64::total_cmp);
    Some(ns[ROUNDS / 2])
}

/// One measurement: two tasks of one parallel op take turns on a counter, the first
/// writing odd values after the even ones the second writes, and the first times the
/// handoffs after the second's first answer (so that its start-up does not count).
fn handoff_round(pool: &Pool) -> Option<f64> {
    let turn = AtomicU64::new(0);
    let gave_up = AtomicBool::new(false);
    let timed = AtomicU64::new(0);
    let last = 2 * TRIPS;
    pool.run(2, &|player, _| {
        let start = Instant::now();
        let mut first_answer = None;
        let mut v = player as u64;
        while v < last {
            if !wait_for(&turn, v, &gave_up, start) {
                return;
            }
            if player == 0 && v == 2 {
                first_answer = Some(Instant::now());
            }
            turn.store(v + 1, Ordering::Release);
            v += 2;
        }
        if let Some(t) = first_answer.filter(|_| wait_for(&turn, last, &gave_up, start)) {
            let per = t.elapsed().as_secs_f64() * 1e9 / (last - 2) as f64;
            timed.store(per.to_bits(), Ordering::Relaxed);
        }
    });
    let per = f64::from_bits(timed.load(Ordering::Relaxed));
    (!gave_up.load(Ordering::Relaxed) && per > 0.0).then_some(per)
}

/// Spins until `turn` holds `v`; false (and `gave_up` set) once either thread has waited
/// longer than [`PATIENCE`] since `start`.
fn wait_for(turn: &AtomicU64, v: u64, gave_up: &AtomicBool, start: Instant) -> bool {
    let mut spins = 0u32;
    while turn.load(Ordering::Acquire) != v {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256)
            && (gave_up.load(Ordering::Relaxed) || start.elapsed() > PATIENCE)
        {
            gave_up.store(true, Ordering::Relaxed);
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_hand_a_line_over_or_say_they_could_not() {
        let pool = Pool::new(2);
        // Whether the two tasks overlap depends on the machine's load: either a time
        // between the fastest handoff hardware does (a few ns) and one that would mean the
        // threads were descheduled mid-measurement, or `None` after the patience ran out
        // on the thread that waited.
        let start = Instant::now();
        match handoff_round(&pool) {
            Some(ns) => assert!((1.0..100_000.0).contains(&ns), "{ns}"),
            None => assert!(start.elapsed() >= PATIENCE),
        }
    }

    #[test]
    fn one_thread_running_both_turns_gives_up_instead_of_hanging() {
        let pool = Pool::new(1);
        let start = Instant::now();
        assert_eq!(handoff_round(&pool), None);
        assert!(start.elapsed() >= PATIENCE);
        assert!(start.elapsed() < 20 * PATIENCE);
    }
}
