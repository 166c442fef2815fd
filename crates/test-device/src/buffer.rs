//! The device's buffer type and buffers.
//!
//! A [`TestBuffer`] owns a [`DeviceAlloc`] it never exposes: `host_ptr` is `None` and every
//! `BufferImpl` method becomes a command on the device's copy engine (a [`Stream`] of its
//! own), which the caller waits for. That is the shape of a real device backend's synchronous
//! buffer operations: a blocking transfer over the bus, not a `memcpy` into a host pointer.
//! Synchronous buffer commands are not ordered with work queued on the device's backends
//! (as with GPU runtimes); synchronize the backend first.

use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use backend_core::{Buffer, BufferImpl, BufferTypeImpl, Device, Result};
use graph::{Tensor, TensorStorage};

use crate::device::{Core, TestDevice};
use crate::memory::DeviceAlloc;

/// The device's memory kind (`backend_core::BufferTypeImpl`): not host memory, aligned and
/// bounded as configured.
pub struct TestBufferType {
    pub(crate) core: Arc<Core>,
    pub(crate) device: Weak<TestDevice>,
}

impl BufferTypeImpl for TestBufferType {
    fn name(&self) -> &str {
        &self.core.config.name
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        Ok(Box::new(TestBuffer::new(self.core.clone(), size)?))
    }
    fn alignment(&self) -> usize {
        self.core.config.alignment
    }
    fn max_size(&self) -> usize {
        self.core.config.max_buffer_size
    }
    fn is_host(&self) -> bool {
        false
    }
    fn device(&self) -> Option<Device> {
        let dev: Arc<dyn backend_core::DeviceImpl> = self.device.upgrade()?;
        Some(Device::from_arc(dev))
    }
}

/// One allocation of device memory (`backend_core::BufferImpl`).
pub struct TestBuffer {
    pub(crate) core: Arc<Core>,
    pub(crate) mem: Arc<DeviceAlloc>,
    address: u64,
}

impl TestBuffer {
    fn new(core: Arc<Core>, size: usize) -> Result<Self> {
        core.reserve(size)?;
        let mem = match DeviceAlloc::new(&core.config.name, size, core.config.alignment) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                core.release(size);
                return Err(e);
            }
        };
        let address = core.next_address(size);
        tracing::trace!(device = %core.config.name, size, address, "device buffer allocated");
        Ok(TestBuffer { core, mem, address })
    }

    /// Where a tensor's byte `offset` lies in this allocation.
    fn at(tensor: &Tensor, offset: usize) -> usize {
        tensor.storage().map_or(0, |s| s.offset) + offset
    }

    /// Run a transfer command on the copy engine and wait for it.
    fn transfer<R: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::memory::BusGuard<'_>, &DeviceAlloc) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let bus = self.core.bus.clone();
        let mem = self.mem.clone();
        let latency = self.core.config.transfer_latency;
        self.core.engine()?.run(move || {
            if !latency.is_zero() {
                std::thread::sleep(latency);
            }
            let guard = bus.lock();
            f(&guard, &mem)
        })
    }

    /// The test buffer behind `storage` if it belongs to the device of `core`.
    pub(crate) fn of(
        storage: &TensorStorage,
        core: &Arc<Core>,
    ) -> Option<(Buffer, Arc<DeviceAlloc>)> {
        let buf = Buffer::from_storage(storage)?;
        let tb = buf
            .implementation()?
            .as_any()
            .downcast_ref::<TestBuffer>()?;
        if !Arc::ptr_eq(&tb.core, core) {
            return None;
        }
        let mem = tb.mem.clone();
        Some((buf, mem))
    }
}

impl Drop for TestBuffer {
    fn drop(&mut self) {
        self.core.release(self.mem.size());
    }
}

impl BufferImpl for TestBuffer {
    fn memset_tensor(&self, tensor: &Tensor, value: u8, offset: usize, size: usize) -> Result<()> {
        let at = Self::at(tensor, offset);
        self.transfer(move |bus, mem| mem.fill(bus, at, size, value))
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> Result<()> {
        let at = Self::at(tensor, offset);
        let bytes = data.to_vec();
        self.transfer(move |bus, mem| mem.write(bus, at, &bytes))
    }
    fn get_tensor(&self, tensor: &Tensor, offset: usize, data: &mut [u8]) -> Result<()> {
        let at = Self::at(tensor, offset);
        let len = data.len();
        let bytes = self.transfer(move |bus, mem| {
            let mut out = vec![0u8; len];
            mem.read(bus, at, &mut out)?;
            Ok(out)
        })?;
        data.copy_from_slice(&bytes);
        Ok(())
    }
    fn cpy_tensor(&self, src: &Tensor, dst: &Tensor) -> Result<bool> {
        // Fast path: both tensors in this device's memory, copied without leaving the device.
        let Some(src_storage) = src.storage() else {
            return Ok(false);
        };
        let Some((_keep, src_mem)) = TestBuffer::of(src_storage, &self.core) else {
            return Ok(false);
        };
        let (from, to, len) = (src_storage.offset, Self::at(dst, 0), src.nbytes());
        self.transfer(move |bus, mem| mem.copy_from(bus, to, &src_mem, from, len))?;
        Ok(true)
    }
    fn clear(&self, value: u8) -> Result<()> {
        let len = self.mem.size();
        self.transfer(move |bus, mem| mem.fill(bus, 0, len, value))
    }
    fn base_address(&self) -> u64 {
        self.address
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Memory accounting of a device.
impl Core {
    pub(crate) fn reserve(&self, size: usize) -> Result<()> {
        let total = self.config.memory;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size).filter(|&u| u <= total)
            })
            .map(|_| ())
            .map_err(|_| backend_core::BackendError::AllocationFailed {
                buffer_type: self.config.name.clone(),
                size,
            })
    }
    pub(crate) fn release(&self, size: usize) {
        self.used.fetch_sub(size, Ordering::AcqRel);
    }
    pub(crate) fn next_address(&self, size: usize) -> u64 {
        let align = self.config.alignment as u64;
        let step = (size as u64).div_ceil(align) * align;
        self.next_addr.fetch_add(step, Ordering::Relaxed)
    }
}
