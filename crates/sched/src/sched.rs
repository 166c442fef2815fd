//! The scheduler proper: backend assignment, splitting, copies, the allocation graph,
//! compute.
//!
//! The decisions follow the seed (`ggml_backend_sched_split_graph` and friends) step for step,
//! because the plans users and fixtures see are defined by them; only the data structures
//! differ:
//!
//! * Per-tensor state (backend, the rule that chose it, input copies per backend and
//!   pipeline copy) lives in a direct-address table indexed by [`TensorId::index`] and stamped
//!   with an epoch. `reset` bumps the epoch instead of clearing memory, the table grows with
//!   the context instead of aborting when a hash set is full (#16555), and once it has grown
//!   nothing on the per-step path allocates.
//! * A backend is a `BackendId`, "maybe a backend" a `PackedBackend` of the same size, where
//!   the seed has `int` with `-1`; the note the assignment phase leaves for splitting (a node settled
//!   on one backend with all its sources) has its own type, so neither is a sentinel that
//!   could be read as the other.
//! * The seed points `node->src[j]` of the caller's graph at input copies and leaves it so,
//!   which breaks reserve-then-alloc on one graph (llama.cpp #15434). We record each rewrite,
//!   apply them only while the allocator or the backends look at the graph, and restore the
//!   original sources before any public call returns.
//!
//! The phases live in one module each, every one an `impl Scheduler` block over the state it
//! owns; this is where each part of the seed (`shared/seeds/ggml-backend.cpp`) went:
//!
//! | module | does | the seed's |
//! |---|---|---|
//! | `assign` | `assign_backends`: `assign_from_buffers` (pre-allocated tensors, inputs, ops on weights), `expand_assignments` (non-CPU backends down and up, then all), `assign_best_or_upgrade` (most usable inputs; same-buffer-type upgrade), `settle_sources_and_views` (sources and views follow their consumer or root) | `ggml_backend_sched_split_graph` passes 1, 2, 3 and 4; `ggml_backend_sched_backend_id_from_cur`, `ggml_backend_sched_set_if_supported` |
//! | `split` | `split_graph`, `plan_graph` (reset the plan, assign, split, build the allocation graph), `cut_splits` (new split on a backend change, an unusable weight or a full input list) | `ggml_backend_sched_split_graph` pass 5 (the split decisions) |
//! | `copies` | `copy_inputs` (input copies per split, pipeline copies of graph inputs), the copy table, the source rewrites | `ggml_backend_sched_split_graph` pass 5 (the copies, `tensor_id_copy`, `graph_inputs`) |
//! | `alloc` | `build_alloc_graph`, `alloc_splits`, `reserve`, `alloc_graph` | the tail of `ggml_backend_sched_split_graph` (the `graph_copy`), `ggml_backend_sched_alloc_splits`, `_reserve`, `_alloc_graph` |
//! | `compute` | `graph_compute(_async)`, `compute_splits` (input copies, events, the eval callback), `synchronize` | `ggml_backend_sched_compute_splits`, `_graph_compute(_async)`, `_synchronize` |
//! | `buffers` | what a buffer tells the phases (usage, devices), memoised per plan; `buffer_supported` | `ggml_backend_sched_backend_from_buffer`, `ggml_backend_sched_buffer_supported` |
//! | `table` | the per-tensor table, `set_tensor_backend`, `reset` | `hv_tensor_backend_ids`, `hv_tensor_copies`, `_set_tensor_backend`, `_reset` |
//! | `backend_id` | `BackendId`, `PackedBackend`, `Settled` | `int backend_id`, `-1` |
//!
//! The rest of the seed's interface (`ggml_backend_sched_new`, the getters, the eval callback
//! and the `GGML_SCHED_DEBUG` layout) is here and in `print.rs`.

use std::fmt::Write as _;

use backend_core::{Backend, BufferType, Device, DeviceType};
use graph::{Context, Graph, TensorId, TensorName};

use crate::error::SchedError;
use crate::trace::TraceSink;

mod alloc;
mod assign;
mod backend_id;
mod buffers;
mod compute;
mod copies;
mod split;
mod table;

use alloc::Allocation;
use assign::NodeLists;
use backend_id::BackendId;
use buffers::Capabilities;
use compute::Pipeline;
use copies::{Copies, Rewrites};
use split::SplitList;
use table::TensorTable;

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

/// One split: a run of user-graph nodes computed on one backend, and the tensors copied in
/// from other backends before it runs.
///
/// ```
/// use sched::fixture::GraphFile;
/// let file = GraphFile::from_json(r#"{
///   "graph_size": 16,
///   "backends": [{"name": "GPU0", "device_type": "gpu"}, {"name": "CPU", "device_type": "cpu"}],
///   "tensors": [
///     {"name": "w", "type": "f32", "ne": [8, 8], "buffer": "GPU0"},
///     {"name": "x", "type": "f32", "ne": [8, 2], "flags": ["input"]},
///     {"name": "y", "op": "MUL_MAT", "src": ["w", "x"]}],
///   "expand": ["y"]}"#)?;
/// let (_built, sched) = file.schedule()?;
/// let split = &sched.splits()[0];
/// assert_eq!(split.backend().name(), "GPU0");
/// assert_eq!(split.backend_index(), 0);
/// assert_eq!(split.inputs().len(), 1); // x, copied from the CPU
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Split {
    backend: BackendId,
    /// `backends[backend]`, kept so that [`Split::backend`] needs no scheduler.
    handle: Backend,
    start: usize,
    end: usize,
    inputs: Vec<TensorId>,
}

impl Split {
    /// The backend that computes this split.
    pub fn backend(&self) -> &Backend {
        &self.handle
    }
    /// Index of the backend that computes this split in [`Scheduler::backends`] (the
    /// numbering of [`Scheduler::tensor_backend`] and [`Scheduler::buffer_size`]).
    pub fn backend_index(&self) -> usize {
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

/// The eval callback (`ggml_backend_sched_eval_callback`): called with `ask = true` to ask
/// whether the caller wants to see a node (then the nodes up to it are computed, the backend
/// synchronized, and it is called again with `ask = false`; returning `false` then stops the
/// computation of the current split).
pub type EvalCallback = Box<dyn FnMut(&Context, TensorId, bool) -> bool + Send>;

/// The multi-backend scheduler (`ggml_backend_sched`).
///
/// Made by [`Scheduler::builder`] (named settings) or [`Scheduler::new`] (the seed's
/// positional ones). Backends are given in priority order; the last one must run on a CPU
/// device. For each
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
/// let mut sched = Scheduler::builder(backends.backends().to_vec())
///     .graph_size(64)
///     .build()?;
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
    /// The backends, in priority order (the last on a CPU device).
    backends: Vec<Backend>,
    /// Each backend's device, asked once.
    devices: Vec<Device>,
    /// The buffer type each backend's compute memory is allocated in.
    bufts: Vec<BufferType>,
    /// What the buffer types and buffers say about the devices (fixed, and memoised per plan).
    caps: Capabilities,
    /// Per tensor: its backend and the rule that chose it, and where its copies are.
    table: TensorTable,
    /// The dense per-compute-node lists the assignment phase hands the splitting phase.
    lists: NodeLists,
    /// The splits of the last plan.
    splits: SplitList,
    /// The input copies and pipeline copies of the last plan.
    copies: Copies,
    /// The source slots of the caller's graph pointed at copies while allocating and computing.
    rewrites: Rewrites,
    /// The allocation graph and the graph allocator.
    alloc: Allocation,
    /// Pipeline copies and the events between them.
    pipeline: Pipeline,
    /// Whether the scheduler is reset, planned, allocated, and for which graph.
    state: PlanState,
    options: Options,
    hooks: Hooks,
    /// Per tensor index: 1 + the generation of the tensor last warned about as an unplaced
    /// weight (0: none), so each such tensor is warned about once.
    reported: Vec<u32>,
}

/// Where the scheduler stands between `reset`, a plan and an allocation.
#[derive(Debug, Default)]
struct PlanState {
    /// Nothing is assigned or copied since the last [`Scheduler::reset`].
    is_reset: bool,
    /// The last plan is allocated and may be computed.
    is_alloc: bool,
    /// [`Graph::stamp`] of the graph the current splits and allocation were made for (set by a
    /// successful `alloc_graph`, cleared when a split starts): compute refuses any other
    /// graph instead of running these splits' node ranges over it.
    planned: Option<u64>,
}

/// Settings that change how a plan is checked and logged, not the plan.
#[derive(Debug)]
struct Options {
    /// The graph capacity hint (the seed sizes its hash set from it).
    graph_size: usize,
    /// Reference limits: the seed's fixed capacities are errors.
    strict: bool,
    /// A graph leaf that would get compute memory is an error, not a warning.
    strict_weights: bool,
    /// `GGML_SCHED_DEBUG` level.
    debug: u32,
}

/// The caller's hooks into compute.
#[derive(Default)]
struct Hooks {
    callback: Option<EvalCallback>,
    trace: Option<Box<dyn TraceSink>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("backends", &self.backends)
            .field("n_copies", &self.pipeline.n_copies)
            .field("n_splits", &self.splits.n)
            .finish_non_exhaustive()
    }
}

/// Named settings for a new [`Scheduler`], from [`Scheduler::builder`].
///
/// Every setting has a default, so a caller names only what it changes, and a setting added
/// later breaks no caller: buffer types default to each backend's default buffer type, the
/// graph size hint to [`graph::DEFAULT_GRAPH_SIZE`], pipeline copies to 1 (no pipeline
/// parallelism), reference limits and strict weights to off, the debug level to the
/// `GGML_SCHED_DEBUG` environment variable.
///
/// ```
/// use sched::{DEFAULT_PARALLEL_COPIES, Scheduler, fixture::{BackendSpec, FixtureBackends}};
///
/// let backends = FixtureBackends::new(&[BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")])?;
/// let sched = Scheduler::builder(backends.backends().to_vec())
///     .graph_size(4096)
///     .parallel(true)
///     .build()?;
/// assert_eq!(sched.n_copies(), DEFAULT_PARALLEL_COPIES);
/// assert_eq!(sched.backend_names(), ["GPU0", "CPU"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder makes no scheduler until `build` is called"]
pub struct SchedulerBuilder {
    backends: Vec<Backend>,
    buffer_types: Option<Vec<BufferType>>,
    graph_size: usize,
    n_copies: usize,
    reference_limits: bool,
    strict_weights: bool,
    debug: Option<u32>,
}

impl SchedulerBuilder {
    /// The buffer type each backend's compute memory is allocated in, one per backend in the
    /// backends' order (default: each backend's default buffer type). [`build`](Self::build)
    /// checks the count and that each backend can use its buffer type.
    ///
    /// ```
    /// use sched::{Scheduler, SchedError, fixture::{BackendSpec, FixtureBackends}};
    ///
    /// let b = FixtureBackends::new(&[BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")])?;
    /// let host = b.backends()[1].default_buffer_type();
    /// let r = Scheduler::builder(b.backends().to_vec()).buffer_types(vec![host]).build();
    /// assert!(matches!(r, Err(SchedError::BufferTypeCount { expected: 2, got: 1 })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer_types(mut self, buffer_types: Vec<BufferType>) -> Self {
        self.buffer_types = Some(buffer_types);
        self
    }

    /// The graph capacity hint: the number of nodes (and, separately, leafs) the graphs are
    /// expected to have. The scheduler's tables start this large and grow past it; with
    /// [`reference_limits`](Self::reference_limits) it is a limit, as in the seed.
    ///
    /// ```
    /// # let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::builder(vec![cpu]).graph_size(8192).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn graph_size(mut self, graph_size: usize) -> Self {
        self.graph_size = graph_size;
        self
    }

    /// Pipeline parallelism with [`DEFAULT_PARALLEL_COPIES`] copies of the inputs (`true`), or
    /// none (`false`, the default): the `parallel` argument of `ggml_backend_sched_new`.
    ///
    /// ```
    /// # let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::builder(vec![cpu]).parallel(true).build()?;
    /// assert_eq!(sched.n_copies(), sched::DEFAULT_PARALLEL_COPIES);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parallel(mut self, parallel: bool) -> Self {
        self.n_copies = if parallel { DEFAULT_PARALLEL_COPIES } else { 1 };
        self
    }

    /// An explicit number of pipeline copies (1: no pipeline parallelism; 0 is
    /// [`SchedError::InvalidCopies`] at [`build`](Self::build)). More copies overlap more
    /// steps and cost more memory (llama.cpp #24355, #20395).
    ///
    /// ```
    /// # let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::builder(vec![cpu]).copies(2).build()?;
    /// assert_eq!(sched.n_copies(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn copies(mut self, n_copies: usize) -> Self {
        self.n_copies = n_copies;
        self
    }

    /// Enforce the seed's fixed capacities as errors instead of growing (see
    /// [`Scheduler::set_reference_limits`]).
    ///
    /// ```
    /// # let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::builder(vec![cpu]).reference_limits(true).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reference_limits(mut self, on: bool) -> Self {
        self.reference_limits = on;
        self
    }

    /// Make a graph leaf that would end up in compute memory an error
    /// ([`SchedError::UnplacedWeights`]) instead of a warning (see
    /// [`Scheduler::set_strict_weights`]).
    ///
    /// ```
    /// use graph::{Context, ElementType, Graph};
    /// use sched::{SchedError, Scheduler};
    ///
    /// let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let mut sched = Scheduler::builder(vec![cpu]).strict_weights(true).build()?;
    /// let mut ctx = Context::new();
    /// // a weight nobody allocated: the scheduler would give it (uninitialised) compute memory
    /// let w = ctx.new_tensor_1d(ElementType::F32, 4)?;
    /// let y = ctx.sqr(w)?;
    /// let mut g = Graph::new(8);
    /// g.build_forward_expand(&mut ctx, y)?;
    /// let r = sched.alloc_graph(&mut ctx, &g);
    /// assert!(matches!(r, Err(SchedError::UnplacedWeights { tensor, .. }) if tensor == w));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn strict_weights(mut self, on: bool) -> Self {
        self.strict_weights = on;
        self
    }

    /// The debug level (see [`Scheduler::set_debug`]); without it, the `GGML_SCHED_DEBUG`
    /// environment variable's.
    ///
    /// ```
    /// # let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let sched = sched::Scheduler::builder(vec![cpu]).debug(2).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn debug(mut self, level: u32) -> Self {
        self.debug = Some(level);
        self
    }

    /// The scheduler (`ggml_backend_sched_new`). Errors: no backends, more than
    /// [`MAX_BACKENDS`], a last backend not on a CPU device, a buffer-type list of the wrong
    /// length or a buffer type its backend cannot use, zero pipeline copies.
    ///
    /// ```
    /// use sched::{Scheduler, SchedError};
    /// assert!(matches!(Scheduler::builder(vec![]).build(), Err(SchedError::NoBackends)));
    /// ```
    pub fn build(self) -> Result<Scheduler> {
        let mut s = Scheduler::with_copies(
            self.backends,
            self.buffer_types,
            self.graph_size,
            self.n_copies,
        )?;
        s.options.strict = self.reference_limits;
        s.options.strict_weights = self.strict_weights;
        if let Some(level) = self.debug {
            s.options.debug = level;
        }
        Ok(s)
    }
}

impl Scheduler {
    /// Start a scheduler over `backends` (priority order, the last on a CPU device) with
    /// named settings; see [`SchedulerBuilder`] for them and their defaults.
    ///
    /// ```
    /// use sched::{Scheduler, fixture::{BackendSpec, FixtureBackends}};
    ///
    /// let backends = FixtureBackends::new(&[BackendSpec::cpu("CPU")])?;
    /// let sched = Scheduler::builder(backends.backends().to_vec())
    ///     .graph_size(64)
    ///     .build()?;
    /// assert_eq!(sched.n_copies(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(backends: Vec<Backend>) -> SchedulerBuilder {
        SchedulerBuilder {
            backends,
            buffer_types: None,
            graph_size: graph::DEFAULT_GRAPH_SIZE,
            n_copies: 1,
            reference_limits: false,
            strict_weights: false,
            debug: None,
        }
    }

    /// A scheduler over `backends` (priority order, the last on a CPU device), with optional
    /// buffer types per backend (default: each backend's default buffer type), a graph
    /// capacity hint, and `parallel` for pipeline parallelism with
    /// [`DEFAULT_PARALLEL_COPIES`] copies: the positional form of `ggml_backend_sched_new`.
    /// [`Scheduler::builder`] names the same settings and has the rest.
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
    /// parallelism); [`SchedulerBuilder::copies`] is the named form. More copies overlap more
    /// steps and cost more memory (llama.cpp #24355, #20395).
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
        let debug = std::env::var("GGML_SCHED_DEBUG")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let mut s = Scheduler {
            caps: Capabilities::new(&devices, &bufts),
            pipeline: Pipeline::new(&devices, n_copies),
            alloc: Allocation::new(&bufts, graph_size),
            backends,
            devices,
            bufts,
            table: TensorTable::with_capacity(graph_size),
            lists: NodeLists::default(),
            splits: SplitList::default(),
            copies: Copies::default(),
            rewrites: Rewrites::default(),
            state: PlanState::default(),
            options: Options {
                graph_size,
                strict: false,
                strict_weights: false,
                debug,
            },
            reported: Vec::new(),
            hooks: Hooks::default(),
        };
        s.reset();
        Ok(s)
    }

    /// Enforce the seed's fixed capacities as errors instead of growing: a graph larger than
    /// the hash set sized from `graph_size`, more than [`MAX_SPLIT_INPUTS`] inputs in one
    /// split, more than [`MAX_SPLIT_INPUTS`] user inputs with pipeline copies. The plan
    /// inspector turns this on so that graphs the reference rejects are rejected here too.
    pub fn set_reference_limits(&mut self, on: bool) {
        self.options.strict = on;
    }

    /// Make a graph leaf the scheduler would treat as compute memory an error instead of a
    /// warning. Such a leaf (op `NONE`, no input, no view) has no memory, so the allocator
    /// gives it compute memory and it is read uninitialised, or it already lives in a
    /// [`BufferUsage::Compute`](backend_core::BufferUsage::Compute) buffer, which the next
    /// allocation may overwrite: in both cases, usually a weight that was not loaded into a
    /// weights buffer. Without strict weights each such tensor is logged once through
    /// `tracing` at WARN; with it, planning fails with [`SchedError::UnplacedWeights`] before
    /// anything is allocated. Leafs in buffers of usage `Any` (caches and other state the
    /// caller owns) are neither.
    ///
    /// ```
    /// use graph::{Context, ElementType, Graph};
    /// use sched::{SchedError, Scheduler};
    ///
    /// let cpu = backend_cpu::cpu_device().init_backend("")?;
    /// let mut sched = Scheduler::builder(vec![cpu]).build()?;
    /// let mut ctx = Context::new();
    /// let w = ctx.new_tensor_1d(ElementType::F32, 4)?;
    /// let y = ctx.sqr(w)?;
    /// let mut g = Graph::new(8);
    /// g.build_forward_expand(&mut ctx, y)?;
    /// sched.set_strict_weights(true);
    /// assert!(matches!(sched.alloc_graph(&mut ctx, &g), Err(SchedError::UnplacedWeights { .. })));
    /// sched.set_strict_weights(false);
    /// sched.alloc_graph(&mut ctx, &g)?; // a warning only
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_strict_weights(&mut self, on: bool) {
        self.options.strict_weights = on;
    }

    /// Set the debug level (0: off, 1: split headers, 2: also one line per node), logged
    /// through `tracing` at DEBUG after every split. The initial level comes from the
    /// `GGML_SCHED_DEBUG` environment variable, as in the seed.
    pub fn set_debug(&mut self, level: u32) {
        self.options.debug = level;
    }

    /// Install or remove the eval callback (`ggml_backend_sched_set_eval_callback`).
    pub fn set_eval_callback(&mut self, callback: Option<EvalCallback>) {
        self.hooks.callback = callback;
    }

    /// Install or remove the trace sink, which then receives a
    /// [`TraceSpan`](crate::trace::TraceSpan) for every input copy, wait and split compute of
    /// [`Scheduler::graph_compute`] (see [`crate::trace`]); returns the sink it replaces. Without a
    /// sink nothing is timed.
    pub fn set_trace_sink(
        &mut self,
        sink: Option<Box<dyn TraceSink>>,
    ) -> Option<Box<dyn TraceSink>> {
        std::mem::replace(&mut self.hooks.trace, sink)
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
    /// let sched = sched::Scheduler::builder(vec![cpu]).build()?;
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
        self.splits.n
    }

    /// Number of pipeline copies.
    pub fn n_copies(&self) -> usize {
        self.pipeline.n_copies
    }

    /// The pipeline copy the next compute uses.
    pub fn cur_copy(&self) -> usize {
        self.pipeline.cur_copy
    }

    /// The splits of the last planned graph.
    pub fn splits(&self) -> &[Split] {
        &self.splits.list[..self.splits.n]
    }

    /// Graph inputs given per-pipeline-copy storage by the last split (parallel mode).
    pub fn graph_inputs(&self) -> &[TensorId] {
        &self.copies.graph_inputs
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
        Ok(self.alloc.galloc.buffer_size(i))
    }

    /// The graph the allocator saw last: per split, the dependency views and copies of its
    /// inputs followed by its nodes; leafs with pipeline copies first.
    pub fn allocation_graph(&self) -> &Graph {
        &self.alloc.graph
    }

    /// The plan of the last split of `graph` in the seed's `GGML_SCHED_DEBUG` layout (level 1:
    /// split headers; 2: also one line per non-view node with its sources), with the assigning
    /// pass in the cause column (the seed compiles causes out and prints it empty), as a
    /// [`Display`](std::fmt::Display) value: format it, or `to_string()` it.
    ///
    /// ```
    /// use sched::fixture::GraphFile;
    /// let file = GraphFile::from_json(r#"{
    ///   "graph_size": 16, "backends": [{"name": "CPU", "device_type": "cpu"}],
    ///   "tensors": [{"name": "x", "type": "f32", "ne": [4], "flags": ["input"]},
    ///               {"name": "y", "op": "SCALE", "src": ["x"], "scale": 2.0}],
    ///   "expand": ["y"]}"#)?;
    /// let (b, sched) = file.schedule()?;
    /// let text = sched.layout(&b.ctx, &b.graph, 1).to_string();
    /// assert_eq!(text, "\n## SPLIT #0: CPU # 0 inputs\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn layout<'a>(
        &'a self,
        ctx: &'a Context,
        graph: &'a Graph,
        level: u32,
    ) -> crate::print::Layout<'a> {
        crate::print::Layout {
            sched: self,
            ctx,
            graph,
            level,
        }
    }

    /// [`Scheduler::layout`], appended to `out`.
    pub fn write_layout(&self, ctx: &Context, graph: &Graph, level: u32, out: &mut String) {
        let _ = write!(out, "{}", self.layout(ctx, graph, level));
    }
}
