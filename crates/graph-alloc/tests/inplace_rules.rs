//! The in-place rule of `allocate_node` (spec §7.5, step 2), one condition per test.
//!
//! Each expected offset is worked out by hand from the spec's planning pass (§7.7: leafs,
//! counting, sweep; §7.2: best-fit blocks, alignment 32) and written in the test's comment;
//! none is produced by this crate. The sources `x`/`y` are pre-allocated in a separate
//! buffer (never "own", so never reused), which keeps every case down to the one rule it is
//! about.

mod common;

use common::{cpu_like, off, preallocate};
use graph::{Context, ElementType::F32, Graph, TensorId};
use graph_alloc::GraphAllocator;
use test_fixtures::FakeBufferType;

fn graph_of(ctx: &mut Context, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(64);
    for &o in outs {
        g.build_forward_expand(ctx, o).unwrap();
    }
    g
}

/// `c = add(a, b)` over two fresh 256-byte results; `a_output` flags `a` OUTPUT.
/// Returns (a, b, c) after allocation and the buffer size.
fn add_of_two(a_output: bool) -> (Context, [TensorId; 3], usize) {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    preallocate(&mut ctx, &[x]);
    let a = ctx.sqr(x).unwrap();
    if a_output {
        ctx.set_output(a).unwrap();
    }
    let b = ctx.sqrt(x).unwrap();
    let c = ctx.add(a, b).unwrap();
    let g = graph_of(&mut ctx, &[c]);
    assert_eq!(g.nodes(), &[a, b, c]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let size = galloc.buffer_size(0);
    (ctx, [a, b, c], size)
}

/// Slots are tried in order and the first qualifying one wins: with both sources eligible,
/// `c` takes `a`'s place (a at 0, b at 256, c at 0; 512 bytes).
#[test]
fn the_first_qualifying_source_slot_wins() {
    let (ctx, [a, b, c], size) = add_of_two(false);
    assert_eq!((off(&ctx, a), off(&ctx, b), off(&ctx, c)), (0, 256, 0));
    assert_eq!(size, 512);
}

/// Slot 0 is an OUTPUT (rule b), so slot 1 is tried and wins: a at 0, b at 256, c at 256
/// (b's place); 512 bytes, not the 768 a fresh `c` would need.
#[test]
fn source_slot_1_wins_when_slot_0_cannot() {
    let (ctx, [a, b, c], size) = add_of_two(true);
    assert_eq!((off(&ctx, a), off(&ctx, b), off(&ctx, c)), (0, 256, 256));
    assert_eq!(size, 512);
}

/// Rule c: a source whose layout differs from the result is never reused, even when it is
/// the only candidate. `c = add(a, b)` with a [64, 4] OUTPUT (1024 bytes at 0) and a
/// broadcast b [64, 1] (256 bytes at 1024) in its last use: c is fresh at 1280; 2304 bytes.
#[test]
fn a_layout_mismatch_blocks_reuse() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_2d(F32, 64, 4).unwrap();
    let y = ctx.new_tensor_2d(F32, 64, 1).unwrap();
    preallocate(&mut ctx, &[x, y]);
    let a = ctx.sqr(x).unwrap();
    ctx.set_output(a).unwrap();
    let b = ctx.sqrt(y).unwrap();
    let c = ctx.add(a, b).unwrap();
    let g = graph_of(&mut ctx, &[c]);
    assert_eq!(g.nodes(), &[a, b, c]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!((off(&ctx, a), off(&ctx, b), off(&ctx, c)), (0, 1024, 1280));
    assert_eq!(galloc.buffer_size(0), 2304);
}

/// Rule d: a parent with a live view is not reused. Nodes p = sqr(x), v = view(p),
/// c = sqrt(p), w = scale(v), out = add(c, w). At c, p has one child left (c) but one view
/// whose consumer w has not run: c is fresh at 256. w is fresh at 512; after w, v's last
/// consumer, p is freed; out reuses c (its last use) at 256. 768 bytes.
#[test]
fn a_parent_with_live_views_is_not_reused() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    preallocate(&mut ctx, &[x]);
    let p = ctx.sqr(x).unwrap();
    let v = ctx.view_1d(p, 64, 0).unwrap();
    let c = ctx.sqrt(p).unwrap();
    let w = ctx.scale(v, 2.0).unwrap();
    let out = ctx.add(c, w).unwrap();
    let g = graph_of(&mut ctx, &[v, c, out]);
    assert_eq!(g.nodes(), &[p, v, c, w, out]);
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let got: Vec<usize> = [p, v, c, w, out].iter().map(|&t| off(&ctx, t)).collect();
    assert_eq!(got, [0, 0, 256, 512, 256]);
    assert_eq!(galloc.buffer_size(0), 768);
}

/// Note to §7.5: the child inherits the parent's buffer id, whatever id it was asked for.
/// p = sqr(x) on id 0 (at 0), c = scale(p) asked on id 1 but computed in place over p (in
/// buffer 0, at 0), d = sqr(x) on id 1 (at 0 of buffer 1). Buffer 1 holds only d: 256 bytes.
#[test]
fn an_in_place_child_inherits_the_parents_buffer_id() {
    let a = FakeBufferType::new("A", 32).into_buffer_type();
    let b = FakeBufferType::new("B", 64).into_buffer_type();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    preallocate(&mut ctx, &[x]);
    let p = ctx.sqr(x).unwrap();
    let c = ctx.scale(p, 2.0).unwrap();
    let d = ctx.sqr(x).unwrap();
    let g = graph_of(&mut ctx, &[c, d]);
    assert_eq!(g.nodes(), &[p, c, d]);
    assert_eq!(g.n_leafs(), 1);
    let mut galloc = GraphAllocator::new(&[a, b]);
    galloc.reserve_n(&ctx, &g, &[0, 1, 1], &[0]).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let in_buffer = |t: TensorId, id: usize| {
        galloc
            .buffer(id)
            .is_some_and(|buf| buf.holds(ctx[t].storage().unwrap()))
    };
    assert!(
        in_buffer(p, 0) && in_buffer(c, 0),
        "c lives with its parent"
    );
    assert!(in_buffer(d, 1));
    assert_eq!((off(&ctx, p), off(&ctx, c), off(&ctx, d)), (0, 0, 0));
    assert_eq!(galloc.buffer_size(0), 256);
    assert_eq!(galloc.buffer_size(1), 256);
}
