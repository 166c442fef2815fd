//! Caller-owned host memory that a buffer can be placed over.
//!
//! Why this type exists: engines memory-map weight files and want tensors to point straight
//! into the mapping instead of copying gigabytes into a fresh allocation (ggml's
//! `buffer_from_host_ptr`). In C the caller promises to keep the memory alive and the buffer
//! promises not to free it; here both promises are types:
//!
//! * the [`HostMemory`] *owns* the caller's object (an `Mmap`, a `Vec<u8>`, a `Box<[u8]>`, …),
//!   so the bytes stay valid for as long as any clone of it — and therefore any buffer or
//!   tensor built over it — lives;
//! * nothing here ever frees the bytes itself: when the last clone goes, the *owner's* `Drop`
//!   runs, exactly once (unmapping the file, freeing the vector);
//! * whether the bytes may be written is decided when the memory is wrapped: read-only memory
//!   (a `PROT_READ` mapping) makes every write through a buffer fail with
//!   [`crate::BackendError::ReadOnly`] instead of faulting.
//!
//! The address is taken once, when the owner is wrapped, and the owner is never touched again
//! until it is dropped; that is what makes the pointer stable even for owners that keep their
//! bytes inline.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Host memory owned by someone else (a memory-mapped file, a `Vec`), shared with buffers.
///
/// Clones share the owner. The bytes are reachable through [`HostMemory::as_ptr`] for
/// [`HostMemory::len`] bytes while any clone lives; the owner is dropped (and frees its memory
/// its own way) after the last clone is gone. Backends read and, if [`HostMemory::is_writable`],
/// write the bytes; engines only wrap the memory and hand it to
/// [`crate::Device::buffer_from_host_memory`].
///
/// ```
/// use backend_core::HostMemory;
/// // Read-only: anything that exposes bytes by shared reference (e.g. `memmap2::Mmap`).
/// let weights = HostMemory::read_only(vec![1u8, 2, 3]);
/// assert_eq!(weights.len(), 3);
/// assert!(!weights.is_writable());
/// // Writable: anything that exposes bytes by mutable reference (e.g. `memmap2::MmapMut`).
/// let scratch = HostMemory::read_write(vec![0u8; 16]);
/// assert!(scratch.is_writable());
/// ```
#[derive(Clone)]
pub struct HostMemory(Arc<Inner>);

struct Inner {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

enum Owner {
    /// Read-only memory: only shared references to the owner ever existed.
    Shared(#[allow(dead_code)] Arc<dyn Any + Send + Sync>),
    /// Writable memory: the owner, boxed and leaked into a raw pointer at wrap time so that no
    /// later move or reference can invalidate the pointer taken from its `as_mut`; turned back
    /// into a box (and dropped) only in `Drop`.
    Exclusive(NonNull<dyn Send>),
}

// SAFETY: `Inner` is shared between threads in two ways. (1) The owner: a `Shared` owner is
// `Send + Sync` by construction; an `Exclusive` owner is `Send` and is never accessed through a
// shared reference at all — only moved into a box and dropped in `Drop`, which has exclusive
// access — so sending or sharing `Inner` never shares the owner. (2) The bytes behind `ptr`:
// for a `Shared` owner they were borrowed from `&T` with `T: Sync`, so reading them from any
// thread is what `&T: Send` allows; for an `Exclusive` owner they were borrowed from `&mut T`
// and are plain `u8`s. Writes through `ptr` are only allowed to backends under the ordering
// contract documented on `as_ptr`.
unsafe impl Send for Inner {}
// SAFETY: see the `Send` impl above; `&Inner` only gives out the pointer, length and flag.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Owner::Exclusive(raw) = self.owner {
            // SAFETY: `raw` came from `Box::into_raw` in `read_write`, and this is the only
            // place it is turned back into a box, once, when the last clone is dropped.
            drop(unsafe { Box::from_raw(raw.as_ptr()) });
        }
    }
}

impl HostMemory {
    /// Memory the backend may only read, e.g. a read-only `memmap2::Mmap` of a weights file,
    /// a `Vec<u8>`, a `&'static [u8]`. Writes through buffers over it are refused with
    /// [`crate::BackendError::ReadOnly`].
    pub fn read_only<T>(owner: T) -> Self
    where
        T: AsRef<[u8]> + Send + Sync + 'static,
    {
        let owner = Arc::new(owner);
        let bytes: &[u8] = (*owner).as_ref();
        let ptr = NonNull::from(bytes).cast::<u8>();
        let len = bytes.len();
        HostMemory(Arc::new(Inner {
            ptr,
            len,
            owner: Owner::Shared(owner),
        }))
    }

    /// Memory the backend may read and write, e.g. a `Vec<u8>`, a `Box<[u8]>`, a writable
    /// `memmap2::MmapMut`. The wrapper takes the owner: nobody else can reach the bytes except
    /// through buffers over this memory.
    pub fn read_write<T>(owner: T) -> Self
    where
        T: AsMut<[u8]> + Send + 'static,
    {
        let raw: *mut T = Box::into_raw(Box::new(owner));
        // SAFETY: `raw` comes from `Box::into_raw` just above, so it is valid and unique; the
        // mutable reference lives only for this statement.
        let bytes: &mut [u8] = unsafe { (*raw).as_mut() };
        let len = bytes.len();
        let ptr = NonNull::from(bytes).cast::<u8>();
        let erased: *mut dyn Send = raw;
        // SAFETY: `Box::into_raw` never returns null.
        let erased = unsafe { NonNull::new_unchecked(erased) };
        HostMemory(Arc::new(Inner {
            ptr,
            len,
            owner: Owner::Exclusive(erased),
        }))
    }

    /// The first byte. Valid for [`HostMemory::len`] bytes while this or any clone lives.
    ///
    /// Contract for whoever dereferences it (a backend's buffer code, always `unsafe`):
    /// never write unless [`HostMemory::is_writable`]; never create references that overlap
    /// a concurrent write. The checked helpers of this crate order accesses per buffer (see
    /// [`crate::Buffer::lock_write`]); raw users must hold those locks or order accesses
    /// themselves, as with a GPU API.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.0.ptr
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Whether the backend may write the bytes.
    pub fn is_writable(&self) -> bool {
        matches!(self.0.owner, Owner::Exclusive(_))
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("len", &self.len())
            .field("writable", &self.is_writable())
            .finish()
    }
}
