//! The error type of every allocator in this crate.

use backend_core::BackendError;
use graph::{GraphError, TensorId};

/// Why an allocation could not be made. Where ggml aborts we return one of these; the
/// allocator that returned it stays usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The recorded plan does not fit the graph and the graph allocator has several buffer
    /// ids, so it cannot re-plan by itself (ggml's `alloc_graph` returning `false`): call
    /// [`crate::GraphAllocator::reserve_n`] with explicit buffer ids, then try again.
    #[error("the graph does not fit the reserved plan; call reserve_n with buffer ids")]
    NeedsReserve,
    /// A backend operation failed (the buffer type refused a size, a tensor could not be
    /// placed, …).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A tensor id was stale.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// One tensor is larger than the buffer type's maximum buffer size.
    #[error(
        "tensor {tensor:?} is too large to fit in a {buffer_type} buffer \
         (tensor size: {size}, max buffer size: {max})"
    )]
    TensorTooLarge {
        /// The tensor.
        tensor: TensorId,
        /// Its padded allocation size.
        size: usize,
        /// The buffer type's maximum size.
        max: usize,
        /// The buffer type's name.
        buffer_type: String,
    },
    /// The linear allocator's buffer has no room left for the tensor.
    #[error(
        "not enough space in the buffer to allocate {tensor:?} (needed {needed}, available {available})"
    )]
    OutOfSpace {
        /// The tensor.
        tensor: TensorId,
        /// Padded bytes it needs.
        needed: usize,
        /// Bytes left in the buffer.
        available: usize,
    },
    /// A size does not fit the allocator's virtual address range (`usize::MAX / 2`).
    #[error("cannot place {size} bytes: the virtual address range is exhausted")]
    AddressSpaceExhausted {
        /// The requested size.
        size: usize,
    },
    /// A buffer id is not below the number of buffer types the allocator was made with.
    #[error("buffer id {id} out of range (the allocator has {n_buffers} buffer types)")]
    BufferIdOutOfRange {
        /// The id.
        id: usize,
        /// Number of buffer ids.
        n_buffers: usize,
    },
    /// A per-node or per-leaf buffer id list does not have one entry per node or leaf.
    #[error("{what}: {got} buffer ids given for {expected} tensors")]
    BufferIdCount {
        /// `"nodes"` or `"leafs"`.
        what: &'static str,
        /// Number of nodes or leafs.
        expected: usize,
        /// Number of ids given.
        got: usize,
    },
    /// The linear allocator was given a multi-buffer (tensors live in its parts).
    #[error("cannot place tensors directly in a multi-buffer")]
    MultiBuffer,
}
