//! Scheduler overhead on a llama decode graph (n_embd 4096, one token, weights in a weights
//! buffer, each layer's KV cache in the layer's buffer): `reset + alloc_graph`, `split_graph`
//! alone and `reserve`, with one CPU backend and with a GPU fixture backend + CPU at 16 and
//! 33 offloaded layers of 32; then the same at 10× the layers. Heap allocations per call are
//! counted with a counting global allocator and printed before each group.
//!
//! ggml's reference on this graph: reset + alloc_graph ≈ 80 µs, split ≈ 53 µs, reserve ≈
//! 120 µs. Run with `cargo bench -p sched --bench sched`.
//!
//! Pipeline parallelism (`llama32/gpu16+cpu/pipeline`): one `alloc_graph`, then
//! `graph_compute` step after step with 1, 2 and 4 pipeline copies, timing the scheduler's
//! work per step (the fixture backends compute nothing: what is left is the input copies, the
//! events and the splits' dispatch, plus any re-planning). Every 64 steps the plan is made
//! again, and computed once, outside the timing, so that a version that re-plans per step does not grow the context
//! without bound. `SCHED_PIPE=<steps>` prints mean / median / p10 per step instead, for
//! interleaved rounds of two builds.
//!
//! ggml measured in the same run on the same graph: `crates/sched/benches/ggml-sched-bench.sh`
//! (ggml 0.25.3's scheduler, graph written by `cargo run --release -p sched --example
//! llama-graph`); `SCHED_PERCALL=2000` prints our per-call mean / median / p10 in its format,
//! and `crates/sched/benches/sched-vs-ggml.sh` runs both in interleaved rounds and prints the
//! ratios.

#![allow(clippy::print_stdout, missing_docs)]

use std::time::{Duration, Instant};

use alloc_counter::{CountingAllocator, allocations};
use criterion::{Criterion, criterion_group, criterion_main};
use graph::{Checkpoint, TensorId};
use sched::Scheduler;
use sched::fixture::Built;
use test_fixtures::llama_file::LlamaConfig;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::PROCESS;

type Op = fn(&mut Setup);

struct Setup {
    built: Built,
    sched: Scheduler,
    cp: Checkpoint,
    unplaced: Vec<TensorId>,
}

impl Setup {
    fn new(n_layer: usize, n_gpu: Option<usize>) -> Setup {
        let mut c = LlamaConfig::llama_7b(n_layer);
        if let Some(n) = n_gpu {
            c = c.offload("GPU0", n);
        }
        let built = c.graph_file("bench").build().expect("graph");
        let sched = built.scheduler().expect("scheduler");
        let cp = built.ctx.checkpoint();
        let unplaced = test_fixtures::unplaced(&built.ctx, &built.graph);
        let mut s = Setup {
            built,
            sched,
            cp,
            unplaced,
        };
        // warm up: tables and buffers reach their steady-state size
        for _ in 0..3 {
            s.fresh();
            s.sched.reset();
            s.sched
                .alloc_graph(&mut s.built.ctx, &s.built.graph)
                .expect("alloc");
            s.fresh();
            s.sched
                .reserve(&mut s.built.ctx, &s.built.graph)
                .expect("reserve");
        }
        s
    }

    /// Make the graph look freshly built: drop the scheduler's copies and views, and the
    /// compute memory the last allocation placed.
    fn fresh(&mut self) {
        self.built.ctx.rewind(self.cp);
        for &t in &self.unplaced {
            self.built.ctx[t].set_storage(None);
        }
    }

    /// Like [`Setup::new`], with `n_copies` pipeline copies.
    fn with_copies(n_layer: usize, n_gpu: Option<usize>, n_copies: usize) -> Setup {
        let mut s = Setup::new(n_layer, n_gpu);
        s.sched = Scheduler::with_copies(
            s.built.backends.backends().to_vec(),
            None,
            s.built.graph_size,
            n_copies,
        )
        .expect("scheduler");
        s.replan();
        s
    }

    /// Drop the last plan's copies and views, then plan and allocate the graph again, and
    /// compute it once (the fixture's memory is materialised on first use, and a new
    /// allocation may place compute buffers anew).
    fn replan(&mut self) {
        self.fresh();
        self.alloc();
        self.step();
    }

    /// One pipeline step: compute the allocated graph.
    fn step(&mut self) {
        self.sched
            .graph_compute(&mut self.built.ctx, &self.built.graph)
            .expect("compute");
    }

    fn alloc(&mut self) {
        self.sched.reset();
        self.sched
            .alloc_graph(&mut self.built.ctx, &self.built.graph)
            .expect("alloc");
    }
    fn split(&mut self) {
        self.sched.reset();
        self.sched
            .split_graph(&mut self.built.ctx, &self.built.graph)
            .expect("split");
    }
    fn reserve(&mut self) {
        self.sched
            .reserve(&mut self.built.ctx, &self.built.graph)
            .expect("reserve");
    }
}

fn allocs_per_call(s: &mut Setup, f: fn(&mut Setup)) -> f64 {
    let n = 20;
    let mut total = 0;
    for _ in 0..n {
        s.fresh();
        let a = allocations();
        f(s);
        total += allocations() - a;
    }
    total as f64 / n as f64
}

fn bench_case(c: &mut Criterion, name: &str, n_layer: usize, n_gpu: Option<usize>) {
    let mut s = Setup::new(n_layer, n_gpu);
    println!(
        "{name}: {} nodes, {} leafs, {} splits; heap allocations per call: alloc_graph {}, split {}, reserve {}",
        s.built.graph.n_nodes(),
        s.built.graph.n_leafs(),
        s.sched.n_splits(),
        allocs_per_call(&mut s, Setup::alloc),
        allocs_per_call(&mut s, Setup::split),
        allocs_per_call(&mut s, Setup::reserve),
    );
    let mut g = c.benchmark_group(name);
    let ops: [(&str, Op); 3] = [
        ("reset+alloc_graph", Setup::alloc),
        ("split", Setup::split),
        ("reserve", Setup::reserve),
    ];
    for (op, f) in ops {
        g.bench_function(op, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    s.fresh();
                    let start = Instant::now();
                    f(&mut s);
                    t += start.elapsed();
                }
                t
            })
        });
    }
    g.finish();
}

/// Steps between two untimed re-plans in the pipeline cases.
const REPLAN_EVERY: u64 = 64;

/// `graph_compute` per step of one allocation with `n_copies` pipeline copies.
fn bench_pipeline(c: &mut Criterion, name: &str, n_layer: usize, n_gpu: Option<usize>) {
    let mut g = c.benchmark_group(name);
    for n_copies in [1, 2, 4] {
        let mut s = Setup::with_copies(n_layer, n_gpu, n_copies);
        let a = allocations();
        for _ in 0..REPLAN_EVERY - 1 {
            s.step();
        }
        let per_step = (allocations() - a) as f64 / (REPLAN_EVERY - 1) as f64;
        println!("{name}, {n_copies} copies: heap allocations per step {per_step}");
        s.replan();
        let mut n = 0u64;
        g.bench_function(format!("compute/{n_copies}copies"), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    if n.is_multiple_of(REPLAN_EVERY) {
                        s.replan();
                    }
                    let start = Instant::now();
                    s.step();
                    t += start.elapsed();
                }
                t
            })
        });
    }
    g.finish();
}

/// `SCHED_PIPE=<steps>[:<layers>[:<gpu layers>]]` times `steps` pipeline steps (see
/// [`bench_pipeline`]) with 1, 2 and 4 copies outside criterion and prints mean, median and
/// 10th percentile ns per step.
fn pipe_mode() -> bool {
    let Ok(spec) = std::env::var("SCHED_PIPE") else {
        return false;
    };
    let mut it = spec.split(':');
    let steps: usize = it
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
        .max(1);
    let n_layer = it.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let n_gpu = it.next().and_then(|v| v.parse().ok()).or(Some(16));
    let mut ns = vec![0f64; steps];
    for n_copies in [1, 2, 4] {
        let mut s = Setup::with_copies(n_layer, n_gpu, n_copies);
        for (k, v) in ns.iter_mut().enumerate() {
            if (k as u64 + 1).is_multiple_of(REPLAN_EVERY) {
                s.replan();
            }
            let start = Instant::now();
            s.step();
            *v = start.elapsed().as_nanos() as f64;
        }
        let mean = ns.iter().sum::<f64>() / steps as f64;
        ns.sort_by(f64::total_cmp);
        println!(
            "pipeline step, {n_copies} copies: mean {mean:8.0} ns  median {:8.0} ns  p10 {:8.0} ns  ({steps} steps)",
            ns[steps / 2],
            ns[steps / 10]
        );
    }
    true
}

/// One call of `f`, kept out of line so that `valgrind --tool=callgrind --collect-atstart=no
/// --toggle-collect='*measured_call*'` counts exactly the measured work.
#[inline(never)]
fn measured_call(s: &mut Setup, f: Op) {
    f(s)
}

/// `SCHED_INSTR=<op>:<layers>[:<gpu layers>]` (op: alloc, split, reserve) runs the op 100 times
/// outside criterion, for instruction counting under callgrind; instructions per call are
/// the collected total divided by 100.
fn instr_mode() -> bool {
    let Ok(spec) = std::env::var("SCHED_INSTR") else {
        return false;
    };
    let mut it = spec.split(':');
    let op: Op = match it.next() {
        Some("alloc") => Setup::alloc,
        Some("split") => Setup::split,
        Some("reserve") => Setup::reserve,
        other => panic!("unknown op {other:?}"),
    };
    let n_layer = it.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let n_gpu = it.next().and_then(|v| v.parse().ok());
    let mut s = Setup::new(n_layer, n_gpu);
    for _ in 0..100 {
        s.fresh();
        measured_call(&mut s, op);
    }
    true
}

/// `SCHED_PERCALL=<calls>[:<layers>[:<gpu layers>]]` times each op `calls` times outside
/// criterion, every call alone, and prints mean, median and 10th percentile ns per call in the
/// format of `benches/ggml-sched-bench.sh`'s driver, for a comparison with ggml's scheduler
/// whose statistics survive a loaded machine (the median and p10 ignore preempted calls).
fn percall_mode() -> bool {
    let Ok(spec) = std::env::var("SCHED_PERCALL") else {
        return false;
    };
    let mut it = spec.split(':');
    let calls: usize = it
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
        .max(1);
    let n_layer = it.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let n_gpu = it.next().and_then(|v| v.parse().ok());
    let mut s = Setup::new(n_layer, n_gpu);
    let ops: [(&str, Op); 3] = [
        ("reset+alloc_graph", Setup::alloc),
        ("split", Setup::split),
        ("reserve", Setup::reserve),
    ];
    let mut ns = vec![0f64; calls];
    for (name, f) in ops {
        for v in ns.iter_mut() {
            s.fresh();
            let start = Instant::now();
            f(&mut s);
            *v = start.elapsed().as_nanos() as f64;
        }
        let mean = ns.iter().sum::<f64>() / calls as f64;
        ns.sort_by(f64::total_cmp);
        println!(
            "ours {name:<18}: mean {mean:8.0} ns  median {:8.0} ns  p10 {:8.0} ns  ({calls} calls)",
            ns[calls / 2],
            ns[calls / 10]
        );
    }
    true
}

fn benches(c: &mut Criterion) {
    if instr_mode() || percall_mode() || pipe_mode() {
        return;
    }
    bench_case(c, "llama32/cpu", 32, None);
    bench_case(c, "llama32/gpu16+cpu", 32, Some(16));
    bench_pipeline(c, "llama32/gpu16+cpu/pipeline", 32, Some(16));
    bench_case(c, "llama32/gpu33+cpu", 32, Some(33));
    bench_case(c, "llama320/cpu", 320, None);
    bench_case(c, "llama320/gpu160+cpu", 320, Some(160));
    bench_case(c, "llama320/gpu321+cpu", 320, Some(321));
}

criterion_group! {
    name = sched_benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = benches
}
criterion_main!(sched_benches);
