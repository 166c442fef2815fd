//! The scheduler computing for real over the CPU backend and the test device (whose memory is
//! not host memory): every result must be bit-for-bit the CPU backend's alone, for plain
//! scheduling, pipeline copies (2 and 4), an eval callback (observing and stopping early),
//! per-op latency on the device, and a device that lacks some ops (more splits, copies both
//! ways).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Cfg, Model, Reference};
use graph::{Op, TensorId};
use sched::Scheduler;
use test_device::{TestDevice, TestDeviceConfig};

const SEED: u64 = 42;

struct Setup {
    model: Model,
    sched: Scheduler,
}

fn setup(cfg: &Cfg, dev_cfg: TestDeviceConfig, n_cpu: usize, n_copies: usize) -> Setup {
    let dev = TestDevice::create(dev_cfg).unwrap();
    let cpu = common::cpu(2);
    let place = common::offload(&cpu, &dev, n_cpu);
    let model = Model::build(cfg, &place, SEED);
    let sched = Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu])
        .graph_size(4096)
        .copies(n_copies)
        .build()
        .unwrap();
    Setup { model, sched }
}

impl Setup {
    fn step(&mut self, step: u64) -> Vec<u8> {
        let m = &mut self.model;
        self.sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
        m.set_inputs(step);
        let st = self.sched.graph_compute(&mut m.ctx, &m.graph).unwrap();
        assert_eq!(st, backend_core::ComputeStatus::Success);
        self.model.logits()
    }
}

/// Both backends really got work: at least one split on each.
fn assert_split_between_both(s: &Scheduler) {
    let on: Vec<usize> = s.splits().iter().map(|sp| sp.backend_index()).collect();
    assert!(on.contains(&0) && on.contains(&1), "splits on {on:?}");
}

fn run_steps(cfg: &Cfg, dev_cfg: TestDeviceConfig, n_cpu: usize, n_copies: usize, steps: u64) {
    let mut reference = Reference::new(cfg, SEED, &[]);
    let mut s = setup(cfg, dev_cfg, n_cpu, n_copies);
    for step in 0..steps {
        let want = reference.step(step);
        let got = s.step(step);
        assert_split_between_both(&s.sched);
        assert!(got == want, "step {step}: logits differ from the CPU alone");
    }
    assert!(
        s.model.caches() == reference.model.caches(),
        "KV caches differ from the CPU alone"
    );
}

#[test]
fn split_graph_equals_cpu_alone() {
    run_steps(&Cfg::tiny(4), TestDeviceConfig::named("D"), 2, 1, 3);
}

#[test]
fn f16_weights_split_graph_equals_cpu_alone() {
    let mut cfg = Cfg::tiny(3);
    cfg.wtype = "f16".into();
    run_steps(&cfg, TestDeviceConfig::named("D"), 1, 1, 3);
}

#[test]
fn pipeline_copies_2_equal_cpu_alone() {
    run_steps(&Cfg::tiny(4), TestDeviceConfig::named("D"), 2, 2, 5);
}

#[test]
fn pipeline_copies_4_equal_cpu_alone() {
    run_steps(&Cfg::tiny(4), TestDeviceConfig::named("D"), 2, 4, 9);
}

#[test]
fn per_op_latency_on_the_device_changes_nothing() {
    let slow = TestDeviceConfig::named("SLOW")
        .default_latency(Duration::from_micros(100))
        .op_latency(Op::MulMat, Duration::from_micros(300))
        .transfer_latency(Duration::from_micros(200));
    run_steps(&Cfg::tiny(4), slow.clone(), 2, 1, 2);
    run_steps(&Cfg::tiny(4), slow, 2, 4, 5);
}

#[test]
fn a_device_without_some_ops_splits_more_and_still_equals_cpu_alone() {
    // ROPE and SOFT_MAX run on the CPU between device splits: copies go both ways, and the
    // cache writes (CPY into the device's cache) read CPU results. (Leaving out CPY too is
    // refused, as in ggml: the cache views are pre-allocated in device memory.)
    let ops = [
        Op::Cpy,
        Op::Add,
        Op::Mul,
        Op::MulMat,
        Op::RmsNorm,
        Op::Unary(graph::UnaryOp::Silu),
        Op::Cont,
    ];
    let cfg = Cfg::tiny(3);
    let dev = TestDeviceConfig::named("PARTIAL")
        .supported_ops(ops)
        .transfer_latency(Duration::from_micros(100));
    let mut reference = Reference::new(&cfg, SEED, &[]);
    let mut s = setup(&cfg, dev, 0, 2);
    for step in 0..4 {
        let want = reference.step(step);
        let got = s.step(step);
        assert!(got == want, "step {step}: logits differ");
    }
    assert!(
        s.sched.n_splits() > 2 * cfg.n_layer,
        "{} splits",
        s.sched.n_splits()
    );
    assert!(s.model.caches() == reference.model.caches());
}

/// Node names and bytes seen by a callback.
type Seen = Vec<(String, Vec<u8>)>;

/// The eval callback sees every MUL_MAT node when asked for them, with the values the CPU
/// alone computes, and the final results do not change.
#[test]
fn eval_callback_observes_nodes_with_cpu_alone_values() {
    let cfg = Cfg::tiny(3);
    let watched = ["attn_out.0", "kq_soft.1", "attn_out.2", "l_out.2"];
    let mut reference = Reference::new(&cfg, SEED, &watched);
    let want = reference.step(7);
    let mut s = setup(
        &cfg,
        TestDeviceConfig::named("D").default_latency(Duration::from_micros(50)),
        1,
        2,
    );
    let watched_ids: Vec<(String, TensorId)> = watched
        .iter()
        .map(|n| (n.to_string(), s.model.id(n)))
        .collect();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let asked = Arc::new(Mutex::new(0usize));
    let (seen2, asked2, ids) = (seen.clone(), asked.clone(), watched_ids.clone());
    s.sched.set_eval_callback(Some(Box::new(move |ctx, t, ask| {
        let w = ids.iter().find(|(_, id)| *id == t);
        if ask {
            *asked2.lock().unwrap() += 1;
            return w.is_some();
        }
        let (name, _) = w.expect("called back only for nodes it asked for");
        let mut b = vec![0u8; ctx[t].nbytes()];
        backend_core::tensor_get(ctx, t, 0, &mut b).unwrap();
        seen2.lock().unwrap().push((name.clone(), b));
        true
    })));
    let got = s.step(7);
    assert!(got == want, "logits differ with a callback");
    let seen = seen.lock().unwrap();
    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, watched, "every watched node, in graph order");
    for (n, b) in seen.iter() {
        let r = reference.model.bytes(reference.model.id(n));
        assert!(
            *b == r,
            "{n}: value seen by the callback differs from the CPU alone"
        );
    }
    // asked exactly once about every node of every split (the callback never stops here), and
    // the splits hold every computed node
    let in_splits: usize = s.sched.splits().iter().map(|x| x.end() - x.start()).sum();
    let computed = s
        .model
        .graph
        .nodes()
        .iter()
        .filter(|&&n| !(s.model.ctx[n].op() == Op::None || s.model.ctx[n].op().is_view_op()))
        .count();
    let a = *asked.lock().unwrap();
    assert_eq!(
        a, in_splits,
        "asked about {a} nodes, the splits hold {in_splits}"
    );
    assert!(
        in_splits >= computed,
        "{in_splits} nodes in splits, {computed} computed"
    );
}

/// Returning `false` after a node stops its split: later nodes of that split are not
/// computed (nor asked about); later splits still run. A full compute afterwards is exact.
#[test]
fn eval_callback_stopping_early_skips_the_rest_of_the_split() {
    let cfg = Cfg::tiny(3);
    // layer 0 on the CPU, the rest on the device
    let mut s = setup(&cfg, TestDeviceConfig::named("D"), 1, 1);
    s.sched
        .alloc_graph(&mut s.model.ctx, &s.model.graph)
        .unwrap();
    // a named node followed by other computed nodes in its split, which is not the last one
    let nodes = s.model.graph.nodes().to_vec();
    let splits: Vec<(usize, usize)> = s
        .sched
        .splits()
        .iter()
        .map(|x| (x.start(), x.end()))
        .collect();
    let (stop_name, stop_at, later) = splits[..splits.len() - 1]
        .iter()
        .find_map(|&(a, b)| {
            let (name, id) = s
                .model
                .named
                .iter()
                .find(|(_, id)| nodes[a..b.saturating_sub(2)].contains(id))?;
            Some((name.clone(), *id, nodes[b - 1]))
        })
        .expect("a split with a named node before its end");
    let logits = s.model.logits;
    // keep both readable after compute (outputs are never overwritten by the allocator):
    // in a fresh setup, flagged before its first allocation (the allocator keeps a plan
    // that fits, flags aside, as ggml's does)
    let mut s = setup(&cfg, TestDeviceConfig::named("D"), 1, 1);
    s.model.ctx.set_output(stop_at).unwrap();
    s.model.ctx.set_output(later).unwrap();
    s.sched
        .alloc_graph(&mut s.model.ctx, &s.model.graph)
        .unwrap();
    let again: Vec<(usize, usize)> = s
        .sched
        .splits()
        .iter()
        .map(|x| (x.start(), x.end()))
        .collect();
    assert_eq!(splits, again);
    let mut reference = Reference::new(&cfg, SEED, &[&stop_name]);
    let want3 = reference.step(3);
    let want_stop = reference.model.bytes(reference.model.id(&stop_name));
    let want4 = reference.step(4);
    let want_stop4 = reference.model.bytes(reference.model.id(&stop_name));
    assert!(want_stop != want_stop4, "inputs change between steps");
    // A first, plain compute fills everything with step 3's values.
    assert!(s.step(3) == want3);
    assert!(
        s.model.bytes(stop_at) == want_stop,
        "{stop_name}: {:?} vs {:?}",
        &s.model.bytes(stop_at)[..16],
        &want_stop[..16]
    );
    let asked: Arc<Mutex<Vec<TensorId>>> = Arc::default();
    let a2 = asked.clone();
    s.sched
        .set_eval_callback(Some(Box::new(move |_ctx, t, ask| {
            if ask {
                a2.lock().unwrap().push(t);
                return t == stop_at;
            }
            assert_eq!(t, stop_at);
            false
        })));
    // step 4 with the early stop: the split's last node keeps step 3's value; the logits are
    // computed (their split ran) but from stale values, so they are not step 4's.
    let before = s.model.bytes(later);
    let got = s.step(4);
    let asked = asked.lock().unwrap().clone();
    assert!(asked.contains(&stop_at));
    assert!(!asked.contains(&later), "asked about a node after the stop");
    assert!(asked.contains(&logits), "later splits must still run");
    assert!(
        s.model.bytes(later) == before,
        "a node after the stop was computed"
    );
    assert!(
        s.model.bytes(stop_at) == want_stop4,
        "the node the callback stopped at holds step 4's value"
    );
    assert!(got != want4);
    // without the callback, the next compute is exact again
    s.sched.set_eval_callback(None);
    assert!(s.step(4) == want4);
}
