//! [`lifetimes`] and [`live_bytes_lower_bound`]: an allocator-independent view of when each
//! tensor needs its bytes; [`unplaced`]: which tensors an allocator has to place.
//!
//! Why: to check a graph allocator's plans (no two live tensors share bytes) and to measure
//! how far a plan is from the least memory any plan could use, without trusting the
//! allocator's own bookkeeping.

use graph::{Context, Graph, Tensor, TensorFlags, TensorId};

/// The nodes and then the leafs of `graph` that have no storage yet: what an allocator places.
/// Clearing their storage after an allocation makes the same graph read as a freshly built one
/// of the same shape, as an application builds every step; the allocators' steady-state tests
/// and benchmarks do that between calls.
///
/// ```
/// use graph::{Context, ElementType, Graph};
/// use graph_alloc::GraphAllocator;
/// use test_fixtures::{FakeBufferType, unplaced};
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_1d(ElementType::F32, 8)?;
/// let b = ctx.scale(a, 2.0)?;
/// let mut g = Graph::new(8);
/// g.build_forward_expand(&mut ctx, b)?;
/// assert_eq!(unplaced(&ctx, &g), [b, a]);
/// let buft = FakeBufferType::new("host", 32).into_buffer_type();
/// GraphAllocator::new(&[buft]).alloc_graph(&mut ctx, &g)?;
/// assert!(unplaced(&ctx, &g).is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn unplaced(ctx: &Context, graph: &Graph) -> Vec<TensorId> {
    graph
        .nodes()
        .iter()
        .chain(graph.leafs())
        .copied()
        .filter(|&t| !ctx[t].has_storage())
        .collect()
}

/// When a tensor needs its bytes, in node positions: from `first` (−1 = before the first node:
/// leafs and INPUT tensors, which the user fills before the graph runs) to `last` inclusive
/// (`n_nodes` = until after the graph: outputs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// First position at which the bytes must be reserved.
    pub first: isize,
    /// Last position at which they are read or written.
    pub last: isize,
}

/// The lifetime of every non-view tensor without storage that `nodes` and `leafs` mention
/// (the tensors a graph allocator must place), computed from the graph alone, independently
/// of any allocator: call it before allocating. Indexed by `TensorId::index`.
///
/// A tensor is live from its production (or first use, or −1 for leafs and INPUT tensors) to
/// its last use, directly or through a view, or to the end for OUTPUT tensors and roots of
/// OUTPUT views.
pub fn lifetimes(ctx: &Context, nodes: &[TensorId], leafs: &[TensorId]) -> Vec<Option<Lifetime>> {
    let mut lt: Vec<Option<Lifetime>> = vec![None; ctx.len()];
    let end = nodes.len() as isize;
    let needs_bytes = |id: TensorId| {
        let t = &ctx[id];
        !t.is_view() && !t.has_storage()
    };
    let touch = |lt: &mut Vec<Option<Lifetime>>, id: TensorId, at: isize| {
        if !needs_bytes(id) {
            return;
        }
        let e = lt[id.index()].get_or_insert(Lifetime {
            first: at,
            last: at,
        });
        e.first = e.first.min(at);
        e.last = e.last.max(at);
    };
    let user_filled = |t: &Tensor| t.flags().contains(TensorFlags::INPUT);
    for &l in leafs {
        touch(&mut lt, l, -1);
    }
    for (i, &n) in nodes.iter().enumerate() {
        let i = i as isize;
        let t = &ctx[n];
        touch(&mut lt, n, if user_filled(t) { -1 } else { i });
        if let Some(root) = t.view_src() {
            touch(&mut lt, root, i);
        }
        for &s in t.srcs().iter().flatten() {
            let st = &ctx[s];
            touch(&mut lt, s, if user_filled(st) { -1 } else { i });
            touch(&mut lt, s, i);
            if let Some(root) = st.view_src() {
                touch(&mut lt, root, i);
            }
        }
    }
    for &n in nodes.iter().chain(leafs) {
        let t = &ctx[n];
        if t.flags().contains(TensorFlags::OUTPUT) {
            touch(&mut lt, t.view_src().unwrap_or(n), end);
        }
    }
    lt
}

/// The most bytes that must be reserved at once, in one group of tensors: the maximum over
/// node positions of the summed `size` of the tensors of the group live at that position,
/// where a node whose op may run in place does not count one same-layout, non-OUTPUT source
/// that dies at it (that source's bytes can be its result's). `size` gives a tensor's padded
/// size, or `None` for tensors outside the group. No allocator that honours the lifetimes of
/// [`lifetimes`] can use less.
pub fn live_bytes_lower_bound(
    ctx: &Context,
    nodes: &[TensorId],
    lifetimes: &[Option<Lifetime>],
    size: impl Fn(TensorId) -> Option<usize>,
) -> usize {
    let mut sized: Vec<(Lifetime, usize)> = Vec::new();
    let mut size_of = vec![None; lifetimes.len()];
    for id in ctx.ids() {
        if let (Some(l), Some(s)) = (lifetimes[id.index()], size(id)) {
            sized.push((l, s));
            size_of[id.index()] = Some(s);
        }
    }
    let mut best = 0usize;
    for i in -1..=nodes.len() as isize {
        let mut bytes: usize = sized
            .iter()
            .filter(|(l, _)| l.first <= i && i <= l.last)
            .map(|&(_, s)| s)
            .sum();
        if i >= 0 && (i as usize) < nodes.len() {
            let t = &ctx[nodes[i as usize]];
            if t.op().can_inplace() && !t.is_view() && size_of[nodes[i as usize].index()].is_some()
            {
                let credit = t
                    .srcs()
                    .iter()
                    .flatten()
                    .filter(|&&s| {
                        let st = &ctx[s];
                        lifetimes[s.index()].is_some_and(|l| l.last == i)
                            && st.same_layout(t)
                            && !st.flags().contains(TensorFlags::OUTPUT)
                    })
                    .filter_map(|&s| size_of[s.index()])
                    .max()
                    .unwrap_or(0);
                bytes -= credit;
            }
        }
        best = best.max(bytes);
    }
    best
}
