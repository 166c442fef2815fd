//! Scheduling decisions that depend on which buffer type a tensor lives in, computed end to
//! end against the CPU backend alone.
//!
//! The other computed tests place everything in one of two buffer types (the CPU's host
//! memory or the test device's memory), so a rule that asks "is this buffer type host
//! memory?" or "can that backend read this buffer type?" always gets the same answer there
//! and a change to it goes unnoticed. Here the answers differ: the CPU's `CPU_REPACK`
//! weights, which only the CPU reads and which are not host memory (their bytes are not the
//! tensors' plain bytes); two test devices, whose buffer types differ and neither reads the
//! other's; two streams of one test device, which share a buffer type; and, planning only,
//! fixture backends that read another's buffer type.

mod common;

use backend_core::{
    Backend, Buffer, BufferType, BufferUsage, ComputeStatus, tensor_alloc, tensor_get, tensor_set,
};
use common::Rng;
use graph::{Context, ElementType, Graph, TensorId};
use graph_alloc::GraphAllocator;
use sched::{Cause, Scheduler};
use test_device::{TestDevice, TestDeviceConfig};

/// q4_0 weight bytes: `rows` rows of `k` values, each block a small f16 scale and random
/// nibbles.
fn q4_0_bytes(k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = half::f16::from_f32(rng.uniform(0.005, 0.02));
        v.extend_from_slice(&d.to_le_bytes());
        v.extend((0..16).map(|_| rng.below(256) as u8));
    }
    v
}

fn f32_bytes(n: usize, rng: &mut Rng) -> Vec<u8> {
    (0..n)
        .flat_map(|_| rng.uniform(-1.0, 1.0).to_le_bytes())
        .collect()
}

/// `y = w_rep · x` with a q4_0 weight in `CPU_REPACK`, then `z = w_host · y` with an f32
/// weight in plain CPU memory; `x` is the graph input, `z` the output.
struct Net {
    ctx: Context,
    graph: Graph,
    w_rep: TensorId,
    w_host: TensorId,
    x: TensorId,
    y: TensorId,
    z: TensorId,
    _weights: Vec<Buffer>,
}

const K: i64 = 64;
const ROWS: i64 = 16;
const OUT: i64 = 8;
const COLS: i64 = 4;

fn net() -> Net {
    let mut ctx = Context::new();
    let mut rng = Rng::new(5);
    let w_rep = ctx.new_tensor_2d(ElementType::Q4_0, K, ROWS).unwrap();
    let w_host = ctx.new_tensor_2d(ElementType::F32, ROWS, OUT).unwrap();
    let place = |ctx: &mut Context, buft: BufferType, t: TensorId, bytes: &[u8]| {
        let buf = buft.alloc_buffer(buft.alloc_size(&ctx[t])).unwrap();
        buf.set_usage(BufferUsage::Weights);
        tensor_alloc(ctx, &buf, t, 0).unwrap();
        tensor_set(ctx, t, 0, bytes).unwrap();
        buf
    };
    let rep = place(
        &mut ctx,
        backend_cpu::cpu_repack_buffer_type(),
        w_rep,
        &q4_0_bytes(K as usize, ROWS as usize, &mut rng),
    );
    let host = place(
        &mut ctx,
        backend_cpu::cpu_buffer_type(),
        w_host,
        &f32_bytes((ROWS * OUT) as usize, &mut rng),
    );
    let x = ctx.new_tensor_2d(ElementType::F32, K, COLS).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.mul_mat(w_rep, x).unwrap();
    let z = ctx.mul_mat(w_host, y).unwrap();
    ctx.set_output(z).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, z).unwrap();
    Net {
        ctx,
        graph,
        w_rep,
        w_host,
        x,
        y,
        z,
        _weights: vec![rep, host],
    }
}

fn input(step: u64) -> Vec<u8> {
    f32_bytes((K * COLS) as usize, &mut Rng::new(100 + step))
}

/// The net computed by the CPU backend alone, without a scheduler.
fn reference(step: u64) -> Vec<u8> {
    let cpu = common::cpu(2);
    let mut n = net();
    let mut ga = GraphAllocator::new(&[cpu.default_buffer_type()]);
    ga.alloc_graph(&mut n.ctx, &n.graph).unwrap();
    tensor_set(&n.ctx, n.x, 0, &input(step)).unwrap();
    assert_eq!(
        cpu.graph_compute(&n.ctx, n.graph.as_view()).unwrap(),
        ComputeStatus::Success
    );
    let mut out = vec![0u8; n.ctx[n.z].nbytes()];
    tensor_get(&n.ctx, n.z, 0, &mut out).unwrap();
    out
}

/// Pass 1 offloads an op on host weights to a device that asks for it (`1.off`), but not an
/// op whose weight's buffer type is not host memory: the `CPU_REPACK` product stays on the
/// CPU by its weight (`1.wgt0`), and its weight is never copied, while the product with the
/// plain host weight moves to the device. Asking only "is the weight on the last backend?"
/// would offload both (and copy the repacked weight every step).
#[test]
fn only_products_on_host_weights_are_offloaded() {
    let dev = TestDevice::create(TestDeviceConfig::named("D").offload(true)).unwrap();
    let cpu: Backend = common::cpu(2);
    let mut s = Scheduler::new(vec![dev.init_backend("").unwrap(), cpu], None, 64, false).unwrap();
    for step in 0..2 {
        // a freshly built graph each step, as llama.cpp does (a node that still has memory
        // from the last plan would count as pre-allocated where it is)
        let mut n = net();
        s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
        assert_eq!(
            s.tensor_backend(n.y),
            Some(1),
            "repacked product on the CPU"
        );
        assert_eq!(s.tensor_cause(n.y), Cause::Weight(0));
        assert_eq!(
            s.tensor_backend(n.z),
            Some(0),
            "host-weight product offloaded"
        );
        assert_eq!(s.tensor_cause(n.z), Cause::Offload);
        let inputs: Vec<TensorId> = s
            .splits()
            .iter()
            .flat_map(|sp| sp.inputs())
            .copied()
            .collect();
        assert!(
            !inputs.contains(&n.w_rep),
            "the repacked weight is not copied"
        );
        assert!(
            inputs.contains(&n.w_host) && inputs.contains(&n.y),
            "{inputs:?}"
        );
        tensor_set(&n.ctx, n.x, 0, &input(step)).unwrap();
        assert_eq!(
            s.graph_compute(&mut n.ctx, &n.graph).unwrap(),
            ComputeStatus::Success
        );
        let mut got = vec![0u8; n.ctx[n.z].nbytes()];
        tensor_get(&n.ctx, n.z, 0, &mut got).unwrap();
        assert!(
            got == reference(step),
            "step {step}: differs from the CPU alone"
        );
        s.reset();
    }
}

/// `y = sqr(x)` on a device, `z = sqrt(y)` on the CPU: one input copy into the device and
/// one back, whichever device `y` is on.
struct Hop {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    y: TensorId,
    z: TensorId,
}

fn hop() -> Hop {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 64).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.sqr(x).unwrap();
    let z = ctx.sqrt(y).unwrap();
    ctx.set_output(z).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, z).unwrap();
    Hop {
        ctx,
        graph,
        x,
        y,
        z,
    }
}

/// Moving a node between two devices whose buffer types differ, without a reset, must re-plan
/// the compute memory even when nothing else about the allocation graph changes. Here
/// nothing else does: `y` (and the copy of `x` it reads) moves between devices A and B, and
/// the allocation graph has the same positions, roles and sizes either way, so the graph
/// allocator's own check finds the old plan fitting; only the comparison of the backend ids
/// with the last plan's (`backend_ids_changed` in the seed's `alloc_splits`) sees that
/// those positions now belong in B's memory. Reusing the plan would leave `y` in A's memory
/// while B computes it, which B cannot address.
#[test]
fn moving_a_node_to_a_device_of_another_buffer_type_replans_without_a_reset() {
    let a = TestDevice::create(TestDeviceConfig::named("A")).unwrap();
    let b = TestDevice::create(TestDeviceConfig::named("B")).unwrap();
    let mut s = Scheduler::new(
        vec![
            a.init_backend("").unwrap(),
            b.init_backend("").unwrap(),
            common::cpu(1),
        ],
        None,
        64,
        false,
    )
    .unwrap();
    let mut h = hop();
    let mut shape = None;
    for step in 0..4u64 {
        // the last plan's memory is dropped (the graph reads as freshly built), not the
        // scheduler's state: no reset
        for t in [h.x, h.y, h.z] {
            h.ctx[t].set_storage(None);
        }
        let (dev, on) = if step % 2 == 0 { (&a, 0) } else { (&b, 1) };
        s.set_tensor_backend(&h.ctx, h.y, on).unwrap();
        s.set_tensor_backend(&h.ctx, h.z, 2).unwrap();
        s.alloc_graph(&mut h.ctx, &h.graph).unwrap();
        let g = s.allocation_graph();
        let now = (g.n_nodes(), g.n_leafs(), s.n_splits());
        assert_eq!(
            *shape.get_or_insert(now),
            now,
            "same allocation-graph shape"
        );
        let st = h.ctx[h.y].storage().expect("y is placed");
        assert_eq!(
            backend_core::storage_buffer_type(st),
            Some(&dev.buffer_type()),
            "step {step}: y in the memory of the device computing it"
        );
        let xs: Vec<f32> = (0..64)
            .map(|i| (i as f32 - 31.5) * 0.25 + step as f32)
            .collect();
        let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensor_set(&h.ctx, h.x, 0, &bytes).unwrap();
        assert_eq!(
            s.graph_compute(&mut h.ctx, &h.graph).unwrap(),
            ComputeStatus::Success
        );
        let mut got = vec![0u8; 256];
        tensor_get(&h.ctx, h.z, 0, &mut got).unwrap();
        // sqrt(x²) rounds back to |x| exactly in binary floating point (no overflow or
        // underflow at these magnitudes)
        let want: Vec<u8> = xs.iter().flat_map(|v| v.abs().to_le_bytes()).collect();
        assert!(got == want, "step {step}: z differs from |x|");
    }
}

/// A backend that reads another backend's buffer type takes that data where it is: neither
/// a node computed there nor a weight kept there is copied, and a weight there does not cut
/// a split. Planning only (fixture backends): the test device reads no other memory.
///
/// GPU1 reads GPU0's buffer type. `a = w0 · x` runs on GPU0 (its weight), `b = w1 · a` on
/// GPU1 (its weight) reading `a` from GPU0's compute memory, `b2 = b + x2` follows `b`, and
/// `c = b2 + g0`, pinned to GPU1, reads the GPU0 weight `g0` in place. Two splits (GPU0: `a`;
/// GPU1: `b`, `b2`, `c`), whose only copies are the CPU inputs `x` and `x2`.
#[test]
fn a_backend_reading_another_buffer_type_takes_its_data_without_copies() {
    use sched::fixture::{BackendSpec, GraphFile, TensorSpec};
    let mut gpu1 = BackendSpec::gpu("GPU1");
    gpu1.reads_buffer_types = vec!["GPU0".into()];
    let file = GraphFile {
        name: "gpu1-reads-gpu0".into(),
        graph_size: 64,
        parallel: false,
        backends: vec![BackendSpec::gpu("GPU0"), gpu1, BackendSpec::cpu("CPU")],
        tensors: vec![
            TensorSpec::leaf("w0", "f32", &[16, 16]).in_buffer("GPU0"),
            TensorSpec::leaf("g0", "f32", &[16, 1]).in_buffer("GPU0"),
            TensorSpec::leaf("w1", "f32", &[16, 16]).in_buffer("GPU1"),
            TensorSpec::leaf("x", "f32", &[16, 1]).flag("input"),
            TensorSpec::leaf("x2", "f32", &[16, 1]).flag("input"),
            TensorSpec::op("a", "MUL_MAT", &["w0", "x"]),
            TensorSpec::op("b", "MUL_MAT", &["w1", "a"]),
            TensorSpec::op("b2", "ADD", &["b", "x2"]),
            TensorSpec::op("c", "ADD", &["b2", "g0"]),
        ],
        expand: vec!["c".into()],
        assign: [("c".to_owned(), "GPU1".to_owned())].into(),
    };
    let mut built = file.build().unwrap();
    let mut s = built.scheduler().unwrap();
    s.alloc_graph(&mut built.ctx, &built.graph).unwrap();
    let id = |n: &str| built.names[n];
    let on: Vec<(usize, Vec<TensorId>)> = s
        .splits()
        .iter()
        .map(|sp| (sp.backend_index(), sp.inputs().to_vec()))
        .collect();
    assert_eq!(
        on,
        [(0, vec![id("x")]), (1, vec![id("x2")])],
        "GPU0 with x copied in, GPU1 with x2 copied in; a and g0 read in place"
    );
    assert_eq!(s.tensor_backend(id("c")), Some(1));
    assert_eq!(s.tensor_cause(id("c")), Cause::User);
}

/// Forwards to `inner`, counting `synchronize` calls.
struct CountingSync {
    inner: Backend,
    syncs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl backend_core::BackendImpl for CountingSync {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn guid(&self) -> backend_core::Guid {
        self.inner.guid()
    }
    fn device(&self) -> backend_core::Device {
        self.inner.device()
    }
    fn synchronize(&self) -> backend_core::Result<()> {
        self.syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.synchronize()
    }
    fn graph_compute(
        &self,
        ctx: &Context,
        graph: graph::GraphView<'_>,
    ) -> backend_core::Result<ComputeStatus> {
        self.inner.implementation().graph_compute(ctx, graph)
    }
    fn event_record(&self, event: &backend_core::Event) -> backend_core::Result<()> {
        self.inner.event_record(event)
    }
    fn event_wait(&self, event: &backend_core::Event) -> backend_core::Result<()> {
        self.inner.event_wait(event)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The other half of the backend-id rule: a node moved between two backends that share a
/// buffer type (two streams of one device) keeps the memory plan, since its memory is the
/// same either way; re-planning costs a wait for every backend (a stall of any pipelined
/// work). Seen through the backends' `synchronize` calls during `alloc_graph`, which are
/// made only to re-plan: none when `y` moves between the two streams, some when it moves
/// to the CPU (another buffer type), which shows the count sees a re-plan. Planning only:
/// two streams of one device are not ordered against each other without copies.
#[test]
fn moving_a_node_between_backends_that_share_a_buffer_type_keeps_the_plan() {
    let dev = TestDevice::create(TestDeviceConfig::named("D")).unwrap();
    let syncs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = |b: Backend| {
        Backend::new(CountingSync {
            inner: b,
            syncs: syncs.clone(),
        })
    };
    let mut s = Scheduler::new(
        vec![
            counted(dev.init_backend("").unwrap()),
            counted(dev.init_backend("").unwrap()),
            counted(common::cpu(1)),
        ],
        None,
        64,
        false,
    )
    .unwrap();
    let mut h = hop();
    let mut plan = |on: usize| {
        for t in [h.x, h.y, h.z] {
            h.ctx[t].set_storage(None);
        }
        s.set_tensor_backend(&h.ctx, h.y, on).unwrap();
        s.set_tensor_backend(&h.ctx, h.z, 2).unwrap();
        let before = syncs.load(std::sync::atomic::Ordering::SeqCst);
        s.alloc_graph(&mut h.ctx, &h.graph).unwrap();
        assert_eq!(s.tensor_backend(h.y), Some(on));
        syncs.load(std::sync::atomic::Ordering::SeqCst) - before
    };
    plan(0); // the first plan
    assert_eq!(plan(1), 0, "stream 0 -> stream 1 re-planned");
    assert_eq!(plan(0), 0, "stream 1 -> stream 0 re-planned");
    assert!(plan(2) > 0, "device -> CPU must re-plan");
}

/// Pass 3 upgrades a node only to a higher-priority backend of the *same* buffer type, even
/// when a higher one still could read every source. GPU1 reads the VRAM buffer type that
/// GPU0a and GPU0b share; `m = wa + wb` (both weights in VRAM), pinned to GPU0b, moves up
/// to GPU0a and not to GPU1, which comes first and could read both weights. Planning only
/// (fixture backends).
#[test]
fn upgrades_go_only_to_a_backend_of_the_same_buffer_type() {
    use sched::fixture::{BackendSpec, GraphFile, TensorSpec};
    let mut gpu1 = BackendSpec::gpu("GPU1");
    gpu1.reads_buffer_types = vec!["VRAM".into()];
    let vram = |name: &str| BackendSpec {
        buffer_type: Some("VRAM".into()),
        ..BackendSpec::gpu(name)
    };
    let file = GraphFile {
        name: "upgrade-same-buft".into(),
        graph_size: 64,
        parallel: false,
        backends: vec![gpu1, vram("GPU0a"), vram("GPU0b"), BackendSpec::cpu("CPU")],
        tensors: vec![
            TensorSpec::leaf("wa", "f32", &[16]).in_buffer("VRAM"),
            TensorSpec::leaf("wb", "f32", &[16]).in_buffer("VRAM"),
            TensorSpec::op("m", "ADD", &["wa", "wb"]),
        ],
        expand: vec!["m".into()],
        assign: [("m".to_owned(), "GPU0b".to_owned())].into(),
    };
    let mut built = file.build().unwrap();
    let mut s = built.scheduler().unwrap();
    s.alloc_graph(&mut built.ctx, &built.graph).unwrap();
    let m = built.names["m"];
    assert_eq!(s.tensor_backend(m), Some(1), "GPU0a, the same buffer type");
    assert_eq!(s.tensor_cause(m), Cause::Upgrade);
}
