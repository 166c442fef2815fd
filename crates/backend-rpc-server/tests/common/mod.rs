//! Test helpers: a memory-only device (no compute) to serve, and the CPU device the fuzz tests
//! serve.
#![allow(dead_code)]

use std::any::Any;
use std::sync::Arc;

use backend_core::{
    Backend, BackendError, BufferImpl, BufferType, BufferTypeImpl, Device, DeviceImpl, DeviceType,
};
use backend_rpc_server::{Server, ServerConfig};
use graph::{Context, Tensor, TensorId};
use parking_lot::Mutex;

/// Bytes in a `Vec`, reached only through the `BufferImpl` methods.
struct MemBuffer(Mutex<Vec<u8>>);

impl MemBuffer {
    fn range(
        &self,
        t: &Tensor,
        offset: usize,
        len: usize,
    ) -> Result<std::ops::Range<usize>, BackendError> {
        let start = t.storage().map_or(0, |s| s.offset) + offset;
        let n = self.0.lock().len();
        if start + len > n {
            return Err(BackendError::out_of_bounds("mem", start, len, n));
        }
        Ok(start..start + len)
    }
}

impl BufferImpl for MemBuffer {
    fn memset_tensor(
        &self,
        t: &Tensor,
        v: u8,
        off: usize,
        size: usize,
    ) -> backend_core::Result<()> {
        let r = self.range(t, off, size)?;
        self.0.lock()[r].fill(v);
        Ok(())
    }
    fn set_tensor(&self, t: &Tensor, off: usize, data: &[u8]) -> backend_core::Result<()> {
        let r = self.range(t, off, data.len())?;
        self.0.lock()[r].copy_from_slice(data);
        Ok(())
    }
    fn get_tensor(&self, t: &Tensor, off: usize, data: &mut [u8]) -> backend_core::Result<()> {
        let r = self.range(t, off, data.len())?;
        data.copy_from_slice(&self.0.lock()[r]);
        Ok(())
    }
    fn clear(&self, v: u8) -> backend_core::Result<()> {
        self.0.lock().fill(v);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct MemType;
impl BufferTypeImpl for MemType {
    fn name(&self) -> &str {
        "MEM"
    }
    fn alloc_buffer(&self, size: usize) -> backend_core::Result<Box<dyn BufferImpl>> {
        Ok(Box::new(MemBuffer(Mutex::new(vec![0; size]))))
    }
    fn alignment(&self) -> usize {
        32
    }
}

/// A device with memory but no compute.
pub struct MemDevice(BufferType);
impl DeviceImpl for MemDevice {
    fn name(&self) -> &str {
        "MEM"
    }
    fn description(&self) -> &str {
        "memory only"
    }
    fn memory(&self) -> (usize, usize) {
        (1 << 30, 2 << 30)
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn init_backend(&self, _d: &Device, _p: &str) -> backend_core::Result<Backend> {
        Err(BackendError::unsupported("MEM", "compute"))
    }
    fn buffer_type(&self) -> BufferType {
        self.0.clone()
    }
    fn supports_op(&self, _ctx: &Context, _op: TensorId) -> bool {
        false
    }
    fn supports_buft(&self, b: &BufferType) -> bool {
        *b == self.0
    }
}

pub fn mem_device() -> Device {
    Device::new(MemDevice(BufferType::new(MemType)))
}

/// A server over the memory device.
pub fn mem_server(config: ServerConfig) -> Arc<Server> {
    let dev = mem_device();
    let d2 = dev.clone();
    Server::new(dev, Arc::new(move || d2.init_backend("")), config)
}

/// The server the fuzz tests drive: the real CPU device (host memory reached through raw
/// pointers), so a validation gap would show up as a crash or a Miri/ASan finding.
pub fn fuzz_server(config: ServerConfig) -> Arc<Server> {
    let dev = backend_cpu::cpu_device();
    Server::new(dev, Arc::new(backend_cpu::init), config)
}
