//! Events: markers in a backend's stream that other work can wait for.
//!
//! The contract (ggml never wrote one down):
//! * [`crate::Backend::event_record`] marks the point after all work queued on that backend so
//!   far. The event must belong to the backend's device ([`BackendError::EventDeviceMismatch`]
//!   otherwise). Recording again moves the marker.
//! * [`Event::synchronize`] blocks the calling thread until the recorded point is reached. An
//!   event never recorded is already complete.
//! * [`crate::Backend::event_wait`] makes work queued on the waiting backend *after* the call
//!   start only once the recorded point is reached; it does not block the caller. Which
//!   events a backend can wait for (its own device's, or others') is the backend's choice; it
//!   answers [`BackendError::Unsupported`] for the others.
//! * Visibility: once [`Event::synchronize`] returns, or once work ordered after an
//!   [`crate::Backend::event_wait`] starts, every write made by the work before the record
//!   point is visible to that reader (host or other backend).
//! * Events are `Send + Sync` handles; recording and waiting from several threads is allowed,
//!   and the last record wins.
//! * A device without events answers [`BackendError::Unsupported`] from
//!   [`crate::Device::event_new`], and so do a backend's `event_record`/`event_wait` by default.
//!   A failed call (wrong device, unsupported) changes nothing.
//!
//! Why written down: ggml never did (llama.cpp #25319), and the scheduler's pipeline copies
//! depend on exactly these guarantees.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::backend::Backend;
use crate::device::Device;
use crate::error::{BackendError, Result};

/// What a backend crate implements per event.
pub trait EventImpl: Send + Sync + 'static {
    /// Block until the recorded point is reached.
    fn synchronize(&self) -> Result<()>;
    /// For downcasting by the backend that made it.
    fn as_any(&self) -> &dyn Any;
}

/// A handle to an event of one device.
#[derive(Clone)]
pub struct Event {
    imp: Arc<dyn EventImpl>,
    device: Device,
}

impl Event {
    /// An event of `device` over `imp`.
    pub fn new(device: Device, imp: impl EventImpl) -> Self {
        Event {
            imp: Arc::new(imp),
            device,
        }
    }
    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The implementation, for downcasting.
    pub fn implementation(&self) -> &dyn EventImpl {
        &*self.imp
    }
    /// Block until the recorded point is reached.
    pub fn synchronize(&self) -> Result<()> {
        self.imp.synchronize()
    }
    /// Check that `backend` runs on this event's device.
    pub fn check_device(&self, backend: &Backend) -> Result<()> {
        let dev = backend.device();
        if dev == self.device {
            Ok(())
        } else {
            Err(BackendError::EventDeviceMismatch {
                event_device: self.device.name().to_owned(),
                backend: backend.name().to_owned(),
                backend_device: dev.name().to_owned(),
            })
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({})", self.device.name())
    }
}
