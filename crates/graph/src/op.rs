//! Operations and their parameters.
//!
//! [`Op`] names what produces a tensor. Parameters live in a raw 64-byte block laid out exactly
//! like ggml's `op_params` (16 × i32, floats stored by bit pattern, a view's byte offset as a u64
//! in the first eight bytes), because backends that speak ggml's wire formats (RPC) send that block
//! as is. Typed accessors on [`crate::Tensor`] read it back.

use std::fmt;

/// The operation that produces a tensor (`ggml_op`). `None` marks leafs: weights, inputs,
/// constants.
///
/// ```
/// use graph::{Op, UnaryOp};
/// assert_eq!(Op::MulMat.name(), "MUL_MAT");
/// assert!(Op::Permute.is_view_op());
/// assert!(Op::Unary(UnaryOp::Silu).can_inplace());
/// assert_eq!(Op::from_name("UNARY"), None); // a unary op needs its kind: use UnaryOp
/// assert_eq!(Op::from_name("SOFT_MAX"), Some(Op::SoftMax));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// No op: a leaf (or a parameter).
    None,
    /// Copy into a new contiguous tensor of the same type.
    Dup,
    /// Elementwise add, `b` broadcast over `a`.
    Add,
    /// Elementwise subtract, `b` broadcast over `a`.
    Sub,
    /// Elementwise multiply, `b` broadcast over `a`.
    Mul,
    /// Elementwise divide, `b` broadcast over `a`.
    Div,
    /// Elementwise square.
    Sqr,
    /// Elementwise square root.
    Sqrt,
    /// Layer normalisation over rows (mean and variance), parameter `eps`.
    Norm,
    /// RMS normalisation over rows, parameter `eps`.
    RmsNorm,
    /// Matrix product: result `[a.ne1, b.ne1, b.ne2, b.ne3]`, rows of `a` dotted with rows of `b`.
    MulMat,
    /// Multiply by a scalar.
    Scale,
    /// Copy `a` into (a view of) `b`, converting types.
    Cpy,
    /// Copy into a new contiguous tensor.
    Cont,
    /// A reshaped view (no computation).
    Reshape,
    /// A strided view (no computation).
    View,
    /// A permuted view (no computation).
    Permute,
    /// A transposed view (no computation).
    Transpose,
    /// Gather rows of `a` selected by an i32 index tensor.
    GetRows,
    /// Softmax over rows with scale, optional mask and ALiBi bias.
    SoftMax,
    /// Rotary position embedding.
    Rope,
    /// An elementwise unary function.
    Unary(UnaryOp),
}

/// Elementwise unary functions (`ggml_unary_op`), numbered as in ggml.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnaryOp {
    /// |x|
    Abs,
    /// -x
    Neg,
    /// tanh(x)
    Tanh,
    /// max(x, 0)
    Relu,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// GELU, ggml's tanh approximation.
    Gelu,
    /// x · sigmoid(x)
    Silu,
    /// e^x
    Exp,
    /// GELU in its exact form, 0.5·x·(1 + erf(x/√2)).
    GeluErf,
}

impl UnaryOp {
    /// ggml's unary op id (NOV24 numbering; `GeluErf` uses the id later ggml versions gave it).
    pub const fn id(self) -> i32 {
        match self {
            UnaryOp::Abs => 0,
            UnaryOp::Neg => 2,
            UnaryOp::Tanh => 4,
            UnaryOp::Relu => 6,
            UnaryOp::Sigmoid => 7,
            UnaryOp::Gelu => 8,
            UnaryOp::Silu => 10,
            UnaryOp::Exp => 13,
            UnaryOp::GeluErf => 14,
        }
    }

    /// The unary op with ggml id `id`.
    pub fn from_id(id: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.id() == id)
    }

    /// Every unary op.
    pub const ALL: [UnaryOp; 9] = [
        UnaryOp::Abs,
        UnaryOp::Neg,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Silu,
        UnaryOp::Exp,
        UnaryOp::GeluErf,
    ];

    /// ggml's name (`ggml_unary_op_name`).
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Abs => "ABS",
            UnaryOp::Neg => "NEG",
            UnaryOp::Tanh => "TANH",
            UnaryOp::Relu => "RELU",
            UnaryOp::Sigmoid => "SIGMOID",
            UnaryOp::Gelu => "GELU",
            UnaryOp::Silu => "SILU",
            UnaryOp::Exp => "EXP",
            UnaryOp::GeluErf => "GELU_ERF",
        }
    }

    /// The unary op named `name` (case-sensitive, ggml's spelling).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.name() == name)
    }
}

impl Op {
    /// ggml's op name (`ggml_op_name`), e.g. `"MUL_MAT"`; every unary op is `"UNARY"`.
    pub const fn name(self) -> &'static str {
        match self {
            Op::None => "NONE",
            Op::Dup => "DUP",
            Op::Add => "ADD",
            Op::Sub => "SUB",
            Op::Mul => "MUL",
            Op::Div => "DIV",
            Op::Sqr => "SQR",
            Op::Sqrt => "SQRT",
            Op::Norm => "NORM",
            Op::RmsNorm => "RMS_NORM",
            Op::MulMat => "MUL_MAT",
            Op::Scale => "SCALE",
            Op::Cpy => "CPY",
            Op::Cont => "CONT",
            Op::Reshape => "RESHAPE",
            Op::View => "VIEW",
            Op::Permute => "PERMUTE",
            Op::Transpose => "TRANSPOSE",
            Op::GetRows => "GET_ROWS",
            Op::SoftMax => "SOFT_MAX",
            Op::Rope => "ROPE",
            Op::Unary(_) => "UNARY",
        }
    }

    /// ggml's op number in the NOV24 numbering (the reference's `enum ggml_op`).
    pub const fn ggml_id(self) -> u32 {
        match self {
            Op::None => 0,
            Op::Dup => 1,
            Op::Add => 2,
            Op::Sub => 5,
            Op::Mul => 6,
            Op::Div => 7,
            Op::Sqr => 8,
            Op::Sqrt => 9,
            Op::Norm => 22,
            Op::RmsNorm => 23,
            Op::MulMat => 26,
            Op::Scale => 29,
            Op::Cpy => 31,
            Op::Cont => 32,
            Op::Reshape => 33,
            Op::View => 34,
            Op::Permute => 35,
            Op::Transpose => 36,
            Op::GetRows => 37,
            Op::SoftMax => 42,
            Op::Rope => 44,
            Op::Unary(_) => 69,
        }
    }

    /// Every op without a parameter in its variant, plus `Unary(Silu)` standing for UNARY.
    pub const ALL: [Op; 22] = [
        Op::None,
        Op::Dup,
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Sqr,
        Op::Sqrt,
        Op::Norm,
        Op::RmsNorm,
        Op::MulMat,
        Op::Scale,
        Op::Cpy,
        Op::Cont,
        Op::Reshape,
        Op::View,
        Op::Permute,
        Op::Transpose,
        Op::GetRows,
        Op::SoftMax,
        Op::Rope,
        Op::Unary(UnaryOp::Silu),
    ];

    /// The op named `name` (ggml's spelling). `"UNARY"` is ambiguous and returns `None`;
    /// compare with [`Op::name`] instead when a whole class is meant.
    pub fn from_name(name: &str) -> Option<Self> {
        if name == "UNARY" {
            return None;
        }
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    /// `VIEW`, `RESHAPE`, `PERMUTE`, `TRANSPOSE`: ops that compute nothing (`ggml_is_view_op`).
    pub const fn is_view_op(self) -> bool {
        matches!(self, Op::View | Op::Reshape | Op::Permute | Op::Transpose)
    }

    /// Ops whose result may share memory with a same-layout source (`ggml_op_can_inplace`,
    /// the NOV24 list restricted to the ops this crate has).
    pub const fn can_inplace(self) -> bool {
        matches!(
            self,
            Op::Scale
                | Op::Add
                | Op::Sub
                | Op::Mul
                | Op::Div
                | Op::Sqr
                | Op::Sqrt
                | Op::Unary(_)
                | Op::Rope
                | Op::RmsNorm
                | Op::SoftMax
        )
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Number of 32-bit parameter slots (`GGML_MAX_OP_PARAMS / 4`).
pub const MAX_OP_PARAMS: usize = 16;

/// ggml's raw operator parameter block: 16 × i32, floats by bit pattern.
///
/// The accessors index the array: a slot past [`MAX_OP_PARAMS`] (for the u64 pair, past
/// `MAX_OP_PARAMS - 1`) panics, as indexing `.0` would; ops use fixed slots (constants in the
/// library), and `.0.get(i)` is the checked form.
///
/// ```
/// use graph::OpParams;
/// let mut p = OpParams::default();
/// p.set_f32(1, 0.5);
/// p.set_u64(2, 1 << 40);
/// assert_eq!(p.f32(1), 0.5);
/// assert_eq!(p.u64(2), 1 << 40);
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct OpParams(pub [i32; MAX_OP_PARAMS]);

impl OpParams {
    /// Slot `i` as an i32.
    pub fn i32(&self, i: usize) -> i32 {
        self.0[i]
    }
    /// Set slot `i`.
    pub fn set_i32(&mut self, i: usize, v: i32) {
        self.0[i] = v;
    }
    /// Slot `i` as an f32 bit pattern.
    pub fn f32(&self, i: usize) -> f32 {
        f32::from_bits(self.0[i] as u32)
    }
    /// Store `v`'s bit pattern in slot `i`.
    pub fn set_f32(&mut self, i: usize, v: f32) {
        self.0[i] = v.to_bits() as i32;
    }
    /// Slots `i`, `i + 1` as a little-endian u64 (how ggml stores a view's `size_t` offset).
    pub fn u64(&self, i: usize) -> u64 {
        (self.0[i] as u32 as u64) | ((self.0[i + 1] as u32 as u64) << 32)
    }
    /// Store `v` in slots `i`, `i + 1`.
    pub fn set_u64(&mut self, i: usize, v: u64) {
        self.0[i] = v as u32 as i32;
        self.0[i + 1] = (v >> 32) as u32 as i32;
    }
    /// The block as bytes, in ggml's in-memory (little-endian) layout.
    pub fn to_bytes(&self) -> [u8; MAX_OP_PARAMS * 4] {
        let mut out = [0u8; MAX_OP_PARAMS * 4];
        for (chunk, v) in out.chunks_exact_mut(4).zip(self.0) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }
    /// The block from bytes in ggml's layout.
    pub fn from_bytes(bytes: &[u8; MAX_OP_PARAMS * 4]) -> Self {
        let mut p = [0i32; MAX_OP_PARAMS];
        for (v, chunk) in p.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        OpParams(p)
    }
}

/// Rotary embedding modes (`mode` of ROPE).
pub mod rope_mode {
    /// Rotate adjacent pairs (x0, x1), (x2, x3), …
    pub const NORMAL: i32 = 0;
    /// Rotate pairs half a rotation apart (x0, x_{n/2}), … (GPT-NeoX).
    pub const NEOX: i32 = 2;
}
