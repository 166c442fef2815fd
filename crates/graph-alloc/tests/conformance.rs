//! The reference's observed offsets (spec §6.4 and §7.12), reproduced offset for offset.
//!
//! Every expected number below is copied from the spec's tables (observed on ggml NOV24 with
//! the CPU buffer type, alignment 32), not produced by this crate.
//!
//! Three ops of the spec's graphs (REPEAT, SUM_ROWS, SUM) do not exist in the `graph` crate.
//! They are stood in for by MUL_MAT with a pre-allocated second operand that gives the same
//! result shape. That is exact for the allocator: it looks only at an op's in-place ability
//! (none of the four ops can run in place), at layouts, at sources and at flags, and a source
//! that already has storage is skipped by every phase (never placed, counted, freed or reused),
//! so the stand-in operand changes nothing but the leaf list, where it is skipped too.

mod common;

use common::{cpu_like, off, preallocate};
use graph::{Context, ElementType::F32, Graph, TensorId};
use graph_alloc::{AllocError, GraphAllocator, alloc_ctx_tensors};
use test_fixtures::FakeBufferType;

fn graph_of(ctx: &mut Context, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(64);
    for &o in outs {
        g.build_forward_expand(ctx, o).unwrap();
    }
    g
}

fn check(ctx: &Context, expected: &[(TensorId, usize)]) {
    for &(id, want) in expected {
        assert_eq!(off(ctx, id), want, "offset of {}", ctx[id].name());
    }
}

/// §6.4: alignment 32, max size 1000.
#[test]
fn ctx_tensors_split_by_max_size() {
    let fake = FakeBufferType::new("CPU", 32).with_max_size(1000);
    let stats = fake.stats();
    let buft = fake.into_buffer_type();
    let mut ctx = Context::new();
    let t0 = ctx.new_tensor_1d(F32, 100).unwrap();
    let t1 = ctx.new_tensor_1d(F32, 50).unwrap();
    let view = ctx.view_1d(t0, 10, 40).unwrap();
    let t2 = ctx.new_tensor_1d(F32, 120).unwrap();
    let t3 = ctx.new_tensor_1d(F32, 10).unwrap();
    let t4 = ctx.new_tensor_1d(F32, 200).unwrap();
    let t5 = ctx.new_tensor_1d(F32, 7).unwrap();
    let all: Vec<TensorId> = ctx.ids().collect();
    let buf = alloc_ctx_tensors(&mut ctx, all, &buft).unwrap().unwrap();
    assert!(buf.is_multi());
    assert_eq!(buf.size(), 2016);
    let sizes: Vec<usize> = buf.parts().iter().map(|b| b.size()).collect();
    assert_eq!(sizes, [640, 544, 832]);
    assert_eq!(stats.live_buffers(), 3);
    let part = |id: TensorId| {
        let st = ctx[id].storage().unwrap();
        buf.parts().iter().position(|p| p.holds(st)).unwrap()
    };
    let expected = [
        (t0, 0, 0),
        (t1, 0, 416),
        (t2, 1, 0),
        (view, 0, 40),
        (t3, 1, 480),
        (t4, 2, 0),
        (t5, 2, 800),
    ];
    for (id, p, o) in expected {
        assert_eq!((part(id), off(&ctx, id)), (p, o), "{}", ctx[id].name());
    }
}

/// §6.4: one F32[300] tensor (1216 padded) with max size 1000 is an error.
#[test]
fn ctx_tensor_too_large() {
    let fake = FakeBufferType::new("CPU", 32).with_max_size(1000);
    let stats = fake.stats();
    let buft = fake.into_buffer_type();
    let mut ctx = Context::new();
    let small = ctx.new_tensor_1d(F32, 10).unwrap();
    let big = ctx.new_tensor_1d(F32, 300).unwrap();
    let err = alloc_ctx_tensors(&mut ctx, [small, big], &buft).unwrap_err();
    assert!(
        matches!(err, AllocError::TensorTooLarge { tensor, size: 1216, max: 1000, .. } if tensor == big),
        "{err:?}"
    );
    assert!(!ctx[small].has_storage());
    assert_eq!(stats.live_buffers(), 0);
}

/// §6.3: nothing to allocate → no buffer, views not initialised.
#[test]
fn ctx_tensors_nothing_to_do() {
    let buft = cpu_like();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 0).unwrap();
    assert!(alloc_ctx_tensors(&mut ctx, [a], &buft).unwrap().is_none());
    assert!(alloc_ctx_tensors(&mut ctx, [], &buft).unwrap().is_none());
}

/// §7.12 A1: a chain of in-place ops over an INPUT.
#[test]
fn a1_inplace_chain() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 100).unwrap();
    ctx.set_input(a).unwrap();
    let b = ctx.new_tensor_1d(F32, 100).unwrap();
    let c = ctx.add(a, b).unwrap();
    let d = ctx.scale(c, 2.0).unwrap();
    let e = ctx.mul(d, b).unwrap();
    ctx.set_output(e).unwrap();
    let g = graph_of(&mut ctx, &[e]);
    assert_eq!(g.leafs(), &[a, b]);
    assert_eq!(g.nodes(), &[c, d, e]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 832);
    check(&ctx, &[(a, 0), (b, 416), (c, 0), (d, 0), (e, 0)]);
}

/// §7.12 A2: free-list reuse and a view.
#[test]
fn a2_free_list_and_view() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    // stand-ins: repeat(x → [256]), sum_rows(→ [1]), repeat(→ [128])
    let w1 = ctx.new_tensor_2d(F32, 64, 256).unwrap();
    let w2 = ctx.new_tensor_2d(F32, 256, 1).unwrap();
    let w3 = ctx.new_tensor_2d(F32, 1, 128).unwrap();
    preallocate(&mut ctx, &[w1, w2, w3]);
    let p1 = ctx.mul_mat(w1, x).unwrap(); // [256, 1]
    let p2 = ctx.mul_mat(p1, w2).unwrap(); // [1, 1]
    let p3 = ctx.mul_mat(p2, w3).unwrap(); // [1, 128]
    let p3v = ctx.view_1d(p3, 64, 0).unwrap();
    let p4 = ctx.cont(p3v).unwrap();
    let p5 = ctx.add(p4, x).unwrap();
    let g = graph_of(&mut ctx, &[p5]);
    assert_eq!(g.nodes(), &[p1, p2, p3, p3v, p4, p5]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 1312);
    check(
        &ctx,
        &[
            (x, 0),
            (p1, 256),
            (p2, 1280),
            (p3, 256),
            (p3v, 256),
            (p4, 768),
            (p5, 768),
        ],
    );
}

/// §7.12 A3: views and results of the in-place API.
#[test]
fn a3_views_and_inplace_api() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(a).unwrap();
    let s = ctx.sqr(a).unwrap();
    let t = ctx.sqr(a).unwrap();
    let v = ctx.view_1d(s, 64, 0).unwrap();
    let u = ctx.sqrt(v).unwrap();
    let w = ctx.add_inplace(u, t).unwrap();
    let z = ctx.scale(w, 0.5).unwrap();
    let g = graph_of(&mut ctx, &[z]);
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &[s, v, u, t, w, z]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 768);
    check(
        &ctx,
        &[
            (a, 0),
            (s, 256),
            (v, 256),
            (u, 512),
            (t, 0),
            (w, 512),
            (z, 0),
        ],
    );
}

/// §7.12 E1: tie-breaking, a repeated source, an OUTPUT parent.
#[test]
fn e1_ties_repeated_src_output_parent() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let wsum = ctx.new_tensor_1d(F32, 64).unwrap(); // stand-in operand for sum()
    preallocate(&mut ctx, &[wsum]);
    let [a, b, c, d, f] = [0; 5].map(|_| ctx.cont(x).unwrap());
    let e = ctx.mul_mat(a, c).unwrap();
    let gg = ctx.mul(f, f).unwrap();
    ctx.set_output(gg).unwrap();
    let h = ctx.sqr(gg).unwrap();
    let k = ctx.mul_mat(b, d).unwrap();
    let m = ctx.add(k, e).unwrap();
    let sh = ctx.mul_mat(h, wsum).unwrap(); // sum(h): [1, 1]
    let n = ctx.add(sh, m).unwrap();
    let g = graph_of(&mut ctx, &[n]);
    assert_eq!(g.nodes(), &[f, gg, h, sh, b, d, k, a, c, e, m, n]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 1088);
    check(
        &ctx,
        &[
            (x, 0),
            (f, 256),
            (gg, 512),
            (h, 256),
            (sh, 768),
            (b, 256),
            (d, 800),
            (k, 1056),
            (a, 800),
            (c, 256),
            (e, 0),
            (m, 1056),
            (n, 768),
        ],
    );
}

/// §7.12 E2: two buffer ids with the same buffer type share one buffer.
#[test]
fn e2_two_ids_one_buffer_type() {
    let fake = FakeBufferType::new("CPU", 32);
    let stats = fake.stats();
    let buft = fake.into_buffer_type();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let a = ctx.cont(x).unwrap();
    let b = ctx.cont(a).unwrap();
    let g = graph_of(&mut ctx, &[b]);
    let mut galloc = GraphAllocator::new(&[buft.clone(), buft]);
    assert_eq!(galloc.n_buffers(), 2);
    assert_eq!(
        galloc.alloc_graph(&mut ctx, &g),
        Err(AllocError::NeedsReserve)
    );
    assert!(!ctx[x].has_storage(), "nothing placed");
    galloc.reserve_n(&ctx, &g, &[0, 1], &[1]).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 512);
    assert_eq!(galloc.buffer_size(1), 0);
    assert_eq!(galloc.buffer(0), galloc.buffer(1));
    assert_eq!(stats.live_buffers(), 1);
    check(&ctx, &[(x, 0), (a, 256), (b, 0)]);
}

/// §7.12 A4: the plan is reused while sizes shrink and re-made when a node grows.
#[test]
fn a4_plan_reuse_and_replan() {
    let mut ctx = Context::new();
    let cp = ctx.checkpoint();
    let build = |ctx: &mut Context, n: i64| {
        let a = ctx.new_tensor_1d(F32, n).unwrap();
        ctx.set_input(a).unwrap();
        let b = ctx.sqr(a).unwrap();
        let c = ctx.add(a, b).unwrap();
        let g = graph_of(ctx, &[c]);
        (g, a, b, c)
    };
    let mut galloc = GraphAllocator::new(&[cpu_like()]);

    let (g, a, b, c) = build(&mut ctx, 1000);
    galloc.reserve(&ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 8000);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    check(&ctx, &[(a, 0), (b, 4000), (c, 0)]);
    ctx.rewind(cp);

    let (g, _, b, _) = build(&mut ctx, 500);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 8000);
    assert_eq!(off(&ctx, b), 4000, "old plan reused");
    ctx.rewind(cp);

    let (g, _, b, _) = build(&mut ctx, 2000);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 16000);
    assert_eq!(off(&ctx, b), 8000, "re-planned");
}

/// §7.9 improvement: a leaf that lost its storage since the plan was made forces a re-plan
/// (the reference uses a stale record here).
#[test]
fn leaf_that_lost_its_storage_replans() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_1d(F32, 64).unwrap();
    preallocate(&mut ctx, &[w]);
    let cp = ctx.checkpoint();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.add(x, w).unwrap();
    let g = graph_of(&mut ctx, &[y]);
    assert_eq!(g.leafs(), &[x, w]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 256);
    ctx.rewind(cp);

    // same shape, but now the second leaf needs bytes from the allocator
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let w2 = ctx.new_tensor_1d(F32, 64).unwrap();
    let y = ctx.add(x, w2).unwrap();
    let g = graph_of(&mut ctx, &[y]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 512);
    check(&ctx, &[(x, 0), (w2, 256), (y, 0)]);

    // and with several buffer ids the same situation asks for a reserve
    let mut ctx2 = Context::new();
    let w = ctx2.new_tensor_1d(F32, 64).unwrap();
    preallocate(&mut ctx2, &[w]);
    let cp = ctx2.checkpoint();
    let x = ctx2.new_tensor_1d(F32, 64).unwrap();
    let y = ctx2.add(x, w).unwrap();
    let g = graph_of(&mut ctx2, &[y]);
    let mut galloc = GraphAllocator::new(&[cpu_like(), cpu_like()]);
    galloc.reserve_n(&ctx2, &g, &[0], &[0, 0]).unwrap();
    galloc.alloc_graph(&mut ctx2, &g).unwrap();
    ctx2.rewind(cp);
    let x = ctx2.new_tensor_1d(F32, 64).unwrap();
    let w2 = ctx2.new_tensor_1d(F32, 64).unwrap();
    let y = ctx2.add(x, w2).unwrap();
    let g = graph_of(&mut ctx2, &[y]);
    assert_eq!(
        galloc.alloc_graph(&mut ctx2, &g),
        Err(AllocError::NeedsReserve)
    );
}

/// Our fix of the spec's §7.7 caveat: a root whose view is an OUTPUT is never freed.
#[test]
fn output_view_protects_its_root() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let a = ctx.sqr(x).unwrap(); // 256 bytes
    let av = ctx.view_1d(a, 64, 0).unwrap();
    ctx.set_output(av).unwrap();
    let b = ctx.sqrt(av).unwrap(); // last consumer of the view
    let c = ctx.cont(b).unwrap(); // a fresh tensor after the view's consumers ran
    let d = ctx.cont(c).unwrap();
    let g = graph_of(&mut ctx, &[av, d]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let a_off = off(&ctx, a);
    assert_eq!(off(&ctx, x), a_off, "a is computed in place over its input");
    for t in [b, c, d] {
        let o = off(&ctx, t);
        assert!(
            o + 256 <= a_off || a_off + 256 <= o,
            "{} overlaps the output view",
            ctx[t].name()
        );
    }
}

#[test]
fn bad_buffer_ids_are_errors() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    let a = ctx.cont(x).unwrap();
    let g = graph_of(&mut ctx, &[a]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    assert_eq!(
        galloc.reserve_n(&ctx, &g, &[1], &[0]),
        Err(AllocError::BufferIdOutOfRange {
            id: 1,
            n_buffers: 1
        })
    );
    assert_eq!(
        galloc.reserve_n(&ctx, &g, &[0, 0], &[0]),
        Err(AllocError::BufferIdCount {
            what: "nodes",
            expected: 1,
            got: 2
        })
    );
    galloc.reserve_n(&ctx, &g, &[0], &[0]).unwrap();
    assert_eq!(galloc.buffer_size(7), 0);
    assert!(galloc.buffer(7).is_none());
    let mut none = GraphAllocator::new(&[]);
    assert!(matches!(
        none.alloc_graph(&mut ctx, &g),
        Err(AllocError::NeedsReserve | AllocError::BufferIdOutOfRange { .. })
    ));
}
