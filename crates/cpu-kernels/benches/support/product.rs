//! The bench set-ups of matrix products, with their buffers: one product `y = W·x`
//! ([`product`]), shared by `matvec`, `stream_shape` and `thin_cpu` so that their rows are the
//! same set-up (weights alone in a buffer of the asked type, the column and the result in a
//! 64-byte aligned CPU buffer, every byte 0x3c, see `place`); and a decode step's products,
//! one node each ([`step`], for `matvec`).

#[path = "place.rs"]
mod place;

use backend_core::Buffer;
use graph::{Context, ElementType, Graph, TensorId};

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
    let wbuf = place::place(&mut ctx, &[w], weights);
    let xbuf = place::place(&mut ctx, &[x, y], cpu_weights(false));
    Product {
        ctx,
        g,
        weight_bytes,
        _bufs: vec![wbuf, xbuf],
    }
}

/// Weights in the CPU buffer type (`repack` false) or in `CPU_REPACK`.
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

/// A decode step's matrix products in one graph: `layers` times one node per weight shape
/// `(k, m)` of `shapes`, node `i` of a layer against the f32 column `inputs[i]` (of its `k`;
/// a layer's Q, K and V share one, as do gate and up, and the nodes that share one follow
/// each other, as in a model's graph). With `distinct`, every node has weights of its
/// own, one after another in one buffer as a model's load them, so that they stream from
/// memory as in a real step; without, the layers share one layer's weights, which then stay
/// in cache, so that the nodes' own costs show apart from the memory's. `weight_bytes` is
/// what the nodes read per compute.
#[allow(dead_code, reason = "not every bench uses it")]
pub fn step(
    ty: ElementType,
    shapes: &[(i64, i64)],
    inputs: &[usize],
    layers: usize,
    repack: bool,
    distinct: bool,
) -> Product {
    let mut ctx = Context::new();
    let mut cols: Vec<(usize, TensorId)> = Vec::new();
    let mut weights = Vec::new();
    let mut results = Vec::new();
    for layer in 0..layers {
        for (s, (&(k, m), &input)) in shapes.iter().zip(inputs).enumerate() {
            let w = if distinct || layer == 0 {
                let w = ctx.new_tensor_2d(ty, k, m).unwrap();
                weights.push(w);
                w
            } else {
                weights[s]
            };
            let x = match cols.iter().find(|c| c.0 == input) {
                Some(&(_, x)) => x,
                None => {
                    let x = ctx.new_tensor_2d(ElementType::F32, k, 1).unwrap();
                    cols.push((input, x));
                    x
                }
            };
            results.push((ctx.mul_mat(w, x).unwrap(), ctx[w].nbytes()));
        }
    }
    let mut g = Graph::new(results.len() + cols.len() + weights.len());
    for &(y, _) in &results {
        g.build_forward_expand(&mut ctx, y).unwrap();
    }
    let wbuf = place::place(&mut ctx, &weights, cpu_weights(repack));
    let inputs_outputs: Vec<TensorId> = cols
        .iter()
        .map(|c| c.1)
        .chain(results.iter().map(|r| r.0))
        .collect();
    let xbuf = place::place(&mut ctx, &inputs_outputs, cpu_weights(false));
    Product {
        ctx,
        g,
        weight_bytes: results.iter().map(|r| r.1).sum(),
        _bufs: vec![wbuf, xbuf],
    }
}
