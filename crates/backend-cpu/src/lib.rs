//! The CPU backend's memory, device, registry entry and backend object.
//!
//! * **Memory.** The `"CPU"` buffer type allocates zero-initialised host memory aligned to
//!   [`ALIGNMENT`] = 64 bytes. Why 64: it is the cache-line size of current x86 and most ARM
//!   cores and the width of an AVX-512 register, so a tensor placed on the boundary is read by
//!   full-width aligned loads and never splits a cache line at its start; ggml uses 32
//!   (AVX2), and every 64-aligned address is also 32-aligned, so both requirements hold.
//!   Size-0 buffers are valid and empty. [`backend_core::Device::buffer_from_host_memory`]
//!   wraps caller-owned memory (a read-only `memmap2::Mmap` of a weights file, a `Vec`) in a
//!   `"CPU_Mapped"` buffer that keeps its owner alive, never frees it, and refuses writes to
//!   read-only memory with [`backend_core::BackendError::ReadOnly`].
//! * **Buffer operations.** set/get/memset/copy are single `copy_nonoverlapping` /
//!   `write_bytes` / `copy` calls after one bounds check, i.e. `memcpy`/`memset` speed at every
//!   size; a copy from another CPU buffer takes the buffer's `cpy_tensor` fast path.
//! * **Device and registry.** One device named `"CPU"` of type [`backend_core::DeviceType::Cpu`], its memory
//!   from `/proc/meminfo` (0 where that is missing), in a registry named `"CPU"` that
//!   [`register`] adds to the [`GlobalRegistry`] (idempotent); the device names that registry
//!   ([`backend_core::Device::registry`]). The registry answers ggml's proc-address names of
//!   [`backend_core::proc`] (thread count, extra buffer types, abort callback, and the
//!   processor's [`features`]) besides its own [`EXT_SET_N_THREADS`] and
//!   [`EXT_EXTRA_BUFFER_TYPES`]. Besides `"CPU"` it offers the weight buffer type
//!   [`cpu_repack_buffer_type`] (`"CPU_REPACK"`), and it reads tensors in any host buffer type
//!   and in `"CPU_REPACK"`.
//! * **Compute.** [`CpuBackend`] computes graphs with the kernels of `cpu-kernels`
//!   (`cpu_kernels::CpuCompute`) on a worker pool of its thread count (made on first compute,
//!   remade only when more threads are asked for), node by node, polling its abort callback
//!   between nodes; graph plans are supported. The device's `supports_op` is
//!   `cpu_kernels::supports_op`: what it says yes to, `graph_compute` computes. Before any node
//!   runs, a node whose result lies in read-only memory (a read-only mapping of a weights file)
//!   is refused with [`backend_core::BackendError::ReadOnly`], since the kernels write through
//!   raw pointers.
//!
//! `unsafe` code is confined to the aligned allocation and the raw copies (`mem`), wrapping
//! caller-owned memory (`buffer`) and glibc's allocator tuning calls
//! ([`release_free_memory`] and its siblings); every access is bounds-checked and the aliasing
//! contract is `backend_core::Buffer`'s.
//!
//! ```
//! use backend_core::{GlobalRegistry, tensor_alloc, tensor_get_vec, tensor_set_slice};
//! use graph::{Context, ElementType, Graph};
//!
//! backend_cpu::register();
//! let backend = GlobalRegistry::get().init_by_name("CPU", "n_threads=2")?;
//! let buf = backend.alloc_buffer(1024)?;
//! let mut ctx = Context::new();
//! let x = ctx.new_tensor_1d(ElementType::F32, 4)?;
//! let y = ctx.scale(x, 2.0)?;
//! tensor_alloc(&mut ctx, &buf, x, 0)?;
//! tensor_alloc(&mut ctx, &buf, y, 64)?;
//! tensor_set_slice(&ctx, x, &[1.5f32, -1.0, 0.0, 4.0])?;
//! let mut graph = Graph::new(4);
//! graph.build_forward_expand(&mut ctx, y)?;
//! backend.graph_compute(&ctx, graph.as_view())?;
//! assert_eq!(tensor_get_vec::<f32>(&ctx, y)?, [3.0, -2.0, 0.0, 8.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backend;
mod buffer;
mod device;
mod features;
mod heap;
mod mem;

use std::sync::OnceLock;

use backend_core::{Backend, BufferType, Device, GlobalRegistry, Registry, Result};

pub use backend::{AbortCallback, CPU_GUID, CpuBackend, default_n_threads};
pub use buffer::{CPU_BUFFER_TYPE_NAME, CPU_MAPPED_BUFFER_TYPE_NAME, MAPPED_ALIGNMENT};
pub use device::{
    CPU_NAME, EXT_EXTRA_BUFFER_TYPES, EXT_SET_N_THREADS, ExtraBufferTypes, SetNThreads,
};
pub use features::{KERNELS_FEATURE, features};
pub use heap::{limit_heap_arenas, release_free_memory, return_large_frees_to_os};
pub use mem::ALIGNMENT;

/// The CPU buffer type (one object for the process: buffer types compare by identity).
pub fn cpu_buffer_type() -> BufferType {
    static B: OnceLock<BufferType> = OnceLock::new();
    B.get_or_init(|| {
        BufferType::new(buffer::CpuBufferType {
            name: CPU_BUFFER_TYPE_NAME,
            alignment: ALIGNMENT,
        })
    })
    .clone()
}

/// The buffer type of buffers over caller-owned host memory (`"CPU_Mapped"`).
pub fn cpu_mapped_buffer_type() -> BufferType {
    static B: OnceLock<BufferType> = OnceLock::new();
    B.get_or_init(|| {
        BufferType::new(buffer::CpuBufferType {
            name: CPU_MAPPED_BUFFER_TYPE_NAME,
            alignment: buffer::MAPPED_ALIGNMENT,
        })
    })
    .clone()
}

/// The CPU device's extra buffer type `"CPU_REPACK"` (ggml's `CPU_REPACK`): q4_0, q4_1 and q8_0
/// matrices with a multiple of 16 rows are stored interleaved for the kernels
/// (`cpu_kernels::repack`); `set_tensor` repacks, `get_tensor` gives back the plain bytes.
/// Only MUL_MAT reads such a tensor (as its weights); the CPU device refuses any other op
/// on it, and every op on a tensor such a buffer stores as it is, so a scheduler leaves them
/// alone and `backend_core::WeightBufferTypes` puts only repacked weights there. Listed by the registry extension
/// [`EXT_EXTRA_BUFFER_TYPES`].
///
/// ```
/// use backend_core::{tensor_alloc, tensor_get, tensor_set};
/// use graph::{Context, ElementType};
///
/// let buft = backend_cpu::cpu_repack_buffer_type();
/// let mut ctx = Context::new();
/// let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 16)?;
/// let buf = buft.alloc_buffer(ctx[w].nbytes())?;
/// tensor_alloc(&mut ctx, &buf, w, 0)?;
/// let bytes: Vec<u8> = (0..ctx[w].nbytes()).map(|i| i as u8).collect();
/// tensor_set(&ctx, w, 0, &bytes)?;
/// let mut back = vec![0u8; bytes.len()];
/// tensor_get(&ctx, w, 0, &mut back)?;
/// assert_eq!(back, bytes);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn cpu_repack_buffer_type() -> BufferType {
    static B: OnceLock<BufferType> = OnceLock::new();
    B.get_or_init(|| BufferType::new(buffer::RepackBufferType))
        .clone()
}

/// The CPU device (one object for the process).
pub fn cpu_device() -> Device {
    static D: OnceLock<Device> = OnceLock::new();
    D.get_or_init(|| {
        Device::new(device::CpuDevice {
            description: device::cpu_description(),
        })
    })
    .clone()
}

/// The CPU registry entry (one object for the process).
pub fn cpu_registry() -> Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::new(device::CpuRegistry)).clone()
}

/// Add the CPU registry to the [`GlobalRegistry`]. Safe to call any number of times from any
/// thread; returns whether this call added it.
pub fn register() -> bool {
    GlobalRegistry::get().register(cpu_registry())
}

/// A new CPU backend with default settings (`ggml_backend_cpu_init`).
pub fn init() -> Result<Backend> {
    Ok(Backend::new(CpuBackend::new()))
}
