//! Allocation: the graph the allocator sees (per split, its input copies and then its nodes)
//! and the compute memory planned and placed for it.

use backend_core::BufferType;
use graph::{Context, Graph};

use super::backend_id::{BackendId, PackedBackend};
use super::table::Slot;
use super::{Result, Scheduler};
use crate::galloc::{AllocError, GraphAllocator};

/// The allocation side of a plan: the graph the allocator sees and the backend of each of its
/// nodes and leafs, this plan's and the last one's (a buffer-type change means re-planning
/// memory).
pub(super) struct Allocation {
    pub(super) galloc: GraphAllocator,
    pub(super) graph: Graph,
    pub(super) node_ids: Vec<PackedBackend>,
    pub(super) leaf_ids: Vec<PackedBackend>,
    pub(super) prev_node_ids: Vec<PackedBackend>,
    pub(super) prev_leaf_ids: Vec<PackedBackend>,
    /// `node_ids` and `leaf_ids` with "none" as the last backend, for the allocator.
    pub(super) node_buf_ids: Vec<usize>,
    pub(super) leaf_buf_ids: Vec<usize>,
}

impl Allocation {
    pub(super) fn new(bufts: &[BufferType], graph_size: usize) -> Allocation {
        Allocation {
            galloc: GraphAllocator::new(bufts),
            graph: Graph::new(graph_size),
            node_ids: Vec::new(),
            leaf_ids: Vec::new(),
            prev_node_ids: Vec::new(),
            prev_leaf_ids: Vec::new(),
            node_buf_ids: Vec::new(),
            leaf_buf_ids: Vec::new(),
        }
    }
}

impl Scheduler {
    #[inline(never)]
    pub(super) fn build_alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        std::mem::swap(&mut self.alloc.node_ids, &mut self.alloc.prev_node_ids);
        std::mem::swap(&mut self.alloc.leaf_ids, &mut self.alloc.prev_leaf_ids);

        let n_inputs: usize = self.splits.list[..self.splits.n]
            .iter()
            .map(|s| s.inputs.len())
            .sum();
        // Enough for every position written below: the splits partition the graph's nodes and
        // add two nodes per input; the leafs are the graph's plus one per copy of each input.
        let size = graph.n_nodes().max(graph.n_leafs())
            + (n_inputs + self.copies.graph_inputs.len()) * 2 * self.pipeline.n_copies;
        let cap = self.alloc.graph.capacity().max(size);
        self.alloc.graph.reset_capacity(cap);
        // positions keep values from older plans beyond the current length, as in the seed
        let first = PackedBackend::some(BackendId::new(0));
        if self.alloc.node_ids.len() < size {
            self.alloc.node_ids.resize(size, first);
        }
        if self.alloc.leaf_ids.len() < size {
            self.alloc.leaf_ids.resize(size, first);
        }

        let mut n = 0usize;
        for si in 0..self.splits.n {
            let backend = self.splits.list[si].backend;
            for k in 0..self.splits.list[si].inputs.len() {
                let input = self.splits.list[si].inputs[k];
                // invariant: an input is registered in a split only after its copies for every
                // pipeline copy were made, in this split pass (current copy epoch)
                let copy = self
                    .get_copy(input, backend.index(), self.pipeline.cur_copy)
                    .expect("every split input has copies");
                let dep = ctx.view_tensor(input)?;
                ctx.set_src(dep, 0, Some(input))?;
                self.alloc.node_ids[n] = self.bid(input);
                self.alloc.graph.add_node(dep)?;
                n += 1;
                self.alloc.node_ids[n] = backend.into();
                self.alloc.graph.add_node(copy)?;
                n += 1;
            }
            let (start, end) = (self.splits.list[si].start, self.splits.list[si].end);
            // the splits were just cut from `graph`, as ranges inside its node list
            let split_nodes = &graph.nodes()[start..end];
            self.alloc.graph.extend_nodes(split_nodes)?;
            let key_hi = self.key_hi();
            let slots = &self.table.slots[..];
            for (id, &node) in self.alloc.node_ids[n..n + split_nodes.len()]
                .iter_mut()
                .zip(split_nodes)
            {
                *id = Slot::backend_in(slots, key_hi, node);
            }
            n += split_nodes.len();
        }

        let mut l = 0usize;
        if self.pipeline.n_copies > 1 {
            for gi in 0..self.copies.graph_inputs.len() {
                let input = self.copies.graph_inputs[gi];
                // invariant: a graph input is registered only with a backend, which the split
                // pass does not change afterwards
                let b = self.bid(input).get().expect("graph inputs have a backend");
                for c in 0..self.pipeline.n_copies {
                    // invariant: as for split inputs, copies are made before registration
                    let copy = self
                        .get_copy(input, b.index(), c)
                        .expect("graph inputs have copies");
                    self.alloc.leaf_ids[l] = b.into();
                    self.alloc.graph.add_leaf(copy)?;
                    l += 1;
                }
            }
            for si in 0..self.splits.n {
                let backend = self.splits.list[si].backend;
                for k in 0..self.splits.list[si].inputs.len() {
                    let input = self.splits.list[si].inputs[k];
                    for c in 0..self.pipeline.n_copies {
                        // invariant: copies are made before an input is registered
                        let copy = self
                            .get_copy(input, backend.index(), c)
                            .expect("split inputs have copies");
                        self.alloc.leaf_ids[l] = backend.into();
                        self.alloc.graph.add_leaf(copy)?;
                        l += 1;
                    }
                }
            }
        }
        let leafs = graph.leafs();
        self.alloc.graph.extend_leafs(leafs)?;
        let key_hi = self.key_hi();
        let slots = &self.table.slots[..];
        for (id, &leaf) in self.alloc.leaf_ids[l..l + leafs.len()]
            .iter_mut()
            .zip(leafs)
        {
            *id = Slot::backend_in(slots, key_hi, leaf);
        }
        Ok(())
    }

    pub(super) fn buft_of(&self, id: PackedBackend) -> Option<&BufferType> {
        id.get().map(|b| &self.bufts[b.index()])
    }

    pub(super) fn fill_buffer_ids(&mut self) {
        let last = self.backends.len() - 1;
        let clamp = |b: PackedBackend| b.get().map_or(last, BackendId::index);
        let nn = self.alloc.graph.n_nodes();
        let nl = self.alloc.graph.n_leafs();
        self.alloc.node_buf_ids.clear();
        self.alloc
            .node_buf_ids
            .extend(self.alloc.node_ids[..nn].iter().map(|&b| clamp(b)));
        self.alloc.leaf_buf_ids.clear();
        self.alloc
            .leaf_buf_ids
            .extend(self.alloc.leaf_ids[..nl].iter().map(|&b| clamp(b)));
    }

    pub(super) fn reserve_alloc_graph(&mut self, ctx: &Context) -> Result<()> {
        self.fill_buffer_ids();
        self.alloc.galloc.reserve_n(
            ctx,
            &self.alloc.graph,
            &self.alloc.node_buf_ids,
            &self.alloc.leaf_buf_ids,
        )?;
        Ok(())
    }

    /// `ggml_backend_sched_alloc_splits`.
    pub(super) fn alloc_splits(&mut self, ctx: &mut Context) -> Result<()> {
        let nn = self.alloc.graph.n_nodes();
        let nl = self.alloc.graph.n_leafs();
        let changed_at = |ids: &[PackedBackend], prev: &[PackedBackend], n: usize| {
            (0..n).any(|i| {
                let p = prev
                    .get(i)
                    .copied()
                    .unwrap_or(PackedBackend::some(BackendId::new(0)));
                ids[i] != p && self.buft_of(ids[i]) != self.buft_of(p)
            })
        };
        let changed = changed_at(&self.alloc.node_ids, &self.alloc.prev_node_ids, nn)
            || changed_at(&self.alloc.leaf_ids, &self.alloc.prev_leaf_ids, nl);

        let needs_reserve = changed
            || match self.alloc.galloc.alloc_graph(ctx, &self.alloc.graph) {
                Ok(()) => false,
                Err(AllocError::NeedsReserve) => true,
                Err(e) => return Err(e.into()),
            };
        if needs_reserve {
            // the new plan may move split inputs
            self.synchronize()?;
            tracing::debug!(
                backend_ids_changed = changed,
                "failed to allocate graph, reserving"
            );
            self.reserve_alloc_graph(ctx)?;
            self.alloc.galloc.alloc_graph(ctx, &self.alloc.graph)?;
        }
        Ok(())
    }

    /// Plan compute memory for a worst-case graph (`ggml_backend_sched_reserve`): split it,
    /// size every backend's compute buffer, then reset. The graph is left as it was.
    pub fn reserve(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.check_capacity(graph)?;
        let r = self.plan_graph(ctx, graph).and_then(|()| {
            self.apply_rewrites(ctx);
            self.synchronize()?;
            self.reserve_alloc_graph(ctx)
        });
        self.restore_rewrites(ctx);
        r?;
        self.reset();
        Ok(())
    }

    /// Assign, split and allocate `graph` (`ggml_backend_sched_alloc_graph`). Re-plans memory
    /// only when a node's backend moved to another buffer type or the plan does not fit.
    /// The graph is left with its original sources; compute applies the copies again.
    pub fn alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.check_capacity(graph)?;
        let r = self.plan_graph(ctx, graph).and_then(|()| {
            self.apply_rewrites(ctx);
            self.alloc_splits(ctx)
        });
        self.restore_rewrites(ctx);
        r?;
        self.state.is_alloc = true;
        self.state.planned = Some(graph.stamp());
        Ok(())
    }
}
