//! The error type of graph construction.

use crate::op::Op;
use crate::tensor::TensorId;
use crate::types::ElementType;

/// Why a tensor or graph could not be built. Nothing is changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The id belongs to a tensor dropped by [`crate::Context::rewind`], or to another context.
    #[error("stale or foreign tensor id {0:?}")]
    StaleId(TensorId),
    /// 0 or more than 4 dimensions, or a negative extent.
    #[error("invalid shape {ne:?}: {why}")]
    InvalidShape {
        /// Extents given.
        ne: Vec<i64>,
        /// What is wrong.
        why: &'static str,
    },
    /// The first extent of a block type is not a multiple of its block size.
    #[error("ne[0] = {ne0} is not a multiple of the block size {block} of {ty}")]
    BlockMisaligned {
        /// Type.
        ty: ElementType,
        /// First extent.
        ne0: i64,
        /// Block size.
        block: usize,
    },
    /// Operand shapes do not fit the op.
    #[error("{op}: {why} (a: {a:?}, b: {b:?})")]
    ShapeMismatch {
        /// The op being built.
        op: Op,
        /// Extents of the first operand.
        a: [i64; 4],
        /// Extents of the second operand (or of the requested result).
        b: [i64; 4],
        /// What is wrong.
        why: &'static str,
    },
    /// An operand has a type the op does not accept.
    #[error("{op}: unsupported operand type {ty} ({why})")]
    TypeMismatch {
        /// The op being built.
        op: Op,
        /// The offending type.
        ty: ElementType,
        /// What is expected.
        why: &'static str,
    },
    /// The op needs a contiguous operand.
    #[error("{op}: operand must be contiguous")]
    NotContiguous {
        /// The op being built.
        op: Op,
    },
    /// A view reaches past the end of its source.
    #[error("view of {size} bytes at offset {offset} exceeds its source of {src_size} bytes")]
    ViewOutOfRange {
        /// Bytes the view covers (contiguous size of its extents).
        size: usize,
        /// Offset inside the root.
        offset: usize,
        /// Bytes of the root.
        src_size: usize,
    },
    /// Permutation axes are not a permutation of 0..4.
    #[error("invalid permutation {0:?}")]
    BadPermutation([i32; 4]),
    /// An invalid op parameter (for example `max_bias > 0` without a mask).
    #[error("{op}: invalid parameter: {why}")]
    InvalidParam {
        /// The op being built.
        op: Op,
        /// What is wrong.
        why: &'static str,
    },
    /// An index given by the caller (a source slot, the end of a node range) is outside what
    /// it indexes.
    #[error("{what} {index} out of range (limit {limit})")]
    IndexOutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index given.
        index: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// The graph has no room for another node or leaf.
    #[error("graph capacity {capacity} exceeded ({what})")]
    GraphFull {
        /// Capacity of the graph (nodes and leafs each).
        capacity: usize,
        /// "nodes" or "leafs".
        what: &'static str,
    },
}
