//! [`FakeBufferType`]: a buffer type whose buffers hold no bytes (set/get are no-ops), with a
//! configurable alignment, maximum size, extra per-tensor padding and a refusal threshold,
//! plus shared [`FakeMemoryStats`] counting live buffers and bytes.
//!
//! Why: allocator and scheduler tests place multi-gigabyte models, inject allocation failures
//! and check that nothing leaks; none of that needs real memory, so a 4 GB model "fits"
//! without using RAM.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{BufferImpl, BufferType, BufferTypeImpl};
use graph::Tensor;

/// Counters shared by a [`FakeBufferType`] and every buffer it made.
#[derive(Debug)]
pub struct FakeMemoryStats {
    live_bytes: AtomicUsize,
    live_buffers: AtomicUsize,
    allocs: AtomicUsize,
    refusals: AtomicUsize,
    limit: AtomicUsize,
}

impl FakeMemoryStats {
    /// Bytes in buffers not yet freed.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::SeqCst)
    }
    /// Buffers not yet freed.
    pub fn live_buffers(&self) -> usize {
        self.live_buffers.load(Ordering::SeqCst)
    }
    /// Successful allocations so far.
    pub fn allocs(&self) -> usize {
        self.allocs.load(Ordering::SeqCst)
    }
    /// Refused allocations so far.
    pub fn refusals(&self) -> usize {
        self.refusals.load(Ordering::SeqCst)
    }
    /// Refuse every later allocation larger than `bytes`.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::SeqCst);
    }
}

/// A buffer type whose buffers hold no memory (see the module docs).
///
/// ```
/// use backend_core::BackendError;
/// use test_fixtures::FakeBufferType;
/// let fake = FakeBufferType::new("fake", 64).with_limit(1000);
/// let stats = fake.stats();
/// let buft = fake.into_buffer_type();
/// let b = buft.alloc_buffer(1000)?;
/// let refused = buft.alloc_buffer(1001);
/// assert!(
///     matches!(refused, Err(BackendError::AllocationFailed { size: 1001, .. })),
///     "{refused:?}"
/// );
/// assert_eq!((stats.live_bytes(), stats.refusals()), (1000, 1));
/// drop(b);
/// assert_eq!(stats.live_buffers(), 0);
/// # Ok::<(), backend_core::BackendError>(())
/// ```
#[derive(Debug)]
pub struct FakeBufferType {
    name: String,
    alignment: usize,
    max_size: usize,
    extra: usize,
    stats: Arc<FakeMemoryStats>,
}

impl FakeBufferType {
    /// A fake buffer type with this name and alignment, unbounded.
    pub fn new(name: &str, alignment: usize) -> Self {
        FakeBufferType {
            name: name.to_owned(),
            alignment,
            max_size: usize::MAX,
            extra: 0,
            stats: Arc::new(FakeMemoryStats {
                live_bytes: AtomicUsize::new(0),
                live_buffers: AtomicUsize::new(0),
                allocs: AtomicUsize::new(0),
                refusals: AtomicUsize::new(0),
                limit: AtomicUsize::new(usize::MAX),
            }),
        }
    }
    /// Report `max` as the maximum buffer size.
    pub fn with_max_size(mut self, max: usize) -> Self {
        self.max_size = max;
        self
    }
    /// Let every tensor need `extra` bytes beyond its `nbytes` (like a backend padding rows).
    pub fn with_extra_alloc_size(mut self, extra: usize) -> Self {
        self.extra = extra;
        self
    }
    /// Refuse allocations larger than `bytes` (changeable later through the stats).
    pub fn with_limit(self, bytes: usize) -> Self {
        self.stats.set_limit(bytes);
        self
    }
    /// The shared counters.
    pub fn stats(&self) -> Arc<FakeMemoryStats> {
        self.stats.clone()
    }
    /// Wrap it in a handle.
    pub fn into_buffer_type(self) -> BufferType {
        BufferType::new(self)
    }
}

impl BufferTypeImpl for FakeBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc_buffer(&self, size: usize) -> backend_core::Result<Box<dyn BufferImpl>> {
        if size > self.stats.limit.load(Ordering::SeqCst) {
            self.stats.refusals.fetch_add(1, Ordering::SeqCst);
            return Err(backend_core::BackendError::AllocationFailed {
                buffer_type: self.name.clone(),
                size,
            });
        }
        self.stats.allocs.fetch_add(1, Ordering::SeqCst);
        self.stats.live_buffers.fetch_add(1, Ordering::SeqCst);
        self.stats.live_bytes.fetch_add(size, Ordering::SeqCst);
        Ok(Box::new(FakeBuffer {
            size,
            stats: self.stats.clone(),
        }))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        tensor.nbytes() + self.extra
    }
}

struct FakeBuffer {
    size: usize,
    stats: Arc<FakeMemoryStats>,
}

impl Drop for FakeBuffer {
    fn drop(&mut self) {
        self.stats.live_buffers.fetch_sub(1, Ordering::SeqCst);
        self.stats.live_bytes.fetch_sub(self.size, Ordering::SeqCst);
    }
}

impl BufferImpl for FakeBuffer {
    fn memset_tensor(&self, _: &Tensor, _: u8, _: usize, _: usize) -> backend_core::Result<()> {
        Ok(())
    }
    fn set_tensor(&self, _: &Tensor, _: usize, _: &[u8]) -> backend_core::Result<()> {
        Ok(())
    }
    fn get_tensor(&self, _: &Tensor, _: usize, data: &mut [u8]) -> backend_core::Result<()> {
        data.fill(0);
        Ok(())
    }
    fn clear(&self, _: u8) -> backend_core::Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
