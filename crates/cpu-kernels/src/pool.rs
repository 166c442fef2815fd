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
//! The job is a borrowed closure. Workers receive it with its lifetime erased; this is sound
//! because [`Pool::run`] does not return (or unwind) before every worker has finished with it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

type Job = dyn Fn(usize) + Sync;

/// A job pointer with its lifetime erased (see the module docs for why that is sound).
#[derive(Copy, Clone)]
struct JobPtr(*const Job);

// SAFETY: the pointee is `Sync` (a `dyn Fn + Sync`), so calling it from several threads is
// fine; the pointer itself is only dereferenced while `Pool::run` keeps the closure alive.
unsafe impl Send for JobPtr {}

struct Slot {
    job: Option<JobPtr>,
    n: usize,
    epoch: u64,
    shutdown: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    work: Condvar,
    done: Condvar,
    epoch: AtomicU64,
    remaining: AtomicUsize,
    /// `seats[i]`: worker `i` may still start the current job. Set when the job is
    /// published; taken (swapped to `false`) by the worker as it starts, or by the caller
    /// once its own call has returned, whichever comes first; the one that takes it owns
    /// the worker's decrement of `remaining`.
    seats: Box<[AtomicBool]>,
    panicked: AtomicBool,
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
            slot: Mutex::new(Slot {
                job: None,
                n: 0,
                epoch: 0,
                shutdown: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            epoch: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            seats: (0..n_threads).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
        });
        let mut handles = Vec::with_capacity(n_threads - 1);
        for ith in 1..n_threads {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("cpu-kernels-{ith}"))
                .spawn(move || worker(sh, ith));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a worker thread; using fewer");
                    break;
                }
            }
        }
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

    /// Run `f(ith)` for `ith in 0..n` (`n` clamped to the pool size), `f(0)` on this thread,
    /// and return when all have finished. A panic in any of them is re-raised here.
    ///
    /// `f` must share its work out: any one call completes whatever work the others have not
    /// claimed. A worker that has not started `f` when `f(0)` returns is then skipped (its
    /// call would find nothing left), so not every `f(ith)` for `ith > 0` runs.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let n = n.clamp(1, self.n_threads);
        if n == 1 {
            f(0);
            return;
        }
        // SAFETY: only the lifetime is erased (same fat-pointer layout). The pointer is
        // cleared from the slot and every worker has finished calling it before this function
        // returns or unwinds (the wait below runs unconditionally, f(0)'s panic is caught).
        let job: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        {
            let mut s = self.shared.slot.lock();
            s.job = Some(JobPtr(job));
            s.n = n;
            s.epoch += 1;
            for seat in &self.shared.seats[1..n] {
                seat.store(true, Ordering::Relaxed);
            }
            self.shared.remaining.store(n - 1, Ordering::Release);
            self.shared.epoch.store(s.epoch, Ordering::Release);
        }
        self.shared.work.notify_all();
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        // Take back the seats of workers that have not started: the work is all claimed.
        for seat in &self.shared.seats[1..n] {
            if seat.swap(false, Ordering::AcqRel) {
                self.shared.remaining.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // Wait for the workers: poll briefly, then sleep.
        poll(|| self.shared.remaining.load(Ordering::Acquire) == 0);
        {
            let mut s = self.shared.slot.lock();
            while self.shared.remaining.load(Ordering::Acquire) != 0 {
                self.shared.done.wait(&mut s);
            }
            s.job = None;
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if self.shared.panicked.swap(false, Ordering::AcqRel) {
            panic!("a cpu-kernels worker panicked (a kernel bug)");
        }
    }
}

fn worker(sh: Arc<Shared>, ith: usize) {
    let mut seen = 0u64;
    loop {
        poll(|| sh.epoch.load(Ordering::Acquire) != seen);
        let (job, seated) = {
            let mut s = sh.slot.lock();
            while s.epoch == seen && !s.shutdown {
                sh.work.wait(&mut s);
            }
            if s.shutdown {
                return;
            }
            seen = s.epoch;
            // Take our seat while holding the lock, so that the job read above is the one
            // the seat was set for (the next job is published under this lock).
            let seated = s.n > ith && sh.seats[ith].swap(false, Ordering::AcqRel);
            (s.job, seated)
        };
        if !seated {
            // Not in this job, or the caller finished it before we started.
            continue;
        }
        if let Some(JobPtr(p)) = job {
            // SAFETY: `Pool::run` published this pointer for the current epoch; we hold its
            // seat, so it waits for `remaining` to reach zero (our decrement below) before the
            // closure goes away.
            let f = unsafe { &*p };
            if catch_unwind(AssertUnwindSafe(|| f(ith))).is_err() {
                sh.panicked.store(true, Ordering::Release);
            }
        }
        if sh.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _s = sh.slot.lock();
            sh.done.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut s = self.shared.slot.lock();
            s.shutdown = true;
        }
        self.shared.work.notify_all();
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
