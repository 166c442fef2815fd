//! The backend: one stream of work on a test device.

use std::any::Any;
use std::sync::Arc;

use backend_core::{
    Backend, BackendError, BackendImpl, Buffer, ComputeStatus, Device, Event, Guid, Result,
};
use graph::{Context, GraphView, Op, Tensor, TensorId};

use crate::buffer::TestBuffer;
use crate::device::Core;
use crate::event::{EventState, TestEvent};
use crate::stream::Stream;

/// The test device's backend kind id.
pub const TEST_GUID: Guid = *b"rs-test-device\0\0";

/// A stream on a test device (`backend_core::BackendImpl`). Every operation queues a command
/// on the stream's worker thread and returns; [`BackendImpl::synchronize`] waits for them.
///
/// Create it through the device: `device.init_backend("")`.
///
/// ```
/// use backend_core::{tensor_alloc, tensor_get};
/// use graph::{Context, ElementType};
/// use test_device::{TestDevice, TestDeviceConfig};
/// let dev = TestDevice::create(TestDeviceConfig::default())?;
/// let backend = dev.init_backend("")?;
/// let mut ctx = Context::new();
/// let t = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// let buf = backend.alloc_buffer(1024)?;
/// tensor_alloc(&mut ctx, &buf, t, 0)?;
/// backend.tensor_set_async(&ctx, t, 0, &[7u8; 16])?; // queued; bytes captured already
/// backend.synchronize()?;                           // now written
/// let mut out = [0u8; 16];
/// tensor_get(&ctx, t, 0, &mut out)?;
/// assert_eq!(out, [7u8; 16]);
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub struct TestBackend {
    device: Device,
    core: Arc<Core>,
    stream: Stream,
    /// The kernels this stream computes with (their pool and scratch are the stream's own).
    kernels: Arc<cpu_kernels::CpuCompute>,
}

impl TestBackend {
    pub(crate) fn new(device: Device, core: Arc<Core>) -> Result<Self> {
        let stream = Stream::new(&format!("{}-stream", core.config.name))?;
        let kernels = Arc::new(cpu_kernels::CpuCompute::new(core.config.compute_threads));
        Ok(TestBackend {
            device,
            core,
            stream,
            kernels,
        })
    }

    /// Queue a command that holds the stream until the returned [`StreamPause`] is released
    /// (or dropped): everything queued after it waits. Tests use it to prove that operations
    /// are really asynchronous and that events really order work, without timing anything.
    ///
    /// ```
    /// use test_device::{TestBackend, TestDevice, TestDeviceConfig};
    /// let dev = TestDevice::create(TestDeviceConfig::default())?;
    /// let backend = dev.init_backend("")?;
    /// let tb = backend.implementation().as_any().downcast_ref::<TestBackend>().unwrap();
    /// let pause = tb.pause()?;
    /// // ... queue work; it cannot have run yet ...
    /// pause.release();
    /// backend.synchronize()?;
    /// # Ok::<(), backend_core::BackendError>(())
    /// ```
    pub fn pause(&self) -> Result<StreamPause> {
        let gate = Arc::new(EventState::default());
        let target = gate.arm();
        let g = gate.clone();
        self.stream.submit(Box::new(move || {
            g.wait_for(target);
            Ok(())
        }))?;
        Ok(StreamPause {
            gate,
            target,
            released: false,
        })
    }

    /// `tensor`'s place in this device's memory, if that is where it lives.
    fn ours(&self, tensor: &Tensor) -> Option<(Buffer, Arc<crate::memory::DeviceAlloc>, usize)> {
        let st = tensor.storage()?;
        let (buf, mem) = TestBuffer::of(st, &self.core)?;
        Some((buf, mem, st.offset))
    }

    /// Queue a transfer: sleep the configured latency, take the bus, run `f`.
    fn queue_transfer(
        &self,
        f: impl FnOnce(&crate::memory::BusGuard<'_>) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let bus = self.core.bus.clone();
        let latency = self.core.config.transfer_latency;
        self.stream
            .submit(Box::new(move || {
                if !latency.is_zero() {
                    std::thread::sleep(latency);
                }
                f(&bus.lock())
            }))
            .map(|_| ())
    }
}

impl BackendImpl for TestBackend {
    fn name(&self) -> &str {
        &self.core.config.name
    }
    fn guid(&self) -> Guid {
        TEST_GUID
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
        let Some((_buf, mem, at)) = self.ours(&ctx[tensor]) else {
            // Not our memory: the synchronous path of whoever owns it.
            return backend_core::tensor_set(ctx, tensor, offset, data);
        };
        let bytes = data.to_vec(); // captured now, as the contract requires
        self.queue_transfer(move |bus| mem.write(bus, at + offset, &bytes))
    }

    fn get_tensor_async(
        &self,
        ctx: &Context,
        tensor: TensorId,
        offset: usize,
        data: &mut [u8],
    ) -> Result<()> {
        let Some((_buf, mem, at)) = self.ours(&ctx[tensor]) else {
            return backend_core::tensor_get(ctx, tensor, offset, data);
        };
        let (bus, latency, len) = (
            self.core.bus.clone(),
            self.core.config.transfer_latency,
            data.len(),
        );
        // `data` is borrowed for this call only, so the read completes before returning, after
        // everything queued before it.
        let bytes = self.stream.run(move || {
            if !latency.is_zero() {
                std::thread::sleep(latency);
            }
            let mut out = vec![0u8; len];
            mem.read(&bus.lock(), at + offset, &mut out)?;
            Ok(out)
        })?;
        data.copy_from_slice(&bytes);
        Ok(())
    }

    fn cpy_tensor_async(&self, src_backend: &Backend, src: &Tensor, dst: &Tensor) -> Result<bool> {
        let Some((_dst_buf, dst_mem, dst_at)) = self.ours(dst) else {
            return Ok(false);
        };
        let Some(src_storage) = src.storage().cloned() else {
            return Ok(false);
        };
        let len = src.nbytes();
        if let Some((_src_buf, src_mem, src_at)) = self.ours(src) {
            // Device to device on this device: order after the source stream's queued work.
            if let Some(other) = src_backend
                .implementation()
                .as_any()
                .downcast_ref::<TestBackend>()
                && !std::ptr::eq(other, self)
            {
                let ev = Arc::new(EventState::default());
                ev.record(&other.stream)?;
                ev.enqueue_wait(&self.stream)?;
            } else if src_backend
                .implementation()
                .as_any()
                .downcast_ref::<TestBackend>()
                .is_none()
            {
                return Ok(false);
            }
            self.queue_transfer(move |bus| dst_mem.copy_from(bus, dst_at, &src_mem, src_at, len))?;
            return Ok(true);
        }
        let Some(src_buf) = Buffer::from_storage(&src_storage) else {
            return Ok(false);
        };
        if src_buf.host_ptr().is_none() {
            // Another device's memory: let the caller stage it through the host.
            return Ok(false);
        }
        // Host to device: the source backend must have finished writing it. The bytes are read
        // now, not later on our worker: the host memory belongs to another backend, which may
        // reuse it for its next work as soon as this call returns (the scheduler's next split
        // on the CPU overwrote a freed source before a deferred read ran: wrong results, and a
        // data race). CUDA stages pageable host memory the same way.
        src_backend.synchronize()?;
        let base = src_buf.host_ptr().ok_or_else(|| {
            BackendError::failed("test device", "host source buffer lost its memory")
        })?;
        if src_storage
            .offset
            .checked_add(len)
            .is_none_or(|end| end > src_buf.size())
        {
            return Err(BackendError::out_of_bounds(
                "test device copy",
                src_storage.offset,
                len,
                src_buf.size(),
            ));
        }
        // SAFETY: `src_buf` is host memory of `src_buf.size()` bytes kept alive by the handle
        // we hold, the range lies inside it (checked above), and its backend has finished
        // writing it (synchronized above).
        let staged =
            unsafe { std::slice::from_raw_parts(base.as_ptr().add(src_storage.offset), len) }
                .to_vec();
        self.queue_transfer(move |bus| {
            let mut staged = staged;
            let from = std::ptr::NonNull::new(staged.as_mut_ptr())
                .ok_or_else(|| BackendError::failed("test device", "null staging pointer"))?;
            // SAFETY: `staged` is our own vector of `len` bytes, alive for the call.
            unsafe { dst_mem.write_from_host(bus, dst_at, from, len) }
        })?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus> {
        for &id in graph.nodes {
            let t = ctx.get(id)?;
            if !self.device.supports_op(ctx, id) {
                return Err(BackendError::UnsupportedOp {
                    backend: self.name().to_owned(),
                    op: t.op().name(),
                    tensor: id,
                });
            }
        }
        // The borrow of `ctx` ends when we return, so the job owns a snapshot: tensor metadata
        // clones whose storage handles keep every buffer alive until the job has run.
        let snapshot = Arc::new(ctx.clone());
        let nodes: Vec<TensorId> = graph.nodes.to_vec();
        let core = self.core.clone();
        let kernels = self.kernels.clone();
        self.stream.submit(Box::new(move || {
            crate::compute::run_nodes(&core, &kernels, &snapshot, &nodes)
        }))?;
        Ok(ComputeStatus::Success)
    }

    fn event_record(&self, event: &Event) -> Result<()> {
        let ev = test_event(event, self.name())?;
        ev.state.record(&self.stream)
    }

    fn event_wait(&self, event: &Event) -> Result<()> {
        let ev = test_event(event, self.name())?;
        ev.state.enqueue_wait(&self.stream)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A hold on a stream made by [`TestBackend::pause`]; releasing or dropping it lets the stream
/// go on.
pub struct StreamPause {
    gate: Arc<EventState>,
    target: u64,
    released: bool,
}

impl StreamPause {
    /// Let the stream continue.
    pub fn release(mut self) {
        self.open();
    }
    fn open(&mut self) {
        if !self.released {
            self.released = true;
            self.gate.fire(self.target);
        }
    }
}

impl Drop for StreamPause {
    fn drop(&mut self) {
        self.open();
    }
}

fn test_event<'a>(event: &'a Event, backend: &str) -> Result<&'a TestEvent> {
    event
        .implementation()
        .as_any()
        .downcast_ref::<TestEvent>()
        .ok_or_else(|| BackendError::unsupported(backend, "events of other backend families"))
}

/// Whether a node computes nothing (leafs and views).
pub(crate) fn is_noop(op: Op) -> bool {
    op == Op::None || op.is_view_op()
}
