//! Property tests over random graphs: random ops (in-place capable or not, views, in-place API
//! results, copies into pre-allocated tensors), random shapes, random INPUT/OUTPUT flags, and
//! one to three buffer ids over buffer types with different alignments and padding, some
//! shared.
//!
//! The plan is checked against lifetimes computed from the graph alone
//! (`test_fixtures::lifetimes`), never against the allocator's own bookkeeping, and
//! in-place sharing against an oracle written here from the seed's rules (the
//! `ggml_op_can_inplace` list by op name, layout equality field by field), not against the
//! `graph` crate's `can_inplace` / `same_layout` that the allocator itself calls.

mod common;

use backend_core::BufferType;
use graph::{Context, ElementType, Graph, Op, Tensor, TensorFlags, TensorId, UnaryOp};
use graph_alloc::{GraphAllocator, alloc_ctx_tensors};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use test_fixtures::{FakeBufferType, Lifetime, lifetimes, live_bytes_lower_bound};

/// `ggml_op_can_inplace` of ggml NOV24 (spec §8.2), by the op names the seed prints.
const SEED_INPLACE_OPS: [&str; 15] = [
    "SCALE",
    "DIAG_MASK_ZERO",
    "DIAG_MASK_INF",
    "ADD",
    "ADD1",
    "SUB",
    "MUL",
    "DIV",
    "SQR",
    "SQRT",
    "LOG",
    "UNARY",
    "ROPE",
    "RMS_NORM",
    "SOFT_MAX",
];

/// Whether the seed lets `op`'s result share its source's memory.
fn seed_can_inplace(op: Op) -> bool {
    SEED_INPLACE_OPS.contains(&op.name())
}

/// The seed's layout test for in-place reuse (`ggml_are_same_layout`): type, extents and
/// strides all equal.
fn seed_same_layout(a: &Tensor, b: &Tensor) -> bool {
    a.ty() == b.ty() && a.ne() == b.ne() && a.nb() == b.nb()
}

/// The oracle itself, on cases whose answer the spec states outright.
#[test]
fn inplace_oracle_follows_the_seed() {
    for op in [
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Scale,
        Op::Sqr,
        Op::Sqrt,
    ] {
        assert!(seed_can_inplace(op), "{op:?}");
    }
    for op in [Op::RmsNorm, Op::SoftMax, Op::Rope, Op::Unary(UnaryOp::Silu)] {
        assert!(seed_can_inplace(op), "{op:?}");
    }
    // copies, norms with a mean, products, gathers and views never run in place in NOV24
    for op in [
        Op::None,
        Op::Dup,
        Op::Cpy,
        Op::Cont,
        Op::Norm,
        Op::MulMat,
        Op::GetRows,
        Op::View,
        Op::Reshape,
        Op::Permute,
        Op::Transpose,
    ] {
        assert!(!seed_can_inplace(op), "{op:?}");
    }
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ElementType::F32, 8, 4).unwrap();
    let b = ctx.new_tensor_2d(ElementType::F32, 8, 4).unwrap();
    let c = ctx.new_tensor_2d(ElementType::F32, 4, 8).unwrap(); // same count, other extents
    let d = ctx.new_tensor_2d(ElementType::I32, 8, 4).unwrap(); // same bytes, other type
    let t = ctx.transpose(c).unwrap(); // extents of a, strides not
    assert!(seed_same_layout(&ctx[a], &ctx[b]));
    assert!(!seed_same_layout(&ctx[a], &ctx[c]));
    assert!(!seed_same_layout(&ctx[a], &ctx[d]));
    assert_eq!(ctx[t].ne(), ctx[a].ne());
    assert!(!seed_same_layout(&ctx[a], &ctx[t]));
}

/// A node flagged INPUT whose op may run in place (spec §7.7; alignment 32, every tensor 16
/// bytes padded to 32). Phase 1 places the leafs c@0, a@32, b@64. Phase 2 reaches
/// `n3 = add(a, n2)`, flagged INPUT, when only n1 has been counted as a's consumer. The
/// reference applies its in-place rule there: n3 takes a's bytes, a is placed again at its
/// first use (n1) in c's freed block @0, and the leafs a and c, both filled by the user before
/// the graph runs, share bytes (its plan: c 0, a 0, b 64, n0 96, n1 128, n2 64, n3 32). Ours
/// places phase-2 tensors fresh: n3@96; n0 = cont(c) @128, then c is freed; n1 = add(a, b)
/// (OUTPUT, no source dying) takes c's block @0; n2 = add(n1, b) runs in place over b @64.
#[test]
fn an_input_node_never_takes_a_leaf_in_place_while_consumers_are_counted() {
    let mut ctx = Context::new();
    let [c, a, b] = [(); 3].map(|_| ctx.new_tensor_1d(ElementType::F32, 4).unwrap());
    let n0 = ctx.cont(c).unwrap();
    let n1 = ctx.add(a, b).unwrap();
    ctx.set_output(n1).unwrap();
    let n2 = ctx.add(n1, b).unwrap();
    ctx.set_output(n2).unwrap();
    let n3 = ctx.add(a, n2).unwrap();
    ctx.set_input(n3).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, n0).unwrap();
    graph.build_forward_expand(&mut ctx, n3).unwrap();
    assert_eq!(graph.leafs(), [c, a, b]);
    assert_eq!(graph.nodes(), [n0, n1, n2, n3]);

    let buft = FakeBufferType::new("host", 32).into_buffer_type();
    let mut galloc = GraphAllocator::new(&[buft]);
    galloc.alloc_graph(&mut ctx, &graph).unwrap();
    let offset = |t: TensorId| ctx[t].storage().unwrap().offset;
    let got = [c, a, b, n0, n1, n2, n3].map(offset);
    assert_eq!(got, [0, 32, 64, 128, 0, 64, 96]);
}

/// The `graph` crate's list, which the allocator uses, is the seed's for every op it has.
#[test]
fn graph_crate_inplace_list_is_the_seeds() {
    for op in Op::ALL.into_iter().chain(UnaryOp::ALL.map(Op::Unary)) {
        assert_eq!(op.can_inplace(), seed_can_inplace(op), "{op:?}");
    }
}

#[derive(Clone, Debug)]
struct Program {
    leafs: Vec<(usize, bool, bool)>, // (shape index, pre-allocated, INPUT)
    steps: Vec<(u8, usize, usize, u8)>, // (op, a, b, flag)
    roots: Vec<usize>,
    n_bufts: usize,
    buft_pick: Vec<u8>,
    ids: Vec<u8>,
}

const SHAPES: [[i64; 2]; 6] = [[8, 1], [8, 3], [4, 2], [8, 8], [16, 1], [4, 1]];

fn program() -> impl Strategy<Value = Program> {
    (
        prop::collection::vec(
            (0..SHAPES.len(), prop::bool::weighted(0.3), any::<bool>()),
            1..6,
        ),
        prop::collection::vec((0u8..22, any::<usize>(), any::<usize>(), 0u8..12), 1..48),
        prop::collection::vec(any::<usize>(), 1..4),
        1usize..4,
        prop::collection::vec(0u8..3, 3),
        prop::collection::vec(any::<u8>(), 256),
    )
        .prop_map(|(leafs, steps, roots, n_bufts, buft_pick, ids)| Program {
            leafs,
            steps,
            roots,
            n_bufts,
            buft_pick,
            ids,
        })
}

struct Built {
    ctx: Context,
    graph: Graph,
    node_ids: Vec<usize>,
    leaf_ids: Vec<usize>,
    bufts: Vec<BufferType>,
}

/// Build the program's graph. Constructors that reject their operands change nothing, so a
/// rejected step is simply skipped.
fn build(p: &Program, pool_bufts: &[BufferType; 3]) -> Built {
    let mut ctx = Context::new();
    let mut pool: Vec<TensorId> = Vec::new();
    let mut pre = Vec::new();
    for &(s, prealloc, input) in &p.leafs {
        let t = ctx
            .new_tensor_2d(ElementType::F32, SHAPES[s][0], SHAPES[s][1])
            .unwrap();
        if prealloc {
            pre.push(t);
        } else if input {
            ctx.set_input(t).unwrap();
        }
        pool.push(t);
    }
    if !pre.is_empty() {
        let w = FakeBufferType::new("weights", 32).into_buffer_type();
        alloc_ctx_tensors(&mut ctx, pre, &w).unwrap();
    }
    for &(op, a, b, flag) in &p.steps {
        let a = pool[a % pool.len()];
        let b = pool[b % pool.len()];
        let r = match op {
            0 => ctx.add(a, b),
            1 => ctx.mul(a, b),
            2 => ctx.sub(a, b),
            3 => ctx.sqr(a),
            4 => ctx.sqrt(a),
            5 => ctx.scale(a, 0.5),
            6 => ctx.silu(a),
            7 => ctx.rms_norm(a, 1e-5),
            8 => ctx.soft_max(a),
            9 => ctx.cont(a),
            10 => ctx.dup(a),
            11 => ctx.mul_mat(a, b),
            12 => ctx.transpose(a),
            13 => {
                let n = ctx[a].nelements();
                ctx.reshape_1d(a, n)
            }
            14 => {
                let n = ctx[a].ne()[0];
                ctx.view_1d(a, (n / 2).max(1), 4 * (n as usize / 4))
            }
            15 => ctx.permute(a, [1, 0, 2, 3]),
            16 => ctx.cpy(a, b),
            17 => ctx.add_inplace(a, b),
            18 => ctx.mul_inplace(a, b),
            19 => ctx.scale_inplace(a, 2.0),
            20 => ctx.sqr_inplace(a),
            _ => ctx.div(a, b),
        };
        let Ok(r) = r else { continue };
        match flag {
            0 | 1 => ctx.set_output(r).unwrap(),
            2 => ctx.set_input(r).unwrap(),
            _ => {}
        }
        pool.push(r);
    }
    let mut graph = Graph::new(1024);
    let n = pool.len();
    for &r in &p.roots {
        graph.build_forward_expand(&mut ctx, pool[r % n]).unwrap();
    }
    graph.build_forward_expand(&mut ctx, pool[n - 1]).unwrap();
    let bufts: Vec<BufferType> = (0..p.n_bufts)
        .map(|i| pool_bufts[p.buft_pick[i] as usize].clone())
        .collect();
    let nb = bufts.len();
    let node_ids = (0..graph.n_nodes())
        .map(|i| p.ids[i % 256] as usize % nb)
        .collect();
    let leaf_ids = (0..graph.n_leafs())
        .map(|i| p.ids[(i + 128) % 256] as usize % nb)
        .collect();
    Built {
        ctx,
        graph,
        node_ids,
        leaf_ids,
        bufts,
    }
}

fn pool_bufts() -> [BufferType; 3] {
    [
        FakeBufferType::new("A32", 32).into_buffer_type(),
        FakeBufferType::new("B64", 64)
            .with_extra_alloc_size(16)
            .into_buffer_type(),
        FakeBufferType::new("C16", 16).into_buffer_type(),
    ]
}

/// Allocate the program's graph and check every property; returns (buffer bytes, lower bound).
fn check_program(p: &Program) -> Result<(usize, usize), TestCaseError> {
    let bufts = pool_bufts();
    let Built {
        mut ctx,
        graph,
        node_ids,
        leaf_ids,
        bufts,
    } = build(p, &bufts);
    let nodes = graph.nodes().to_vec();
    let life = lifetimes(&ctx, &nodes, graph.leafs());
    let mut galloc = GraphAllocator::new(&bufts);
    galloc
        .reserve_n(&ctx, &graph, &node_ids, &leaf_ids)
        .map_err(|e| TestCaseError::fail(format!("reserve_n: {e}")))?;
    galloc
        .alloc_graph(&mut ctx, &graph)
        .map_err(|e| TestCaseError::fail(format!("alloc_graph: {e}")))?;

    // Every tensor that needed bytes has them, aligned, inside one of our buffers.
    struct Placed {
        id: TensorId,
        buf: usize,
        off: usize,
        size: usize,
        life: Lifetime,
    }
    let mut placed = Vec::new();
    for id in ctx.ids() {
        let Some(l) = life[id.index()] else { continue };
        let t = &ctx[id];
        let st = t
            .storage()
            .ok_or_else(|| TestCaseError::fail(format!("{id:?} not placed")))?;
        let buf = (0..galloc.n_buffers())
            .find(|&b| galloc.buffer(b).is_some_and(|x| x.holds(st)))
            .ok_or_else(|| TestCaseError::fail(format!("{id:?} outside our buffers")))?;
        let buffer = galloc.buffer(buf).unwrap();
        let buft = buffer.buffer_type();
        let size = buft.alloc_size(t);
        prop_assert_eq!(st.offset % buft.alignment(), 0, "{:?} misaligned", id);
        prop_assert!(st.offset + size <= buffer.size(), "{:?} past the end", id);
        // identify shared buffers by their first id
        let buf = (0..=buf)
            .find(|&b| galloc.buffer(b) == Some(buffer))
            .unwrap();
        placed.push(Placed {
            id,
            buf,
            off: st.offset,
            size,
            life: l,
        });
    }

    // Views point into their root.
    for &n in &nodes {
        let t = &ctx[n];
        if let (Some(root), Some(st)) = (t.view_src(), t.storage()) {
            let rs = ctx[root].storage().unwrap();
            prop_assert!(rs.same_buffer(st));
            prop_assert_eq!(st.offset, rs.offset + t.view_offs());
        }
    }

    // No two tensors live at the same time share bytes, except a node computed in place over a
    // same-layout, non-OUTPUT source whose last use it is.
    let pos = |id: TensorId| nodes.iter().position(|&n| n == id);
    for (i, a) in placed.iter().enumerate() {
        for b in &placed[i + 1..] {
            let time = a.life.first <= b.life.last && b.life.first <= a.life.last;
            let bytes = a.buf == b.buf && a.off < b.off + b.size && b.off < a.off + a.size;
            if !(time && bytes) {
                continue;
            }
            let in_place = |p: &Placed, c: &Placed| {
                let (pt, ct) = (&ctx[p.id], &ctx[c.id]);
                pos(c.id).is_some_and(|ci| {
                    seed_can_inplace(ct.op())
                        && ct.srcs().contains(&Some(p.id))
                        && seed_same_layout(pt, ct)
                        && !pt.flags().contains(TensorFlags::OUTPUT)
                        && p.life.last == ci as isize
                        && c.life.first == ci as isize
                        && p.off == c.off
                })
            };
            prop_assert!(
                in_place(a, b) || in_place(b, a),
                "{:?} {:?} and {:?} {:?} overlap while both live",
                a.id,
                a.life,
                b.id,
                b.life
            );
        }
    }

    // Each buffer holds at least the live-bytes lower bound.
    let (mut total, mut bound) = (0, 0);
    for b in 0..galloc.n_buffers() {
        let size = galloc.buffer_size(b);
        if size == 0 {
            continue;
        }
        let lb = live_bytes_lower_bound(&ctx, &nodes, &life, |id| {
            placed.iter().find(|p| p.id == id && p.buf == b).map(|p| {
                let a = galloc.buffer(b).unwrap().alignment();
                p.size.next_multiple_of(a)
            })
        });
        prop_assert!(
            size >= lb,
            "buffer {} of {} bytes below the bound {}",
            b,
            size,
            lb
        );
        total += size;
        bound += lb;
    }

    // Re-running on the same graph is a no-op, and an identical fresh graph reuses the plan.
    galloc
        .alloc_graph(&mut ctx, &graph)
        .map_err(|e| TestCaseError::fail(format!("second alloc_graph: {e}")))?;
    let before: Vec<_> = placed.iter().map(|p| (p.id.index(), p.off)).collect();
    let Built {
        ctx: mut ctx2,
        graph: graph2,
        ..
    } = build(p, &pool_bufts());
    galloc
        .alloc_graph(&mut ctx2, &graph2)
        .map_err(|e| TestCaseError::fail(format!("alloc_graph on a copy: {e}")))?;
    for (index, o) in before {
        let id = ctx2.id_at(index).unwrap();
        prop_assert_eq!(ctx2[id].storage().map(|s| s.offset), Some(o));
    }
    Ok((total, bound))
}

proptest! {
    // Random seeds (`PROPTEST_RNG_SEED=<n>` replays one).
    #![proptest_config(Config {
        cases: if cfg!(miri) { 4 } else { 512 },
        ..Config::default()
    })]

    #[test]
    fn random_graphs_plan_soundly(p in program()) {
        check_program(&p)?;
    }
}

/// How far above the lower bound the plans are, over a fixed set of random graphs (a fixed
/// ChaCha seed, so the figures are exact and reproducible: mean 1.160, worst 3.000, aggregate
/// 1.140 over 994 graphs with a non-zero bound).
///
/// Bounds:
/// * worst ≤ 3.0. The worst graph is all 32-byte tensors with three nodes nobody consumes:
///   the seed never frees an unconsumed node (spec §7.7, "allocated and simply never
///   freed"), while the bound, computed from the graph, counts each as live only at its own
///   step; so 96 bytes against a bound of 32. Any fragmentation on top of that rule fails.
/// * aggregate ≤ 1.15 and mean ≤ 1.17, just above the measured values: a change that reuses
///   less (frees later, skips in-place reuse, picks worse blocks) fails here even when every
///   single plan stays sound.
#[test]
#[allow(clippy::print_stderr)]
fn ratio_to_lower_bound() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = program();
    let (mut sum_ratio, mut n, mut total, mut bound, mut worst) = (0.0, 0, 0usize, 0usize, 1.0f64);
    for _ in 0..if cfg!(miri) { 4 } else { 1000 } {
        let p = strategy.new_tree(&mut runner).unwrap().current();
        let (t, b) = check_program(&p).unwrap();
        if b > 0 {
            let r = t as f64 / b as f64;
            sum_ratio += r;
            worst = worst.max(r);
            n += 1;
            total += t;
            bound += b;
        }
    }
    eprintln!(
        "buffer bytes / live-bytes lower bound over {n} random graphs: mean {:.3}, \
         worst {:.3}, aggregate {:.3}",
        sum_ratio / n as f64,
        worst,
        total as f64 / bound as f64
    );
    assert!(n > 0);
    assert!(worst <= 3.0, "worst ratio {worst:.3} above 3.0");
    if !cfg!(miri) {
        let (mean, aggregate) = (sum_ratio / n as f64, total as f64 / bound as f64);
        assert!(
            aggregate <= 1.15,
            "aggregate ratio {aggregate:.3} above 1.15"
        );
        assert!(mean <= 1.17, "mean ratio {mean:.3} above 1.17");
    }
}
