//! Steady state is heap-allocation free: once reserved, `alloc_graph` (and re-reserving the same
//! graph) performs no heap allocation. Checked with a counting global allocator that counts
//! only on the measuring thread, around the measured call only.

use alloc_counter::{CountingAllocator, count_on_this_thread as counted};
use graph::Context;
use graph_alloc::{GraphAllocator, alloc_ctx_tensors};
use test_fixtures::{FakeBufferType, LlamaConfig, LlamaModel, unplaced};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::THREAD;

#[test]
fn steady_state_alloc_graph_does_not_allocate() {
    let cfg = if cfg!(miri) {
        LlamaConfig {
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_vocab: 100,
            n_ctx: 8,
            ..LlamaConfig::llama_7b(2)
        }
    } else {
        LlamaConfig::llama_7b(32)
    };
    let mut ctx = Context::new();
    let model = LlamaModel::new(&mut ctx, cfg).unwrap();
    let weights = FakeBufferType::new("weights", 32).into_buffer_type();
    let kv = FakeBufferType::new("kv", 32).into_buffer_type();
    let compute = FakeBufferType::new("CPU", 32).into_buffer_type();
    let _w = alloc_ctx_tensors(&mut ctx, model.weights.iter().copied(), &weights).unwrap();
    let _k = alloc_ctx_tensors(&mut ctx, model.kv_cache.iter().copied(), &kv).unwrap();
    let d = model.decode_graph(&mut ctx).unwrap();
    let g = &d.graph;
    let planned = unplaced(&ctx, g);

    // the counter does count
    let (_, n) = counted(|| std::hint::black_box(Box::new(7u64)));
    assert_eq!(n, 1);

    let mut galloc = GraphAllocator::new(&[compute]);
    galloc.reserve(&ctx, g).unwrap();
    galloc.alloc_graph(&mut ctx, g).unwrap();

    let (r, n) = counted(|| galloc.reserve(&ctx, g));
    r.unwrap();
    assert_eq!(n, 0, "re-reserving the same graph allocated {n} times");

    for _ in 0..3 {
        // forget the placements (what a fresh graph of the same shape looks like)
        for &t in &planned {
            ctx[t].set_storage(None);
        }
        let (r, n) = counted(|| galloc.alloc_graph(&mut ctx, g));
        r.unwrap();
        assert_eq!(n, 0, "alloc_graph allocated {n} times in steady state");
        assert!(planned.iter().all(|&t| ctx[t].has_storage()));
    }
}
