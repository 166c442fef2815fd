//! A persistent worker pool that runs one job at a time on `n` threads.
//!
//! Why not `std::thread::scope` or rayon: a decode step runs hundreds of small ops, and
//! spawning threads per op (or per graph) costs more than the ops. ggml keeps its threads
//! alive and synchronises them per op; we do the same with a job slot, an epoch counter that
//! workers poll briefly (cheap hand-off for back-to-back ops) before sleeping on a condition
//! variable. The caller's thread always takes part as worker 0.
//!
//! Waiting is bounded by time, not by a loop count: a few microseconds of `spin_loop` (a
//! decode step issues its parallel ops a few microseconds apart), then a few `yield_now`s
//! (on a loaded machine the thread we wait for may need our core), then sleep. Spinning for
//! long burnt a whole core while the other thread ran the many small single-threaded ops of a
//! decode step, and on a shared machine took time from the very thread being waited for.
//!
//! Jobs share their work out (each call of the job claims units from a common counter until
//! none are left), so a worker that has not started by the time the caller's own share is
//! done has nothing left to do: the caller then takes back its seat instead of waiting for
//! it to wake up, which on a loaded machine (the worker descheduled, or asleep) saved most of
//! the hand-off cost of a small op.
//!
//! The job is a borrowed closure. Workers reach it through a pointer with its lifetime
//! erased; this is sound because [`Pool::run`] does not return (or unwind) before every
//! worker that took a seat in the job has finished with it.
//!
//! Handing a job over takes no lock while the threads are awake: the caller publishes the
//! job, sets the seats and bumps an epoch counter; a worker polling the epoch takes its seat
//! (one atomic swap) and runs; the last one to finish counts `remaining` down to zero, which
//! the caller polls. The mutex and the two condition variables are only for going to sleep
//! and waking up (a decode step hands some 300 jobs a step to its worker, a few
//! microseconds apart).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

type Job = dyn Fn(usize) + Sync;

/// A value on a cache line of its own: the epoch that idle workers poll is not on the line
/// that finishing workers write.
#[repr(align(64))]
struct Line<T>(T);

struct Shared {
    /// The current job: the address of the caller's `&Job` (a thin pointer to the fat one, on
    /// [`Pool::run`]'s stack), read by a worker only after it took its seat.
    job: AtomicPtr<()>,
    /// Bumped once per job, after the job, `remaining` and the seats are in place.
    epoch: Line<AtomicU64>,
    /// Seated workers that have not finished the current job.
    remaining: Line<AtomicUsize>,
    /// `seats[i]`: worker `i` may still start the current job. Set when the job is
    /// published; taken (swapped to `false`) by the worker as it starts, or by the caller
    /// once its own call has returned, whichever comes first; the one that takes it owns
    /// the worker's decrement of `remaining`.
    seats: Box<[AtomicBool]>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Only for sleeping: idle workers wait on `work`, the caller on `done`.
    lock: Mutex<()>,
    work: Condvar,
    done: Condvar,
    /// Workers asleep on `work` (or about to be): the caller takes the lock to wake them.
    sleepers: AtomicUsize,
    /// The caller is asleep on `done` (or about to be): the last worker wakes it.
    waiting: AtomicBool,
    /// Times a worker blocked on `work` (each `wait`), for [`Pool::worker_sleeps`].
    sleeps: AtomicU64,
}

/// Take a lock of the pool. Nothing panics while holding one, and they guard no data that a
/// panic could leave half-written, so a poisoned lock is as good as a healthy one.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a thread polls (with `spin_loop`) before it starts yielding its core.
const SPIN_TIME: Duration = Duration::from_micros(if cfg!(miri) { 0 } else { 20 });
/// How many `yield_now` calls follow the spin before the thread sleeps.
const YIELDS: u32 = if cfg!(miri) { 0 } else { 8 };

/// Poll `ready` for [`SPIN_TIME`], then yield [`YIELDS`] times; `true` as soon as it holds.
/// The caller sleeps on a condition variable when this returns `false`.
fn poll(ready: impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            std::hint::spin_loop();
            if ready() {
                return true;
            }
        }
        if start.elapsed() >= SPIN_TIME {
            break;
        }
    }
    for _ in 0..YIELDS {
        std::thread::yield_now();
        if ready() {
            return true;
        }
    }
    false
}

/// The pool: `n_threads - 1` workers plus the calling thread.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl Pool {
    /// Start `n_threads - 1` workers (at least one thread in total).
    pub fn new(n_threads: usize) -> Pool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: Line(AtomicU64::new(0)),
            remaining: Line(AtomicUsize::new(0)),
            seats: (0..n_threads).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            work: Condvar::new(),
            done: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            sleeps: AtomicU64::new(0),
        });
        let mut handles = Vec::with_capacity(n_threads - 1);
        // Each worker reports once it runs: a new thread's start-up (its name copied for the
        // runtime, thread-locals) allocates on that thread, which the OS may schedule late;
        // waiting here keeps those allocations inside `new`, never inside a later compute.
        // (A count under the sleep lock rather than a channel: a channel's blocking receive
        // allocates, or not, depending on who gets there first.)
        let started = Arc::new((Mutex::new(0usize), Condvar::new()));
        for ith in 1..n_threads {
            let sh = shared.clone();
            let started = started.clone();
            let h = std::thread::Builder::new()
                .name(format!("cpu-kernels-{ith}"))
                .spawn(move || {
                    *lock(&started.0) += 1;
                    started.1.notify_one();
                    drop(started);
                    worker(sh, ith)
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a worker thread; using fewer");
                    break;
                }
            }
        }
        // Every spawned worker counts itself as the first thing it does.
        let mut count = lock(&started.0);
        while *count < handles.len() {
            count = started
                .1
                .wait(count)
                .unwrap_or_else(PoisonError::into_inner);
        }
        drop(count);
        let n_threads = handles.len() + 1;
        Pool {
            shared,
            handles,
            n_threads,
        }
    }

    /// Threads available (workers + caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// How many times a worker has blocked on the condition variable since the pool started.
    pub fn worker_sleeps(&self) -> u64 {
        self.shared.sleeps.load(Ordering::Relaxed)
    }

    /// Run `f(ith)` for `ith in 0..n` (`n` clamped to the pool size), `f(0)` on this thread,
    /// and return when all have finished. A panic in any of them is re-raised here.
    ///
    /// `f` must share its work out: any one call completes whatever work the others have not
    /// claimed. A worker that has not started `f` when `f(0)` returns is then skipped (its
    /// call would find nothing left), so not every `f(ith)` for `ith > 0` runs.
    ///
    /// Publishing a job and waiting for it take no lock while the workers are awake (a few
    /// atomic operations each way); the lock and condition variables only put threads to
    /// sleep and wake them.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let n = n.clamp(1, self.n_threads);
        if n == 1 {
            f(0);
            return;
        }
        let sh = &*self.shared;
        // Workers reach the closure through this reference on our stack. It outlives every
        // use: a worker dereferences it only while holding a seat of this job, and we do not
        // return (or unwind) before `remaining` says every seated worker has finished (the
        // wait below runs unconditionally, f(0)'s panic is caught).
        let job: &(dyn Fn(usize) + Sync) = f;
        sh.job
            .store((&raw const job).cast::<()>().cast_mut(), Ordering::Relaxed);
        sh.remaining.0.store(n - 1, Ordering::Relaxed);
        // Release: a worker that takes its seat sees the job and `remaining` above.
        for seat in &sh.seats[1..n] {
            seat.store(true, Ordering::Release);
        }
        // SeqCst, with the `sleepers` load: either a worker going to sleep sees the new
        // epoch, or we see it and wake it.
        sh.epoch.0.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) != 0 {
            let _g = lock(&sh.lock);
            sh.work.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        // Take back the seats of workers that have not started: the work is all claimed.
        for seat in &sh.seats[1..n] {
            if seat.swap(false, Ordering::AcqRel) {
                sh.remaining.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // Wait for the workers: poll briefly, then sleep.
        if !poll(|| sh.remaining.0.load(Ordering::Acquire) == 0) {
            let mut g = lock(&sh.lock);
            // SeqCst, with the last worker's decrement and `waiting` load: either we see
            // `remaining` at zero, or it sees us waiting (and takes the lock, which we hold
            // until we sleep, to wake us).
            sh.waiting.store(true, Ordering::SeqCst);
            while sh.remaining.0.load(Ordering::SeqCst) != 0 {
                g = sh.done.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            sh.waiting.store(false, Ordering::Relaxed);
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::AcqRel) {
            panic!("a cpu-kernels worker panicked (a kernel bug)");
        }
    }
}

fn worker(sh: Arc<Shared>, ith: usize) {
    let mut seen = sh.epoch.0.load(Ordering::Acquire);
    loop {
        let ready =
            || sh.epoch.0.load(Ordering::Acquire) != seen || sh.shutdown.load(Ordering::Relaxed);
        if !poll(ready) {
            let mut g = lock(&sh.lock);
            // SeqCst, with the caller's epoch bump and `sleepers` load (see `Pool::run`).
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.epoch.0.load(Ordering::SeqCst) == seen && !sh.shutdown.load(Ordering::SeqCst) {
                sh.sleeps.fetch_add(1, Ordering::Relaxed);
                g = sh.work.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = sh.epoch.0.load(Ordering::Acquire);
        // Acquire: the seat was set after the job and `remaining` were published. The seat
        // may be that of a later job than `seen` (the caller may have taken this one back
        // and published the next): the job read below is then that later one, for which the
        // seat was set.
        if !sh.seats[ith].swap(false, Ordering::AcqRel) {
            // Not in this job, or the caller finished it before we started.
            continue;
        }
        let job = sh.job.load(Ordering::Acquire).cast_const().cast::<&Job>();
        // SAFETY: `Pool::run` stored the address of its `&Job` before setting our seat and
        // keeps both alive until `remaining` reaches zero, which needs our decrement below.
        let f: &Job = unsafe { *job };
        if catch_unwind(AssertUnwindSafe(|| f(ith))).is_err() {
            sh.panicked.store(true, Ordering::Release);
        }
        if sh.remaining.0.fetch_sub(1, Ordering::SeqCst) == 1 && sh.waiting.load(Ordering::SeqCst) {
            let _g = lock(&sh.lock);
            sh.done.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = lock(&self.shared.lock);
            self.shared.work.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work-sharing jobs finish every unit exactly once, back to back, whether or not the
    /// workers start in time (the caller takes back the seats of those that do not).
    #[test]
    fn shared_jobs_do_every_unit_once() {
        let (jobs, units) = if cfg!(miri) { (4, 16) } else { (2000, 64) };
        for threads in 1..=3 {
            let pool = Pool::new(threads);
            for job in 0..jobs {
                let next = AtomicUsize::new(0);
                let done: Vec<AtomicUsize> = (0..units).map(|_| AtomicUsize::new(0)).collect();
                pool.run(threads, &|_| {
                    loop {
                        let u = next.fetch_add(1, Ordering::Relaxed);
                        if u >= units {
                            return;
                        }
                        done[u].fetch_add(1, Ordering::Relaxed);
                    }
                });
                for (u, d) in done.iter().enumerate() {
                    assert_eq!(d.load(Ordering::Relaxed), 1, "job {job}, unit {u}");
                }
            }
        }
    }
}
