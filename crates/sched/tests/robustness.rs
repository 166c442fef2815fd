//! Misuse of the scheduler through its public API: regression tests for bugs found by hand,
//! and a property test that drives random (often nonsensical) graphs through graph
//! construction, the scheduler (1 to 3 backends with random capabilities), allocation and
//! compute, asserting that nothing panics, that every refusal is a typed error, and that the
//! same context and scheduler compute a valid graph correctly after any error.
//!
//! The property test runs `ROBUSTNESS_CASES` cases (default 10 000, about a minute in a
//! debug build); `ROBUSTNESS_CASES=1000000 cargo test --release -p sched --test robustness`
//! is the long run.

use backend_core::{Backend, ComputeStatus, tensor_get, tensor_set};
use graph::{Context, ElementType, Graph, TensorId};
use sched::{SchedError, Scheduler};

fn cpu() -> Backend {
    let b = backend_cpu::init().unwrap();
    backend_cpu::CpuBackend::from_backend(&b)
        .unwrap()
        .set_n_threads(1);
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f32(ctx: &Context, t: TensorId) -> Vec<f32> {
    let mut b = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut b).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `n` chained SQRs of a 4-element input, as a graph of `n` nodes.
fn chain(ctx: &mut Context, x: TensorId, n: usize) -> (Graph, TensorId) {
    let mut y = x;
    for _ in 0..n {
        y = ctx.sqr(y).unwrap();
    }
    ctx.set_output(y).unwrap();
    let mut g = Graph::new(64);
    g.build_forward_expand(ctx, y).unwrap();
    (g, y)
}

/// Regression: after `alloc_graph(g1)`, `graph_compute(g2)` ran g1's split ranges over g2:
/// a smaller g2 panicked on a slice range, a larger one silently computed the wrong nodes.
#[test]
fn compute_of_a_graph_other_than_the_allocated_one_is_refused() {
    let mut sched = Scheduler::new(vec![cpu()], None, 64, false).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    ctx.set_input(x).unwrap();
    let (g1, y1) = chain(&mut ctx, x, 3);
    let (small, _) = chain(&mut ctx, x, 1);
    let (large, _) = chain(&mut ctx, x, 6);

    sched.alloc_graph(&mut ctx, &g1).unwrap();
    for other in [&small, &large] {
        assert_eq!(
            sched.graph_compute(&mut ctx, other),
            Err(SchedError::GraphNotAllocated)
        );
    }
    // a changed g1 is another graph too
    let mut g1b = g1.clone();
    assert_eq!(g1b.stamp(), g1.stamp());
    g1b.build_forward_expand(&mut ctx, x).unwrap();
    assert_eq!(
        sched.graph_compute(&mut ctx, &g1b),
        Err(SchedError::GraphNotAllocated)
    );

    // the allocated graph (or a clone of it) still computes, correctly: x^8
    tensor_set(&ctx, x, 0, &f32_bytes(&[1.0, 2.0, -1.5, 0.5])).unwrap();
    assert_eq!(
        sched.graph_compute(&mut ctx, &g1.clone()),
        Ok(ComputeStatus::Success)
    );
    assert_eq!(read_f32(&ctx, y1), [1.0, 256.0, 25.628906, 0.00390625]);

    // allocating the larger graph makes it computable: x^64
    let (large2, y2) = chain(&mut ctx, x, 6);
    sched.alloc_graph(&mut ctx, &large2).unwrap();
    tensor_set(&ctx, x, 0, &f32_bytes(&[1.0, -1.0, 1.0, 0.0])).unwrap();
    assert_eq!(
        sched.graph_compute(&mut ctx, &large2),
        Ok(ComputeStatus::Success)
    );
    assert_eq!(read_f32(&ctx, y2), [1.0, 1.0, 1.0, 0.0]);

    // after a reset, compute allocates whatever graph it is given (ggml's behaviour)
    sched.reset();
    assert_eq!(
        sched.graph_compute(&mut ctx, &small),
        Ok(ComputeStatus::Success)
    );
}

/// A failed `alloc_graph` after a successful one leaves no plan behind: compute refuses
/// instead of running the old (now cleared) splits.
#[test]
fn a_failed_alloc_leaves_no_stale_plan() {
    let mut sched = Scheduler::new(vec![cpu()], None, 64, false).unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    ctx.set_input(x).unwrap();
    let (g, y) = chain(&mut ctx, x, 2);
    sched.alloc_graph(&mut ctx, &g).unwrap();
    // a graph naming a rewound tensor fails to allocate
    let cp = ctx.checkpoint();
    let (bad, _) = chain(&mut ctx, x, 2);
    ctx.rewind(cp);
    assert!(matches!(
        sched.alloc_graph(&mut ctx, &bad),
        Err(SchedError::Graph(graph::GraphError::StaleId(_)))
    ));
    assert_eq!(
        sched.graph_compute(&mut ctx, &g),
        Err(SchedError::GraphNotAllocated)
    );
    sched.alloc_graph(&mut ctx, &g).unwrap();
    tensor_set(&ctx, x, 0, &f32_bytes(&[2.0, 3.0, -1.0, 0.5])).unwrap();
    sched.graph_compute(&mut ctx, &g).unwrap();
    assert_eq!(read_f32(&ctx, y), [16.0, 81.0, 1.0, 0.0625]);
}
