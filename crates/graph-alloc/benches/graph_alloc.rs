//! Graph allocator on a llama-shaped decode graph (n_embd 4096, one token, Q4_0 weights in a
//! weights buffer, F16 KV cache of 256 positions in its own buffer): `reserve` (a full planning
//! pass) and steady-state `alloc_graph` (plan check + placement), at 32 and 320 layers. Also
//! prints the compute buffer size against the live-bytes lower bound.
//!
//! Run: `cargo bench -p graph-alloc --bench graph_alloc`
//!
//! Instruction counts (repeatable where wall time is not): build with `--no-run`, then
//! `GALLOC_INSTR=alloc:32 valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*measured_call*' target/release/deps/graph_alloc-<hash> --bench`
//! (or `reserve:32`, or another layer count); the total divided by 100 is the count per call.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use graph::{Context, TensorId};
use graph_alloc::{GraphAllocator, alloc_ctx_tensors};
use test_fixtures::{
    FakeBufferType, LlamaConfig, LlamaDecode, LlamaModel, lifetimes, live_bytes_lower_bound,
    unplaced,
};

struct Setup {
    ctx: Context,
    decode: LlamaDecode,
    planned: Vec<TensorId>,
    galloc: GraphAllocator,
    _keep: Vec<backend_core::Buffer>,
}

#[allow(clippy::print_stderr)]
fn setup(n_layer: usize) -> Setup {
    let mut ctx = Context::new();
    let model = LlamaModel::new(&mut ctx, LlamaConfig::llama_7b(n_layer)).unwrap();
    let weights = FakeBufferType::new("weights", 32).into_buffer_type();
    let kv = FakeBufferType::new("kv", 32).into_buffer_type();
    let compute = FakeBufferType::new("CPU", 32).into_buffer_type();
    let w = alloc_ctx_tensors(&mut ctx, model.weights.iter().copied(), &weights)
        .unwrap()
        .unwrap();
    let k = alloc_ctx_tensors(&mut ctx, model.kv_cache.iter().copied(), &kv)
        .unwrap()
        .unwrap();
    let decode = model.decode_graph(&mut ctx).unwrap();
    let g = &decode.graph;
    let planned = unplaced(&ctx, g);
    let life = lifetimes(&ctx, g.nodes(), g.leafs());
    let mut galloc = GraphAllocator::new(std::slice::from_ref(&compute));
    galloc.alloc_graph(&mut ctx, g).unwrap();
    let bound = live_bytes_lower_bound(&ctx, g.nodes(), &life, |id| {
        life[id.index()].map(|_| compute.alloc_size(&ctx[id]).next_multiple_of(32))
    });
    let size = galloc.buffer_size(0);
    eprintln!(
        "llama decode, {n_layer} layers: {} nodes, {} leafs; compute buffer {size} bytes, \
         live-bytes lower bound {bound} bytes, ratio {:.3}",
        g.n_nodes(),
        g.n_leafs(),
        size as f64 / bound as f64
    );
    Setup {
        ctx,
        decode,
        planned,
        galloc,
        _keep: vec![w, k],
    }
}

/// One call of the measured operation, kept out of line so that `valgrind --tool=callgrind
/// --collect-atstart=no --toggle-collect='*measured_call*'` counts exactly the measured work.
#[inline(never)]
fn measured_call(s: &mut Setup, reserve: bool) {
    if reserve {
        s.galloc
            .reserve(&s.ctx, black_box(&s.decode.graph))
            .unwrap();
    } else {
        s.galloc
            .alloc_graph(&mut s.ctx, black_box(&s.decode.graph))
            .unwrap();
    }
}

/// `GALLOC_INSTR=<reserve|alloc>:<layers>` runs the operation 100 times outside criterion,
/// for instruction counting under callgrind (instructions per call: total / 100).
fn instr_mode() -> bool {
    let Ok(spec) = std::env::var("GALLOC_INSTR") else {
        return false;
    };
    let mut it = spec.split(':');
    let reserve = it.next() == Some("reserve");
    let n_layer = it.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let mut s = setup(n_layer);
    for _ in 0..100 {
        for &t in &s.planned {
            s.ctx[t].set_storage(None);
        }
        measured_call(&mut s, reserve);
    }
    true
}

fn bench(c: &mut Criterion) {
    if instr_mode() {
        return;
    }
    for n_layer in [32, 320] {
        let mut s = setup(n_layer);
        let mut group = c.benchmark_group(format!("llama_decode_{n_layer}_layers"));
        group.bench_function("reserve", |b| {
            b.iter(|| {
                s.galloc
                    .reserve(&s.ctx, black_box(&s.decode.graph))
                    .unwrap()
            })
        });
        group.bench_function("alloc_graph_steady", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for &t in &s.planned {
                        s.ctx[t].set_storage(None);
                    }
                    let start = Instant::now();
                    s.galloc
                        .alloc_graph(&mut s.ctx, black_box(&s.decode.graph))
                        .unwrap();
                    total += start.elapsed();
                }
                total
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
