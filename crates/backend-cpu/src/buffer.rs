//! CPU buffer types and buffers: aligned heap allocations ("CPU") and buffers over
//! caller-owned host memory ("CPU_Mapped").

use std::any::Any;
use std::ptr::NonNull;

use backend_core::{
    BackendError, Buffer, BufferImpl, BufferType, BufferTypeImpl, Device, HostMemory, Result,
};
use graph::Tensor;

use crate::mem::{ALIGNMENT, AlignedAlloc, Region};

/// Name of the CPU buffer type.
pub const CPU_BUFFER_TYPE_NAME: &str = "CPU";
/// Name of the buffer type of buffers over caller-owned host memory (ggml's `CPU_Mapped`).
pub const CPU_MAPPED_BUFFER_TYPE_NAME: &str = "CPU_Mapped";

/// Alignment of buffers over caller-owned host memory ("CPU_Mapped"), and of the tensors
/// placed in them. Why smaller than [`ALIGNMENT`]: weights files are mapped and used in place,
/// and their formats align tensor data to less than a cache line — safetensors pads its
/// header to 8 bytes, so its data section starts at 8 (mod 64) in a page-aligned map, and no
/// mapping can move it. 8 covers every element type's natural alignment; the kernels do not
/// need more.
pub const MAPPED_ALIGNMENT: usize = 8;

/// The CPU buffer types: host memory from the global allocator, aligned to [`ALIGNMENT`]
/// ("CPU"), or caller-owned memory aligned to [`MAPPED_ALIGNMENT`] ("CPU_Mapped").
pub(crate) struct CpuBufferType {
    pub(crate) name: &'static str,
    pub(crate) alignment: usize,
}

impl BufferTypeImpl for CpuBufferType {
    fn name(&self) -> &str {
        self.name
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let alloc = AlignedAlloc::new(size).ok_or_else(|| {
            tracing::error!(size, "CPU buffer allocation failed");
            BackendError::AllocationFailed {
                buffer_type: self.name.to_owned(),
                size,
            }
        })?;
        Ok(Box::new(CpuBuffer {
            region: alloc.region(),
            writable: true,
            _memory: Memory::Owned(alloc),
        }))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        // `Layout` refuses anything above isize::MAX (minus alignment padding).
        isize::MAX as usize - (ALIGNMENT - 1)
    }
    fn is_host(&self) -> bool {
        true
    }
    fn device(&self) -> Option<Device> {
        Some(crate::cpu_device())
    }
}

/// Who owns a CPU buffer's bytes.
enum Memory {
    /// We allocated them and free them on drop.
    Owned(#[allow(dead_code)] AlignedAlloc),
    /// The caller's memory: we hold its owner alive and never free it.
    Host(#[allow(dead_code)] HostMemory),
}

/// A CPU buffer. `region` describes the bytes owned (directly or not) by `_memory`, which
/// outlives every access because both live in this struct.
pub(crate) struct CpuBuffer {
    region: Region,
    writable: bool,
    _memory: Memory,
}

impl CpuBuffer {
    fn at(&self, tensor: &Tensor, offset: usize) -> Result<usize> {
        let st = tensor
            .storage()
            .ok_or_else(|| BackendError::failed("CPU", "tensor without storage"))?;
        st.offset
            .checked_add(offset)
            .ok_or_else(|| BackendError::out_of_bounds("cpu tensor", st.offset, offset, 0))
    }

    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(BackendError::read_only(CPU_MAPPED_BUFFER_TYPE_NAME))
        }
    }
}

impl BufferImpl for CpuBuffer {
    fn memset_tensor(&self, tensor: &Tensor, value: u8, offset: usize, size: usize) -> Result<()> {
        self.check_writable()?;
        self.region.fill(self.at(tensor, offset)?, size, value)
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.region.write(self.at(tensor, offset)?, data)
    }
    fn get_tensor(&self, tensor: &Tensor, offset: usize, data: &mut [u8]) -> Result<()> {
        self.region.read(self.at(tensor, offset)?, data)
    }
    /// The fast path when the source is in CPU memory too: one direct copy.
    fn cpy_tensor(&self, src: &Tensor, dst: &Tensor) -> Result<bool> {
        let Some(src_buf) = src.storage().and_then(Buffer::from_storage) else {
            return Ok(false);
        };
        let Some(src_cpu) = src_buf
            .implementation()
            .and_then(|b| b.as_any().downcast_ref::<CpuBuffer>())
        else {
            return Ok(false);
        };
        self.check_writable()?;
        let n = src.nbytes();
        self.region
            .copy_from(self.at(dst, 0)?, &src_cpu.region, src_cpu.at(src, 0)?, n)?;
        Ok(true)
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.check_writable()?;
        self.region.fill(0, self.region.len(), value)
    }
    fn is_writable(&self) -> bool {
        self.writable
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.region.ptr())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer over caller-owned host memory (`ggml_backend_cpu_buffer_from_ptr`).
pub(crate) fn buffer_from_host_memory(buft: BufferType, memory: HostMemory) -> Result<Buffer> {
    let addr = memory.as_ptr().as_ptr() as usize;
    if memory.is_empty() {
        return Ok(Buffer::from_parts(buft, None, 0));
    }
    let align = buft.alignment();
    if !addr.is_multiple_of(align) {
        return Err(BackendError::Misaligned {
            offset: addr,
            alignment: align,
        });
    }
    // SAFETY: `HostMemory` guarantees its pointer is valid for `len` bytes while it lives, and
    // the buffer holds it (in `_memory`) for as long as the region is used; writes happen only
    // if `is_writable` (checked in every write path via `writable`).
    let region = unsafe { Region::new(memory.as_ptr(), memory.len()) };
    let size = memory.len();
    let imp = CpuBuffer {
        region,
        writable: memory.is_writable(),
        _memory: Memory::Host(memory),
    };
    Ok(Buffer::from_parts(buft, Some(Box::new(imp)), size))
}

/// The `CPU_REPACK` buffer type (ggml's CPU extra buffer type of the same name): CPU memory
/// in which q4_0, q4_1 and q8_0 matrices are stored in the interleaved layout of `cpu_kernels::repack`,
/// repacked by `set_tensor` and given back plain by `get_tensor`. Not a host buffer type:
/// its bytes are not the tensors' plain bytes.
pub(crate) struct RepackBufferType;

impl BufferTypeImpl for RepackBufferType {
    fn name(&self) -> &str {
        cpu_kernels::repack::REPACK_BUFFER_TYPE_NAME
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let inner = CpuBufferType {
            name: cpu_kernels::repack::REPACK_BUFFER_TYPE_NAME,
            alignment: ALIGNMENT,
        }
        .alloc_buffer(size)?;
        Ok(Box::new(cpu_kernels::repack::RepackBuffer::new(inner)))
    }
    fn alignment(&self) -> usize {
        ALIGNMENT
    }
    fn max_size(&self) -> usize {
        isize::MAX as usize - (ALIGNMENT - 1)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn device(&self) -> Option<Device> {
        Some(crate::cpu_device())
    }
}
