//! Events: numbered markers in a stream.
//!
//! Each record bumps `recorded` at the call and queues a marker that raises `fired` to that
//! number when the stream reaches it. Waiting (on the host or on another stream) snapshots
//! `recorded` at the call and waits until `fired` catches up, which is exactly the contract in
//! `backend_core`'s event docs: the wait is for the point recorded *before* it was asked for,
//! never for a later record.

use std::any::Any;
use std::sync::Arc;

use backend_core::{EventImpl, Result};
use parking_lot::{Condvar, Mutex};

use crate::stream::Stream;

#[derive(Default)]
struct Marks {
    recorded: u64,
    fired: u64,
}

/// The shared state of one event.
#[derive(Default)]
pub(crate) struct EventState {
    marks: Mutex<Marks>,
    cv: Condvar,
}

impl EventState {
    /// Queue a marker on `stream` after everything queued so far.
    pub(crate) fn record(self: &Arc<Self>, stream: &Stream) -> Result<()> {
        let target = {
            let mut m = self.marks.lock();
            m.recorded += 1;
            m.recorded
        };
        let me = self.clone();
        let r = stream.submit(Box::new(move || {
            me.fire(target);
            Ok(())
        }));
        if r.is_err() {
            // Never leave a point that will not be reached.
            self.fire(target);
        }
        r.map(|_| ())
    }

    /// Count a record whose marker someone else fires (a stream pause).
    pub(crate) fn arm(&self) -> u64 {
        let mut m = self.marks.lock();
        m.recorded += 1;
        m.recorded
    }

    pub(crate) fn fire(&self, target: u64) {
        let mut m = self.marks.lock();
        m.fired = m.fired.max(target);
        self.cv.notify_all();
    }

    /// The point a wait asked for now must reach.
    pub(crate) fn target(&self) -> u64 {
        self.marks.lock().recorded
    }

    /// Block until the point `target` is reached.
    pub(crate) fn wait_for(&self, target: u64) {
        let mut m = self.marks.lock();
        while m.fired < target {
            self.cv.wait(&mut m);
        }
    }

    /// Make `stream` block, when it gets there, until the current record is reached.
    pub(crate) fn enqueue_wait(self: &Arc<Self>, stream: &Stream) -> Result<()> {
        let target = self.target();
        let me = self.clone();
        stream
            .submit(Box::new(move || {
                me.wait_for(target);
                Ok(())
            }))
            .map(|_| ())
    }
}

/// The test device's event (`backend_core::EventImpl`).
pub struct TestEvent {
    pub(crate) state: Arc<EventState>,
}

impl EventImpl for TestEvent {
    fn synchronize(&self) -> Result<()> {
        let target = self.state.target();
        self.state.wait_for(target);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
