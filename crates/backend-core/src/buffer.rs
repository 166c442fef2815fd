//! Buffer types and buffers.
//!
//! A backend implements [`BufferTypeImpl`] and [`BufferImpl`]; engines and allocators use the
//! cheap-to-clone handles [`BufferType`] and [`Buffer`]. A buffer frees itself when the last
//! handle and the last tensor pointing into it are gone (tensors hold it through
//! [`graph::TensorStorage`]), so memory is released exactly once and never while in use.
//!
//! # Access ordering
//!
//! Buffers are shared (`Arc`) and written through `&self`, like GPU buffers. Two rules keep
//! that sound:
//!
//! * every access through this crate's checked helpers ([`crate::tensor_set`],
//!   [`crate::tensor_get`], [`crate::tensor_memset`], [`crate::tensor_copy`],
//!   [`Buffer::clear`]) takes the buffer's access lock — shared for reads, exclusive for
//!   writes — so safe code can never race on a buffer's bytes, whatever threads do;
//! * code that touches the bytes through [`Buffer::host_ptr`] (compute kernels, always
//!   `unsafe`) must either hold [`Buffer::lock_read`] / [`Buffer::lock_write`] for as long as it
//!   reads or writes, or otherwise guarantee that no overlapping access runs at the same time.
//!   That ordering is the scheduler's and the caller's job (with events across backends), as in
//!   every GPU API. Locks are taken in buffer-identity order when two are needed, so copies
//!   between two buffers in opposite directions cannot deadlock.
//!
//! An uncontended lock costs two atomic operations, a few nanoseconds next to the copy itself.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use graph::{StorageBuffer, Tensor};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::device::Device;
use crate::error::{BackendError, Result};

/// What a buffer holds (`ggml_backend_buffer_usage`). The scheduler treats `Weights` specially.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum BufferUsage {
    /// Anything.
    #[default]
    Any = 0,
    /// Model weights: ops using them prefer the weights' backend.
    Weights = 1,
    /// Compute (activations), as set by the graph allocator.
    Compute = 2,
}

impl BufferUsage {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => BufferUsage::Weights,
            2 => BufferUsage::Compute,
            _ => BufferUsage::Any,
        }
    }
}

/// What a backend implements for a kind of memory (`ggml_backend_buffer_type_i`).
///
/// Optional capabilities have defaults: unbounded max size, `nbytes` as the alloc size, not
/// host memory.
pub trait BufferTypeImpl: Send + Sync + 'static {
    /// The name, e.g. `"CPU"`.
    fn name(&self) -> &str;
    /// Allocate `size > 0` bytes (zero-size requests never reach the implementation).
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>>;
    /// Alignment of every allocation and of tensor offsets (a power of two).
    fn alignment(&self) -> usize;
    /// Largest buffer this type can allocate.
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// Bytes a tensor needs in this memory; at least `tensor.nbytes()`.
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        tensor.nbytes()
    }
    /// Whether the memory is directly addressable host memory.
    fn is_host(&self) -> bool {
        false
    }
    /// The device this memory belongs to, if any.
    fn device(&self) -> Option<Device> {
        None
    }
}

/// A handle to a buffer type. Equality is identity (two handles to the same object are equal),
/// as with ggml's pointers.
#[derive(Clone)]
pub struct BufferType(Arc<dyn BufferTypeImpl>);

impl BufferType {
    /// Wrap an implementation. Create it once and clone the handle: identity matters.
    pub fn new(imp: impl BufferTypeImpl) -> Self {
        BufferType(Arc::new(imp))
    }

    /// Wrap an already shared implementation.
    pub fn from_arc(imp: Arc<dyn BufferTypeImpl>) -> Self {
        BufferType(imp)
    }

    /// The implementation, for downcasting by the backend that made it.
    pub fn implementation(&self) -> &dyn BufferTypeImpl {
        &*self.0
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Allocate a buffer of `size` bytes; `size == 0` gives a valid empty buffer without
    /// asking the implementation.
    pub fn alloc_buffer(&self, size: usize) -> Result<Buffer> {
        if size == 0 {
            return Ok(Buffer::from_parts(self.clone(), None, 0));
        }
        let max = self.max_size();
        if size > max {
            return Err(BackendError::TooLarge {
                buffer_type: self.name().to_owned(),
                size,
                max,
            });
        }
        let imp = self.0.alloc_buffer(size)?;
        Ok(Buffer::from_parts(self.clone(), Some(imp), size))
    }

    /// Alignment.
    pub fn alignment(&self) -> usize {
        self.0.alignment()
    }

    /// Max buffer size.
    pub fn max_size(&self) -> usize {
        self.0.max_size()
    }

    /// Bytes `tensor` needs here, never less than its `nbytes`.
    #[inline]
    pub fn alloc_size(&self, tensor: &Tensor) -> usize {
        self.0.alloc_size(tensor).max(tensor.nbytes())
    }

    /// Whether this is host memory.
    pub fn is_host(&self) -> bool {
        self.0.is_host()
    }

    /// The device.
    pub fn device(&self) -> Option<Device> {
        self.0.device()
    }

    /// A stable identity for hashing and comparison.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }
}

impl PartialEq for BufferType {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for BufferType {}

impl std::hash::Hash for BufferType {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl fmt::Debug for BufferType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BufferType({})", self.name())
    }
}

/// What a backend implements for one allocation (`ggml_backend_buffer_i`).
///
/// Offsets passed in are relative to the start of the tensor (`tensor.storage().offset` is its
/// place in this buffer); the wrappers have already checked bounds.
pub trait BufferImpl: Send + Sync + 'static {
    /// Called when a tensor is placed in this buffer (also for views).
    fn init_tensor(&self, _tensor: &Tensor) -> Result<()> {
        Ok(())
    }
    /// Fill `size` bytes of `tensor` from `offset` with `value`.
    fn memset_tensor(&self, tensor: &Tensor, value: u8, offset: usize, size: usize) -> Result<()>;
    /// Write `data` into `tensor` at `offset`.
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> Result<()>;
    /// Read `data.len()` bytes of `tensor` from `offset`.
    fn get_tensor(&self, tensor: &Tensor, offset: usize, data: &mut [u8]) -> Result<()>;
    /// Copy `src` (same layout, any buffer) into `dst` (in this buffer) if this buffer can do
    /// it directly; `Ok(false)` asks the caller to stage the copy through host memory.
    fn cpy_tensor(&self, _src: &Tensor, _dst: &Tensor) -> Result<bool> {
        Ok(false)
    }
    /// Fill the whole buffer with `value`.
    fn clear(&self, value: u8) -> Result<()>;
    /// Forget per-tensor state before the allocator re-places tensors.
    fn reset(&self) {}
    /// Whether the memory may be written. Read-only memory (a read-only file mapping) answers
    /// `false`, and its `set`/`memset`/`clear`/`cpy_tensor` return
    /// [`BackendError::ReadOnly`]; the checked helpers also refuse to copy into it.
    fn is_writable(&self) -> bool {
        true
    }
    /// The base address for host memory (`None` for device memory). The pointer is valid for
    /// the buffer's size as long as the buffer lives; see the module docs for who may
    /// dereference it and when.
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        None
    }
    /// An opaque base address (device pointer, remote address) for diagnostics and wire
    /// protocols; host buffers return their pointer's value.
    fn base_address(&self) -> u64 {
        self.host_ptr().map_or(0, |p| p.as_ptr() as u64)
    }
    /// For downcasting by the backend that made it.
    fn as_any(&self) -> &dyn Any;
}

enum Contents {
    /// A size-0 buffer or a real allocation.
    Single(Option<Box<dyn BufferImpl>>),
    /// Several buffers presented as one (`ggml_backend_multi_buffer`).
    Multi(Vec<Buffer>),
}

/// The shared state behind a [`Buffer`] handle; tensors point at it through
/// [`graph::TensorStorage`].
pub struct BufferShared {
    contents: Contents,
    buft: BufferType,
    size: usize,
    usage: AtomicU8,
    access: RwLock<()>,
}

impl BufferShared {
    #[inline]
    pub(crate) fn implementation(&self) -> Option<&dyn BufferImpl> {
        match &self.contents {
            Contents::Single(Some(b)) => Some(&**b),
            _ => None,
        }
    }
    pub(crate) fn name(&self) -> &str {
        self.buft.name()
    }
    pub(crate) fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.implementation().and_then(|b| b.host_ptr())
    }
    pub(crate) fn is_writable(&self) -> bool {
        self.implementation().is_none_or(|b| b.is_writable())
    }
    pub(crate) fn read(&self) -> AccessGuard<'_> {
        AccessGuard(Guard::Read(self.access.read()))
    }
    pub(crate) fn write(&self) -> AccessGuard<'_> {
        AccessGuard(Guard::Write(self.access.write()))
    }
    pub(crate) fn storage_size_checked(&self) -> usize {
        self.size
    }
    pub(crate) fn identity(&self) -> usize {
        self as *const BufferShared as usize
    }
}

/// Holds a buffer's access lock (shared or exclusive) until dropped. See the module docs.
#[must_use = "the lock is released when the guard is dropped"]
pub struct AccessGuard<'a>(Guard<'a>);

#[allow(dead_code)] // the guards are held for their `Drop`, never read
enum Guard<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

impl fmt::Debug for AccessGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Guard::Read(_) => f.write_str("AccessGuard(read)"),
            Guard::Write(_) => f.write_str("AccessGuard(write)"),
        }
    }
}

impl fmt::Debug for BufferShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("type", &self.buft.name())
            .field("size", &self.size)
            .field(
                "usage",
                &BufferUsage::from_u8(self.usage.load(Ordering::Relaxed)),
            )
            .finish()
    }
}

impl StorageBuffer for BufferShared {
    fn storage_size(&self) -> usize {
        self.size
    }
}

/// A handle to an allocation (`ggml_backend_buffer_t`). Clones share the allocation; it is
/// freed once, when the last handle and the last tensor inside it are gone.
///
/// ```
/// # use backend_core::*;
/// # use std::any::Any;
/// # struct Nothing;
/// # impl BufferTypeImpl for Nothing {
/// #     fn name(&self) -> &str { "nothing" }
/// #     fn alloc_buffer(&self, _: usize) -> Result<Box<dyn BufferImpl>> { unreachable!() }
/// #     fn alignment(&self) -> usize { 32 }
/// # }
/// let buft = BufferType::new(Nothing);
/// let empty = buft.alloc_buffer(0)?; // never reaches the implementation
/// assert_eq!(empty.size(), 0);
/// empty.clear(0)?;                   // a no-op on an empty buffer
/// # Ok::<(), BackendError>(())
/// ```
#[derive(Clone)]
pub struct Buffer(Arc<BufferShared>);

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Buffer {}

impl Buffer {
    /// A buffer of type `buft` over `imp` (`ggml_backend_buffer_init`). Backends call this from
    /// functions like "buffer over host memory"; allocation normally goes through
    /// [`BufferType::alloc_buffer`].
    pub fn from_parts(buft: BufferType, imp: Option<Box<dyn BufferImpl>>, size: usize) -> Self {
        Buffer(Arc::new(BufferShared {
            contents: Contents::Single(imp),
            buft,
            size,
            usage: AtomicU8::new(BufferUsage::Any as u8),
            access: RwLock::new(()),
        }))
    }

    /// One buffer over several (`ggml_backend_multi_buffer_alloc_buffer`): its size is the sum,
    /// its type the first part's, `clear` and `set_usage` reach every part. Tensors live in the
    /// parts, never in the wrapper. Returns `None` for an empty list.
    pub fn multi(parts: Vec<Buffer>) -> Option<Self> {
        let buft = parts.first()?.buffer_type().clone();
        let size = parts.iter().map(Buffer::size).sum();
        Some(Buffer(Arc::new(BufferShared {
            contents: Contents::Multi(parts),
            buft,
            size,
            usage: AtomicU8::new(BufferUsage::Any as u8),
            access: RwLock::new(()),
        })))
    }

    /// Whether this is a multi-buffer.
    #[inline]
    pub fn is_multi(&self) -> bool {
        matches!(self.0.contents, Contents::Multi(_))
    }

    /// The parts of a multi-buffer (empty for a plain buffer).
    pub fn parts(&self) -> &[Buffer] {
        match &self.0.contents {
            Contents::Multi(p) => p,
            Contents::Single(_) => &[],
        }
    }

    /// The implementation (`None` for size-0 and multi buffers).
    #[inline]
    pub fn implementation(&self) -> Option<&dyn BufferImpl> {
        self.0.implementation()
    }

    /// Whether the memory may be written (`false` for read-only host memory such as a
    /// read-only file mapping; `true` for size-0 and multi buffers).
    pub fn is_writable(&self) -> bool {
        self.0.is_writable() && self.parts().iter().all(Buffer::is_writable)
    }

    /// Take this buffer's access lock shared, for reading its bytes through
    /// [`Buffer::host_ptr`]. Do not call the checked helpers on this buffer while holding it
    /// for writing, they would wait for it.
    pub fn lock_read(&self) -> AccessGuard<'_> {
        self.0.read()
    }

    /// Take this buffer's access lock exclusively, for writing its bytes through
    /// [`Buffer::host_ptr`]. When locking several buffers, lock them in [`Buffer::id`] order.
    pub fn lock_write(&self) -> AccessGuard<'_> {
        self.0.write()
    }

    /// A stable identity (the address of the shared state), for ordering locks and hashing.
    pub fn id(&self) -> usize {
        self.0.identity()
    }

    /// The buffer type.
    pub fn buffer_type(&self) -> &BufferType {
        &self.0.buft
    }

    /// The buffer type's name.
    pub fn name(&self) -> &str {
        self.0.buft.name()
    }

    /// Size in bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.0.size
    }

    /// Alignment of the buffer type.
    pub fn alignment(&self) -> usize {
        self.0.buft.alignment()
    }

    /// Whether this is host memory.
    pub fn is_host(&self) -> bool {
        self.0.buft.is_host()
    }

    /// Host base pointer (`None` for size 0, multi and device buffers).
    pub fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.implementation().and_then(|b| b.host_ptr())
    }

    /// Opaque base address (0 for size-0 and multi buffers).
    pub fn base_address(&self) -> u64 {
        self.implementation().map_or(0, |b| b.base_address())
    }

    /// Current usage.
    pub fn usage(&self) -> BufferUsage {
        BufferUsage::from_u8(self.0.usage.load(Ordering::Relaxed))
    }

    /// Set the usage; a multi-buffer passes it on to its parts.
    pub fn set_usage(&self, usage: BufferUsage) {
        self.0.usage.store(usage as u8, Ordering::Relaxed);
        for p in self.parts() {
            p.set_usage(usage);
        }
    }

    /// Fill the whole buffer (every part of a multi-buffer); a no-op for size 0.
    pub fn clear(&self, value: u8) -> Result<()> {
        match &self.0.contents {
            Contents::Single(Some(b)) => {
                if !b.is_writable() {
                    return Err(BackendError::read_only(self.name()));
                }
                let _guard = self.0.write();
                b.clear(value)
            }
            Contents::Single(None) => Ok(()),
            Contents::Multi(parts) => {
                // Refuse before touching any part, so a failure leaves every part intact.
                if let Some(ro) = parts.iter().find(|p| !p.is_writable()) {
                    return Err(BackendError::read_only(ro.name()));
                }
                parts.iter().try_for_each(|p| p.clear(value))
            }
        }
    }

    /// Let the implementation forget per-tensor state (`ggml_backend_buffer_reset`).
    pub fn reset(&self) {
        if let Some(b) = self.implementation() {
            b.reset();
        }
    }

    /// This buffer as a tensor storage reference at `offset`.
    #[inline]
    pub fn storage_at(&self, offset: usize) -> graph::TensorStorage {
        graph::TensorStorage {
            buffer: self.0.clone(),
            offset,
        }
    }

    /// The buffer a tensor's storage refers to, if it is one of ours.
    pub fn from_storage(storage: &graph::TensorStorage) -> Option<Buffer> {
        let any: Arc<dyn Any + Send + Sync> = storage.buffer.clone();
        any.downcast::<BufferShared>().ok().map(Buffer)
    }

    /// Whether `storage` points into this buffer.
    pub fn holds(&self, storage: &graph::TensorStorage) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&storage.buffer), Arc::as_ptr(&self.0))
    }
}

pub(crate) fn shared_of(storage: &graph::TensorStorage) -> Option<&BufferShared> {
    let any: &dyn Any = &*storage.buffer;
    any.downcast_ref::<BufferShared>()
}

/// The usage of the buffer behind `storage`, without cloning a handle (the scheduler asks
/// this for every tensor).
pub fn storage_usage(storage: &graph::TensorStorage) -> Option<BufferUsage> {
    shared_of(storage).map(|s| BufferUsage::from_u8(s.usage.load(Ordering::Relaxed)))
}

/// Whether the buffer behind `storage` may be written (`None` if it is not one of ours).
/// Kernels that write through raw host pointers ask this before computing into a tensor.
pub fn storage_is_writable(storage: &graph::TensorStorage) -> Option<bool> {
    shared_of(storage).map(BufferShared::is_writable)
}

/// The buffer type of the buffer behind `storage`, without cloning a handle.
pub fn storage_buffer_type(storage: &graph::TensorStorage) -> Option<&BufferType> {
    shared_of(storage).map(|s| &s.buft)
}
