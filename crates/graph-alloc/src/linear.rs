//! Linear allocation: the bump allocator inside one buffer, and allocation of a whole set of
//! tensors (a model's weights) into as few buffers of one type as its maximum size allows.
//!
//! Why a separate, simple allocator: weights are placed once and live as long as their
//! buffer, so there is nothing to free and nothing to plan; the running sum of padded sizes
//! in creation order is also exactly the layout users of the reference expect.

use backend_core::{Buffer, BufferType, tensor_alloc, view_init};
use graph::{Context, TensorId};

use crate::error::AllocError;
use crate::pad;

/// A bump allocator inside one existing buffer (`ggml_tallocr`): each tensor gets the next
/// `alloc_size` bytes, padded to the buffer type's alignment. It never frees and knows nothing
/// about views (initialise those with [`backend_core::view_init`]).
///
/// A failed [`LinearAllocator::alloc`] changes nothing, so the allocator stays usable.
///
/// ```
/// use graph::{Context, ElementType};
/// use graph_alloc::LinearAllocator;
///
/// let buffer = backend_cpu::cpu_buffer_type().alloc_buffer(1024)?; // alignment 64
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_1d(ElementType::F32, 100)?; // 400 bytes → 448 padded
/// let b = ctx.new_tensor_1d(ElementType::F32, 10)?;
/// let mut la = LinearAllocator::new(&buffer)?;
/// la.alloc(&mut ctx, a)?;
/// la.alloc(&mut ctx, b)?;
/// assert_eq!(ctx[b].storage().unwrap().offset, 448);
/// assert_eq!(la.offset(), 448 + 64);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct LinearAllocator {
    buffer: Buffer,
    alignment: usize,
    offset: usize,
}

impl LinearAllocator {
    /// A bump allocator at the start of `buffer` (offsets are relative to the buffer start,
    /// which the buffer type aligns). A multi-buffer is refused: tensors live in its parts.
    pub fn new(buffer: &Buffer) -> Result<Self, AllocError> {
        if buffer.is_multi() {
            return Err(AllocError::MultiBuffer);
        }
        Ok(LinearAllocator {
            alignment: buffer.alignment().max(1),
            buffer: buffer.clone(),
            offset: 0,
        })
    }

    /// Place `id` at the current offset and advance past its padded alloc size.
    pub fn alloc(&mut self, ctx: &mut Context, id: TensorId) -> Result<(), AllocError> {
        let t = ctx.get(id)?;
        let raw = self.buffer.buffer_type().alloc_size(t);
        let available = self.buffer.size().saturating_sub(self.offset);
        let size = match pad(raw, self.alignment) {
            Some(s) if s <= available => s,
            _ => {
                return Err(AllocError::OutOfSpace {
                    tensor: id,
                    needed: pad(raw, self.alignment).unwrap_or(usize::MAX),
                    available,
                });
            }
        };
        tensor_alloc(ctx, &self.buffer, id, self.offset)?;
        self.offset += size;
        Ok(())
    }

    /// Bytes handed out so far (the next tensor's offset).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

/// Give every tensor of `tensors` (in creation order) that has no storage and is not a view its
/// own bytes in new buffers of type `buft`, and initialise the views among them
/// (`ggml_backend_alloc_ctx_tensors_from_buft`).
///
/// Tensors are packed in order, each at the running sum of the padded sizes before it; when
/// the next tensor would push a buffer past `buft`'s maximum size a new buffer starts (greedy,
/// no bin packing). One buffer is returned as is, several as a multi-buffer whose parts hold
/// the tensors. `Ok(None)` means there was nothing to allocate (then views are not initialised
/// either, as in the reference).
///
/// Errors, after which no buffer is kept and no tensor of the set has been given storage:
/// [`AllocError::TensorTooLarge`] when one tensor alone exceeds the maximum size, a backend
/// error when the buffer type refuses a buffer or a view's root has no storage.
///
/// ```
/// use graph::{Context, ElementType};
/// use graph_alloc::alloc_ctx_tensors;
/// use test_device::{TestDevice, TestDeviceConfig};
///
/// // The CPU buffer type has no maximum size; the test device's is configurable.
/// let config = TestDeviceConfig::named("SMALL").alignment(32).max_buffer_size(1000);
/// let buft = TestDevice::create(config)?.buffer_type();
/// let mut ctx = Context::new();
/// let t0 = ctx.new_tensor_1d(ElementType::F32, 200)?; // 800 bytes
/// let t1 = ctx.new_tensor_1d(ElementType::F32, 100)?; // 416 bytes: a second buffer
/// let buf = alloc_ctx_tensors(&mut ctx, [t0, t1], &buft)?.unwrap();
/// assert!(buf.is_multi());
/// assert_eq!(buf.parts().len(), 2);
/// assert_eq!(buf.size(), 800 + 416);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn alloc_ctx_tensors(
    ctx: &mut Context,
    tensors: impl IntoIterator<Item = TensorId>,
    buft: &BufferType,
) -> Result<Option<Buffer>, AllocError> {
    let ids: Vec<TensorId> = tensors.into_iter().collect();
    let alignment = buft.alignment().max(1);
    let max = buft.max_size();

    // Cut the list into ranges, each with the bytes it needs.
    let mut ranges: Vec<(usize, usize, usize)> = Vec::new();
    let (mut first, mut cur) = (0usize, 0usize);
    for (i, &id) in ids.iter().enumerate() {
        let t = ctx.get(id)?;
        let this = if !t.has_storage() && !t.is_view() {
            pad(buft.alloc_size(t), alignment).unwrap_or(usize::MAX)
        } else {
            0
        };
        if this > max {
            tracing::error!(
                tensor = t.name(),
                size = this,
                max,
                buffer_type = buft.name(),
                "tensor is too large for the buffer type"
            );
            return Err(AllocError::TensorTooLarge {
                tensor: id,
                size: this,
                max,
                buffer_type: buft.name().to_owned(),
            });
        }
        if cur.checked_add(this).is_none_or(|s| s > max) {
            ranges.push((first, i, cur));
            first = i;
            cur = this;
        } else {
            cur += this;
        }
    }
    if cur > 0 {
        ranges.push((first, ids.len(), cur));
    }
    if ranges.is_empty() {
        tracing::debug!("all tensors are already allocated");
        return Ok(None);
    }

    // Allocate every buffer before placing anything, so a refusal leaves no tensor placed;
    // buffers made so far are dropped (freed) on the way out.
    let buffers = ranges
        .iter()
        .map(|&(_, _, size)| buft.alloc_buffer(size))
        .collect::<Result<Vec<Buffer>, _>>()?;

    let mut placed: Vec<TensorId> = Vec::new();
    let result = place_ranges(ctx, &ids, &ranges, &buffers, &mut placed);
    if let Err(e) = result {
        for &id in &placed {
            if let Ok(t) = ctx.get_mut(id) {
                t.set_storage(None);
            }
        }
        return Err(e);
    }
    let mut buffers = buffers;
    Ok(if buffers.len() == 1 {
        buffers.pop()
    } else {
        Buffer::multi(buffers)
    })
}

fn place_ranges(
    ctx: &mut Context,
    ids: &[TensorId],
    ranges: &[(usize, usize, usize)],
    buffers: &[Buffer],
    placed: &mut Vec<TensorId>,
) -> Result<(), AllocError> {
    for (&(start, end, _), buffer) in ranges.iter().zip(buffers) {
        let mut la = LinearAllocator::new(buffer)?;
        for &id in &ids[start..end] {
            let t = ctx.get(id)?;
            if t.has_storage() {
                continue;
            }
            if t.is_view() {
                view_init(ctx, id)?;
            } else {
                la.alloc(ctx, id)?;
            }
            placed.push(id);
        }
    }
    Ok(())
}
