//! A whole llama-shaped decode step on the CPU backend, through the scheduler and directly
//! (graph allocator + backend), and the scheduler's planning alone. The ratio of the first two
//! is the scheduler's overhead on a real step.
//!
//! `cargo bench -p benches --bench decode_step`

use benches::{DecodeBench, bench_config};
use criterion::{Criterion, criterion_group, criterion_main};

fn decode(c: &mut Criterion) {
    let mut bench = DecodeBench::new(bench_config(), 2).expect("model");
    assert_eq!(
        bench.step_scheduled().expect("scheduled step"),
        bench.step_direct().expect("direct step"),
        "the scheduler must not change the result"
    );
    let mut g = c.benchmark_group("decode_step_8x1024_q4_0");
    g.sample_size(30);
    g.bench_function("scheduled", |b| {
        b.iter(|| bench.step_scheduled().expect("step"))
    });
    g.bench_function("direct", |b| b.iter(|| bench.step_direct().expect("step")));
    g.bench_function("scheduler_planning_only", |b| {
        b.iter(|| bench.plan_scheduled().expect("plan"))
    });
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
