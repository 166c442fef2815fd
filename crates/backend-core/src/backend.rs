//! Backends: a stream of work on one device.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use graph::{Context, GraphView, Tensor, TensorId};

use crate::buffer::BufferType;
use crate::device::Device;
use crate::error::{BackendError, Result};
use crate::event::Event;

/// A backend's globally unique id (`ggml_guid`).
pub type Guid = [u8; 16];

/// How a compute ended (`ggml_status` without the failure codes, which are errors here).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ComputeStatus {
    /// Every node was computed.
    Success,
    /// The abort callback stopped the computation between two ops; buffers stay valid.
    Aborted,
}

/// A backend's precomputed plan for one graph (`ggml_backend_graph_plan_t`): whatever the
/// backend wants to prepare once and reuse for many computes of graphs of the same shape
/// (thread pools, work buffers, captured command lists). Freed by dropping it. The backend
/// that made it gets its own type back by upcasting to `dyn Any` and downcasting:
/// `(plan as &mut dyn Any).downcast_mut::<MyPlan>()`.
pub trait GraphPlan: Send + Any {}

/// What a backend crate implements per stream (`ggml_backend_i`).
///
/// The optional async operations default to their synchronous forms, and events, plans and
/// async copies to "unsupported" — exactly the seed's fallbacks.
pub trait BackendImpl: Send + Sync + 'static {
    /// Name, e.g. `"CPU"`.
    fn name(&self) -> &str;
    /// Globally unique id of the backend kind.
    fn guid(&self) -> Guid;
    /// The device this backend runs on.
    fn device(&self) -> Device;

    /// Write `data` into `tensor` at `offset`, possibly after queued work; the bytes are
    /// captured before this returns. Default: the synchronous buffer write.
    fn set_tensor_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        crate::tensor::tensor_set(ctx, tensor, offset, data)
    }
    /// Read `tensor` into `data` once queued work is done; complete when this returns.
    /// Default: the synchronous buffer read.
    fn get_tensor_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &mut [u8],
    ) -> Result<()> {
        crate::tensor::tensor_get(ctx, tensor, offset, data)
    }
    /// Queue a copy from `src` (on `src_backend`) to `dst` (on this backend). `Ok(false)`:
    /// not possible asynchronously, the caller falls back to synchronize + copy.
    fn cpy_tensor_async(
        &self,
        _src_backend: &Backend,
        _src: &Tensor,
        _dst: &Tensor,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Wait for every queued operation to finish.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Prepare a plan for `graph`.
    fn graph_plan_create(
        &self,
        _ctx: &Context,
        _graph: GraphView<'_>,
    ) -> Result<Box<dyn GraphPlan>> {
        Err(BackendError::unsupported(self.name(), "graph plans"))
    }
    /// Refresh a plan for a changed graph of the same shape.
    fn graph_plan_update(
        &self,
        _plan: &mut dyn GraphPlan,
        _ctx: &Context,
        _graph: GraphView<'_>,
    ) -> Result<()> {
        Err(BackendError::unsupported(self.name(), "graph plans"))
    }
    /// Compute a plan.
    fn graph_plan_compute(
        &self,
        _plan: &mut dyn GraphPlan,
        _ctx: &Context,
        _graph: GraphView<'_>,
    ) -> Result<ComputeStatus> {
        Err(BackendError::unsupported(self.name(), "graph plans"))
    }
    /// Queue the computation of `graph`'s nodes in order. Tensors' metadata and storage are
    /// read from `ctx` during the call; an asynchronous backend must capture what it needs.
    fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus>;
    /// Record `event` after the work queued so far.
    fn event_record(&self, _event: &Event) -> Result<()> {
        Err(BackendError::unsupported(self.name(), "events"))
    }
    /// Make work queued after this call wait for `event`.
    fn event_wait(&self, _event: &Event) -> Result<()> {
        Err(BackendError::unsupported(self.name(), "events"))
    }
    /// For downcasting by the crate that made it (e.g. to set thread counts).
    fn as_any(&self) -> &dyn Any;
}

/// A handle to a backend (`ggml_backend_t`). Clones share the backend; equality is identity.
#[derive(Clone)]
pub struct Backend(Arc<dyn BackendImpl>);

impl Backend {
    /// Wrap an implementation.
    pub fn new(imp: impl BackendImpl) -> Self {
        Backend(Arc::new(imp))
    }
    /// Wrap a shared implementation.
    pub fn from_arc(imp: Arc<dyn BackendImpl>) -> Self {
        Backend(imp)
    }
    /// The implementation.
    pub fn implementation(&self) -> &dyn BackendImpl {
        &*self.0
    }
    /// Name.
    pub fn name(&self) -> &str {
        self.0.name()
    }
    /// Guid.
    pub fn guid(&self) -> Guid {
        self.0.guid()
    }
    /// Device.
    pub fn device(&self) -> Device {
        self.0.device()
    }
    /// The device's default buffer type.
    pub fn default_buffer_type(&self) -> BufferType {
        self.device().buffer_type()
    }
    /// Allocate a buffer of the default type.
    pub fn alloc_buffer(&self, size: usize) -> Result<crate::Buffer> {
        self.default_buffer_type().alloc_buffer(size)
    }
    /// Alignment of the default buffer type.
    pub fn alignment(&self) -> usize {
        self.default_buffer_type().alignment()
    }
    /// Max size of the default buffer type.
    pub fn max_size(&self) -> usize {
        self.default_buffer_type().max_size()
    }

    /// Checked asynchronous write (bounds and allocation checked first).
    pub fn tensor_set_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        crate::tensor::check_range(ctx, tensor, offset, data.len(), "tensor_set_async")?;
        self.0.set_tensor_async(ctx, tensor, offset, data)
    }
    /// Checked asynchronous read.
    pub fn tensor_get_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &mut [u8],
    ) -> Result<()> {
        crate::tensor::check_range(ctx, tensor, offset, data.len(), "tensor_get_async")?;
        self.0.get_tensor_async(ctx, tensor, offset, data)
    }
    /// Wait for queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
    /// Create a plan.
    pub fn graph_plan_create(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<Box<dyn GraphPlan>> {
        self.0.graph_plan_create(ctx, graph)
    }
    /// Update a plan.
    pub fn graph_plan_update(
        &self,
        plan: &mut dyn GraphPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<()> {
        self.0.graph_plan_update(plan, ctx, graph)
    }
    /// Free a plan (`ggml_backend_graph_plan_free`). Dropping the box does the same; this
    /// exists so code ported from ggml reads the same.
    pub fn graph_plan_free(&self, plan: Box<dyn GraphPlan>) {
        drop(plan);
    }
    /// Compute a plan.
    pub fn graph_plan_compute(
        &self,
        plan: &mut dyn GraphPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<ComputeStatus> {
        self.0.graph_plan_compute(plan, ctx, graph)
    }
    /// Queue a graph.
    pub fn graph_compute_async(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<ComputeStatus> {
        self.0.graph_compute(ctx, graph)
    }
    /// Compute a graph and wait for it (`ggml_backend_graph_compute` = async + synchronize).
    pub fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus> {
        let status = self.0.graph_compute(ctx, graph)?;
        self.0.synchronize()?;
        Ok(status)
    }
    /// Whether this backend computes `op` (asks its device).
    pub fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.device().supports_op(ctx, op)
    }
    /// Whether this backend reads `buft` (asks its device).
    pub fn supports_buft(&self, buft: &BufferType) -> bool {
        self.device().supports_buft(buft)
    }
    /// Whether to offload `op` here (asks its device).
    pub fn offload_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.device().offload_op(ctx, op)
    }
    /// Record `event` on this backend; the event must belong to this backend's device.
    pub fn event_record(&self, event: &Event) -> Result<()> {
        event.check_device(self)?;
        self.0.event_record(event)
    }
    /// Make this backend wait for `event` (of any device this backend's implementation
    /// accepts; the seed leaves cross-device waits to the backend).
    pub fn event_wait(&self, event: &Event) -> Result<()> {
        self.0.event_wait(event)
    }
    /// A stable identity.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }
}

impl PartialEq for Backend {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Backend {}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.name())
    }
}
