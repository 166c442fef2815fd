//! Tensors placed one after another in one buffer, every byte 0x3c: the bench set-ups'
//! allocation (`kernels`, and `product` for `matvec`, `stream_shape` and `thin_cpu`).
//! 0x3c3c is 1.06 as f16 and 0x3c3c3c3c 0.011 as f32, so quantized blocks keep finite
//! scales, and one byte value everywhere is the same in the repacked layout.

use backend_core::Buffer;
use graph::{Context, TensorId};

/// `tensors` one after another, each at a multiple of 64 bytes, in one buffer from
/// `alloc(bytes)`, which is then filled with 0x3c.
pub fn place(
    ctx: &mut Context,
    tensors: &[TensorId],
    alloc: impl FnOnce(usize) -> Buffer,
) -> Buffer {
    let mut total = 0usize;
    let mut offsets = Vec::with_capacity(tensors.len());
    for &t in tensors {
        let offset = total.next_multiple_of(64);
        offsets.push(offset);
        total = offset + ctx[t].nbytes();
    }
    let buf = alloc(total);
    for (&t, offset) in tensors.iter().zip(offsets) {
        backend_core::tensor_alloc(ctx, &buf, t, offset).unwrap();
    }
    buf.clear(0x3c).unwrap();
    buf
}
