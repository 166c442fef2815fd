//! The scheduler proper: backend assignment, splitting, the allocation graph, compute.
//!
//! The decisions follow the seed (`ggml_backend_sched_split_graph` and friends) step for step,
//! because the plans users and fixtures see are defined by them; only the data structures
//! differ:
//!
//! * Per-tensor state (backend id, the pass that chose it, input copies per backend and
//!   pipeline copy) lives in a direct-address table indexed by [`TensorId::index`] and stamped
//!   with an epoch. `reset` bumps the epoch instead of clearing memory, the table grows with
//!   the context instead of aborting when a hash set is full (#16555), and once it has grown
//!   nothing on the per-step path allocates.
//! * The seed points `node->src[j]` of the caller's graph at input copies and leaves it so,
//!   which breaks reserve-then-alloc on one graph (llama.cpp #15434). We record each rewrite,
//!   apply them only while the allocator or the backends look at the graph, and restore the
//!   original sources before any public call returns.

use std::fmt::Write as _;
use std::time::Instant;

use backend_core::{
    Backend, BufferType, BufferUsage, ComputeStatus, Device, DeviceType, Event,
    storage_buffer_type, storage_usage,
};
use graph::{Context, Graph, Op, Tensor, TensorFlags, TensorId, TensorName};

use crate::error::SchedError;
use crate::galloc::{AllocError, GraphAllocator};
use crate::trace::{SpanKind, TraceSink, TraceSpan};

mod backend_id;

use backend_id::{BackendId, PackedBackend, Settled};

/// Most backends one scheduler drives (`GGML_SCHED_MAX_BACKENDS`).
pub const MAX_BACKENDS: usize = 16;
/// Inputs per split at which a new split is started (`GGML_SCHED_MAX_SPLIT_INPUTS`, which is
/// `GGML_MAX_SRC` in the seed). Plans depend on it, so it is kept; the per-split input list
/// itself grows past it unless reference limits are on.
pub const MAX_SPLIT_INPUTS: usize = graph::MAX_SRC;
/// Pipeline copies in parallel mode (`GGML_SCHED_MAX_COPIES`).
pub const DEFAULT_PARALLEL_COPIES: usize = 4;

type Result<T> = std::result::Result<T, SchedError>;

/// Which rule gave a tensor its backend (the seed's `SET_CAUSE` tags, which it compiles out;
/// we keep them for the debug layout).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// Not assigned, or assigned by no recorded rule.
    #[default]
    None,
    /// Pass 1: the tensor's own (or view root's) buffer decides (`1.dst`).
    Dst,
    /// Pass 1: the view root's buffer decides (`1.vsrc`).
    ViewSrc,
    /// Pass 1: a graph input goes to the last backend (`1.inp`).
    Input,
    /// Pass 1: a higher-priority backend wants to offload an op on host weights (`1.off`).
    Offload,
    /// Pass 1: the op follows the weight in source slot N (`1.wgtN`).
    Weight(u8),
    /// Pass 2: expanded from a neighbour (`2.sup`).
    Expand,
    /// Pass 3: the backend with the most usable inputs (`3.best`).
    Best,
    /// Pass 3: upgraded to a higher-priority backend with the same buffer type (`3.upg`).
    Upgrade,
    /// Pass 4: a view follows its root (`4.vsrc`).
    FromViewSrc,
    /// Pass 4: a source follows its consumer (`4.cur`).
    FromConsumer,
    /// Pass 5: an input copy made by the scheduler (`4.cpy` in the seed).
    Copy,
    /// Assigned by the user with `set_tensor_backend` (`usr`).
    User,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Cause::None => "",
            Cause::Dst => "1.dst",
            Cause::ViewSrc => "1.vsrc",
            Cause::Input => "1.inp",
            Cause::Offload => "1.off",
            Cause::Weight(i) => {
                let mut n = TensorName::EMPTY;
                let _ = write!(n, "1.wgt{i}");
                return f.pad(n.as_str());
            }
            Cause::Expand => "2.sup",
            Cause::Best => "3.best",
            Cause::Upgrade => "3.upg",
            Cause::FromViewSrc => "4.vsrc",
            Cause::FromConsumer => "4.cur",
            Cause::Copy => "4.cpy",
            Cause::User => "usr",
        };
        f.pad(s)
    }
}

const NO_COPIES: u32 = u32::MAX;

/// Per-tensor state, valid when `key` is `(epoch << 32) | generation` of the tensor asked
/// about (an index reused after a context rewind carries another generation; epochs start at
/// 1, so the empty key 0 never matches).
#[derive(Copy, Clone, Debug, Default)]
struct Slot {
    key: u64,
    /// None or an index of the scheduler's backends: every writer gives one (the passes take
    /// them from the device list, `set_tensor_backend` checks the caller's), which is what
    /// indexing `backends`, `devices`, `bufts` and `backend_buft_devices` by a backend relies
    /// on.
    backend: PackedBackend,
    cause: Cause,
    /// Index of this tensor's block in the copy table, or `NO_COPIES`.
    copies: u32,
    /// The split the copies belong to: copies live only until the next split, which makes
    /// them again in the caller's context.
    copies_epoch: u32,
}

impl Slot {
    /// The key of `t`'s slot in the epoch whose key bits are `key_hi` (`epoch << 32`).
    #[inline(always)]
    fn key_of(key_hi: u64, t: TensorId) -> u64 {
        key_hi | u64::from(t.generation())
    }

    /// A slot for the tensor with `key`, with no backend and no copies.
    #[inline(always)]
    fn fresh(key: u64) -> Slot {
        Slot {
            key,
            backend: PackedBackend::NONE,
            cause: Cause::None,
            copies: NO_COPIES,
            copies_epoch: 0,
        }
    }

    /// Make `slots` hold index `i` (doubling, so growth is amortised).
    #[inline(always)]
    fn reserve_index(slots: &mut Vec<Slot>, i: usize) {
        if i >= slots.len() {
            let want = (i + 1).max(slots.len() * 2);
            slots.resize(want, Slot::default());
        }
    }

    /// The slot of `t` in `slots`, made fresh when it is not current; `slots` must hold
    /// `t`'s index ([`Slot::reserve_index`]).
    #[inline(always)]
    fn current_in(slots: &mut [Slot], key_hi: u64, t: TensorId) -> &mut Slot {
        let key = Self::key_of(key_hi, t);
        let s = &mut slots[t.index()];
        if s.key != key {
            *s = Self::fresh(key);
        }
        s
    }

    /// Give `t` backend `b` by `cause` in `slots`, which must hold `t`'s index.
    #[inline(always)]
    fn set_in(slots: &mut [Slot], key_hi: u64, t: TensorId, b: PackedBackend, cause: Cause) {
        let s = Self::current_in(slots, key_hi, t);
        s.backend = b;
        s.cause = cause;
    }

    /// The backend of `t` in `slots` (none when its slot is not current).
    #[inline(always)]
    fn backend_in(slots: &[Slot], key_hi: u64, t: TensorId) -> PackedBackend {
        let key = Self::key_of(key_hi, t);
        slots
            .get(t.index())
            .filter(|s| s.key == key)
            .map_or(PackedBackend::NONE, |s| s.backend)
    }
}

/// What one buffer tells the passes: its usage and which devices read its buffer type.
///
/// Aligned to a word so that a memo hit reads it with one load.
#[derive(Copy, Clone, Debug, Default)]
#[repr(align(8))]
struct BufferFacts {
    /// The buffer is one of ours (it has a buffer type); false for foreign storage.
    ours: bool,
    usage: Option<BufferUsage>,
    /// Devices (bit = backend index) whose `supports_buft` accepts the buffer type (none for
    /// foreign storage).
    devices: u16,
    /// The buffer type is host memory.
    host: bool,
}

/// Slots of the buffer memo (direct-mapped by buffer address; a collision only costs a
/// fresh lookup).
const MEMO_SLOTS: usize = 64;

/// Per-split memo of [`BufferFacts`] by buffer: a graph's tensors live in a handful of
/// buffers (weights, caches, per-layer buffers), and every pass asks about them, so the
/// downcast to the buffer and the devices' `supports_buft` are paid once per buffer per
/// split instead of once per tensor per question. Cleared at every split: usages can change
/// and a freed buffer's address can be reused between splits; within one split the tensors
/// hold their buffers alive.
///
/// The entries sit inline (no length to check, no pointer to load); key 0 (no buffer's
/// address) marks an empty entry.
#[derive(Debug)]
struct BufferMemo {
    entries: [(usize, BufferFacts); MEMO_SLOTS],
}

impl Default for BufferMemo {
    fn default() -> Self {
        BufferMemo {
            entries: [(0, BufferFacts::default()); MEMO_SLOTS],
        }
    }
}

impl BufferMemo {
    fn clear(&mut self) {
        self.entries = [(0, BufferFacts::default()); MEMO_SLOTS];
    }

    fn devices_for(buft: &BufferType, devices: &[Device]) -> u16 {
        let mut mask = 0u16;
        for (i, d) in devices.iter().enumerate() {
            if d.supports_buft(buft) {
                mask |= 1 << i;
            }
        }
        mask
    }

    #[inline(always)]
    fn facts(&mut self, st: &graph::TensorStorage, devices: &[Device]) -> BufferFacts {
        let key = std::sync::Arc::as_ptr(&st.buffer).cast::<()>() as usize;
        // (key >> 6 ^ key >> 12), one shift fewer
        let k = ((key ^ key >> 6) >> 6) % MEMO_SLOTS;
        let (ek, ef) = self.entries[k];
        if ek == key {
            return ef;
        }
        self.miss(st, devices, key, k)
    }

    #[cold]
    #[inline(never)]
    fn miss(
        &mut self,
        st: &graph::TensorStorage,
        devices: &[Device],
        key: usize,
        k: usize,
    ) -> BufferFacts {
        let facts = match storage_buffer_type(st) {
            Some(buft) => BufferFacts {
                ours: true,
                usage: storage_usage(st),
                devices: Self::devices_for(buft, devices),
                host: buft.is_host(),
            },
            None => BufferFacts::default(),
        };
        self.entries[k] = (key, facts);
        facts
    }
}

/// One split: a run of user-graph nodes computed on one backend, and the tensors copied in
/// from other backends before it runs.
#[derive(Clone, Debug, Default)]
pub struct Split {
    backend: BackendId,
    start: usize,
    end: usize,
    inputs: Vec<TensorId>,
}

impl Split {
    /// Index of the backend that computes this split.
    pub fn backend(&self) -> usize {
        self.backend.index()
    }
    /// First node (index in the user graph).
    pub fn start(&self) -> usize {
        self.start
    }
    /// One past the last node.
    pub fn end(&self) -> usize {
        self.end
    }
    /// Tensors copied into this split's backend, in registration order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }
}

/// A source slot pointed at an input copy while the allocator and backends run.
#[derive(Copy, Clone, Debug)]
struct Rewrite {
    node: TensorId,
    slot: u8,
    original: TensorId,
    copy: TensorId,
}

/// The eval callback (`ggml_backend_sched_eval_callback`): called with `ask = true` to ask
/// whether the caller wants to see a node (then the nodes up to it are computed, the backend
/// synchronized, and it is called again with `ask = false`; returning `false` then stops the
/// computation of the current split).
pub type EvalCallback = Box<dyn FnMut(&Context, TensorId, bool) -> bool + Send>;

/// The multi-backend scheduler (`ggml_backend_sched`).
///
/// Backends are given in priority order; the last one must run on a CPU device. For each
/// graph the scheduler assigns every node a backend, cuts the graph into splits that run on
/// one backend each, adds copies of the tensors a split reads from incompatible memory,
/// allocates compute memory through the graph allocator (one buffer per distinct buffer
/// type), and computes split after split.
///
/// ```
/// use sched::{Scheduler, fixture::{BackendSpec, FixtureBackends}};
/// use graph::{Context, ElementType, Graph};
///
/// // one planning-only CPU backend
/// let backends = FixtureBackends::new(&[BackendSpec::cpu("CPU")])?;
/// let mut sched = Scheduler::new(backends.backends().to_vec(), None, 64, false)?;
///
/// let mut ctx = Context::new();
/// let x = ctx.new_tensor_1d(ElementType::F32, 16)?;
/// ctx.set_input(x)?;
/// let y = ctx.sqr(x)?;
/// let mut g = Graph::new(64);
/// g.build_forward_expand(&mut ctx, y)?;
///
/// sched.alloc_graph(&mut ctx, &g)?;
/// assert_eq!(sched.n_splits(), 1);
/// assert_eq!(sched.tensor_backend(y), Some(0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Scheduler {
    backends: Vec<Backend>,
    devices: Vec<Device>,
    bufts: Vec<BufferType>,
    galloc: GraphAllocator,
    n_copies: usize,
    cur_copy: usize,
    /// The pipeline copy the current split's sources were rewritten to (`cur_copy` at the
    /// last split); a compute with another `cur_copy` must split again.
    split_copy: usize,
    /// `[backend * n_copies + copy]`
    events: Vec<Option<Event>>,
    graph_size: usize,
    is_reset: bool,
    is_alloc: bool,
    /// [`Graph::stamp`] of the graph the current splits and allocation were made for (set by a
    /// successful `alloc_graph`, cleared when a split starts): compute re-plans any other
    /// graph instead of running these splits' node ranges over it.
    planned: Option<u64>,
    strict: bool,
    debug: u32,

    epoch: u32,
    copy_epoch: u32,
    slots: Vec<Slot>,
    /// Per split: what each buffer seen says (usage, buffer type's device support).
    buffer_memo: BufferMemo,
    /// Devices (bit = backend index) whose `supports_buft` accepts backend `i`'s compute
    /// buffer type; asked once at creation.
    backend_buft_devices: Vec<u16>,
    /// Per backend: whether a higher-priority backend has the same compute buffer type
    /// (pass 3 can upgrade a node only then).
    upgradable: Vec<bool>,
    copy_table: Vec<Option<TensorId>>,

    node_ids: Vec<PackedBackend>,
    leaf_ids: Vec<PackedBackend>,
    prev_node_ids: Vec<PackedBackend>,
    prev_leaf_ids: Vec<PackedBackend>,
    node_buf_ids: Vec<usize>,
    leaf_buf_ids: Vec<usize>,

    alloc_graph: Graph,
    splits: Vec<Split>,
    n_splits: usize,
    graph_inputs: Vec<TensorId>,
    rewrites: Vec<Rewrite>,
    rewritten: bool,
    /// Positions in the graph of the compute (non-view) nodes, listed by pass 1 for passes
    /// 2, 3 and 5.
    scratch: Vec<usize>,
    /// The backend of each of `scratch`'s compute nodes during passes 2 and 3 (a dense
    /// mirror of their slots, which the sweeps read without a slot lookup).
    scratch_bids: Vec<PackedBackend>,
    /// Pass 4's note on each of `scratch`'s compute nodes for pass 5.
    scratch_settled: Vec<Settled>,

    callback: Option<EvalCallback>,
    trace: Option<Box<dyn TraceSink>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("backends", &self.backends)
            .field("n_copies", &self.n_copies)
            .field("n_splits", &self.n_splits)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler over `backends` (priority order, the last on a CPU device), with optional
    /// buffer types per backend (default: each backend's default buffer type), a graph
    /// capacity hint, and `parallel` for pipeline parallelism with
    /// [`DEFAULT_PARALLEL_COPIES`] copies (`ggml_backend_sched_new`).
    pub fn new(
        backends: Vec<Backend>,
        bufts: Option<Vec<BufferType>>,
        graph_size: usize,
        parallel: bool,
    ) -> Result<Self> {
        let n_copies = if parallel { DEFAULT_PARALLEL_COPIES } else { 1 };
        Self::with_copies(backends, bufts, graph_size, n_copies)
    }

    /// Like [`Scheduler::new`] with an explicit number of pipeline copies (1: no pipeline
    /// parallelism). More copies overlap more steps and cost more memory (llama.cpp #24355,
    /// #20395).
    pub fn with_copies(
        backends: Vec<Backend>,
        bufts: Option<Vec<BufferType>>,
        graph_size: usize,
        n_copies: usize,
    ) -> Result<Self> {
        let n = backends.len();
        if n == 0 {
            return Err(SchedError::NoBackends);
        }
        if n > MAX_BACKENDS {
            return Err(SchedError::TooManyBackends {
                n,
                max: MAX_BACKENDS,
            });
        }
        if n_copies == 0 {
            return Err(SchedError::InvalidCopies(n_copies));
        }
        let devices: Vec<Device> = backends.iter().map(Backend::device).collect();
        if devices[n - 1].device_type() != DeviceType::Cpu {
            return Err(SchedError::LastNotCpu {
                name: backends[n - 1].name().to_owned(),
            });
        }
        let bufts = match bufts {
            Some(b) if b.len() != n => {
                return Err(SchedError::BufferTypeCount {
                    expected: n,
                    got: b.len(),
                });
            }
            Some(b) => b,
            None => backends.iter().map(Backend::default_buffer_type).collect(),
        };
        for (b, buft) in backends.iter().zip(&bufts) {
            if !b.supports_buft(buft) {
                return Err(SchedError::BufferTypeUnsupported {
                    backend: b.name().to_owned(),
                    buffer_type: buft.name().to_owned(),
                });
            }
        }
        let mut events = Vec::with_capacity(n * n_copies);
        for d in &devices {
            for _ in 0..n_copies {
                events.push(if n_copies > 1 {
                    d.event_new().ok()
                } else {
                    None
                });
            }
        }
        let debug = std::env::var("GGML_SCHED_DEBUG")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let galloc = GraphAllocator::new(&bufts);
        let backend_buft_devices = bufts
            .iter()
            .map(|buft| BufferMemo::devices_for(buft, &devices))
            .collect();
        let upgradable = (0..bufts.len())
            .map(|b| bufts[..b].contains(&bufts[b]))
            .collect();
        let mut s = Scheduler {
            backends,
            devices,
            bufts,
            galloc,
            n_copies,
            cur_copy: 0,
            split_copy: 0,
            events,
            graph_size,
            is_reset: false,
            is_alloc: false,
            planned: None,
            strict: false,
            debug,
            epoch: 0,
            copy_epoch: 1,
            slots: Vec::with_capacity(graph_size),
            buffer_memo: BufferMemo::default(),
            backend_buft_devices,
            upgradable,
            copy_table: Vec::new(),
            node_ids: Vec::new(),
            leaf_ids: Vec::new(),
            prev_node_ids: Vec::new(),
            prev_leaf_ids: Vec::new(),
            node_buf_ids: Vec::new(),
            leaf_buf_ids: Vec::new(),
            alloc_graph: Graph::new(graph_size),
            splits: Vec::new(),
            n_splits: 0,
            graph_inputs: Vec::new(),
            rewrites: Vec::new(),
            rewritten: false,
            scratch: Vec::new(),
            scratch_bids: Vec::new(),
            scratch_settled: Vec::new(),
            callback: None,
            trace: None,
        };
        s.reset();
        Ok(s)
    }

    /// Enforce the seed's fixed capacities as errors instead of growing: a graph larger than
    /// the hash set sized from `graph_size`, more than [`MAX_SPLIT_INPUTS`] inputs in one
    /// split, more than [`MAX_SPLIT_INPUTS`] user inputs with pipeline copies. The plan
    /// inspector turns this on so that graphs the reference rejects are rejected here too.
    pub fn set_reference_limits(&mut self, on: bool) {
        self.strict = on;
    }

    /// Set the debug level (0: off, 1: split headers, 2: also one line per node), logged
    /// through `tracing` at DEBUG after every split. The initial level comes from the
    /// `GGML_SCHED_DEBUG` environment variable, as in the seed.
    pub fn set_debug(&mut self, level: u32) {
        self.debug = level;
    }

    /// Install or remove the eval callback (`ggml_backend_sched_set_eval_callback`).
    pub fn set_eval_callback(&mut self, callback: Option<EvalCallback>) {
        self.callback = callback;
    }

    /// Install or remove the trace sink, which then receives a [`TraceSpan`] for every
    /// input copy, wait and split compute of [`Scheduler::graph_compute`] (see
    /// [`crate::trace`]); returns the sink it replaces. Without a sink nothing is timed.
    pub fn set_trace_sink(
        &mut self,
        sink: Option<Box<dyn TraceSink>>,
    ) -> Option<Box<dyn TraceSink>> {
        std::mem::replace(&mut self.trace, sink)
    }

    /// Number of backends.
    pub fn n_backends(&self) -> usize {
        self.backends.len()
    }

    /// Backend `i` (priority order).
    pub fn backend(&self, i: usize) -> Result<&Backend> {
        self.backends.get(i).ok_or(SchedError::BackendIndex {
            index: i,
            n: self.backends.len(),
        })
    }

    /// Every backend, in priority order.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The backends' names, in priority order: the tracks of a [`crate::trace::ChromeTrace`].
    ///
    /// ```
    /// let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::new(vec![cpu], None, 64, false)?;
    /// assert_eq!(sched.backend_names(), ["CPU"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backend_names(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.name().to_owned()).collect()
    }

    /// The buffer type compute memory of backend `i` is allocated in.
    pub fn buffer_type(&self, i: usize) -> Option<&BufferType> {
        self.bufts.get(i)
    }

    /// Index of `backend` among the scheduler's backends.
    pub fn backend_index(&self, backend: &Backend) -> Option<usize> {
        self.backends.iter().position(|b| b == backend)
    }

    /// Number of splits of the last planned graph.
    pub fn n_splits(&self) -> usize {
        self.n_splits
    }

    /// Number of pipeline copies.
    pub fn n_copies(&self) -> usize {
        self.n_copies
    }

    /// The pipeline copy the next compute uses.
    pub fn cur_copy(&self) -> usize {
        self.cur_copy
    }

    /// The splits of the last planned graph.
    pub fn splits(&self) -> &[Split] {
        &self.splits[..self.n_splits]
    }

    /// Graph inputs given per-pipeline-copy storage by the last split (parallel mode).
    pub fn graph_inputs(&self) -> &[TensorId] {
        &self.graph_inputs
    }

    /// Compute buffer bytes of backend `i` (`ggml_backend_sched_get_buffer_size`); 0 for a
    /// backend sharing the buffer type of a higher-priority one.
    pub fn buffer_size(&self, i: usize) -> Result<usize> {
        if i >= self.backends.len() {
            return Err(SchedError::BackendIndex {
                index: i,
                n: self.backends.len(),
            });
        }
        Ok(self.galloc.buffer_size(i))
    }

    /// The graph the allocator saw last: per split, the dependency views and copies of its
    /// inputs followed by its nodes; leafs with pipeline copies first.
    pub fn allocation_graph(&self) -> &Graph {
        &self.alloc_graph
    }

    // ---- per-tensor table ----

    /// The key bits of the current epoch (see [`Slot`]).
    #[inline]
    fn key_hi(&self) -> u64 {
        u64::from(self.epoch) << 32
    }

    #[inline]
    fn key(&self, t: TensorId) -> u64 {
        Slot::key_of(self.key_hi(), t)
    }

    #[inline]
    fn slot(&self, t: TensorId) -> Option<&Slot> {
        let key = self.key(t);
        self.slots.get(t.index()).filter(|s| s.key == key)
    }

    fn slot_mut(&mut self, t: TensorId) -> &mut Slot {
        Slot::reserve_index(&mut self.slots, t.index());
        let key_hi = self.key_hi();
        Slot::current_in(&mut self.slots, key_hi, t)
    }

    fn bid(&self, t: TensorId) -> PackedBackend {
        self.slot(t).map_or(PackedBackend::NONE, |s| s.backend)
    }

    fn bid_opt(&self, t: Option<TensorId>) -> PackedBackend {
        t.map_or(PackedBackend::NONE, |t| self.bid(t))
    }

    fn set_bid(&mut self, t: TensorId, b: PackedBackend, cause: Cause) {
        let s = self.slot_mut(t);
        s.backend = b;
        s.cause = cause;
    }

    fn copy_index(&self, b: usize, c: usize) -> usize {
        b * self.n_copies + c
    }

    /// The copy table holds one block of `n_backends · n_copies` entries per tensor with
    /// copies; `b < n_backends` and `c < n_copies` at every call (backends of slots, split
    /// backends, checked in `tensor_copy`), and `s.copies` names a block of this copy epoch
    /// (the table is cleared whenever the epoch moves on).
    fn get_copy(&self, t: TensorId, b: usize, c: usize) -> Option<TensorId> {
        let s = self.slot(t)?;
        if s.copies == NO_COPIES || s.copies_epoch != self.copy_epoch {
            return None;
        }
        let per = self.backends.len() * self.n_copies;
        self.copy_table[s.copies as usize * per + self.copy_index(b, c)]
    }

    fn set_copy(&mut self, t: TensorId, b: usize, c: usize, copy: TensorId) {
        let per = self.backends.len() * self.n_copies;
        let k = self.copy_index(b, c);
        let copy_epoch = self.copy_epoch;
        let block = {
            let s = self.slot_mut(t);
            if s.copies_epoch != copy_epoch {
                s.copies = NO_COPIES;
            }
            s.copies
        };
        let block = if block == NO_COPIES {
            let nb = (self.copy_table.len() / per) as u32;
            self.copy_table.resize(self.copy_table.len() + per, None);
            let s = self.slot_mut(t);
            s.copies = nb;
            s.copies_epoch = copy_epoch;
            nb
        } else {
            block
        };
        self.copy_table[block as usize * per + k] = Some(copy);
    }

    /// The backend assigned to `t`, if any (`ggml_backend_sched_get_tensor_backend`).
    pub fn tensor_backend(&self, t: TensorId) -> Option<usize> {
        self.bid(t).get().map(BackendId::index)
    }

    /// Which rule assigned `t` its backend.
    pub fn tensor_cause(&self, t: TensorId) -> Cause {
        self.slot(t).map_or(Cause::None, |s| s.cause)
    }

    /// The copy of `t` for backend `b` and pipeline copy `c`, if the last split made one.
    pub fn tensor_copy(&self, t: TensorId, b: usize, c: usize) -> Option<TensorId> {
        if b >= self.backends.len() || c >= self.n_copies {
            return None;
        }
        self.get_copy(t, b, c)
    }

    /// Pin `t` to backend `b` (`ggml_backend_sched_set_tensor_backend`). The assignment is
    /// never overwritten by the passes and lasts until the next [`Scheduler::reset`].
    pub fn set_tensor_backend(&mut self, ctx: &Context, t: TensorId, b: usize) -> Result<()> {
        ctx.get(t)?;
        if b >= self.backends.len() {
            return Err(SchedError::BackendIndex {
                index: b,
                n: self.backends.len(),
            });
        }
        self.set_bid(t, BackendId::new(b).into(), Cause::User);
        self.is_reset = false;
        Ok(())
    }

    /// Forget assignments and copies (`ggml_backend_sched_reset`); O(1).
    pub fn reset(&mut self) {
        if !self.is_reset {
            self.epoch = self.epoch.wrapping_add(1);
            if self.epoch == 0 {
                self.slots.iter_mut().for_each(|s| *s = Slot::default());
                self.epoch = 1;
            }
            self.copy_table.clear();
            self.is_reset = true;
        }
        self.is_alloc = false;
    }

    // ---- buffers and capabilities ----

    /// The storage whose buffer decides for `t`: its view root's, else its own.
    fn root_storage<'a>(ctx: &'a Context, t: &'a Tensor) -> Option<&'a graph::TensorStorage> {
        match t.view_src() {
            Some(r) => ctx.get(r).ok().and_then(Tensor::storage),
            None => t.storage(),
        }
    }

    /// ggml's `tensor->buffer` of a source: a view only gets one from `view_init`, which runs
    /// when the graph allocator places it, so a view freshly made in a graph has none.
    #[inline(always)]
    fn own_storage(t: &Tensor) -> Option<&graph::TensorStorage> {
        // storage first: most sources without a buffer are no views either
        t.storage().filter(|_| t.view_src().is_none())
    }

    /// What the buffer behind `st` tells the passes, from the per-split memo.
    #[inline]
    fn buffer_facts(&mut self, st: &graph::TensorStorage) -> BufferFacts {
        self.buffer_memo.facts(st, &self.devices)
    }

    /// `ggml_backend_sched_backend_from_buffer` for a buffer the caller already looked up:
    /// the first backend whose device reads the buffer type and runs `op` (`t` only names
    /// the tensor in the log).
    #[inline(always)]
    fn backend_from_facts(
        devices: &[Device],
        ctx: &Context,
        facts: BufferFacts,
        st: &graph::TensorStorage,
        t: &Tensor,
        op: TensorId,
    ) -> PackedBackend {
        // foreign storage has no devices (`BufferFacts::default`)
        let mut m = facts.devices;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            if devices[i].supports_op(ctx, op) {
                return BackendId::new(i).into();
            }
            m &= m - 1;
        }
        if facts.ours {
            Self::log_no_backend(st, t);
        }
        PackedBackend::NONE
    }

    #[cold]
    #[inline(never)]
    fn log_no_backend(st: &graph::TensorStorage, t: &Tensor) {
        tracing::debug!(
            tensor = t.name(),
            buffer = storage_buffer_type(st).map_or("?", BufferType::name),
            "no backend supports the op with a weight in this buffer type; it will be copied"
        );
    }

    /// `ggml_backend_sched_backend_id_from_cur` (`t` is `id`'s tensor; `memo` and `devices`
    /// are the scheduler's, passed apart so that pass 1 can hold the tensor's slot).
    #[inline(always)]
    fn backend_id_from_cur(
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

    /// `ggml_backend_sched_buffer_supported`.
    fn buffer_supported(&mut self, ctx: &Context, t: TensorId, b: usize) -> bool {
        let Ok(tt) = ctx.get(t) else { return false };
        let devices = match Self::root_storage(ctx, tt) {
            Some(st) => self.buffer_facts(st).devices,
            None => {
                let mut id = self.bid(t);
                if id.is_none() {
                    id = self.bid_opt(tt.view_src());
                }
                let Some(id) = id.get() else {
                    return false;
                };
                self.backend_buft_devices[id.index()]
            }
        };
        devices & (1 << b) != 0
    }

    /// Assign `node` to `cur` if its device runs the op; returns whether it did.
    fn set_if_supported(&mut self, ctx: &Context, node: TensorId, cur: BackendId) -> bool {
        if self.devices[cur.index()].supports_op(ctx, node) {
            self.set_bid(node, cur.into(), Cause::Expand);
            true
        } else {
            false
        }
    }

    // ---- rewrites of the caller's graph ----

    fn apply_rewrites(&mut self, ctx: &mut Context) {
        if self.rewritten {
            return;
        }
        for r in &self.rewrites {
            let _ = ctx.set_src(r.node, r.slot as usize, Some(r.copy));
        }
        self.rewritten = true;
    }

    fn restore_rewrites(&mut self, ctx: &mut Context) {
        if !self.rewritten {
            return;
        }
        for r in self.rewrites.iter().rev() {
            // A node the caller has rewound away is skipped (set_src checks liveness).
            if ctx
                .get(r.node)
                .is_ok_and(|t| t.src(r.slot as usize) == Some(r.copy))
            {
                let _ = ctx.set_src(r.node, r.slot as usize, Some(r.original));
            }
        }
        self.rewritten = false;
    }

    /// The source the allocator and backends see in slot `j` of `node` (the input copy where
    /// the last split made one).
    pub fn effective_src(&self, ctx: &Context, node: TensorId, j: usize) -> Option<TensorId> {
        let s = ctx.get(node).ok()?.src(j)?;
        if self.rewritten {
            return Some(s);
        }
        self.rewrites
            .iter()
            .find(|r| r.node == node && r.slot as usize == j && r.original == s)
            .map_or(Some(s), |r| Some(r.copy))
    }

    // ---- the passes ----

    fn check_capacity(&self, graph: &Graph) -> Result<()> {
        if self.strict {
            let cap = crate::hash_size(self.graph_size);
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
        let r = self.split_graph_impl(ctx, graph);
        self.restore_rewrites(ctx);
        r
    }

    fn split_graph_impl(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.restore_rewrites(ctx);
        self.rewrites.clear();
        // copies made by an earlier split may have been rewound away with the caller's
        // context; every split makes its own (the seed relies on a reset in between)
        self.copy_epoch = self.copy_epoch.wrapping_add(1).max(1);
        self.copy_table.clear();
        self.n_splits = 0;
        self.planned = None;
        self.graph_inputs.clear();
        self.is_reset = false;
        // usages may have changed and buffers come and gone since the last split
        self.buffer_memo.clear();

        // pass 1 also lists the compute (non-view) nodes and their backends for passes 2, 3
        let mut compute = std::mem::take(&mut self.scratch);
        let mut bids = std::mem::take(&mut self.scratch_bids);
        let mut settled = std::mem::take(&mut self.scratch_settled);
        compute.clear();
        bids.clear();
        settled.clear();
        let r = self
            .pass1(ctx, graph, &mut compute, &mut bids)
            .and_then(|any_gpu| {
                // pass 2: expand non-CPU backends down and up, then every backend down and up
                let nodes = graph.nodes();
                self.pass2(ctx, nodes, &compute, &mut bids, any_gpu);
                self.pass3(ctx, nodes, &compute, &bids)?;
                let key_hi = self.key_hi();
                Self::pass4(&mut self.slots, key_hi, ctx, graph, &mut settled)?;
                // pass 5: splits and input copies
                self.pass5(ctx, graph, &compute, &settled)
            });
        self.scratch = compute;
        self.scratch_bids = bids;
        self.scratch_settled = settled;
        r?;

        if self.debug > 0 {
            let mut s = String::new();
            self.write_layout(ctx, graph, self.debug, &mut s);
            tracing::debug!(target: "sched", "{s}");
        }

        self.build_alloc_graph(ctx, graph)
    }

    /// Pass 1 for one tensor: `bid`, and when unassigned `backend_id_from_cur` then
    /// `set_bid`, on one slot access (`slots`, `memo`, `devices` and `key_hi` are the
    /// scheduler's, passed apart; `slots` holds every tensor of `ctx`).
    #[inline(always)]
    fn assign(
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

    /// Pass 1: pre-allocated tensors, inputs, ops on weights. Returns whether any node sits
    /// on a backend other than the last one.
    ///
    /// The positions of the compute (non-view) nodes are appended to `compute` and their
    /// backends to `bids`.
    #[inline(never)]
    fn pass1(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        compute: &mut Vec<usize>,
        bids: &mut Vec<PackedBackend>,
    ) -> Result<bool> {
        let nodes = graph.nodes();
        let leafs = graph.leafs();
        // pass 1: pre-allocated tensors, inputs, ops on weights
        // every tensor of the context gets a slot up front
        if let Some(last) = ctx.len().checked_sub(1) {
            Slot::reserve_index(&mut self.slots, last);
        }
        let key_hi = self.key_hi();
        let memo = &mut self.buffer_memo;
        let devices = &self.devices[..];
        // exactly the context's tensors, so that a tensor `ctx.get` found has a slot without
        // a second bounds check
        let slots = &mut self.slots[..ctx.len()];
        for &leaf in leafs {
            let t = ctx.get(leaf)?;
            Self::assign(slots, memo, devices, key_hi, ctx, leaf, t)?;
        }
        // whether any node sits on a backend other than the last one: the first two sweeps of
        // pass 2 expand only such assignments, and are skipped without one (one backend); none
        // is no such backend
        let n_first = self.backends.len() - 1;
        let mut any_gpu = false;
        for (pos, &node) in nodes.iter().enumerate() {
            let t = ctx.get(node)?;
            let b = Self::assign(slots, memo, devices, key_hi, ctx, node, t)?;
            any_gpu |= b.is_below(n_first);
            if !t.op().is_view_op() {
                compute.push(pos);
                bids.push(b);
            }
        }

        Ok(any_gpu)
    }

    /// Pass 2: expand non-CPU backends down and up, then every backend down and up.
    ///
    /// `bids[k]` is the backend of compute node `nodes[compute[k]]`, kept in step with its
    /// slot.
    #[inline(never)]
    fn pass2(
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
            let last_unassigned = self.pass2_sweep(ctx, nodes, compute, bids, 0..n, only_gpu);
            // Above the last node the down sweep left without a backend every node has one, so
            // the up sweep sets nothing there and only the next node decides what it expands:
            // it starts at that node.
            let start = last_unassigned.map_or(0, |k| (k + 2).min(n));
            self.pass2_sweep(ctx, nodes, compute, bids, (0..start).rev(), only_gpu);
        }
    }

    /// One sweep of pass 2 over the compute nodes `ks`, in that order: a node with a backend
    /// sets the backend expanded (none for the last backend when `only_gpu`), a node without
    /// gets it where its device runs the op. Returns the last `k` visited that is left
    /// without a backend.
    #[inline(always)]
    fn pass2_sweep(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        compute: &[usize],
        bids: &mut [PackedBackend],
        ks: impl Iterator<Item = usize>,
        only_gpu: bool,
    ) -> Option<usize> {
        let last = BackendId::new(self.backends.len() - 1);
        let mut cur: Option<BackendId> = None;
        let mut unassigned = None;
        for k in ks {
            if let Some(b) = bids[k].get() {
                cur = if only_gpu && b == last { None } else { Some(b) };
            } else if let Some(c) = cur
                && self.set_if_supported(ctx, nodes[compute[k]], c)
            {
                bids[k] = c.into();
            } else {
                unassigned = Some(k);
            }
        }
        unassigned
    }

    /// Pass 3: unassigned nodes to the backend with most usable inputs; upgrade assigned
    /// nodes to a higher-priority backend with the same buffer type.
    ///
    /// `bids[k]` is the backend of compute node `nodes[compute[k]]` after pass 2.
    #[inline(never)]
    fn pass3(
        &mut self,
        ctx: &Context,
        nodes: &[TensorId],
        compute: &[usize],
        bids: &[PackedBackend],
    ) -> Result<()> {
        // pass 3: unassigned nodes to the backend with most usable inputs; upgrade assigned
        // nodes to a higher-priority backend with the same buffer type
        for (&pos, &b) in compute.iter().zip(bids) {
            let b = b.get();
            if let Some(b) = b
                && (b.index() == 0 || !self.upgradable.get(b.index()).copied().unwrap_or(false))
            {
                // nothing to upgrade to
                continue;
            }
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

    /// Pass 4: sources and views without a backend follow their root or their consumer.
    ///
    /// Also notes, for pass 5, each compute node whose backend and sources' backends are
    /// settled and equal: `settled` gets one [`Settled`] per compute node, in the order pass 1
    /// listed them. Settled is final: pass 4 only assigns tensors without a backend.
    ///
    /// The slot table (which holds every tensor of `ctx` since pass 1) is walked through
    /// `slots` and `key_hi`, the scheduler's passed apart, so that the per-source loop keeps
    /// them in registers.
    #[inline(never)]
    fn pass4(
        slots: &mut [Slot],
        key_hi: u64,
        ctx: &Context,
        graph: &Graph,
        settled_out: &mut Vec<Settled>,
    ) -> Result<()> {
        // pass 4: sources and views without a backend follow their root or their consumer
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
                settled = Self::pass4_sources(slots, key_hi, ctx, t, cur)?;
            }
            // pass 1 listed exactly the non-view nodes
            if !t.op().is_view_op() {
                settled_out.push(match cur.get() {
                    Some(b) if settled => Settled::on(b),
                    _ => Settled::UNSETTLED,
                });
            }
        }

        Ok(())
    }

    /// Pass 4 for the sources of `t`, a node on `cur` (maybe none) with a source without a
    /// backend: in order, a view follows its root, anything else its consumer. Returns whether
    /// every source ends on `cur` and `cur` is a backend.
    #[cold]
    #[inline(never)]
    fn pass4_sources(
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

    fn new_split(&mut self, i_split: usize, backend: BackendId, start: usize) {
        if i_split < self.splits.len() {
            let s = &mut self.splits[i_split];
            s.backend = backend;
            s.start = start;
            s.end = start;
            s.inputs.clear();
        } else {
            self.splits.push(Split {
                backend,
                start,
                end: start,
                inputs: Vec::with_capacity(MAX_SPLIT_INPUTS),
            });
        }
    }

    fn make_copy(
        &mut self,
        ctx: &mut Context,
        src: TensorId,
        backend: usize,
        c: usize,
    ) -> Result<TensorId> {
        let copy = ctx.new_tensor_same_layout(src)?;
        let mut name = TensorName::EMPTY;
        let _ = write!(
            name,
            "{}#{}#{}",
            self.backends[backend].name(),
            ctx[src].name(),
            c
        );
        ctx.set_name(copy, name.as_str())?;
        self.set_bid(copy, PackedBackend::NONE, Cause::Copy);
        Ok(copy)
    }

    /// Pass 5: splits and input copies.
    ///
    /// `compute` holds the positions of the compute (non-view) nodes, from pass 1, and
    /// `settled` what pass 4 noted of them: a node settled on one backend with all its sources
    /// needs no source check and no copy without pipeline copies.
    #[inline(never)]
    fn pass5(
        &mut self,
        ctx: &mut Context,
        graph: &Graph,
        compute: &[usize],
        settled: &[Settled],
    ) -> Result<()> {
        let nodes = graph.nodes();
        let no_pipeline = self.n_copies == 1;
        let mut i_split = 0usize;
        // the first split's backend: the first non-view node's (kept from the last plan when
        // every node is a view, as the seed does)
        let mut first_backend = self.splits.first().map_or(BackendId::new(0), |s| s.backend);
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
                    self.splits[i_split].end = i;
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
            let n_inputs = self.splits[i_split].inputs.len();
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
                self.splits[i_split].end = i;
                i_split += 1;
                self.new_split(i_split, nb, i);
                cur = nb;
                srcs_on_cur = false;
            }

            // the common case: every source is on this split's backend and there are no
            // pipeline copies, so nothing is copied or rewritten
            if self.n_copies == 1
                && (srcs_on_cur || srcs.iter().flatten().all(|&s| self.bid(s) == cur))
            {
                continue;
            }
            // the context is changed below: work on a copy of the source slots
            let n_src = srcs.len();
            let srcs = *t.srcs();
            let srcs = &srcs[..n_src];
            for (j, s) in srcs.iter().enumerate() {
                let Some(src) = *s else { continue };
                let sb = self.bid(src);
                if self.n_copies > 1
                    && ctx.get(src)?.flags().contains(TensorFlags::INPUT)
                    && let Some(sbi) = sb.get().map(BackendId::index)
                    && self.get_copy(src, sbi, 0).is_none()
                {
                    for c in 0..self.n_copies {
                        let copy = if c == self.cur_copy {
                            src
                        } else {
                            self.make_copy(ctx, src, sbi, c)?
                        };
                        ctx.set_input(copy)?;
                        ctx.set_output(copy)?;
                        self.set_copy(src, sbi, c, copy);
                    }
                    if self.strict && self.graph_inputs.len() >= MAX_SPLIT_INPUTS {
                        return Err(SchedError::TooManyGraphInputs {
                            limit: MAX_SPLIT_INPUTS,
                        });
                    }
                    self.graph_inputs.push(src);
                }

                if sb != cur && !self.buffer_supported(ctx, src, cur.index()) {
                    let cu = cur.index();
                    if self.get_copy(src, cu, 0).is_none() {
                        for c in 0..self.n_copies {
                            let copy = self.make_copy(ctx, src, cu, c)?;
                            if self.n_copies > 1 {
                                ctx.set_input(copy)?;
                                ctx.set_output(copy)?;
                            }
                            self.set_copy(src, cu, c, copy);
                        }
                        if self.strict && self.splits[i_split].inputs.len() >= MAX_SPLIT_INPUTS {
                            return Err(SchedError::TooManySplitInputs {
                                split: i_split,
                                limit: MAX_SPLIT_INPUTS,
                            });
                        }
                        self.splits[i_split].inputs.push(src);
                    }
                    let copy = self
                        .get_copy(src, cu, self.cur_copy)
                        // invariant: the loop above made copies for every pipeline copy
                        .expect("copies for every pipeline copy were just made");
                    ctx.set_src(node, j, Some(copy))?;
                    self.rewritten = true;
                    self.rewrites.push(Rewrite {
                        node,
                        slot: j as u8,
                        original: src,
                        copy,
                    });
                }
            }
        }
        self.splits[i_split].end = nodes.len();
        self.n_splits = i_split + 1;
        Ok(())
    }

    #[inline(never)]
    fn build_alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
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

    // ---- allocation ----

    fn buft_of(&self, id: PackedBackend) -> Option<&BufferType> {
        id.get().map(|b| &self.bufts[b.index()])
    }

    fn fill_buffer_ids(&mut self) {
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

    fn reserve_alloc_graph(&mut self, ctx: &Context) -> Result<()> {
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
    fn alloc_splits(&mut self, ctx: &mut Context) -> Result<()> {
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
        let r = self.split_graph_impl(ctx, graph).and_then(|()| {
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
        let r = self.split_graph_impl(ctx, graph).and_then(|()| {
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

    // ---- compute ----

    /// Compute `graph` and wait for every backend (`ggml_backend_sched_graph_compute`).
    ///
    /// With a trace sink, the final wait for each backend that computed a split is a wait span
    /// on its track (on a backend that queues work, that is where the work's time shows).
    pub fn graph_compute(&mut self, ctx: &mut Context, graph: &Graph) -> Result<ComputeStatus> {
        let r = self.graph_compute_async(ctx, graph);
        let s = if self.trace.is_some() {
            self.synchronize_traced()
        } else {
            self.synchronize()
        };
        let status = r?;
        s?;
        Ok(status)
    }

    /// [`Scheduler::synchronize`], reporting each backend's wait as a span of the last split
    /// it computed.
    fn synchronize_traced(&mut self) -> Result<()> {
        for (b, backend) in self.backends.iter().enumerate() {
            let t0 = Instant::now();
            backend.synchronize()?;
            let last = self.splits[..self.n_splits]
                .iter()
                .enumerate()
                .rev()
                .find(|(_, sp)| sp.backend.index() == b);
            if let (Some(sink), Some((k, sp))) = (self.trace.as_mut(), last) {
                sink.span(&TraceSpan {
                    kind: SpanKind::Wait,
                    backend: b,
                    split: k,
                    nodes: (sp.start, sp.end),
                    tensor: None,
                    bytes: 0,
                    waits_for: Some(b),
                    start: t0,
                    end: Instant::now(),
                });
            }
        }
        Ok(())
    }

    /// Compute `graph` without waiting for the last backend
    /// (`ggml_backend_sched_graph_compute_async`): allocates first when nothing is allocated
    /// (never allocated, or [`Scheduler::reset`] since). A graph other than the one
    /// [`Scheduler::alloc_graph`] planned, or one changed since (ggml would run the old
    /// plan's node ranges over it), is [`SchedError::GraphNotAllocated`].
    pub fn graph_compute_async(
        &mut self,
        ctx: &mut Context,
        graph: &Graph,
    ) -> Result<ComputeStatus> {
        if !self.is_reset && !self.is_alloc {
            self.reset();
        }
        if self.is_alloc && self.planned != Some(graph.stamp()) {
            // The splits are node ranges of the graph they were made for; run over another
            // graph (or this one changed since) they would compute the wrong nodes. Planning
            // the new graph here could move inputs the caller already wrote, so the caller
            // decides: `alloc_graph` (or `reset`) first.
            return Err(SchedError::GraphNotAllocated);
        }
        // With pipeline copies, the split's sources point at the copies of the pipeline copy
        // current when it was made, while compute fills those of `cur_copy`, which advances
        // after every compute: computing an allocated graph again must split it again (the
        // seed has the same hazard; newer ggml picks the copy at split time instead).
        if !self.is_alloc || (self.n_copies > 1 && self.split_copy != self.cur_copy) {
            self.alloc_graph(ctx, graph)?;
        }
        self.apply_rewrites(ctx);
        let r = self.compute_splits(ctx, graph);
        self.restore_rewrites(ctx);
        r
    }

    /// Wait for every backend (`ggml_backend_sched_synchronize`).
    ///
    /// Every backend is waited for even when one reports an error (the first error is
    /// returned): stopping at the first would leave another backend's queued error behind, to
    /// fail an unrelated later call.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for b in &self.backends {
            let r = b.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        Ok(first?)
    }

    fn event(&self, b: usize, c: usize) -> Option<&Event> {
        self.events[b * self.n_copies + c].as_ref()
    }

    fn compute_splits(&mut self, ctx: &mut Context, graph: &Graph) -> Result<ComputeStatus> {
        for si in 0..self.n_splits {
            let split_backend_id = self.splits[si].backend.index();
            let split_backend = self.backends[split_backend_id].clone();
            let event = self.event(split_backend_id, self.cur_copy).cloned();
            let (start, end) = (self.splits[si].start, self.splits[si].end);
            // The trace's span for this split, started at `t` (only read with a sink).
            let span = |kind, t: Instant, tensor: Option<TensorName>| TraceSpan {
                kind,
                backend: split_backend_id,
                split: si,
                nodes: (start, end),
                tensor,
                bytes: 0,
                waits_for: None,
                start: t,
                end: t,
            };

            for k in 0..self.splits[si].inputs.len() {
                let input = self.splits[si].inputs[k];
                let Some(ib) = self.bid(input).get().map(BackendId::index) else {
                    let name = ctx.get(input).map_or("?", Tensor::name).to_owned();
                    return Err(SchedError::UnassignedInput(name));
                };
                let input_backend = &self.backends[ib];
                // invariant: the splits are current (`planned` matched, and `reset` or a new
                // split pass would have cleared it), and a split pass registers an input only
                // after making its copies for every pipeline copy in the current copy epoch
                let copy = self
                    .get_copy(input, split_backend_id, self.cur_copy)
                    .expect("every split input has copies");
                let tracing = self.trace.is_some();
                let name = if tracing {
                    Some(TensorName::new(ctx.get(input)?.name()))
                } else {
                    None
                };
                let bytes = ctx.get(input)?.nbytes();
                let mut t = tracing.then(Instant::now);
                let waited =
                    |trace: &mut Option<Box<dyn TraceSink>>, t: &mut Option<Instant>, on: usize| {
                        if let (Some(sink), Some(t0)) = (trace.as_mut(), *t) {
                            let now = Instant::now();
                            sink.span(&TraceSpan {
                                end: now,
                                waits_for: Some(on),
                                ..span(SpanKind::Wait, t0, name)
                            });
                            *t = Some(now);
                        }
                    };
                if ctx.get(input)?.flags().contains(TensorFlags::INPUT) {
                    // user inputs are copied at once: the user may overwrite them after return
                    match &event {
                        Some(e) => e.synchronize()?,
                        None => split_backend.synchronize()?,
                    }
                    waited(&mut self.trace, &mut t, split_backend_id);
                    backend_core::tensor_copy(ctx, input, copy)?;
                } else {
                    // wait until the split backend is done with the copy's previous contents
                    match &event {
                        Some(e) => split_backend.event_wait(e)?,
                        None => split_backend.synchronize()?,
                    }
                    waited(&mut self.trace, &mut t, split_backend_id);
                    let queued = split_backend.implementation().cpy_tensor_async(
                        input_backend,
                        ctx.get(input)?,
                        ctx.get(copy)?,
                    )?;
                    if !queued {
                        input_backend.synchronize()?;
                        match &event {
                            Some(e) => e.synchronize()?,
                            None => split_backend.synchronize()?,
                        }
                        waited(&mut self.trace, &mut t, ib);
                        backend_core::tensor_copy(ctx, input, copy)?;
                    }
                }
                if let (Some(sink), Some(t0)) = (self.trace.as_mut(), t) {
                    sink.span(&TraceSpan {
                        end: Instant::now(),
                        bytes,
                        ..span(SpanKind::Copy, t0, name)
                    });
                }
            }

            let t = self.trace.is_some().then(Instant::now);
            // `graph` is the graph the splits were made for (its stamp was checked by the
            // caller), and the split pass only cuts ranges inside its node list.
            let split_nodes = &graph.nodes()[start..end];
            let status = match self.callback.as_mut() {
                None => split_backend
                    .graph_compute_async(ctx, graph::GraphView::new(split_nodes, &[]))?,
                Some(cb) => {
                    let mut status = ComputeStatus::Success;
                    let mut j0 = 0;
                    while j0 < split_nodes.len() {
                        let mut t = split_nodes[j0];
                        let mut need = cb(ctx, t, true);
                        let mut j1 = j0;
                        while !need && j1 + 1 < split_nodes.len() {
                            j1 += 1;
                            t = split_nodes[j1];
                            need = cb(ctx, t, true);
                        }
                        let view = graph::GraphView::new(&split_nodes[j0..=j1], &[]);
                        status = split_backend.graph_compute_async(ctx, view)?;
                        if status != ComputeStatus::Success {
                            break;
                        }
                        split_backend.synchronize()?;
                        if need && !cb(ctx, t, false) {
                            break;
                        }
                        j0 = j1 + 1;
                    }
                    status
                }
            };
            if let (Some(sink), Some(t0)) = (self.trace.as_mut(), t) {
                sink.span(&TraceSpan {
                    end: Instant::now(),
                    ..span(SpanKind::Compute, t0, None)
                });
            }
            if status != ComputeStatus::Success {
                return Ok(status);
            }

            if !self.splits[si].inputs.is_empty()
                && let Some(e) = &event
            {
                split_backend.event_record(e)?;
            }
        }
        self.cur_copy = (self.cur_copy + 1) % self.n_copies;
        Ok(ComputeStatus::Success)
    }

    // ---- printing ----

    /// Write the plan of the last split of `graph` in the seed's `GGML_SCHED_DEBUG` layout
    /// (level 1: split headers; 2: also one line per non-view node with its sources), with the
    /// assigning pass in the cause column (the seed compiles causes out and prints it empty).
    pub fn write_layout(&self, ctx: &Context, graph: &Graph, level: u32, out: &mut String) {
        crate::print::write_layout(self, ctx, graph, level, out);
    }
}
