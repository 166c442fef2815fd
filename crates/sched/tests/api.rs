//! The scheduler's interface as an engine meets it: the named constructor against the
//! positional one, split backends as handles, the layout as a `Display` value, and the report
//! of leafs that would be treated as compute memory (a warning once per tensor, an error with
//! strict weights).

use std::io::Write;
use std::sync::{Arc, Mutex};

use alloc_counter::{CountingAllocator, count_on_this_thread};
use backend_core::BufferUsage;
use graph::{Context, ElementType, Graph, TensorId};
use graph_alloc::alloc_ctx_tensors;
use sched::fixture::{BackendSpec, FixtureBackends};
use sched::{DEFAULT_PARALLEL_COPIES, Plan, SchedError, Scheduler};
use test_fixtures::llama_file::LlamaConfig;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::THREAD;

/// The named constructor makes the scheduler the positional one makes: same plan, same
/// copies, same buffer types.
#[test]
fn the_builder_plans_as_new_does() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 2).graph_file("b");
    for parallel in [false, true] {
        let mut a = file.build().unwrap();
        let mut pos = Scheduler::new(a.backends.backends().to_vec(), None, 256, parallel).unwrap();
        pos.alloc_graph(&mut a.ctx, &a.graph).unwrap();

        let mut b = file.build().unwrap();
        let bufts: Vec<_> = b
            .backends
            .backends()
            .iter()
            .map(|x| x.default_buffer_type())
            .collect();
        let mut named = Scheduler::builder(b.backends.backends().to_vec())
            .graph_size(256)
            .parallel(parallel)
            .buffer_types(bufts.clone())
            .build()
            .unwrap();
        named.alloc_graph(&mut b.ctx, &b.graph).unwrap();

        assert_eq!(
            Plan::from_scheduler(&pos, &a.ctx, &a.graph),
            Plan::from_scheduler(&named, &b.ctx, &b.graph)
        );
        assert!(named.n_splits() > 1);
        let want = if parallel { DEFAULT_PARALLEL_COPIES } else { 1 };
        assert_eq!((pos.n_copies(), named.n_copies()), (want, want));
        for (i, buft) in bufts.iter().enumerate() {
            assert_eq!(named.buffer_type(i), Some(buft));
        }
    }
}

#[test]
fn builder_errors_are_the_typed_errors_of_new() {
    let gpu_last =
        FixtureBackends::new(&[BackendSpec::cpu("CPU"), BackendSpec::gpu("GPU0")]).unwrap();
    assert!(matches!(
        Scheduler::builder(gpu_last.backends().to_vec()).build(),
        Err(SchedError::LastNotCpu { name }) if name == "GPU0"
    ));
    assert!(matches!(
        Scheduler::builder(vec![]).build(),
        Err(SchedError::NoBackends)
    ));
    let two = FixtureBackends::new(&[BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")]).unwrap();
    let gpu_buft = two.buffer_type("GPU0").unwrap();
    assert!(matches!(
        Scheduler::builder(two.backends().to_vec())
            .buffer_types(vec![gpu_buft.clone(), gpu_buft.clone()])
            .build(),
        Err(SchedError::BufferTypeUnsupported { .. })
    ));
    assert!(matches!(
        Scheduler::builder(two.backends().to_vec())
            .buffer_types(vec![gpu_buft])
            .build(),
        Err(SchedError::BufferTypeCount {
            expected: 2,
            got: 1
        })
    ));
    assert!(matches!(
        Scheduler::builder(two.backends().to_vec())
            .copies(0)
            .build(),
        Err(SchedError::InvalidCopies(0))
    ));
    // the last setting of the copies wins
    let s = Scheduler::builder(two.backends().to_vec())
        .copies(3)
        .parallel(false)
        .build()
        .unwrap();
    assert_eq!(s.n_copies(), 1);
}

/// `reference_limits` and `debug` on the builder are the setters' settings.
#[test]
fn builder_reference_limits_are_the_setters() {
    let backends = FixtureBackends::new(&[BackendSpec::cpu("CPU")]).unwrap();
    let mut ctx = Context::new();
    let mut x = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    ctx.set_input(x).unwrap();
    for _ in 0..40 {
        x = ctx.sqr(x).unwrap();
    }
    let mut g = Graph::new(64);
    g.build_forward_expand(&mut ctx, x).unwrap();
    let mut limited = Scheduler::builder(backends.backends().to_vec())
        .graph_size(8)
        .reference_limits(true)
        .debug(0)
        .build()
        .unwrap();
    assert!(matches!(
        limited.alloc_graph(&mut ctx, &g),
        Err(SchedError::GraphTooLarge { n: 41, .. })
    ));
    let mut grows = Scheduler::builder(backends.backends().to_vec())
        .graph_size(8)
        .build()
        .unwrap();
    grows.alloc_graph(&mut ctx, &g).unwrap();
}

/// A split's backend is the scheduler's backend handle at the split's index.
#[test]
fn a_split_names_its_backend() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 2).graph_file("s");
    let (_b, s) = file.schedule().unwrap();
    let mut names = Vec::new();
    for sp in s.splits() {
        assert!(*sp.backend() == s.backends()[sp.backend_index()]);
        names.push(sp.backend().name().to_owned());
    }
    assert!(names.iter().any(|n| n == "GPU0") && names.iter().any(|n| n == "CPU"));
    // a second plan over other backends gives other handles
    let cpu_only = LlamaConfig::tiny(2).graph_file("c");
    let (_c, s2) = cpu_only.schedule().unwrap();
    assert!(
        s2.splits()
            .iter()
            .all(|sp| *sp.backend() == s2.backends()[0])
    );
}

/// The `Display` layout is the written one, at both levels.
#[test]
fn the_layout_displays_what_write_layout_writes() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 2).graph_file("l");
    let (b, s) = file.schedule().unwrap();
    for level in [1, 2] {
        let mut written = String::from("head");
        s.write_layout(&b.ctx, &b.graph, level, &mut written);
        let shown = s.layout(&b.ctx, &b.graph, level).to_string();
        assert_eq!(written, format!("head{shown}"));
        assert!(shown.contains("## SPLIT #1"));
    }
    assert!(
        s.layout(&b.ctx, &b.graph, 2)
            .to_string()
            .contains("node #  0")
    );
}

/// A one-backend graph `y = w * x` where `w` is a leaf that is no input and `x` an input.
struct Weighted {
    ctx: Context,
    graph: Graph,
    w: TensorId,
    backends: FixtureBackends,
    _buffers: Vec<backend_core::Buffer>,
}

/// `w` placed by `place`: `None` leaves it without memory, `Some(usage)` allocates it in a
/// CPU buffer of that usage.
fn weighted(place: Option<BufferUsage>) -> Weighted {
    let backends = FixtureBackends::new(&[BackendSpec::cpu("CPU")]).unwrap();
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::F32, 8, 8).unwrap();
    ctx.set_name(w, "blk.0.w").unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 8, 2).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, y).unwrap();
    let mut buffers = Vec::new();
    if let Some(usage) = place {
        let buft = backends.backends()[0].default_buffer_type();
        let buf = alloc_ctx_tensors(&mut ctx, [w], &buft).unwrap().unwrap();
        buf.set_usage(usage);
        buffers.push(buf);
    }
    Weighted {
        ctx,
        graph,
        w,
        backends,
        _buffers: buffers,
    }
}

fn strict(m: &Weighted) -> Scheduler {
    Scheduler::builder(m.backends.backends().to_vec())
        .graph_size(16)
        .strict_weights(true)
        .build()
        .unwrap()
}

#[test]
fn strict_weights_refuse_a_leaf_without_memory_and_allocate_nothing() {
    let mut m = weighted(None);
    let mut s = strict(&m);
    let n = m.ctx.len();
    let e = s.alloc_graph(&mut m.ctx, &m.graph).unwrap_err();
    assert!(
        matches!(&e, SchedError::UnplacedWeights { tensor, name }
            if *tensor == m.w && name == "blk.0.w"),
        "{e}"
    );
    assert!(e.to_string().contains("blk.0.w"), "{e}");
    assert!(m.ctx[m.w].storage().is_none());
    assert_eq!(m.ctx.len(), n);
    assert!(matches!(
        s.reserve(&mut m.ctx, &m.graph),
        Err(SchedError::UnplacedWeights { .. })
    ));
    // off again: the seed's behaviour, compute memory for the leaf
    s.set_strict_weights(false);
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    assert!(m.ctx[m.w].storage().is_some());
    // which is now a compute buffer: still refused with strict weights
    s.set_strict_weights(true);
    assert!(matches!(
        s.alloc_graph(&mut m.ctx, &m.graph),
        Err(SchedError::UnplacedWeights { tensor, .. }) if tensor == m.w
    ));
}

#[test]
fn strict_weights_refuse_a_leaf_in_a_compute_buffer_only() {
    let mut m = weighted(Some(BufferUsage::Compute));
    assert!(matches!(
        strict(&m).alloc_graph(&mut m.ctx, &m.graph),
        Err(SchedError::UnplacedWeights { tensor, .. }) if tensor == m.w
    ));
    for usage in [BufferUsage::Weights, BufferUsage::Any] {
        let mut m = weighted(Some(usage));
        strict(&m).alloc_graph(&mut m.ctx, &m.graph).unwrap();
    }
    // an input without memory is the caller's to fill after allocation, not a weight
    let mut m = weighted(None);
    m.ctx.set_input(m.w).unwrap();
    strict(&m).alloc_graph(&mut m.ctx, &m.graph).unwrap();
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn warnings_during(f: impl FnOnce()) -> Vec<String> {
    let out = Captured::default();
    let w = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    out.text()
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_leaf_treated_as_compute_memory_is_warned_about_once() {
    let mut m = weighted(None);
    let lines = warnings_during(|| {
        let mut s = Scheduler::builder(m.backends.backends().to_vec())
            .graph_size(16)
            .build()
            .unwrap();
        for _ in 0..3 {
            s.reset();
            s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
        }
    });
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("blk.0.w"), "{lines:#?}");
    assert!(lines[0].contains("compute memory"), "{lines:#?}");

    // a placed weight: nothing to say
    let mut m = weighted(Some(BufferUsage::Weights));
    let lines = warnings_during(|| {
        let mut s = Scheduler::builder(m.backends.backends().to_vec())
            .graph_size(16)
            .build()
            .unwrap();
        s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    });
    assert!(lines.is_empty(), "{lines:#?}");
}

/// Once the warning is given, planning the graph again allocates nothing for it.
#[test]
fn a_reported_leaf_costs_no_allocation_per_step() {
    let mut m = weighted(None);
    let mut s = Scheduler::builder(m.backends.backends().to_vec())
        .graph_size(16)
        .build()
        .unwrap();
    for _ in 0..4 {
        s.reset();
        s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    }
    let ((), n) = count_on_this_thread(|| {
        for _ in 0..16 {
            s.reset();
            s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
        }
    });
    assert_eq!(n, 0, "{n} allocations in 16 plans");
}
