//! Every op constructor: result type, shape, strides, op, parameters, sources, view root and
//! offset, and name; and each invalid input rejected with the right [`GraphError`] variant while
//! the context stays as it was.
//!
//! Expected values follow ggml's constructors as described in the spec
//! (`../shared/spec/ggml-core-and-alloc.md` §1.2, §1.5) and FORMAT.md's op list.

use graph::{Context, ElementType, GraphError, Op, OpParams, RopeParams, TensorId, UnaryOp};

use ElementType::*;

/// Assert that `$e` fails with an error matching `$pat` and creates no tensor.
macro_rules! rejects {
    ($ctx:ident, $e:expr, $pat:pat $(if $guard:expr)?) => {{
        let before = $ctx.len();
        let r: Result<TensorId, GraphError> = $e;
        assert!(matches!(r, Err($pat) $(if $guard)?), "{}: got {:?}", stringify!($e), r);
        assert_eq!($ctx.len(), before, "{} created a tensor", stringify!($e));
    }};
}

fn named(ctx: &mut Context, ty: ElementType, ne: &[i64], name: &str) -> TensorId {
    let t = ctx.new_tensor(ty, ne).unwrap();
    ctx.set_name(t, name).unwrap();
    t
}

fn srcs(ctx: &Context, t: TensorId) -> Vec<Option<TensorId>> {
    ctx[t].srcs().to_vec()
}

fn src_list(s: &[Option<TensorId>]) -> Vec<Option<TensorId>> {
    let mut v = s.to_vec();
    v.resize(graph::MAX_SRC, None);
    v
}

#[test]
fn new_tensor_shapes_and_errors() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 7).unwrap();
    assert_eq!(ctx[a].ne(), [7, 1, 1, 1]);
    assert_eq!(ctx[a].nb(), [4, 28, 28, 28]);
    assert_eq!(ctx[a].op(), Op::None);
    assert_eq!(ctx[a].view_src(), None);
    assert_eq!(ctx[a].name(), "");
    assert_eq!(ctx[a].n_dims(), 1);
    assert!(!ctx[a].has_storage());
    let b = ctx.new_tensor_4d(F16, 2, 3, 4, 5).unwrap();
    // nb = [2, 2*2, 4*3, 12*4] = [2, 4, 12, 48]
    assert_eq!(ctx[b].nb(), [2, 4, 12, 48]);
    assert_eq!(ctx[b].n_dims(), 4);
    let c = ctx.new_tensor_3d(I32, 3, 1, 2).unwrap();
    assert_eq!(ctx[c].n_dims(), 3);

    rejects!(
        ctx,
        ctx.new_tensor(F32, &[]),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor(F32, &[1, 1, 1, 1, 1]),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor_2d(F32, 3, -1),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor_1d(Q4_0, 48),
        GraphError::BlockMisaligned { .. }
    );
    // Extents whose byte size (or element count) does not fit are rejected, not an overflow:
    // 4 * 2^62 = 2^64 bytes; 2^40 * 2^40 elements.
    rejects!(
        ctx,
        ctx.new_tensor_1d(F32, 1 << 62),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor_2d(I8, 1 << 40, 1 << 40),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor_4d(F32, 1 << 40, 1 << 40, 1 << 40, 0),
        GraphError::InvalidShape { .. }
    );
    rejects!(
        ctx,
        ctx.new_tensor_1d(F32, i64::MAX),
        GraphError::InvalidShape { .. }
    );
    // 2^40 bytes is fine (metadata only).
    let big = ctx.new_tensor_2d(F32, 1 << 20, 1 << 18).unwrap();
    assert_eq!(ctx[big].nbytes(), 1 << 40);

    // Same layout keeps strides (the scheduler's input copies).
    let t = ctx.transpose(b).unwrap();
    let s = ctx.new_tensor_same_layout(t).unwrap();
    assert!(ctx[s].same_layout(&ctx[t]));
    assert_eq!(ctx[s].view_src(), None);
    assert_eq!(ctx[s].op(), Op::None);
}

#[test]
fn binary_ops() {
    type Ctor = fn(&mut Context, TensorId, TensorId) -> Result<TensorId, GraphError>;
    let cases: [(Op, Ctor, Ctor); 4] = [
        (Op::Add, Context::add, Context::add_inplace),
        (Op::Sub, Context::sub, Context::sub_inplace),
        (Op::Mul, Context::mul, Context::mul_inplace),
        (Op::Div, Context::div, Context::div_inplace),
    ];
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[8, 6, 2], "a");
    let row = named(&mut ctx, F32, &[8], "row");
    let col = named(&mut ctx, F32, &[1, 3, 2], "col");
    let bad = named(&mut ctx, F32, &[3], "bad");
    for (op, plain, inplace) in cases {
        // Broadcast a row and a column: 8 % 8, 6 % 1, 2 % 1 and 8 % 1, 6 % 3, 2 % 2 are all 0.
        for b in [row, col, a] {
            let r = plain(&mut ctx, a, b).unwrap();
            let t = &ctx[r];
            assert_eq!((t.op(), t.ty(), t.ne()), (op, F32, [8, 6, 2, 1]));
            assert_eq!(t.nb(), [4, 32, 192, 384]);
            assert_eq!(srcs(&ctx, r), src_list(&[Some(a), Some(b)]));
            assert_eq!(ctx[r].view_src(), None);
            assert_eq!(ctx[r].name(), "");
            assert_eq!(ctx[r].op_params(), &OpParams::default());
        }
        // In place: a view of `a` named "a (view)".
        let r = inplace(&mut ctx, a, row).unwrap();
        assert_eq!(ctx[r].op(), op);
        assert_eq!(ctx[r].view_src(), Some(a));
        assert_eq!(ctx[r].view_offs(), 0);
        assert_eq!(ctx[r].name(), "a (view)");
        assert_eq!(srcs(&ctx, r), src_list(&[Some(a), Some(row)]));
        // Wrong broadcast: 8 % 3 != 0; and the big one cannot go over the small one.
        rejects!(ctx, plain(&mut ctx, a, bad), GraphError::ShapeMismatch { op: o, .. } if o == op);
        rejects!(ctx, plain(&mut ctx, row, a), GraphError::ShapeMismatch { op: o, .. } if o == op);
        rejects!(ctx, inplace(&mut ctx, a, bad), GraphError::ShapeMismatch { op: o, .. } if o == op);
    }
    // Broadcast over a zero extent is not a division by zero.
    let z = ctx.new_tensor_2d(F32, 0, 3).unwrap();
    rejects!(ctx, ctx.add(a, z), GraphError::ShapeMismatch { .. });
}

#[test]
fn elementwise_unary_ops() {
    type Ctor = fn(&mut Context, TensorId) -> Result<TensorId, GraphError>;
    let cases: [(Op, Ctor, Option<Ctor>); 3] = [
        (Op::Sqr, Context::sqr, Some(Context::sqr_inplace)),
        (Op::Sqrt, Context::sqrt, Some(Context::sqrt_inplace)),
        (Op::Dup, Context::dup, None),
    ];
    let mut ctx = Context::new();
    let a = named(&mut ctx, F16, &[4, 3], "a");
    for (op, plain, inplace) in cases {
        let r = plain(&mut ctx, a).unwrap();
        assert_eq!(
            (ctx[r].op(), ctx[r].ty(), ctx[r].ne()),
            (op, F16, [4, 3, 1, 1])
        );
        assert_eq!(srcs(&ctx, r), src_list(&[Some(a)]));
        assert_eq!(ctx[r].view_src(), None);
        assert_eq!(ctx[r].name(), "");
        if let Some(inplace) = inplace {
            let r = inplace(&mut ctx, a).unwrap();
            assert_eq!(ctx[r].op(), op);
            assert_eq!(ctx[r].view_src(), Some(a));
            assert_eq!(ctx[r].name(), "a (view)");
        }
    }
    // dup of a transposed view is contiguous with the view's extents.
    let t = ctx.transpose(a).unwrap();
    let d = ctx.dup(t).unwrap();
    assert_eq!(ctx[d].ne(), [3, 4, 1, 1]);
    assert_eq!(ctx[d].nb(), [2, 6, 24, 24]);
}

#[test]
fn scale() {
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[4, 3], "a");
    let r = ctx.scale(a, 0.125).unwrap();
    assert_eq!((ctx[r].op(), ctx[r].ne()), (Op::Scale, [4, 3, 1, 1]));
    assert_eq!(ctx[r].op_params().f32(0), 0.125);
    assert_eq!(ctx[r].op_params().i32(0), 0.125f32.to_bits() as i32);
    assert_eq!(srcs(&ctx, r), src_list(&[Some(a)]));
    assert_eq!(ctx[r].view_src(), None);
    let r = ctx.scale_inplace(a, 2.0).unwrap();
    assert_eq!(ctx[r].view_src(), Some(a));
    assert_eq!(ctx[r].op_params().f32(0), 2.0);
    // Rows must be contiguous: a transposed tensor has nb0 = 12 != 4.
    let t = ctx.transpose(a).unwrap();
    rejects!(
        ctx,
        ctx.scale(t, 2.0),
        GraphError::NotContiguous { op: Op::Scale }
    );
}

#[test]
fn norms() {
    type Ctor = fn(&mut Context, TensorId, f32) -> Result<TensorId, GraphError>;
    let cases: [(Op, Ctor, Ctor); 2] = [
        (Op::Norm, Context::norm, Context::norm_inplace),
        (Op::RmsNorm, Context::rms_norm, Context::rms_norm_inplace),
    ];
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[16, 5], "a");
    for (op, plain, inplace) in cases {
        let r = plain(&mut ctx, a, 1e-5).unwrap();
        assert_eq!(
            (ctx[r].op(), ctx[r].ty(), ctx[r].ne()),
            (op, F32, [16, 5, 1, 1])
        );
        assert_eq!(ctx[r].op_params().f32(0), 1e-5);
        assert_eq!(srcs(&ctx, r), src_list(&[Some(a)]));
        assert_eq!(ctx[r].view_src(), None);
        let r = inplace(&mut ctx, a, 0.0).unwrap();
        assert_eq!(ctx[r].view_src(), Some(a));
        rejects!(ctx, plain(&mut ctx, a, -1.0), GraphError::InvalidParam { op: o, .. } if o == op);
        rejects!(
            ctx,
            plain(&mut ctx, a, f32::NAN),
            GraphError::InvalidParam { .. }
        );
    }
}

#[test]
fn mul_mat() {
    let mut ctx = Context::new();
    // a: [K=64, M=16, 2, 1] (Q8_0), b: [K=64, N=5, 6, 3]: result F32 [16, 5, 6, 3]
    // (b.ne2 = 6 is a multiple of a.ne2 = 2; b.ne3 = 3 of a.ne3 = 1).
    let a = named(&mut ctx, Q8_0, &[64, 16, 2], "w");
    let b = named(&mut ctx, F16, &[64, 5, 6, 3], "x");
    let r = ctx.mul_mat(a, b).unwrap();
    let t = &ctx[r];
    assert_eq!((t.op(), t.ty(), t.ne()), (Op::MulMat, F32, [16, 5, 6, 3]));
    assert_eq!(t.nb(), [4, 64, 320, 1920]);
    assert_eq!(srcs(&ctx, r), src_list(&[Some(a), Some(b)]));
    assert_eq!(ctx[r].view_src(), None);
    assert_eq!(ctx[r].name(), "");

    // Mismatched inner dimension: 64 != 32.
    let b2 = ctx.new_tensor_2d(F32, 32, 5).unwrap();
    rejects!(
        ctx,
        ctx.mul_mat(a, b2),
        GraphError::ShapeMismatch { op: Op::MulMat, .. }
    );
    // b.ne2 = 3 is not a multiple of a.ne2 = 2.
    let b3 = ctx.new_tensor_3d(F32, 64, 5, 3).unwrap();
    rejects!(
        ctx,
        ctx.mul_mat(a, b3),
        GraphError::ShapeMismatch { op: Op::MulMat, .. }
    );
    // a transposed (nb0 > nb1).
    let f = ctx.new_tensor_2d(F32, 5, 64).unwrap();
    let ft = ctx.transpose(f).unwrap();
    let bx = ctx.new_tensor_2d(F32, 64, 2).unwrap();
    rejects!(
        ctx,
        ctx.mul_mat(ft, bx),
        GraphError::ShapeMismatch { op: Op::MulMat, .. }
    );
    // A zero batch in a: no division by zero.
    let a0 = ctx.new_tensor_3d(F32, 64, 4, 0).unwrap();
    rejects!(
        ctx,
        ctx.mul_mat(a0, b),
        GraphError::ShapeMismatch { op: Op::MulMat, .. }
    );
}

#[test]
fn get_rows() {
    let mut ctx = Context::new();
    // An F16 embedding table [768, 100] and 7 token ids (a.ne2 = 1 == ids.ne1 = 1).
    let emb = named(&mut ctx, F16, &[768, 100], "tok_embd");
    let ids = named(&mut ctx, I32, &[7], "ids");
    let r = ctx.get_rows(emb, ids).unwrap();
    // [a.ne0, ids.ne0, ids.ne1, ids.ne2] = [768, 7, 1, 1], F32.
    assert_eq!(
        (ctx[r].op(), ctx[r].ty(), ctx[r].ne()),
        (Op::GetRows, F32, [768, 7, 1, 1])
    );
    assert_eq!(srcs(&ctx, r), src_list(&[Some(emb), Some(ids)]));
    assert_eq!(ctx[r].view_src(), None);
    // Batched: a [4, 10, 3], ids [5, 3, 2] (a.ne2 = 3 == ids.ne1, ids.ne3 = 1):
    // result [a.ne0, ids.ne0, ids.ne1, ids.ne2] = [4, 5, 3, 2].
    let a3 = ctx.new_tensor_3d(F32, 4, 10, 3).unwrap();
    let i3 = ctx.new_tensor_3d(I32, 5, 3, 2).unwrap();
    let r3 = ctx.get_rows(a3, i3).unwrap();
    assert_eq!(ctx[r3].ne(), [4, 5, 3, 2]);
    // An I32 table gives I32 rows.
    let ai = ctx.new_tensor_2d(I32, 4, 10).unwrap();
    let ri = ctx.get_rows(ai, ids).unwrap();
    assert_eq!(ctx[ri].ty(), I32);

    let fids = ctx.new_tensor_1d(F32, 7).unwrap();
    rejects!(
        ctx,
        ctx.get_rows(emb, fids),
        GraphError::TypeMismatch {
            op: Op::GetRows,
            ty: F32,
            ..
        }
    );
    let i64ids = ctx.new_tensor_1d(I64, 7).unwrap();
    rejects!(
        ctx,
        ctx.get_rows(emb, i64ids),
        GraphError::TypeMismatch {
            op: Op::GetRows,
            ty: I64,
            ..
        }
    );
    // a.ne2 = 1 but ids.ne1 = 2.
    let ids2 = ctx.new_tensor_2d(I32, 7, 2).unwrap();
    rejects!(
        ctx,
        ctx.get_rows(emb, ids2),
        GraphError::ShapeMismatch {
            op: Op::GetRows,
            ..
        }
    );
}

#[test]
fn soft_max() {
    let mut ctx = Context::new();
    // Attention scores [n_kv = 32, n_q = 4, n_head = 8].
    let kq = named(&mut ctx, F32, &[32, 4, 8], "kq");
    let r = ctx.soft_max(kq).unwrap();
    assert_eq!(
        (ctx[r].op(), ctx[r].ty(), ctx[r].ne()),
        (Op::SoftMax, F32, [32, 4, 8, 1])
    );
    assert_eq!(ctx[r].op_params().f32(0), 1.0);
    assert_eq!(ctx[r].op_params().f32(1), 0.0);
    assert_eq!(srcs(&ctx, r), src_list(&[Some(kq)]));
    assert_eq!(ctx[r].view_src(), None);

    // Mask [32, 4] (ne1 >= 4, broadcast over the 8 heads), F16 allowed.
    let mask = named(&mut ctx, F16, &[32, 4], "mask");
    let r = ctx.soft_max_ext(kq, Some(mask), 0.125, 8.0).unwrap();
    assert_eq!(ctx[r].op_params().f32(0), 0.125);
    assert_eq!(ctx[r].op_params().f32(1), 8.0);
    assert_eq!(srcs(&ctx, r), src_list(&[Some(kq), Some(mask)]));
    // A padded mask (ne1 = 16 >= 4) is fine.
    let padded = ctx.new_tensor_2d(F32, 32, 16).unwrap();
    ctx.soft_max_ext(kq, Some(padded), 1.0, 0.0).unwrap();
    let r = ctx.soft_max_ext_inplace(kq, Some(mask), 1.0, 0.0).unwrap();
    assert_eq!(ctx[r].view_src(), Some(kq));
    assert_eq!(ctx[r].name(), "kq (view)");

    // Mask with the wrong row length, too few rows, heads that do not broadcast.
    for ne in [[16i64, 4, 1], [32, 2, 1], [32, 4, 3]] {
        let m = ctx.new_tensor(F32, &ne).unwrap();
        rejects!(
            ctx,
            ctx.soft_max_ext(kq, Some(m), 1.0, 0.0),
            GraphError::ShapeMismatch {
                op: Op::SoftMax,
                ..
            }
        );
    }
    // Mask with a zero extent in a broadcast dimension is rejected, not a division by zero.
    let m0 = ctx.new_tensor_3d(F32, 32, 4, 0).unwrap();
    rejects!(
        ctx,
        ctx.soft_max_ext(kq, Some(m0), 1.0, 0.0),
        GraphError::ShapeMismatch {
            op: Op::SoftMax,
            ..
        }
    );
    // Wrong mask type.
    let mi = ctx.new_tensor_2d(I32, 32, 4).unwrap();
    rejects!(
        ctx,
        ctx.soft_max_ext(kq, Some(mi), 1.0, 0.0),
        GraphError::TypeMismatch {
            op: Op::SoftMax,
            ty: I32,
            ..
        }
    );
    // ALiBi without a mask.
    rejects!(
        ctx,
        ctx.soft_max_ext(kq, None, 1.0, 8.0),
        GraphError::InvalidParam {
            op: Op::SoftMax,
            ..
        }
    );
    // Non-contiguous input.
    let p = ctx.permute(kq, [0, 2, 1, 3]).unwrap();
    rejects!(
        ctx,
        ctx.soft_max(p),
        GraphError::NotContiguous { op: Op::SoftMax }
    );
}

#[test]
fn rope() {
    let mut ctx = Context::new();
    // q: [head_dim = 64, n_head = 4, n_tokens = 3]; one position per token.
    let q = named(&mut ctx, F32, &[64, 4, 3], "q");
    let pos = named(&mut ctx, I32, &[3], "pos");
    let r = ctx.rope(q, pos, 64, graph::rope_mode::NEOX).unwrap();
    assert_eq!(
        (ctx[r].op(), ctx[r].ty(), ctx[r].ne()),
        (Op::Rope, F32, [64, 4, 3, 1])
    );
    assert_eq!(srcs(&ctx, r), src_list(&[Some(q), Some(pos)]));
    assert_eq!(ctx[r].view_src(), None);
    let p = ctx[r].op_params();
    // Slots: 0 n_past (0), 1 n_dims, 2 mode, 3 n_ctx (0), 4 n_ctx_orig, 5.. floats.
    assert_eq!(
        [p.i32(0), p.i32(1), p.i32(2), p.i32(3), p.i32(4)],
        [0, 64, 2, 0, 0]
    );
    assert_eq!(
        [p.f32(5), p.f32(6), p.f32(7), p.f32(8), p.f32(9), p.f32(10)],
        [10000.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    );

    let params = RopeParams {
        n_ctx_orig: 4096,
        freq_base: 500000.0,
        freq_scale: 0.25,
        ext_factor: 1.0,
        attn_factor: 0.5,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let r = ctx
        .rope_ext(q, pos, 32, graph::rope_mode::NORMAL, params)
        .unwrap();
    let p = ctx[r].op_params();
    assert_eq!([p.i32(1), p.i32(2), p.i32(4)], [32, 0, 4096]);
    assert_eq!(
        [p.f32(5), p.f32(6), p.f32(7), p.f32(8), p.f32(9), p.f32(10)],
        [500000.0, 0.25, 1.0, 0.5, 32.0, 1.0]
    );

    // Positions: wrong type, wrong length (a.ne2 = 3), not a vector.
    let fpos = ctx.new_tensor_1d(F32, 3).unwrap();
    rejects!(
        ctx,
        ctx.rope(q, fpos, 64, 0),
        GraphError::TypeMismatch {
            op: Op::Rope,
            ty: F32,
            ..
        }
    );
    let short = ctx.new_tensor_1d(I32, 4).unwrap();
    rejects!(
        ctx,
        ctx.rope(q, short, 64, 0),
        GraphError::ShapeMismatch { op: Op::Rope, .. }
    );
    let mat = ctx.new_tensor_2d(I32, 3, 2).unwrap();
    rejects!(
        ctx,
        ctx.rope(q, mat, 64, 0),
        GraphError::ShapeMismatch { op: Op::Rope, .. }
    );
    // n_dims odd, zero, larger than a.ne0.
    for n_dims in [63, 0, 128] {
        rejects!(
            ctx,
            ctx.rope(q, pos, n_dims, 0),
            GraphError::InvalidParam { op: Op::Rope, .. }
        );
    }
}

#[test]
fn unary_ops() {
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[8, 2], "a");
    type Ctor = fn(&mut Context, TensorId) -> Result<TensorId, GraphError>;
    let named_ctors: [(UnaryOp, Ctor); 4] = [
        (UnaryOp::Silu, Context::silu),
        (UnaryOp::Gelu, Context::gelu),
        (UnaryOp::GeluErf, Context::gelu_erf),
        (UnaryOp::Relu, Context::relu),
    ];
    for (u, ctor) in named_ctors {
        let r = ctor(&mut ctx, a).unwrap();
        assert_eq!(ctx[r].op(), Op::Unary(u));
        assert_eq!(ctx[r].unary_op(), Some(u));
        assert_eq!(ctx[r].op_params().i32(0), u.id());
        assert_eq!((ctx[r].ty(), ctx[r].ne()), (F32, [8, 2, 1, 1]));
        assert_eq!(srcs(&ctx, r), src_list(&[Some(a)]));
        assert_eq!(ctx[r].view_src(), None);
    }
    // ggml's unary ids (NOV24): SILU 10, GELU 8, RELU 6.
    assert_eq!(UnaryOp::Silu.id(), 10);
    assert_eq!(UnaryOp::Gelu.id(), 8);
    assert_eq!(UnaryOp::Relu.id(), 6);
    for u in UnaryOp::ALL {
        let r = ctx.unary(a, u).unwrap();
        assert_eq!(ctx[r].op_params().i32(0), u.id());
        let r = ctx.unary_inplace(a, u).unwrap();
        assert_eq!(ctx[r].op(), Op::Unary(u));
        assert_eq!(ctx[r].view_src(), Some(a));
    }
    // Rows must be contiguous: a transposed tensor is rejected.
    let t = ctx.transpose(a).unwrap();
    rejects!(
        ctx,
        ctx.silu(t),
        GraphError::NotContiguous {
            op: Op::Unary(UnaryOp::Silu)
        }
    );
    // ggml_is_contiguous_1: padded rows are fine (ne [6, 4], nb [4, 32, 128, 128]) ...
    let b = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    let padded = ctx.view_2d(b, 6, 4, 32, 0).unwrap();
    ctx.gelu(padded).unwrap();
    // ... but swapped dimensions 1 and 2 are not: [8, 2, 3] permuted by [0, 2, 1, 3] has
    // ne [8, 3, 2], nb [4, 64, 32, 192], and nb2 = 32 != ne1 * nb1 = 192.
    let c = ctx.new_tensor_3d(F32, 8, 2, 3).unwrap();
    let p = ctx.permute(c, [0, 2, 1, 3]).unwrap();
    rejects!(ctx, ctx.gelu(p), GraphError::NotContiguous { .. });
}

#[test]
fn cont_and_cont_shape() {
    let mut ctx = Context::new();
    let a = named(&mut ctx, F16, &[3, 5], "a");
    let t = ctx.transpose(a).unwrap();
    let c = ctx.cont(t).unwrap();
    assert_eq!(
        (ctx[c].op(), ctx[c].ty(), ctx[c].ne()),
        (Op::Cont, F16, [5, 3, 1, 1])
    );
    assert_eq!(ctx[c].nb(), [2, 10, 30, 30]);
    assert!(ctx[c].is_contiguous());
    assert_eq!(ctx[c].view_src(), None);
    assert_eq!(ctx[c].name(), "a (transposed) (cont)");
    assert_eq!(srcs(&ctx, c), src_list(&[Some(t)]));

    let c2 = ctx.cont_shape(t, &[15]).unwrap();
    assert_eq!((ctx[c2].op(), ctx[c2].ne()), (Op::Cont, [15, 1, 1, 1]));
    assert_eq!(ctx[c2].name(), "a (transposed) (cont)");
    rejects!(
        ctx,
        ctx.cont_shape(t, &[4, 4]),
        GraphError::ShapeMismatch { op: Op::Cont, .. }
    );
}

#[test]
fn cpy_into_a_view_of_a_cache() {
    let mut ctx = Context::new();
    // K cache of 4 rows of 8 F16 (row 16 bytes); write row 2 (offset 32).
    let cache = named(&mut ctx, F16, &[8, 4], "cache_k");
    let slot = ctx.view_1d(cache, 8, 32).unwrap();
    let k = named(&mut ctx, F32, &[8], "k");
    let c = ctx.cpy(k, slot).unwrap();
    let t = &ctx[c];
    // A view of b (collapsed to the cache), b's type and layout, op CPY, src [a, b].
    assert_eq!(
        (t.op(), t.ty(), t.ne(), t.nb()),
        (Op::Cpy, F16, [8, 1, 1, 1], [2, 16, 16, 16])
    );
    assert_eq!(t.view_src(), Some(cache));
    assert_eq!(t.view_offs(), 32);
    assert_eq!(t.name(), "cache_k (view) (copy of k)");
    assert_eq!(srcs(&ctx, c), src_list(&[Some(k), Some(slot)]));

    // Unnamed destination: "<a> (copy)".
    let dst = ctx.new_tensor_2d(F32, 4, 2).unwrap();
    let c2 = ctx.cpy(k, dst).unwrap();
    assert_eq!(ctx[c2].name(), "k (copy)");
    assert_eq!(ctx[c2].ne(), [4, 2, 1, 1]);
    assert_eq!(ctx[c2].view_src(), Some(dst));
    // Element counts must match: 8 vs 7.
    let seven = ctx.new_tensor_1d(F32, 7).unwrap();
    rejects!(
        ctx,
        ctx.cpy(k, seven),
        GraphError::ShapeMismatch { op: Op::Cpy, .. }
    );
}

#[test]
fn views() {
    let mut ctx = Context::new();
    // Root F32 [6, 4, 2]: nb = [4, 24, 96, 192], 192 bytes.
    let a = named(&mut ctx, F32, &[6, 4, 2], "a");

    let v1 = ctx.view_1d(a, 5, 8).unwrap();
    let t = &ctx[v1];
    assert_eq!(
        (t.op(), t.ty(), t.ne(), t.nb()),
        (Op::View, F32, [5, 1, 1, 1], [4, 20, 20, 20])
    );
    assert_eq!((t.view_src(), t.view_offs()), (Some(a), 8));
    assert_eq!(t.op_params().u64(0), 8);
    assert_eq!(t.name(), "a (view)");
    assert_eq!(srcs(&ctx, v1), src_list(&[Some(a)]));

    // view_2d: nb2 = nb1 * ne1 = 24 * 3 = 72, nb3 = nb2.
    let v2 = ctx.view_2d(a, 4, 3, 24, 24).unwrap();
    assert_eq!(ctx[v2].ne(), [4, 3, 1, 1]);
    assert_eq!(ctx[v2].nb(), [4, 24, 72, 72]);
    assert_eq!(ctx[v2].op_params().u64(0), 24);

    // view_3d: nb3 = nb2 * ne2 = 96 * 2 = 192.
    let v3 = ctx.view_3d(a, 6, 2, 2, 24, 96, 0).unwrap();
    assert_eq!(ctx[v3].ne(), [6, 2, 2, 1]);
    assert_eq!(ctx[v3].nb(), [4, 24, 96, 192]);

    let v4 = ctx.view_4d(a, 2, 2, 2, 1, 8, 24, 96, 4).unwrap();
    assert_eq!(ctx[v4].ne(), [2, 2, 2, 1]);
    assert_eq!(ctx[v4].nb(), [4, 8, 24, 96]);
    assert_eq!(ctx[v4].view_offs(), 4);

    // The generic form: missing strides are contiguous for ne.
    let g = ctx.view(a, &[3, 4], None, 0).unwrap();
    assert_eq!(ctx[g].nb(), [4, 12, 48, 48]);
    let g = ctx.view(a, &[3, 2, 2], Some([4, 24, 96, 0]), 0).unwrap();
    assert_eq!(ctx[g].nb(), [4, 24, 96, 192]);
    rejects!(
        ctx,
        ctx.view(a, &[], None, 0),
        GraphError::InvalidShape { .. }
    );

    // Out of range: contiguous size of the view + offset > 192.
    // 1-d: 10*4 + 160 = 200 > 192.
    rejects!(
        ctx,
        ctx.view_1d(a, 10, 160),
        GraphError::ViewOutOfRange {
            size: 40,
            offset: 160,
            src_size: 192
        }
    );
    // 2-d: 6*4*8 = 192 + 4 > 192.
    rejects!(
        ctx,
        ctx.view_2d(a, 6, 8, 24, 4),
        GraphError::ViewOutOfRange { .. }
    );
    // Exactly fitting is fine: 6*4*8 + 0 = 192.
    ctx.view_2d(a, 6, 8, 24, 0).unwrap();
    // Of a view: the offset is checked against the root (8 + 184 + 4 = 196 > 192).
    rejects!(
        ctx,
        ctx.view_1d(v1, 1, 184),
        GraphError::ViewOutOfRange {
            size: 4,
            offset: 192,
            src_size: 192
        }
    );
    // Offsets near usize::MAX are out of range, not an overflow.
    rejects!(
        ctx,
        ctx.view_1d(a, 1, usize::MAX),
        GraphError::ViewOutOfRange { .. }
    );
    rejects!(
        ctx,
        ctx.view_1d(v1, 1, usize::MAX - 4),
        GraphError::ViewOutOfRange { .. }
    );
    // A zero-sized view may start anywhere up to its root's end; ggml skips the check when
    // data_size == 0, we refuse an empty view past the end (placing it would address bytes
    // outside the root, and overflow or not depending on where the root was placed).
    let end = ctx[a].nbytes();
    ctx.view_1d(a, 0, end).unwrap();
    rejects!(
        ctx,
        ctx.view_1d(a, 0, end + 1),
        GraphError::ViewOutOfRange { .. }
    );
    rejects!(
        ctx,
        ctx.view_1d(a, 0, usize::MAX),
        GraphError::ViewOutOfRange { .. }
    );
}

#[test]
fn view_tensor() {
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[3, 5], "a");
    let t = ctx.transpose(a).unwrap();
    let v = ctx.view_tensor(t).unwrap();
    // Same extents and strides as t, no op, root a.
    assert_eq!(
        (ctx[v].op(), ctx[v].ne(), ctx[v].nb()),
        (Op::None, [5, 3, 1, 1], [12, 4, 60, 60])
    );
    assert_eq!(ctx[v].view_src(), Some(a));
    assert_eq!(ctx[v].name(), "a (transposed) (view)");
    assert_eq!(srcs(&ctx, v), src_list(&[]));
}

#[test]
fn reshape() {
    let mut ctx = Context::new();
    let a = named(&mut ctx, F32, &[6, 4], "a");
    type Case = (&'static [i64], [i64; 4], [usize; 4]);
    let cases: [Case; 4] = [
        (&[24], [24, 1, 1, 1], [4, 96, 96, 96]),
        (&[3, 8], [3, 8, 1, 1], [4, 12, 96, 96]),
        (&[2, 3, 4], [2, 3, 4, 1], [4, 8, 24, 96]),
        (&[1, 2, 3, 4], [1, 2, 3, 4], [4, 4, 8, 24]),
    ];
    for (ne, want_ne, want_nb) in cases {
        let r = ctx.reshape(a, ne).unwrap();
        let t = &ctx[r];
        assert_eq!(
            (t.op(), t.ty(), t.ne(), t.nb()),
            (Op::Reshape, F32, want_ne, want_nb)
        );
        assert_eq!((t.view_src(), t.view_offs()), (Some(a), 0));
        assert_eq!(t.name(), "a (reshaped)");
        assert_eq!(srcs(&ctx, r), src_list(&[Some(a)]));
    }
    let r1 = ctx.reshape_1d(a, 24).unwrap();
    assert_eq!(ctx[r1].ne(), [24, 1, 1, 1]);
    let r2 = ctx.reshape_2d(a, 12, 2).unwrap();
    assert_eq!(ctx[r2].ne(), [12, 2, 1, 1]);
    let r3 = ctx.reshape_3d(a, 2, 2, 6).unwrap();
    assert_eq!(ctx[r3].ne(), [2, 2, 6, 1]);
    let r4 = ctx.reshape_4d(a, 2, 2, 3, 2).unwrap();
    assert_eq!(ctx[r4].ne(), [2, 2, 3, 2]);
    // Reshape of a reshape collapses to the root; of a contiguous view keeps its offset.
    let rr = ctx.reshape(r2, &[24]).unwrap();
    assert_eq!(ctx[rr].view_src(), Some(a));
    let v = ctx.view_1d(a, 12, 48).unwrap();
    let rv = ctx.reshape_2d(v, 6, 2).unwrap();
    assert_eq!((ctx[rv].view_src(), ctx[rv].view_offs()), (Some(a), 48));

    // Element counts must match; negative extents are invalid.
    rejects!(
        ctx,
        ctx.reshape(a, &[5, 5]),
        GraphError::ShapeMismatch {
            op: Op::Reshape,
            ..
        }
    );
    rejects!(
        ctx,
        ctx.reshape(a, &[]),
        GraphError::ShapeMismatch {
            op: Op::Reshape,
            ..
        }
    );
    rejects!(
        ctx,
        ctx.reshape(a, &[1, 1, 1, 1, 24]),
        GraphError::ShapeMismatch { .. }
    );
    rejects!(
        ctx,
        ctx.reshape(a, &[-4, -6]),
        GraphError::InvalidShape { .. }
    );
    // Non-contiguous: transposed and padded views.
    let t = ctx.transpose(a).unwrap();
    rejects!(
        ctx,
        ctx.reshape(t, &[24]),
        GraphError::NotContiguous { op: Op::Reshape }
    );
    let padded = ctx.view_2d(a, 4, 4, 24, 0).unwrap();
    rejects!(
        ctx,
        ctx.reshape_1d(padded, 16),
        GraphError::NotContiguous { op: Op::Reshape }
    );
}

#[test]
fn permute_and_transpose() {
    let mut ctx = Context::new();
    // a: F32 [2, 3, 4, 5], nb = [4, 8, 24, 96].
    let a = named(&mut ctx, F32, &[2, 3, 4, 5], "a");
    // axes [1, 3, 0, 2]: dim0 -> 1, dim1 -> 3, dim2 -> 0, dim3 -> 2.
    // ne = [4, 2, 5, 3], nb = [24, 4, 96, 8].
    let p = ctx.permute(a, [1, 3, 0, 2]).unwrap();
    let t = &ctx[p];
    assert_eq!(
        (t.op(), t.ty(), t.ne(), t.nb()),
        (Op::Permute, F32, [4, 2, 5, 3], [24, 4, 96, 8])
    );
    assert_eq!([0, 1, 2, 3].map(|i| t.op_params().i32(i)), [1, 3, 0, 2]);
    assert_eq!((t.view_src(), t.view_offs()), (Some(a), 0));
    assert_eq!(t.name(), "a (permuted)");
    assert_eq!(srcs(&ctx, p), src_list(&[Some(a)]));
    // The identity permutation is a view with a's layout.
    let id = ctx.permute(a, [0, 1, 2, 3]).unwrap();
    assert!(ctx[id].same_layout(&ctx[a]));

    for axes in [[0, 0, 1, 2], [0, 1, 2, 4], [-1, 0, 1, 2], [3, 3, 3, 3]] {
        rejects!(ctx, ctx.permute(a, axes), GraphError::BadPermutation(x) if x == axes);
    }

    let tr = ctx.transpose(a).unwrap();
    let t = &ctx[tr];
    assert_eq!(
        (t.op(), t.ne(), t.nb()),
        (Op::Transpose, [3, 2, 4, 5], [8, 4, 24, 96])
    );
    assert_eq!([t.op_params().i32(0), t.op_params().i32(1)], [1, 0]);
    assert_eq!(t.name(), "a (transposed)");
    assert_eq!(t.view_src(), Some(a));
    // Transposing a permuted view keeps the root.
    let tp = ctx.transpose(p).unwrap();
    assert_eq!(ctx[tp].view_src(), Some(a));
    assert_eq!(ctx[tp].ne(), [2, 4, 5, 3]);
}

#[test]
fn stale_ids_are_rejected_everywhere() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(F32, 4, 4).unwrap();
    let cp = ctx.checkpoint();
    let x = ctx.new_tensor_2d(F32, 4, 4).unwrap();
    let pos = ctx.new_tensor_1d(I32, 1).unwrap();
    ctx.rewind(cp);
    rejects!(ctx, ctx.add(w, x), GraphError::StaleId(id) if id == x);
    rejects!(ctx, ctx.add(x, w), GraphError::StaleId(id) if id == x);
    rejects!(ctx, ctx.mul_mat(w, x), GraphError::StaleId(_));
    rejects!(ctx, ctx.sqr(x), GraphError::StaleId(_));
    rejects!(ctx, ctx.scale(x, 1.0), GraphError::StaleId(_));
    rejects!(ctx, ctx.view_1d(x, 1, 0), GraphError::StaleId(_));
    rejects!(ctx, ctx.reshape(x, &[16]), GraphError::StaleId(_));
    rejects!(ctx, ctx.permute(x, [0, 1, 2, 3]), GraphError::StaleId(_));
    rejects!(ctx, ctx.transpose(x), GraphError::StaleId(_));
    rejects!(ctx, ctx.cpy(x, w), GraphError::StaleId(_));
    rejects!(
        ctx,
        ctx.soft_max_ext(w, Some(x), 1.0, 0.0),
        GraphError::StaleId(_)
    );
    rejects!(ctx, ctx.rope(w, pos, 2, 0), GraphError::StaleId(_));
    rejects!(ctx, ctx.get_rows(w, pos), GraphError::StaleId(_));
    rejects!(ctx, ctx.silu(x), GraphError::StaleId(_));
    rejects!(ctx, ctx.cont(x), GraphError::StaleId(_));
    rejects!(ctx, ctx.view_tensor(x), GraphError::StaleId(_));
    assert_eq!(ctx.set_name(x, "x"), Err(GraphError::StaleId(x)));
    assert_eq!(ctx.set_src(w, 0, Some(x)), Err(GraphError::StaleId(x)));
}

#[test]
fn view_op_classification() {
    for op in [Op::View, Op::Reshape, Op::Permute, Op::Transpose] {
        assert!(op.is_view_op(), "{op}");
    }
    for op in [Op::None, Op::Cpy, Op::Cont, Op::Dup, Op::Add, Op::MulMat] {
        assert!(!op.is_view_op(), "{op}");
    }
    // A CPY result is a storage view but not a view op.
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 4).unwrap();
    let b = ctx.new_tensor_1d(F32, 4).unwrap();
    let c = ctx.cpy(a, b).unwrap();
    assert!(ctx[c].is_view());
    assert!(!ctx[c].op().is_view_op());
}
