//! graph_copy: layouts, views, sharing, data, and failures that leave nothing behind.

use backend_core::{BackendError, Buffer, tensor_alloc, tensor_get, tensor_set};
use graph::{Context, ElementType, Graph, TensorId};
use graph_copy::{CopyOptions, GraphCopyError, graph_copy, graph_copy_with};
use test_device::{TestDevice, TestDeviceConfig};

fn bytes(ctx: &Context, t: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).unwrap();
    v
}

struct Fixture {
    ctx: Context,
    g: Graph,
    x: TensorId,
    w: TensorId,
    xt: TensorId,
    m: TensorId,
    s: TensorId,
    unrelated: TensorId,
    _buf: Buffer,
}

/// x [4,3] f32, w [3,2] f32, xt = transpose(x) (a view), m = mul_mat(w, xt) uses x through
/// the view, s = add(m, m) reaches m twice.
fn fixture(dev: &backend_core::Device) -> Fixture {
    let mut ctx = Context::new();
    let unrelated = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 4, 3).unwrap();
    let w = ctx.new_tensor_2d(ElementType::F32, 3, 2).unwrap();
    let xt = ctx.transpose(x).unwrap();
    let m = ctx.mul_mat(w, xt).unwrap();
    let s = ctx.add(m, m).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(&mut ctx, s).unwrap();
    let buf = dev.buffer_type().alloc_buffer(4096).unwrap();
    let mut off = 0;
    for t in [unrelated, x, w, m, s] {
        tensor_alloc(&mut ctx, &buf, t, off).unwrap();
        off += 256;
    }
    backend_core::view_init(&mut ctx, xt).unwrap(); // made before x had storage
    for (i, t) in [x, w, m, s].into_iter().enumerate() {
        let n = ctx[t].nbytes();
        let data: Vec<u8> = (0..n).map(|k| (k * 7 + i * 31) as u8).collect();
        tensor_set(&ctx, t, 0, &data).unwrap();
    }
    Fixture {
        ctx,
        g,
        x,
        w,
        xt,
        m,
        s,
        unrelated,
        _buf: buf,
    }
}

#[test]
fn copies_layouts_views_data_into_one_aligned_buffer() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC")).unwrap();
    let dst = TestDevice::create(TestDeviceConfig::named("DST").alignment(64)).unwrap();
    let f = fixture(&src);
    let copy = graph_copy(&f.ctx, &f.g, &dst.buffer_type()).unwrap();
    let c = copy.ctx();

    // Reached tensors, each once (m is reached twice through s).
    let mut got: Vec<TensorId> = copy.tensors().to_vec();
    got.sort();
    let mut want = vec![f.x, f.w, f.xt, f.m, f.s];
    want.sort();
    assert_eq!(got, want);

    // Same layout, op and sources for every copy.
    for &t in copy.tensors() {
        assert!(c[t].same_layout(&f.ctx[t]));
        assert_eq!(c[t].op(), f.ctx[t].op());
        assert_eq!(c[t].srcs(), f.ctx[t].srcs());
    }
    // Non-views in the one new buffer, at offsets aligned to 64, in first-reached order. The
    // walk starts at the first node, xt, so the order is xt, x, m, w, s:
    // x (48 bytes) at 0, m ([2,4] f32, 32) at 64, w (24) at 128, s (32) at 192.
    let buf = copy.buffer();
    assert_eq!(buf.buffer_type(), &dst.buffer_type());
    assert_eq!(buf.size(), 192 + 32);
    let off = |t: TensorId| c[t].storage().unwrap().offset;
    assert_eq!([off(f.x), off(f.m), off(f.w), off(f.s)], [0, 64, 128, 192]);
    for t in [f.s, f.m, f.w, f.x] {
        assert!(buf.holds(c[t].storage().unwrap()));
    }
    // The view is rebuilt on its copied root.
    assert!(buf.holds(c[f.xt].storage().unwrap()));
    assert_eq!(off(f.xt), off(f.x) + f.ctx[f.xt].view_offs());
    // Data copied, for leafs and nodes alike.
    for t in [f.x, f.w, f.m, f.s] {
        assert_eq!(bytes(c, t), bytes(&f.ctx, t));
    }
    // A tensor outside the graph is not copied; the original is untouched.
    assert!(!c[f.unrelated].has_storage());
    assert!(!buf.holds(f.ctx[f.x].storage().unwrap()));
    // The graph is the same.
    assert_eq!(copy.graph().nodes(), f.g.nodes());
    assert_eq!(copy.graph().leafs(), f.g.leafs());
}

#[test]
fn unallocated_graph_is_refused() {
    let dev = TestDevice::create(TestDeviceConfig::default()).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let y = ctx.sqr(x).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let err = graph_copy(&ctx, &g, &dev.buffer_type()).unwrap_err();
    assert!(matches!(err, GraphCopyError::NotAllocated(t) if t == y || t == x));
}

#[test]
fn allocation_failure_is_typed_and_leaks_nothing() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC")).unwrap();
    let f = fixture(&src);
    // Needs 192 + 32 = 224 bytes at alignment 64 (see the layout test).
    let small =
        TestDevice::create(TestDeviceConfig::named("SMALL").alignment(64).memory(200)).unwrap();
    let err = graph_copy(&f.ctx, &f.g, &small.buffer_type()).unwrap_err();
    match err {
        GraphCopyError::Allocation { size, source, .. } => {
            assert_eq!(size, 224);
            assert!(matches!(source, BackendError::AllocationFailed { .. }));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(small.memory(), (200, 200));

    // Over the maximum buffer size, with memory for one buffer of 192 bytes only: the split
    // needs two (192 + 64), the second is refused, and the first is freed.
    let capped = TestDevice::create(
        TestDeviceConfig::named("CAP")
            .alignment(64)
            .max_buffer_size(223)
            .memory(200),
    )
    .unwrap();
    let err = graph_copy(&f.ctx, &f.g, &capped.buffer_type()).unwrap_err();
    match err {
        GraphCopyError::Allocation { size, source, .. } => {
            assert_eq!(size, 224, "the whole copy's size");
            assert!(matches!(source, BackendError::AllocationFailed { .. }));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(capped.memory(), (200, 200));

    // And a copy that fits frees its memory when dropped.
    let fits =
        TestDevice::create(TestDeviceConfig::named("FIT").alignment(64).memory(224)).unwrap();
    let copy = graph_copy(&f.ctx, &f.g, &fits.buffer_type()).unwrap();
    assert_eq!(fits.memory().0, 0);
    drop(copy);
    assert_eq!(fits.memory(), (224, 224));
}

#[test]
fn compare_skips_view_ops_and_reports_nodes_no_backend_computes() {
    let a = TestDevice::create(TestDeviceConfig::named("A").supported_ops([])).unwrap();
    let b = TestDevice::create(TestDeviceConfig::named("B").supported_ops([])).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_2d(ElementType::F32, 4, 2).unwrap();
    let v = ctx.transpose(x).unwrap();
    let r = ctx.reshape_1d(x, 8).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, v).unwrap();
    g.build_forward_expand(&mut ctx, r).unwrap();
    let buf = a.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    backend_core::view_init(&mut ctx, v).unwrap();
    backend_core::view_init(&mut ctx, r).unwrap();
    let (ba, bb) = (a.init_backend("").unwrap(), b.init_backend("").unwrap());
    let mut calls = 0;
    let rep = graph_copy::compare_graph_backends(&ba, &bb, &ctx, &g, |_| {
        calls += 1;
        true
    })
    .unwrap();
    assert_eq!((rep.compared, calls, rep.complete), (0, 0, true));
    assert!(rep.unsupported.is_empty());

    // A SQR neither computes ends the walk, listed for both.
    let s = ctx.sqr(x).unwrap();
    let buf2 = a.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &buf2, s, 0).unwrap();
    g.build_forward_expand(&mut ctx, s).unwrap();
    let rep = graph_copy::compare_graph_backends(&ba, &bb, &ctx, &g, |_| true).unwrap();
    assert!(!rep.complete);
    let who: Vec<&str> = rep.unsupported.iter().map(|u| u.backend.as_str()).collect();
    assert_eq!(who, ["A", "B"]);
    assert_eq!(rep.unsupported[0].op, "SQR");
}

#[test]
fn guards_surround_every_copied_tensor_and_catch_overwrites() {
    let dev = TestDevice::create(TestDeviceConfig::named("G").alignment(64)).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 12).unwrap(); // 48 bytes
    let y = ctx.sqr(x).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let buf = dev.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, y, 64).unwrap();
    let opts = graph_copy::CopyOptions { guard_bytes: 64 };
    let mut copy = graph_copy::graph_copy_with(&ctx, &g, &dev.buffer_type(), &opts).unwrap();
    // Layout by hand: guard 0..64, y at 64 (48 bytes), guard at 128..192, x at 192, guard at 256..320.
    assert_eq!(copy.buffer().size(), 320);
    let off = |c: &Context, t: TensorId| c[t].storage().unwrap().offset;
    assert_eq!((off(copy.ctx(), y), off(copy.ctx(), x)), (64, 192));
    assert!(copy.check_guards().unwrap().is_empty());
    // An out-of-bounds write just past y lands in y's guard.
    let buffer = copy.buffer().clone();
    let c = copy.ctx_mut();
    let intruder = c.new_tensor_1d(ElementType::I8, 1).unwrap();
    tensor_alloc(c, &buffer, intruder, 128).unwrap();
    tensor_set(c, intruder, 0, &[0]).unwrap();
    tensor_set(c, intruder, 0, &[1]).unwrap();
    assert_eq!(copy.check_guards().unwrap(), vec![Some(y)]);
    // Re-armed: no damage left.
    assert!(copy.check_guards().unwrap().is_empty());
}

/// Regression: the guard size is the caller's, and the layout added it unchecked (a debug
/// build panicked on an overflowing size). Past `usize` it is the allocation failure it
/// would be, and a sane guard then works.
#[test]
fn a_guard_size_past_usize_is_a_typed_error() {
    let dev = TestDevice::create(TestDeviceConfig::named("G").alignment(64)).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 12).unwrap();
    let y = ctx.sqr(x).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let buf = dev.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, y, 64).unwrap();
    for guard_bytes in [usize::MAX, usize::MAX - 64, usize::MAX / 2] {
        let opts = graph_copy::CopyOptions { guard_bytes };
        let e = graph_copy::graph_copy_with(&ctx, &g, &dev.buffer_type(), &opts).unwrap_err();
        assert!(matches!(e, GraphCopyError::Allocation { .. }), "{e}");
    }
    let opts = graph_copy::CopyOptions { guard_bytes: 64 };
    graph_copy::graph_copy_with(&ctx, &g, &dev.buffer_type(), &opts).unwrap();
}

/// Regression: `NodeComparison`'s fields are public, and `op` indexed its context by its id.
#[test]
fn a_node_comparison_of_a_foreign_id_has_no_op() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let y = ctx.sqr(x).unwrap();
    let empty = Context::new();
    let c = graph_copy::NodeComparison {
        index: 0,
        id: y,
        ctx1: &empty,
        ctx2: &ctx,
    };
    assert_eq!(c.op(), graph::Op::None);
    let c = graph_copy::NodeComparison { ctx1: &ctx, ..c };
    assert_eq!(c.op(), graph::Op::Sqr);
}

/// Six tensors of 64 bytes at alignment 64 (x, its view xv, and five nodes; the view takes
/// no bytes): 384 bytes, over a maximum of 128 bytes a buffer.
struct Chain {
    ctx: Context,
    g: Graph,
    x: TensorId,
    xv: TensorId,
    nodes: Vec<TensorId>,
    _buf: Buffer,
}

fn chain(dev: &backend_core::Device) -> Chain {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    let xv = ctx.view_1d(x, 16, 0).unwrap();
    let a = ctx.sqr(xv).unwrap();
    let b = ctx.add(a, x).unwrap();
    let c = ctx.scale(b, 0.5).unwrap();
    let d = ctx.add(c, a).unwrap();
    let e = ctx.sqr(d).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(&mut ctx, e).unwrap();
    let buf = dev.buffer_type().alloc_buffer(6 * 64).unwrap();
    let nodes = vec![a, b, c, d, e];
    for (i, t) in std::iter::once(x).chain(nodes.iter().copied()).enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 64 * i).unwrap();
        let data: Vec<u8> = (0..64).map(|k| (k * 13 + i * 41) as u8).collect();
        tensor_set(&ctx, t, 0, &data).unwrap();
    }
    backend_core::view_init(&mut ctx, xv).unwrap();
    Chain {
        ctx,
        g,
        x,
        xv,
        nodes,
        _buf: buf,
    }
}

#[test]
fn a_copy_over_the_maximum_size_is_split_into_three_buffers() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC").alignment(64)).unwrap();
    let dst = TestDevice::create(
        TestDeviceConfig::named("DST")
            .alignment(64)
            .max_buffer_size(128)
            .memory(4096),
    )
    .unwrap();
    let f = chain(&src);
    let copy = graph_copy(&f.ctx, &f.g, &dst.buffer_type()).unwrap();
    let c = copy.ctx();

    // 6 × 64 bytes at most 128 a buffer: exactly three buffers of two tensors each.
    assert!(copy.buffer().is_multi());
    let parts = copy.buffers();
    assert_eq!(parts.len(), 3);
    for p in parts {
        assert_eq!(p.size(), 128);
        assert_eq!(p.buffer_type(), &dst.buffer_type());
    }
    assert_eq!(copy.buffer().size(), 384);
    assert_eq!(dst.memory().0, 4096 - 384);
    let mut per_part = [0usize; 3];
    for t in std::iter::once(f.x).chain(f.nodes.iter().copied()) {
        let st = c[t].storage().unwrap();
        let k = parts.iter().position(|p| p.holds(st)).unwrap();
        per_part[k] += 1;
        assert!(st.offset + c[t].nbytes() <= 128);
        assert_eq!(st.offset % 64, 0);
    }
    assert_eq!(per_part, [2, 2, 2]);
    // The view sits on its copied root, in the root's part.
    let root = c[f.x].storage().unwrap();
    let view = c[f.xv].storage().unwrap();
    assert_eq!(view.offset, root.offset);
    assert!(parts.iter().any(|p| p.holds(root) && p.holds(view)));
    // Every value came along, through whichever part holds it.
    for t in std::iter::once(f.x)
        .chain(std::iter::once(f.xv))
        .chain(f.nodes.iter().copied())
    {
        assert_eq!(bytes(c, t), bytes(&f.ctx, t), "{t:?}");
    }
    // Dropping the copy frees all three.
    drop(copy);
    assert_eq!(dst.memory(), (4096, 4096));
}

#[test]
fn a_copy_that_fits_the_maximum_stays_in_one_exact_buffer() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC").alignment(64)).unwrap();
    let dst = TestDevice::create(
        TestDeviceConfig::named("DST")
            .alignment(64)
            .max_buffer_size(384),
    )
    .unwrap();
    let f = chain(&src);
    let copy = graph_copy(&f.ctx, &f.g, &dst.buffer_type()).unwrap();
    assert!(!copy.buffer().is_multi());
    assert_eq!(copy.buffers().len(), 1);
    assert_eq!(copy.buffer().size(), 384);
}

#[test]
fn a_tensor_over_the_maximum_size_is_a_typed_error_and_leaks_nothing() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC").alignment(64)).unwrap();
    let dst = TestDevice::create(
        TestDeviceConfig::named("DST")
            .alignment(64)
            .max_buffer_size(63)
            .memory(4096),
    )
    .unwrap();
    let f = chain(&src);
    let err = graph_copy(&f.ctx, &f.g, &dst.buffer_type()).unwrap_err();
    match err {
        GraphCopyError::TensorTooLarge {
            tensor, size, max, ..
        } => {
            assert!(tensor == f.x || f.nodes.contains(&tensor), "{tensor:?}");
            assert_eq!((size, max), (64, 63));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(dst.memory(), (4096, 4096));
}

#[test]
fn a_split_copy_keeps_its_guards() {
    let src = TestDevice::create(TestDeviceConfig::named("SRC").alignment(64)).unwrap();
    let dst = TestDevice::create(
        TestDeviceConfig::named("DST")
            .alignment(64)
            .max_buffer_size(256),
    )
    .unwrap();
    let f = chain(&src);
    // guard, then each of the six tensors followed by its guard: 13 × 64 bytes, four a buffer.
    let opts = CopyOptions { guard_bytes: 64 };
    let copy = graph_copy_with(&f.ctx, &f.g, &dst.buffer_type(), &opts).unwrap();
    assert_eq!(copy.buffers().len(), 4);
    assert_eq!(copy.buffer().size(), 13 * 64);
    assert!(copy.check_guards().unwrap().is_empty());
    for &t in &f.nodes {
        assert_eq!(bytes(copy.ctx(), t), bytes(&f.ctx, t));
    }
    // A guard that alone exceeds the maximum is the allocation failure it is.
    let big = CopyOptions { guard_bytes: 300 };
    let err = graph_copy_with(&f.ctx, &f.g, &dst.buffer_type(), &big).unwrap_err();
    assert!(
        matches!(
            err,
            GraphCopyError::Allocation {
                source: BackendError::TooLarge { .. },
                ..
            }
        ),
        "{err}"
    );
}
