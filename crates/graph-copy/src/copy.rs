//! Copying a graph onto another buffer type.

use backend_core::{
    BackendError, Buffer, BufferType, tensor_alloc, tensor_get, tensor_set, view_init,
};
use graph::{Context, Graph, GraphError, TensorId};

/// Why a graph could not be copied. Nothing is allocated or changed when this is returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphCopyError {
    /// A tensor reachable from the graph has no storage (the graph must be allocated).
    #[error("tensor {0:?} reachable from the graph is not allocated")]
    NotAllocated(TensorId),
    /// The buffer for the copies could not be allocated.
    #[error("cannot allocate {size} bytes of {buffer_type} for the graph copy: {source}")]
    Allocation {
        /// Buffer type name.
        buffer_type: String,
        /// Bytes asked for.
        size: usize,
        /// What the buffer type said.
        source: BackendError,
    },
    /// A backend operation (placing or copying a tensor) failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A tensor id of the graph is stale.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// A graph copied onto another buffer type: its own context (same ids as the original), the
/// graph, and the one buffer holding every copied tensor. Dropping it frees everything.
#[derive(Debug)]
pub struct GraphCopy {
    ctx: Context,
    graph: Graph,
    buffer: Buffer,
    copied: Vec<TensorId>,
}

impl GraphCopy {
    /// The copies' context: `ctx[id]` is the copy of the original's `id`.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }
    /// The copies' context, mutably (to set inputs or build on the copy).
    pub fn ctx_mut(&mut self) -> &mut Context {
        &mut self.ctx
    }
    /// The copied graph (the same node ids as the original).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The buffer every copied non-view tensor lives in.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
    /// Every tensor copied (reachable from the graph's nodes), in first-reached order.
    pub fn tensors(&self) -> &[TensorId] {
        &self.copied
    }
}

/// Tensors reachable from `graph`'s nodes through sources and view roots, each once, in
/// depth-first first-reached order.
fn reachable(ctx: &Context, graph: &Graph) -> Result<Vec<TensorId>, GraphError> {
    let mut seen = vec![false; ctx.len()];
    let mut order = Vec::new();
    let mut stack: Vec<TensorId> = Vec::new();
    for &n in graph.nodes().iter().chain(graph.leafs()) {
        stack.push(n);
        while let Some(id) = stack.pop() {
            let t = ctx.get(id)?;
            if std::mem::replace(&mut seen[id.index()], true) {
                continue;
            }
            order.push(id);
            stack.extend(t.view_src());
            stack.extend(t.srcs().iter().rev().flatten());
        }
    }
    Ok(order)
}

/// Copy `graph` (every tensor reachable from its nodes) of `ctx` into one new buffer of
/// `buft`: same layouts, views rebuilt on their copied roots, data copied.
///
/// The graph must be allocated (every reachable tensor has storage). On error nothing is left
/// allocated.
pub fn graph_copy(
    ctx: &Context,
    graph: &Graph,
    buft: &BufferType,
) -> Result<GraphCopy, GraphCopyError> {
    let copied = reachable(ctx, graph)?;
    // Place every non-view tensor: aligned offsets in one buffer.
    let align = buft.alignment().max(1);
    let mut offsets = Vec::with_capacity(copied.len());
    let mut size = 0usize;
    for &id in &copied {
        let t = &ctx[id];
        if !t.has_storage() {
            return Err(GraphCopyError::NotAllocated(id));
        }
        if t.is_view() {
            continue;
        }
        let start = size.next_multiple_of(align);
        offsets.push((id, start));
        size = start + buft.alloc_size(t);
    }
    let buffer = buft
        .alloc_buffer(size)
        .map_err(|source| GraphCopyError::Allocation {
            buffer_type: buft.name().to_owned(),
            size,
            source,
        })?;

    let mut new_ctx = ctx.clone();
    let ids: Vec<TensorId> = new_ctx.ids().collect();
    for id in ids {
        new_ctx[id].set_storage(None);
    }
    for &(id, offset) in &offsets {
        tensor_alloc(&mut new_ctx, &buffer, id, offset)?;
    }
    for &id in &copied {
        if new_ctx[id].is_view() {
            view_init(&mut new_ctx, id)?;
        }
    }
    // Data: every placed tensor, through host memory (the source and target may be any two
    // devices, and views share their root's bytes).
    let mut staging = Vec::new();
    for &(id, _) in &offsets {
        let n = ctx[id].nbytes();
        staging.resize(n, 0);
        tensor_get(ctx, id, 0, &mut staging)?;
        tensor_set(&new_ctx, id, 0, &staging)?;
    }
    tracing::debug!(
        tensors = copied.len(),
        bytes = size,
        buffer_type = buft.name(),
        "graph copied"
    );
    Ok(GraphCopy {
        ctx: new_ctx,
        graph: graph.clone(),
        buffer,
        copied,
    })
}
