//! A thread pool whose workers spin between jobs, for decode, that steps aside when the
//! machine is busy.
//!
//! One decoded token runs about ten parallel regions per layer (the matmuls, attention, the
//! GLU), each only microseconds of work. Rayon's idle workers go to sleep between them, so
//! every region pays a futex wake-up and a join, which on two threads cost about as much as
//! the work. ggml's threads spin on a barrier instead; this pool does the same: its workers
//! poll for the next job for [`SPIN`] and only then sleep, and the caller works on the job
//! too. Tasks are handed out one at a time from a shared counter, so uneven tasks balance.
//!
//! A barrier is a trap when the cores are shared (another process, another model): a worker
//! that does not get its core holds every region up for a scheduler time slice, and decode
//! fell from 50 to 5 tokens/s with one of two cores busy. So:
//! - the caller waits only for tasks a worker has *claimed*: a worker that is not running
//!   when a job comes takes none of it, and the caller does the rest itself;
//! - a caller that still has to wait spins briefly and then parks, freeing its core for the
//!   worker it waits for;
//! - an idle worker that notices it was descheduled while polling sleeps at once;
//! - the pool measures each job (its wall time against the caller's own task rate, which is
//!   what running alone would cost) and, when the workers do not pay for themselves over a
//!   window of jobs, runs jobs on the caller alone for a while, then tries again (the pause
//!   doubles while the machine stays busy);
//! - a pool is shared by every engine of a process with the same thread count
//!   ([`CpuPool::shared`]), and a job that finds the pool busy with another engine's job
//!   runs on its caller alone instead of queueing or adding threads.
//!
//! None of this changes a result: a task computes the same values on whichever thread runs
//! it, and a job's tasks write disjoint outputs.
//!
//! The engine installs a pool around each forward pass ([`SpinPool::install`]); [`par_for`]
//! uses it when one is installed on the calling thread and falls back to rayon otherwise.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next job before it sleeps: longer than the serial
/// work between two regions of a decode step (norms, rope: tens of microseconds), short
/// enough that an idle server does not keep cores busy.
const SPIN: Duration = Duration::from_micros(500);

/// A gap this long between two looks at the clock of a polling worker means the thread was
/// descheduled (a time slice is milliseconds; interrupts are microseconds).
const PREEMPTED: Duration = Duration::from_micros(200);

/// How long a caller spins for claimed tasks to finish before it parks.
const WAIT_SPIN: Duration = Duration::from_micros(50);

/// Jobs per measuring window.
const WINDOW: u32 = 64;

/// The speed-up (the caller's solo time estimate over the job's wall time, summed over a
/// window) below which the workers are not worth waking.
const MIN_SPEEDUP: f64 = 1.15;

/// The first and the longest pause from parallel jobs once the workers did not pay.
const SOLO_MIN: Duration = Duration::from_millis(20);
const SOLO_MAX: Duration = Duration::from_secs(1);

/// The task function of the job being run. It lives on the stack of [`SpinPool::run`], which
/// does not return before every claimed task is done.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// The job being handed out: `(generation << 32) | tasks not yet claimed`. A claim is a
    /// compare-and-swap that takes task `left - 1` of that generation; no task is left once
    /// the caller is done, so a late worker claims nothing and never touches an old job.
    claim: AtomicU64,
    /// The current job; stable while any task of the current generation is unfinished.
    job: AtomicPtr<Job<'static>>,
    /// Tasks in the current job, and how many of them are finished.
    n: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers asleep on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The caller, when it parked waiting for `done` (the last task's worker unparks it).
    waiting: AtomicBool,
    waiter: Mutex<Option<Thread>>,
}

impl Shared {
    /// Claims and runs tasks of the published job until none is left; returns how many.
    fn work(&self) -> usize {
        let mut ran = 0;
        let mut w = self.claim.load(Ordering::Acquire);
        loop {
            let left = w & 0xffff_ffff;
            if left == 0 {
                return ran;
            }
            match self
                .claim
                .compare_exchange_weak(w, w - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Err(now) => w = now,
                Ok(_) => {
                    // SAFETY: task `left - 1` is claimed and not yet finished, so the caller
                    // that published this generation is still inside `run`, its job alive.
                    let job = unsafe { &*self.job.load(Ordering::Acquire) };
                    if catch_unwind(AssertUnwindSafe(|| (job.f)(left as usize - 1))).is_err() {
                        self.panicked.store(true, Ordering::Relaxed);
                    }
                    ran += 1;
                    let n = self.n.load(Ordering::Relaxed);
                    if self.done.fetch_add(1, Ordering::SeqCst) + 1 == n
                        && self.waiting.load(Ordering::SeqCst)
                    {
                        if let Some(t) = self
                            .waiter
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .as_ref()
                        {
                            t.unpark();
                        }
                    }
                    w = self.claim.load(Ordering::Acquire);
                }
            }
        }
    }
}

/// Whether to wake the workers, from how the last jobs went.
#[derive(Debug)]
struct Adapt {
    /// Parallel jobs measured in this window: their wall time and the caller's estimate of
    /// the time it would have taken alone.
    jobs: u32,
    wall: Duration,
    solo_estimate: Duration,
    /// Jobs run on the caller alone until then.
    solo_until: Option<Instant>,
    /// The next pause.
    backoff: Duration,
    /// Decisions so far (tests and logs).
    pauses: u64,
}

impl Adapt {
    fn new() -> Adapt {
        Adapt {
            jobs: 0,
            wall: Duration::ZERO,
            solo_estimate: Duration::ZERO,
            solo_until: None,
            backoff: SOLO_MIN,
            pauses: 0,
        }
    }

    fn solo(&mut self, now: Instant) -> bool {
        match self.solo_until {
            Some(t) if now < t => true,
            Some(_) => {
                self.solo_until = None;
                false
            }
            None => false,
        }
    }

    /// One parallel job: `n` tasks in `wall`, of which the caller ran `mine` in `busy`.
    fn record(&mut self, now: Instant, n: usize, mine: usize, busy: Duration, wall: Duration) {
        if mine == 0 {
            return;
        }
        self.jobs += 1;
        self.wall += wall;
        self.solo_estimate += busy * n as u32 / mine as u32;
        if self.jobs < WINDOW {
            return;
        }
        let speedup = self.solo_estimate.as_secs_f64() / self.wall.as_secs_f64().max(1e-9);
        if speedup < MIN_SPEEDUP {
            self.solo_until = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(SOLO_MAX);
            self.pauses += 1;
        } else {
            self.backoff = SOLO_MIN;
        }
        self.jobs = 0;
        self.wall = Duration::ZERO;
        self.solo_estimate = Duration::ZERO;
    }
}

/// `threads - 1` spinning workers; the thread that runs a job is the last one.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held by the caller of the job being run; a second caller runs alone.
    busy: Mutex<(u32, Adapt)>,
}

thread_local! {
    /// The pool installed on this thread, and whether this thread is inside one of its jobs
    /// (a nested region then runs serially rather than waiting on itself).
    static CURRENT: Cell<*const SpinPool> = const { Cell::new(std::ptr::null()) };
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Threads this process may run on at once: the CPUs in its affinity mask, capped by a
/// cgroup CPU quota (what `std::thread::available_parallelism` reads on Linux); 1 when that
/// cannot be read. The default thread count of engines and quantization.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl SpinPool {
    /// A pool that runs jobs on `threads` threads (the caller and `threads - 1` workers).
    pub fn new(threads: usize) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            n: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            waiting: AtomicBool::new(false),
            waiter: Mutex::new(None),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("smelt-spin-{i}"))
                    .spawn(move || worker(&s))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(SpinPool {
            shared,
            workers,
            busy: Mutex::new((0, Adapt::new())),
        })
    }

    /// Threads a job runs on.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// How many times the pool has paused its workers because they did not pay.
    pub fn pauses(&self) -> u64 {
        self.busy.lock().unwrap_or_else(|e| e.into_inner()).1.pauses
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
    /// done. A panic in a task is raised here once every claimed task has finished.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() || IN_JOB.with(Cell::get) {
            (0..n).for_each(f);
            return;
        }
        // Another engine's job holds the workers: run alone rather than queue.
        let mut busy = match self.busy.try_lock() {
            Ok(b) => b,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                serial(n, f);
                return;
            }
        };
        let (generation, adapt) = &mut *busy;
        let start = Instant::now();
        if adapt.solo(start) {
            serial(n, f);
            return;
        }
        // More tasks than a claim word holds run as several jobs.
        let mut base = 0;
        while base < n {
            let m = (n - base).min(u32::MAX as usize);
            let g = |i: usize| f(base + i);
            self.run_job(generation, adapt, m, &g);
            base += m;
        }
        drop(busy);
        if self.shared.panicked.swap(false, Ordering::Relaxed) {
            resume_unwind(Box::new("a task of a SpinPool job panicked"));
        }
    }

    fn run_job(
        &self,
        generation: &mut u32,
        adapt: &mut Adapt,
        n: usize,
        f: &(dyn Fn(usize) + Sync),
    ) {
        let s = &*self.shared;
        let job = Job { f };
        *generation = generation.wrapping_add(1);
        s.n.store(n, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        // SAFETY (of the lifetime erasure): the pointer is read only by a worker holding a
        // claimed, unfinished task of this generation, and this function does not return
        // (the job does not leave the stack) until every task is finished.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        s.job.store(ptr, Ordering::Release);
        let start = Instant::now();
        s.claim
            .store(u64::from(*generation) << 32 | n as u64, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_JOB.with(|c| c.set(true));
        let mine = s.work();
        IN_JOB.with(|c| c.set(false));
        let busy = start.elapsed();
        // Wait for the tasks workers claimed: spin a little, then park so that a worker
        // waiting for a core can have this one.
        if s.done.load(Ordering::Acquire) != n {
            let spin_start = Instant::now();
            let mut spins = 0u32;
            while s.done.load(Ordering::Acquire) != n {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) && spin_start.elapsed() > WAIT_SPIN {
                    *s.waiter.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(std::thread::current());
                    s.waiting.store(true, Ordering::SeqCst);
                    while s.done.load(Ordering::SeqCst) != n {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                    s.waiting.store(false, Ordering::SeqCst);
                    break;
                }
            }
        }
        let wall = start.elapsed();
        s.job.store(std::ptr::null_mut(), Ordering::Release);
        adapt.record(Instant::now(), n, mine, busy, wall);
    }
}

/// A job on the calling thread alone (nested regions inside it run serially too).
fn serial(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let was = IN_JOB.with(|c| c.replace(true));
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_JOB.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(was);
    (0..n).for_each(f);
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // A generation no caller uses, with no task, moves every worker off its wait.
        self.shared.claim.fetch_add(1 << 32, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn generation_of(w: u64) -> u64 {
    w >> 32
}

fn worker(s: &Shared) {
    IN_JOB.with(|c| c.set(true));
    let mut seen = generation_of(s.claim.load(Ordering::SeqCst));
    loop {
        // Checked first: a pool dropped before this thread started has already moved the
        // generation this thread just read.
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        // Poll, then sleep until a new job (a new generation) is published. A thread that
        // was descheduled while polling sleeps at once: its core is wanted elsewhere.
        let start = Instant::now();
        let mut last = start;
        let mut spins = 0u32;
        while generation_of(s.claim.load(Ordering::SeqCst)) == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                continue;
            }
            let now = Instant::now();
            if now - start > SPIN || now - last > PREEMPTED {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                while generation_of(s.claim.load(Ordering::SeqCst)) == seen
                    && !s.stop.load(Ordering::SeqCst)
                {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            last = now;
        }
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        seen = generation_of(s.claim.load(Ordering::SeqCst));
        s.work();
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

/// The threads an engine computes on: a rayon pool (prefill, batched steps) and a spinning
/// pool (decode regions), both of one size.
pub struct CpuPool {
    pub rayon: rayon::ThreadPool,
    pub spin: SpinPool,
}

impl CpuPool {
    /// The pool of `threads` threads (default: [`default_threads`]) that every engine of this
    /// process with that count shares, made on first use and dropped with its last engine:
    /// two models served together take turns on one set of cores instead of each starting
    /// a thread per core.
    pub fn shared(threads: Option<usize>) -> std::io::Result<Arc<CpuPool>> {
        static POOLS: Mutex<Vec<(usize, Weak<CpuPool>)>> = Mutex::new(Vec::new());
        let threads = threads.unwrap_or_else(default_threads).max(1);
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = pools
            .iter()
            .find(|(t, _)| *t == threads)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(p);
        }
        let rayon = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("smelt-cpu-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let pool = Arc::new(CpuPool {
            rayon,
            spin: SpinPool::new(threads)?,
        });
        pools.push((threads, Arc::downgrade(&pool)));
        Ok(pool)
    }

    /// Threads a job runs on.
    pub fn threads(&self) -> usize {
        self.spin.threads()
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

    /// Several threads sharing one pool (several models in one server): every job is
    /// complete, whoever gets the workers.
    #[test]
    fn callers_on_several_threads_share_one_pool() {
        let pool = SpinPool::new(3).unwrap();
        std::thread::scope(|sc| {
            for t in 0..3 {
                let pool = &pool;
                sc.spawn(move || {
                    for k in 0..300 {
                        let n = 1 + (t * 7 + k) % 40;
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        pool.run(n, &|i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    /// A worker that cannot finish its claimed task for a while (as when it loses its core)
    /// holds that job up, and the caller, parked, is woken when it finishes.
    #[test]
    fn the_caller_waits_for_a_slow_claimed_task() {
        let pool = SpinPool::new(2).unwrap();
        let slow_ran = AtomicBool::new(false);
        for _ in 0..20 {
            pool.run(4, &|i| {
                if i == 3 {
                    std::thread::sleep(Duration::from_millis(3));
                    slow_ran.store(true, Ordering::SeqCst);
                }
            });
            assert!(slow_ran.swap(false, Ordering::SeqCst));
        }
    }

    /// Jobs whose parallel wall time is no better than the caller alone pause the workers;
    /// fast parallel jobs do not.
    #[test]
    fn workers_that_do_not_pay_are_paused() {
        let mut a = Adapt::new();
        let t0 = Instant::now();
        let us = Duration::from_micros;
        // Two threads, each half: speed-up 2, no pause.
        for _ in 0..WINDOW {
            a.record(t0, 8, 4, us(40), us(42));
        }
        assert_eq!(a.pauses, 0);
        assert!(!a.solo(t0));
        // A descheduled worker: the caller did 7 of 8 tasks and still waited a slice.
        for _ in 0..WINDOW {
            a.record(t0, 8, 7, us(70), us(3000));
        }
        assert_eq!(a.pauses, 1);
        assert!(a.solo(t0 + SOLO_MIN / 2));
        assert!(!a.solo(t0 + SOLO_MIN * 2));
        // Still bad: the next pause is twice as long.
        for _ in 0..WINDOW {
            a.record(t0, 8, 8, us(80), us(80));
        }
        assert_eq!(a.pauses, 2);
        assert!(a.solo(t0 + SOLO_MIN * 3 / 2));
        assert!(!a.solo(t0 + SOLO_MIN * 3));
    }

    /// A pool dropped at once, before its workers have started, still joins them.
    #[test]
    fn a_pool_dropped_at_once_stops_its_workers() {
        for _ in 0..200 {
            drop(SpinPool::new(3).unwrap());
        }
        for _ in 0..50 {
            let pool = SpinPool::new(2).unwrap();
            pool.run(4, &|_| {});
        }
    }

    #[test]
    fn engines_with_one_thread_count_share_one_pool() {
        let a = CpuPool::shared(Some(2)).unwrap();
        let b = CpuPool::shared(Some(2)).unwrap();
        let c = CpuPool::shared(Some(1)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!((a.threads(), c.threads()), (2, 1));
        let d = CpuPool::shared(None).unwrap();
        assert_eq!(d.threads(), default_threads());
    }
}
