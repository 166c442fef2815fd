//! The tensor and compute-graph arena every other crate of the workspace builds on.
//!
//! * [`ElementType`]: ggml's element types with their ids, block sizes and byte sizes.
//! * [`Tensor`]: metadata (type, extents, byte strides, op, parameters, flags, sources, view
//!   root and offset, name) plus an opaque [`TensorStorage`] slot saying where its bytes live.
//! * [`Context`]: an arena of tensors addressed by typed [`TensorId`]s, with shape-checked op
//!   constructors that follow ggml's rules and return [`GraphError`] instead of aborting.
//! * [`Graph`]: nodes and leafs in ggml's build order.
//!
//! This crate knows nothing about backends or memory: `backend-core` implements
//! [`StorageBuffer`] for its buffers and fills the storage slot when it places a tensor.
//!
//! ```
//! use graph::{Context, ElementType, Graph, Op};
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor_2d(ElementType::F16, 64, 32)?;
//! let x = ctx.new_tensor_2d(ElementType::F32, 64, 4)?;
//! ctx.set_input(x)?;
//! let y = ctx.mul_mat(w, x)?;
//! let z = ctx.silu(y)?;
//! let mut g = Graph::default();
//! g.build_forward_expand(&mut ctx, z)?;
//! assert_eq!(g.n_nodes(), 2);
//! assert_eq!(ctx[g.nodes()[0]].op(), Op::MulMat);
//! # Ok::<(), graph::GraphError>(())
//! ```

mod cgraph;
mod context;
mod error;
mod op;
mod ops;
mod tensor;
mod types;

pub use cgraph::{DEFAULT_GRAPH_SIZE, Graph, GraphView};
pub use context::{Checkpoint, Context};
pub use error::GraphError;
pub use op::{MAX_OP_PARAMS, Op, OpParams, UnaryOp, rope_mode};
pub use ops::RopeParams;
pub use tensor::{
    MAX_DIMS, MAX_NAME, MAX_SRC, StorageBuffer, Tensor, TensorFlags, TensorId, TensorName,
    TensorStorage, checked_nbytes, contiguous_strides, nbytes,
};
pub use types::{ElementType, UnknownType};
