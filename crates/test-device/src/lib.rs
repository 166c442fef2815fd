//! A real, computing device backend that lives in-process: the model a third-party backend
//! crate can read, and the second device the scheduler's tests run on.
//!
//! What makes it a *device* and not a mock:
//! * **Its memory is not host memory.** [`TestBufferType::is_host`](backend_core::BufferTypeImpl::is_host)
//!   is false, buffers have no host pointer, and the bytes are reachable only through commands
//!   executed on the device's own threads (a copy engine for synchronous buffer operations, a
//!   worker per backend for queued work). Addresses it reports are a fake device address space.
//! * **Its backends are streams.** Each backend owns a worker thread; async set/copy and graph
//!   compute queue commands and return at once; `synchronize` waits for the queue. Errors
//!   raised by queued commands surface at the next `synchronize`.
//! * **Its events order work.** Recording queues a marker; `event_wait` makes the stream block
//!   when it reaches the wait until the marker fires; `Event::synchronize` blocks the caller.
//! * **It computes.** Nodes run with the CPU kernels, on the worker, over device memory.
//!
//! What makes it a *test* device: the supported ops, alignment, max buffer size and total
//! memory are configurable ([`TestDeviceConfig`]), and a latency can be added before each op
//! or transfer so that a missing synchronisation shows up as a wrong result instead of going
//! unnoticed. With one kernel thread (the default) results are bit-for-bit deterministic.
//!
//! ```
//! use backend_core::{tensor_alloc, tensor_get, tensor_set};
//! use graph::{Context, ElementType};
//! use test_device::{TestDevice, TestDeviceConfig};
//!
//! let device = TestDevice::create(TestDeviceConfig::named("GPU0").alignment(256))?;
//! let buffer = device.buffer_type().alloc_buffer(1 << 12)?;
//! assert!(buffer.host_ptr().is_none());
//! let mut ctx = Context::new();
//! let t = ctx.new_tensor_1d(ElementType::F32, 3)?;
//! tensor_alloc(&mut ctx, &buffer, t, 256)?;
//! tensor_set(&ctx, t, 0, &1.5f32.to_le_bytes().repeat(3))?;
//! let mut back = [0u8; 12];
//! tensor_get(&ctx, t, 0, &mut back)?;
//! assert_eq!(back, *1.5f32.to_le_bytes().repeat(3));
//! # Ok::<(), backend_core::BackendError>(())
//! ```

mod backend;
mod buffer;
mod compute;
mod config;
mod device;
mod event;
mod memory;
mod stream;

pub use backend::{StreamPause, TEST_GUID, TestBackend};
pub use buffer::{TestBuffer, TestBufferType};
pub use config::TestDeviceConfig;
pub use device::{TestDevice, TestRegistry, register};
pub use event::TestEvent;
