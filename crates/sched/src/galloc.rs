//! Temporary stand-in for `graph_alloc` until the graph allocator lands (same API, plans
//! nothing, sizes 0). Replaced by a re-export of the real crate.

use backend_core::BufferType;
use graph::{Context, Graph};

/// Allocation errors (stand-in).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The plan no longer fits.
    #[error("the graph does not fit the reserved plan; call reserve_n with buffer ids")]
    NeedsReserve,
}

/// Graph allocator (stand-in).
#[derive(Debug)]
pub struct GraphAllocator {
    n: usize,
}

impl GraphAllocator {
    /// New allocator over buffer types.
    pub fn new(bufts: &[BufferType]) -> Self {
        GraphAllocator { n: bufts.len() }
    }
    /// Plan.
    pub fn reserve_n(
        &mut self,
        _ctx: &Context,
        _graph: &Graph,
        _node_buffer_ids: &[usize],
        _leaf_buffer_ids: &[usize],
    ) -> Result<(), AllocError> {
        Ok(())
    }
    /// Apply.
    pub fn alloc_graph(&mut self, _ctx: &mut Context, _graph: &Graph) -> Result<(), AllocError> {
        Ok(())
    }
    /// Size.
    pub fn buffer_size(&self, buffer_id: usize) -> usize {
        let _ = self.n;
        let _ = buffer_id;
        0
    }
}
