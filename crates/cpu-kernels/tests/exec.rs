//! Execution: abort between ops, plans with reused scratch, thread options.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{BackendError, ComputeStatus};
use common::*;
use cpu_kernels::{ComputeOptions, CpuCompute};
use graph::{Context, ElementType as T, Graph};

/// A chain x -> x+1 -> (x+1)+1 ... of `n` adds.
fn chain(n: usize) -> (Context, Graph, graph::TensorId, Vec<graph::TensorId>) {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(T::F32, 8).unwrap();
    let one = ctx.new_tensor_1d(T::F32, 1).unwrap();
    let mut cur = x;
    let mut nodes = Vec::new();
    for _ in 0..n {
        cur = ctx.add(cur, one).unwrap();
        nodes.push(cur);
    }
    let mut g = Graph::new(64);
    g.build_forward_expand(&mut ctx, cur).unwrap();
    let _ = alloc_all(&mut ctx);
    set_f32(&ctx, x, &[0.0; 8]);
    set_f32(&ctx, one, &[1.0]);
    (ctx, g, x, nodes)
}

#[test]
fn abort_mid_graph_then_complete() {
    let (ctx, g, _x, nodes) = chain(6);
    let cpu = CpuCompute::new(2);
    let calls = AtomicUsize::new(0);
    let abort = || calls.fetch_add(1, Ordering::SeqCst) >= 3;
    let st = cpu.compute(&ctx, g.as_view(), Some(&abort)).unwrap();
    assert_eq!(st, ComputeStatus::Aborted);
    // Nodes 0..3 ran, the rest did not.
    assert_eq!(read(&ctx, nodes[2]), vec![3.0; 8]);
    assert_eq!(read(&ctx, nodes[3]), vec![0.0; 8]);
    // The next compute works and overwrites everything.
    assert_eq!(
        cpu.compute(&ctx, g.as_view(), None).unwrap(),
        ComputeStatus::Success
    );
    assert_eq!(read(&ctx, nodes[5]), vec![6.0; 8]);
    // Options with an abort callback that always fires.
    let opts = ComputeOptions {
        n_threads: 1,
        abort: Some(Arc::new(|| true)),
    };
    assert_eq!(
        cpu.compute_with(&ctx, g.as_view(), &opts).unwrap(),
        ComputeStatus::Aborted
    );
}

#[test]
fn plans_reuse_scratch_and_reject_other_graphs() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(T::Q8_0, 64, 16).unwrap();
    let x = ctx.new_tensor_2d(T::F32, 64, 2).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let z = ctx.silu(y).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(&mut ctx, z).unwrap();
    let _buf = alloc_all(&mut ctx);
    fill(&ctx, w, &mut Rng::new(1));
    fill(&ctx, x, &mut Rng::new(2));
    let cpu = CpuCompute::new(2);
    let mut plan = cpu.plan(&ctx, g.as_view()).unwrap();
    assert_eq!(plan.n_nodes(), 2);
    assert_eq!(
        cpu.compute_plan(&mut plan, &ctx, g.as_view(), None)
            .unwrap(),
        ComputeStatus::Success
    );
    let (first_y, first_z) = (read(&ctx, y), read(&ctx, z));
    // The second compute starts by giving every thread the scratch lengths any thread reached
    // in the first; from then on nothing grows.
    cpu.compute_plan(&mut plan, &ctx, g.as_view(), None)
        .unwrap();
    let bytes = plan.scratch_bytes();
    assert!(bytes > 0);
    for _ in 0..3 {
        cpu.compute_plan(&mut plan, &ctx, g.as_view(), None)
            .unwrap();
        assert_eq!(
            plan.scratch_bytes(),
            bytes,
            "scratch must be reused, not regrown"
        );
    }
    // y has no transcendental op: bit-identical. z (silu) within f32 rounding (Miri perturbs
    // exp's last bits on purpose).
    assert_eq!(read(&ctx, y), first_y);
    for (a, b) in read(&ctx, z).iter().zip(&first_z) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0));
    }
    // A different node list is refused until the plan is updated.
    let sub = g.view(0..1).unwrap();
    let r = cpu.compute_plan(&mut plan, &ctx, sub, None);
    assert!(
        matches!(&r, Err(BackendError::Failed { message, .. }) if message.contains("update the plan")),
        "{r:?}"
    );
    cpu.update_plan(&mut plan, &ctx, sub).unwrap();
    assert!(cpu.compute_plan(&mut plan, &ctx, sub, None).is_ok());
}

#[test]
fn engine_is_send_sync_and_serialises_computes() {
    fn assert_send_sync<S: Send + Sync>() {}
    assert_send_sync::<CpuCompute>();
    let (ctx, g, _x, nodes) = chain(4);
    let cpu = CpuCompute::new(2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..3 {
                    cpu.compute(&ctx, g.as_view(), None).unwrap();
                }
            });
        }
    });
    assert_eq!(read(&ctx, nodes[3]), vec![4.0; 8]);
}

#[test]
fn views_and_none_compute_nothing() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(T::F32, 4, 3).unwrap();
    let t = ctx.transpose(a).unwrap();
    let r = ctx.reshape_1d(a, 12).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, t).unwrap();
    g.build_forward_expand(&mut ctx, r).unwrap();
    let _buf = alloc_all(&mut ctx);
    let vals: Vec<f32> = (0..12).map(|v| v as f32).collect();
    set_f32(&ctx, a, &vals);
    assert!(g.nodes().iter().all(|&n| cpu_kernels::supports_op(&ctx, n)));
    CpuCompute::new(1).compute(&ctx, g.as_view(), None).unwrap();
    assert_eq!(
        read(&ctx, r),
        vals.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
}
