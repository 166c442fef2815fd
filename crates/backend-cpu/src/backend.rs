//! The CPU backend object: thread count, abort callback, graph compute and plans.
//!
//! Computing ops is the `cpu-kernels` crate's job: [`can_compute`] and [`compute_nodes`] below
//! are the only places that decide what the CPU can run, and they defer to it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{
    Backend, BackendError, BackendImpl, ComputeStatus, Device, GraphPlan, Guid, Result,
};
use graph::{Context, GraphView, TensorId};

use crate::device::CPU_NAME;

/// The abort callback: polled between nodes; returning `true` stops the computation, which
/// then reports [`ComputeStatus::Aborted`]. The same type as [`backend_core::AbortCallback`],
/// which the registry's `ggml_backend_set_abort_callback` entry point takes.
pub type AbortCallback = backend_core::AbortCallback;

/// The CPU backend's guid.
pub const CPU_GUID: Guid = *b"rs-ggml-cpu-be01";

/// What one compute is run with (mirrors what `cpu-kernels` takes).
struct ComputeOptions {
    n_threads: usize,
    abort: Option<AbortCallback>,
}

/// Whether the CPU can compute `id`: what the `cpu-kernels` crate implements.
pub(crate) fn can_compute(ctx: &Context, id: TensorId) -> bool {
    cpu_kernels::supports_op(ctx, id)
}

/// The kernels' engine (worker pool and scratch) of one backend, created on first use and
/// recreated only when more threads are asked for than its pool has.
#[derive(Default)]
struct Engine(std::sync::Mutex<Option<Arc<cpu_kernels::CpuCompute>>>);

impl Engine {
    fn get(&self, n_threads: usize) -> Arc<cpu_kernels::CpuCompute> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(e) if e.n_threads() >= n_threads => Arc::clone(e),
            _ => {
                let e = Arc::new(cpu_kernels::CpuCompute::new(n_threads));
                *slot = Some(Arc::clone(&e));
                e
            }
        }
    }
}

/// Run `graph`'s nodes in order with the kernels of `cpu-kernels`.
fn compute_nodes(
    engine: &Engine,
    ctx: &Context,
    graph: GraphView<'_>,
    opts: &ComputeOptions,
) -> Result<ComputeStatus> {
    // The kernels write through raw host pointers: refuse, before anything runs, a node whose
    // bytes live in read-only memory (a read-only mapping of a weights file would fault).
    for &id in graph.nodes {
        let t = ctx.get(id)?;
        if t.op() != graph::Op::None
            && !t.op().is_view_op()
            && let Some(st) = t.storage()
            && backend_core::storage_is_writable(st) == Some(false)
        {
            return Err(BackendError::read_only(format!(
                "CPU: node {:?} ({}) writes into read-only memory",
                id,
                t.name()
            )));
        }
    }
    let kernels = engine.get(opts.n_threads);
    let kopts = cpu_kernels::ComputeOptions {
        n_threads: opts.n_threads,
        abort: opts.abort.clone(),
    };
    kernels.compute_with(ctx, graph, &kopts)
}

/// The CPU backend (`ggml_backend_cpu`). Get one with [`crate::init`] or through the registry
/// (`GlobalRegistry::get().init_by_name("CPU", "n_threads=4")`), and reach its settings with
/// [`CpuBackend::from_backend`].
///
/// ```
/// let backend = backend_cpu::init()?;
/// let cpu = backend_cpu::CpuBackend::from_backend(&backend).unwrap();
/// cpu.set_n_threads(2);
/// assert_eq!(cpu.n_threads(), 2);
/// cpu.set_abort_callback(Some(std::sync::Arc::new(|| false)));
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub struct CpuBackend {
    device: Device,
    n_threads: AtomicUsize,
    abort: parking_lot_free::Slot<AbortCallback>,
    engine: Engine,
}

impl fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBackend")
            .field("n_threads", &self.n_threads())
            .field("abort_callback", &self.abort.get().is_some())
            .finish()
    }
}

/// A tiny mutex-protected slot (std only; poisoning cannot leave it inconsistent because the
/// value is replaced whole).
mod parking_lot_free {
    use std::sync::Mutex;

    pub(crate) struct Slot<T>(Mutex<Option<T>>);

    impl<T: Clone> Slot<T> {
        pub(crate) fn new() -> Self {
            Slot(Mutex::new(None))
        }
        pub(crate) fn get(&self) -> Option<T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
        pub(crate) fn set(&self, v: Option<T>) {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = v;
        }
    }
}

/// The default thread count: what the OS says this process may use, at least 1.
pub fn default_n_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Parse `init_backend` parameters: empty, or `n_threads=N`.
pub(crate) fn parse_params(params: &str) -> Result<Option<usize>> {
    let mut n_threads = None;
    for item in params.split([',', ' ']).filter(|s| !s.is_empty()) {
        match item.split_once('=') {
            Some(("n_threads", v)) => match v.parse::<usize>() {
                Ok(n) if n > 0 => n_threads = Some(n),
                _ => {
                    return Err(BackendError::invalid_params(
                        CPU_NAME,
                        format!("n_threads must be a positive integer, got {v:?}"),
                    ));
                }
            },
            _ => {
                return Err(BackendError::invalid_params(
                    CPU_NAME,
                    format!("unknown parameter {item:?} (known: n_threads=N)"),
                ));
            }
        }
    }
    Ok(n_threads)
}

impl CpuBackend {
    /// A CPU backend on the CPU device with the default thread count and no abort callback.
    pub fn new() -> Self {
        CpuBackend::with_device(crate::cpu_device())
    }

    pub(crate) fn with_device(device: Device) -> Self {
        CpuBackend {
            device,
            n_threads: AtomicUsize::new(default_n_threads()),
            abort: parking_lot_free::Slot::new(),
            engine: Engine::default(),
        }
    }

    /// The CPU backend behind `backend`, if it is one.
    pub fn from_backend(backend: &Backend) -> Option<&CpuBackend> {
        backend.implementation().as_any().downcast_ref()
    }

    /// Threads used by graph computes.
    pub fn n_threads(&self) -> usize {
        self.n_threads.load(Ordering::Relaxed)
    }

    /// Set the thread count (`ggml_backend_cpu_set_n_threads`); 0 is taken as 1.
    pub fn set_n_threads(&self, n: usize) {
        self.n_threads.store(n.max(1), Ordering::Relaxed);
    }

    /// Set or remove the abort callback (`ggml_backend_cpu_set_abort_callback`).
    pub fn set_abort_callback(&self, callback: Option<AbortCallback>) {
        self.abort.set(callback);
    }

    fn options(&self) -> ComputeOptions {
        ComputeOptions {
            n_threads: self.n_threads(),
            abort: self.abort.get(),
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

/// The CPU's graph plan: the settings captured at creation (ggml's `cplan`).
struct CpuPlan {
    n_threads: usize,
    abort: Option<AbortCallback>,
}

impl GraphPlan for CpuPlan {}

impl BackendImpl for CpuBackend {
    fn name(&self) -> &str {
        CPU_NAME
    }
    fn guid(&self) -> Guid {
        CPU_GUID
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn graph_plan_create(
        &self,
        _ctx: &Context,
        _graph: GraphView<'_>,
    ) -> Result<Box<dyn GraphPlan>> {
        let o = self.options();
        Ok(Box::new(CpuPlan {
            n_threads: o.n_threads,
            abort: o.abort,
        }))
    }
    fn graph_plan_update(
        &self,
        plan: &mut dyn GraphPlan,
        _ctx: &Context,
        _graph: GraphView<'_>,
    ) -> Result<()> {
        let plan = (plan as &mut dyn Any)
            .downcast_mut::<CpuPlan>()
            .ok_or_else(|| BackendError::failed(CPU_NAME, "not a CPU plan"))?;
        let o = self.options();
        plan.n_threads = o.n_threads;
        plan.abort = o.abort;
        Ok(())
    }
    fn graph_plan_compute(
        &self,
        plan: &mut dyn GraphPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<ComputeStatus> {
        let plan = (plan as &mut dyn Any)
            .downcast_mut::<CpuPlan>()
            .ok_or_else(|| BackendError::failed(CPU_NAME, "not a CPU plan"))?;
        let opts = ComputeOptions {
            n_threads: plan.n_threads,
            abort: plan.abort.clone(),
        };
        compute_nodes(&self.engine, ctx, graph, &opts)
    }
    fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus> {
        compute_nodes(&self.engine, ctx, graph, &self.options())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
