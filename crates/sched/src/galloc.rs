//! The graph allocator the scheduler drives (one buffer id per backend index).

pub use graph_alloc::{AllocError, GraphAllocator};
