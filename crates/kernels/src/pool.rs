//! One persistent thread pool for every kernel: `n - 1` parked worker threads plus the caller.
//!
//! [`ThreadPool::parallel_for`]`(n_tasks, f)` runs `f(0) .. f(n_tasks - 1)`, each exactly once,
//! spread over the workers and the calling thread, and returns when all have finished. Tasks
//! are claimed one at a time from a shared atomic counter, so uneven tasks balance themselves;
//! callers cut work into a few tasks per thread.
//!
//! Design and invariants:
//! * **No per-op spawning.** Workers are spawned once and wait for the next job: they spin
//!   briefly (ops in a forward pass follow each other within microseconds) and then park on a
//!   condvar, so an idle server costs nothing.
//! * **The caller never waits for a thread that is not working.** On a busy machine a worker
//!   may not be scheduled for milliseconds; so workers *join* a job (a CAS on the `state`
//!   word: epoch, closed bit, joined count) before touching it, and once no task is left to
//!   claim the caller *closes* the job and waits only for the workers that joined. A worker
//!   that wakes up late finds the job closed and never touches it.
//! * **Borrowed closures, no `'static`.** The job is a `&dyn Fn(usize) + Sync` whose lifetime
//!   is erased while workers run it. This is sound because `parallel_for` does not return —
//!   not even by unwinding — until every worker that joined has incremented `finished` after
//!   its last touch of the closure (Release), which the caller observes (Acquire) before the
//!   borrow ends; and no worker can join after the caller closed the job. Publishing the job
//!   happens-before workers read it: the caller stores the job pointer and task count before
//!   the new epoch (Release); a worker joins by CAS (Acquire) before loading them.
//! * **Cheap hand-off.** The polled words (`state`, `next`, `finished`) sit on their own cache
//!   lines; no mutex is taken per job unless a worker is parked.
//! * **One job at a time.** A `submit` mutex serialises jobs. A call that finds the pool busy —
//!   a nested `parallel_for` from inside a task, or a second thread calling concurrently —
//!   runs all its tasks on the calling thread instead of waiting, so nesting never deadlocks.
//! * **Panics.** A panicking task stops the thread that ran it from claiming more tasks; the
//!   other threads finish theirs; then `parallel_for` re-raises the first panic on the calling
//!   thread (after all workers are done with the closure). Some tasks may then not have run.
//!   The pool stays usable.
//!
//! [`global()`] is the process-wide pool (threads = available cores unless
//! [`set_num_threads`] ran first); [`ThreadPool::new`] makes private pools (tests, benches).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker spins for the next job before it parks. Ops of a forward pass follow
/// each other within microseconds, so a worker stays hot through a step; a longer spin only
/// burns CPU that, on a busy machine, the caller's own thread may need.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(100);
/// `pause`s between two clock reads while spinning.
const SPINS_PER_CLOCK_READ: u32 = 64;

/// Spins (a `pause` each call) until [`SPIN_BEFORE_PARK`] has passed since the first clock
/// read; then returns `false`.
struct Spinner {
    start: Option<Instant>,
    spins: u32,
}

impl Spinner {
    fn new() -> Self {
        Spinner {
            start: None,
            spins: 0,
        }
    }

    fn spin(&mut self) -> bool {
        std::hint::spin_loop();
        self.spins += 1;
        if self.spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
            let start = *self.start.get_or_insert_with(Instant::now);
            return start.elapsed() < SPIN_BEFORE_PARK;
        }
        true
    }
}

/// The closure of a job, as a thin pointer to the caller's `&dyn Fn` (which lives on the
/// caller's stack for the whole `parallel_for`).
type JobRef<'a> = &'a (dyn Fn(usize) + Sync + 'a);

/// Bits of [`Shared::state`]: `epoch << EPOCH_SHIFT | CLOSED? | joined workers`.
const JOINED_MASK: u64 = 0xFFFF;
const CLOSED: u64 = 1 << 16;
const EPOCH_SHIFT: u32 = 17;

/// A value on its own cache line (two, against adjacent-line prefetch), so threads polling one
/// counter do not slow down writers of another.
#[repr(align(128))]
struct Padded<T>(T);

/// State shared by the pool's threads.
struct Shared {
    /// The current job's epoch, whether it is closed to new workers, and how many joined.
    /// A new epoch (Release) publishes a job; workers join by CAS while it is open.
    state: Padded<AtomicU64>,
    /// Next task index to claim.
    next: Padded<AtomicUsize>,
    /// Workers that joined the current job and finished with it (Release).
    finished: Padded<AtomicUsize>,
    /// The current job: a pointer to the caller's `JobRef`, and the task count. Written before
    /// the epoch is published, read only by workers that joined it.
    job: AtomicPtr<()>,
    n_tasks: AtomicUsize,
    /// Workers parked (or about to park) on `wake`; `sleep` is only for the condvar.
    parked: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// The first panic of the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
}

/// A persistent pool of `num_threads - 1` workers; the thread calling
/// [`parallel_for`](Self::parallel_for) is the remaining one.
pub struct ThreadPool {
    shared: Arc<Shared>,
    submit: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
    num_threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("num_threads", &self.num_threads)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Tasks never run while a pool mutex is held, so poisoning cannot leave broken state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ThreadPool {
    /// A pool running jobs on `num_threads` threads (at least 1, at most 65536): the caller
    /// and `num_threads - 1` new workers.
    pub fn new(num_threads: usize) -> ThreadPool {
        let num_threads = num_threads.clamp(1, JOINED_MASK as usize + 1);
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(CLOSED)),
            next: Padded(AtomicUsize::new(0)),
            finished: Padded(AtomicUsize::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            n_tasks: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..num_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("tokenmill-worker-{i}"))
                    .spawn(move || worker_loop(&shared, i))
                    .expect("spawn a pool worker")
            })
            .collect();
        ThreadPool {
            shared,
            submit: Mutex::new(()),
            workers,
            num_threads,
        }
    }

    /// Threads that run a job, the caller included.
    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    /// Returns once every worker has started and run a task (or after about a second, on a
    /// machine too busy to schedule them all). Thread start-up — allocations included — then
    /// lies behind the caller: call it before a latency-critical or measured phase (a
    /// zero-allocation steady state, a benchmark).
    pub fn warm_up(&self) {
        let n = self.num_threads;
        let deadline = Instant::now() + Duration::from_secs(1);
        let arrived = AtomicUsize::new(0);
        self.parallel_for(n, |_| {
            arrived.fetch_add(1, Ordering::AcqRel);
            // Hold this thread until every thread holds a task, so each runs exactly one.
            while arrived.load(Ordering::Acquire) < n && Instant::now() < deadline {
                std::hint::spin_loop();
            }
        });
    }

    /// Runs `f(i)` for every `i < n_tasks`, each exactly once, on the pool's threads and the
    /// caller's; returns when all are done. See the module docs for nesting and panics.
    pub fn parallel_for<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        let guard = match self.submit.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if self.workers.is_empty() || n_tasks == 1 || guard.is_none() {
            observed(|| (0..n_tasks).for_each(f));
            return;
        }
        let f: JobRef<'_> = &f;
        self.run(&f, n_tasks);
        drop(guard);
    }

    /// Publishes the job, takes part in it, closes it, waits for the workers that joined, and
    /// re-raises a task panic.
    fn run(&self, f: &JobRef<'_>, n_tasks: usize) {
        let sh = &*self.shared;
        sh.next.0.store(0, Ordering::Relaxed);
        sh.finished.0.store(0, Ordering::Relaxed);
        sh.job.store(
            (f as *const JobRef<'_>).cast_mut().cast(),
            Ordering::Relaxed,
        );
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        // A new epoch, open, nobody joined yet. Release: the stores above are visible to a
        // worker that joins this epoch. SeqCst against `parked` (see `worker_loop`).
        let epoch = (sh.state.0.load(Ordering::Relaxed) >> EPOCH_SHIFT) + 1;
        sh.state.0.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        if sh.parked.load(Ordering::SeqCst) > 0 {
            let _sleep = lock(&sh.sleep);
            sh.wake.notify_all();
        }
        let mine = observed(|| catch_unwind(AssertUnwindSafe(|| run_tasks(sh, *f, n_tasks))));
        // No task is left to claim: close the job so late workers stay away, then wait for
        // the ones that joined — even if our own tasks panicked, they may still use `f`.
        let joined = (sh.state.0.fetch_or(CLOSED, Ordering::AcqRel) & JOINED_MASK) as usize;
        let mut spinner = Spinner::new();
        while sh.finished.0.load(Ordering::Acquire) != joined {
            if !spinner.spin() {
                std::thread::yield_now();
            }
        }
        sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        let theirs = lock(&sh.panic).take();
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }
}

/// Claims and runs tasks until none are left.
fn run_tasks(sh: &Shared, f: JobRef<'_>, n_tasks: usize) {
    loop {
        let i = sh.next.0.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            return;
        }
        f(i);
    }
}

/// Joins the job of `epoch` if it is still open; returns whether it did.
fn try_join(sh: &Shared, epoch: u64) -> bool {
    let mut s = sh.state.0.load(Ordering::Acquire);
    loop {
        if s >> EPOCH_SHIFT != epoch || s & CLOSED != 0 {
            return false;
        }
        match sh
            .state
            .0
            .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => s = now,
        }
    }
}

/// Waits until the epoch differs from `seen` (or shutdown): spins, then parks.
fn wait_for_job(sh: &Shared, seen: u64) -> u64 {
    let epoch = || sh.state.0.load(Ordering::SeqCst) >> EPOCH_SHIFT;
    let mut spinner = Spinner::new();
    loop {
        let e = epoch();
        if e != seen || sh.shutdown.load(Ordering::Acquire) {
            return e;
        }
        if spinner.spin() {
            continue;
        }
        // Park. `parked` is raised before the epoch is checked again, and the caller stores
        // the epoch before it reads `parked` (both SeqCst): either we see the new epoch, or
        // the caller sees us parked and notifies under the mutex we hold until `wait`.
        let mut sleep = lock(&sh.sleep);
        sh.parked.fetch_add(1, Ordering::SeqCst);
        while epoch() == seen && !sh.shutdown.load(Ordering::Acquire) {
            sleep = sh.wake.wait(sleep).unwrap_or_else(|e| e.into_inner());
        }
        sh.parked.fetch_sub(1, Ordering::SeqCst);
        spinner = Spinner::new();
    }
}

/// Sees the jobs pool workers take part in, for tracing: each worker asks `active` (meant to
/// be one atomic load) when it joins a job, and only then times its share of the job and
/// passes it to `record` (on the worker's own thread). The time between two recorded shares
/// is the worker's wait: spinning or parked.
#[derive(Clone, Copy, Debug)]
pub struct JobObserver {
    pub active: fn() -> bool,
    /// `(worker index: 1-based for the pool's threads, 0 for the caller, which runs its
    /// share of every job too; when it started on the job; when it finished)`.
    pub record: fn(usize, Instant, Instant),
}

/// Runs the caller's share of a job, timed for the observer when it is active.
fn observed<R>(share: impl FnOnce() -> R) -> R {
    let Some(o) = OBSERVER.get().filter(|o| (o.active)()) else {
        return share();
    };
    let start = Instant::now();
    let r = share();
    (o.record)(0, start, Instant::now());
    r
}

static OBSERVER: OnceLock<JobObserver> = OnceLock::new();

/// Installs the process's job observer; `false` if one was installed already.
pub fn set_job_observer(observer: JobObserver) -> bool {
    OBSERVER.set(observer).is_ok()
}

fn worker_loop(sh: &Shared, worker: usize) {
    let mut seen = 0u64;
    loop {
        let epoch = wait_for_job(sh, seen);
        seen = epoch;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        if !try_join(sh, epoch) {
            continue; // The caller already ran every task and closed the job.
        }
        // Joined (Acquire): the job fields are this epoch's until we report `finished`.
        let job = sh.job.load(Ordering::Relaxed).cast::<JobRef<'static>>();
        let n_tasks = sh.n_tasks.load(Ordering::Relaxed);
        // SAFETY: the caller keeps its `JobRef` (and the closure behind it) alive until every
        // worker that joined has reported `finished` (module docs).
        let f = unsafe { *job };
        let observer = OBSERVER.get().filter(|o| (o.active)());
        let start = observer.map(|_| Instant::now());
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| run_tasks(sh, f, n_tasks))) {
            lock(&sh.panic).get_or_insert(p);
        }
        if let (Some(o), Some(start)) = (observer, start) {
            (o.record)(worker, start, Instant::now());
        }
        sh.finished.0.fetch_add(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _sleep = lock(&self.shared.sleep);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

static GLOBAL: OnceLock<ThreadPool> = OnceLock::new();

/// The process-wide pool, created on first use with [`set_num_threads`]'s count or, by
/// default, `std::thread::available_parallelism()` threads.
pub fn global() -> &'static ThreadPool {
    GLOBAL.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadPool::new(n)
    })
}

/// Sets the global pool's thread count (the caller included; 0 means available cores). Call
/// it once at start-up, before any kernel runs (the CLI's `--threads`). Returns `false` if the
/// global pool already exists with a different count.
pub fn set_num_threads(num_threads: usize) -> bool {
    let n = if num_threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        num_threads
    };
    GLOBAL.get_or_init(|| ThreadPool::new(n)).num_threads() == n
}

/// Runs `f(chunk_index, chunk)` over `data.chunks_mut(chunk_len)` on `pool`, each chunk
/// exactly once (a safe split of a mutable buffer among tasks).
pub fn parallel_chunks_mut<T: Send, F>(pool: &ThreadPool, data: &mut [T], chunk_len: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync,
{
    assert!(chunk_len > 0);
    let len = data.len();
    let base = SyncPtr(data.as_mut_ptr());
    pool.parallel_for(len.div_ceil(chunk_len), |i| {
        let start = i * chunk_len;
        let end = len.min(start + chunk_len);
        // SAFETY: task `i` gets `start..end`, disjoint from every other task's range and
        // within `data`, which stays mutably borrowed for the whole `parallel_for`.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(i, chunk);
    });
}

/// A raw pointer that tasks may share; users guarantee disjoint access.
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: a `SyncPtr` is only dereferenced on disjoint ranges (documented at each use), and
// the pointee type is `Send`.
unsafe impl<T: Send> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SyncPtr<T> {}
