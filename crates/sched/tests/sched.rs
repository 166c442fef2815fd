//! Scheduler behaviour beyond single plans: the generator against the shared fixtures,
//! reserve-then-alloc on one graph, the caller's graph left intact, steady-state re-use,
//! compute with copies, the eval callback's batching, pipeline copies, typed errors.

use std::path::Path;
use std::sync::{Arc, Mutex};

use graph::{Context, ElementType, Graph, GraphError, Op, TensorId};
use sched::fixture::{BackendSpec, FixtureBackends, FixtureError, GraphFile, TensorSpec};
use sched::{Plan, SchedError, Scheduler};
use test_fixtures::llama_file::LlamaConfig;

fn shared(name: &str) -> GraphFile {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.graph.json"));
    GraphFile::from_json(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn same_graph(a: &GraphFile, b: &GraphFile) {
    assert_eq!(a.backends, b.backends);
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(x, y);
    }
    assert_eq!(a.expand, b.expand);
    assert_eq!(a.graph_size, b.graph_size);
}

#[test]
fn generator_reproduces_the_shared_llama_graphs() {
    let mut c = LlamaConfig::tiny(1);
    c.n_tokens = 4;
    c.kv_head = 12;
    same_graph(&c.graph_file("x"), &shared("llama-cpu-only-L1"));

    let c = LlamaConfig::tiny(2).offload("GPU0", 3);
    same_graph(&c.graph_file("x"), &shared("llama-gpu-full-L2"));

    let mut c = LlamaConfig::tiny(4).offload("GPU0", 2);
    c.wtype = "f16".into();
    c.output_buffer = "GPU0".into();
    same_graph(&c.graph_file("x"), &shared("llama-gpu-partial-L4-k2-f16"));

    let mut c = LlamaConfig::tiny(4).offload("GPU1", 5);
    c.backends.insert(0, BackendSpec::gpu("GPU0"));
    c.layer_buffers[0] = "GPU0".into();
    c.layer_buffers[1] = "GPU0".into();
    same_graph(&c.graph_file("x"), &shared("llama-2gpu-L4"));
}

/// The generator's fields are public: a layer list shorter than `n_layer` (the missing layers
/// take the embeddings' buffer) and a head count of 0 give a graph file, not a panic; building
/// the one with no heads is a typed error.
#[test]
fn generator_takes_any_field_values() {
    let mut c = LlamaConfig::tiny(3);
    c.layer_buffers.truncate(1);
    let full = LlamaConfig::tiny(3).graph_file("x");
    same_graph(&c.graph_file("x"), &full);
    let c = c.offload("GPU0", 1);
    assert_eq!(c.layer_buffers, ["CPU", "CPU", "GPU0"]);
    let mut c = LlamaConfig::tiny(1);
    c.n_head = 0;
    // heads of width 0: the reshape of Q to [0, 0, n_tokens] loses its elements
    let r = c.graph_file("x").build().map(|_| ());
    assert!(
        matches!(
            r,
            Err(FixtureError::Graph(GraphError::ShapeMismatch {
                op: Op::Reshape,
                ..
            }))
        ),
        "{r:?}"
    );
    // Shapes whose products leave the integer range are refused when built, not wrapped: a
    // leaf whose byte size overflows (the embeddings), caches each of which fits but not
    // together in their buffer, and a cache view at an offset past usize.
    type Expect = fn(&FixtureError) -> bool;
    let cases: [(i64, i64, i64, Expect); 3] = [
        (i64::MAX, 16, 8, |e| {
            matches!(e, FixtureError::Graph(GraphError::InvalidShape { .. }))
        }),
        (
            64,
            i64::MAX / 2,
            8,
            |e| matches!(e, FixtureError::Invalid(m) if m.contains("overflow usize")),
        ),
        (64, 16, -1, |e| {
            matches!(e, FixtureError::Graph(GraphError::ViewOutOfRange { .. }))
        }),
    ];
    for (n_embd, n_ctx, kv_head, expect) in cases {
        let mut c = LlamaConfig::tiny(1);
        (c.n_embd, c.n_ctx, c.kv_head) = (n_embd, n_ctx, kv_head);
        let r = c.graph_file("x").build().map(|_| ());
        assert!(
            r.as_ref().is_err_and(expect),
            "n_embd {n_embd}, n_ctx {n_ctx}, kv_head {kv_head}: {r:?}"
        );
    }
}

fn srcs_of(ctx: &Context, g: &Graph) -> Vec<[Option<TensorId>; 10]> {
    g.nodes().iter().map(|&n| *ctx[n].srcs()).collect()
}

#[test]
fn reserve_then_alloc_on_one_graph_gives_the_fresh_plan_and_leaves_the_graph_intact() {
    let file = LlamaConfig::tiny(4).offload("GPU0", 2).graph_file("p");
    let fresh = file.plan().unwrap();

    let mut b = file.build().unwrap();
    let before = srcs_of(&b.ctx, &b.graph);
    let mut s = b.scheduler().unwrap();
    s.reserve(&mut b.ctx, &b.graph).unwrap();
    assert_eq!(
        srcs_of(&b.ctx, &b.graph),
        before,
        "reserve left sources rewritten"
    );
    let reserved: Vec<usize> = (0..2).map(|i| s.buffer_size(i).unwrap()).collect();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    assert_eq!(
        srcs_of(&b.ctx, &b.graph),
        before,
        "alloc_graph left sources rewritten"
    );
    let plan = Plan::from_scheduler(&s, &b.ctx, &b.graph);
    assert_eq!(plan, fresh);
    // the reserved sizes were enough: no growth on alloc
    for (i, &r) in reserved.iter().enumerate() {
        assert_eq!(s.buffer_size(i).unwrap(), r);
    }
    // the plan has inputs, so there were rewrites to restore
    assert!(plan.splits.iter().any(|sp| !sp.inputs.is_empty()));
}

#[test]
fn steady_state_reset_and_alloc_repeat_the_plan() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 1).graph_file("p");
    let mut b = file.build().unwrap();
    let mut s = b.scheduler().unwrap();
    let cp = b.ctx.checkpoint();
    let fresh = file.plan().unwrap();
    for _ in 0..3 {
        s.reset();
        s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
        let p = Plan::from_scheduler(&s, &b.ctx, &b.graph);
        assert_eq!(p.splits, fresh.splits);
        assert_eq!(p.buffer_sizes, fresh.buffer_sizes);
        b.ctx.rewind(cp);
        // a fresh graph has no compute memory: clear what alloc_graph placed
        for &n in b.graph.nodes() {
            let is_view = b.ctx[n].is_view();
            let root_in_graph = b.ctx[n]
                .view_src()
                .is_some_and(|r| b.ctx[r].storage().is_none() || b.graph.nodes().contains(&r));
            if !is_view || root_in_graph {
                b.ctx[n].set_storage(None);
            }
        }
        for &l in b.graph.leafs() {
            if b.ctx[l].flags().contains(graph::TensorFlags::INPUT) {
                b.ctx[l].set_storage(None);
            }
        }
    }
}

#[test]
fn compute_runs_every_split_on_its_backend_and_advances_the_copy() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 1).graph_file("p");
    let mut b = file.build().unwrap();
    // one copy: compute leaves the copy at 0
    let mut s = b.scheduler().unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    s.graph_compute(&mut b.ctx, &b.graph).unwrap();
    assert_eq!(s.cur_copy(), 0);
    // three copies: each compute runs every split and moves to the next copy, wrapping
    let start = [b.backends.computed(0), b.backends.computed(1)];
    let mut s = Scheduler::builder(b.backends.backends().to_vec())
        .copies(3)
        .build()
        .unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    let before = srcs_of(&b.ctx, &b.graph);
    let mut want = [0usize; 2];
    for sp in s.splits() {
        want[sp.backend_index()] += sp.end() - sp.start();
    }
    assert!(want[0] > 0 && want[1] > 0);
    for (k, copy) in [1, 2, 0, 1].into_iter().enumerate() {
        s.graph_compute(&mut b.ctx, &b.graph).unwrap();
        assert_eq!(srcs_of(&b.ctx, &b.graph), before);
        assert_eq!(s.cur_copy(), copy, "after compute {}", k + 1);
        let n = k + 1;
        assert_eq!(b.backends.computed(0) - start[0], n * want[0]);
        assert_eq!(b.backends.computed(1) - start[1], n * want[1]);
    }
}

#[test]
fn pipeline_copies_are_chosen_at_run_time() {
    let file = LlamaConfig::tiny(2).offload("GPU0", 3).graph_file("p");
    let mut b = file.build().unwrap();
    let mut s = Scheduler::builder(b.backends.backends().to_vec())
        .copies(2)
        .build()
        .unwrap();
    assert_eq!(s.n_copies(), 2);
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    // every split input has one copy per pipeline copy, all allocated and distinct
    for sp in s.splits() {
        for &inp in sp.inputs() {
            let c0 = s.tensor_copy(inp, sp.backend_index(), 0).unwrap();
            let c1 = s.tensor_copy(inp, sp.backend_index(), 1).unwrap();
            assert_ne!(c0, c1);
            let (a, bb) = (b.ctx[c0].storage().unwrap(), b.ctx[c1].storage().unwrap());
            assert!(a.offset != bb.offset || !a.same_buffer(bb));
        }
    }
    // user inputs get per-copy storage too, the original being the current copy
    assert!(!s.graph_inputs().is_empty());
    for &inp in s.graph_inputs() {
        let be = s.tensor_backend(inp).unwrap();
        assert_eq!(s.tensor_copy(inp, be, s.cur_copy()), Some(inp));
    }
    s.graph_compute(&mut b.ctx, &b.graph).unwrap();
    assert_eq!(s.cur_copy(), 1);
}

#[test]
fn eval_callback_batches_nodes_and_can_stop() {
    let file = LlamaConfig::tiny(1).graph_file("cpu");
    let mut b = file.build().unwrap();
    let mut s = b.scheduler().unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    let n_nodes = b.graph.n_nodes();
    let want = b.graph.nodes()[5];
    let log: Arc<Mutex<Vec<(TensorId, bool)>>> = Arc::default();
    let l2 = log.clone();
    s.set_eval_callback(Some(Box::new(move |_ctx, t, ask| {
        l2.lock().unwrap().push((t, ask));
        if ask { t == want } else { false } // want node 5, then stop
    })));
    s.graph_compute(&mut b.ctx, &b.graph).unwrap();
    let log = log.lock().unwrap();
    // asked about nodes 0..=5, then told about 5, then stopped
    let asked: Vec<TensorId> = log.iter().filter(|e| e.1).map(|e| e.0).collect();
    assert_eq!(asked, b.graph.nodes()[..=5].to_vec());
    assert_eq!(log.last(), Some(&(want, false)));
    assert_eq!(b.backends.computed(0), 6);
    assert!(n_nodes > 6);
}

#[test]
fn user_assignment_survives_until_reset() {
    let file = LlamaConfig::tiny(1).offload("GPU0", 2).graph_file("g");
    let mut b = file.build().unwrap();
    let mut s = b.scheduler().unwrap();
    let t = b.names["kq_soft.0"];
    s.set_tensor_backend(&b.ctx, t, 1).unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    assert_eq!(s.tensor_backend(t), Some(1));
    assert_eq!(s.tensor_cause(t), sched::Cause::User);
    s.reset();
    assert_eq!(s.tensor_backend(t), None);
    let r = s.set_tensor_backend(&b.ctx, t, 7);
    assert!(
        matches!(r, Err(SchedError::BackendIndex { index: 7, .. })),
        "{r:?}"
    );
}

#[test]
fn construction_errors_are_typed() {
    let gpu_last =
        FixtureBackends::new(&[BackendSpec::cpu("CPU"), BackendSpec::gpu("GPU0")]).unwrap();
    assert!(matches!(
        Scheduler::new(gpu_last.backends().to_vec(), None, 16, false),
        Err(SchedError::LastNotCpu { .. })
    ));
    assert!(matches!(
        Scheduler::new(vec![], None, 16, false),
        Err(SchedError::NoBackends)
    ));
    let specs: Vec<BackendSpec> = (0..16)
        .map(|i| BackendSpec::gpu(&format!("G{i}")))
        .chain([BackendSpec::cpu("CPU")])
        .collect();
    let many = FixtureBackends::new(&specs).unwrap();
    assert!(matches!(
        Scheduler::new(many.backends().to_vec(), None, 16, false),
        Err(SchedError::TooManyBackends { n: 17, .. })
    ));
    let two = FixtureBackends::new(&[BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")]).unwrap();
    let gpu_buft = two.buffer_type("GPU0").unwrap();
    assert!(matches!(
        Scheduler::new(
            two.backends().to_vec(),
            Some(vec![gpu_buft.clone(), gpu_buft]),
            16,
            false
        ),
        Err(SchedError::BufferTypeUnsupported { .. })
    ));
    assert!(matches!(
        Scheduler::with_copies(two.backends().to_vec(), None, 16, 0),
        Err(SchedError::InvalidCopies(0))
    ));
}

#[test]
fn preallocated_tensor_on_an_incapable_backend_is_an_error_and_changes_nothing() {
    let file = shared("error-cpy-into-gpu-cache-unsupported");
    let mut b = file.build().unwrap();
    let before = srcs_of(&b.ctx, &b.graph);
    let n = b.ctx.len();
    let mut s = b.scheduler().unwrap();
    let e = s.alloc_graph(&mut b.ctx, &b.graph).unwrap_err();
    assert!(
        matches!(e, SchedError::PreallocatedUnsupported { op: "CPY", .. }),
        "{e}"
    );
    assert_eq!(srcs_of(&b.ctx, &b.graph), before);
    assert_eq!(b.ctx.len(), n);
}

#[test]
fn an_op_no_backend_supports_is_an_error() {
    let mut cpu = BackendSpec::cpu("CPU");
    cpu.supports_ops = Some(sched::fixture::OpsSpec::Except {
        except: vec!["SCALE".into()],
    });
    let file = GraphFile {
        graph_size: 16,
        backends: vec![cpu],
        tensors: vec![TensorSpec::leaf("x", "f32", &[4]).flag("input"), {
            let mut t = TensorSpec::op("y", "SCALE", &["x"]);
            t.scale = Some(2.0);
            t
        }],
        expand: vec!["y".into()],
        ..Default::default()
    };
    assert!(matches!(
        file.plan(),
        Err(sched::fixture::FixtureError::Sched(
            SchedError::NoBackendForOp { .. }
        ))
    ));
}

#[test]
fn graphs_beyond_the_reference_capacity_grow_unless_limits_are_on() {
    let backends = FixtureBackends::new(&[BackendSpec::cpu("CPU")]).unwrap();
    let mut ctx = Context::new();
    let mut x = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    ctx.set_input(x).unwrap();
    let mut g = Graph::new(64);
    for _ in 0..40 {
        x = ctx.sqr(x).unwrap();
    }
    g.build_forward_expand(&mut ctx, x).unwrap();
    let mut s = Scheduler::new(backends.backends().to_vec(), None, 8, false).unwrap();
    s.alloc_graph(&mut ctx, &g).unwrap(); // grows
    s.reset();
    s.set_reference_limits(true);
    assert!(matches!(
        s.alloc_graph(&mut ctx, &g),
        Err(SchedError::GraphTooLarge {
            n: 41,
            capacity: 11
        })
    ));
}

#[test]
fn a_buffer_usage_changed_between_splits_changes_the_plan() {
    // Buffer facts are memoised per split; a usage changed between two splits must be seen.
    let file = LlamaConfig::tiny(2).offload("GPU0", 3).graph_file("u");
    let mut b = file.build().unwrap();
    let mut s = b.scheduler().unwrap();
    let node = b.names["Qcur.0"];
    let unplaced: Vec<TensorId> = (b.graph.nodes().iter().chain(b.graph.leafs()))
        .copied()
        .filter(|&t| b.ctx[t].storage().is_none())
        .collect();
    let plan = |b: &mut sched::fixture::Built, s: &mut Scheduler| {
        for &t in &unplaced {
            b.ctx[t].set_storage(None);
        }
        s.reset();
        s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
        s.tensor_cause(node)
    };

    assert_eq!(plan(&mut b, &mut s), sched::Cause::Weight(0));
    for buf in &b.buffers {
        buf.set_usage(backend_core::BufferUsage::Any);
    }
    let c = plan(&mut b, &mut s);
    assert!(!matches!(c, sched::Cause::Weight(_)), "{c:?}");
    for buf in &b.buffers {
        buf.set_usage(backend_core::BufferUsage::Weights);
    }
    assert_eq!(plan(&mut b, &mut s), sched::Cause::Weight(0));
}
