//! The scheduler's error type.
//!
//! Every place where the seed asserts or aborts is a variant here, so a bad graph or a bad
//! configuration is reported to the caller instead of ending the process (llama.cpp #10351,
//! #13684). A failed call leaves the caller's graph and every buffer as they were.

use crate::galloc::AllocError;
use backend_core::BackendError;
use graph::{GraphError, TensorId};

/// What went wrong in a scheduler call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// The scheduler was given no backend.
    #[error("the scheduler needs at least one backend")]
    NoBackends,
    /// More backends than the scheduler supports.
    #[error("{n} backends given, at most {max} are supported")]
    TooManyBackends {
        /// Number given.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// The last (lowest-priority) backend must run on a CPU device.
    #[error("the last backend ({name}) is not a CPU backend")]
    LastNotCpu {
        /// Its name.
        name: String,
    },
    /// The buffer-type list does not have one entry per backend.
    #[error("{got} buffer types given for {expected} backends")]
    BufferTypeCount {
        /// Number of backends.
        expected: usize,
        /// Number of buffer types.
        got: usize,
    },
    /// A backend cannot use the buffer type chosen for it.
    #[error("backend {backend} does not support buffer type {buffer_type}")]
    BufferTypeUnsupported {
        /// The backend.
        backend: String,
        /// The buffer type.
        buffer_type: String,
    },
    /// An invalid number of pipeline copies.
    #[error("the number of pipeline copies must be at least 1 (got {0})")]
    InvalidCopies(usize),
    /// A backend index is out of range.
    #[error("backend index {index} out of range ({n} backends)")]
    BackendIndex {
        /// The index.
        index: usize,
        /// Number of backends.
        n: usize,
    },
    /// A backend handle that is not one of the scheduler's backends.
    #[error("backend {0} is not one of the scheduler's backends")]
    UnknownBackend(String),
    /// A tensor already has memory in a buffer that no backend able to run its op can use
    /// (the seed's "pre-allocated tensor in a buffer that cannot run the operation" abort).
    #[error(
        "pre-allocated tensor ({tensor}) in a buffer ({buffer}) that cannot run the operation ({op})"
    )]
    PreallocatedUnsupported {
        /// The tensor's name.
        tensor: String,
        /// The buffer type's name.
        buffer: String,
        /// The op.
        op: &'static str,
    },
    /// After every pass a node is still without a backend: no backend supports its op.
    #[error("no backend can compute node {tensor} (op {op})")]
    NoBackendForOp {
        /// The node's name.
        tensor: String,
        /// The op.
        op: &'static str,
    },
    /// Reference limits only: the graph has more nodes plus leafs than the seed's hash set
    /// holds (`ggml_backend_sched_alloc_graph`'s capacity assert).
    #[error("the graph has {n} nodes and leafs, the scheduler was sized for {capacity}")]
    GraphTooLarge {
        /// Nodes plus leafs.
        n: usize,
        /// Hash-set size of the reference.
        capacity: usize,
    },
    /// Reference limits only: a split needs more inputs than the seed's fixed array.
    #[error("split #{split} needs more than {limit} inputs")]
    TooManySplitInputs {
        /// The split's index.
        split: usize,
        /// The limit.
        limit: usize,
    },
    /// Reference limits only: more user inputs than the seed's fixed array in parallel mode.
    #[error("more than {limit} graph inputs need pipeline copies")]
    TooManyGraphInputs {
        /// The limit.
        limit: usize,
    },
    /// `graph_compute` was given a graph other than the one `alloc_graph` planned (or that
    /// graph changed since, see `graph::Graph::stamp`). Nothing was computed; allocate the
    /// graph (or `reset`) first.
    #[error("the graph to compute is not the one allocated: call alloc_graph on it first")]
    GraphNotAllocated,
    /// Strict weights only (`Scheduler::set_strict_weights`, `SchedulerBuilder::strict_weights`):
    /// a graph leaf (op `NONE`, no input, no view) that the scheduler would treat as compute
    /// memory: it has no memory (the allocator would give it compute memory, read
    /// uninitialised) or lives in a compute buffer. Usually a weight that was not loaded into a
    /// buffer marked [`BufferUsage::Weights`](backend_core::BufferUsage::Weights). Nothing was
    /// allocated.
    #[error(
        "leaf {name} is not in a weights buffer: the scheduler would treat it as compute memory \
         (load it into a buffer, or mark it as a graph input)"
    )]
    UnplacedWeights {
        /// The tensor.
        tensor: TensorId,
        /// Its name.
        name: String,
    },
    /// An input of a split has no backend when it must be copied at compute time.
    #[error("split input {0} has no backend")]
    UnassignedInput(String),
    /// The graph allocator failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A backend operation failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A tensor id was stale, or a tensor could not be created.
    #[error(transparent)]
    Graph(#[from] GraphError),
}
