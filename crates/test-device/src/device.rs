//! The device and its registry entry.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use backend_core::{
    Backend, BackendError, BufferType, Device, DeviceCaps, DeviceImpl, DeviceType, Event,
    GlobalRegistry, Registry, RegistryImpl, Result,
};
use graph::{Context, TensorId};

use crate::backend::TestBackend;
use crate::buffer::TestBufferType;
use crate::config::TestDeviceConfig;
use crate::event::TestEvent;
use crate::memory::Bus;
use crate::stream::Stream;

/// What the device's buffers, buffer type and backends share.
pub(crate) struct Core {
    pub(crate) config: TestDeviceConfig,
    /// Held by every access to this device's memory.
    pub(crate) bus: Arc<Bus>,
    /// Executes the synchronous buffer commands; started on the first one, so a device that
    /// never touches memory (a registry entry nobody uses) owns no thread.
    engine: OnceLock<Stream>,
    pub(crate) used: AtomicUsize,
    pub(crate) next_addr: AtomicU64,
}

impl Core {
    /// The copy engine, started on first use.
    pub(crate) fn engine(&self) -> Result<&Stream> {
        if let Some(s) = self.engine.get() {
            return Ok(s);
        }
        let s = Stream::new(&format!("{}-copy-engine", self.config.name))?;
        // If another thread won the race, its engine is used and ours stops here.
        Ok(self.engine.get_or_init(|| s))
    }
}

/// A test device (`backend_core::DeviceImpl`). Make one with [`TestDevice::create`]; the
/// registry's default device comes from [`crate::register`].
///
/// ```
/// use backend_core::DeviceType;
/// use test_device::{TestDevice, TestDeviceConfig};
/// let dev = TestDevice::create(TestDeviceConfig::named("GPU0").memory(1 << 20))?;
/// assert_eq!(dev.name(), "GPU0");
/// assert_eq!(dev.device_type(), DeviceType::Gpu);
/// let buft = dev.buffer_type();
/// assert!(!buft.is_host());
/// assert_eq!(buft.device(), Some(dev.clone()));
/// let buf = buft.alloc_buffer(4096)?;
/// assert_eq!(buf.host_ptr(), None); // device memory: only reachable through commands
/// assert_eq!(dev.memory(), ((1 << 20) - 4096, 1 << 20));
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub struct TestDevice {
    pub(crate) core: Arc<Core>,
    buft: BufferType,
    description: String,
}

impl TestDevice {
    /// A new device configured by `config` (not registered anywhere; see [`TestRegistry`]).
    ///
    /// Fails if the alignment is not a power of two.
    pub fn create(config: TestDeviceConfig) -> Result<Device> {
        if !config.alignment.is_power_of_two() {
            return Err(BackendError::failed(
                &config.name,
                format!("alignment {} is not a power of two", config.alignment),
            ));
        }
        let description = format!(
            "in-process test device ({} bytes, alignment {})",
            config.memory, config.alignment
        );
        let core = Arc::new(Core {
            config,
            bus: Arc::new(Bus::default()),
            engine: OnceLock::new(),
            used: AtomicUsize::new(0),
            // A recognisable fake device address space, never a host address.
            next_addr: AtomicU64::new(0x7e57_0000_0000),
        });
        let dev = Arc::new_cyclic(|weak| TestDevice {
            buft: BufferType::new(TestBufferType {
                core: core.clone(),
                device: weak.clone(),
            }),
            core,
            description,
        });
        Ok(Device::from_arc(dev))
    }
}

impl DeviceImpl for TestDevice {
    fn name(&self) -> &str {
        &self.core.config.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        let total = self.core.config.memory;
        (total - self.core.used.load(Ordering::Acquire), total)
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: true,
            host_buffer: false,
            buffer_from_host_memory: false,
            events: true,
        }
    }
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend> {
        if !params.trim().is_empty() {
            return Err(BackendError::failed(
                self.name(),
                format!("unknown backend parameters {params:?} (the test device takes none)"),
            ));
        }
        Ok(Backend::new(TestBackend::new(
            device.clone(),
            self.core.clone(),
        )?))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        ctx.get(op).is_ok_and(|t| {
            self.core.config.supports(t.op()) && crate::compute::kernels_support(ctx, op)
        })
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft
    }
    fn offload_op(&self, _ctx: &Context, _op: TensorId) -> bool {
        self.core.config.offload
    }
    fn event_new(&self, device: &Device) -> Result<Event> {
        Ok(Event::new(
            device.clone(),
            TestEvent {
                state: Arc::default(),
            },
        ))
    }
}

/// The test device family's registry (`backend_core::RegistryImpl`), named `"TEST"`.
///
/// ```
/// use test_device::{TestDevice, TestDeviceConfig, TestRegistry};
/// let a = TestDevice::create(TestDeviceConfig::named("A"))?;
/// let b = TestDevice::create(TestDeviceConfig::named("B"))?;
/// let reg = backend_core::Registry::new(TestRegistry::new(vec![a, b]));
/// assert_eq!(reg.devices().len(), 2);
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub struct TestRegistry {
    devices: Vec<Device>,
}

impl TestRegistry {
    /// A registry over `devices`.
    pub fn new(devices: Vec<Device>) -> Self {
        TestRegistry { devices }
    }
}

impl RegistryImpl for TestRegistry {
    fn name(&self) -> &str {
        "TEST"
    }
    fn devices(&self) -> Vec<Device> {
        self.devices.clone()
    }
}

/// Register the `"TEST"` registry, with one default device `"TEST0"`, in the global registry
/// (idempotent). Returns that device.
///
/// ```
/// let dev = test_device::register()?;
/// let global = backend_core::GlobalRegistry::get();
/// assert_eq!(global.device_by_name("TEST0")?, dev);
/// assert_eq!(test_device::register()?, dev); // once only
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub fn register() -> Result<Device> {
    static DEFAULT: OnceLock<Device> = OnceLock::new();
    if let Some(d) = DEFAULT.get() {
        return Ok(d.clone());
    }
    let dev = TestDevice::create(TestDeviceConfig::default())?;
    let dev = DEFAULT.get_or_init(|| dev).clone();
    GlobalRegistry::get().register(Registry::new(TestRegistry::new(vec![dev.clone()])));
    Ok(dev)
}
