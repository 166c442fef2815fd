//! Backend assignment: which backend runs each node, and where the tensors it reads live.

use backend_core::{BufferUsage, Device, storage_buffer_type};
use graph::{Context, Graph, Op, Tensor, TensorFlags, TensorId};

use super::backend_id::{BackendId, PackedBackend, Settled};
use super::buffers::BufferMemo;
use super::table::Slot;
use super::{Cause, Result, Scheduler};
use crate::error::SchedError;

/// Dense lists over the compute (non-view) nodes, filled by the assignment phase: kept
/// between plans for their capacity.
#[derive(Debug, Default)]
pub(super) struct NodeLists {
    /// Positions in the graph of the compute nodes.
    pub(super) compute: Vec<usize>,
    /// The backend of each compute node while backends are expanded and upgraded (a dense
    /// mirror of their slots, which the sweeps read without a slot lookup).
    pub(super) bids: Vec<PackedBackend>,
    /// What [`Scheduler::settle_sources_and_views`] noted of each compute node for
    /// [`Scheduler::cut_splits`].
    pub(super) settled: Vec<Settled>,
}

impl Scheduler {
    /// Give every node of `graph` a backend (the seed's passes 1 to 4 of
    /// `ggml_backend_sched_split_graph`), user assignments untouched.
    ///
    /// On return `compute` lists the positions of the compute (non-view) nodes, and `settled`
    /// holds what [`Scheduler::settle_sources_and_views`] noted of each of them for the
    /// splitting phase; `bids` is scratch. All three are expected empty.
    pub(super) fn assign_backends(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        compute: &mut Vec<usize>,
        bids: &mut Vec<PackedBackend>,
        settled: &mut Vec<Settled>,
    ) -> Result<()> {
        let any_gpu = self.assign_from_buffers(ctx, graph, compute, bids)?;
        let nodes = graph.nodes();
        self.expand_assignments(ctx, nodes, compute, bids, any_gpu);
        self.assign_best_or_upgrade(ctx, nodes, compute, bids)?;
        let key_hi = self.key_hi();
        // one note per compute node, written in place
        settled.resize(compute.len(), Settled::UNSETTLED);
        Self::settle_sources_and_views(&mut self.table.slots, key_hi, ctx, graph, settled)
    }

    /// `ggml_backend_sched_backend_id_from_cur` (`t` is `id`'s tensor; `memo` and `devices`
    /// are the scheduler's, passed apart so that `assign_from_buffers` can hold the tensor's
    /// slot).
    #[inline(always)]
    pub(super) fn backend_id_from_cur(
        memo: &mut BufferMemo,
        devices: &[Device],
        ctx: &Context,
        id: TensorId,
        t: &Tensor,
    ) -> Result<(PackedBackend, Cause)> {
        // the view root, looked up once (a stale one only fails below, as the seed's order has
        // it: its storage counts as none first)
        let view_root = t.view_src().map(|vs| ctx.get(vs));
        let root = match &view_root {
            Some(vt) => vt.as_ref().ok().and_then(|vt| vt.storage()),
            None => t.storage(),
        };
        if let Some(st) = root {
            let facts = memo.facts(st, devices);
            let b = Self::backend_from_facts(devices, ctx, facts, st, t, id);
            if b.is_some() {
                return Ok((b, Cause::Dst));
            }
        }
        if let Some(vt) = view_root {
            let vt = vt?;
            // A root that is no view itself decides through the storage just asked about,
            // with the same op: the answer is the same "none", so it is not asked again.
            if vt.view_src().is_some()
                && let Some(vst) = Self::root_storage(ctx, vt)
            {
                let facts = memo.facts(vst, devices);
                let b = Self::backend_from_facts(devices, ctx, facts, vst, vt, id);
                if b.is_some() {
                    return Ok((b, Cause::ViewSrc));
                }
            }
        }
        if let Some(st) = root {
            let buffer = storage_buffer_type(st).map_or("?", |b| b.name()).to_owned();
            return Err(SchedError::PreallocatedUnsupported {
                tensor: t.name().to_owned(),
                buffer,
                op: t.op().name(),
            });
        }
        // the scheduler has at least one backend
        let last = BackendId::new(devices.len() - 1);
        if t.flags().contains(TensorFlags::INPUT) {
            return Ok((last.into(), Cause::Input));
        }
        if t.op() == Op::Rope {
            // ROPE does not follow its weights: the seed skips every source of a ROPE
            return Ok((PackedBackend::NONE, Cause::None));
        }
        for (i, s) in t.srcs_used().iter().enumerate() {
            let Some(s) = *s else { continue };
            let src = ctx.get(s)?;
            let Some(st) = Self::own_storage(src) else {
                continue;
            };
            let facts = memo.facts(st, devices);
            if facts.usage != Some(BufferUsage::Weights) {
                continue;
            }
            // `src` is no view (it has its own storage), so its buffer decides
            let sb = Self::backend_from_facts(devices, ctx, facts, st, src, id);
            if sb == last && facts.host {
                for (b, d) in devices[..last.index()].iter().enumerate() {
                    if d.supports_op(ctx, id) && d.offload_op(ctx, id) {
                        return Ok((BackendId::new(b).into(), Cause::Offload));
                    }
                }
            }
            return Ok((sb, Cause::Weight(i as u8)));
        }
        Ok((PackedBackend::NONE, Cause::None))
    }

    /// Assign `node` to `cur` if its device runs the op; returns whether it did.
    pub(super) fn set_if_supported(
        &mut self,
        ctx: &Context,
        node: TensorId,
        cur: BackendId,
    ) -> bool {
        if self.devices[cur.index()].supports_op(ctx, node) {
            self.set_bid(node, cur.into(), Cause::Expand);
            true
        } else {
            false
        }
    }

    /// [`Scheduler::assign_from_buffers`] for one tensor: `bid`, and when unassigned
    /// `backend_id_from_cur` then `set_bid`, on one slot access (`slots`, `memo`, `devices`
    /// and `key_hi` are the scheduler's, passed apart; `slots` holds every tensor of `ctx`).
    #[inline(always)]
    pub(super) fn assign_from_cur(
        slots: &mut [Slot],
        memo: &mut BufferMemo,
        devices: &[Device],
        key_hi: u64,
        ctx: &Context,
        id: TensorId,
        t: &Tensor,
    ) -> Result<PackedBackend> {
        let key = Slot::key_of(key_hi, id);
        let s = &mut slots[id.index()];
        if s.key == key {
            if s.backend.is_some() {
                return Ok(s.backend);
            }
        } else {
            // a fresh slot reads as no slot (no backend, no cause, no copies), so making it
            // before an error changes nothing
            *s = Slot::fresh(key);
        }
        let (b, c) = Self::backend_id_from_cur(memo, devices, ctx, id, t)?;
        s.backend = b;
        s.cause = c;
        Ok(b)
    }

    /// Whether the leaf `t` is one the scheduler treats as compute memory although it reads
    /// like a weight: op `NONE`, not a graph input, no view, and either no memory (the
    /// allocator will give it compute memory) or memory in a buffer of usage `Compute`.
    /// Buffers of usage `Any` hold state the caller owns (caches) and are not reported; a
    /// weight in one only loses the "ops follow their weights" rule, as in the seed.
    #[inline(always)]
    pub(super) fn in_compute_memory(memo: &mut BufferMemo, devices: &[Device], t: &Tensor) -> bool {
        if t.op() != Op::None || t.view_src().is_some() || t.flags().contains(TensorFlags::INPUT) {
            return false;
        }
        match t.storage() {
            None => true,
            Some(st) => memo.facts(st, devices).usage == Some(BufferUsage::Compute),
        }
    }

    /// Report the leaf `id` (`t`), which [`Scheduler::in_compute_memory`] found: an error with
    /// `strict`, else a warning the first time this tensor is seen (`reported` holds, per
    /// tensor index, 1 + the generation of the tensor last warned about; it grows only when a
    /// new tensor is reported, so a plan repeated over the same tensors allocates nothing).
    #[cold]
    #[inline(never)]
    pub(super) fn report_unplaced(
        reported: &mut Vec<u32>,
        strict: bool,
        id: TensorId,
        t: &Tensor,
    ) -> Result<()> {
        if strict {
            return Err(SchedError::UnplacedWeights {
                tensor: id,
                name: t.name().to_owned(),
            });
        }
        let mark = id.generation().wrapping_add(1).max(1);
        if reported.get(id.index()) == Some(&mark) {
            return Ok(());
        }
        if reported.len() <= id.index() {
            reported.resize(id.index() + 1, 0);
        }
        reported[id.index()] = mark;
        tracing::warn!(
            target: "sched",
            tensor = t.name(),
            "leaf {} is not in a weights buffer and no graph input: the scheduler treats it as \
             compute memory (its data is not kept); load it into a weights buffer or mark it as \
             an input",
            t.name()
        );
        Ok(())
    }

    /// Assign pre-allocated tensors, inputs and ops on weights (the seed's pass 1). Returns
    /// whether any node sits on a backend other than the last one.
    ///
    /// The positions of the compute (non-view) nodes are appended to `compute` and their
    /// backends to `bids`.
    #[inline(never)]
    pub(super) fn assign_from_buffers(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        compute: &mut Vec<usize>,
        bids: &mut Vec<PackedBackend>,
    ) -> Result<bool> {
        let nodes = graph.nodes();
        let leafs = graph.leafs();
        // every tensor of the context gets a slot up front
        if let Some(last) = ctx.len().checked_sub(1) {
            Slot::reserve_index(&mut self.table.slots, last);
        }
        let key_hi = self.key_hi();
        let memo = &mut self.caps.memo;
        let devices = &self.devices[..];
        // exactly the context's tensors, so that a tensor `ctx.get` found has a slot without
        // a second bounds check
        let slots = &mut self.table.slots[..ctx.len()];
        let reported = &mut self.reported;
        let strict_weights = self.options.strict_weights;
        for &leaf in leafs {
            let t = ctx.get(leaf)?;
            Self::assign_from_cur(slots, memo, devices, key_hi, ctx, leaf, t)?;
            if Self::in_compute_memory(memo, devices, t) {
                Self::report_unplaced(reported, strict_weights, leaf, t)?;
            }
        }
        // whether any node sits on a backend other than the last one: the first two sweeps of
        // `expand_assignments` expand only such assignments, and are skipped without one (one
        // backend); none is no such backend
        let n_first = self.backends.len() - 1;
        let mut any_gpu = false;
        for (pos, &node) in nodes.iter().enumerate() {
            let t = ctx.get(node)?;
            let b = Self::assign_from_cur(slots, memo, devices, key_hi, ctx, node, t)?;
            any_gpu |= b.is_below(n_first);
            if !t.op().is_view_op() {
                compute.push(pos);
                bids.push(b);
            }
        }

        Ok(any_gpu)
    }

    /// Expand assignments to unassigned neighbours: non-CPU backends down and up, then every
    /// backend down and up (the seed's pass 2).
    ///
    /// `bids[k]` is the backend of compute node `nodes[compute[k]]`, kept in step with its
    /// slot.
    #[inline(never)]
    pub(super) fn expand_assignments(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        compute: &[usize],
        bids: &mut [PackedBackend],
        any_gpu: bool,
    ) {
        let n = compute.len().min(bids.len());
        for only_gpu in [true, false] {
            if only_gpu && !any_gpu {
                // every assigned node is on the last backend: these sweeps would set nothing
                continue;
            }
            let last_unassigned = self.expand_sweep(ctx, nodes, compute, bids, 0..n, only_gpu);
            // Above the last node the down sweep left without a backend every node has one, so
            // the up sweep sets nothing there and only the next node decides what it expands:
            // it starts at that node.
            let start = last_unassigned.map_or(0, |k| (k + 2).min(n));
            self.expand_sweep(ctx, nodes, compute, bids, (0..start).rev(), only_gpu);
        }
    }

    /// One sweep of [`Scheduler::expand_assignments`] over the compute nodes `ks`, in that order: a
    /// node with a backend sets the backend expanded (none for the last backend when `only_gpu`), a
    /// node without gets it where its device runs the op. Returns the last `k` visited that is left
    /// without a backend.
    #[inline(always)]
    pub(super) fn expand_sweep(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        compute: &[usize],
        bids: &mut [PackedBackend],
        ks: impl Iterator<Item = usize>,
        only_gpu: bool,
    ) -> Option<usize> {
        let last = BackendId::new(self.backends.len() - 1);
        // packed, as `bids` is: the sweep compares and copies it without unpacking
        let mut cur = PackedBackend::NONE;
        let mut unassigned = None;
        for k in ks {
            let b = bids[k];
            if b.is_some() {
                cur = if only_gpu && b == last {
                    PackedBackend::NONE
                } else {
                    b
                };
            } else if let Some(c) = cur.get()
                && self.set_if_supported(ctx, nodes[compute[k]], c)
            {
                bids[k] = cur;
            } else {
                unassigned = Some(k);
            }
        }
        unassigned
    }

    /// Give unassigned nodes the backend with most usable inputs; upgrade assigned nodes to a
    /// higher-priority backend with the same buffer type (the seed's pass 3).
    ///
    /// `bids[k]` is the backend of compute node `nodes[compute[k]]` after
    /// [`Scheduler::expand_assignments`].
    #[inline(never)]
    pub(super) fn assign_best_or_upgrade(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        compute: &[usize],
        bids: &[PackedBackend],
    ) -> Result<()> {
        for (&pos, &b) in compute.iter().zip(bids) {
            if b == BackendId::new(0)
                || b.get().is_some_and(|b| {
                    !self
                        .caps
                        .upgradable
                        .get(b.index())
                        .copied()
                        .unwrap_or(false)
                })
            {
                // nothing to upgrade to
                continue;
            }
            let b = b.get();
            let node = nodes[pos];
            let t = ctx.get(node)?;
            let srcs = t.srcs_used();
            if let Some(b) = b {
                for cand in 0..b.index() {
                    if self.bufts[cand] == self.bufts[b.index()]
                        && self.devices[cand].supports_op(ctx, node)
                    {
                        let mut ok = true;
                        for s in srcs.iter().flatten() {
                            if !self.buffer_supported(ctx, *s, cand) {
                                ok = false;
                                break;
                            }
                        }
                        if ok {
                            self.set_bid(node, BackendId::new(cand).into(), Cause::Upgrade);
                            break;
                        }
                    }
                }
            } else {
                let mut best = -1i32;
                for cand in 0..self.backends.len() {
                    if !self.devices[cand].supports_op(ctx, node) {
                        continue;
                    }
                    let mut n_supported = 0;
                    for s in srcs.iter().flatten() {
                        let vs = ctx.get(*s)?.view_src();
                        if (self.bid(*s).is_some() || self.bid_opt(vs).is_some())
                            && self.buffer_supported(ctx, *s, cand)
                        {
                            n_supported += 1;
                        }
                    }
                    if n_supported > best {
                        best = n_supported;
                        self.set_bid(node, BackendId::new(cand).into(), Cause::Best);
                    }
                }
            }
        }

        Ok(())
    }

    /// Sources and views without a backend follow their root or their consumer (the seed's
    /// pass 4).
    ///
    /// Also notes, for [`Scheduler::cut_splits`], each compute node whose backend and sources'
    /// backends are settled and equal: `settled` holds one [`Settled`] per compute node, in the
    /// order [`Scheduler::assign_from_buffers`] listed them. Settled is final: this phase only
    /// assigns tensors without a backend.
    ///
    /// The slot table (which holds every tensor of `ctx` since `assign_from_buffers`) is walked
    /// through `slots` and `key_hi`, the scheduler's passed apart, so that the per-source loop
    /// keeps them in registers.
    #[inline(never)]
    pub(super) fn settle_sources_and_views(
        slots: &mut [Slot],
        key_hi: u64,
        ctx: &Context,
        graph: &Graph,
        settled: &mut [Settled],
    ) -> Result<()> {
        let mut notes = settled.iter_mut();
        for &node in graph.nodes() {
            let t = ctx.get(node)?;
            let mut cur = Slot::backend_in(slots, key_hi, node);
            if cur.is_none()
                && let Some(vs) = t.view_src()
            {
                let b = Slot::backend_in(slots, key_hi, vs);
                if b.is_some() {
                    Slot::set_in(slots, key_hi, node, b, Cause::FromViewSrc);
                    cur = b;
                }
            }
            // every source ends this step on `cur` (and `cur` is a backend); a source without
            // a backend (which leaves the node unsettled) is rare, and then the sources are
            // walked again, assigning as they go
            let srcs = t.srcs_used();
            let bid = |s: &TensorId| Slot::backend_in(slots, key_hi, *s);
            let mut settled = cur.is_some() && srcs.iter().flatten().all(|s| bid(s) == cur);
            if !settled && srcs.iter().flatten().any(|s| bid(s).is_none()) {
                settled = Self::settle_sources(slots, key_hi, ctx, t, cur)?;
            }
            // `assign_from_buffers` listed exactly the non-view nodes
            if !t.op().is_view_op()
                && let Some(note) = notes.next()
            {
                *note = Settled::when(settled, cur);
            }
        }

        Ok(())
    }

    /// [`Scheduler::settle_sources_and_views`] for the sources of `t`, a node on `cur` (maybe none)
    /// with a source without a backend: in order, a view follows its root, anything else its
    /// consumer. Returns whether every source ends on `cur` and `cur` is a backend.
    #[cold]
    #[inline(never)]
    pub(super) fn settle_sources(
        slots: &mut [Slot],
        key_hi: u64,
        ctx: &Context,
        t: &Tensor,
        cur: PackedBackend,
    ) -> Result<bool> {
        let mut settled = cur.is_some();
        for &s in t.srcs_used().iter().flatten() {
            let mut sb = Slot::backend_in(slots, key_hi, s);
            if sb.is_none() {
                let (b, cause) = match ctx.get(s)?.view_src() {
                    Some(svs) => (Slot::backend_in(slots, key_hi, svs), Cause::FromViewSrc),
                    None => (cur, Cause::FromConsumer),
                };
                if b.is_some() {
                    Slot::set_in(slots, key_hi, s, b, cause);
                    sb = b;
                }
            }
            settled &= sb == cur;
        }
        Ok(settled)
    }
}
