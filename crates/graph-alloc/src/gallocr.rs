//! The graph allocator (ggml's `gallocr`): plans compute memory for a graph, then applies the
//! recorded plan to every later graph of the same shape.
//!
//! Why plan and apply are separate: planning walks the whole graph with lifetime counting and
//! a free list; applying only checks that each tensor still fits its recorded slot and places
//! it. A decode loop builds a fresh graph each step with identical shapes, so after the first
//! step only the cheap half runs.
//!
//! Planning follows ggml exactly (see the crate docs for why): phase 1 places leafs, phase 2
//! counts consumers and views and places INPUT tensors, phase 3 walks the nodes in order,
//! placing each (over a dying same-layout parent where the op allows it) and freeing every
//! parent whose last consumer it was. Three deliberate differences, all only where the
//! reference produces a wrong plan:
//!
//! * a root whose view is flagged OUTPUT is treated like an OUTPUT tensor (never freed, never
//!   overwritten in place), because otherwise the output view's bytes get reused;
//! * the validity check on [`GraphAllocator::alloc_graph`] also checks leafs, so a leaf that
//!   grew or lost its storage since the plan was made triggers a re-plan instead of memory
//!   corruption;
//! * a tensor placed in phase 2 (an op node or source flagged INPUT) gets bytes of its own,
//!   never a source's in place: the reference applies its in-place rule there with consumer
//!   counts still incomplete, so such a node took over a leaf that had one consumer counted
//!   so far, and that leaf, placed again at its first use, landed on another leaf the user
//!   had filled (two inputs sharing bytes). Graphs whose INPUT tensors are leafs, as every
//!   graph the scheduler and llama.cpp build, are planned exactly as before.

use backend_core::{Buffer, BufferType, BufferUsage, tensor_alloc, view_init};
use graph::{Context, Graph, MAX_SRC, Op, Tensor, TensorFlags, TensorId, TensorStorage};

use crate::dyn_alloc::DynAllocator;
use crate::error::AllocError;

/// Whether a tensor placed now may take over the bytes of a source whose last consumer it is.
/// Phase 2 places INPUT tensors while consumers are still being counted, so a source's count
/// there says nothing about its last use: those placements are always [`Reuse::Fresh`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Reuse {
    /// The seed's in-place rule applies.
    InPlace,
    /// New bytes, whatever the op.
    Fresh,
}

/// Where a tensor was planned: a buffer id, an offset and the size it may grow to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Slot {
    /// `None` for tensors the plan does not place (views, tensors that had storage).
    buffer_id: Option<u32>,
    offset: usize,
    size_max: usize,
}

impl Slot {
    const NONE: Slot = Slot {
        buffer_id: None,
        offset: usize::MAX,
        size_max: 0,
    };
}

/// Where the slot of one source edge of the plan is recorded, packed in a `u32`:
///
/// * a node position `j` (the source was the tensor at node `j` when planned, so its slot is
///   node `j`'s),
/// * [`LEAF`] | `j`: the tensor at leaf position `j`,
/// * [`EXTRA`] | `e`: entry `e` of the plan's extra slots (a source at no earlier position),
/// * [`EMPTY`]: no source in this slot when planned ([`Slot::NONE`]).
///
/// Why: a source is almost always a leaf or an earlier node, so the check of a later graph
/// only has to see that the same id sits at that position (its fit is checked there) instead
/// of looking the source up again; and a node's plan shrinks from 11 slots (264 bytes) to
/// one slot and ten `u32`s (64 bytes).
type EdgeRef = u32;
const EMPTY: EdgeRef = u32::MAX;
const LEAF: EdgeRef = 1 << 31;
const EXTRA: EdgeRef = 1 << 30;
/// Positions and extra indices must stay below this to be encoded.
const POS_LIMIT: usize = 1 << 30;

/// Position `j` with `tag` (0 for a node, [`LEAF`]), or [`EMPTY`] past [`POS_LIMIT`].
fn encode_pos(j: usize, tag: EdgeRef) -> EdgeRef {
    if j < POS_LIMIT {
        tag | j as EdgeRef
    } else {
        EMPTY
    }
}

/// The recorded plan of one node position: the node's slot and where each source's is.
#[derive(Copy, Clone, Debug)]
struct NodePlan {
    dst: Slot,
    edges: [EdgeRef; MAX_SRC],
    /// What the plan assumed of the node (see [`role`]).
    role: Role,
}

impl Default for NodePlan {
    fn default() -> Self {
        NodePlan {
            dst: Slot::NONE,
            edges: [EMPTY; MAX_SRC],
            role: Role::default(),
        }
    }
}

/// The facts about a tensor that decide how long its memory lives and whether a node may be
/// written over it: its op (in place or not), INPUT / OUTPUT flags and whether it is a view.
/// A plan is re-applied only to positions with the same role; the reference re-applies on
/// sizes alone, so a graph of the same shape whose input flags or in-place ops moved had
/// nodes written over tensors still needed (silently wrong results).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Role {
    op: Op,
    bits: u8,
}

impl Default for Role {
    fn default() -> Self {
        Role {
            op: Op::None,
            bits: 0,
        }
    }
}

#[inline(always)]
fn role(t: &Tensor) -> Role {
    let f = t.flags();
    Role {
        op: t.op(),
        bits: u8::from(f.contains(TensorFlags::INPUT))
            | u8::from(f.contains(TensorFlags::OUTPUT)) << 1
            | u8::from(t.is_view()) << 2,
    }
}

/// No buffer id (for [`Record::size_bid`]).
const NO_BID: u32 = u32::MAX;

/// Planning state of one tensor (ggml's `hash_node`), valid when `epoch` is the current pass.
#[derive(Copy, Clone, Debug)]
struct Record {
    epoch: u32,
    /// Consumer edges still to run (a node using the tensor twice counts twice).
    n_children: i32,
    /// View nodes of this tensor whose consumers have not all run.
    n_views: i32,
    buffer_id: u32,
    /// The buffer id `size` was computed for ([`NO_BID`]: not yet).
    size_bid: u32,
    /// First position of the tensor in the graph being planned (leafs first, then nodes).
    pos: EdgeRef,
    offset: usize,
    /// `bufts[size_bid].alloc_size(tensor)`: asked once per pass, not at allocation, free
    /// and recording each.
    size: usize,
    /// This pass owns live memory for the tensor.
    allocated: bool,
    /// Some view of this tensor is flagged OUTPUT (our fix: protect the root).
    output_view: bool,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            epoch: 0,
            n_children: 0,
            n_views: 0,
            buffer_id: 0,
            size_bid: NO_BID,
            pos: EMPTY,
            offset: 0,
            size: 0,
            allocated: false,
            output_view: false,
        }
    }
}

impl Record {
    /// `bufts[bid].alloc_size(t)`, computed once per tensor and buffer id per pass.
    #[inline]
    fn size_for(&mut self, bufts: &[BufferType], t: &Tensor, bid: u32) -> usize {
        if self.size_bid != bid {
            self.size = bufts[bid as usize].alloc_size(t);
            self.size_bid = bid;
        }
        self.size
    }
}

/// Per-tensor records indexed by `TensorId::index`, reset in O(1) by bumping the epoch.
#[derive(Debug, Default)]
struct Records {
    table: Vec<Record>,
    epoch: u32,
}

impl Records {
    fn begin(&mut self, n_tensors: usize) {
        if self.table.len() < n_tensors {
            self.table.resize(n_tensors, Record::default());
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.table.iter_mut().for_each(|r| r.epoch = 0);
            self.epoch = 1;
        }
    }

    /// `table` holds the context's tensors (`begin(ctx.len())`), and every id passed here was
    /// looked up with `ctx.get` first.
    #[inline]
    fn get(&mut self, id: TensorId) -> &mut Record {
        let epoch = self.epoch;
        let r = &mut self.table[id.index()];
        if r.epoch != epoch {
            *r = Record {
                epoch,
                ..Record::default()
            };
        }
        r
    }
}

/// What the plan check learns for placement, per position: whether the tensor there is sure
/// to have storage once placement has passed it ([`GraphAllocator::settles`]), and per node
/// which source slots placement must still look at (the others hold a tensor settled at a
/// position placement visits first). Sized with the plan.
#[derive(Debug, Default)]
struct Settled {
    leaf: Vec<bool>,
    node: Vec<bool>,
    /// Per node, a bit per source slot placement must look at.
    scan: Vec<u16>,
}

/// The graph allocator (`ggml_gallocr`): one buffer per buffer id, planned per graph.
///
/// Buffer ids are positions in the list of buffer types given to [`GraphAllocator::new`];
/// ids with the identical buffer type share one planner and one buffer (the scheduler gives
/// each backend an id, and backends with the same memory share a compute buffer). Buffers
/// only grow.
///
/// * [`GraphAllocator::reserve`] / [`GraphAllocator::reserve_n`] plan a graph (all on id 0, or
///   with a buffer id per node and per leaf) and size the buffers.
/// * [`GraphAllocator::alloc_graph`] places a graph's tensors by the recorded plan, re-planning
///   first when the graph does not fit it and there is a single buffer id.
///
/// Once the tables have grown to a graph's size, [`GraphAllocator::alloc_graph`] with a valid
/// plan does not allocate on the heap.
///
/// ```
/// use graph::{Context, ElementType, Graph};
/// use graph_alloc::{AllocError, GraphAllocator};
///
/// let buft = backend_cpu::cpu_buffer_type();
/// let mut ctx = Context::new();
/// let x = ctx.new_tensor_1d(ElementType::F32, 64)?;
/// ctx.set_input(x)?;
/// let a = ctx.cont(x)?;
/// let b = ctx.cont(a)?;
/// let mut g = Graph::new(8);
/// g.build_forward_expand(&mut ctx, b)?;
///
/// // two ids with the same buffer type share one buffer
/// let mut galloc = GraphAllocator::new(&[buft.clone(), buft]);
/// assert!(matches!(galloc.alloc_graph(&mut ctx, &g), Err(AllocError::NeedsReserve)));
/// galloc.reserve_n(&ctx, &g, &[0, 1], &[1])?;
/// galloc.alloc_graph(&mut ctx, &g)?;
/// assert_eq!((galloc.buffer_size(0), galloc.buffer_size(1)), (512, 0));
/// assert_eq!(ctx[b].storage().unwrap().offset, 0); // reuses x's bytes, freed after `a`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GraphAllocator {
    bufts: Vec<BufferType>,
    /// Buffer id → index into `planners` (ids with the same buffer type share one).
    planner_of: Vec<usize>,
    planners: Vec<DynAllocator>,
    buffers: Vec<Option<Buffer>>,
    records: Records,
    node_plans: Vec<NodePlan>,
    leaf_slots: Vec<Slot>,
    /// The role ([`role`]) of each leaf when planned.
    leaf_roles: Vec<Role>,
    /// Slots of source edges whose tensor sits at no earlier position ([`EXTRA`]).
    extra_slots: Vec<Slot>,
    /// The edges that get an extra slot, as (node position, source slot), in plan order:
    /// found while planning, given their slots once planning is done.
    extra_edges: Vec<(usize, usize)>,
    /// What the last plan check learnt for placement (see [`Settled`]).
    settled: Settled,
    n_nodes: usize,
    n_leafs: usize,
    /// Whether a complete plan with its buffers exists.
    planned: bool,
}

impl std::fmt::Debug for GraphAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphAllocator")
            .field("bufts", &self.bufts)
            .field("buffers", &self.buffers)
            .field("n_nodes", &self.n_nodes)
            .field("n_leafs", &self.n_leafs)
            .field("planned", &self.planned)
            .finish()
    }
}

impl GraphAllocator {
    /// An allocator with one buffer id per buffer type (`ggml_gallocr_new_n`). Ids whose
    /// buffer type is identical to an earlier id's share that id's planner and buffer.
    pub fn new(bufts: &[BufferType]) -> Self {
        let mut planner_of = Vec::with_capacity(bufts.len());
        let mut planners = Vec::new();
        for (i, b) in bufts.iter().enumerate() {
            match bufts[..i].iter().position(|e| e == b) {
                Some(j) => planner_of.push(planner_of[j]),
                None => {
                    planner_of.push(planners.len());
                    planners.push(DynAllocator::new(b.alignment()));
                }
            }
        }
        GraphAllocator {
            bufts: bufts.to_vec(),
            planner_of,
            planners,
            buffers: vec![None; bufts.len()],
            records: Records::default(),
            node_plans: Vec::new(),
            leaf_slots: Vec::new(),
            leaf_roles: Vec::new(),
            extra_slots: Vec::new(),
            extra_edges: Vec::new(),
            settled: Settled::default(),
            n_nodes: 0,
            n_leafs: 0,
            planned: false,
        }
    }

    /// Number of buffer ids.
    pub fn n_buffers(&self) -> usize {
        self.bufts.len()
    }

    /// The buffer type of `buffer_id`.
    pub fn buffer_type(&self, buffer_id: usize) -> Option<&BufferType> {
        self.bufts.get(buffer_id)
    }

    /// Size of `buffer_id`'s buffer (`ggml_gallocr_get_buffer_size`): 0 when it has none, when
    /// a lower id shares the same buffer (so a sum over ids counts it once), or when the id is
    /// out of range.
    pub fn buffer_size(&self, buffer_id: usize) -> usize {
        let Some(Some(buf)) = self.buffers.get(buffer_id) else {
            return 0;
        };
        if self.buffers[..buffer_id]
            .iter()
            .any(|b| b.as_ref() == Some(buf))
        {
            return 0;
        }
        buf.size()
    }

    /// The buffer of `buffer_id` (shared ids return the same buffer).
    pub fn buffer(&self, buffer_id: usize) -> Option<&Buffer> {
        self.buffers.get(buffer_id).and_then(Option::as_ref)
    }

    /// Plan `graph` with every node and leaf on buffer id 0 and size the buffers
    /// (`ggml_gallocr_reserve`).
    pub fn reserve(&mut self, ctx: &Context, graph: &Graph) -> Result<(), AllocError> {
        self.reserve_impl(ctx, graph.nodes(), graph.leafs(), None, None)
    }

    /// Plan `graph` with a buffer id per node and per leaf (positions as in the graph), then
    /// (re)allocate every buffer that is smaller than the plan needs
    /// (`ggml_gallocr_reserve_n`).
    ///
    /// On error the previous plan is dropped (the next [`GraphAllocator::alloc_graph`]
    /// re-plans or asks for a reserve) and buffers that were already grown are kept.
    pub fn reserve_n(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        node_buffer_ids: &[usize],
        leaf_buffer_ids: &[usize],
    ) -> Result<(), AllocError> {
        self.reserve_impl(
            ctx,
            graph.nodes(),
            graph.leafs(),
            Some(node_buffer_ids),
            Some(leaf_buffer_ids),
        )
    }

    /// Place `graph`'s tensors by the recorded plan (`ggml_gallocr_alloc_graph`).
    ///
    /// The plan is kept if the graph has as many nodes and leafs as the reserved one and every
    /// unplaced tensor still fits its slot (leafs included). Otherwise, with one buffer id the
    /// graph is re-planned first; with several, [`AllocError::NeedsReserve`] is returned and
    /// nothing is changed. Tensors that already have storage are left alone; views are given
    /// their root's storage.
    pub fn alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<(), AllocError> {
        let (nodes, leafs) = (graph.nodes(), graph.leafs());
        // The quick check answers "fits" only when the full check would; anything else (a
        // misfit, a stale id) is decided by the full check, in its order.
        if !self.plan_fits_quick(ctx, nodes, leafs) {
            if !self.plan_fits(ctx, nodes, leafs)? {
                if self.bufts.len() != 1 {
                    tracing::debug!("cannot re-plan a graph over several buffers; call reserve_n");
                    return Err(AllocError::NeedsReserve);
                }
                tracing::debug!("graph does not fit the plan; re-planning");
                self.reserve_impl(ctx, nodes, leafs, None, None)?;
            }
            // placement learns nothing from the quick check here: it looks at every source
            self.settled.scan.iter_mut().for_each(|m| *m = u16::MAX);
        }
        for b in self.buffers.iter().flatten() {
            b.reset();
        }
        // Placement walks the same positions the check just validated, in the reference's
        // order: leafs, then each node's sources and the node.
        let buffers = &self.buffers[..];
        for (&leaf, slot) in leafs.iter().zip(&self.leaf_slots) {
            Self::place(buffers, ctx, leaf, slot)?;
        }
        for ((&node, np), &scan) in nodes.iter().zip(&self.node_plans).zip(&self.settled.scan) {
            // A source is nearly always placed already (a leaf, a weight, an earlier node):
            // the check marked the sources settled at an earlier position, the others are
            // looked at, and those without storage are placed one by one below.
            let mut todo = 0u16;
            if scan != 0 {
                let t = ctx.get(node)?;
                for (k, s) in t.srcs_used().iter().enumerate() {
                    if scan & (1 << k) != 0
                        && let Some(s) = *s
                        && !ctx.get(s)?.has_storage()
                    {
                        todo |= 1 << k;
                    }
                }
            }
            while todo != 0 {
                let k = todo.trailing_zeros() as usize;
                todo &= todo - 1;
                if let Some(s) = ctx.get(node)?.src(k) {
                    let slot = self.edge_slot(np.edges[k]);
                    Self::place(buffers, ctx, s, &slot)?;
                }
            }
            Self::place(buffers, ctx, node, &np.dst)?;
        }
        Ok(())
    }

    // ---- plan validity and application ----

    /// The slot an edge of the plan refers to.
    #[inline]
    fn edge_slot(&self, e: EdgeRef) -> Slot {
        let slot = if e < EXTRA {
            self.node_plans.get(e as usize).map(|np| &np.dst)
        } else if e & (LEAF | EXTRA) == LEAF {
            self.leaf_slots.get((e & !LEAF) as usize)
        } else if e != EMPTY {
            self.extra_slots.get((e & !EXTRA) as usize)
        } else {
            None
        };
        slot.copied().unwrap_or(Slot::NONE)
    }

    /// Whether edge `e` of the plan names the position that holds `s` in this graph.
    #[inline]
    fn covers(nodes: &[TensorId], leafs: &[TensorId], e: EdgeRef, s: TensorId) -> bool {
        if e < EXTRA {
            nodes.get(e as usize) == Some(&s)
        } else if e & (LEAF | EXTRA) == LEAF {
            leafs.get((e & !LEAF) as usize) == Some(&s)
        } else {
            false
        }
    }

    /// Whether source `ts` fits edge `e`, which names no position holding it. A source with
    /// storage (or a view) is not planned, and an extra slot is the source's own; an OUTPUT
    /// tensor's memory is never freed or written over while the graph runs (the scheduler's
    /// pipeline copies of inputs swap positions from step to step). But any other source
    /// without storage that the plan expected at another position moved in the graph: the
    /// lifetime (and in-place decisions) planned for that position do not hold for it.
    #[inline]
    fn edge_fits(&self, e: EdgeRef, ts: &Tensor) -> bool {
        let moved = e < EXTRA || e & (LEAF | EXTRA) == LEAF;
        if moved && !ts.has_storage() && !ts.is_view() && !ts.flags().contains(TensorFlags::OUTPUT)
        {
            return false;
        }
        self.slot_fits(ts, &self.edge_slot(e))
    }

    #[inline]
    fn slot_fits(&self, t: &Tensor, slot: &Slot) -> bool {
        if t.has_storage() || t.is_view() {
            return true;
        }
        // `None`: had storage or was a view when planned, needs bytes now
        slot.buffer_id
            .is_some_and(|bid| slot.size_max >= self.bufts[bid as usize].alloc_size(t))
    }

    /// `true` only if [`GraphAllocator::plan_fits`] would answer `Ok(true)`. A source edge
    /// whose id is the one at the position the plan took its slot from needs no check of its
    /// own: that position's check covers the same tensor against the same slot.
    ///
    /// On `true` it has also filled [`GraphAllocator::settled`] for the placement that follows.
    fn plan_fits_quick(&mut self, ctx: &Context, nodes: &[TensorId], leafs: &[TensorId]) -> bool {
        if !self.planned || nodes.len() != self.n_nodes || leafs.len() != self.n_leafs {
            return false;
        }
        // (taken out and put back, so that `self` can be read meanwhile; no allocation)
        let mut st = std::mem::take(&mut self.settled);
        let fits = self.check_quick(ctx, nodes, leafs, &mut st);
        self.settled = st;
        fits
    }

    fn check_quick(
        &self,
        ctx: &Context,
        nodes: &[TensorId],
        leafs: &[TensorId],
        st: &mut Settled,
    ) -> bool {
        let (st_leaf, st_node, st_scan) = (&mut st.leaf[..], &mut st.node[..], &mut st.scan[..]);
        let leaf_plans = leafs.iter().zip(&self.leaf_slots).zip(&self.leaf_roles);
        for (((&leaf, slot), &r), settled) in leaf_plans.zip(&mut *st_leaf) {
            match ctx.get(leaf) {
                Ok(t) if role(t) == r && self.slot_fits(t, slot) => {
                    *settled = Self::settles(ctx, t);
                }
                _ => return false,
            }
        }
        let st_leaf = &*st_leaf;
        let plans = nodes.iter().zip(&self.node_plans).zip(st_scan);
        for (i, ((&node, np), st_scan)) in plans.enumerate() {
            let Ok(t) = ctx.get(node) else {
                return false;
            };
            if role(t) != np.role || !self.slot_fits(t, &np.dst) {
                return false;
            }
            // (only a node before this one can be settled)
            let Some(earlier) = st_node.get(..i) else {
                return false;
            };
            let mut scan = 0u16;
            for (k, (s, &e)) in t.srcs_used().iter().zip(&np.edges).enumerate() {
                let Some(s) = *s else {
                    continue;
                };
                // covered: the id at the edge's position is this source (checked there);
                // settled: and placement will have given it storage by the time it is here
                let (covered, settled) = if e < EXTRA {
                    let j = e as usize;
                    let c = nodes.get(j) == Some(&s);
                    (c, c && earlier.get(j).is_some_and(|&v| v))
                } else if e & (LEAF | EXTRA) == LEAF {
                    let j = (e & !LEAF) as usize;
                    let c = leafs.get(j) == Some(&s);
                    (c, c && st_leaf.get(j).is_some_and(|&v| v))
                } else {
                    (false, false)
                };
                if !settled {
                    scan |= 1 << k;
                }
                if covered {
                    continue;
                }
                match ctx.get(s) {
                    Ok(ts) if Self::edge_fits(self, e, ts) => {}
                    _ => return false,
                }
            }
            if let Some(v) = st_node.get_mut(i) {
                *v = Self::settles(ctx, t);
            }
            *st_scan = scan;
        }
        true
    }

    /// Whether `t` is sure to have storage once placement has visited its position (or has
    /// failed): it has storage, or it is not a view (it is placed), or it is a view whose
    /// root has storage already (it gets its root's).
    #[inline]
    fn settles(ctx: &Context, t: &Tensor) -> bool {
        match t.view_src() {
            None => true,
            Some(root) => t.has_storage() || ctx.get(root).is_ok_and(Tensor::has_storage),
        }
    }

    /// Whether the recorded plan fits the graph: the full check, every position and edge in
    /// order (the first stale id is the error).
    fn plan_fits(
        &self,
        ctx: &Context,
        nodes: &[TensorId],
        leafs: &[TensorId],
    ) -> Result<bool, AllocError> {
        if !self.planned || nodes.len() != self.n_nodes || leafs.len() != self.n_leafs {
            return Ok(false);
        }
        for (&node, np) in nodes.iter().zip(&self.node_plans) {
            let t = ctx.get(node)?;
            if role(t) != np.role || !self.slot_fits(t, &np.dst) {
                return Ok(false);
            }
            for (s, &e) in t.srcs_used().iter().zip(&np.edges) {
                let Some(s) = *s else { continue };
                let ts = ctx.get(s)?;
                if !Self::covers(nodes, leafs, e, s) && !self.edge_fits(e, ts) {
                    return Ok(false);
                }
            }
        }
        let leaf_plans = leafs.iter().zip(&self.leaf_slots).zip(&self.leaf_roles);
        for ((&leaf, slot), &r) in leaf_plans {
            let t = ctx.get(leaf)?;
            if role(t) != r || !self.slot_fits(t, slot) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Place one tensor by its slot. The plan check has established what `tensor_alloc`
    /// would check again (no storage, not a view, `alloc_size <= size_max`); the offset comes
    /// from the planner, so it is aligned, and `offset + size_max` lies within the buffer
    /// (asserted cheaply below). So the tensor is placed directly: one reference count
    /// increment and the buffer's `init_tensor` hook, undone if the hook fails.
    #[inline(always)]
    fn place(
        buffers: &[Option<Buffer>],
        ctx: &mut Context,
        id: TensorId,
        slot: &Slot,
    ) -> Result<(), AllocError> {
        let t = ctx.get_mut(id)?;
        if t.has_storage() {
            return Ok(());
        }
        if t.is_view() {
            return Self::place_view(buffers, ctx, id);
        }
        // plan_fits guarantees a slot for every unplaced non-view tensor
        let Some(bid) = slot.buffer_id else {
            return Err(AllocError::NeedsReserve);
        };
        let Some(Some(buffer)) = buffers.get(bid as usize) else {
            return Err(AllocError::NeedsReserve);
        };
        if buffer.is_multi()
            || slot
                .offset
                .checked_add(slot.size_max)
                .is_none_or(|end| end > buffer.size())
        {
            // not a plan of ours; let the checked helper report it
            tensor_alloc(ctx, buffer, id, slot.offset)?;
            return Ok(());
        }
        t.set_storage(Some(buffer.storage_at(slot.offset)));
        if let Some(imp) = buffer.implementation()
            && let Err(e) = imp.init_tensor(t)
        {
            t.set_storage(None);
            return Err(e.into());
        }
        Ok(())
    }

    /// Give an unplaced view its root's storage (`view_init`), if the root has storage; a
    /// root without storage was placed by someone else (or not at all): the view is left
    /// alone, as the reference does. For a root in one of our buffers the buffer's hook is
    /// reached through our handle; otherwise the checked helper finds it.
    #[inline(never)]
    fn place_view(
        buffers: &[Option<Buffer>],
        ctx: &mut Context,
        id: TensorId,
    ) -> Result<(), AllocError> {
        let t = ctx.get(id)?;
        let (Some(root), offs) = (t.view_src(), t.view_offs()) else {
            return Ok(());
        };
        let Some(rs) = ctx.get(root)?.storage() else {
            return Ok(());
        };
        let Some(buffer) = buffers.iter().flatten().find(|b| b.holds(rs)) else {
            view_init(ctx, id)?;
            return Ok(());
        };
        // exactly what `view_init` does once its checks (all established here) have passed;
        // the sum is checked because an empty view may sit at any offset
        let offset = rs.offset.checked_add(offs).ok_or_else(|| {
            backend_core::BackendError::out_of_bounds("view_init", rs.offset, offs, usize::MAX)
        })?;
        let storage = TensorStorage {
            buffer: rs.buffer.clone(),
            offset,
        };
        let t = ctx.get_mut(id)?;
        t.set_storage(Some(storage));
        if let Some(imp) = buffer.implementation()
            && let Err(e) = imp.init_tensor(t)
        {
            t.set_storage(None);
            return Err(e.into());
        }
        Ok(())
    }

    // ---- planning ----

    fn check_ids(
        &self,
        what: &'static str,
        n: usize,
        ids: Option<&[usize]>,
    ) -> Result<(), AllocError> {
        let n_buffers = self.bufts.len();
        match ids {
            Some(ids) => {
                if ids.len() != n {
                    return Err(AllocError::BufferIdCount {
                        what,
                        expected: n,
                        got: ids.len(),
                    });
                }
                // A branch-free bitwise or first (vectorised; an unsigned maximum is not on
                // baseline x86-64): it is at least the largest id, so below `n_buffers` every
                // id is in range. Only otherwise are the ids searched for an offender.
                if ids.iter().fold(0, |m, &id| m | id) >= n_buffers
                    && let Some(&id) = ids.iter().find(|&&id| id >= n_buffers)
                {
                    return Err(AllocError::BufferIdOutOfRange { id, n_buffers });
                }
            }
            None if n > 0 && n_buffers == 0 => {
                return Err(AllocError::BufferIdOutOfRange { id: 0, n_buffers });
            }
            None => {}
        }
        Ok(())
    }

    fn reserve_impl(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        leafs: &[TensorId],
        node_ids: Option<&[usize]>,
        leaf_ids: Option<&[usize]>,
    ) -> Result<(), AllocError> {
        self.check_ids("nodes", nodes.len(), node_ids)?;
        self.check_ids("leafs", leafs.len(), leaf_ids)?;
        self.planned = false;
        self.records.begin(ctx.len());
        for p in &mut self.planners {
            p.reset();
        }
        if self.node_plans.len() < nodes.len() {
            self.node_plans.resize(nodes.len(), NodePlan::default());
        }
        self.plan(ctx, nodes, leafs, node_ids, leaf_ids)?;
        self.record_plan(ctx, nodes, leafs)?;
        self.n_nodes = nodes.len();
        self.n_leafs = leafs.len();

        // Grow the buffers to the high-water marks.
        for i in 0..self.bufts.len() {
            let p = self.planner_of[i];
            if let Some(j) = (0..i).find(|&j| self.planner_of[j] == p) {
                self.buffers[i] = self.buffers[j].clone();
            }
            let cur = self.buffers[i].as_ref().map_or(0, Buffer::size);
            let new = self.planners[p].max_size();
            if new > cur || self.buffers[i].is_none() {
                let buft = &self.bufts[i];
                tracing::debug!(
                    buffer_type = buft.name(),
                    from = cur,
                    to = new,
                    "reallocating compute buffer"
                );
                // Drop our handle first, like the reference frees before allocating, so the
                // memory can be reused if no tensor still points into it.
                self.buffers[i] = None;
                let buf = buft.alloc_buffer(new).inspect_err(|e| {
                    tracing::error!(buffer_type = buft.name(), size = new, error = %e,
                        "failed to allocate compute buffer");
                })?;
                buf.set_usage(BufferUsage::Compute);
                self.buffers[i] = Some(buf);
            }
        }
        self.planned = true;
        Ok(())
    }

    /// Record the slots of the plan from the final planning state: each leaf's, each node's
    /// and, for the source edges planning found at no earlier position, an extra slot each.
    /// (Planning has recorded every other edge as the position its source was first seen at.)
    fn record_plan(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        leafs: &[TensorId],
    ) -> Result<(), AllocError> {
        if self.leaf_slots.len() < leafs.len() {
            self.leaf_slots.resize(leafs.len(), Slot::NONE);
        }
        let st = &mut self.settled;
        if st.node.len() < nodes.len() {
            st.node.resize(nodes.len(), false);
            st.scan.resize(nodes.len(), u16::MAX);
        }
        if st.leaf.len() < leafs.len() {
            st.leaf.resize(leafs.len(), false);
        }
        let (records, bufts) = (&mut self.records, &self.bufts[..]);
        self.leaf_roles.clear();
        for (&leaf, ls) in leafs.iter().zip(&mut self.leaf_slots) {
            let t = ctx.get(leaf)?;
            *ls = Self::slot_of(bufts, t, records.get(leaf));
            self.leaf_roles.push(role(t));
        }
        for (&node, np) in nodes.iter().zip(&mut self.node_plans) {
            let t = ctx.get(node)?;
            np.dst = Self::slot_of(bufts, t, records.get(node));
            np.role = role(t);
        }
        self.extra_slots.clear();
        for &(i, k) in &self.extra_edges {
            let Some(s) = ctx.get(nodes[i])?.src(k) else {
                continue;
            };
            let slot = Self::slot_of(bufts, ctx.get(s)?, records.get(s));
            // Past 2^30 such edges (unreachable in practice) the edge records no slot, so a
            // later alloc_graph asks for a reserve instead of misplacing it.
            let x = self.extra_slots.len();
            self.node_plans[i].edges[k] = if x < POS_LIMIT {
                self.extra_slots.push(slot);
                EXTRA | x as u32
            } else {
                EMPTY
            };
        }
        Ok(())
    }

    fn slot_of(bufts: &[BufferType], t: &Tensor, r: &mut Record) -> Slot {
        if t.is_view() || t.has_storage() {
            return Slot::NONE;
        }
        Slot {
            buffer_id: Some(r.buffer_id),
            offset: r.offset,
            size_max: r.size_for(bufts, t, r.buffer_id),
        }
    }

    /// Plan the graph: the three phases of the module docs. On the way it records where the
    /// slot of each source edge will be found: the position its tensor was first seen at
    /// (leafs first, then nodes in order; all such positions are known when the walk reaches
    /// the edge), or, for a source at no earlier position, an entry of `extra_edges`.
    fn plan(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        leafs: &[TensorId],
        node_ids: Option<&[usize]>,
        leaf_ids: Option<&[usize]>,
    ) -> Result<(), AllocError> {
        // (check_ids has matched the lengths; no ids means id 0 everywhere)
        let (node_ids, leaf_ids) = (node_ids.unwrap_or_default(), leaf_ids.unwrap_or_default());
        let node_id = |i: usize| node_ids.get(i).copied().unwrap_or(0);
        let leaf_id = |i: usize| leaf_ids.get(i).copied().unwrap_or(0);
        self.extra_edges.clear();

        // Phase 1: leafs.
        for (j, &leaf) in leafs.iter().enumerate() {
            let t = ctx.get(leaf)?;
            if let Some(root) = t.view_src()
                && t.flags().contains(TensorFlags::OUTPUT)
            {
                self.records.get(root).output_view = true;
            }
            self.allocate_at(ctx, leaf, t, leaf_id(j), encode_pos(j, LEAF))?;
        }

        // Phase 2: count consumers and views, place INPUT tensors. View leafs count too:
        // phase 3 releases a view's count on its root when the view's last consumer is done,
        // leaf or not, and the reference, counting node views only, let the root of a view
        // leaf be freed and overwritten while the view was still to be read. (Node views
        // without an op count as in the reference, which skips them: the scheduler's
        // dependency views are such nodes, and the reference fixtures' plans depend on it;
        // a PARAM view, the other way to make an op-less view a node, counts.)
        for &leaf in leafs {
            if let Some(root) = ctx.get(leaf)?.view_src() {
                self.records.get(root).n_views += 1;
            }
        }
        for (i, &node) in nodes.iter().enumerate() {
            let t = ctx.get(node)?;
            if let Some(root) = t.view_src() {
                let r = self.records.get(root);
                if t.op() != Op::None || t.flags().contains(TensorFlags::PARAM) {
                    r.n_views += 1;
                }
                if t.flags().contains(TensorFlags::OUTPUT) {
                    r.output_view = true;
                }
            }
            if t.flags().contains(TensorFlags::INPUT) {
                self.allocate_node(ctx, node, node_id(i), Reuse::Fresh)?;
            }
            for s in t.srcs_used().iter().flatten() {
                // Looked up before its record is indexed: a source rewired with `set_src` and
                // then rewound away has an index past the table. Phase 3 walks the same
                // sources, checked here.
                let input = ctx.get(*s)?.flags().contains(TensorFlags::INPUT);
                self.records.get(*s).n_children += 1;
                if input {
                    self.allocate_node(ctx, *s, node_id(i), Reuse::Fresh)?;
                }
            }
        }

        // Phase 3: walk the nodes, placing each and freeing parents after their last use.
        for (i, &node) in nodes.iter().enumerate() {
            let b = node_id(i);
            let t = ctx.get(node)?;
            let srcs = t.srcs_used();
            for s in srcs.iter().flatten() {
                self.allocate_node(ctx, *s, b, Reuse::InPlace)?;
            }
            self.allocate_at(ctx, node, t, b, encode_pos(i, 0))?;
            let mut edges = [EMPTY; MAX_SRC];
            for (k, (e, &p)) in edges.iter_mut().zip(srcs).enumerate() {
                let Some(p) = p else {
                    continue;
                };
                let r = self.records.get(p);
                if r.pos != EMPTY {
                    *e = r.pos;
                } else {
                    self.extra_edges.push((i, k));
                }
                r.n_children -= 1;
                if r.n_children != 0 || r.n_views != 0 {
                    continue;
                }
                let allocated = r.allocated;
                if let Some(root) = ctx.get(p)?.view_src() {
                    let rr = self.records.get(root);
                    rr.n_views -= 1;
                    if rr.n_views == 0 && rr.n_children == 0 && rr.allocated {
                        self.free_node(ctx, root)?;
                    }
                } else if allocated {
                    self.free_node(ctx, p)?;
                }
            }
            self.node_plans[i].edges = edges;
        }
        Ok(())
    }

    /// Give `id` memory unless it has some (or storage, or is a view). Most calls find it
    /// placed already, so that test is inlined into the phases and the work is not.
    #[inline(always)]
    fn allocate_node(
        &mut self,
        ctx: &Context,
        id: TensorId,
        buffer_id: usize,
        reuse: Reuse,
    ) -> Result<(), AllocError> {
        let t = ctx.get(id)?;
        if !Self::claim(self.records.get(id), t) {
            return Ok(());
        }
        self.allocate_new(ctx, id, t, buffer_id, reuse)
    }

    /// [`GraphAllocator::allocate_node`] for the tensor `t` (`id`) at position `pos` of the
    /// graph, which becomes the tensor's position if it is the first one seen.
    #[inline(always)]
    fn allocate_at(
        &mut self,
        ctx: &Context,
        id: TensorId,
        t: &Tensor,
        buffer_id: usize,
        pos: EdgeRef,
    ) -> Result<(), AllocError> {
        let rec = self.records.get(id);
        if rec.pos == EMPTY {
            rec.pos = pos;
        }
        if !Self::claim(rec, t) {
            return Ok(());
        }
        self.allocate_new(ctx, id, t, buffer_id, Reuse::InPlace)
    }

    /// Whether `t` (its record `rec`) still needs memory of its own: not pre-allocated, not
    /// a view and not yet placed in this pass. When it does, it is marked placed.
    #[inline(always)]
    fn claim(rec: &mut Record, t: &Tensor) -> bool {
        if t.has_storage() || rec.allocated || t.is_view() {
            return false;
        }
        rec.allocated = true;
        true
    }

    #[inline(never)]
    fn allocate_new(
        &mut self,
        ctx: &Context,
        id: TensorId,
        t: &Tensor,
        buffer_id: usize,
        reuse: Reuse,
    ) -> Result<(), AllocError> {
        if reuse == Reuse::InPlace && t.op().can_inplace() {
            for p in t.srcs_used().iter().flatten().copied() {
                let pt = ctx.get(p)?;
                let pr = self.records.get(p);
                let (allocated, output_view, n_children, n_views) =
                    (pr.allocated, pr.output_view, pr.n_children, pr.n_views);
                let (pr_bid, pr_offset) = (pr.buffer_id, pr.offset);
                if !allocated || output_view || pt.flags().contains(TensorFlags::OUTPUT) {
                    continue;
                }
                // A view is never "own" (views are never given memory), so the reference's
                // branch for view parents cannot run; its root-OUTPUT test is kept for form.
                if let Some(root) = pt.view_src()
                    && ctx.get(root)?.flags().contains(TensorFlags::OUTPUT)
                {
                    continue;
                }
                // (the counts first: they are cheaper than the layout and have no effects)
                if n_children != 1 || n_views != 0 || !pt.same_layout(t) {
                    continue;
                }
                debug_assert!(!pt.is_view(), "views are never allocated");
                let r = self.records.get(id);
                r.buffer_id = pr_bid;
                r.offset = pr_offset;
                self.records.get(p).allocated = false;
                return Ok(());
            }
        }

        let r = self.records.get(id);
        let size = r.size_for(&self.bufts, t, buffer_id as u32);
        let offset = self.planners[self.planner_of[buffer_id]].alloc(size)?;
        r.buffer_id = buffer_id as u32;
        r.offset = offset;
        Ok(())
    }

    fn free_node(&mut self, ctx: &Context, id: TensorId) -> Result<(), AllocError> {
        let t = ctx.get(id)?;
        let r = self.records.get(id);
        if t.flags().contains(TensorFlags::OUTPUT) || r.output_view {
            return Ok(());
        }
        r.allocated = false;
        let (bid, offset) = (r.buffer_id, r.offset);
        let size = r.size_for(&self.bufts, t, bid);
        self.planners[self.planner_of[bid as usize]].free(offset, size);
        Ok(())
    }
}
