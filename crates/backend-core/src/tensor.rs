//! Checked tensor operations: set/get/memset of byte ranges, copies, placing a tensor in a
//! buffer, initialising views.
//!
//! Why here and not in each backend: every check the seed asserts (allocated, in bounds, same
//! layout, aligned, view source allocated) is done once, before any backend code runs, and
//! becomes an error; a failed call changes nothing. Backends then receive only ranges that lie
//! inside the tensor *and* inside its buffer. These functions also take the buffers' access
//! locks (see [`crate::Buffer::lock_write`]), so safe callers on several threads never race.

use graph::{Context, Tensor, TensorId, TensorStorage};

use crate::backend::Backend;
use crate::buffer::{AccessGuard, Buffer, BufferImpl, BufferShared, shared_of};
use crate::error::{BackendError, Result};
use crate::raw;

/// The buffer `tensor` lives in (its view root's buffer for a view).
pub fn tensor_buffer(ctx: &Context, tensor: TensorId) -> Result<Option<Buffer>> {
    Ok(ctx.get(tensor)?.storage().and_then(Buffer::from_storage))
}

/// A tensor resolved to its buffer, with its range checked.
struct Located<'c> {
    tensor: &'c Tensor,
    /// Offset of the tensor's first byte in its buffer.
    base: usize,
    shared: &'c BufferShared,
    imp: &'c dyn BufferImpl,
}

fn locate<'c>(
    ctx: &'c Context,
    tensor: TensorId,
    offset: usize,
    size: usize,
    what: &'static str,
) -> Result<Located<'c>> {
    let t = ctx.get(tensor)?;
    let st = t.storage().ok_or(BackendError::NotAllocated(tensor))?;
    let nbytes = t.nbytes();
    if offset.checked_add(size).is_none_or(|end| end > nbytes) {
        return Err(BackendError::out_of_bounds(what, offset, size, nbytes));
    }
    let shared = shared_of(st).ok_or(BackendError::NotAllocated(tensor))?;
    // `Tensor::set_storage` is public, so do not trust that the tensor lies in its buffer.
    if st
        .offset
        .checked_add(nbytes)
        .is_none_or(|end| end > shared.storage_size_checked())
    {
        return Err(BackendError::out_of_bounds(
            "tensor storage",
            st.offset,
            nbytes,
            shared.storage_size_checked(),
        ));
    }
    let imp = shared
        .implementation()
        .ok_or(BackendError::NotAllocated(tensor))?;
    Ok(Located {
        tensor: t,
        base: st.offset,
        shared,
        imp,
    })
}

pub(crate) fn check_range(
    ctx: &Context,
    tensor: TensorId,
    offset: usize,
    size: usize,
    what: &'static str,
) -> Result<()> {
    locate(ctx, tensor, offset, size, what).map(|_| ())
}

fn check_writable(l: &Located<'_>) -> Result<()> {
    if l.imp.is_writable() {
        Ok(())
    } else {
        Err(BackendError::read_only(l.shared.name()))
    }
}

/// Write `data` into `tensor` at byte `offset` (`ggml_backend_tensor_set`).
pub fn tensor_set(ctx: &Context, tensor: TensorId, offset: usize, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let l = locate(ctx, tensor, offset, data.len(), "tensor_set")?;
    check_writable(&l)?;
    let _guard = l.shared.write();
    l.imp.set_tensor(l.tensor, offset, data)
}

/// Read `data.len()` bytes of `tensor` from byte `offset` (`ggml_backend_tensor_get`).
pub fn tensor_get(ctx: &Context, tensor: TensorId, offset: usize, data: &mut [u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let l = locate(ctx, tensor, offset, data.len(), "tensor_get")?;
    let _guard = l.shared.read();
    l.imp.get_tensor(l.tensor, offset, data)
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
    let l = locate(ctx, tensor, offset, size, "tensor_memset")?;
    check_writable(&l)?;
    let _guard = l.shared.write();
    l.imp.memset_tensor(l.tensor, value, offset, size)
}

fn check_same_layout(ctx: &Context, src: TensorId, dst: TensorId) -> Result<()> {
    if !ctx.get(src)?.same_layout(ctx.get(dst)?) {
        return Err(BackendError::LayoutMismatch { src, dst });
    }
    Ok(())
}

/// Copy `src` into `dst`, which must have the same layout (`ggml_backend_tensor_copy`): from
/// host memory a direct write, into host memory a direct read, else the destination buffer's
/// copy, else staged through a host vector. Tensors in the same host buffer may overlap.
pub fn tensor_copy(ctx: &Context, src: TensorId, dst: TensorId) -> Result<()> {
    check_same_layout(ctx, src, dst)?;
    if src == dst {
        return Ok(());
    }
    let n = ctx.get(src)?.nbytes();
    let s = locate(ctx, src, 0, n, "tensor_copy")?;
    let d = locate(ctx, dst, 0, n, "tensor_copy")?;
    check_writable(&d)?;
    if n == 0 {
        return Ok(());
    }
    if s.shared.identity() == d.shared.identity() {
        let _guard = d.shared.write();
        if let Some(base) = d.shared.host_ptr() {
            // SAFETY: host buffers' base pointers are valid for their size while the buffer
            // lives (`BufferImpl::host_ptr`), it is writable (checked), and we hold its write
            // lock.
            return unsafe {
                raw::copy_within(base, d.shared.storage_size_checked(), s.base, d.base, n)
            };
        }
        if d.imp.cpy_tensor(s.tensor, d.tensor)? {
            return Ok(());
        }
        return staged(&s, &d, n);
    }
    let _guards = lock_pair(&s, &d);
    if let Some(base) = s.shared.host_ptr() {
        // SAFETY: the source is host memory valid for its size; we hold its read lock, and
        // the destination is another buffer, so the write below cannot touch these bytes.
        let bytes = unsafe { raw::slice(base, s.shared.storage_size_checked(), s.base, n)? };
        return d.imp.set_tensor(d.tensor, 0, bytes);
    }
    if let Some(base) = d.shared.host_ptr() {
        // SAFETY: the destination is writable host memory valid for its size, we hold its
        // write lock, and the source is another buffer.
        let bytes = unsafe { raw::slice_mut(base, d.shared.storage_size_checked(), d.base, n)? };
        return s.imp.get_tensor(s.tensor, 0, bytes);
    }
    if d.imp.cpy_tensor(s.tensor, d.tensor)? {
        return Ok(());
    }
    staged(&s, &d, n)
}

/// Read lock on the source and write lock on the destination, taken in identity order.
fn lock_pair<'a>(s: &Located<'a>, d: &Located<'a>) -> (AccessGuard<'a>, AccessGuard<'a>) {
    if s.shared.identity() < d.shared.identity() {
        let r = s.shared.read();
        (r, d.shared.write())
    } else {
        let w = d.shared.write();
        (w, s.shared.read())
    }
}

fn staged(s: &Located<'_>, d: &Located<'_>, n: usize) -> Result<()> {
    tracing::debug!(
        from = s.shared.name(),
        to = d.shared.name(),
        bytes = n,
        "slow copy through host memory"
    );
    let mut staging = vec![0u8; n];
    s.imp.get_tensor(s.tensor, 0, &mut staging)?;
    d.imp.set_tensor(d.tensor, 0, &staging)
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
    let n = ctx.get(src)?.nbytes();
    let s = locate(ctx, src, 0, n, "tensor_copy_async")?;
    let d = locate(ctx, dst, 0, n, "tensor_copy_async")?;
    check_writable(&d)?;
    if backend_dst
        .implementation()
        .cpy_tensor_async(backend_src, s.tensor, d.tensor)?
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
    ctx.get_mut(tensor)?
        .set_storage(Some(buffer.storage_at(offset)));
    init_or_undo(ctx, buffer, tensor)
}

/// Run the buffer's `init_tensor` hook on a tensor whose storage was just set; on failure the
/// storage is taken away again, so a failed placement changes nothing. (Setting first and
/// undoing on error avoids cloning the tensor for the hook on the allocators' hot path.)
fn init_or_undo(ctx: &mut Context, buffer: &Buffer, tensor: TensorId) -> Result<()> {
    let t = ctx.get_mut(tensor)?;
    if let Some(b) = buffer.implementation()
        && let Err(e) = b.init_tensor(t)
    {
        t.set_storage(None);
        return Err(e);
    }
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
    let rs = ctx
        .get(root)?
        .storage()
        .ok_or(BackendError::ViewSourceNotAllocated(tensor))?;
    // The root's offset comes from the public `Tensor::set_storage`, so the sum is checked: a
    // wrapped offset would place the view over another tensor of the buffer.
    let offset = rs
        .offset
        .checked_add(offs)
        .ok_or_else(|| BackendError::out_of_bounds("view_init", rs.offset, offs, usize::MAX))?;
    // One reference-count increment per view: the new storage's. The buffer's hook is
    // reached through the storage itself instead of through a cloned `Buffer` handle.
    let storage = TensorStorage {
        buffer: rs.buffer.clone(),
        offset,
    };
    let t = ctx.get_mut(tensor)?;
    t.set_storage(Some(storage));
    let imp = t
        .storage()
        .and_then(shared_of)
        .and_then(BufferShared::implementation);
    if let Some(b) = imp
        && let Err(e) = b.init_tensor(t)
    {
        t.set_storage(None);
        return Err(e);
    }
    Ok(())
}
