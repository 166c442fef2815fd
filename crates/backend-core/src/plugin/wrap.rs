//! Host-side wrappers around a plugin's objects. Each holds the plugin's [`Anchor`] (declared
//! after the wrapped object, so the object is dropped first, while its code is still mapped)
//! and delegates; handles handed out (devices, buffer types, backends, events, buffers) are
//! these wrappers, so every one of them keeps the library loaded, and [`PluginRegistry::busy`]
//! can tell from reference counts whether anything outside the registry still uses it.

use std::any::Any;
use std::sync::{Arc, Weak};

use graph::{Context, GraphView, Tensor, TensorId};

use crate::backend::{Backend, BackendImpl, ComputeStatus, GraphPlan, Guid};
use crate::buffer::{Buffer, BufferImpl, BufferType, BufferTypeImpl};
use crate::device::{Device, DeviceCaps, DeviceImpl, DeviceType};
use crate::error::{BackendError, Result};
use crate::event::{Event, EventImpl};
use crate::host::HostMemory;
use crate::registry::{Registry, RegistryImpl};

/// What keeps a plugin's code mapped: the loaded library (or, in tests, any value).
pub(crate) type Anchor = Arc<dyn Any + Send + Sync>;

/// A plugin's registry as the host sees it.
pub(crate) struct PluginRegistry {
    inner: Registry,
    devices: Vec<Arc<PluginDevice>>,
    _anchor: Anchor,
}

impl PluginRegistry {
    /// Wrap `inner` and every device it lists now.
    pub(crate) fn wrap(inner: Registry, anchor: Anchor) -> Arc<PluginRegistry> {
        Arc::new_cyclic(|weak| {
            let devices = inner
                .devices()
                .into_iter()
                .map(|d| PluginDevice::wrap(d, weak.clone(), anchor.clone()))
                .collect();
            PluginRegistry {
                inner,
                devices,
                _anchor: anchor,
            }
        })
    }

    /// Whether anything besides the registry's own `owners` references (the loader's record
    /// and the global registry's entry) holds a handle from this plugin.
    pub(crate) fn busy(self: &Arc<Self>, owners: usize) -> bool {
        Arc::strong_count(self) > owners
            || self
                .devices
                .iter()
                .any(|d| Arc::strong_count(d) > 1 || d.bufts().any(|b| Arc::strong_count(b) > 1))
    }
}

impl RegistryImpl for PluginRegistry {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn devices(&self) -> Vec<Device> {
        self.devices
            .iter()
            .map(|d| Device::from_arc(d.clone()))
            .collect()
    }
    fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.inner.extension(name)
    }
}

/// A plugin's device.
pub(crate) struct PluginDevice {
    inner: Device,
    buft: Arc<PluginBufferType>,
    host_buft: Option<Arc<PluginBufferType>>,
    extra_bufts: Vec<Arc<PluginBufferType>>,
    registry: Weak<PluginRegistry>,
    anchor: Anchor,
}

impl PluginDevice {
    fn wrap(inner: Device, registry: Weak<PluginRegistry>, anchor: Anchor) -> Arc<PluginDevice> {
        Arc::new_cyclic(|weak: &Weak<PluginDevice>| {
            let wrap = |b: BufferType| {
                Arc::new(PluginBufferType {
                    inner: b,
                    device: weak.clone(),
                    _anchor: anchor.clone(),
                })
            };
            PluginDevice {
                buft: wrap(inner.buffer_type()),
                host_buft: inner.host_buffer_type().map(wrap),
                extra_bufts: inner.extra_buffer_types().into_iter().map(wrap).collect(),
                inner,
                registry,
                anchor: anchor.clone(),
            }
        })
    }

    fn bufts(&self) -> impl Iterator<Item = &Arc<PluginBufferType>> {
        std::iter::once(&self.buft)
            .chain(&self.host_buft)
            .chain(&self.extra_bufts)
    }

    /// The plugin's own buffer type behind `outer` (one of ours), else `outer` itself.
    fn inner_buft(&self, outer: &BufferType) -> BufferType {
        self.bufts()
            .find(|b| BufferType::from_arc((*b).clone()) == *outer)
            .map_or_else(|| outer.clone(), |b| b.inner.clone())
    }

    /// Our wrapper of the plugin's buffer type `inner`, if we have one.
    fn outer_buft(&self, inner: &BufferType) -> Option<BufferType> {
        self.bufts()
            .find(|b| b.inner == *inner)
            .map(|b| BufferType::from_arc(b.clone()))
    }
}

impl DeviceImpl for PluginDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn memory(&self) -> (usize, usize) {
        self.inner.memory()
    }
    fn device_type(&self) -> DeviceType {
        self.inner.device_type()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend> {
        let inner = self.inner.init_backend(params)?;
        Ok(Backend::new(PluginBackend {
            inner,
            device: device.clone(),
            _anchor: self.anchor.clone(),
        }))
    }
    fn buffer_type(&self) -> BufferType {
        BufferType::from_arc(self.buft.clone())
    }
    fn host_buffer_type(&self) -> Option<BufferType> {
        self.host_buft
            .as_ref()
            .map(|b| BufferType::from_arc(b.clone()))
    }
    fn extra_buffer_types(&self) -> Vec<BufferType> {
        self.extra_bufts
            .iter()
            .map(|b| BufferType::from_arc(b.clone()))
            .collect()
    }
    fn buffer_from_host_memory(
        &self,
        memory: HostMemory,
        max_tensor_size: usize,
    ) -> Result<Buffer> {
        let inner = self
            .inner
            .buffer_from_host_memory(memory, max_tensor_size)?;
        let buft = self.outer_buft(inner.buffer_type()).ok_or_else(|| {
            BackendError::unsupported(
                self.name(),
                "host-memory buffers of a buffer type the device does not list",
            )
        })?;
        let size = inner.size();
        Ok(Buffer::from_parts(
            buft,
            Some(Box::new(PluginBuffer { inner })),
            size,
        ))
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.inner.supports_op(ctx, op)
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        self.inner.supports_buft(&self.inner_buft(buft))
    }
    fn offload_op(&self, ctx: &Context, op: TensorId) -> bool {
        self.inner.offload_op(ctx, op)
    }
    fn event_new(&self, device: &Device) -> Result<Event> {
        let inner = self.inner.event_new()?;
        Ok(Event::new(
            device.clone(),
            PluginEvent {
                inner,
                _anchor: self.anchor.clone(),
            },
        ))
    }
    fn registry(&self) -> Option<Registry> {
        self.registry
            .upgrade()
            .map(|r| Registry::from_arc(r as Arc<dyn RegistryImpl>))
    }
}

/// A plugin's buffer type.
struct PluginBufferType {
    inner: BufferType,
    device: Weak<PluginDevice>,
    _anchor: Anchor,
}

impl BufferTypeImpl for PluginBufferType {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        // The handle that calls this wraps the answer with *our* buffer type, which keeps the
        // library loaded for as long as the buffer lives.
        self.inner.implementation().alloc_buffer(size)
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn max_size(&self) -> usize {
        self.inner.max_size()
    }
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        self.inner.alloc_size(tensor)
    }
    fn is_host(&self) -> bool {
        self.inner.is_host()
    }
    fn device(&self) -> Option<Device> {
        self.device
            .upgrade()
            .map(|d| Device::from_arc(d as Arc<dyn DeviceImpl>))
    }
}

/// A buffer a plugin made itself (over host memory), re-typed with our buffer type.
struct PluginBuffer {
    inner: Buffer,
}

impl PluginBuffer {
    fn imp(&self) -> Result<&dyn BufferImpl> {
        self.inner
            .implementation()
            .ok_or_else(|| BackendError::unsupported(self.inner.name(), "an empty buffer"))
    }
}

impl BufferImpl for PluginBuffer {
    fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        self.imp()?.init_tensor(tensor)
    }
    fn memset_tensor(&self, tensor: &Tensor, value: u8, offset: usize, size: usize) -> Result<()> {
        self.imp()?.memset_tensor(tensor, value, offset, size)
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> Result<()> {
        self.imp()?.set_tensor(tensor, offset, data)
    }
    fn get_tensor(&self, tensor: &Tensor, offset: usize, data: &mut [u8]) -> Result<()> {
        self.imp()?.get_tensor(tensor, offset, data)
    }
    fn cpy_tensor(&self, src: &Tensor, dst: &Tensor) -> Result<bool> {
        self.imp()?.cpy_tensor(src, dst)
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.imp()?.clear(value)
    }
    fn reset(&self) {
        if let Ok(b) = self.imp() {
            b.reset();
        }
    }
    fn is_writable(&self) -> bool {
        self.imp().is_ok_and(|b| b.is_writable())
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        self.imp().ok()?.host_ptr()
    }
    fn base_address(&self) -> u64 {
        self.imp().map_or(0, |b| b.base_address())
    }
    fn as_any(&self) -> &dyn Any {
        // The plugin recognises its own buffers by downcasting.
        self.imp().map_or(self as &dyn Any, |b| b.as_any())
    }
}

/// A plugin's backend.
struct PluginBackend {
    inner: Backend,
    /// Our device handle (the plugin's backend knows only its own).
    device: Device,
    _anchor: Anchor,
}

/// The plugin's own backend behind `b`, if `b` is one of ours.
fn inner_backend(b: &Backend) -> &Backend {
    b.implementation()
        .as_any()
        .downcast_ref::<PluginBackend>()
        .map_or(b, |p| &p.inner)
}

/// The plugin's own event behind `e`, if `e` is one of ours.
fn inner_event(e: &Event) -> &Event {
    e.implementation()
        .as_any()
        .downcast_ref::<PluginEvent>()
        .map_or(e, |p| &p.inner)
}

impl BackendImpl for PluginBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn guid(&self) -> Guid {
        self.inner.guid()
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn set_tensor_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        self.inner
            .implementation()
            .set_tensor_async(ctx, tensor, offset, data)
    }
    fn get_tensor_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &mut [u8],
    ) -> Result<()> {
        self.inner
            .implementation()
            .get_tensor_async(ctx, tensor, offset, data)
    }
    fn cpy_tensor_async(&self, src_backend: &Backend, src: &Tensor, dst: &Tensor) -> Result<bool> {
        self.inner
            .implementation()
            .cpy_tensor_async(inner_backend(src_backend), src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.implementation().synchronize()
    }
    fn graph_plan_create(&self, ctx: &Context, graph: GraphView<'_>) -> Result<Box<dyn GraphPlan>> {
        self.inner.implementation().graph_plan_create(ctx, graph)
    }
    fn graph_plan_update(
        &self,
        plan: &mut dyn GraphPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<()> {
        self.inner
            .implementation()
            .graph_plan_update(plan, ctx, graph)
    }
    fn graph_plan_compute(
        &self,
        plan: &mut dyn GraphPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<ComputeStatus> {
        self.inner
            .implementation()
            .graph_plan_compute(plan, ctx, graph)
    }
    fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus> {
        self.inner.implementation().graph_compute(ctx, graph)
    }
    fn event_record(&self, event: &Event) -> Result<()> {
        self.inner.implementation().event_record(inner_event(event))
    }
    fn event_wait(&self, event: &Event) -> Result<()> {
        self.inner.implementation().event_wait(inner_event(event))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A plugin's event.
struct PluginEvent {
    inner: Event,
    _anchor: Anchor,
}

impl EventImpl for PluginEvent {
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
