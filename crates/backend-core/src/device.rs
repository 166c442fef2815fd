//! Devices: what a backend crate exposes for each piece of hardware it drives.

use std::fmt;
use std::sync::Arc;

use graph::{Context, TensorId};

use crate::backend::Backend;
use crate::buffer::{Buffer, BufferType};
use crate::error::{BackendError, Result};
use crate::event::Event;
use crate::host::HostMemory;
use crate::registry::Registry;

/// Kind of device (`ggml_backend_dev_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// A CPU: the scheduler's fallback.
    Cpu,
    /// A GPU with its own memory.
    Gpu,
    /// An accelerator that works next to the CPU (BLAS and the like).
    Accel,
}

/// Optional capabilities of a device (`ggml_backend_dev_caps`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Asynchronous set/get/copy/compute.
    pub async_ops: bool,
    /// Has a pinned host buffer type.
    pub host_buffer: bool,
    /// Can wrap caller-owned host memory in a buffer.
    pub buffer_from_host_memory: bool,
    /// Supports events.
    pub events: bool,
}

/// Everything about a device at once (`ggml_backend_dev_props`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProps {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Free memory in bytes.
    pub memory_free: usize,
    /// Total memory in bytes.
    pub memory_total: usize,
    /// Kind.
    pub device_type: DeviceType,
    /// Capabilities.
    pub caps: DeviceCaps,
}

/// What a backend crate implements per device (`ggml_backend_device_i`).
///
/// Optional capabilities default to "unsupported": no host buffer type, no buffers over host
/// memory, no events, no offload preference.
pub trait DeviceImpl: Send + Sync + 'static {
    /// Short unique name, e.g. `"CPU"`.
    fn name(&self) -> &str;
    /// Human-readable description.
    fn description(&self) -> &str;
    /// (free, total) memory in bytes.
    fn memory(&self) -> (usize, usize);
    /// Kind of device.
    fn device_type(&self) -> DeviceType;
    /// Capabilities.
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    /// A new backend (stream) on this device; `params` is backend-specific text.
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend>;
    /// The device's default buffer type.
    fn buffer_type(&self) -> BufferType;
    /// A host buffer type that transfers fast to this device (pinned memory).
    fn host_buffer_type(&self) -> Option<BufferType> {
        None
    }
    /// Extra buffer types of the device (ggml's `ggml_backend_dev_get_extra_bufts`): memory
    /// its backends read, in which some weights are stored in a layout of the device's own
    /// (the CPU's `CPU_REPACK`). A weight belongs in one when [`DeviceImpl::supports_op`]
    /// accepts the op that uses it with the weight placed there: see
    /// [`crate::WeightBufferTypes`]. None by default.
    fn extra_buffer_types(&self) -> Vec<BufferType> {
        Vec::new()
    }
    /// A buffer over caller-owned host memory (e.g. a memory-mapped weights file). The buffer
    /// keeps `memory` alive and never frees it itself.
    fn buffer_from_host_memory(
        &self,
        _memory: HostMemory,
        _max_tensor_size: usize,
    ) -> Result<Buffer> {
        Err(BackendError::unsupported(
            self.name(),
            "buffers over host memory",
        ))
    }
    /// Whether a backend of this device can compute `op`.
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool;
    /// Whether a backend of this device can use tensors in `buft`.
    fn supports_buft(&self, buft: &BufferType) -> bool;
    /// Whether `op` (whose weights are in host memory) is worth running here anyway.
    fn offload_op(&self, _ctx: &Context, _op: TensorId) -> bool {
        false
    }
    /// A new event of this device.
    fn event_new(&self, _device: &Device) -> Result<Event> {
        Err(BackendError::unsupported(self.name(), "events"))
    }
    /// The registry this device belongs to (ggml's `ggml_backend_dev_backend_reg`): the one
    /// whose [`RegistryImpl::devices`](crate::RegistryImpl::devices) lists it, so that code
    /// holding only a device reaches its backend's proc-address lookup. `None` by default,
    /// for a device that belongs to no registry.
    fn registry(&self) -> Option<Registry> {
        None
    }
}

/// A handle to a device (`ggml_backend_dev_t`); equality is identity.
#[derive(Clone)]
pub struct Device(Arc<dyn DeviceImpl>);

impl Device {
    /// Wrap an implementation (create it once; identity matters).
    pub fn new(imp: impl DeviceImpl) -> Self {
        Device(Arc::new(imp))
    }
    /// Wrap a shared implementation.
    pub fn from_arc(imp: Arc<dyn DeviceImpl>) -> Self {
        Device(imp)
    }
    /// The implementation.
    pub fn implementation(&self) -> &dyn DeviceImpl {
        &*self.0
    }
    /// Name.
    pub fn name(&self) -> &str {
        self.0.name()
    }
    /// Description.
    pub fn description(&self) -> &str {
        self.0.description()
    }
    /// (free, total) memory.
    pub fn memory(&self) -> (usize, usize) {
        self.0.memory()
    }
    /// Kind.
    pub fn device_type(&self) -> DeviceType {
        self.0.device_type()
    }
    /// Capabilities.
    pub fn caps(&self) -> DeviceCaps {
        self.0.caps()
    }
    /// Everything at once.
    pub fn props(&self) -> DeviceProps {
        let (memory_free, memory_total) = self.memory();
        DeviceProps {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            memory_free,
            memory_total,
            device_type: self.device_type(),
            caps: self.caps(),
        }
    }
    /// A new backend on this device.
    pub fn init_backend(&self, params: &str) -> Result<Backend> {
        self.0.init_backend(self, params)
    }
    /// Default buffer type.
    pub fn buffer_type(&self) -> BufferType {
        self.0.buffer_type()
    }
    /// Pinned host buffer type, if any.
    pub fn host_buffer_type(&self) -> Option<BufferType> {
        self.0.host_buffer_type()
    }
    /// Extra buffer types for weights ([`DeviceImpl::extra_buffer_types`]).
    pub fn extra_buffer_types(&self) -> Vec<BufferType> {
        self.0.extra_buffer_types()
    }
    /// A buffer over caller-owned host memory.
    pub fn buffer_from_host_memory(
        &self,
        memory: HostMemory,
        max_tensor_size: usize,
    ) -> Result<Buffer> {
        self.0.buffer_from_host_memory(memory, max_tensor_size)
    }
    /// Whether this device computes `op`.
    pub fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.0.supports_op(ctx, op)
    }
    /// Whether this device reads `buft`.
    pub fn supports_buft(&self, buft: &BufferType) -> bool {
        self.0.supports_buft(buft)
    }
    /// Whether to offload `op` here.
    pub fn offload_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.0.offload_op(ctx, op)
    }
    /// A new event.
    pub fn event_new(&self) -> Result<Event> {
        self.0.event_new(self)
    }
    /// The registry this device belongs to ([`DeviceImpl::registry`], ggml's
    /// `ggml_backend_dev_backend_reg`), if any.
    ///
    /// ```
    /// let dev = backend_cpu::cpu_device();
    /// let reg = dev.registry().expect("the CPU device belongs to the CPU registry");
    /// assert_eq!(reg, backend_cpu::cpu_registry());
    /// assert!(reg.devices().contains(&dev));
    /// ```
    pub fn registry(&self) -> Option<Registry> {
        self.0.registry()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}
