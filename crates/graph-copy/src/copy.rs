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
    /// Guard tensors and the copied tensor each one follows (`None`: the leading guard).
    guards: Vec<(TensorId, Option<TensorId>)>,
}

/// How to lay out a copy.
///
/// ```
/// let opts = graph_copy::CopyOptions { guard_bytes: 64 };
/// assert_eq!(graph_copy::CopyOptions::default().guard_bytes, 0);
/// # let _ = opts;
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyOptions {
    /// Bytes of guard (sentinel) memory before the first copied tensor and after every one,
    /// filled with a known pattern; [`GraphCopy::check_guards`] finds the ones a backend
    /// overwrote. 0: tensors are packed at the buffer type's alignment.
    pub guard_bytes: usize,
}

/// The bytes guard number `k` holds.
fn guard_pattern(len: usize, k: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(151) ^ k.wrapping_mul(29) ^ 0xA5) as u8)
        .collect()
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

    /// Check every guard region (see [`CopyOptions::guard_bytes`]); returns, for each damaged
    /// one, the copied tensor it follows (`None` for the guard before the first tensor), and
    /// restores the pattern so that later damage is seen separately.
    pub fn check_guards(&self) -> Result<Vec<Option<TensorId>>, BackendError> {
        let mut damaged = Vec::new();
        let mut got = Vec::new();
        for (k, &(g, after)) in self.guards.iter().enumerate() {
            let want = guard_pattern(self.ctx[g].nbytes(), k);
            got.resize(want.len(), 0);
            tensor_get(&self.ctx, g, 0, &mut got)?;
            if got != want {
                damaged.push(after);
                tensor_set(&self.ctx, g, 0, &want)?;
            }
        }
        Ok(damaged)
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
    graph_copy_with(ctx, graph, buft, &CopyOptions::default())
}

/// [`graph_copy`] with a layout option: guard regions around every copied tensor.
pub fn graph_copy_with(
    ctx: &Context,
    graph: &Graph,
    buft: &BufferType,
    opts: &CopyOptions,
) -> Result<GraphCopy, GraphCopyError> {
    let copied = reachable(ctx, graph)?;
    // Place every non-view tensor: aligned offsets in one buffer, each followed by its guard.
    let align = buft.alignment().max(1);
    let gb = opts.guard_bytes;
    let mut offsets = Vec::with_capacity(copied.len());
    let mut guard_offsets: Vec<(usize, Option<TensorId>)> = Vec::new();
    let mut size = 0usize;
    if gb > 0 {
        guard_offsets.push((0, None));
        size = gb;
    }
    // The guard size is the caller's and tensor sizes add up: checked, an overflow is the
    // allocation failure it would be.
    let overflow = || GraphCopyError::Allocation {
        buffer_type: buft.name().to_owned(),
        size: usize::MAX,
        source: BackendError::failed(buft.name(), "the copy's size overflows usize"),
    };
    let after = |at: usize, n: usize| {
        at.checked_next_multiple_of(align)
            .and_then(|s| Some((s, s.checked_add(n)?)))
            .ok_or_else(overflow)
    };
    for &id in &copied {
        // `copied` holds ids `reachable` looked up in `ctx`.
        let t = &ctx[id];
        if !t.has_storage() {
            return Err(GraphCopyError::NotAllocated(id));
        }
        if t.is_view() {
            continue;
        }
        let (start, end) = after(size, buft.alloc_size(t))?;
        offsets.push((id, start));
        size = end;
        if gb > 0 {
            let (g, end) = after(size, gb)?;
            guard_offsets.push((g, Some(id)));
            size = end;
        }
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
    let mut guards = Vec::with_capacity(guard_offsets.len());
    for (k, &(offset, after)) in guard_offsets.iter().enumerate() {
        let g = new_ctx.new_tensor_1d(graph::ElementType::I8, gb as i64)?;
        new_ctx.set_name(g, "guard")?;
        tensor_alloc(&mut new_ctx, &buffer, g, offset)?;
        tensor_set(&new_ctx, g, 0, &guard_pattern(gb, k))?;
        guards.push((g, after));
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
        guards,
    })
}
