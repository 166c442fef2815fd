//! Copy a graph onto another backend, and compare two backends node by node
//! (`ggml_backend_graph_copy`, `ggml_backend_compare_graph_backend`).
//!
//! # Where the copies live: a new `Context`, same ids
//!
//! ggml duplicates every tensor into two fresh contexts and keeps a hash map from original to
//! copy. Here the copy is a clone of the whole [`graph::Context`] in which every tensor reachable from
//! the graph gets new storage and every other tensor gets none. Because the clone keeps the
//! arena's order, **a tensor's [`graph::TensorId`] names its copy too**: no id map, the original
//! [`graph::Graph`] (cloned) is the copy's graph, sharing is preserved by construction (a tensor
//! reached twice is one arena slot, copied once), and views keep their `view_src` and offset,
//! so they are rebuilt on their copied roots with [`backend_core::view_init`]. The alternative, appending
//! copies to the caller's context, would need `&mut` access to it, mix the copy's lifetime
//! with the caller's tensors and require an id map; a separate context is dropped as a whole.
//! The price is cloning the metadata of tensors outside the graph too (a few hundred bytes
//! each, no data).
//!
//! Every copied tensor that is not a view is placed in **one** new buffer of the target buffer
//! type, at offsets aligned to that type, in first-reached order; the data is then copied
//! (through host memory, since the two sides may be any pair of devices). If the buffer cannot
//! be allocated, [`GraphCopyError::Allocation`] comes back and nothing is left behind: the
//! buffer and the new context are owned values dropped on the error path.
//!
//! A copy larger than the buffer type's maximum buffer size is split over several buffers,
//! as ggml splits it: the same order goes through `graph_alloc::alloc_ctx_tensors`, which
//! starts a new buffer whenever the next tensor would not fit, and the copy holds them as one
//! multi-buffer ([`GraphCopy::buffers`] lists them). Why reuse it rather than lay out the split
//! here: weights and copies then split by one rule, tested in one place. A single tensor larger
//! than the maximum fits no split: [`GraphCopyError::TensorTooLarge`].
//!
//! ```
//! use backend_core::{tensor_alloc, tensor_get, tensor_set};
//! use graph::{Context, ElementType, Graph};
//! use test_device::{TestDevice, TestDeviceConfig};
//!
//! let a = TestDevice::create(TestDeviceConfig::named("A"))?;
//! let b = TestDevice::create(TestDeviceConfig::named("B"))?;
//! let mut ctx = Context::new();
//! let x = ctx.new_tensor_1d(ElementType::F32, 4)?;
//! let y = ctx.scale(x, 2.0)?;
//! let mut g = Graph::new(8);
//! g.build_forward_expand(&mut ctx, y)?;
//! let buf = a.buffer_type().alloc_buffer(1024)?;
//! tensor_alloc(&mut ctx, &buf, x, 0)?;
//! tensor_alloc(&mut ctx, &buf, y, 128)?;
//! tensor_set(&ctx, x, 0, &[1u8; 16])?;
//!
//! let copy = graph_copy::graph_copy(&ctx, &g, &b.buffer_type())?;
//! assert_eq!(copy.graph().nodes(), g.nodes());          // same ids
//! assert_eq!(copy.buffer().buffer_type(), &b.buffer_type());
//! let mut back = [0u8; 16];
//! tensor_get(copy.ctx(), x, 0, &mut back)?;            // data came along
//! assert_eq!(back, [1u8; 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod compare;
mod copy;

pub use compare::{
    CompareReport, GuardViolation, NodeComparison, Unsupported, compare_graph_backends,
    compare_graph_backends_with,
};
pub use copy::{CopyOptions, GraphCopy, GraphCopyError, graph_copy, graph_copy_with};
