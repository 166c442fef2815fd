//! The only raw-memory code of this crate: turning a host buffer's base pointer into byte
//! slices for the host fast paths of [`crate::tensor_copy`]. Every function checks its range
//! against the buffer size first, so a bad offset is an error, never an out-of-bounds access.

use std::ptr::NonNull;

use crate::error::{BackendError, Result};

fn check(size: usize, offset: usize, len: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(BackendError::out_of_bounds(
            "host memory",
            offset,
            len,
            size,
        ));
    }
    Ok(())
}

/// `len` bytes at `offset` of host memory starting at `base` and `size` bytes long.
///
/// # Safety
/// `base` must be valid for reads of `size` bytes for `'a`, and nothing may write those bytes
/// during `'a` (the caller holds the buffer's read lock).
pub(crate) unsafe fn slice<'a>(
    base: NonNull<u8>,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<&'a [u8]> {
    check(size, offset, len)?;
    // SAFETY: `offset + len <= size` was checked, `base` is valid for `size` bytes and not
    // written during `'a` (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(base.as_ptr().add(offset), len) })
}

/// Mutable form of [`slice`].
///
/// # Safety
/// `base` must be valid for reads and writes of `size` bytes for `'a`, and nothing else may
/// access those bytes during `'a` (the caller holds the buffer's write lock).
pub(crate) unsafe fn slice_mut<'a>(
    base: NonNull<u8>,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<&'a mut [u8]> {
    check(size, offset, len)?;
    // SAFETY: as in `slice`, with exclusive access guaranteed by the caller.
    Ok(unsafe { std::slice::from_raw_parts_mut(base.as_ptr().add(offset), len) })
}

/// Copy `len` bytes from `src` to `dst` (offsets into the same host memory); the ranges may
/// overlap.
///
/// # Safety
/// `base` must be valid for reads and writes of `size` bytes, and nothing else may access them
/// during the call (the caller holds the buffer's write lock).
pub(crate) unsafe fn copy_within(
    base: NonNull<u8>,
    size: usize,
    src: usize,
    dst: usize,
    len: usize,
) -> Result<()> {
    check(size, src, len)?;
    check(size, dst, len)?;
    // SAFETY: both ranges were checked to lie inside the `size` valid bytes; `ptr::copy`
    // allows overlap; exclusivity is the caller's contract.
    unsafe { std::ptr::copy(base.as_ptr().add(src), base.as_ptr().add(dst), len) };
    Ok(())
}
