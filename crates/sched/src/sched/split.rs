//! Splitting: cutting the assigned graph into runs of nodes on one backend.

use backend_core::BufferUsage;
use graph::{Context, Graph};

use super::backend_id::{BackendId, Settled};
use super::{MAX_SPLIT_INPUTS, Result, Scheduler, Split};
use crate::error::SchedError;

/// The splits of the last plan: the first `n` entries of `list` (the entries past them keep
/// their input lists' capacity for the next plan).
#[derive(Debug, Default)]
pub(super) struct SplitList {
    pub(super) list: Vec<Split>,
    pub(super) n: usize,
}

impl Scheduler {
    /// With reference limits, a graph larger than the seed's hash set is an error.
    pub(super) fn check_capacity(&self, graph: &Graph) -> Result<()> {
        if self.options.strict {
            let cap = crate::hash_size(self.options.graph_size);
            let n = graph.n_nodes() + graph.n_leafs();
            if n > cap {
                return Err(SchedError::GraphTooLarge { n, capacity: cap });
            }
        }
        Ok(())
    }

    /// Assign backends and cut `graph` into splits with input copies, without allocating
    /// (`ggml_backend_sched_split_graph`; what [`Scheduler::reserve`] and
    /// [`Scheduler::alloc_graph`] do first). Copies and dependency views are created in
    /// `ctx`. On return the caller's graph has its original sources again.
    pub fn split_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.check_capacity(graph)?;
        let r = self.plan_graph(ctx, graph);
        self.restore_rewrites(ctx);
        r
    }

    /// Assign backends, cut splits, make input copies and build the allocation graph; the
    /// caller restores the rewritten sources.
    pub(super) fn plan_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.restore_rewrites(ctx);
        self.rewrites.list.clear();
        self.rewrites.made_for = self.pipeline.cur_copy;
        // copies made by an earlier split may have been rewound away with the caller's
        // context; every split makes its own (the seed relies on a reset in between)
        self.copies.epoch = self.copies.epoch.wrapping_add(1).max(1);
        self.copies.blocks.clear();
        self.splits.n = 0;
        self.state.planned = None;
        self.copies.graph_inputs.clear();
        self.state.is_reset = false;
        // usages may have changed and buffers come and gone since the last split
        self.caps.memo.clear();

        // the dense per-compute-node lists the phases hand on (kept for their capacity)
        let mut compute = std::mem::take(&mut self.lists.compute);
        let mut bids = std::mem::take(&mut self.lists.bids);
        let mut settled = std::mem::take(&mut self.lists.settled);
        compute.clear();
        bids.clear();
        settled.clear();
        let r = self
            .assign_backends(ctx, graph, &mut compute, &mut bids, &mut settled)
            .and_then(|()| self.cut_splits(ctx, graph, &compute, &settled));
        self.lists.compute = compute;
        self.lists.bids = bids;
        self.lists.settled = settled;
        r?;

        if self.options.debug > 0 {
            let layout = self.layout(ctx, graph, self.options.debug);
            tracing::debug!(target: "sched", "{layout}");
        }

        self.build_alloc_graph(ctx, graph)
    }

    /// Start split `i_split` on `backend` at node `start` (an entry left from an earlier plan is
    /// reused, keeping its input list's capacity).
    pub(super) fn new_split(&mut self, i_split: usize, backend: BackendId, start: usize) {
        let handle = &self.backends[backend.index()];
        if i_split < self.splits.list.len() {
            let s = &mut self.splits.list[i_split];
            if s.handle != *handle {
                // a plan like the last one keeps its handles (no reference count touched)
                s.handle = handle.clone();
            }
            s.backend = backend;
            s.start = start;
            s.end = start;
            s.inputs.clear();
        } else {
            self.splits.list.push(Split {
                backend,
                handle: handle.clone(),
                start,
                end: start,
                inputs: Vec::with_capacity(MAX_SPLIT_INPUTS),
            });
        }
    }

    /// Cut the assigned graph into splits and make their input copies (the seed's pass 5).
    ///
    /// `compute` holds the positions of the compute (non-view) nodes and `settled` what
    /// [`Scheduler::settle_sources_and_views`] noted of them: a node settled on one backend with
    /// all its sources needs no source check and no copy without pipeline copies.
    #[inline(never)]
    pub(super) fn cut_splits(
        &mut self,
        ctx: &mut Context,
        graph: &Graph,
        compute: &[usize],
        settled: &[Settled],
    ) -> Result<()> {
        let nodes = graph.nodes();
        let no_pipeline = self.pipeline.n_copies == 1;
        let mut i_split = 0usize;
        // the first split's backend: the first non-view node's (kept from the last plan when
        // every node is a view, as the seed does)
        let mut first_backend = self
            .splits
            .list
            .first()
            .map_or(BackendId::new(0), |s| s.backend);
        if let Some(&i) = compute.first() {
            let Some(b) = self.bid(nodes[i]).get() else {
                let t = ctx.get(nodes[i])?;
                return Err(SchedError::NoBackendForOp {
                    tensor: t.name().to_owned(),
                    op: t.op().name(),
                });
            };
            first_backend = b;
        }
        self.new_split(0, first_backend, 0);
        // `splits` holds at least `i_split + 1` entries: `new_split(i)` follows every step of
        // `i_split` (and pushes when it reaches the end of the list).
        let mut cur = first_backend;
        for (&i, &note) in compute.iter().zip(settled) {
            if no_pipeline && let Some(nb) = note.backend() {
                // every source is on `nb`: the new-split check below finds nothing, and
                // nothing is copied (the general path would decide the same)
                if nb != cur {
                    self.splits.list[i_split].end = i;
                    i_split += 1;
                    self.new_split(i_split, nb, i);
                    cur = nb;
                }
                continue;
            }
            let node = nodes[i];
            let t = ctx.get(node)?;
            let srcs = t.srcs_used();
            let Some(nb) = self.bid(node).get() else {
                return Err(SchedError::NoBackendForOp {
                    tensor: t.name().to_owned(),
                    op: t.op().name(),
                });
            };

            let mut need_new_split = false;
            // whether every source is known to be on `cur`
            let mut srcs_on_cur = false;
            let n_inputs = self.splits.list[i_split].inputs.len();
            if nb == cur && n_inputs > 0 {
                srcs_on_cur = true;
                for s in srcs.iter().flatten() {
                    let sb = self.bid(*s);
                    if sb == cur {
                        // both checks below need a source on another backend
                        continue;
                    }
                    srcs_on_cur = false;
                    let st = ctx.get(*s)?;
                    if let Some(sst) = Self::own_storage(st)
                        && self.buffer_facts(sst).usage == Some(BufferUsage::Weights)
                        && !self.buffer_supported(ctx, *s, cur.index())
                    {
                        need_new_split = true;
                        break;
                    }
                    if n_inputs >= MAX_SPLIT_INPUTS {
                        let supported = self.buffer_supported(ctx, *s, cur.index());
                        if self.get_copy(*s, cur.index(), 0).is_none() && !supported {
                            need_new_split = true;
                            break;
                        }
                    }
                }
            }

            if nb != cur || need_new_split {
                self.splits.list[i_split].end = i;
                i_split += 1;
                self.new_split(i_split, nb, i);
                cur = nb;
                srcs_on_cur = false;
            }

            // the common case: every source is on this split's backend and there are no
            // pipeline copies, so nothing is copied or rewritten
            if self.pipeline.n_copies == 1
                && (srcs_on_cur || srcs.iter().flatten().all(|&s| self.bid(s) == cur))
            {
                continue;
            }
            // the context is changed below: work on a copy of the source slots
            let n_src = srcs.len();
            let srcs = *t.srcs();
            self.copy_inputs(ctx, node, &srcs[..n_src], i_split, cur)?;
        }
        self.splits.list[i_split].end = nodes.len();
        self.splits.n = i_split + 1;
        Ok(())
    }
}
