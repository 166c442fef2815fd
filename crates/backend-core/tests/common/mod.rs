//! A small in-test device: "device memory" is a `Mutex<Vec<u8>>` (not host memory, so the
//! checked helpers must go through the buffer's own set/get), and its backend queues work
//! lazily so the event contract can be observed.
#![allow(dead_code)]

use std::any::Any;
use std::sync::{Arc, Mutex};

use backend_core::*;
use graph::{Context, GraphView, Tensor, TensorId};

pub struct MemBuft {
    pub name: &'static str,
    pub align: usize,
    pub max: usize,
    pub device: Mutex<Option<Device>>,
}

impl BufferTypeImpl for MemBuft {
    fn name(&self) -> &str {
        self.name
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        Ok(Box::new(MemBuffer {
            bytes: Mutex::new(vec![0xEE; size]),
            writable: true,
        }))
    }
    fn alignment(&self) -> usize {
        self.align
    }
    fn max_size(&self) -> usize {
        self.max
    }
    fn device(&self) -> Option<Device> {
        self.device.lock().unwrap().clone()
    }
}

pub struct MemBuffer {
    pub bytes: Mutex<Vec<u8>>,
    pub writable: bool,
}

fn base(t: &Tensor) -> usize {
    t.storage().unwrap().offset
}

impl BufferImpl for MemBuffer {
    fn memset_tensor(&self, t: &Tensor, value: u8, offset: usize, size: usize) -> Result<()> {
        let o = base(t) + offset;
        self.bytes.lock().unwrap()[o..o + size].fill(value);
        Ok(())
    }
    fn set_tensor(&self, t: &Tensor, offset: usize, data: &[u8]) -> Result<()> {
        let o = base(t) + offset;
        self.bytes.lock().unwrap()[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn get_tensor(&self, t: &Tensor, offset: usize, data: &mut [u8]) -> Result<()> {
        let o = base(t) + offset;
        data.copy_from_slice(&self.bytes.lock().unwrap()[o..o + data.len()]);
        Ok(())
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.bytes.lock().unwrap().fill(value);
        Ok(())
    }
    fn is_writable(&self) -> bool {
        self.writable
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub fn mem_buft(align: usize) -> BufferType {
    BufferType::new(MemBuft {
        name: "MEM",
        align,
        max: usize::MAX,
        device: Mutex::new(None),
    })
}

/// The backend's stream: `queued` operations submitted, `done` of them finished. Work runs
/// only when someone synchronizes.
#[derive(Default)]
pub struct Stream {
    pub queued: u64,
    pub done: u64,
    /// Events this stream must see complete before running work queued after the wait:
    /// (other stream, point, position in this stream's queue).
    pub waits: Vec<(Arc<Mutex<Stream>>, u64, u64)>,
}

impl Stream {
    /// Run everything up to `point`, first finishing what it waits for.
    pub fn run_until(this: &Arc<Mutex<Stream>>, point: u64) {
        let waits: Vec<_> = {
            let s = this.lock().unwrap();
            s.waits
                .iter()
                .filter(|(_, _, at)| *at < point)
                .map(|(o, p, _)| (o.clone(), *p))
                .collect()
        };
        for (other, p) in waits {
            Stream::run_until(&other, p);
        }
        let mut s = this.lock().unwrap();
        s.done = s.done.max(point.min(s.queued));
    }
}

pub struct TestEvent {
    /// The stream and point recorded, if any.
    pub recorded: Mutex<Option<(Arc<Mutex<Stream>>, u64)>>,
}

impl EventImpl for TestEvent {
    fn synchronize(&self) -> Result<()> {
        if let Some((s, p)) = self.recorded.lock().unwrap().clone() {
            Stream::run_until(&s, p);
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub struct TestDevice {
    pub name: &'static str,
    pub buft: BufferType,
    pub events: bool,
}

impl DeviceImpl for TestDevice {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "in-test device"
    }
    fn memory(&self) -> (usize, usize) {
        (1 << 20, 2 << 20)
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: true,
            events: self.events,
            ..DeviceCaps::default()
        }
    }
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend> {
        if !params.is_empty() {
            return Err(BackendError::invalid_params(self.name, params));
        }
        Ok(Backend::new(TestBackend {
            device: device.clone(),
            stream: Arc::default(),
        }))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, _ctx: &Context, _op: TensorId) -> bool {
        true
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft
    }
    fn event_new(&self, device: &Device) -> Result<Event> {
        if !self.events {
            return Err(BackendError::unsupported(self.name, "events"));
        }
        Ok(Event::new(
            device.clone(),
            TestEvent {
                recorded: Mutex::new(None),
            },
        ))
    }
}

pub struct TestBackend {
    pub device: Device,
    pub stream: Arc<Mutex<Stream>>,
}

impl TestBackend {
    pub fn of(b: &Backend) -> &TestBackend {
        b.implementation().as_any().downcast_ref().unwrap()
    }
    pub fn queued(&self) -> u64 {
        self.stream.lock().unwrap().queued
    }
    pub fn done(&self) -> u64 {
        self.stream.lock().unwrap().done
    }
}

impl BackendImpl for TestBackend {
    fn name(&self) -> &str {
        self.device.name()
    }
    fn guid(&self) -> Guid {
        [7; 16]
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn synchronize(&self) -> Result<()> {
        let q = self.queued();
        Stream::run_until(&self.stream, q);
        Ok(())
    }
    fn graph_compute(&self, _ctx: &Context, _graph: GraphView<'_>) -> Result<ComputeStatus> {
        self.stream.lock().unwrap().queued += 1;
        Ok(ComputeStatus::Success)
    }
    fn event_record(&self, event: &Event) -> Result<()> {
        let ev: &TestEvent = event.implementation().as_any().downcast_ref().unwrap();
        let q = self.queued();
        *ev.recorded.lock().unwrap() = Some((self.stream.clone(), q));
        Ok(())
    }
    fn event_wait(&self, event: &Event) -> Result<()> {
        let Some(ev) = event.implementation().as_any().downcast_ref::<TestEvent>() else {
            return Err(BackendError::unsupported(
                self.name(),
                "waiting for foreign events",
            ));
        };
        if let Some((s, p)) = ev.recorded.lock().unwrap().clone() {
            let mut me = self.stream.lock().unwrap();
            let at = me.queued;
            me.waits.push((s, p, at));
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub fn test_device(name: &'static str, events: bool) -> Device {
    let buft = mem_buft(32);
    Device::new(TestDevice { name, buft, events })
}

pub struct TestRegistry {
    pub name: String,
    pub devices: Vec<Device>,
}

impl RegistryImpl for TestRegistry {
    fn name(&self) -> &str {
        &self.name
    }
    fn devices(&self) -> Vec<Device> {
        self.devices.clone()
    }
}
