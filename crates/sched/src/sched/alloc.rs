//! Allocation: the graph the allocator sees (per split, its input copies and then its nodes)
//! and the compute memory planned and placed for it.

use backend_core::BufferType;
use graph::{Context, Graph};

use super::backend_id::{BackendId, PackedBackend};
use super::table::Slot;
use super::{Result, Scheduler};
use crate::galloc::AllocError;

impl Scheduler {
    #[inline(never)]
    pub(super) fn build_alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        std::mem::swap(&mut self.node_ids, &mut self.prev_node_ids);
        std::mem::swap(&mut self.leaf_ids, &mut self.prev_leaf_ids);

        let n_inputs: usize = self.splits[..self.n_splits]
            .iter()
            .map(|s| s.inputs.len())
            .sum();
        // Enough for every position written below: the splits partition the graph's nodes and
        // add two nodes per input; the leafs are the graph's plus one per copy of each input.
        let size = graph.n_nodes().max(graph.n_leafs())
            + (n_inputs + self.graph_inputs.len()) * 2 * self.n_copies;
        let cap = self.alloc_graph.capacity().max(size);
        self.alloc_graph.reset_capacity(cap);
        // positions keep values from older plans beyond the current length, as in the seed
        let first = PackedBackend::some(BackendId::new(0));
        if self.node_ids.len() < size {
            self.node_ids.resize(size, first);
        }
        if self.leaf_ids.len() < size {
            self.leaf_ids.resize(size, first);
        }

        let mut n = 0usize;
        for si in 0..self.n_splits {
            let backend = self.splits[si].backend;
            for k in 0..self.splits[si].inputs.len() {
                let input = self.splits[si].inputs[k];
                // invariant: an input is registered in a split only after its copies for every
                // pipeline copy were made, in this split pass (current copy epoch)
                let copy = self
                    .get_copy(input, backend.index(), self.cur_copy)
                    .expect("every split input has copies");
                let dep = ctx.view_tensor(input)?;
                ctx.set_src(dep, 0, Some(input))?;
                self.node_ids[n] = self.bid(input);
                self.alloc_graph.add_node(dep)?;
                n += 1;
                self.node_ids[n] = backend.into();
                self.alloc_graph.add_node(copy)?;
                n += 1;
            }
            let (start, end) = (self.splits[si].start, self.splits[si].end);
            // the splits were just cut from `graph`, as ranges inside its node list
            let split_nodes = &graph.nodes()[start..end];
            self.alloc_graph.extend_nodes(split_nodes)?;
            let key_hi = self.key_hi();
            let slots = &self.slots[..];
            for (id, &node) in self.node_ids[n..n + split_nodes.len()]
                .iter_mut()
                .zip(split_nodes)
            {
                *id = Slot::backend_in(slots, key_hi, node);
            }
            n += split_nodes.len();
        }

        let mut l = 0usize;
        if self.n_copies > 1 {
            for gi in 0..self.graph_inputs.len() {
                let input = self.graph_inputs[gi];
                // invariant: a graph input is registered only with a backend, which the split
                // pass does not change afterwards
                let b = self.bid(input).get().expect("graph inputs have a backend");
                for c in 0..self.n_copies {
                    // invariant: as for split inputs, copies are made before registration
                    let copy = self
                        .get_copy(input, b.index(), c)
                        .expect("graph inputs have copies");
                    self.leaf_ids[l] = b.into();
                    self.alloc_graph.add_leaf(copy)?;
                    l += 1;
                }
            }
            for si in 0..self.n_splits {
                let backend = self.splits[si].backend;
                for k in 0..self.splits[si].inputs.len() {
                    let input = self.splits[si].inputs[k];
                    for c in 0..self.n_copies {
                        // invariant: copies are made before an input is registered
                        let copy = self
                            .get_copy(input, backend.index(), c)
                            .expect("split inputs have copies");
                        self.leaf_ids[l] = backend.into();
                        self.alloc_graph.add_leaf(copy)?;
                        l += 1;
                    }
                }
            }
        }
        let leafs = graph.leafs();
        self.alloc_graph.extend_leafs(leafs)?;
        let key_hi = self.key_hi();
        let slots = &self.slots[..];
        for (id, &leaf) in self.leaf_ids[l..l + leafs.len()].iter_mut().zip(leafs) {
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
        let nn = self.alloc_graph.n_nodes();
        let nl = self.alloc_graph.n_leafs();
        self.node_buf_ids.clear();
        self.node_buf_ids
            .extend(self.node_ids[..nn].iter().map(|&b| clamp(b)));
        self.leaf_buf_ids.clear();
        self.leaf_buf_ids
            .extend(self.leaf_ids[..nl].iter().map(|&b| clamp(b)));
    }

    pub(super) fn reserve_alloc_graph(&mut self, ctx: &Context) -> Result<()> {
        self.fill_buffer_ids();
        self.galloc.reserve_n(
            ctx,
            &self.alloc_graph,
            &self.node_buf_ids,
            &self.leaf_buf_ids,
        )?;
        Ok(())
    }

    /// `ggml_backend_sched_alloc_splits`.
    pub(super) fn alloc_splits(&mut self, ctx: &mut Context) -> Result<()> {
        let nn = self.alloc_graph.n_nodes();
        let nl = self.alloc_graph.n_leafs();
        let changed_at = |ids: &[PackedBackend], prev: &[PackedBackend], n: usize| {
            (0..n).any(|i| {
                let p = prev
                    .get(i)
                    .copied()
                    .unwrap_or(PackedBackend::some(BackendId::new(0)));
                ids[i] != p && self.buft_of(ids[i]) != self.buft_of(p)
            })
        };
        let changed = changed_at(&self.node_ids, &self.prev_node_ids, nn)
            || changed_at(&self.leaf_ids, &self.prev_leaf_ids, nl);

        let needs_reserve = changed
            || match self.galloc.alloc_graph(ctx, &self.alloc_graph) {
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
            self.galloc.alloc_graph(ctx, &self.alloc_graph)?;
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
        self.is_alloc = true;
        self.planned = Some(graph.stamp());
        self.split_copy = self.cur_copy;
        Ok(())
    }
}
