//! All of this crate's `unsafe`: the aligned allocation and raw reads/writes of host memory.
//!
//! [`Region`] is a base pointer and a length; every operation checks its range against the
//! length first and returns [`BackendError::OutOfBounds`] instead of touching memory outside
//! it. Callers (the buffer code) add the ordering guarantee: they run under the buffer's
//! access lock taken by `backend-core`'s checked helpers, or under the caller's ordering
//! contract for raw users (see `backend_core::Buffer`).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use backend_core::{BackendError, Result};

/// Alignment of every CPU allocation, in bytes. See the crate docs for why 64.
pub const ALIGNMENT: usize = 64;

/// A host memory range that this crate reads and writes through raw pointers.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Region` is an address and a length; accesses through it are bounds-checked, and
// their ordering across threads is the buffer's contract (access locks / caller ordering).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// # Safety
    /// `ptr` must be valid for reads (and, if the region is ever written, writes) of `len`
    /// bytes for as long as the region is used.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Region { ptr, len }
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, what: &'static str, offset: usize, size: usize) -> Result<()> {
        if offset.checked_add(size).is_none_or(|end| end > self.len) {
            return Err(BackendError::out_of_bounds(what, offset, size, self.len));
        }
        Ok(())
    }

    /// Copy `data` to `offset`.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check("cpu write", offset, data.len())?;
        // SAFETY: the range is inside the region (checked); `data` is a separate borrow that
        // cannot overlap memory we are allowed to write under the buffer's exclusive access.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copy from `offset` into `out`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check("cpu read", offset, out.len())?;
        // SAFETY: the range is inside the region (checked); `out` is an exclusive borrow, so
        // it does not overlap bytes anyone may be writing.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Fill `size` bytes from `offset` with `value`.
    pub(crate) fn fill(&self, offset: usize, size: usize, value: u8) -> Result<()> {
        self.check("cpu memset", offset, size)?;
        // SAFETY: the range is inside the region (checked).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), value, size) };
        Ok(())
    }

    /// Copy `size` bytes from `src` at `src_offset` to `dst_offset` of this region. The
    /// ranges may overlap (same buffer).
    pub(crate) fn copy_from(
        &self,
        dst_offset: usize,
        src: &Region,
        src_offset: usize,
        size: usize,
    ) -> Result<()> {
        self.check("cpu copy destination", dst_offset, size)?;
        src.check("cpu copy source", src_offset, size)?;
        // SAFETY: both ranges are inside their regions (checked); `ptr::copy` allows overlap.
        unsafe {
            std::ptr::copy(
                src.ptr.as_ptr().add(src_offset),
                self.ptr.as_ptr().add(dst_offset),
                size,
            )
        };
        Ok(())
    }
}

/// An owned, zero-initialised, [`ALIGNMENT`]-aligned heap allocation of at least one byte.
///
/// Zeroed because reading uninitialised bytes out through `get` would be undefined behaviour
/// in Rust; `alloc_zeroed` of a large block is served by fresh zero pages from the OS, so it
/// costs nothing up front.
pub(crate) struct AlignedAlloc {
    region: Region,
    layout: Layout,
}

impl AlignedAlloc {
    /// Allocate `size > 0` bytes; `None` if the size is too large or memory is exhausted.
    pub(crate) fn new(size: usize) -> Option<Self> {
        debug_assert!(size > 0);
        let layout = Layout::from_size_align(size, ALIGNMENT).ok()?;
        // SAFETY: `layout` has a non-zero size (callers never ask for 0: backend-core answers
        // size-0 requests itself).
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        // SAFETY: `ptr` is a fresh allocation of `size` bytes, freed only in `Drop`.
        let region = unsafe { Region::new(ptr, size) };
        Some(AlignedAlloc { region, layout })
    }

    pub(crate) fn region(&self) -> Region {
        self.region
    }
}

impl Drop for AlignedAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once, here.
        unsafe { dealloc(self.region.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_zeroed_and_bounds_checked() {
        for size in [1, 63, 64, 65, 4096] {
            let a = AlignedAlloc::new(size).unwrap();
            let r = a.region();
            assert_eq!(r.ptr().as_ptr() as usize % ALIGNMENT, 0);
            let mut out = vec![1u8; size];
            r.read(0, &mut out).unwrap();
            assert!(out.iter().all(|&b| b == 0));
            assert_eq!(
                r.read(1, &mut out),
                Err(BackendError::out_of_bounds("cpu read", 1, size, size))
            );
            assert_eq!(
                r.write(size, &[1]),
                Err(BackendError::out_of_bounds("cpu write", size, 1, size))
            );
            assert_eq!(
                r.fill(usize::MAX, 2, 0),
                Err(BackendError::out_of_bounds(
                    "cpu memset",
                    usize::MAX,
                    2,
                    size
                ))
            );
            r.fill(size - 1, 1, 0xAB).unwrap();
            r.read(size - 1, &mut out[..1]).unwrap();
            assert_eq!(out[0], 0xAB);
        }
        assert!(AlignedAlloc::new(usize::MAX - 10).is_none());
    }

    #[test]
    fn overlapping_copy_within_one_region() {
        let a = AlignedAlloc::new(8).unwrap();
        let r = a.region();
        r.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        r.copy_from(2, &r, 0, 4).unwrap();
        let mut out = [0u8; 8];
        r.read(0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 1, 2, 3, 4, 7, 8]);
        assert_eq!(
            r.copy_from(5, &r, 0, 4),
            Err(BackendError::out_of_bounds("cpu copy destination", 5, 4, 8))
        );
    }
}
