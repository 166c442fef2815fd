//! The one table between our op and type enums and protocol 7.0.0's numbers.
//!
//! Why a table of its own: [`graph::Op::ggml_id`] follows the numbering of the reference the
//! workspace was written from, while protocol 7.0.0 is tied to a later ggml (101 ops, the
//! unary enum renumbered after `GELU_QUICK`/`EXPM1`/`SOFTPLUS` were added). A wrong number
//! here makes a real server compute the wrong function without any error, so every entry is
//! tested against the enum lists read from the real library. Anything not in the table is
//! unmappable: the client's `supports_op` says no and the server refuses it.

use graph::{ElementType, Op, UnaryOp};

/// `GGML_OP_UNARY` in protocol 7.0.0.
pub const WIRE_OP_UNARY: u32 = 91;

/// (our op, protocol 7.0.0 op id), unary ops excluded (they all travel as [`WIRE_OP_UNARY`]).
const OPS: &[(Op, u32)] = &[
    (Op::None, 0),
    (Op::Dup, 1),
    (Op::Add, 2),
    (Op::Sub, 6),
    (Op::Mul, 7),
    (Op::Div, 8),
    (Op::Sqr, 9),
    (Op::Sqrt, 10),
    (Op::Norm, 24),
    (Op::RmsNorm, 25),
    (Op::MulMat, 29),
    (Op::Scale, 32),
    (Op::Cpy, 34),
    (Op::Cont, 35),
    (Op::Reshape, 36),
    (Op::View, 37),
    (Op::Permute, 38),
    (Op::Transpose, 39),
    (Op::GetRows, 40),
    (Op::SoftMax, 46),
    (Op::Rope, 48),
];

/// (our unary op, protocol 7.0.0 `ggml_unary_op` id).
const UNARY: &[(UnaryOp, i32)] = &[
    (UnaryOp::Abs, 0),
    (UnaryOp::Neg, 2),
    (UnaryOp::Tanh, 4),
    (UnaryOp::Relu, 6),
    (UnaryOp::Sigmoid, 7),
    (UnaryOp::Gelu, 8),
    (UnaryOp::Silu, 10),
    (UnaryOp::Exp, 13),
    (UnaryOp::GeluErf, 16),
];

/// The wire op id of `op`, and for a unary op the sub-op id that goes in `op_params[0]`.
/// `None` when the protocol has no number for it.
///
/// ```
/// use backend_rpc::mapping::op_to_wire;
/// use graph::{Op, UnaryOp};
/// assert_eq!(op_to_wire(Op::MulMat), Some((29, None)));
/// assert_eq!(op_to_wire(Op::Unary(UnaryOp::GeluErf)), Some((91, Some(16))));
/// ```
pub fn op_to_wire(op: Op) -> Option<(u32, Option<i32>)> {
    if let Op::Unary(u) = op {
        return unary_to_wire(u).map(|id| (WIRE_OP_UNARY, Some(id)));
    }
    OPS.iter()
        .find(|(o, _)| *o == op)
        .map(|&(_, id)| (id, None))
}

/// Our op for wire op `id` with `op_params[0] = param0` (needed for UNARY).
///
/// ```
/// use backend_rpc::mapping::op_from_wire;
/// use graph::{Op, UnaryOp};
/// assert_eq!(op_from_wire(2, 0), Some(Op::Add));
/// assert_eq!(op_from_wire(91, 10), Some(Op::Unary(UnaryOp::Silu)));
/// assert_eq!(op_from_wire(91, 14), None); // EXPM1: no such op here
/// assert_eq!(op_from_wire(74, 0), None);  // FLASH_ATTN_EXT
/// ```
pub fn op_from_wire(id: u32, param0: i32) -> Option<Op> {
    if id == WIRE_OP_UNARY {
        return unary_from_wire(param0).map(Op::Unary);
    }
    OPS.iter().find(|&&(_, w)| w == id).map(|&(o, _)| o)
}

/// The protocol's unary sub-op id.
pub fn unary_to_wire(u: UnaryOp) -> Option<i32> {
    UNARY.iter().find(|(o, _)| *o == u).map(|&(_, id)| id)
}

/// Our unary op for the protocol's sub-op id.
pub fn unary_from_wire(id: i32) -> Option<UnaryOp> {
    UNARY.iter().find(|&&(_, w)| w == id).map(|&(u, _)| u)
}

/// The wire type id (our ids are ggml's).
pub fn type_to_wire(ty: ElementType) -> u32 {
    ty as u32
}

/// Our element type for a wire type id, if we have it.
///
/// ```
/// use backend_rpc::mapping::type_from_wire;
/// use graph::ElementType;
/// assert_eq!(type_from_wire(30), Some(ElementType::BF16));
/// assert_eq!(type_from_wire(4), None);  // removed from ggml; block size 0
/// assert_eq!(type_from_wire(39), None); // MXFP4: not supported here
/// ```
pub fn type_from_wire(id: u32) -> Option<ElementType> {
    ElementType::from_id(id)
}
