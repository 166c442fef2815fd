//! Shape-checked op constructors, with ggml's result types, shapes, op parameters and names.
//!
//! Each constructor validates before it creates anything, so an `Err` leaves the context as
//! it was. Constructors whose result is a storage view (the view ops, `cpy`, the `_inplace`
//! variants) record the root and offset exactly as ggml does, because the allocators decide
//! sharing and lifetimes from them.

use std::fmt::Write;

use crate::context::Context;
use crate::error::GraphError;
use crate::op::{Op, UnaryOp};
use crate::tensor::{MAX_DIMS, TensorId, TensorName};
use crate::types::ElementType;

/// Parameters of a rotary embedding beyond `n_dims` and `mode` (`ggml_rope_ext`'s extras).
/// The default is what plain `ggml_rope` uses.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RopeParams {
    /// Context size the model was trained with (YaRN); 0 for plain RoPE.
    pub n_ctx_orig: i32,
    /// Base of the frequencies.
    pub freq_base: f32,
    /// Position scale (linear scaling).
    pub freq_scale: f32,
    /// YaRN extrapolation mix factor.
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dimension.
    pub beta_fast: f32,
    /// YaRN high correction dimension.
    pub beta_slow: f32,
}

impl Default for RopeParams {
    fn default() -> Self {
        RopeParams {
            n_ctx_orig: 0,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        }
    }
}

impl Context {
    fn set_op(&mut self, id: TensorId, op: Op, srcs: &[Option<TensorId>]) {
        let t = &mut self[id];
        t.op = op;
        for (slot, s) in t.src.iter_mut().zip(srcs) {
            *slot = *s;
        }
        t.refresh_n_src();
    }

    fn name_from(&mut self, id: TensorId, src: TensorId, suffix: &str) {
        let mut name = TensorName::EMPTY;
        let _ = write!(name, "{}{}", self[src].name(), suffix);
        self[id].name = name;
    }

    /// A new contiguous tensor with `a`'s type and extents (`ggml_dup_tensor`).
    fn dup_tensor(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let (ty, ne) = {
            let t = self.check(a)?;
            (t.ty, t.ne)
        };
        self.new_impl(ty, &ne, None)
    }

    /// A view of all of `a` with `a`'s strides and no op (`ggml_view_tensor`); the scheduler
    /// uses these as dependency nodes.
    ///
    /// ```
    /// use graph::{Context, ElementType, Op};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_2d(ElementType::F32, 4, 4)?;
    /// ctx.set_name(a, "a")?;
    /// let v = ctx.view_tensor(a)?;
    /// assert_eq!(ctx[v].op(), Op::None);
    /// assert_eq!(ctx[v].view_src(), Some(a));
    /// assert_eq!(ctx[v].name(), "a (view)");
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn view_tensor(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let (ty, ne, nb) = {
            let t = self.check(a)?;
            (t.ty, t.ne, t.nb)
        };
        let id = self.new_impl(ty, &ne, Some((a, 0)))?;
        self[id].nb = nb;
        self[id].refresh_nbytes();
        self.name_from(id, a, " (view)");
        Ok(id)
    }

    fn result_of(&mut self, a: TensorId, inplace: bool) -> Result<TensorId, GraphError> {
        if inplace {
            self.view_tensor(a)
        } else {
            self.dup_tensor(a)
        }
    }

    fn binary(
        &mut self,
        op: Op,
        a: TensorId,
        b: TensorId,
        inplace: bool,
    ) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let tb = self.check(b)?;
        if !tb.can_repeat(ta) {
            return Err(GraphError::ShapeMismatch {
                op,
                a: ta.ne,
                b: tb.ne,
                why: "b cannot be broadcast over a",
            });
        }
        let r = self.result_of(a, inplace)?;
        self.set_op(r, op, &[Some(a), Some(b)]);
        Ok(r)
    }

    /// `a + b`, `b` broadcast over `a` (each extent of `a` a multiple of `b`'s).
    ///
    /// ```
    /// use graph::{Context, ElementType, GraphError};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_2d(ElementType::F32, 8, 4)?;
    /// let b = ctx.new_tensor_1d(ElementType::F32, 8)?;
    /// let c = ctx.add(a, b)?;
    /// assert_eq!(ctx[c].ne(), [8, 4, 1, 1]);
    /// // a cannot be broadcast over b
    /// let r = ctx.add(b, a);
    /// assert!(matches!(r, Err(GraphError::ShapeMismatch { .. })), "{r:?}");
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Add, a, b, false)
    }
    /// `a + b` written over `a`.
    pub fn add_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Add, a, b, true)
    }
    /// `a - b`, `b` broadcast over `a`.
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Sub, a, b, false)
    }
    /// `a - b` written over `a`.
    pub fn sub_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Sub, a, b, true)
    }
    /// `a * b`, `b` broadcast over `a`.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Mul, a, b, false)
    }
    /// `a * b` written over `a`.
    pub fn mul_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Mul, a, b, true)
    }
    /// `a / b`, `b` broadcast over `a`.
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Div, a, b, false)
    }
    /// `a / b` written over `a`.
    pub fn div_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Div, a, b, true)
    }

    fn simple_unary(&mut self, op: Op, a: TensorId, inplace: bool) -> Result<TensorId, GraphError> {
        self.check(a)?;
        let r = self.result_of(a, inplace)?;
        self.set_op(r, op, &[Some(a)]);
        Ok(r)
    }

    /// Elementwise square.
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.simple_unary(Op::Sqr, a, false)
    }
    /// Elementwise square written over `a`.
    pub fn sqr_inplace(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.simple_unary(Op::Sqr, a, true)
    }
    /// Elementwise square root.
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.simple_unary(Op::Sqrt, a, false)
    }
    /// Elementwise square root written over `a`.
    pub fn sqrt_inplace(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.simple_unary(Op::Sqrt, a, true)
    }

    fn scale_impl(&mut self, a: TensorId, s: f32, inplace: bool) -> Result<TensorId, GraphError> {
        self.check(a)?;
        if !self[a].is_contiguous_rows() {
            return Err(GraphError::NotContiguous { op: Op::Scale });
        }
        let r = self.result_of(a, inplace)?;
        self.set_op(r, Op::Scale, &[Some(a)]);
        self[r].op_params.set_f32(0, s);
        Ok(r)
    }

    /// `a * s` for a scalar `s` (parameter slot 0).
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId, GraphError> {
        self.scale_impl(a, s, false)
    }
    /// `a * s` written over `a`.
    pub fn scale_inplace(&mut self, a: TensorId, s: f32) -> Result<TensorId, GraphError> {
        self.scale_impl(a, s, true)
    }

    fn norm_impl(
        &mut self,
        op: Op,
        a: TensorId,
        eps: f32,
        inplace: bool,
    ) -> Result<TensorId, GraphError> {
        self.check(a)?;
        if eps.is_nan() || eps < 0.0 {
            return Err(GraphError::InvalidParam {
                op,
                why: "eps must be >= 0",
            });
        }
        let r = self.result_of(a, inplace)?;
        self.set_op(r, op, &[Some(a)]);
        self[r].op_params.set_f32(0, eps);
        Ok(r)
    }

    /// Normalise each row to zero mean and unit variance (`ggml_norm`).
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.norm_impl(Op::Norm, a, eps, false)
    }
    /// `norm` written over `a`.
    pub fn norm_inplace(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.norm_impl(Op::Norm, a, eps, true)
    }
    /// Divide each row by its root mean square (`ggml_rms_norm`).
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.norm_impl(Op::RmsNorm, a, eps, false)
    }
    /// `rms_norm` written over `a`.
    pub fn rms_norm_inplace(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.norm_impl(Op::RmsNorm, a, eps, true)
    }

    /// Matrix product (`ggml_mul_mat`): result F32 `[a.ne1, b.ne1, b.ne2, b.ne3]`;
    /// `a.ne0 == b.ne0`, `b.ne2`, `b.ne3` multiples of `a`'s (broadcast), `a` not transposed.
    ///
    /// ```
    /// use graph::{Context, ElementType};
    /// let mut ctx = Context::new();
    /// let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 16)?;
    /// let x = ctx.new_tensor_2d(ElementType::F32, 64, 3)?;
    /// let y = ctx.mul_mat(w, x)?;
    /// assert_eq!(ctx[y].ne(), [16, 3, 1, 1]);
    /// assert_eq!(ctx[y].ty(), ElementType::F32);
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let tb = self.check(b)?;
        let (na, nb_) = (ta.ne, tb.ne);
        if na[0] != nb_[0] || na[2] == 0 || na[3] == 0 || nb_[2] % na[2] != 0 || nb_[3] % na[3] != 0
        {
            return Err(GraphError::ShapeMismatch {
                op: Op::MulMat,
                a: na,
                b: nb_,
                why: "need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a's",
            });
        }
        if ta.is_transposed() {
            return Err(GraphError::ShapeMismatch {
                op: Op::MulMat,
                a: na,
                b: nb_,
                why: "a must not be transposed",
            });
        }
        let r = self.new_impl(ElementType::F32, &[na[1], nb_[1], nb_[2], nb_[3]], None)?;
        self.set_op(r, Op::MulMat, &[Some(a), Some(b)]);
        Ok(r)
    }

    /// Gather rows of `a` by the i32 indices in `rows` (`ggml_get_rows`): result
    /// `[a.ne0, rows.ne0, rows.ne1, rows.ne2]`, F32 (I32 when `a` is I32).
    pub fn get_rows(&mut self, a: TensorId, rows: TensorId) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let tb = self.check(rows)?;
        if tb.ty != ElementType::I32 {
            return Err(GraphError::TypeMismatch {
                op: Op::GetRows,
                ty: tb.ty,
                why: "row indices must be i32",
            });
        }
        // (ggml's checks; the CPU kernel, which reads row `rows[i0, i1, i2]` of `a`'s matrix
        // `(i1, i2)`, also needs a.ne3 == rows.ne2 and refuses the node otherwise)
        if ta.ne[2] != tb.ne[1] || tb.ne[3] != 1 {
            return Err(GraphError::ShapeMismatch {
                op: Op::GetRows,
                a: ta.ne,
                b: tb.ne,
                why: "need a.ne2 == rows.ne1 and rows.ne3 == 1",
            });
        }
        let ty = if ta.ty == ElementType::I32 {
            ElementType::I32
        } else {
            ElementType::F32
        };
        let ne = [ta.ne[0], tb.ne[0], tb.ne[1], tb.ne[2]];
        let r = self.new_impl(ty, &ne, None)?;
        self.set_op(r, Op::GetRows, &[Some(a), Some(rows)]);
        Ok(r)
    }

    /// Softmax over rows (`ggml_soft_max`).
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.soft_max_impl(a, None, 1.0, 0.0, false)
    }

    /// `soft_max(a * scale + mask + alibi)` (`ggml_soft_max_ext`). The mask is F32 or F16,
    /// contiguous, `mask.ne0 == a.ne0`, `mask.ne1 >= a.ne1`, and broadcast over `a`'s
    /// dimensions 2 and 3. `max_bias > 0` (ALiBi) needs a mask.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId, GraphError> {
        self.soft_max_impl(a, mask, scale, max_bias, false)
    }

    /// `soft_max_ext` written over `a`.
    pub fn soft_max_ext_inplace(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId, GraphError> {
        self.soft_max_impl(a, mask, scale, max_bias, true)
    }

    fn soft_max_impl(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        inplace: bool,
    ) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        if !ta.is_contiguous() {
            return Err(GraphError::NotContiguous { op: Op::SoftMax });
        }
        if let Some(m) = mask {
            let tm = self.check(m)?;
            if tm.ty != ElementType::F32 && tm.ty != ElementType::F16 {
                return Err(GraphError::TypeMismatch {
                    op: Op::SoftMax,
                    ty: tm.ty,
                    why: "mask must be f32 or f16",
                });
            }
            if !tm.is_contiguous() {
                return Err(GraphError::NotContiguous { op: Op::SoftMax });
            }
            if tm.ne[0] != ta.ne[0]
                || tm.ne[1] < ta.ne[1]
                || tm.ne[2] == 0
                || tm.ne[3] == 0
                || ta.ne[2] % tm.ne[2] != 0
                || ta.ne[3] % tm.ne[3] != 0
            {
                return Err(GraphError::ShapeMismatch {
                    op: Op::SoftMax,
                    a: ta.ne,
                    b: tm.ne,
                    why: "mask needs ne0 == a.ne0, ne1 >= a.ne1, and to broadcast over ne2, ne3",
                });
            }
        }
        if max_bias > 0.0 && mask.is_none() {
            return Err(GraphError::InvalidParam {
                op: Op::SoftMax,
                why: "max_bias > 0 needs a mask",
            });
        }
        let r = self.result_of(a, inplace)?;
        self.set_op(r, Op::SoftMax, &[Some(a), mask]);
        self[r].op_params.set_f32(0, scale);
        self[r].op_params.set_f32(1, max_bias);
        Ok(r)
    }

    /// Rotary embedding (`ggml_rope`) with default frequency parameters.
    pub fn rope(
        &mut self,
        a: TensorId,
        pos: TensorId,
        n_dims: i32,
        mode: i32,
    ) -> Result<TensorId, GraphError> {
        self.rope_ext(a, pos, n_dims, mode, RopeParams::default())
    }

    /// Rotary embedding with every parameter (`ggml_rope_ext` without frequency factors).
    /// `pos` is an i32 vector with one position per `a.ne2`. Parameters are stored in ggml's
    /// slots: 1 n_dims, 2 mode, 4 n_ctx_orig, 5..=10 the floats of [`RopeParams`] in order.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        n_dims: i32,
        mode: i32,
        p: RopeParams,
    ) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let tp = self.check(pos)?;
        if tp.ty != ElementType::I32 {
            return Err(GraphError::TypeMismatch {
                op: Op::Rope,
                ty: tp.ty,
                why: "positions must be i32",
            });
        }
        if tp.ne[1] != 1 || tp.ne[2] != 1 || tp.ne[3] != 1 || ta.ne[2] != tp.ne[0] {
            return Err(GraphError::ShapeMismatch {
                op: Op::Rope,
                a: ta.ne,
                b: tp.ne,
                why: "positions must be a vector of a.ne2 entries",
            });
        }
        if n_dims <= 0 || n_dims as i64 > ta.ne[0] || n_dims % 2 != 0 {
            return Err(GraphError::InvalidParam {
                op: Op::Rope,
                why: "n_dims must be even, positive and at most a.ne0",
            });
        }
        let r = self.dup_tensor(a)?;
        self.set_op(r, Op::Rope, &[Some(a), Some(pos)]);
        let params = &mut self[r].op_params;
        params.set_i32(1, n_dims);
        params.set_i32(2, mode);
        params.set_i32(4, p.n_ctx_orig);
        params.set_f32(5, p.freq_base);
        params.set_f32(6, p.freq_scale);
        params.set_f32(7, p.ext_factor);
        params.set_f32(8, p.attn_factor);
        params.set_f32(9, p.beta_fast);
        params.set_f32(10, p.beta_slow);
        Ok(r)
    }

    fn unary_impl(
        &mut self,
        a: TensorId,
        u: UnaryOp,
        inplace: bool,
    ) -> Result<TensorId, GraphError> {
        if !self.check(a)?.is_contiguous_n(1) {
            return Err(GraphError::NotContiguous { op: Op::Unary(u) });
        }
        let r = self.result_of(a, inplace)?;
        self.set_op(r, Op::Unary(u), &[Some(a)]);
        self[r].op_params.set_i32(0, u.id());
        Ok(r)
    }

    /// An elementwise unary function (`ggml_unary`); the id goes to parameter slot 0.
    pub fn unary(&mut self, a: TensorId, u: UnaryOp) -> Result<TensorId, GraphError> {
        self.unary_impl(a, u, false)
    }
    /// A unary function written over `a`.
    pub fn unary_inplace(&mut self, a: TensorId, u: UnaryOp) -> Result<TensorId, GraphError> {
        self.unary_impl(a, u, true)
    }
    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Silu)
    }
    /// GELU (tanh approximation).
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Gelu)
    }
    /// GELU in the exact erf form.
    pub fn gelu_erf(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::GeluErf)
    }
    /// `max(x, 0)`.
    pub fn relu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Relu)
    }

    /// A contiguous copy of `a` (`ggml_cont`), named `"<a> (cont)"`.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.check(a)?;
        let r = self.dup_tensor(a)?;
        self.set_op(r, Op::Cont, &[Some(a)]);
        self.name_from(r, a, " (cont)");
        Ok(r)
    }

    /// A contiguous copy of `a` with new extents (`ggml_cont_4d` and friends).
    pub fn cont_shape(&mut self, a: TensorId, ne: &[i64]) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let (ty, ane, n) = (ta.ty, ta.ne, ta.nelements());
        if checked_count(ne) != Some(n) {
            let mut b = [1i64; MAX_DIMS];
            for (d, &v) in b.iter_mut().zip(ne) {
                *d = v;
            }
            return Err(GraphError::ShapeMismatch {
                op: Op::Cont,
                a: ane,
                b,
                why: "element counts differ",
            });
        }
        let r = self.new_impl(ty, ne, None)?;
        self.set_op(r, Op::Cont, &[Some(a)]);
        self.name_from(r, a, " (cont)");
        Ok(r)
    }

    /// A copy of `a` (`ggml_dup`).
    pub fn dup(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.simple_unary(Op::Dup, a, false)
    }

    /// Copy `a` into `b` (`ggml_cpy`): the result is a view of `b` with op CPY, sources
    /// `[a, b]`; element counts must match; types may differ (conversion).
    ///
    /// ```
    /// use graph::{Context, ElementType, Op};
    /// let mut ctx = Context::new();
    /// let cache = ctx.new_tensor_1d(ElementType::F16, 64)?;
    /// ctx.set_name(cache, "k")?;
    /// let slot = ctx.view_1d(cache, 16, 32)?;
    /// let x = ctx.new_tensor_1d(ElementType::F32, 16)?;
    /// ctx.set_name(x, "x")?;
    /// let c = ctx.cpy(x, slot)?;
    /// assert_eq!(ctx[c].op(), Op::Cpy);
    /// assert_eq!(ctx[c].view_src(), Some(cache));
    /// assert_eq!(ctx[c].view_offs(), 32);
    /// assert_eq!(ctx[c].name(), "k (view) (copy of x)");
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        let tb = self.check(b)?;
        if ta.nelements() != tb.nelements() {
            return Err(GraphError::ShapeMismatch {
                op: Op::Cpy,
                a: ta.ne,
                b: tb.ne,
                why: "element counts differ",
            });
        }
        let r = self.view_tensor(b)?;
        let mut name = TensorName::EMPTY;
        if self[b].name().is_empty() {
            let _ = write!(name, "{} (copy)", self[a].name());
        } else {
            let _ = write!(name, "{} (copy of {})", self[b].name(), self[a].name());
        }
        self[r].name = name;
        self.set_op(r, Op::Cpy, &[Some(a), Some(b)]);
        Ok(r)
    }
}

/// The element count of extents `ne`, `None` when the product overflows (then it matches no
/// tensor's count).
fn checked_count(ne: &[i64]) -> Option<i64> {
    ne.iter().try_fold(1i64, |acc, &n| acc.checked_mul(n))
}

/// `stride * ne` as the next stride of a `view_Nd`, overflow being a view out of range
/// (negative extents count as 0 here; the constructor refuses them).
fn checked_stride(stride: usize, ne: i64, offset: usize) -> Result<usize, GraphError> {
    stride
        .checked_mul(ne.max(0) as usize)
        .ok_or(GraphError::ViewOutOfRange {
            size: usize::MAX,
            offset,
            src_size: 0,
        })
}

impl Context {
    fn view_impl(
        &mut self,
        a: TensorId,
        ne: &[i64],
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ty = self.check(a)?.ty;
        let r = self.new_impl(ty, ne, Some((a, offset)))?;
        self.name_from(r, a, " (view)");
        self[r].op_params.set_u64(0, offset as u64);
        self.set_op(r, Op::View, &[Some(a)]);
        Ok(r)
    }

    /// A 1-d view of `ne0` elements at byte `offset` (`ggml_view_1d`).
    pub fn view_1d(
        &mut self,
        a: TensorId,
        ne0: i64,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        self.view_impl(a, &[ne0], offset)
    }

    /// A 2-d view with row stride `nb1` (`ggml_view_2d`). Strides whose byte extent overflows
    /// or reaches past the view's root are refused ([`GraphError::ViewOutOfRange`]).
    pub fn view_2d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        nb1: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let nb2 = checked_stride(nb1, ne1, offset)?;
        self.strided_view(a, &[ne0, ne1], [nb1, nb2, nb2], offset)
    }

    /// A 3-d view with strides `nb1`, `nb2` (`ggml_view_3d`); checked as [`Context::view_2d`].
    #[allow(clippy::too_many_arguments)]
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        nb1: usize,
        nb2: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let nb3 = checked_stride(nb2, ne2, offset)?;
        self.strided_view(a, &[ne0, ne1, ne2], [nb1, nb2, nb3], offset)
    }

    /// A 4-d view with strides `nb1`, `nb2`, `nb3` (`ggml_view_4d`); checked as
    /// [`Context::view_2d`].
    #[allow(clippy::too_many_arguments)]
    pub fn view_4d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        ne3: i64,
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        self.strided_view(a, &[ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset)
    }

    /// A VIEW of `a` with extents `ne` and strides `nb[1..4]` (`nb[0]` is the type size), after
    /// checking that its byte extent neither overflows nor reaches past its root: ggml checks
    /// only the contiguous size, so a strided view could address (and a later write corrupt)
    /// bytes outside its root. Nothing is created on error.
    fn strided_view(
        &mut self,
        a: TensorId,
        ne: &[i64],
        nb_hi: [usize; 3],
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ty = self.check(a)?.ty;
        let mut full = [1i64; MAX_DIMS];
        for (d, &n) in full.iter_mut().zip(ne) {
            *d = n;
        }
        let nb = [ty.type_size(), nb_hi[0], nb_hi[1], nb_hi[2]];
        self.check_view_extent(a, ty, full, nb, offset)?;
        let r = self.view_impl(a, ne, offset)?;
        let t = &mut self[r];
        t.nb = nb;
        t.refresh_nbytes();
        Ok(r)
    }

    /// `Ok` when a view of `a` with layout `(ty, ne, nb)` at byte `offset` of `a` has a byte
    /// extent that fits in `usize` and lies inside `a`'s root. Negative extents pass here
    /// (their extent is 0) and are refused by the constructor with their own error.
    pub(crate) fn check_view_extent(
        &self,
        a: TensorId,
        ty: crate::types::ElementType,
        ne: [i64; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
    ) -> Result<(), GraphError> {
        let t = self.check(a)?;
        let (root, offs) = match t.view_src {
            Some(r) => (self.check(r)?, offset.checked_add(t.view_offs)),
            None => (t, Some(offset)),
        };
        let src_size = root.nbytes();
        let extent = crate::tensor::checked_nbytes(ty, ne, nb);
        match (extent, offs) {
            (Some(0), Some(offs)) if offs <= src_size => Ok(()),
            (Some(size), Some(offs)) if offs.checked_add(size).is_some_and(|e| e <= src_size) => {
                Ok(())
            }
            (size, offs) => Err(GraphError::ViewOutOfRange {
                size: size.unwrap_or(usize::MAX),
                offset: offs.unwrap_or(usize::MAX),
                src_size,
            }),
        }
    }

    /// A view with 1–4 extents and, optionally, explicit strides `nb[1..ne.len()]` (the
    /// graph-file form of VIEW; missing strides are contiguous for `ne`, higher ones follow
    /// ggml's `view_Nd` rules).
    pub fn view(
        &mut self,
        a: TensorId,
        ne: &[i64],
        nb: Option<[usize; MAX_DIMS]>,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ty = self.check(a)?.ty;
        let n = ne.len();
        let cont = {
            let mut full = [1i64; MAX_DIMS];
            full[..n.min(MAX_DIMS)].copy_from_slice(&ne[..n.min(MAX_DIMS)]);
            crate::tensor::contiguous_strides(ty, full)
        };
        let nb = nb.unwrap_or(cont);
        match n {
            1 => self.view_1d(a, ne[0], offset),
            2 => self.view_2d(a, ne[0], ne[1], nb[1], offset),
            3 => self.view_3d(a, ne[0], ne[1], ne[2], nb[1], nb[2], offset),
            4 => self.view_4d(a, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], offset),
            _ => Err(GraphError::InvalidShape {
                ne: ne.to_vec(),
                why: "1 to 4 dimensions",
            }),
        }
    }

    /// A view of contiguous `a` with new extents and the same element count (`ggml_reshape`).
    ///
    /// ```
    /// use graph::{Context, ElementType, GraphError};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_2d(ElementType::F32, 6, 4)?;
    /// let r = ctx.reshape(a, &[3, 8])?;
    /// assert_eq!(ctx[r].ne(), [3, 8, 1, 1]);
    /// let t = ctx.transpose(a)?;
    /// assert!(matches!(ctx.reshape(t, &[24]), Err(GraphError::NotContiguous { .. })));
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn reshape(&mut self, a: TensorId, ne: &[i64]) -> Result<TensorId, GraphError> {
        let ta = self.check(a)?;
        if !ta.is_contiguous() {
            return Err(GraphError::NotContiguous { op: Op::Reshape });
        }
        let (ty, ane, n) = (ta.ty, ta.ne, ta.nelements());
        if checked_count(ne) != Some(n) || ne.is_empty() || ne.len() > MAX_DIMS {
            let mut b = [1i64; MAX_DIMS];
            for (d, &v) in b.iter_mut().zip(ne) {
                *d = v;
            }
            return Err(GraphError::ShapeMismatch {
                op: Op::Reshape,
                a: ane,
                b,
                why: "element counts differ",
            });
        }
        let r = self.new_impl(ty, ne, Some((a, 0)))?;
        self.name_from(r, a, " (reshaped)");
        self.set_op(r, Op::Reshape, &[Some(a)]);
        Ok(r)
    }

    /// Reshape to `[ne0]`.
    pub fn reshape_1d(&mut self, a: TensorId, ne0: i64) -> Result<TensorId, GraphError> {
        self.reshape(a, &[ne0])
    }
    /// Reshape to `[ne0, ne1]`.
    pub fn reshape_2d(&mut self, a: TensorId, ne0: i64, ne1: i64) -> Result<TensorId, GraphError> {
        self.reshape(a, &[ne0, ne1])
    }
    /// Reshape to `[ne0, ne1, ne2]`.
    pub fn reshape_3d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
    ) -> Result<TensorId, GraphError> {
        self.reshape(a, &[ne0, ne1, ne2])
    }
    /// Reshape to `[ne0, ne1, ne2, ne3]`.
    pub fn reshape_4d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        ne3: i64,
    ) -> Result<TensorId, GraphError> {
        self.reshape(a, &[ne0, ne1, ne2, ne3])
    }

    /// A permuted view (`ggml_permute`): dimension `i` of `a` becomes dimension `axes[i]`.
    ///
    /// ```
    /// use graph::{Context, ElementType, GraphError};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_3d(ElementType::F32, 2, 3, 4)?;
    /// let p = ctx.permute(a, [0, 2, 1, 3])?;
    /// assert_eq!(ctx[p].ne(), [2, 4, 3, 1]);
    /// assert_eq!(ctx[p].nb(), [4, 24, 8, 96]);
    /// assert_eq!(
    ///     ctx.permute(a, [0, 0, 1, 2]).err(),
    ///     Some(GraphError::BadPermutation([0, 0, 1, 2]))
    /// );
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    pub fn permute(&mut self, a: TensorId, axes: [i32; 4]) -> Result<TensorId, GraphError> {
        self.check(a)?;
        let mut seen = [false; 4];
        for &ax in &axes {
            if !(0..4).contains(&ax) || seen[ax as usize] {
                return Err(GraphError::BadPermutation(axes));
            }
            seen[ax as usize] = true;
        }
        let (ty, ane, anb) = (self[a].ty, self[a].ne, self[a].nb);
        let (mut ne, mut nb) = (ane, anb);
        for i in 0..4 {
            ne[axes[i] as usize] = ane[i];
            nb[axes[i] as usize] = anb[i];
        }
        // a block type's extent counts dimension 0 differently, so a permuted one can differ
        self.check_view_extent(a, ty, ne, nb, 0)?;
        let r = self.view_tensor(a)?;
        self.name_from(r, a, " (permuted)");
        let t = &mut self[r];
        t.ne = ne;
        t.nb = nb;
        for (i, &ax) in axes.iter().enumerate() {
            t.op_params.set_i32(i, ax);
        }
        t.refresh_nbytes();
        self.set_op(r, Op::Permute, &[Some(a)]);
        Ok(r)
    }

    /// A view with dimensions 0 and 1 swapped (`ggml_transpose`).
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let (ty, mut ne, mut nb) = {
            let t = self.check(a)?;
            (t.ty, t.ne, t.nb)
        };
        ne.swap(0, 1);
        nb.swap(0, 1);
        self.check_view_extent(a, ty, ne, nb, 0)?;
        let r = self.view_tensor(a)?;
        self.name_from(r, a, " (transposed)");
        let t = &mut self[r];
        t.ne.swap(0, 1);
        t.nb.swap(0, 1);
        t.refresh_nbytes();
        t.op_params.set_i32(0, 1);
        t.op_params.set_i32(1, 0);
        self.set_op(r, Op::Transpose, &[Some(a)]);
        Ok(r)
    }
}
