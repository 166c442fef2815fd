//! One matrix product `y = W·x` built for a bench, with its buffers: shared by `matvec`,
//! `stream_shape` and `thin_cpu`, so that their rows are the same set-up (weights alone in a
//! buffer of the asked type, the column and the result in a 64-byte aligned CPU buffer,
//! every byte 0x3c: 0x3c3c is 1.06 as f16, 0x3c3c3c3c 0.011 as f32, and one byte value
//! everywhere is the same in the repacked layout).

use backend_core::Buffer;
use graph::{Context, ElementType, Graph};

/// The graph of one product and what holds its tensors.
pub struct Product {
    pub ctx: Context,
    pub g: Graph,
    /// Bytes of the weights.
    pub weight_bytes: usize,
    _bufs: Vec<Buffer>,
}

/// `y = W·x` with `W` of `ty`, `k` × `m`, in the buffer `weights(bytes)` returns, and `x` of
/// `n` columns.
pub fn product(
    ty: ElementType,
    k: i64,
    m: i64,
    n: i64,
    weights: impl FnOnce(usize) -> Buffer,
) -> Product {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, k, n).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let weight_bytes = ctx[w].nbytes();
    let wbuf = weights(weight_bytes);
    wbuf.clear(0x3c).unwrap();
    backend_core::tensor_alloc(&mut ctx, &wbuf, w, 0).unwrap();
    let xbytes = ctx[x].nbytes().next_multiple_of(64);
    let xbuf = backend_cpu::cpu_buffer_type()
        .alloc_buffer(xbytes + ctx[y].nbytes())
        .unwrap();
    xbuf.clear(0x3c).unwrap();
    backend_core::tensor_alloc(&mut ctx, &xbuf, x, 0).unwrap();
    backend_core::tensor_alloc(&mut ctx, &xbuf, y, xbytes).unwrap();
    Product {
        ctx,
        g,
        weight_bytes,
        _bufs: vec![wbuf, xbuf],
    }
}

/// Weights in the CPU buffer type (`repack` false) or in `CPU_REPACK`.
#[allow(dead_code, reason = "not every bench places weights this way")]
pub fn cpu_weights(repack: bool) -> impl FnOnce(usize) -> Buffer {
    move |bytes| {
        if repack {
            backend_cpu::cpu_repack_buffer_type().alloc_buffer(bytes)
        } else {
            backend_cpu::cpu_buffer_type().alloc_buffer(bytes)
        }
        .unwrap()
    }
}
