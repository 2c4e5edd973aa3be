//! An opt-in wall-clock profile of the CPU forward pass, graph op by graph op (`ternion
//! bench --profile` on the CPU): where a decode step's time goes, the serial work between
//! the parallel ops included. It collects the passes the calling thread runs between
//! [`start`] and [`stop`] (a pass runs its ops on the thread that called it); off, the
//! default, a pass pays one thread-local check per op.

use std::cell::RefCell;
use std::time::Instant;

thread_local! {
    /// While collecting: per graph op index, the calls and the nanoseconds.
    static TIMES: RefCell<Option<Vec<(u64, u128)>>> = const { RefCell::new(None) };
}

/// Starts collecting this thread's passes (forgetting anything collected before).
pub fn start() {
    TIMES.with(|t| *t.borrow_mut() = Some(Vec::new()));
}

/// Stops collecting and returns, per graph op index, the calls and the seconds spent in
/// them by this thread's passes since [`start`] (empty when it was not collecting; ops
/// never run: past the end, or zero calls).
pub fn stop() -> Vec<(u64, f64)> {
    TIMES
        .with(|t| t.borrow_mut().take())
        .unwrap_or_default()
        .into_iter()
        .map(|(n, ns)| (n, ns as f64 / 1e9))
        .collect()
}

/// The start of an op while collecting.
pub(super) fn clock() -> Option<Instant> {
    TIMES.with(|t| t.borrow().is_some()).then(Instant::now)
}

/// Adds the time since `start` (from [`clock`]) to op `op`.
pub(super) fn record(op: usize, start: Option<Instant>) {
    let Some(s) = start else { return };
    let ns = s.elapsed().as_nanos();
    TIMES.with(|t| {
        if let Some(times) = t.borrow_mut().as_mut() {
            if times.len() <= op {
                times.resize(op + 1, (0, 0));
            }
            times[op].0 += 1;
            times[op].1 += ns;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collected only between start and stop, per op index, on the collecting thread.
    #[test]
    fn collects_between_start_and_stop_on_this_thread() {
        record(0, clock());
        start();
        let t = clock();
        std::thread::sleep(std::time::Duration::from_millis(2));
        record(2, t);
        record(2, clock());
        std::thread::spawn(|| record(1, clock())).join().unwrap();
        let times = stop();
        record(1, clock());
        assert_eq!(times.len(), 3);
        assert_eq!((times[0].0, times[1].0, times[2].0), (0, 0, 2));
        assert!(times[2].1 >= 0.002, "{times:?}");
        assert!(stop().is_empty());
    }
}
