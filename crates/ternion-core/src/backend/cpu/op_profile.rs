//! An opt-in wall-clock profile of the CPU forward pass, graph op by graph op (`ternion
//! bench --profile` on the CPU): where a decode step's time goes, the serial work between
//! the parallel ops included. Off (the default), a pass pays one relaxed load per op.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

/// Per graph op index: the calls and the nanoseconds collected.
static TIMES: Mutex<Vec<(u64, u128)>> = Mutex::new(Vec::new());

/// Starts collecting (forgetting anything collected before).
pub fn start() {
    TIMES.lock().unwrap_or_else(|e| e.into_inner()).clear();
    ON.store(true, Ordering::Relaxed);
}

/// Stops collecting and returns, per graph op index, the calls and the seconds spent in
/// them by every pass since [`start`] (ops never run: index past the end, or zero calls).
pub fn stop() -> Vec<(u64, f64)> {
    ON.store(false, Ordering::Relaxed);
    let times = std::mem::take(&mut *TIMES.lock().unwrap_or_else(|e| e.into_inner()));
    times
        .into_iter()
        .map(|(n, ns)| (n, ns as f64 / 1e9))
        .collect()
}

/// The start of an op while collecting.
pub(super) fn clock() -> Option<Instant> {
    ON.load(Ordering::Relaxed).then(Instant::now)
}

/// Adds the time since `start` (from [`clock`]) to op `op`.
pub(super) fn record(op: usize, start: Option<Instant>) {
    let Some(t) = start else { return };
    let ns = t.elapsed().as_nanos();
    let mut times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    if times.len() <= op {
        times.resize(op + 1, (0, 0));
    }
    times[op].0 += 1;
    times[op].1 += ns;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collected only between start and stop, per op index.
    #[test]
    fn collects_between_start_and_stop() {
        record(0, clock());
        start();
        record(2, clock());
        record(2, clock());
        let times = stop();
        record(1, clock());
        assert_eq!(times.len(), 3);
        assert_eq!((times[0].0, times[1].0, times[2].0), (0, 0, 2));
        assert!(times[2].1 >= 0.0);
        assert!(stop().is_empty());
    }
}
