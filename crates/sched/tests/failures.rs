//! The scheduler's failure paths and user assignments, computed for real over the test device
//! and the CPU backend: compute-buffer allocation failure, a backend failing mid-graph, too
//! many graph inputs, an unassigned split input and a compute after a failed allocation are
//! each a typed error (or an exact compute), and the same scheduler then computes the next
//! valid graph bit-for-bit as the CPU backend alone does. User assignments
//! (`set_tensor_backend`) and assignments that change without a reset are computed end to
//! end, not only planned.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{
    Backend, BackendError, BackendImpl, BufferType, ComputeStatus, Device, Event, Guid, Result,
};
use common::{Cfg, Model, Reference};
use graph::{Context, ElementType, Graph, GraphView, Tensor, TensorId};
use sched::{Cause, SchedError, Scheduler};
use test_device::{TestDevice, TestDeviceConfig};

const SEED: u64 = 42;

/// Embeddings and layer 0 on the CPU, the other layers on `dev`, the output on the CPU:
/// three splits (CPU, device, CPU).
fn sandwich(cpu: &Backend, dev: &Device, n_layer: usize) -> impl Fn(usize) -> BufferType {
    let (c, d) = (cpu.default_buffer_type(), dev.buffer_type());
    move |g| {
        if g <= 1 || g > n_layer {
            c.clone()
        } else {
            d.clone()
        }
    }
}

/// `cfg`'s model placed by [`sandwich`] on a test device made from `dev_cfg` and a CPU
/// backend of `threads` threads.
fn sandwich_model(
    cfg: &Cfg,
    dev_cfg: TestDeviceConfig,
    threads: usize,
) -> (Device, Backend, Model) {
    let dev = TestDevice::create(dev_cfg).unwrap();
    let cpu = common::cpu(threads);
    let m = Model::build(cfg, &sandwich(&cpu, &dev, cfg.n_layer), SEED);
    (dev, cpu, m)
}

/// A scheduler over the device (backend 0) and `cpu` (backend 1), without pipeline copies.
fn device_and(dev: &Device, cpu: Backend) -> Scheduler {
    Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu])
        .graph_size(4096)
        .build()
        .unwrap()
}

/// A scheduler over the device and `cpu` with two pipeline copies and the reference limits.
fn device_and_with_limits(dev: &Device, cpu: Backend) -> Scheduler {
    Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu])
        .graph_size(4096)
        .copies(2)
        .reference_limits(true)
        .build()
        .unwrap()
}

fn compute(s: &mut Scheduler, m: &mut Model, step: u64) -> Vec<u8> {
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    m.set_inputs(step);
    assert_eq!(
        s.graph_compute(&mut m.ctx, &m.graph).unwrap(),
        ComputeStatus::Success
    );
    m.logits()
}

/// Drop the storage the last plan gave the graph's nodes and inputs (the model's weights,
/// caches and the views into them keep theirs): the same graph then reads as a freshly built
/// one of the same shape, as llama.cpp builds every step. A tensor that still has storage
/// counts as pre-allocated where it is (the seed's "1.dst"), so moving a node to another
/// backend needs this.
fn forget_plan(m: &mut Model) {
    let root = |ctx: &Context, mut t: TensorId| {
        while let Some(v) = ctx[t].view_src() {
            t = v;
        }
        t
    };
    let nodes = m.graph.nodes().to_vec();
    for n in nodes {
        let r = root(&m.ctx, n);
        if m.ctx[r].op() != graph::Op::None {
            m.ctx[n].set_storage(None);
        }
    }
    for id in [m.tokens, m.pos, m.mask] {
        m.ctx[id].set_storage(None);
    }
}

fn srcs_of(ctx: &Context, g: &Graph) -> Vec<[Option<TensorId>; graph::MAX_SRC]> {
    g.nodes().iter().map(|&n| *ctx[n].srcs()).collect()
}

/// A backend that forwards to `inner` and fails its `fail_at`-th graph compute (counted from
/// 1; 0: never).
struct Flaky {
    inner: Backend,
    calls: AtomicUsize,
    fail_at: Arc<AtomicUsize>,
}

impl BackendImpl for Flaky {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn guid(&self) -> Guid {
        self.inner.guid()
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn set_tensor_async(&self, ctx: &Context, t: TensorId, off: usize, data: &[u8]) -> Result<()> {
        self.inner
            .implementation()
            .set_tensor_async(ctx, t, off, data)
    }
    fn get_tensor_async(
        &self,
        ctx: &Context,
        t: TensorId,
        off: usize,
        data: &mut [u8],
    ) -> Result<()> {
        self.inner
            .implementation()
            .get_tensor_async(ctx, t, off, data)
    }
    fn cpy_tensor_async(&self, src_backend: &Backend, src: &Tensor, dst: &Tensor) -> Result<bool> {
        self.inner
            .implementation()
            .cpy_tensor_async(src_backend, src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn graph_compute(&self, ctx: &Context, graph: GraphView<'_>) -> Result<ComputeStatus> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at.load(Ordering::SeqCst) {
            return Err(BackendError::Failed {
                backend: "flaky".into(),
                message: format!("compute #{n} lost"),
            });
        }
        self.inner.implementation().graph_compute(ctx, graph)
    }
    fn event_record(&self, event: &Event) -> Result<()> {
        self.inner.event_record(event)
    }
    fn event_wait(&self, event: &Event) -> Result<()> {
        self.inner.event_wait(event)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn compute_buffer_allocation_failure_is_typed_and_the_scheduler_recovers() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D").memory(16 << 20), 2);
    let mut s = device_and(&dev, cpu);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    // someone else takes all but 1 KiB of the device's memory: the compute buffer cannot fit
    let (free, _) = dev.memory();
    let hog = dev.buffer_type().alloc_buffer(free - 1024).unwrap();
    let before = srcs_of(&m.ctx, &m.graph);
    let err = s.alloc_graph(&mut m.ctx, &m.graph).unwrap_err();
    assert!(
        matches!(
            &err,
            SchedError::Alloc(_) | SchedError::Backend(BackendError::AllocationFailed { .. })
        ),
        "{err:?}"
    );
    assert!(
        format!("{err}").contains("alloc") || format!("{err:?}").contains("Alloc"),
        "{err}"
    );
    assert_eq!(srcs_of(&m.ctx, &m.graph), before, "graph left as it was");
    // compute on the same graph fails the same way, without computing anything
    let r = s.graph_compute(&mut m.ctx, &m.graph);
    assert_eq!(r, Err(err), "compute fails as alloc_graph did");
    drop(hog);
    for step in 0..2 {
        let want = reference.step(step);
        assert!(compute(&mut s, &mut m, step) == want, "step {step}");
        s.reset();
    }
}

#[test]
fn a_backend_failing_mid_graph_is_typed_and_the_scheduler_recovers() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let fail_at = Arc::new(AtomicUsize::new(0));
    let flaky = Backend::new(Flaky {
        inner: cpu,
        calls: AtomicUsize::new(0),
        fail_at: fail_at.clone(),
    });
    let mut s = device_and(&dev, flaky);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    assert!(compute(&mut s, &mut m, 0) == reference.step(0));
    let on: Vec<usize> = s.splits().iter().map(|x| x.backend_index()).collect();
    assert_eq!(on, [1, 0, 1], "CPU, device, CPU");
    s.reset();
    // the CPU's second split of the next step (the output, after the device's split) fails
    fail_at.store(2 + 2, Ordering::SeqCst);
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    m.set_inputs(1);
    let before = srcs_of(&m.ctx, &m.graph);
    let err = s.graph_compute(&mut m.ctx, &m.graph).unwrap_err();
    assert_eq!(
        err,
        SchedError::Backend(BackendError::Failed {
            backend: "flaky".into(),
            message: "compute #4 lost".into(),
        })
    );
    assert_eq!(
        srcs_of(&m.ctx, &m.graph),
        before,
        "copies undone after the failure"
    );
    // the next compute, of the same step and of the next one, is exact
    for step in 1..3 {
        s.reset();
        let want = reference.step(step);
        assert!(compute(&mut s, &mut m, step) == want, "step {step}");
    }
}

/// `n` INPUT vectors summed on the CPU, with `w · x0` on the device in front so that the
/// graph is split.
fn many_inputs(n: usize) -> (Context, Graph, Vec<TensorId>, TensorId) {
    let mut ctx = Context::new();
    let xs: Vec<TensorId> = (0..n)
        .map(|_| {
            let x = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
            ctx.set_input(x).unwrap();
            x
        })
        .collect();
    let mut acc = xs[0];
    for &x in &xs[1..] {
        acc = ctx.add(acc, x).unwrap();
    }
    ctx.set_output(acc).unwrap();
    let mut g = Graph::new(256);
    g.build_forward_expand(&mut ctx, acc).unwrap();
    (ctx, g, xs, acc)
}

#[test]
fn too_many_graph_inputs_is_typed_and_the_scheduler_recovers() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let mut s = device_and_with_limits(&dev, cpu);
    let limit = sched::MAX_SPLIT_INPUTS;
    let (mut ctx, g, _, _) = many_inputs(limit + 1);
    assert_eq!(
        s.alloc_graph(&mut ctx, &g),
        Err(SchedError::TooManyGraphInputs { limit })
    );
    // exactly at the limit is accepted and computes
    s.reset();
    let (mut ctx, g, xs, acc) = many_inputs(limit);
    s.alloc_graph(&mut ctx, &g).unwrap();
    for (i, &x) in xs.iter().enumerate() {
        let v: Vec<u8> = (0..16)
            .flat_map(|j| ((i * j) as f32).to_le_bytes())
            .collect();
        backend_core::tensor_set(&ctx, x, 0, &v).unwrap();
    }
    s.graph_compute(&mut ctx, &g).unwrap();
    let mut out = vec![0u8; 64];
    backend_core::tensor_get(&ctx, acc, 0, &mut out).unwrap();
    let sum_i: usize = (0..limit).sum();
    let want: Vec<u8> = (0..16)
        .flat_map(|j| ((sum_i * j) as f32).to_le_bytes())
        .collect();
    assert_eq!(out, want);
    // and the llama graph after it
    s.reset();
    let mut reference = Reference::new(&cfg, SEED, &[]);
    assert!(compute(&mut s, &mut m, 5) == reference.step(5));
}

#[test]
fn user_assigned_backends_are_computed_end_to_end() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let mut s = device_and(&dev, cpu);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    // a device-weights node pinned to the CPU, a CPU-weights node pinned to the device
    let pins = [("kq_soft.1", 1usize), ("attn_out.2", 1), ("attn_out.0", 0)];
    let mut plain_splits = None;
    for step in 0..4 {
        // llama.cpp's step: reset, a fresh graph, pins, allocate, compute
        s.reset();
        forget_plan(&mut m);
        if step % 2 == 1 {
            for (n, b) in pins {
                s.set_tensor_backend(&m.ctx, m.id(n), b).unwrap();
            }
        }
        let want = reference.step(step);
        assert!(compute(&mut s, &mut m, step) == want, "step {step}");
        if step % 2 == 1 {
            for (n, b) in pins {
                assert_eq!(s.tensor_backend(m.id(n)), Some(b), "{n}");
                assert_eq!(s.tensor_cause(m.id(n)), Cause::User, "{n}");
            }
            assert!(s.n_splits() > plain_splits.unwrap(), "pins add splits");
        } else {
            assert_eq!(s.tensor_backend(m.id("kq_soft.1")), Some(0));
            assert_eq!(s.tensor_backend(m.id("attn_out.0")), Some(1));
            plain_splits = Some(s.n_splits());
        }
    }
}

/// Between two allocations without a reset, two nodes trade places (one moves to the CPU,
/// the other back to the device): the allocation graph keeps its shape (node, leaf and split
/// counts), every plan is redone and computes exactly. Here the graph allocator's own check
/// also rejects the old plan (the copies sit at other positions), so this test does not
/// isolate the backend-id comparison (`backend_ids_changed` in the seed's `alloc_splits`);
/// `buffer_types.rs` has a graph where only that comparison can tell.
#[test]
fn backend_ids_changing_without_a_reset_replan_and_compute() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let mut s = device_and(&dev, cpu);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    let (a, b) = (m.id("kq_soft.1"), m.id("kq_soft.2"));
    let mut shape = None;
    for step in 0..4u64 {
        forget_plan(&mut m);
        let (on_cpu, on_dev) = if step % 2 == 0 { (a, b) } else { (b, a) };
        s.set_tensor_backend(&m.ctx, on_cpu, 1).unwrap();
        s.set_tensor_backend(&m.ctx, on_dev, 0).unwrap();
        let want = reference.step(step);
        assert!(compute(&mut s, &mut m, step) == want, "step {step}");
        assert_eq!(s.tensor_backend(on_cpu), Some(1));
        assert_eq!(s.tensor_backend(on_dev), Some(0));
        let g = s.allocation_graph();
        let now = (g.n_nodes(), g.n_leafs(), s.n_splits());
        assert_eq!(
            *shape.get_or_insert(now),
            now,
            "same allocation-graph shape"
        );
    }
}

/// A failed `alloc_graph` must not leave the scheduler believing the last good graph is still
/// allocated: computing the good graph next (no reset, no explicit alloc) plans it again.
#[test]
fn compute_after_a_failed_alloc_replans() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let mut s = device_and_with_limits(&dev, cpu);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    assert!(compute(&mut s, &mut m, 0) == reference.step(0));
    // the good graph allocated for the current copy, then a graph the limits reject
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    let (mut ctx, g, _, _) = many_inputs(sched::MAX_SPLIT_INPUTS + 1);
    assert!(matches!(
        s.alloc_graph(&mut ctx, &g),
        Err(SchedError::TooManyGraphInputs { .. })
    ));
    // Either the compute plans the good graph again, or it says that nothing is allocated;
    // it must never run the rejected graph's splits over the good one.
    m.set_inputs(1);
    if let Err(e) = s.graph_compute(&mut m.ctx, &m.graph) {
        assert!(!matches!(e, SchedError::Backend(_)), "{e:?}");
        assert!(
            compute(&mut s, &mut m, 1) == reference.step(1),
            "after alloc_graph"
        );
    }
    assert!(
        m.logits() == reference.step(1),
        "the good graph computed exactly"
    );
}

/// A view of a leaf that has no memory and no flag, read by a device node: nothing gives the
/// leaf (or its view) a backend, so the view cannot be copied to the device. A typed error,
/// and the scheduler then computes the llama graph.
#[test]
fn an_unassigned_split_input_is_typed_and_the_scheduler_recovers() {
    let cfg = Cfg::tiny(3);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 2);
    let mut s = device_and(&dev, cpu);
    let mut ctx = Context::new();
    let dev_buf = dev.buffer_type().alloc_buffer(4096).unwrap();
    dev_buf.set_usage(backend_core::BufferUsage::Weights);
    let w = ctx.new_tensor_2d(ElementType::F32, 16, 16).unwrap();
    backend_core::tensor_alloc(&mut ctx, &dev_buf, w, 0).unwrap();
    let r = ctx.new_tensor_2d(ElementType::F32, 16, 2).unwrap(); // no memory, no flag
    ctx.set_name(r, "r").unwrap();
    let v = ctx.view_2d(r, 16, 1, 64, 0).unwrap();
    let y = ctx.mul_mat(w, v).unwrap();
    let mut g = Graph::new(64);
    g.build_forward_expand(&mut ctx, y).unwrap();
    // planning succeeds (the view gets a copy on the device); the copy has no source backend
    s.alloc_graph(&mut ctx, &g).unwrap();
    let before = srcs_of(&ctx, &g);
    assert_eq!(
        s.graph_compute(&mut ctx, &g),
        Err(SchedError::UnassignedInput(ctx[v].name().to_owned()))
    );
    assert_eq!(srcs_of(&ctx, &g), before);
    let mut reference = Reference::new(&cfg, SEED, &[]);
    s.reset();
    assert!(compute(&mut s, &mut m, 2) == reference.step(2));
}

/// The layout printer is given a context and a graph by the caller: printed against another
/// context (here an empty one, and one rewound past the split inputs and copies) it names
/// what it cannot find `?` instead of indexing a stale id; against the planned context it
/// prints every split with its inputs.
#[test]
fn the_layout_of_a_plan_printed_against_another_context_does_not_panic() {
    let cfg = Cfg::tiny(2);
    let (dev, cpu, mut m) = sandwich_model(&cfg, TestDeviceConfig::named("D"), 1);
    let mut s = device_and(&dev, cpu);
    let mark = m.ctx.checkpoint();
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    assert!(s.splits().iter().any(|sp| !sp.inputs().is_empty()));
    let mut good = String::new();
    s.write_layout(&m.ctx, &m.graph, 2, &mut good);
    assert_eq!(good.matches("## SPLIT").count(), s.n_splits());
    let mut out = String::new();
    s.write_layout(&Context::new(), &m.graph, 2, &mut out);
    assert!(out.contains("## SPLIT #1"), "{out}");
    let plan = sched::Plan::from_scheduler(&s, &Context::new(), &m.graph);
    assert_eq!(plan.nodes.len(), m.graph.n_nodes());
    assert!(plan.nodes.iter().all(|n| n.name == "?" && n.op.is_none()));
    // A source slot past the last is empty, not a panic.
    let node = m.graph.nodes()[0];
    assert_eq!(s.effective_src(&m.ctx, node, graph::MAX_SRC), None);
    // The copies the plan made live after `mark`; the inputs before it.
    m.ctx.rewind(mark);
    let mut out = String::new();
    s.write_layout(&m.ctx, &m.graph, 2, &mut out);
    assert!(out.contains("## SPLIT #1"), "{out}");
}
