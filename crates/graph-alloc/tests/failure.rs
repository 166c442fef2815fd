//! Failure injection: a buffer type that refuses allocations above N bytes. Errors surface as
//! typed errors, no buffer leaks, no tensor is left half-placed, and the next call works.

mod common;

use backend_core::BackendError;
use common::off;
use graph::{Context, ElementType::F32, Graph, TensorId};
use graph_alloc::{AllocError, GraphAllocator, LinearAllocator, alloc_ctx_tensors};
use test_fixtures::FakeBufferType;

fn chain(ctx: &mut Context, n: i64) -> (Graph, Vec<TensorId>) {
    let x = ctx.new_tensor_1d(F32, n).unwrap();
    ctx.set_input(x).unwrap();
    let a = ctx.cont(x).unwrap();
    let b = ctx.cont(a).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(ctx, b).unwrap();
    (g, vec![x, a, b])
}

fn refused(e: &AllocError) -> bool {
    matches!(
        e,
        AllocError::Backend(BackendError::AllocationFailed { .. })
    )
}

#[test]
fn graph_allocator_survives_a_refused_buffer() {
    let fake = FakeBufferType::new("small", 32).with_limit(600);
    let stats = fake.stats();
    let buft = fake.into_buffer_type();
    let mut galloc = GraphAllocator::new(&[buft]);
    let mut ctx = Context::new();
    let cp = ctx.checkpoint();

    // needs 1024 bytes: refused
    let (g, ts) = chain(&mut ctx, 128);
    let e = galloc.alloc_graph(&mut ctx, &g).unwrap_err();
    assert!(refused(&e), "{e:?}");
    assert_eq!(stats.refusals(), 1);
    assert_eq!((stats.live_buffers(), stats.live_bytes()), (0, 0));
    assert!(ts.iter().all(|&t| !ctx[t].has_storage()), "nothing placed");
    assert_eq!(galloc.buffer_size(0), 0);
    ctx.rewind(cp);

    // a graph that fits works right after
    let (g, ts) = chain(&mut ctx, 64);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 512);
    assert_eq!(
        ts.iter().map(|&t| off(&ctx, t)).collect::<Vec<_>>(),
        [0, 256, 0]
    );
    assert_eq!(stats.live_buffers(), 1);
    ctx.rewind(cp);

    // growing past the limit fails again; the failed id keeps no buffer
    let (g, _) = chain(&mut ctx, 128);
    assert!(refused(&galloc.alloc_graph(&mut ctx, &g).unwrap_err()));
    assert_eq!(galloc.buffer_size(0), 0);
    // the tensors of the earlier graph were dropped by the rewind, so the old buffer is gone
    assert_eq!(stats.live_buffers(), 0);

    // raise the limit: the same graph now works (the failed plan is not reused)
    stats.set_limit(usize::MAX);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(galloc.buffer_size(0), 1024);
    drop(galloc);
    ctx.rewind(cp);
    assert_eq!(
        (stats.live_buffers(), stats.live_bytes()),
        (0, 0),
        "no leak"
    );
}

#[test]
fn reserve_n_failure_on_second_buffer_type() {
    let big = FakeBufferType::new("big", 32);
    let small = FakeBufferType::new("small", 32).with_limit(100);
    let (big_stats, small_stats) = (big.stats(), small.stats());
    let mut galloc = GraphAllocator::new(&[big.into_buffer_type(), small.into_buffer_type()]);
    let mut ctx = Context::new();
    let (g, ts) = chain(&mut ctx, 64);
    let e = galloc.reserve_n(&ctx, &g, &[0, 1], &[0]).unwrap_err();
    assert!(refused(&e), "{e:?}");
    // the multi-id allocator cannot re-plan itself, and the failed plan is not used
    assert_eq!(
        galloc.alloc_graph(&mut ctx, &g),
        Err(AllocError::NeedsReserve)
    );
    assert!(ts.iter().all(|&t| !ctx[t].has_storage()));
    // a plan that keeps to the big type works
    galloc.reserve_n(&ctx, &g, &[0, 0], &[0]).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(small_stats.live_buffers(), 0);
    assert_eq!(big_stats.live_buffers(), 1);
    drop(galloc);
    drop(ctx);
    assert_eq!(big_stats.live_bytes() + small_stats.live_bytes(), 0);
}

#[test]
fn ctx_tensors_refused_part_frees_everything() {
    let fake = FakeBufferType::new("limited", 32)
        .with_max_size(1000)
        .with_limit(700);
    let stats = fake.stats();
    let buft = fake.into_buffer_type();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 100).unwrap(); // 416
    let b = ctx.new_tensor_1d(F32, 50).unwrap(); // 224 → first part 640
    let v = ctx.view_1d(a, 10, 40).unwrap();
    let c = ctx.new_tensor_1d(F32, 200).unwrap(); // 800 → second part, refused
    let all = [a, b, v, c];
    let e = alloc_ctx_tensors(&mut ctx, all, &buft).unwrap_err();
    assert!(refused(&e), "{e:?}");
    assert!(all.iter().all(|&t| !ctx[t].has_storage()));
    assert_eq!((stats.live_buffers(), stats.live_bytes()), (0, 0));

    stats.set_limit(usize::MAX);
    let buf = alloc_ctx_tensors(&mut ctx, all, &buft).unwrap().unwrap();
    assert_eq!(buf.size(), 640 + 800);
    assert_eq!(off(&ctx, v), 40);
}

#[test]
fn view_of_unplaced_root_is_an_error_and_rolls_back() {
    let buft = FakeBufferType::new("host", 32).into_buffer_type();
    let mut ctx = Context::new();
    let root = ctx.new_tensor_1d(F32, 100).unwrap();
    let a = ctx.new_tensor_1d(F32, 10).unwrap();
    let v = ctx.view_1d(root, 10, 0).unwrap();
    // root is not in the set, so the view cannot be initialised
    let e = alloc_ctx_tensors(&mut ctx, [a, v], &buft).unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::Backend(BackendError::ViewSourceNotAllocated(_))
        ),
        "{e:?}"
    );
    assert!(!ctx[a].has_storage(), "rolled back");
}

#[test]
fn linear_allocator_out_of_space_then_continues() {
    let buft = FakeBufferType::new("host", 32).into_buffer_type();
    let buffer = buft.alloc_buffer(512).unwrap();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 64).unwrap(); // 256
    let big = ctx.new_tensor_1d(F32, 100).unwrap(); // 416: does not fit after a
    let c = ctx.new_tensor_1d(F32, 60).unwrap(); // 240 → 256
    let mut la = LinearAllocator::new(&buffer).unwrap();
    la.alloc(&mut ctx, a).unwrap();
    assert_eq!(
        la.alloc(&mut ctx, big),
        Err(AllocError::OutOfSpace {
            tensor: big,
            needed: 416,
            available: 256
        })
    );
    assert!(!ctx[big].has_storage());
    // a view cannot be placed by the linear allocator, even with room left (checked before the
    // buffer is full, so that the refusal is not merely for lack of space)
    let v = ctx.view_1d(a, 4, 0).unwrap();
    assert_eq!(
        la.alloc(&mut ctx, v),
        Err(AllocError::Backend(BackendError::AlreadyAllocated(v)))
    );
    assert_eq!(la.offset(), 256);
    la.alloc(&mut ctx, c).unwrap();
    assert_eq!(off(&ctx, c), 256);
    assert_eq!(la.offset(), 512);
    // nor can a multi-buffer host one
    let multi = backend_core::Buffer::multi(vec![buffer.clone(), buffer]).unwrap();
    assert_eq!(
        LinearAllocator::new(&multi).unwrap_err(),
        AllocError::MultiBuffer
    );
}

/// A node whose source was rewired (`set_src`) to a tensor that a rewind then removed: the
/// source's id is stale and its index past the context's end. Planning is a typed error (the
/// per-tensor records were indexed by it before it was looked up), and the allocator then
/// plans the repaired graph.
#[test]
fn a_source_rewound_away_is_a_typed_error() {
    let mut galloc = GraphAllocator::new(&[FakeBufferType::new("cpu", 32).into_buffer_type()]);
    let mut ctx = Context::new();
    let (g, ts) = chain(&mut ctx, 8);
    let mark = ctx.checkpoint();
    let extra = ctx.new_tensor_1d(F32, 8).unwrap();
    let (_, _) = (
        ctx.new_tensor_1d(F32, 8).unwrap(),
        ctx.new_tensor_1d(F32, 8).unwrap(),
    );
    ctx.set_src(ts[2], 0, Some(extra)).unwrap();
    ctx.rewind(mark);
    let e = galloc.alloc_graph(&mut ctx, &g).unwrap_err();
    assert!(
        matches!(e, AllocError::Graph(graph::GraphError::StaleId(id)) if id == extra),
        "{e}"
    );
    ctx.set_src(ts[2], 0, Some(ts[1])).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
}
