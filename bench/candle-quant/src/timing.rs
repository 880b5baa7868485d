//! Best-of-N wall-clock timing.

use std::time::Instant;

/// Runs `f` once to warm caches, page tables and thread pools, then `runs` more times, and
/// returns the fastest timed run in milliseconds with the warm-up's result (the outputs of
/// the timed runs are dropped outside the timed region).
pub fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let first = f();
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let out = f();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(out);
        best = best.min(ms);
    }
    (best, first)
}
