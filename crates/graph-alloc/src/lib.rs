//! Tensor allocators: where each tensor's bytes go inside backend buffers (ggml-alloc's job).
//!
//! Three allocators, from simplest to the one the scheduler needs:
//!
//! * [`LinearAllocator`] (ggml's `tallocr`): bump allocation inside one existing buffer. It
//!   never frees; it is how weights are laid out.
//! * [`alloc_ctx_tensors`] (`ggml_backend_alloc_ctx_tensors_from_buft`): give every not yet
//!   placed tensor of a set its own bytes in new buffers of one buffer type, cutting the set
//!   into several buffers when the type's maximum size requires it.
//! * [`GraphAllocator`] (`ggml_gallocr`): plans compute memory for a graph so that tensors
//!   whose lifetimes overlap never share bytes, reusing memory as soon as a tensor's last
//!   consumer has run and letting some ops write over their input in place. The plan is
//!   recorded per node position and re-applied to later graphs of the same shape without
//!   re-planning, which is what makes a decode loop cheap.
//!
//! Why behavioural equality with ggml matters here: the scheduler's plans, the buffer sizes a
//! user sees, and the conformance fixtures were all produced by the reference allocator, so
//! the graph allocator reproduces its decisions offset for offset (best fit with ties to the
//! higher address, the exact in-place conditions, the order of the three planning phases).
//! Where the reference aborts or silently corrupts memory we return an [`AllocError`] instead
//! and the allocator stays usable; where it has fixed capacities (256 free blocks, a hash set
//! sized at creation) our tables grow.
//!
//! Why offsets, not addresses: a tensor's storage is `(buffer, offset)` (see
//! [`graph::TensorStorage`]), so every allocator here works on byte offsets from the start of a
//! buffer and never needs a buffer's base address; device memory works the same as host memory.
//!
//! Per-tensor state lives in vectors indexed by [`graph::TensorId::index`] and stamped with a
//! planning epoch, so a planning pass starts in O(1) and, once the tables have grown to the
//! graph's size, neither planning nor applying a plan allocates on the heap.
//!
//! ```
//! use graph::{Context, ElementType, Graph};
//! use graph_alloc::GraphAllocator;
//!
//! let buft = backend_cpu::cpu_buffer_type(); // any BufferType works; the CPU's aligns to 64
//! let mut ctx = Context::new();
//! let a = ctx.new_tensor_1d(ElementType::F32, 100)?;
//! ctx.set_input(a)?;
//! let b = ctx.sqr(a)?;
//! let c = ctx.add(a, b)?;
//! let mut graph = Graph::new(16);
//! graph.build_forward_expand(&mut ctx, c)?;
//!
//! let mut galloc = GraphAllocator::new(&[buft]);
//! galloc.alloc_graph(&mut ctx, &graph)?; // plans on first use (one buffer type)
//! assert_eq!(ctx[a].storage().unwrap().offset, 0);
//! assert_eq!(ctx[b].storage().unwrap().offset, 448); // 400 bytes padded to 64
//! assert_eq!(ctx[c].storage().unwrap().offset, 0);   // in place over `a`
//! assert_eq!(galloc.buffer_size(0), 896);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dyn_alloc;
mod error;
mod gallocr;
mod linear;

pub use error::AllocError;
pub use gallocr::GraphAllocator;
pub use linear::{LinearAllocator, alloc_ctx_tensors};

/// `x` rounded up to a multiple of `align` (`GGML_PAD`); `None` on overflow. An alignment of 0
/// is treated as 1.
#[inline]
pub(crate) fn pad(x: usize, align: usize) -> Option<usize> {
    let a = align.max(1);
    if a.is_power_of_two() {
        // The usual alignment, rounded with a mask instead of a division. `x + a - 1`
        // overflows exactly when the rounded value does (`usize::MAX + 1` is a multiple of `a`).
        x.checked_add(a - 1).map(|v| v & !(a - 1))
    } else {
        x.checked_next_multiple_of(a)
    }
}

#[cfg(test)]
mod tests {
    use super::pad;

    #[test]
    fn pad_matches_next_multiple_of() {
        for align in [0, 1, 2, 3, 16, 24, 32, 4096, 1 << 40] {
            let a = usize::max(align, 1);
            for x in [
                0,
                1,
                a - 1,
                a,
                a + 1,
                1000,
                usize::MAX - a,
                usize::MAX - 1,
                usize::MAX,
            ] {
                assert_eq!(
                    pad(x, align),
                    x.checked_next_multiple_of(a),
                    "pad({x}, {align})"
                );
            }
        }
    }
}
