//! Scheduler stress: a llama-shaped graph split between the test device and the CPU, with
//! pipeline copies and latency on the device, computed step after step with inputs that
//! change every step (and the next step's inputs written while the device may still be
//! working), every step's logits bit-for-bit the CPU backend's alone. Every fifth step the
//! scheduler is reset and re-plans, as llama.cpp does without graph reuse.
//!
//! 200 steps in normal runs; `STRESS_STEPS=10000 cargo test -p sched --release --test stress`
//! for the long run.

mod common;

use std::time::{Duration, Instant};

use common::{Cfg, Model, Reference};
use graph::Op;
use sched::Scheduler;
use test_device::{TestDevice, TestDeviceConfig};

#[test]
fn split_graph_with_pipeline_copies_and_latency_matches_cpu_alone_every_step() {
    let steps: u64 = std::env::var("STRESS_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let cfg = Cfg::tiny(4);
    let dev = TestDevice::create(
        TestDeviceConfig::named("STRESS")
            .default_latency(Duration::from_micros(5))
            .op_latency(Op::MulMat, Duration::from_micros(20))
            .transfer_latency(Duration::from_micros(10)),
    )
    .unwrap();
    let cpu = common::cpu(2);
    // embeddings and layers 0, 1 on the CPU; layers 2, 3 and the output on the device
    let place = common::offload(&cpu, &dev, 2);
    let mut m = Model::build(&cfg, &place, 7);
    let mut sched = Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu])
        .graph_size(4096)
        .copies(4)
        .build()
        .unwrap();
    let mut reference = Reference::new(&cfg, 7, &[]);

    let start = Instant::now();
    sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    m.set_inputs(0);
    for step in 0..steps {
        if step % 5 == 0 && step > 0 {
            sched.reset();
            sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
            m.set_inputs(step);
        }
        sched.graph_compute_async(&mut m.ctx, &m.graph).unwrap();
        // the scheduler copied the inputs before returning: overwrite them now
        if (step + 1) % 5 != 0 {
            m.set_inputs(step + 1);
        }
        sched.synchronize().unwrap();
        let got = m.logits();
        let want = reference.step(step);
        assert!(got == want, "step {step}: logits differ from the CPU alone");
        let on: Vec<usize> = sched.splits().iter().map(|s| s.backend_index()).collect();
        assert!(on.contains(&0) && on.contains(&1));
    }
    assert!(m.caches() == reference.model.caches(), "KV caches differ");
    tracing::info!(steps, elapsed = ?start.elapsed(), "stress run");
}
