//! Pipeline copies without re-planning: a graph allocated once is computed step after step
//! with two and four pipeline copies, and every compute reuses the plan and the allocation
//! (no new split, no new input copies, nothing moved), while the pipeline copy alternates as
//! in ggml: step k fills and reads the input copies of copy `k % n_copies` and waits on that
//! copy's events. Every step's logits are bit-for-bit those of the same scheduler setup with
//! one copy and those of the CPU backend alone.
//!
//! A split creates its input copies and the allocator's dependency views in the caller's
//! context, so a context that does not grow across computes is a plan that was not made
//! again; and allocation only ever follows a plan. A different graph is still refused until
//! it is allocated, and then planned anew.

mod common;

use std::sync::Arc;

use backend_core::{Backend, tensor_get};
use common::{Cfg, Model, Reference};
use graph::{Context, Graph, Op, TensorId};
use sched::{SchedError, Scheduler};
use test_device::{TestDevice, TestDeviceConfig};

const STEPS: u64 = 9;

/// Two layers, layer 0 (and the embeddings) on the CPU, layer 1 and the output on the
/// device: splits on both, with user inputs and activations copied to the device.
fn setup(n_copies: usize, seed: u64) -> (Model, Scheduler, Backend) {
    let cfg = Cfg::tiny(2);
    let dev = TestDevice::create(TestDeviceConfig::named("PIPE")).unwrap();
    let cpu = common::cpu(1);
    let place = common::offload(&cpu, &dev, 1);
    let mut m = Model::build(&cfg, &place, seed);
    // keep an intermediate on the device readable for the sub-graph test
    let keep = m.id("attn_out.1");
    m.ctx.set_output(keep).unwrap();
    let dev_backend = dev.init_backend("").unwrap();
    let sched =
        Scheduler::with_copies(vec![dev_backend.clone(), cpu], None, 4096, n_copies).unwrap();
    (m, sched, dev_backend)
}

/// What an allocation decided: every split input's copy per pipeline copy, with its storage
/// (buffer object, offset).
fn plan_facts(ctx: &Context, s: &Scheduler) -> Vec<(TensorId, usize, usize)> {
    let mut v = Vec::new();
    for sp in s.splits() {
        for &inp in sp.inputs() {
            for c in 0..s.n_copies() {
                let copy = s.tensor_copy(inp, sp.backend_index(), c).unwrap();
                let st = ctx[copy].storage().unwrap();
                v.push((
                    copy,
                    Arc::as_ptr(&st.buffer).cast::<u8>() as usize,
                    st.offset,
                ));
            }
        }
    }
    v
}

fn bytes(ctx: &Context, t: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).unwrap();
    v
}

/// Compute `STEPS` steps of one allocation; return each step's logits.
fn steps_without_replanning(n_copies: usize) -> Vec<Vec<u8>> {
    let (mut m, mut sched, _dev) = setup(n_copies, 5);
    sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    let on: Vec<usize> = sched.splits().iter().map(|s| s.backend_index()).collect();
    assert!(on.contains(&0) && on.contains(&1), "splits on {on:?}");
    let n_tensors = m.ctx.len();
    let n_splits = sched.n_splits();
    let facts = plan_facts(&m.ctx, &sched);
    let alloc_nodes = sched.allocation_graph().n_nodes();
    // the user inputs the device's splits copy in, with the device
    let user_inputs: Vec<(TensorId, usize)> = sched
        .splits()
        .iter()
        .flat_map(|sp| sp.inputs().iter().map(move |&i| (i, sp.backend_index())))
        .filter(|&(i, _)| i == m.pos || i == m.mask)
        .collect();
    assert!(
        !user_inputs.is_empty(),
        "no user input is copied to the device"
    );

    let mut logits = Vec::new();
    for step in 0..STEPS {
        let c = (step as usize) % n_copies;
        assert_eq!(sched.cur_copy(), c);
        m.set_inputs(step);
        sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
        logits.push(m.logits());

        // nothing was planned or allocated again
        assert_eq!(
            m.ctx.len(),
            n_tensors,
            "step {step}: the graph was split again"
        );
        assert_eq!(sched.n_splits(), n_splits);
        assert_eq!(sched.allocation_graph().n_nodes(), alloc_nodes);
        assert_eq!(
            plan_facts(&m.ctx, &sched),
            facts,
            "step {step}: re-allocated"
        );
        assert_eq!(sched.cur_copy(), (c + 1) % n_copies);

        // this step's user inputs went to this step's pipeline copy; the previous step's
        // copy still holds the previous step's (it was not this step's to fill). Only
        // pipeline copies keep their memory after the split that reads them.
        for &(inp, b) in user_inputs.iter().filter(|_| n_copies > 1) {
            let copy = sched.tensor_copy(inp, b, c).unwrap();
            assert_eq!(bytes(&m.ctx, copy), bytes(&m.ctx, inp), "step {step}");
            if step > 0 {
                let prev_copy = (step as usize - 1) % n_copies;
                let prev = sched.tensor_copy(inp, b, prev_copy).unwrap();
                let [_, pos, mask] = Model::inputs(&m.cfg, step - 1);
                let want = if inp == m.pos { pos } else { mask };
                assert_eq!(bytes(&m.ctx, prev), want, "step {step}: copy {prev_copy}");
            }
        }
    }
    // the caller's graph has its own sources back
    for &node in m.graph.nodes() {
        for s in m.ctx[node].srcs().iter().flatten() {
            assert!(
                !m.ctx[*s].name().contains('#'),
                "a copy is left in the graph"
            );
        }
    }
    logits
}

fn same_as_one_copy_and_cpu_alone(n_copies: usize) {
    let got = steps_without_replanning(n_copies);
    let one = steps_without_replanning(1);
    let mut reference = Reference::new(&Cfg::tiny(2), 5, &[]);
    for (k, (g, o)) in got.iter().zip(&one).enumerate() {
        assert!(g == o, "step {k}: {n_copies} copies differ from one copy");
        assert!(
            *g == reference.step(k as u64),
            "step {k}: differs from the CPU alone"
        );
    }
}

#[test]
fn two_copies_compute_again_without_replanning() {
    same_as_one_copy_and_cpu_alone(2);
}

#[test]
fn four_copies_compute_again_without_replanning() {
    same_as_one_copy_and_cpu_alone(4);
}

#[test]
fn another_graph_or_a_reset_plans_again() {
    let (mut m, mut sched, _dev) = setup(2, 9);
    let mut reference = Reference::new(&Cfg::tiny(2), 9, &["attn_out.1"]);
    let sub_out = m.id("attn_out.1");
    // another graph: the cache stores (which the attention does not depend on) and layer 1's
    // attention output, on the device
    let stores: Vec<TensorId> = (m.graph.nodes().iter().copied())
        .filter(|&t| m.ctx[t].op() == Op::Cpy)
        .collect();
    let mut sub = Graph::new(4096);
    for t in stores.into_iter().chain([sub_out]) {
        sub.build_forward_expand(&mut m.ctx, t).unwrap();
    }

    sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    m.set_inputs(0);
    sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
    assert!(m.logits() == reference.step(0));

    // the same-graph check: another graph is refused until it is allocated ...
    let n = m.ctx.len();
    assert!(matches!(
        sched.graph_compute(&mut m.ctx, &sub),
        Err(SchedError::GraphNotAllocated)
    ));
    assert_eq!(m.ctx.len(), n);
    // ... and then planned anew (new input copies in the context), and computed right
    sched.alloc_graph(&mut m.ctx, &sub).unwrap();
    assert!(m.ctx.len() > n, "the sub-graph was not planned");
    let sub_splits: Vec<(usize, usize)> = sched
        .splits()
        .iter()
        .map(|s| (s.start(), s.end()))
        .collect();
    for step in 1..4 {
        let n = m.ctx.len();
        m.set_inputs(step);
        sched.graph_compute(&mut m.ctx, &sub).unwrap();
        assert_eq!(m.ctx.len(), n, "step {step}: the sub-graph was split again");
        reference.step(step);
        let want = bytes(&reference.model.ctx, reference.model.id("attn_out.1"));
        assert!(
            bytes(&m.ctx, sub_out) == want,
            "step {step}: sub-graph differs"
        );
    }

    // back to the full graph: refused, then planned anew
    assert!(matches!(
        sched.graph_compute(&mut m.ctx, &m.graph),
        Err(SchedError::GraphNotAllocated)
    ));
    sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    let full_splits: Vec<(usize, usize)> = sched
        .splits()
        .iter()
        .map(|s| (s.start(), s.end()))
        .collect();
    assert_ne!(full_splits, sub_splits);
    m.set_inputs(4);
    sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
    assert!(m.logits() == reference.step(4));

    // a reset drops the allocation (as ggml's does): the next compute plans again
    sched.reset();
    let n = m.ctx.len();
    m.set_inputs(5);
    sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
    assert!(m.ctx.len() > n, "a compute after reset did not plan");
    assert!(m.logits() == reference.step(5));
    let n = m.ctx.len();
    m.set_inputs(6);
    sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
    assert_eq!(m.ctx.len(), n);
    assert!(m.logits() == reference.step(6));
}
