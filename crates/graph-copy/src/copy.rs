//! Copying a graph onto another buffer type.

use backend_core::{
    BackendError, Buffer, BufferType, tensor_alloc, tensor_get, tensor_set, view_init,
};
use graph::{Context, Graph, GraphError, TensorId};
use graph_alloc::{AllocError, alloc_ctx_tensors};

/// Why a graph could not be copied. Nothing is allocated or changed when this is returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphCopyError {
    /// A tensor reachable from the graph has no storage (the graph must be allocated).
    #[error("tensor {0:?} reachable from the graph is not allocated")]
    NotAllocated(TensorId),
    /// The buffer for the copies could not be allocated (or, for a copy split over several
    /// buffers, one of them).
    #[error("cannot allocate {size} bytes of {buffer_type} for the graph copy: {source}")]
    Allocation {
        /// Buffer type name.
        buffer_type: String,
        /// Bytes asked for: the whole copy's size.
        size: usize,
        /// What the buffer type said.
        source: BackendError,
    },
    /// One tensor alone is larger than the buffer type's maximum buffer size, so no split of
    /// the copy over several buffers can hold it.
    #[error(
        "tensor {tensor:?} is too large for a {buffer_type} buffer \
         (tensor size: {size}, max buffer size: {max})"
    )]
    TensorTooLarge {
        /// The tensor (its id in the original context).
        tensor: TensorId,
        /// Its allocation size, padded to the buffer type's alignment.
        size: usize,
        /// The buffer type's maximum buffer size.
        max: usize,
        /// Buffer type name.
        buffer_type: String,
    },
    /// The allocator that splits a copy over several buffers failed otherwise.
    #[error(transparent)]
    Alloc(AllocError),
    /// A backend operation (placing or copying a tensor) failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A tensor id of the graph is stale.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// A graph copied onto another buffer type: its own context (same ids as the original), the
/// graph, and the buffer holding every copied tensor (a multi-buffer of several when the copy
/// exceeds the buffer type's maximum size). Dropping it frees everything.
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
    /// The buffer every copied non-view tensor lives in: a multi-buffer whose parts
    /// ([`GraphCopy::buffers`]) hold the tensors when the copy was split.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
    /// The buffers that hold the copied tensors: one, or each part of a split copy in layout
    /// order (every part at most the buffer type's maximum size).
    ///
    /// ```
    /// use backend_core::{tensor_alloc, tensor_get, tensor_set};
    /// use graph::{Context, ElementType, Graph};
    /// use test_device::{TestDevice, TestDeviceConfig};
    ///
    /// let a = TestDevice::create(TestDeviceConfig::named("A").alignment(64))?;
    /// // At most 64 bytes a buffer: room for one of the two 64-byte tensors below.
    /// let b = TestDevice::create(TestDeviceConfig::named("B").alignment(64).max_buffer_size(64))?;
    /// let mut ctx = Context::new();
    /// let x = ctx.new_tensor_1d(ElementType::F32, 16)?;
    /// let y = ctx.scale(x, 2.0)?;
    /// let mut g = Graph::new(8);
    /// g.build_forward_expand(&mut ctx, y)?;
    /// let buf = a.buffer_type().alloc_buffer(128)?;
    /// tensor_alloc(&mut ctx, &buf, x, 0)?;
    /// tensor_alloc(&mut ctx, &buf, y, 64)?;
    /// tensor_set(&ctx, x, 0, &[7u8; 64])?;
    ///
    /// let copy = graph_copy::graph_copy(&ctx, &g, &b.buffer_type())?;
    /// assert_eq!(copy.buffers().len(), 2);
    /// assert!(copy.buffer().is_multi());
    /// let mut back = [0u8; 64];
    /// tensor_get(copy.ctx(), x, 0, &mut back)?;
    /// assert_eq!(back, [7u8; 64]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffers(&self) -> &[Buffer] {
        if self.buffer.is_multi() {
            self.buffer.parts()
        } else {
            std::slice::from_ref(&self.buffer)
        }
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

/// Copy `graph` (every tensor reachable from its nodes) of `ctx` into new memory of `buft`:
/// same layouts, views rebuilt on their copied roots, data copied (`ggml_backend_graph_copy`).
///
/// The copies are packed in first-reached order at `buft`'s alignment into one buffer of
/// exactly the size they need. When that size exceeds `buft`'s maximum buffer size the copy is
/// split over several buffers as ggml splits it, by [`graph_alloc::alloc_ctx_tensors`]: each
/// buffer takes the next tensors (each padded to the alignment) while they fit, and
/// [`GraphCopy::buffer`] is a multi-buffer of them. A tensor that alone exceeds the maximum
/// is [`GraphCopyError::TensorTooLarge`].
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

/// [`graph_copy`] with a layout option: guard regions around every copied tensor. In a copy
/// split over several buffers a buffer may end with a tensor whose guard begins the next one;
/// writing past that tensor is then outside its buffer, which the backend's bounds check
/// refuses, rather than in its guard.
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

    let mut new_ctx = ctx.clone();
    let ids: Vec<TensorId> = new_ctx.ids().collect();
    for id in ids {
        new_ctx[id].set_storage(None);
    }
    let (buffer, guards) = if size <= buft.max_size() {
        place_in_one_buffer(&mut new_ctx, buft, size, &offsets, &guard_offsets, gb)?
    } else {
        place_split(&mut new_ctx, buft, size, &offsets, &guard_offsets, gb)?
    };
    for &id in &copied {
        if new_ctx[id].is_view() {
            view_init(&mut new_ctx, id)?;
        }
    }
    for (k, &(g, _)) in guards.iter().enumerate() {
        tensor_set(&new_ctx, g, 0, &guard_pattern(gb, k))?;
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
        buffers = buffer.parts().len().max(1),
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

/// Guard tensors and the copied tensor each one follows.
type Guards = Vec<(TensorId, Option<TensorId>)>;

/// A new guard tensor of `gb` bytes in `ctx` (not placed); a size past a tensor's extent is
/// the allocation failure it would be.
fn new_guard(ctx: &mut Context, gb: usize, buft: &BufferType) -> Result<TensorId, GraphCopyError> {
    let len = i64::try_from(gb).map_err(|_| GraphCopyError::Allocation {
        buffer_type: buft.name().to_owned(),
        size: gb,
        source: BackendError::failed(buft.name(), "the guard size exceeds a tensor's extent"),
    })?;
    let g = ctx.new_tensor_1d(graph::ElementType::I8, len)?;
    ctx.set_name(g, "guard")?;
    Ok(g)
}

/// The whole copy in one buffer of `size` bytes, at the offsets worked out.
fn place_in_one_buffer(
    ctx: &mut Context,
    buft: &BufferType,
    size: usize,
    offsets: &[(TensorId, usize)],
    guard_offsets: &[(usize, Option<TensorId>)],
    gb: usize,
) -> Result<(Buffer, Guards), GraphCopyError> {
    let buffer = buft
        .alloc_buffer(size)
        .map_err(|source| GraphCopyError::Allocation {
            buffer_type: buft.name().to_owned(),
            size,
            source,
        })?;
    for &(id, offset) in offsets {
        tensor_alloc(ctx, &buffer, id, offset)?;
    }
    let mut guards = Vec::with_capacity(guard_offsets.len());
    for &(offset, after) in guard_offsets {
        let g = new_guard(ctx, gb, buft)?;
        tensor_alloc(ctx, &buffer, g, offset)?;
        guards.push((g, after));
    }
    Ok((buffer, guards))
}

/// The copy over as many buffers as `buft`'s maximum size needs, in the same order (guard,
/// tensor, guard, …), by graph-alloc's greedy split.
fn place_split(
    ctx: &mut Context,
    buft: &BufferType,
    size: usize,
    offsets: &[(TensorId, usize)],
    guard_offsets: &[(usize, Option<TensorId>)],
    gb: usize,
) -> Result<(Buffer, Guards), GraphCopyError> {
    let mut guards = Vec::with_capacity(guard_offsets.len());
    let mut order = Vec::with_capacity(offsets.len() + guard_offsets.len());
    let mut next_guard = guard_offsets.iter().peekable();
    if let Some(&&(_, None)) = next_guard.peek() {
        let g = new_guard(ctx, gb, buft)?;
        guards.push((g, None));
        order.push(g);
        next_guard.next();
    }
    for &(id, _) in offsets {
        order.push(id);
        if next_guard.next().is_some() {
            let g = new_guard(ctx, gb, buft)?;
            guards.push((g, Some(id)));
            order.push(g);
        }
    }
    let buffer = match alloc_ctx_tensors(ctx, order, buft) {
        Ok(Some(b)) => b,
        // Every tensor of `order` lacks storage and is no view, so something was placed;
        // an empty answer would be a graph-alloc bug, reported as what it would mean.
        Ok(None) => {
            return Err(GraphCopyError::Allocation {
                buffer_type: buft.name().to_owned(),
                size,
                source: BackendError::failed(buft.name(), "no buffer was made for the copy"),
            });
        }
        Err(AllocError::TensorTooLarge {
            tensor,
            size: tensor_size,
            max,
            buffer_type,
        }) => {
            if guards.iter().any(|&(g, _)| g == tensor) {
                return Err(GraphCopyError::Allocation {
                    buffer_type: buffer_type.clone(),
                    size,
                    source: BackendError::TooLarge {
                        buffer_type,
                        size: tensor_size,
                        max,
                    },
                });
            }
            return Err(GraphCopyError::TensorTooLarge {
                tensor,
                size: tensor_size,
                max,
                buffer_type,
            });
        }
        Err(AllocError::Backend(source)) => {
            return Err(GraphCopyError::Allocation {
                buffer_type: buft.name().to_owned(),
                size,
                source,
            });
        }
        Err(AllocError::Graph(e)) => return Err(GraphCopyError::Graph(e)),
        Err(e) => return Err(GraphCopyError::Alloc(e)),
    };
    Ok((buffer, guards))
}
