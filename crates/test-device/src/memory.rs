//! Device memory: allocations the host never addresses directly.
//!
//! Why this shape: a real accelerator's memory can only be reached through commands (copy
//! engine transfers, kernels) that run on the device. We model that with raw allocations whose
//! pointers never leave this crate except into the CPU kernels running *on the device's worker
//! threads*, and with one lock per device, the [`Bus`], that every access holds. The bus makes
//! concurrent commands from several streams of one device well defined (they serialise per
//! command, as on a real memory bus) while still letting a missing `synchronize` or event show
//! up as wrong results instead of undefined behaviour inside the device.

use std::alloc::Layout;
use std::ptr::NonNull;

use backend_core::{BackendError, Result};
use parking_lot::{Mutex, MutexGuard};

/// The per-device lock every memory access holds. A [`BusGuard`] is the proof of holding it
/// that each [`DeviceAlloc`] accessor asks for.
#[derive(Debug, Default)]
pub(crate) struct Bus(Mutex<()>);

/// Proof that the caller holds its device's [`Bus`].
pub(crate) struct BusGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

impl Bus {
    /// Take the bus for one command.
    pub(crate) fn lock(&self) -> BusGuard<'_> {
        BusGuard(self.0.lock())
    }
}

/// One allocation of device memory: `size` bytes aligned to the buffer type's alignment.
///
/// Only code holding the device's bus touches the bytes (every accessor takes a [`BusGuard`]),
/// and only on a device worker thread (the callers in this crate guarantee that by running all
/// accesses as stream or copy-engine commands).
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is plain bytes owned by this value; every access goes through methods
// that require the device bus to be held, so sharing the handle between threads cannot produce
// unsynchronised access through it.
unsafe impl Send for DeviceAlloc {}
// SAFETY: as above: `&DeviceAlloc` only offers bus-guarded access.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// Allocate `size > 0` zeroed bytes aligned to `align` (a power of two).
    pub(crate) fn new(name: &str, size: usize, align: usize) -> Result<Self> {
        let layout =
            Layout::from_size_align(size, align).map_err(|_| BackendError::AllocationFailed {
                buffer_type: name.to_owned(),
                size,
            })?;
        debug_assert!(size > 0, "zero-size buffers never reach the implementation");
        // SAFETY: `layout` has a non-zero size (the BufferType wrapper answers size 0 itself).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| BackendError::AllocationFailed {
            buffer_type: name.to_owned(),
            size,
        })?;
        Ok(DeviceAlloc { ptr, layout })
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.layout.size()
    }

    fn check(&self, offset: usize, len: usize, what: &'static str) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Err(BackendError::out_of_bounds(what, offset, len, self.size()));
        }
        Ok(())
    }

    /// Copy `data` to `offset`.
    pub(crate) fn write(&self, _bus: &BusGuard<'_>, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len(), "device write")?;
        // SAFETY: the range is inside the allocation (checked above); the bus guard excludes
        // every other access to device memory of this device; `data` is host memory that
        // cannot overlap the device allocation, which is never handed out as a slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copy `data.len()` bytes from `offset` into `data`.
    pub(crate) fn read(&self, _bus: &BusGuard<'_>, offset: usize, data: &mut [u8]) -> Result<()> {
        self.check(offset, data.len(), "device read")?;
        // SAFETY: as in `write`, with the roles of the two ranges swapped.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                data.as_mut_ptr(),
                data.len(),
            )
        };
        Ok(())
    }

    /// Fill `len` bytes from `offset` with `value`.
    pub(crate) fn fill(
        &self,
        _bus: &BusGuard<'_>,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        self.check(offset, len, "device fill")?;
        // SAFETY: the range is inside the allocation and the bus guard excludes other access.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), value, len) };
        Ok(())
    }

    /// Copy `len` bytes from `src` at `src_off` to `self` at `dst_off` (the ranges may be in
    /// the same allocation and may overlap).
    pub(crate) fn copy_from(
        &self,
        _bus: &BusGuard<'_>,
        dst_off: usize,
        src: &DeviceAlloc,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        self.check(dst_off, len, "device copy (destination)")?;
        src.check(src_off, len, "device copy (source)")?;
        // SAFETY: both ranges lie inside their allocations (checked above), the bus guard
        // excludes every other access to this device's memory, and `copy` allows overlap.
        unsafe {
            std::ptr::copy(
                src.ptr.as_ptr().add(src_off),
                self.ptr.as_ptr().add(dst_off),
                len,
            )
        };
        Ok(())
    }

    /// The base pointer, for the CPU kernels running on this device's worker while the
    /// caller holds the bus (the guard's lifetime bounds the use).
    pub(crate) fn base_ptr(&self, _bus: &BusGuard<'_>) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed only here, once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
