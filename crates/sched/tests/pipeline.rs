//! Pipeline parallelism with overlapping computes: `graph_compute_async` is called again
//! before the previous compute was synchronised, with two and with three pipeline copies, on
//! a test device with latency (so its stream is still on step k while the host already
//! prepares step k + 1 and k + 2). What keeps the steps apart is the per-copy machinery: each
//! step's inputs go to their own copy, and the per-(backend, copy) events make the host wait
//! before it overwrites a copy the device has not read yet.
//!
//! Every step's logits are checked, bit-for-bit against the CPU backend alone, without
//! synchronising between steps: right after each compute a device-to-device copy of the
//! logits into a history slot is queued on the device's stream, behind that step's work and
//! ahead of the next step's, and the host reads the history only every `WINDOW` steps.
//!
//! 1000 steps per run by default (`PIPELINE_STEPS=…` to change it).

mod common;

use std::time::Duration;

use backend_core::{tensor_alloc, tensor_copy_async, tensor_get};
use common::{Cfg, Model, Reference};
use graph::Op;
use sched::Scheduler;
use test_device::{TestDevice, TestDeviceConfig};

fn steps() -> u64 {
    std::env::var("PIPELINE_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 4 } else { 1000 })
}

/// Steps between two synchronisations (and history slots).
const WINDOW: u64 = 8;

fn overlapping_computes_match_cpu_alone(n_copies: usize) {
    // a small llama: two layers of width 32, four tokens at cache position 4 of 8
    let cfg = Cfg {
        n_embd: 32,
        n_head: 2,
        n_ff: 64,
        n_vocab: 32,
        n_tokens: 4,
        n_ctx: 8,
        kv_head: 4,
        n_kv: 8,
        ..Cfg::tiny(2)
    };
    let dev = TestDevice::create(
        TestDeviceConfig::named("PIPE")
            .default_latency(Duration::from_micros(20))
            .op_latency(Op::MulMat, Duration::from_micros(100))
            .transfer_latency(Duration::from_micros(20)),
    )
    .unwrap();
    let cpu = common::cpu(1);
    // embeddings and layer 0 on the CPU; layer 1 and the output on the device
    let place = common::offload(&cpu, &dev, 1);
    let mut m = Model::build(&cfg, &place, 11);
    let dev_backend = dev.init_backend("").unwrap();
    let mut sched = Scheduler::builder(vec![dev_backend.clone(), cpu])
        .graph_size(4096)
        .copies(n_copies)
        .build()
        .unwrap();
    let mut reference = Reference::new(&cfg, 11, &[]);

    // history slots for the logits, in device memory
    let (ty, ne) = (m.ctx[m.logits].ty(), m.ctx[m.logits].ne());
    let hist: Vec<_> = (0..WINDOW)
        .map(|_| m.ctx.new_tensor(ty, &ne).unwrap())
        .collect();
    let bytes = m.ctx[m.logits].nbytes();
    let slot = bytes.next_multiple_of(dev.buffer_type().alignment());
    let hist_buf = dev
        .buffer_type()
        .alloc_buffer(slot * WINDOW as usize)
        .unwrap();
    for (i, &h) in hist.iter().enumerate() {
        tensor_alloc(&mut m.ctx, &hist_buf, h, i * slot).unwrap();
    }

    sched.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    let on: Vec<usize> = sched.splits().iter().map(|s| s.backend_index()).collect();
    assert!(on.contains(&0) && on.contains(&1), "splits on {on:?}");
    let n = steps();
    let mut checked = 0;
    let mut window_start = 0;
    for step in 0..n {
        // The scheduler copies user inputs before it returns, so they are written while the
        // device may still be computing earlier steps.
        m.set_inputs(step);
        assert_eq!(sched.cur_copy(), (step as usize) % n_copies);
        sched.graph_compute_async(&mut m.ctx, &m.graph).unwrap();
        let h = hist[(step % WINDOW) as usize];
        tensor_copy_async(&m.ctx, &dev_backend, &dev_backend, m.logits, h).unwrap();
        if (step + 1) % WINDOW == 0 || step + 1 == n {
            sched.synchronize().unwrap();
            // Each step writes the same cache rows and reads only those and older ones, so a
            // step's logits depend on its own inputs only.
            for k in window_start..=step {
                let want = reference.step(k);
                let mut got = vec![0u8; bytes];
                tensor_get(&m.ctx, hist[(k % WINDOW) as usize], 0, &mut got).unwrap();
                assert!(
                    got == want,
                    "step {k} ({n_copies} copies): logits differ from the CPU alone"
                );
                checked += 1;
            }
            window_start = step + 1;
        }
    }
    assert_eq!(checked, n);
    assert!(m.caches() == reference.model.caches(), "KV caches differ");
}

#[test]
fn overlapping_computes_with_2_copies_match_cpu_alone() {
    overlapping_computes_match_cpu_alone(2);
}

#[test]
fn overlapping_computes_with_3_copies_match_cpu_alone() {
    overlapping_computes_match_cpu_alone(3);
}
