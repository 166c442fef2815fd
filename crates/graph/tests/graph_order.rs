//! Graph build order: nodes and leafs exactly as ggml's `build_forward_expand` produces them.
//!
//! The rules (spec §2.2), applied by hand to each graph below:
//! 1. visit(t): if t is already visited, stop; otherwise mark it *before* recursing;
//! 2. visit src[0], src[1], … src[9] in slot order (never `view_src`);
//! 3. append t: op NONE and not PARAM → leafs, else → nodes; unnamed tensors become
//!    `leaf_<i>` / `node_<i>` with i their index in that list.
//!
//! Every expected order is written out by hand from these rules; none is produced by the code
//! under test.

use graph::{Context, ElementType, Graph, GraphError, Op, TensorId};

use ElementType::F32;

fn leaf(ctx: &mut Context, name: &str) -> TensorId {
    let t = ctx.new_tensor_1d(F32, 8).unwrap();
    ctx.set_name(t, name).unwrap();
    t
}

fn expand(ctx: &mut Context, cap: usize, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(cap);
    for &t in outs {
        g.build_forward_expand(ctx, t).unwrap();
    }
    g
}

#[test]
fn spec_example_2_2() {
    // z = scale(w), w = add_inplace(u, t), u = sqrt(view(s)), s = sqr(a), t = sqr(a).
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let s = ctx.sqr(a).unwrap();
    let v = ctx.view_1d(s, 8, 0).unwrap();
    let u = ctx.sqrt(v).unwrap();
    let t = ctx.sqr(a).unwrap();
    let w = ctx.add_inplace(u, t).unwrap();
    let z = ctx.scale(w, 0.5).unwrap();
    let g = expand(&mut ctx, 16, &[z]);
    // visit z → w → u → v → s → a: leaf a; append s, v, u; back in w: src1 t → a (visited),
    // append t; append w; append z.
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &[s, v, u, t, w, z]);
    // The view's name came from its source when it was made, before s was named "node_0".
    assert_eq!(ctx[s].name(), "node_0");
    assert_eq!(ctx[v].name(), " (view)");
    assert_eq!(ctx[t].name(), "node_3");
    assert_eq!(ctx[a].name(), "a");
}

#[test]
fn shared_source_reached_twice() {
    // y = mul_mat(w, x); z = add(y, x): x is reached from y and again from z.
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    let x = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    let y = ctx.mul_mat(w, x).unwrap(); // [4, 4]
    let x2 = ctx.new_tensor_2d(F32, 4, 4).unwrap();
    let z = ctx.add(y, x2).unwrap();
    let z2 = ctx.mul(z, y).unwrap();
    let g = expand(&mut ctx, 16, &[z2]);
    // z2 → z → y → w (leaf 0), x (leaf 1), append y; z: src1 x2 (leaf 2), append z;
    // z2: src1 y visited; append z2.
    assert_eq!(g.leafs(), &[w, x, x2]);
    assert_eq!(g.nodes(), &[y, z, z2]);
    assert_eq!(
        [w, x, x2].map(|t| ctx[t].name().to_owned()),
        ["leaf_0", "leaf_1", "leaf_2"]
    );
    assert_eq!(
        [y, z, z2].map(|t| ctx[t].name().to_owned()),
        ["node_0", "node_1", "node_2"]
    );
}

#[test]
fn diamond() {
    // b = sqr(a), c = sqrt(a), d = add(b, c), e = mul(d, b).
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let b = ctx.sqr(a).unwrap();
    let c = ctx.sqrt(a).unwrap();
    let d = ctx.add(b, c).unwrap();
    let e = ctx.mul(d, b).unwrap();
    let g = expand(&mut ctx, 16, &[e]);
    // e → d → b → a (leaf), append b; d: src1 c → a visited, append c; append d;
    // e: src1 b visited; append e.
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &[b, c, d, e]);
}

#[test]
fn source_slot_order_beats_creation_order() {
    // c is created after b but sits in slot 0, so it is visited first.
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let k = leaf(&mut ctx, "k");
    let b = ctx.sqr(a).unwrap();
    let c = ctx.sqr(k).unwrap();
    let d = ctx.add(c, b).unwrap();
    let g = expand(&mut ctx, 16, &[d]);
    // d → c → k (leaf 0), append c; d: src1 b → a (leaf 1), append b; append d.
    assert_eq!(g.leafs(), &[k, a]);
    assert_eq!(g.nodes(), &[c, b, d]);
}

#[test]
fn views_of_views_collapse_to_the_root() {
    let mut ctx = Context::new();
    // a: F32 [4, 6] (96 bytes, rows of 16).
    let a = ctx.new_tensor_2d(F32, 4, 6).unwrap();
    ctx.set_name(a, "a").unwrap();
    // v1: rows 1..4 (offset 16); v2: 4 elements at offset 8 inside v1 → 24 in a;
    // v3: reshape of v2 → still a at 24; v4: transpose of v3 → a at 24.
    let v1 = ctx.view_2d(a, 4, 3, 16, 16).unwrap();
    let v2 = ctx.view_1d(v1, 4, 8).unwrap();
    let v3 = ctx.reshape_2d(v2, 2, 2).unwrap();
    let v4 = ctx.transpose(v3).unwrap();
    for (v, offs) in [(v1, 16), (v2, 24), (v3, 24), (v4, 24)] {
        assert_eq!(ctx[v].view_src(), Some(a));
        assert_eq!(ctx[v].view_offs(), offs);
    }
    assert_eq!(ctx[v2].op_params().u64(0), 8); // the requested offset, not the collapsed one
    assert_eq!(ctx[v4].name(), "a (view) (view) (reshaped) (transposed)");
    let s = ctx.sqr(v4).unwrap();
    let g = expand(&mut ctx, 16, &[s]);
    // Graph building follows src[0] (v4 → v3 → v2 → v1 → a), not view_src.
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &[v1, v2, v3, v4, s]);
}

#[test]
fn view_src_is_not_followed() {
    // view_tensor has no op and no sources: it is a leaf, and its root is not reached.
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let v = ctx.view_tensor(a).unwrap();
    let s = ctx.sqr(v).unwrap();
    let g = expand(&mut ctx, 16, &[s]);
    assert_eq!(g.leafs(), &[v]);
    assert_eq!(g.nodes(), &[s]);
    assert!(!g.contains(a));
}

#[test]
fn cpy_into_a_view_of_a_cache() {
    let mut ctx = Context::new();
    let cache = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    ctx.set_name(cache, "cache").unwrap();
    let x = leaf(&mut ctx, "x");
    let slot = ctx.view_1d(cache, 8, 64).unwrap(); // row 2
    let c = ctx.cpy(x, slot).unwrap();
    // Attention reads the whole cache after the write.
    let q = leaf(&mut ctx, "q");
    let kq = ctx.mul_mat(cache, q).unwrap();
    let g = expand(&mut ctx, 16, &[c, kq]);
    // expand(c): c → x (leaf 0); slot → cache (leaf 1), append slot; append c.
    // expand(kq): kq → cache visited; q (leaf 2); append kq.
    assert_eq!(g.leafs(), &[x, cache, q]);
    assert_eq!(g.nodes(), &[slot, c, kq]);
    assert_eq!(ctx[c].op(), Op::Cpy);
    assert_eq!((ctx[c].view_src(), ctx[c].view_offs()), (Some(cache), 64));
}

#[test]
fn expand_calls_accumulate() {
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let b = ctx.sqr(a).unwrap();
    let c = ctx.sqrt(a).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(&mut ctx, b).unwrap();
    assert_eq!((g.leafs(), g.nodes()), (&[a][..], &[b][..]));
    g.build_forward_expand(&mut ctx, c).unwrap();
    assert_eq!(g.nodes(), &[b, c]);
    let d = ctx.add(c, b).unwrap();
    g.build_forward_expand(&mut ctx, d).unwrap();
    assert_eq!(g.nodes(), &[b, c, d]);
    // Already present: nothing changes.
    g.build_forward_expand(&mut ctx, b).unwrap();
    g.build_forward_expand(&mut ctx, a).unwrap();
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &[b, c, d]);
    // Expanding a leaf alone adds just the leaf.
    let lone = leaf(&mut ctx, "lone");
    g.build_forward_expand(&mut ctx, lone).unwrap();
    assert_eq!(g.leafs(), &[a, lone]);
    // The other order gives a different graph: c's post-order first.
    let mut g2 = Graph::new(16);
    g2.build_forward_expand(&mut ctx, c).unwrap();
    g2.build_forward_expand(&mut ctx, d).unwrap();
    assert_eq!(g2.nodes(), &[c, b, d]);
}

#[test]
fn param_tensors_are_nodes() {
    let mut ctx = Context::new();
    let p = leaf(&mut ctx, "p");
    ctx.set_param(p).unwrap();
    let x = leaf(&mut ctx, "x");
    let y = ctx.mul(p, x).unwrap();
    let g = expand(&mut ctx, 16, &[y]);
    // y → p (op NONE but PARAM: node 0), x (leaf 0); append y.
    assert_eq!(g.nodes(), &[p, y]);
    assert_eq!(g.leafs(), &[x]);
}

#[test]
fn lookups_and_views() {
    let mut ctx = Context::new();
    let a = leaf(&mut ctx, "a");
    let b = ctx.sqr(a).unwrap();
    let c = ctx.sqrt(b).unwrap();
    let d = ctx.silu(c).unwrap();
    ctx.set_name(c, "c").unwrap();
    let g = expand(&mut ctx, 16, &[d]);
    assert_eq!(g.nodes(), &[b, c, d]);
    assert_eq!(g.node(0), Some(b));
    assert_eq!(g.node(-1), Some(d));
    assert_eq!(g.node(-3), Some(b));
    assert_eq!(g.node(3), None);
    assert_eq!(g.node(-4), None);
    assert_eq!(g.view(1..3).unwrap().nodes, &[c, d]);
    assert!(g.view(1..3).unwrap().leafs.is_empty());
    assert_eq!(g.as_view().n_nodes(), 3);
    assert!(g.contains(a) && g.contains(c));
    let other = ctx.sqr(a).unwrap();
    assert!(!g.contains(other));
    assert_eq!(g.get_tensor(&ctx, "c"), Some(c));
    assert_eq!(g.get_tensor(&ctx, "a"), Some(a));
    assert_eq!(g.get_tensor(&ctx, "node_0"), Some(b));
    assert_eq!(g.get_tensor(&ctx, "nope"), None);
    // Names: c kept its own, d was unnamed when appended as node 2.
    assert_eq!(ctx[d].name(), "node_2");
}

#[test]
fn graph_full_leaves_the_graph_unchanged() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 4).unwrap();
    let b = ctx.sqr(a).unwrap();
    let c = ctx.sqr(b).unwrap();
    let d = ctx.sqr(c).unwrap();
    let mut g = Graph::new(2);
    g.build_forward_expand(&mut ctx, b).unwrap();
    assert_eq!(g.nodes(), &[b]);
    // d needs c and d: 3 nodes > 2.
    assert_eq!(
        g.build_forward_expand(&mut ctx, d),
        Err(GraphError::GraphFull {
            capacity: 2,
            what: "nodes"
        })
    );
    assert_eq!(g.nodes(), &[b]);
    assert_eq!(g.leafs(), &[a]);
    assert!(!g.contains(c) && !g.contains(d));
    // Nothing in the context changed either: the failed expand named nobody.
    assert_eq!(ctx[c].name(), "");
    assert_eq!(ctx[d].name(), "");
    // A smaller expand still fits and continues where the graph was.
    g.build_forward_expand(&mut ctx, c).unwrap();
    assert_eq!(g.nodes(), &[b, c]);
    assert_eq!(ctx[c].name(), "node_1");

    // Leafs have their own capacity.
    let x = ctx.new_tensor_1d(F32, 4).unwrap();
    let y = ctx.new_tensor_1d(F32, 4).unwrap();
    let s = ctx.add(x, y).unwrap();
    let mut g1 = Graph::new(1);
    assert_eq!(
        g1.build_forward_expand(&mut ctx, s),
        Err(GraphError::GraphFull {
            capacity: 1,
            what: "leafs"
        })
    );
    assert!(g1.nodes().is_empty() && g1.leafs().is_empty());
    assert!(!g1.contains(x));
    assert_eq!(ctx[x].name(), "");
    assert!(g1.add_node(s).is_ok());
    assert_eq!(
        g1.add_node(s),
        Err(GraphError::GraphFull {
            capacity: 1,
            what: "nodes"
        })
    );
}

#[test]
fn stale_root_is_rejected() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(F32, 4).unwrap();
    let cp = ctx.checkpoint();
    let b = ctx.sqr(a).unwrap();
    ctx.rewind(cp);
    let mut g = Graph::new(4);
    assert_eq!(
        g.build_forward_expand(&mut ctx, b),
        Err(GraphError::StaleId(b))
    );
    assert!(g.nodes().is_empty() && g.leafs().is_empty());
}

#[test]
fn deep_chain_does_not_overflow_the_stack() {
    let n = if cfg!(miri) { 1_000 } else { 100_000 };
    let mut ctx = Context::with_capacity(n + 1);
    let a = ctx.new_tensor_1d(F32, 1).unwrap();
    let mut t = a;
    let mut chain = Vec::with_capacity(n);
    for _ in 0..n {
        t = ctx.sqr(t).unwrap();
        chain.push(t);
    }
    let mut g = Graph::new(n);
    g.build_forward_expand(&mut ctx, t).unwrap();
    assert_eq!(g.leafs(), &[a]);
    assert_eq!(g.nodes(), &chain[..]);
    // One more node does not fit.
    let over = ctx.sqr(t).unwrap();
    assert!(matches!(
        g.build_forward_expand(&mut ctx, over),
        Err(GraphError::GraphFull { .. })
    ));
    assert_eq!(g.n_nodes(), n);
}

#[test]
fn rewind_makes_step_ids_stale_and_keeps_weights() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    ctx.set_name(w, "w").unwrap();
    let step = ctx.checkpoint();
    let x = ctx.new_tensor_2d(F32, 8, 2).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    assert_eq!(ctx.len(), 3);
    ctx.rewind(step);
    assert_eq!(ctx.len(), 1);
    assert_eq!(ctx.get(x).err(), Some(GraphError::StaleId(x)));
    assert_eq!(ctx.get(y).err(), Some(GraphError::StaleId(y)));
    assert!(!ctx.contains(y));
    assert_eq!(ctx[w].name(), "w");

    // The next step reuses the slots with new ids; the old ones stay stale.
    let x2 = ctx.new_tensor_2d(F32, 8, 2).unwrap();
    assert_eq!(x2.index(), x.index());
    assert_ne!(x2, x);
    assert_eq!(ctx.get(x).err(), Some(GraphError::StaleId(x)));
    let y2 = ctx.mul_mat(w, x2).unwrap();
    let g = expand(&mut ctx, 8, &[y2]);
    assert_eq!(g.leafs(), &[w, x2]);
    assert_eq!(g.nodes(), &[y2]);
    assert_eq!(ctx.find("w"), Some(w));

    // Rewinding to the current end changes nothing, so live ids stay valid.
    let here = ctx.checkpoint();
    ctx.rewind(here);
    assert!(ctx.contains(x2) && ctx.contains(w));
}

#[test]
fn a_tensor_in_a_reused_slot_is_not_taken_for_the_visited_one() {
    use graph::{Context, ElementType, Graph};
    let mut ctx = Context::new();
    let w = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let cp = ctx.checkpoint();
    let a = ctx.sqr(w).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, a).unwrap();
    assert!(g.contains(a));
    ctx.rewind(cp);
    let b = ctx.sqrt(w).unwrap();
    assert_eq!(a.index(), b.index(), "the new tensor reuses the slot");
    assert!(!g.contains(b));
    g.clear();
    g.build_forward_expand(&mut ctx, b).unwrap();
    assert_eq!(g.nodes(), &[b]);
    assert_eq!(g.leafs(), &[w]);
}
