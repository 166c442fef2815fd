//! The multi-backend scheduler (ggml's `ggml_backend_sched`), planning-only fixture
//! backends, and the plan printers.
//!
//! Why a scheduler: an engine holds weights in several kinds of memory (GPU, host, mapped
//! files) and has several backends that can each run some ops. For every compute graph the
//! [`Scheduler`] decides which backend runs each node, cuts the graph into splits that run on
//! one backend each, inserts copies of the tensors a split reads from memory its backend
//! cannot use, allocates compute memory per backend through `graph-alloc`, and runs the
//! splits, optionally pipelined over several copies of the inputs.
//!
//! Why decision-for-decision with the seed: users tune layer offloading against the plans
//! ggml makes, and the fixtures in `shared/fixtures` pin those plans down. The five
//! assignment passes, the split rules and the allocation graph are therefore ported rule by
//! rule (see [`sched`](crate::Scheduler) for the data-structure differences), while the
//! places where the seed hurts its users are fixed without changing any plan: typed errors
//! instead of aborts, growing tables instead of fixed capacities, a caller's graph that is
//! never left rewritten, and a run-time number of pipeline copies.
//!
//! * [`Scheduler`]: the scheduler, made with named settings by [`Scheduler::builder`].
//! * [`fixture`]: graph files (`FORMAT.md`) and backends that honour their capabilities.
//! * [`Plan`]: the plan-file form of a schedule; [`Scheduler::layout`] the
//!   `GGML_SCHED_DEBUG` layout.
//! * [`dot`]: a picture of a plan (Graphviz DOT, rendered by `dot`).
//! * [`trace`]: a picture of a run (Chrome trace-event JSON from an optional sink).
//!
//! ```
//! use sched::fixture::GraphFile;
//! let file = GraphFile::from_json(r#"{
//!   "graph_size": 64,
//!   "backends": [{"name": "GPU0", "device_type": "gpu"}, {"name": "CPU", "device_type": "cpu"}],
//!   "tensors": [
//!     {"name": "w", "type": "f32", "ne": [8, 8], "buffer": "GPU0"},
//!     {"name": "x", "type": "f32", "ne": [8, 2], "flags": ["input"]},
//!     {"name": "y", "op": "MUL_MAT", "src": ["w", "x"]}],
//!   "expand": ["y"]}"#)?;
//! let plan = file.plan()?;
//! assert_eq!(plan.splits[0].backend, "GPU0");
//! assert_eq!(plan.splits[0].inputs, ["x"]); // the input lives on the CPU and is copied in
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! An engine makes its scheduler once, naming what it changes from the defaults, and plans
//! and computes each step's graph with it:
//!
//! ```
//! use graph::{Context, ElementType, Graph};
//! use sched::Scheduler;
//!
//! let cpu = backend_cpu::cpu_device().init_backend("")?;
//! let mut sched = Scheduler::builder(vec![cpu])
//!     .graph_size(1024) // nodes per graph, a capacity hint
//!     .build()?;
//!
//! let mut ctx = Context::new();
//! let x = ctx.new_tensor_1d(ElementType::F32, 4)?;
//! ctx.set_input(x)?;
//! let y = ctx.sqr(x)?;
//! let mut g = Graph::new(16);
//! g.build_forward_expand(&mut ctx, y)?;
//! sched.alloc_graph(&mut ctx, &g)?;
//! assert_eq!(sched.splits()[0].backend().name(), "CPU");
//! let layout = sched.layout(&ctx, &g, 2).to_string(); // the GGML_SCHED_DEBUG layout
//! assert!(layout.contains("## SPLIT #0: CPU"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod dot;
mod error;
pub mod fixture;
mod galloc;
mod op_timer;
mod plan;
mod print;
mod sched;
pub mod trace;

pub use error::SchedError;
pub use op_timer::OpTimer;
pub use plan::{Plan, PlanSplit, PlanTensor};
pub use print::{Layout, fmt_size};
pub use sched::{
    Cause, DEFAULT_PARALLEL_COPIES, EvalCallback, MAX_BACKENDS, MAX_SPLIT_INPUTS, Scheduler,
    SchedulerBuilder, Split,
};

/// Slots of ggml's hash set for at least `min` keys (`ggml_hash_size`): the smallest of
/// ggml's "prime after a power of two" list that is `>= min`, else `min | 1`. The reference
/// limits of the scheduler use it.
///
/// ```
/// assert_eq!(sched::hash_size(2048), 2053);
/// assert_eq!(sched::hash_size(4), 5);
/// ```
pub fn hash_size(min: usize) -> usize {
    const PRIMES: [usize; 32] = [
        2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537,
        131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879,
        134217757, 268435459, 536870923, 1073741827, 2147483659,
    ];
    match PRIMES.iter().find(|&&p| p >= min) {
        Some(&p) => p,
        None => min | 1,
    }
}
