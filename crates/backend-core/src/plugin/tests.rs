//! The loader's bookkeeping without a library (so it runs under Miri): an in-process registry
//! installed as if loaded, wrapped, counted, refused while busy, released on unload.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use graph::{Context, GraphView, Tensor, TensorId};

use super::{PluginError, search_dirs_from};
use crate::{
    Backend, BackendImpl, BufferImpl, BufferType, BufferTypeImpl, ComputeStatus, Device,
    DeviceImpl, DeviceType, Event, EventImpl, GlobalRegistry, Guid, Registry, RegistryImpl, Result,
};

struct FakeBuffer;
impl BufferImpl for FakeBuffer {
    fn memset_tensor(&self, _: &Tensor, _: u8, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
    fn set_tensor(&self, _: &Tensor, _: usize, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn get_tensor(&self, _: &Tensor, _: usize, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn clear(&self, _: u8) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FakeBuft(Weak<FakeDevice>);
impl BufferTypeImpl for FakeBuft {
    fn name(&self) -> &str {
        "FAKE"
    }
    fn alloc_buffer(&self, _: usize) -> Result<Box<dyn BufferImpl>> {
        Ok(Box::new(FakeBuffer))
    }
    fn alignment(&self) -> usize {
        8
    }
    fn device(&self) -> Option<Device> {
        self.0
            .upgrade()
            .map(|d| Device::from_arc(d as Arc<dyn DeviceImpl>))
    }
}

struct FakeBackend(Device);
impl BackendImpl for FakeBackend {
    fn name(&self) -> &str {
        "FAKE"
    }
    fn guid(&self) -> Guid {
        [7; 16]
    }
    fn device(&self) -> Device {
        self.0.clone()
    }
    fn graph_compute(&self, _: &Context, _: GraphView<'_>) -> Result<ComputeStatus> {
        Ok(ComputeStatus::Success)
    }
    fn event_record(&self, event: &Event) -> Result<()> {
        // The plugin sees its own event and its own device, not the host's wrappers.
        assert!(event.implementation().as_any().is::<FakeEvent>());
        event.check_device(&Backend::from_arc(Arc::new(FakeBackend(self.0.clone()))))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FakeEvent;
impl EventImpl for FakeEvent {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FakeDevice {
    buft: BufferType,
}
impl DeviceImpl for FakeDevice {
    fn name(&self) -> &str {
        "FAKE0"
    }
    fn description(&self) -> &str {
        "fake"
    }
    fn memory(&self) -> (usize, usize) {
        (0, 0)
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn init_backend(&self, device: &Device, _: &str) -> Result<Backend> {
        Ok(Backend::new(FakeBackend(device.clone())))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, _: &Context, _: TensorId) -> bool {
        true
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft
    }
    fn event_new(&self, device: &Device) -> Result<Event> {
        Ok(Event::new(device.clone(), FakeEvent))
    }
}

struct FakeRegistry(Vec<Device>);
impl RegistryImpl for FakeRegistry {
    fn name(&self) -> &str {
        "FAKE"
    }
    fn devices(&self) -> Vec<Device> {
        self.0.clone()
    }
}

fn fake_registry() -> Registry {
    let dev = Arc::new_cyclic(|w| FakeDevice {
        buft: BufferType::new(FakeBuft(w.clone())),
    });
    Registry::new(FakeRegistry(vec![Device::from_arc(dev)]))
}

#[test]
fn wrapped_handles_keep_the_anchor_and_unload_waits_for_them() {
    let global = GlobalRegistry::default();
    let anchor: Arc<()> = Arc::new(());
    let path = Path::new("/plugins/libbackend_fake.so");
    global.install_loaded(super::install_in_process(
        path,
        fake_registry(),
        anchor.clone(),
    ));
    assert!(Arc::strong_count(&anchor) > 1);

    let dev = global.device_by_name("fake0").unwrap();
    let reg = global.registry("fake").unwrap();
    assert_eq!(dev.registry(), Some(reg.clone()));
    assert_eq!(dev.buffer_type().device(), Some(dev.clone()));
    assert!(
        dev.supports_buft(&dev.buffer_type()),
        "our buffer type maps to the plugin's"
    );
    let backend = dev.init_backend("").unwrap();
    assert_eq!(
        backend.device(),
        dev,
        "backends report the host's device handle"
    );
    let event = dev.event_new().unwrap();
    backend.event_record(&event).unwrap();
    let buffer = dev.buffer_type().alloc_buffer(64).unwrap();
    assert_eq!(buffer.buffer_type(), &dev.buffer_type());

    let busy = PluginError::Busy {
        path: path.to_path_buf(),
        name: "FAKE".to_owned(),
    };
    assert_eq!(global.unload("FAKE"), Err(busy.clone()));
    drop((reg, dev));
    assert_eq!(global.unload("FAKE"), Err(busy.clone()), "backend");
    drop(backend);
    assert_eq!(global.unload("FAKE"), Err(busy.clone()), "event");
    drop(event);
    assert_eq!(global.unload("FAKE"), Err(busy), "buffer");
    assert!(Arc::strong_count(&anchor) > 1);
    drop(buffer);
    assert_eq!(global.unload("fake"), Ok(()));
    assert_eq!(
        Arc::strong_count(&anchor),
        1,
        "every wrapper let the library go"
    );
    assert!(global.registries().is_empty());
    assert_eq!(
        global.unload("fake"),
        Err(PluginError::NotLoaded {
            name: "fake".to_owned()
        })
    );
}

#[test]
fn plugin_file_names() {
    let lib = |s: &str| {
        format!(
            "{}{s}{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        )
    };
    let m = super::load::plugin_file_matches;
    assert!(m(&lib("backend_cpu"), None));
    assert!(m(&lib("backend_cpu"), Some("CPU")));
    assert!(m(&lib("backend-cpu-avx2"), Some("cpu")));
    assert!(m(&lib("backend_cpu_avx2"), Some("cpu")));
    assert!(!m(&lib("backend_cpuid"), Some("cpu")));
    assert!(!m(&lib("backend_cpu_"), Some("cpu")));
    assert!(!m(&lib("backend_"), None));
    assert!(!m(&lib("other"), None));
    assert!(!m("backend_cpu.txt", None));
}

#[test]
fn search_dirs_come_from_the_variable_then_the_executable() {
    let var = std::env::join_paths(["/a", "/b/c"]).unwrap();
    assert_eq!(
        search_dirs_from(Some(&var), Some(Path::new("/bin/app"))),
        vec![
            PathBuf::from("/a"),
            PathBuf::from("/b/c"),
            PathBuf::from("/bin")
        ]
    );
    assert_eq!(search_dirs_from(None, None), Vec::<PathBuf>::new());
}
