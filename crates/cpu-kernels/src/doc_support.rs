//! A minimal host buffer type for this crate's doc examples and tests (the real one lives in
//! `backend-cpu`, which depends on this crate). Not part of the supported API.

use std::any::Any;
use std::ptr::NonNull;

use backend_core::{BackendError, Buffer, BufferImpl, BufferType, BufferTypeImpl};
use graph::Tensor;

/// A buffer type over `Vec<u64>` (8-byte aligned, with 32-byte aligned offsets requested).
#[derive(Debug, Default)]
pub struct VecBufferType;

struct VecBuffer {
    _mem: Vec<u64>,
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: `ptr` points into `mem`'s heap allocation, which never moves or reallocates (the
// vector is never touched again); access goes through the pointer under the compute's rules.
unsafe impl Send for VecBuffer {}
// SAFETY: as above.
unsafe impl Sync for VecBuffer {}

impl VecBuffer {
    fn bytes(&self, off: usize, len: usize) -> Result<*mut u8, BackendError> {
        if off.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(BackendError::out_of_bounds(
                "vec buffer",
                off,
                len,
                self.size,
            ));
        }
        // SAFETY: off + len <= size, the allocation's byte length.
        Ok(unsafe { self.ptr.as_ptr().add(off) })
    }
    fn tensor_off(t: &Tensor) -> usize {
        t.storage().map_or(0, |s| s.offset)
    }
}

impl BufferImpl for VecBuffer {
    fn memset_tensor(
        &self,
        t: &Tensor,
        value: u8,
        offset: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        let p = self.bytes(Self::tensor_off(t) + offset, size)?;
        // SAFETY: `size` bytes from `p` are inside the allocation (checked by `bytes`).
        unsafe { std::ptr::write_bytes(p, value, size) };
        Ok(())
    }
    fn set_tensor(&self, t: &Tensor, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let p = self.bytes(Self::tensor_off(t) + offset, data.len())?;
        // SAFETY: the range is inside the allocation; `data` is caller memory, not ours.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }
    fn get_tensor(&self, t: &Tensor, offset: usize, data: &mut [u8]) -> Result<(), BackendError> {
        let p = self.bytes(Self::tensor_off(t) + offset, data.len())?;
        // SAFETY: as above, reading.
        unsafe { std::ptr::copy_nonoverlapping(p, data.as_mut_ptr(), data.len()) };
        Ok(())
    }
    fn clear(&self, value: u8) -> Result<(), BackendError> {
        let p = self.bytes(0, self.size)?;
        // SAFETY: the whole allocation.
        unsafe { std::ptr::write_bytes(p, value, self.size) };
        Ok(())
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.ptr)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl BufferTypeImpl for VecBufferType {
    fn name(&self) -> &str {
        "TestHost"
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>, BackendError> {
        let mut mem = vec![0u64; size.div_ceil(8)];
        let ptr = NonNull::new(mem.as_mut_ptr().cast::<u8>())
            .ok_or_else(|| BackendError::failed("TestHost", "null"))?;
        Ok(Box::new(VecBuffer {
            _mem: mem,
            ptr,
            size,
        }))
    }
    fn alignment(&self) -> usize {
        32
    }
    fn is_host(&self) -> bool {
        true
    }
}

/// A host buffer of `size` bytes (panics only if allocation fails).
pub fn host_buffer(size: usize) -> Buffer {
    BufferType::new(VecBufferType)
        .alloc_buffer(size)
        .expect("test host buffer")
}
