//! A stream: one worker thread executing commands in submission order.
//!
//! Why a thread per stream: it makes "asynchronous" literal. A command submitted here runs
//! later, on another thread, after every command submitted before it, exactly like work queued
//! on a GPU stream. Callers get control back immediately; [`Stream::synchronize`] is the only
//! way to know the work is done. The first error a command returns is kept and reported by the
//! next `synchronize` (a "sticky" stream error, as GPU runtimes do).

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::{self, JoinHandle, ThreadId};

use backend_core::{BackendError, Result};
use parking_lot::{Condvar, Mutex};

/// A unit of work for the worker.
pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct State {
    submitted: u64,
    completed: u64,
    error: Option<BackendError>,
}

#[derive(Default)]
struct Progress {
    state: Mutex<State>,
    done: Condvar,
}

/// A worker thread and its queue.
pub(crate) struct Stream {
    name: String,
    tx: Option<mpsc::Sender<Job>>,
    progress: Arc<Progress>,
    worker: Option<JoinHandle<()>>,
    worker_id: ThreadId,
}

impl Stream {
    /// Start a worker named `name`.
    pub(crate) fn new(name: &str) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        let worker = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                for job in rx {
                    // A panicking command is a bug in this crate; turn it into a stream error
                    // so that `synchronize` reports it instead of waiting forever.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                        .unwrap_or_else(|_| {
                            Err(BackendError::failed("device", "command panicked"))
                        });
                    let mut st = p.state.lock();
                    st.completed += 1;
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "device stream command failed");
                        st.error.get_or_insert(e);
                    }
                    p.done.notify_all();
                }
            })
            .map_err(|e| BackendError::failed(name, format!("cannot start worker: {e}")))?;
        Ok(Stream {
            name: name.to_owned(),
            tx: Some(tx),
            progress,
            worker_id: worker.thread().id(),
            worker: Some(worker),
        })
    }

    /// Queue `job` after everything queued so far; returns its ticket (1-based count).
    pub(crate) fn submit(&self, job: Job) -> Result<u64> {
        let mut st = self.progress.state.lock();
        let tx = self.tx.as_ref().ok_or_else(|| self.gone())?;
        tx.send(job).map_err(|_| self.gone())?;
        st.submitted += 1;
        Ok(st.submitted)
    }

    /// Queue `f` and block until it has run (after everything queued before it); its result
    /// comes back to the caller instead of becoming the stream's sticky error.
    pub(crate) fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit(Box::new(move || {
            let _ = tx.send(f());
            Ok(())
        }))?;
        rx.recv().map_err(|_| self.gone())?
    }

    /// Block until every command submitted so far has run; return (and clear) the first error
    /// any of them returned.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let mut st = self.progress.state.lock();
        let target = st.submitted;
        while st.completed < target {
            self.progress.done.wait(&mut st);
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn gone(&self) -> BackendError {
        BackendError::failed(&self.name, "device worker has stopped")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Closing the channel lets the worker finish what is queued and exit.
        self.tx.take();
        if let Some(w) = self.worker.take() {
            // The last handle can be dropped by a job running on the worker itself (a job that
            // held the last reference to a buffer); a thread cannot join itself, so it is left
            // to exit on its own.
            if thread::current().id() != self.worker_id {
                let _ = w.join();
            }
        }
    }
}
