//! A thread pool whose workers spin between jobs, for decode.
//!
//! One decoded token runs about ten parallel regions per layer (the matmuls, attention, the
//! GLU), each only microseconds of work. Rayon's idle workers go to sleep between them, so
//! every region pays a futex wake-up and a join, which on two threads cost about as much as
//! the work. ggml's threads spin on a barrier instead; this pool does the same: its workers
//! poll for the next job for [`SPIN`] and only then sleep, and the caller works on the job
//! too. Tasks are handed out one at a time from a shared counter, so uneven tasks balance.
//!
//! The engine installs a pool around each forward pass ([`SpinPool::install`]); [`par_for`]
//! uses it when one is installed on the calling thread and falls back to rayon otherwise.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next job before it sleeps: longer than the serial
/// work between two regions of a decode step (norms, rope: tens of microseconds), short
/// enough that an idle server does not keep cores busy.
const SPIN: Duration = Duration::from_micros(500);

/// One job: `f(0..n)`, tasks claimed from `next`.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    /// Workers that have not finished with this job (the caller waits for zero before the
    /// job, which lives on its stack, goes away).
    attached: AtomicUsize,
    panicked: AtomicBool,
}

impl Job<'_> {
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| (self.f)(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
    }
}

struct Shared {
    /// Bumped (SeqCst) for every job and at shutdown.
    epoch: AtomicU64,
    /// The current job (`Job<'static>` in name only: see [`SpinPool::run`]).
    job: AtomicPtr<Job<'static>>,
    stop: AtomicBool,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// `threads - 1` spinning workers; the thread that runs a job is the last one.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

thread_local! {
    /// The pool installed on this thread, and whether this thread is inside one of its jobs
    /// (a nested region then runs serially rather than waiting on itself).
    static CURRENT: Cell<*const SpinPool> = const { Cell::new(std::ptr::null()) };
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl SpinPool {
    /// A pool that runs jobs on `threads` threads (the caller and `threads - 1` workers).
    pub fn new(threads: usize) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            stop: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("smelt-spin-{i}"))
                    .spawn(move || worker(&s))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(SpinPool { shared, workers })
    }

    /// Threads a job runs on.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `body` with this pool installed on the calling thread: [`par_for`] inside it
    /// (on this thread) uses the pool.
    /// `SMELT_NO_SPIN=1` leaves it uninstalled (everything on rayon), for A/B runs: the
    /// bits are the same either way.
    pub fn install<R>(&self, body: impl FnOnce() -> R) -> R {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *OFF.get_or_init(|| std::env::var_os("SMELT_NO_SPIN").is_some_and(|v| v == "1")) {
            return body();
        }
        struct Restore(*const SpinPool);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(self)));
        body()
    }

    /// `f(i)` for every `i` in `0..n`, spread over the pool's threads; returns when all are
    /// done. A panic in a task is raised here once every thread has let go of the job.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() || IN_JOB.with(Cell::get) {
            (0..n).for_each(f);
            return;
        }
        let job = Job {
            f,
            n,
            next: AtomicUsize::new(0),
            attached: AtomicUsize::new(self.workers.len()),
            panicked: AtomicBool::new(false),
        };
        // SAFETY (of the lifetime erasure): the pointer is published for this call only; the
        // workers touch the job only between reading it and decrementing `attached`, and this
        // function does not return (the job does not leave the stack) until `attached` is 0.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        self.shared.job.store(ptr, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        IN_JOB.with(|c| c.set(true));
        job.work();
        IN_JOB.with(|c| c.set(false));
        while job.attached.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        self.shared
            .job
            .store(std::ptr::null_mut(), Ordering::SeqCst);
        if job.panicked.load(Ordering::Relaxed) {
            resume_unwind(Box::new("a task of a SpinPool job panicked"));
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared) {
    IN_JOB.with(|c| c.set(true));
    // Zero, not a fresh load: a job may be published before this thread gets to run.
    let mut seen = 0;
    loop {
        // Poll, then sleep until the epoch moves.
        let start = Instant::now();
        let mut spins = 0u32;
        while s.epoch.load(Ordering::SeqCst) == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
                break;
            }
        }
        seen = s.epoch.load(Ordering::SeqCst);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let ptr = s.job.load(Ordering::SeqCst);
        // SAFETY: a new epoch with no stop means `run` published a job and is waiting for
        // this worker's detach before it returns; the epoch cannot move again before that.
        let job = unsafe { &*ptr };
        job.work();
        job.attached.fetch_sub(1, Ordering::Release);
    }
}

/// `f(i)` for `i` in `0..n` on the pool installed on this thread ([`SpinPool::install`]),
/// else on rayon's current pool.
pub fn par_for(n: usize, f: impl Fn(usize) + Sync) {
    if IN_JOB.with(Cell::get) {
        (0..n).for_each(f);
        return;
    }
    let pool = CURRENT.with(Cell::get);
    if pool.is_null() {
        use rayon::prelude::*;
        (0..n).into_par_iter().for_each(&f);
    } else {
        // SAFETY: `install` keeps the pool alive (it borrows it) while the pointer is set.
        unsafe { &*pool }.run(n, &f);
    }
}

/// Threads of the pool installed on this thread, else rayon's.
pub fn current_threads() -> usize {
    let pool = CURRENT.with(Cell::get);
    if pool.is_null() {
        rayon::current_num_threads()
    } else {
        // SAFETY: as in `par_for`.
        unsafe { &*pool }.threads()
    }
}

/// A mutable slice that tasks write disjoint parts of.
pub struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks take disjoint ranges (the caller's contract on `range`).
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        Disjoint {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// `s[start..end]` (clamped to the slice).
    ///
    /// # Safety
    /// No two live results overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range(&self, start: usize, end: usize) -> &mut [T] {
        let end = end.min(self.len);
        let start = start.min(end);
        std::slice::from_raw_parts_mut(self.ptr.add(start), end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = SpinPool::new(3).unwrap();
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                "n {n}"
            );
        }
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_job() {
        let pool = SpinPool::new(2).unwrap();
        std::thread::sleep(SPIN * 4);
        let sum = AtomicUsize::new(0);
        pool.run(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }

    #[test]
    fn par_for_uses_the_installed_pool_and_nests_serially() {
        let pool = SpinPool::new(2).unwrap();
        let count = AtomicUsize::new(0);
        pool.install(|| {
            assert_eq!(current_threads(), 2);
            par_for(8, |_| {
                par_for(4, |_| {
                    count.fetch_add(1, Ordering::Relaxed);
                });
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 32);
        par_for(5, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 37);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_goes_on() {
        let pool = SpinPool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|i| assert!(i != 11, "task 11"));
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(16, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 16);
    }

    #[test]
    fn disjoint_ranges_write_one_slice() {
        let pool = SpinPool::new(2).unwrap();
        let mut v = vec![0usize; 103];
        let d = Disjoint::new(&mut v);
        pool.run(11, &|c| {
            // SAFETY: task c owns [10c, 10c + 10).
            for (k, x) in unsafe { d.range(c * 10, c * 10 + 10) }
                .iter_mut()
                .enumerate()
            {
                *x = c * 10 + k;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i));
    }
}
