//! The error type shared by every backend.
//!
//! Why one type for all backends: the scheduler and engines mix backends from different crates
//! and must handle their failures uniformly, so a third-party backend returns this type too
//! (every variant can be built with a constructor, and the enum is `#[non_exhaustive]` so new
//! failure kinds do not break anyone).

use graph::{GraphError, TensorId};

/// What went wrong in a backend operation. Public and constructible, so third-party backends
/// return the same type; new variants may be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A tensor id was stale, or a graph could not be built.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The tensor has no storage.
    #[error("tensor {0:?} is not allocated")]
    NotAllocated(TensorId),
    /// The tensor already has storage (or is a view, which cannot be placed).
    #[error("tensor {0:?} is already allocated or is a view")]
    AlreadyAllocated(TensorId),
    /// A byte range falls outside a tensor or buffer.
    #[error("{what}: range {offset}..{offset}+{size} outside {limit} bytes")]
    OutOfBounds {
        /// Which operation.
        what: &'static str,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        size: usize,
        /// Size of the tensor or buffer.
        limit: usize,
    },
    /// An address or offset is not aligned as the buffer type requires.
    #[error("offset {offset} is not aligned to {alignment}")]
    Misaligned {
        /// The offset.
        offset: usize,
        /// The required alignment.
        alignment: usize,
    },
    /// Two tensors do not have the same type, extents and strides.
    #[error("tensors {src:?} and {dst:?} have different layouts")]
    LayoutMismatch {
        /// Source.
        src: TensorId,
        /// Destination.
        dst: TensorId,
    },
    /// The view's root has no storage yet.
    #[error("view {0:?}: its source is not allocated")]
    ViewSourceNotAllocated(TensorId),
    /// The tensor is not a view.
    #[error("tensor {0:?} is not a view")]
    NotAView(TensorId),
    /// A buffer type refused an allocation.
    #[error("{buffer_type}: failed to allocate {size} bytes")]
    AllocationFailed {
        /// Buffer type name.
        buffer_type: String,
        /// Requested size.
        size: usize,
    },
    /// A size exceeds the buffer type's maximum.
    #[error("{buffer_type}: {size} bytes exceed the maximum of {max}")]
    TooLarge {
        /// Buffer type name.
        buffer_type: String,
        /// Requested size.
        size: usize,
        /// Maximum.
        max: usize,
    },
    /// An optional capability the backend does not have.
    #[error("{backend}: {what} is not supported")]
    Unsupported {
        /// Backend, device or buffer name.
        backend: String,
        /// The capability.
        what: &'static str,
    },
    /// An op the backend cannot compute.
    #[error("{backend}: cannot compute op {op} of tensor {tensor:?}")]
    UnsupportedOp {
        /// Backend name.
        backend: String,
        /// Op name.
        op: &'static str,
        /// Node.
        tensor: TensorId,
    },
    /// An event was used with a backend of another device.
    #[error(
        "event of device {event_device} used with backend {backend} of device {backend_device}"
    )]
    EventDeviceMismatch {
        /// The event's device.
        event_device: String,
        /// The backend.
        backend: String,
        /// The backend's device.
        backend_device: String,
    },
    /// No registered device or registry has that name.
    #[error("no {what} named {name:?}")]
    NotFound {
        /// "device", "registry", "backend".
        what: &'static str,
        /// The name asked for.
        name: String,
    },
    /// A write was attempted on memory the backend may only read (e.g. a read-only
    /// memory-mapped weights file wrapped with [`crate::HostMemory::read_only`]).
    #[error("{buffer}: buffer is read-only")]
    ReadOnly {
        /// Buffer type name.
        buffer: String,
    },
    /// Backend parameters (the text given to `init_backend`) could not be understood.
    #[error("{backend}: invalid parameters: {message}")]
    InvalidParams {
        /// Backend name.
        backend: String,
        /// What is wrong.
        message: String,
    },
    /// A compute was stopped by its abort callback.
    #[error("computation aborted")]
    Aborted,
    /// Any other backend failure (device lost, connection closed, …).
    #[error("{backend}: {message}")]
    Failed {
        /// Backend name.
        backend: String,
        /// What happened.
        message: String,
    },
}

impl BackendError {
    /// An [`BackendError::Unsupported`] error.
    pub fn unsupported(backend: impl Into<String>, what: &'static str) -> Self {
        BackendError::Unsupported {
            backend: backend.into(),
            what,
        }
    }

    /// A [`BackendError::Failed`] error.
    pub fn failed(backend: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError::Failed {
            backend: backend.into(),
            message: message.into(),
        }
    }

    /// A [`BackendError::NotFound`] error.
    pub fn not_found(what: &'static str, name: impl Into<String>) -> Self {
        BackendError::NotFound {
            what,
            name: name.into(),
        }
    }

    /// A [`BackendError::ReadOnly`] error.
    pub fn read_only(buffer: impl Into<String>) -> Self {
        BackendError::ReadOnly {
            buffer: buffer.into(),
        }
    }

    /// An [`BackendError::InvalidParams`] error.
    pub fn invalid_params(backend: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError::InvalidParams {
            backend: backend.into(),
            message: message.into(),
        }
    }

    /// An [`BackendError::UnsupportedOp`] error.
    pub fn unsupported_op(backend: impl Into<String>, op: &'static str, tensor: TensorId) -> Self {
        BackendError::UnsupportedOp {
            backend: backend.into(),
            op,
            tensor,
        }
    }

    /// An [`BackendError::OutOfBounds`] error.
    pub fn out_of_bounds(what: &'static str, offset: usize, size: usize, limit: usize) -> Self {
        BackendError::OutOfBounds {
            what,
            offset,
            size,
            limit,
        }
    }
}

/// Result alias.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;
