//! Checked tensor operations: set/get/memset of byte ranges, copies, placing a tensor in a
//! buffer, initialising views. Every check the seed asserts is an error here, and a failed
//! call changes nothing.

use graph::{Context, TensorId, TensorStorage};

use crate::backend::Backend;
use crate::buffer::Buffer;
use crate::error::{BackendError, Result};

/// The buffer `tensor` lives in (its view root's buffer for a view).
pub fn tensor_buffer(ctx: &Context, tensor: TensorId) -> Result<Option<Buffer>> {
    Ok(ctx.get(tensor)?.storage().and_then(Buffer::from_storage))
}

pub(crate) fn check_range(
    ctx: &Context,
    tensor: TensorId,
    offset: usize,
    size: usize,
    what: &'static str,
) -> Result<Buffer> {
    let t = ctx.get(tensor)?;
    let st = t.storage().ok_or(BackendError::NotAllocated(tensor))?;
    let nbytes = t.nbytes();
    if offset.checked_add(size).is_none_or(|end| end > nbytes) {
        return Err(BackendError::out_of_bounds(what, offset, size, nbytes));
    }
    Buffer::from_storage(st).ok_or(BackendError::NotAllocated(tensor))
}

/// Write `data` into `tensor` at byte `offset` (`ggml_backend_tensor_set`).
pub fn tensor_set(ctx: &Context, tensor: TensorId, offset: usize, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let buf = check_range(ctx, tensor, offset, data.len(), "tensor_set")?;
    match buf.implementation() {
        Some(b) => b.set_tensor(&ctx[tensor], offset, data),
        None => Err(BackendError::NotAllocated(tensor)),
    }
}

/// Read `data.len()` bytes of `tensor` from byte `offset` (`ggml_backend_tensor_get`).
pub fn tensor_get(ctx: &Context, tensor: TensorId, offset: usize, data: &mut [u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let buf = check_range(ctx, tensor, offset, data.len(), "tensor_get")?;
    match buf.implementation() {
        Some(b) => b.get_tensor(&ctx[tensor], offset, data),
        None => Err(BackendError::NotAllocated(tensor)),
    }
}

/// Fill `size` bytes of `tensor` from `offset` with `value` (`ggml_backend_tensor_memset`).
pub fn tensor_memset(
    ctx: &Context,
    tensor: TensorId,
    value: u8,
    offset: usize,
    size: usize,
) -> Result<()> {
    if size == 0 {
        return Ok(());
    }
    let buf = check_range(ctx, tensor, offset, size, "tensor_memset")?;
    match buf.implementation() {
        Some(b) => b.memset_tensor(&ctx[tensor], value, offset, size),
        None => Err(BackendError::NotAllocated(tensor)),
    }
}

fn check_same_layout(ctx: &Context, src: TensorId, dst: TensorId) -> Result<()> {
    if !ctx.get(src)?.same_layout(ctx.get(dst)?) {
        return Err(BackendError::LayoutMismatch { src, dst });
    }
    Ok(())
}

/// Copy `src` into `dst`, which must have the same layout (`ggml_backend_tensor_copy`): from
/// host memory a direct write, into host memory a direct read, else the destination buffer's
/// copy, else staged through a host vector.
pub fn tensor_copy(ctx: &Context, src: TensorId, dst: TensorId) -> Result<()> {
    check_same_layout(ctx, src, dst)?;
    if src == dst {
        return Ok(());
    }
    let n = ctx[src].nbytes();
    let sbuf = check_range(ctx, src, 0, n, "tensor_copy")?;
    let dbuf = check_range(ctx, dst, 0, n, "tensor_copy")?;
    if let (Some(p), Some(st)) = (sbuf.host_ptr(), ctx[src].storage()) {
        // SAFETY: the source buffer is host memory of `sbuf.size()` bytes, alive while `sbuf`
        // is held; check_range proved `st.offset + n` lies inside the tensor, and the tensor
        // lies inside its buffer (tensor_alloc / view_init checked it).
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr().add(st.offset), n) };
        return tensor_set(ctx, dst, 0, bytes);
    }
    if let (Some(p), Some(st)) = (dbuf.host_ptr(), ctx[dst].storage()) {
        // SAFETY: as above, for the destination; src and dst are different buffers here
        // because src is not host memory, so the slices cannot alias.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr().add(st.offset), n) };
        return tensor_get(ctx, src, 0, bytes);
    }
    if let Some(b) = dbuf.implementation()
        && b.cpy_tensor(&ctx[src], &ctx[dst])?
    {
        return Ok(());
    }
    tracing::debug!(
        from = sbuf.name(),
        to = dbuf.name(),
        bytes = n,
        "slow copy through host memory"
    );
    let mut staging = vec![0u8; n];
    tensor_get(ctx, src, 0, &mut staging)?;
    tensor_set(ctx, dst, 0, &staging)
}

/// Copy `src` (on `backend_src`) into `dst` (on `backend_dst`) asynchronously where the
/// destination backend can, otherwise synchronize both and copy
/// (`ggml_backend_tensor_copy_async`).
pub fn tensor_copy_async(
    ctx: &Context,
    backend_src: &Backend,
    backend_dst: &Backend,
    src: TensorId,
    dst: TensorId,
) -> Result<()> {
    check_same_layout(ctx, src, dst)?;
    if src == dst {
        return Ok(());
    }
    if backend_dst
        .implementation()
        .cpy_tensor_async(backend_src, &ctx[src], &ctx[dst])?
    {
        return Ok(());
    }
    backend_src.synchronize()?;
    backend_dst.synchronize()?;
    tensor_copy(ctx, src, dst)
}

/// Place `tensor` at byte `offset` of `buffer` (`ggml_backend_tensor_alloc`): it must have no
/// storage and not be a view, the offset must be aligned, and its alloc size must fit.
pub fn tensor_alloc(
    ctx: &mut Context,
    buffer: &Buffer,
    tensor: TensorId,
    offset: usize,
) -> Result<()> {
    let t = ctx.get(tensor)?;
    if t.has_storage() || t.is_view() {
        return Err(BackendError::AlreadyAllocated(tensor));
    }
    if buffer.is_multi() {
        return Err(BackendError::unsupported(
            buffer.name(),
            "placing tensors in a multi-buffer",
        ));
    }
    let align = buffer.alignment();
    if align > 1 && !offset.is_multiple_of(align) {
        return Err(BackendError::Misaligned {
            offset,
            alignment: align,
        });
    }
    let size = buffer.buffer_type().alloc_size(t);
    if offset
        .checked_add(size)
        .is_none_or(|end| end > buffer.size())
    {
        return Err(BackendError::out_of_bounds(
            "tensor_alloc",
            offset,
            size,
            buffer.size(),
        ));
    }
    if let Some(b) = buffer.implementation() {
        let mut probe = t.clone();
        probe.set_storage(Some(buffer.storage_at(offset)));
        b.init_tensor(&probe)?;
    }
    ctx[tensor].set_storage(Some(buffer.storage_at(offset)));
    Ok(())
}

/// Give a view the storage of its root at its offset (`ggml_backend_view_init`).
pub fn view_init(ctx: &mut Context, tensor: TensorId) -> Result<()> {
    let t = ctx.get(tensor)?;
    let root = t.view_src().ok_or(BackendError::NotAView(tensor))?;
    if t.has_storage() {
        return Err(BackendError::AlreadyAllocated(tensor));
    }
    let offs = t.view_offs();
    let rs: TensorStorage = ctx
        .get(root)?
        .storage()
        .cloned()
        .ok_or(BackendError::ViewSourceNotAllocated(tensor))?;
    let storage = TensorStorage {
        buffer: rs.buffer.clone(),
        offset: rs.offset + offs,
    };
    if let Some(buf) = Buffer::from_storage(&storage)
        && let Some(b) = buf.implementation()
    {
        let mut probe = ctx[tensor].clone();
        probe.set_storage(Some(storage.clone()));
        b.init_tensor(&probe)?;
    }
    ctx[tensor].set_storage(Some(storage));
    Ok(())
}
