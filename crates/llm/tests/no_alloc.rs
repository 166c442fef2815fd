//! After warm-up, a decode step (build the graph, schedule it, compute, read the logits)
//! makes no heap allocation, counted by a global allocator that wraps the system one: on
//! SmolLM2 with 2 threads, and on the synthetic model (F32 weights: other kernel paths).
//!
//! The synthetic test uses one CPU thread: with several, the f32 kernels' work is stolen in
//! chunks whose length varies from run to run, and a chunk longer than any before grows that
//! thread's scratch (by `realloc`) at whatever step it first happens (measured: 2 allocations
//! in 16 steps in about one run of six). SmolLM2's q4_1/q8_0/f16 paths use fixed units and
//! settle within the warm-up. The kernels' worker threads are running before `Llama::new`
//! returns, so their own start-up allocations never fall inside a measured step (they did
//! under load, where a worker could first be scheduled after the warm-up), and they sleep on `std`'s
//! condition variables, which never allocate (under load a worker could first sleep during a
//! measured step, and `parking_lot`'s first block in the process built its wait table then:
//! 5 failures in 60 runs beside three CPU hogs, 0 in 60 since).

mod common;

use alloc_counter::{CountingAllocator, allocations};
use llm::{Llama, LlamaOptions};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::PROCESS;

const WARM: u32 = 4;
const STEPS: u32 = 16;

#[test]
#[cfg_attr(miri, ignore = "too slow under Miri")]
fn a_decode_step_after_warm_up_does_not_allocate() {
    let m = common::Synthetic::tiny(9);
    let mut llama = Llama::new(
        &m,
        LlamaOptions {
            threads: 1,
            n_ctx: 64,
            ..Default::default()
        },
    )
    .unwrap();
    llama.eval(&[1, 2, 3, 4]).unwrap();
    for t in 0..WARM {
        llama.eval(&[t]).unwrap();
    }
    let before = allocations();
    for t in 0..STEPS {
        llama.eval(&[t]).unwrap();
    }
    let n = allocations() - before;
    assert_eq!(n, 0, "{n} heap allocations in {STEPS} decode steps");
}

/// SmolLM2 itself (q4_1 and q8_0 products, the f16 attention over the KV cache), with 2
/// threads: after warm-up no step allocates.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri")]
fn a_smollm2_decode_step_after_warm_up_does_not_allocate() {
    let Some(file) = common::golden::model_or_skip("no_alloc smollm2") else {
        return;
    };
    let mut llama = Llama::new(
        &file,
        LlamaOptions {
            threads: 2,
            n_ctx: 256,
            ..Default::default()
        },
    )
    .unwrap();
    llama.eval(&[1, 9690, 198, 2683, 359, 253]).unwrap();
    for t in 0..16 {
        llama.eval(&[t + 100]).unwrap();
    }
    let before = allocations();
    for t in 0..16 {
        llama.eval(&[t + 200]).unwrap();
    }
    let n = allocations() - before;
    assert_eq!(n, 0, "{n} heap allocations in 16 SmolLM2 decode steps");
}
