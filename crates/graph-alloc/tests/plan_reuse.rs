//! Re-applying a plan gives exactly the offsets the plan was made with, also for graphs laid
//! out by hand in ways `build_forward_expand` never produces: a source in no list, a source
//! listed as a later node, a node using one source twice, views of placed and unplaced roots.
//! And a graph whose sources moved to other positions is checked, not assumed to fit.

mod common;

use common::{cpu_like, preallocate};
use graph::{Context, ElementType::F32, Graph, TensorId};
use graph_alloc::GraphAllocator;

/// Every tensor of `ids` that has storage, with its offset.
fn offsets(ctx: &Context, ids: &[TensorId]) -> Vec<(TensorId, Option<usize>)> {
    ids.iter()
        .map(|&id| (id, ctx[id].storage().map(|s| s.offset)))
        .collect()
}

fn clear(ctx: &mut Context, ids: &[TensorId]) {
    for &id in ids {
        ctx[id].set_storage(None);
    }
}

/// A hand-made graph: `x` (input leaf), `hidden` (a source in no list), `later` (a node listed
/// after its consumer), `twice` (uses `x` in both slots), a view of `twice`, a view of a
/// pre-allocated weight, and an output.
fn odd_graph(ctx: &mut Context) -> (Graph, Vec<TensorId>) {
    let w = ctx.new_tensor_1d(F32, 64).unwrap();
    preallocate(ctx, &[w]);
    let x = ctx.new_tensor_1d(F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let hidden = ctx.sqr(x).unwrap();
    let later = ctx.sqrt(x).unwrap();
    let a = ctx.add(hidden, later).unwrap();
    let twice = ctx.mul(x, x).unwrap();
    let v = ctx.view_1d(twice, 32, 0).unwrap();
    let vw = ctx.view_1d(w, 32, 128).unwrap();
    let b = ctx.add(v, vw).unwrap();
    let c = ctx.add(a, twice).unwrap();
    ctx.set_output(c).unwrap();
    let mut g = Graph::new(32);
    for leaf in [w, x] {
        g.add_leaf(leaf).unwrap();
    }
    // `a` before `later`; `hidden` in no list
    for node in [a, later, twice, v, vw, b, c] {
        g.add_node(node).unwrap();
    }
    (g, vec![w, x, hidden, later, a, twice, v, vw, b, c])
}

#[test]
fn steady_state_gives_the_planned_offsets_on_hand_made_graphs() {
    let mut ctx = Context::new();
    let (g, all) = odd_graph(&mut ctx);
    let planned: Vec<TensorId> = all
        .iter()
        .copied()
        .filter(|&t| !ctx[t].has_storage())
        .collect();

    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.reserve(&ctx, &g).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let first = offsets(&ctx, &all);
    let size = galloc.buffer_size(0);
    assert!(first.iter().all(|(_, o)| o.is_some()), "{first:?}");

    for _ in 0..3 {
        clear(&mut ctx, &planned);
        galloc.alloc_graph(&mut ctx, &g).unwrap();
        assert_eq!(offsets(&ctx, &all), first);
        assert_eq!(galloc.buffer_size(0), size);
    }

    // a fresh allocator plans the same
    clear(&mut ctx, &planned);
    let mut fresh = GraphAllocator::new(&[cpu_like()]);
    fresh.alloc_graph(&mut ctx, &g).unwrap();
    assert_eq!(offsets(&ctx, &all), first);
    assert_eq!(fresh.buffer_size(0), size);
}

#[test]
fn a_rebuilt_graph_of_the_same_shape_reuses_the_plan() {
    let mut ctx = Context::new();
    let cp = ctx.checkpoint();
    let mut galloc = GraphAllocator::new(&[cpu_like(), cpu_like()]);
    let mut seen = None;
    for _ in 0..3 {
        let (g, all) = odd_graph(&mut ctx);
        let (nn, nl) = (g.n_nodes(), g.n_leafs());
        if seen.is_none() {
            galloc
                .reserve_n(&ctx, &g, &vec![1; nn], &vec![1; nl])
                .unwrap();
        }
        // new ids every step (the rewind bumps the generation): still the recorded plan,
        // and with two buffer ids no re-plan is possible, so a misfit would be an error
        galloc.alloc_graph(&mut ctx, &g).unwrap();
        let offs: Vec<_> = offsets(&ctx, &all).into_iter().map(|(_, o)| o).collect();
        match &seen {
            None => seen = Some(offs),
            Some(s) => assert_eq!(&offs, s),
        }
        ctx.rewind(cp);
    }
}

#[test]
fn sources_at_other_positions_are_checked() {
    let mut ctx = Context::new();
    let cp = ctx.checkpoint();
    let build = |ctx: &mut Context, n_big: i64, swap: bool| {
        let x = ctx.new_tensor_1d(F32, 64).unwrap();
        ctx.set_input(x).unwrap();
        let s = ctx.sqr(x).unwrap();
        let big = ctx.new_tensor_1d(F32, n_big).unwrap();
        ctx.set_input(big).unwrap();
        let y = ctx.sqrt(x).unwrap();
        // the consumer's first source is `s` (a node) or `x` (a leaf), by `swap`
        let first = if swap { x } else { s };
        let z = ctx.add(first, y).unwrap();
        let mut g = Graph::new(16);
        g.add_leaf(x).unwrap();
        g.add_leaf(big).unwrap();
        for node in [s, y, z] {
            g.add_node(node).unwrap();
        }
        (g, z)
    };
    let mut galloc = GraphAllocator::new(&[cpu_like(), cpu_like()]);
    let (g, _) = build(&mut ctx, 64, false);
    galloc.reserve_n(&ctx, &g, &[0, 0, 0], &[0, 0]).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    ctx.rewind(cp);

    // same shape and sizes, but a source moved: the plan's lifetimes and in-place choices
    // were made for another consumer structure, so it is not re-applied (the reference
    // re-applies it on sizes alone); with two buffer ids that is NeedsReserve, and nothing
    // is placed
    let (g, z) = build(&mut ctx, 64, true);
    assert!(matches!(
        galloc.alloc_graph(&mut ctx, &g),
        Err(graph_alloc::AllocError::NeedsReserve)
    ));
    assert!(!ctx[z].has_storage(), "nothing placed");
    galloc.reserve_n(&ctx, &g, &[0, 0, 0], &[0, 0]).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    assert!(ctx[z].has_storage());
    ctx.rewind(cp);
    let (g, _) = build(&mut ctx, 64, false);
    galloc.reserve_n(&ctx, &g, &[0, 0, 0], &[0, 0]).unwrap();
    ctx.rewind(cp);

    // a leaf grew: the plan does not fit, and with two buffer ids that is NeedsReserve
    let (g, z) = build(&mut ctx, 4096, false);
    assert!(matches!(
        galloc.alloc_graph(&mut ctx, &g),
        Err(graph_alloc::AllocError::NeedsReserve)
    ));
    assert!(!ctx[z].has_storage(), "nothing placed");
}

/// Regression (found by the scheduler's property test): a plan was re-applied to any graph of
/// the same node and leaf counts whose tensors fit its slots. A plan that wrote a node over a
/// non-input leaf (in place) was re-applied to a graph whose leaf is an INPUT read again later,
/// so the node overwrote the input before its second read: `x*x + x` came out as `2*x*x`.
#[test]
fn a_plan_is_not_reused_where_an_in_place_write_would_clobber_a_live_tensor() {
    let mut ctx = Context::new();
    let cp = ctx.checkpoint();
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    // plan: y = sqr(a) may be written over a (a is no input and has no other consumer)
    let a = ctx.new_tensor_1d(F32, 4).unwrap();
    let y = ctx.sqr(a).unwrap();
    let z = ctx.add(y, y).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, z).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let in_place = ctx[y].storage().unwrap().offset == ctx[a].storage().unwrap().offset;
    ctx.rewind(cp);
    assert!(in_place, "the first plan is expected to write y over a");

    // same counts and sizes: x is an INPUT and z reads it after y was computed
    let x = ctx.new_tensor_1d(F32, 4).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.sqr(x).unwrap();
    let z = ctx.add(y, x).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, z).unwrap();
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let off = |t| ctx[t].storage().unwrap().offset;
    assert_ne!(off(y), off(x), "y must not be written over the input x");
    assert_ne!(off(z), off(x), "z must not be written over the input x");
}

/// Regression (found by the scheduler's property test): views were counted on their root only
/// when they were nodes with an op, so the root of a view *leaf* was freed after its last
/// direct consumer and its memory given to a later node while the view was still to be read.
#[test]
fn the_root_of_a_view_leaf_lives_until_the_view_is_read() {
    let mut ctx = Context::new();
    let t0 = ctx.new_tensor_1d(F32, 4).unwrap();
    let t1 = ctx.sqr(t0).unwrap();
    let t2 = ctx.sqr(t1).unwrap();
    let v = ctx.view_tensor(t0).unwrap(); // a leaf: no op
    let t4 = ctx.add(t2, v).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, t4).unwrap();
    assert!(g.leafs().contains(&v));
    let mut galloc = GraphAllocator::new(&[cpu_like()]);
    galloc.alloc_graph(&mut ctx, &g).unwrap();
    let range = |t: TensorId| {
        let o = ctx[t].storage().unwrap().offset;
        o..o + 16
    };
    let root = range(t0);
    for t in [t1, t2] {
        let r = range(t);
        assert!(
            r.end <= root.start || root.end <= r.start,
            "{t:?} at {r:?} overlaps the root at {root:?}, read later through the view"
        );
    }
}
