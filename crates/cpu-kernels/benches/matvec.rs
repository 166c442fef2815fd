//! Mat-vec products whose weights exceed the L3 cache, against the read ceiling, in
//! interleaved rounds: `cargo bench -p cpu-kernels --bench matvec`.
//!
//! Each round makes `MATVEC_REPS` (default 5) back-to-back calls of the two-thread read of
//! 64 MiB (`read`, [`support::read_baseline`], the same ceiling as `kernels`'
//! `mul_mat/read_64MiB_baseline`) and then of each product, one weight matrix each, and keeps
//! each one's fastest call; `MATVEC_ROUNDS` (default 20) rounds. On a shared machine the
//! fastest call is the one that kept both cores, and taking it per round, read and products
//! side by side, compares them under the same load. Printed per row: the fastest call over
//! all rounds and the median of the rounds' fastest (ms), the weights' bytes per second of
//! the fastest call, and its fraction of the read's bandwidth: best over best, and the
//! median over rounds of the same round's ratio.
//!
//! Rows: `f32_4096x4096_x1` (64 MiB, as in `kernels`) in the CPU buffer type (64-byte
//! aligned, as the CPU backend allocates) and `f32_4096x4096_x1_host` in the crate's test
//! host buffer (16 bytes past a cache line, where the f32 kernel is mostly a little slower); `f16_8192x4096_x1` (64 MiB),
//! `q8_0_8192x8192_x1` (68 MiB), `q4_1_8192x16384_x1` (80 MiB), `q4_0_8192x16384_x1`
//! (72 MiB), and the last three again as `_repack` with the weights in the CPU's `CPU_REPACK`
//! buffer type (the layout a model's q4_0/q4_1/q8_0 weights load into). Plain q4_0 also as
//! `q4_0_16384x8192_x1`, `q4_0_4096x32768_x1` and `q4_0_2048x65536_x1` (72 MiB each), and
//! plain q4_1 as `q4_1_4096x32768_x1` (80 MiB): rows of twice, half and a quarter the
//! length, where a call's rows take another share of the L1 cache and its sets
//! (`q4tiles::interleaves`, `q4tiles::interleaved_rows_spread`). Names are elements per row
//! × rows, as ggml writes `ne0 × ne1`. (Until 2026-12-03 two rows were mislabeled:
//! `q4_0_16384x8192_x1` computed the 8192 × 16384 weights again, and `q4_0_32768x4096_x1`
//! was today's `q4_0_4096x32768_x1`.)
//!
//! And a decode step's products as the model runs them, one node each in one graph
//! (`support::product::step`): `step_q4_1_repack_60_layers` (SmolLM2-135M's seven products
//! per layer, 576 × 576 to 1536 × 576, in `CPU_REPACK` q4_1; sixty layers, 133 MB, so that
//! they stream from memory), `step_q8_0_repack_30_layers` (the same in q8_0, thirty layers, 113 MB), and
//! `step_q4_1_repack_60_layers_cached` (the same 420 nodes over one layer's weights, 2.2 MB,
//! which stay in cache: what the nodes cost apart from the memory). Their weights are small
//! (0.07–0.94 MB a node), so what each node costs besides streaming its weights (the pool's
//! hand-over, the column's packing, a claim and a store per group of 16 rows) shows here
//! and not in the single products. `MATVEC_CASES=f32,q8` keeps the rows whose names contain one of the words.
//! `BENCH_THREADS=N`: threads of the products; with 1 the read is one thread's too (the
//! per-core streaming efficiency, which a loaded machine disturbs less). Results go to
//! stdout as a table.
#![allow(clippy::print_stdout)]

#[path = "support/product.rs"]
mod product;
#[path = "support/read_baseline.rs"]
mod read_baseline;
#[path = "support/smollm2.rs"]
mod smollm2;

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpu_kernels::CpuCompute;
use graph::ElementType;
use product::{Product, cpu_weights, product};
use read_baseline::ReadBaseline;

struct Case {
    name: String,
    p: Product,
}

/// Where a case's weights live.
#[derive(Copy, Clone)]
enum Weights {
    /// The CPU buffer type (64-byte aligned).
    Cpu,
    /// The crate's test host buffer (a `Vec<u64>`: 16 mod 64 from glibc).
    Host,
    /// The CPU's `CPU_REPACK` buffer type (q4_0, q4_1 and q8_0: sixteen rows interleaved).
    Repack,
}

/// `y = W·x` with `W` of `ty`, `k` × `m`, placed as `weights` says.
fn case(name: &str, ty: ElementType, k: i64, m: i64, weights: Weights) -> Case {
    let p = product(ty, k, m, 1, |bytes| match weights {
        Weights::Cpu => cpu_weights(false)(bytes),
        Weights::Host => cpu_kernels::doc_support::host_buffer(bytes),
        Weights::Repack => cpu_weights(true)(bytes),
    });
    Case {
        name: name.to_owned(),
        p,
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fastest of `reps` back-to-back calls of `f`.
fn fastest(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is taken from MATVEC_CASES instead.
    let rounds = env("MATVEC_ROUNDS", 20).max(1);
    let reps = env("MATVEC_REPS", 5).max(1);
    let filter = std::env::var("MATVEC_CASES").unwrap_or_default();
    let keep = |name: &str| filter.is_empty() || filter.split(',').any(|w| name.contains(w));
    let threads = env("BENCH_THREADS", 2).max(1);
    let cpu = CpuCompute::new(threads);
    let read = ReadBaseline::new(64 << 20);
    let all = [
        (
            "f32_4096x4096_x1",
            ElementType::F32,
            4096,
            4096,
            Weights::Cpu,
        ),
        (
            "f32_4096x4096_x1_host",
            ElementType::F32,
            4096,
            4096,
            Weights::Host,
        ),
        (
            "f16_8192x4096_x1",
            ElementType::F16,
            8192,
            4096,
            Weights::Cpu,
        ),
        (
            "q8_0_8192x8192_x1",
            ElementType::Q8_0,
            8192,
            8192,
            Weights::Cpu,
        ),
        (
            "q8_0_8192x8192_x1_repack",
            ElementType::Q8_0,
            8192,
            8192,
            Weights::Repack,
        ),
        (
            "q4_1_8192x16384_x1",
            ElementType::Q4_1,
            8192,
            16384,
            Weights::Cpu,
        ),
        (
            "q4_1_4096x32768_x1",
            ElementType::Q4_1,
            4096,
            32768,
            Weights::Cpu,
        ),
        (
            "q4_1_8192x16384_x1_repack",
            ElementType::Q4_1,
            8192,
            16384,
            Weights::Repack,
        ),
        (
            "q4_0_8192x16384_x1",
            ElementType::Q4_0,
            8192,
            16384,
            Weights::Cpu,
        ),
        (
            "q4_0_4096x32768_x1",
            ElementType::Q4_0,
            4096,
            32768,
            Weights::Cpu,
        ),
        (
            "q4_0_16384x8192_x1",
            ElementType::Q4_0,
            16384,
            8192,
            Weights::Cpu,
        ),
        (
            "q4_0_2048x65536_x1",
            ElementType::Q4_0,
            2048,
            65536,
            Weights::Cpu,
        ),
        (
            "q4_0_8192x16384_x1_repack",
            ElementType::Q4_0,
            8192,
            16384,
            Weights::Repack,
        ),
    ];
    let mut cases: Vec<Case> = all
        .iter()
        .filter(|c| keep(c.0))
        .map(|&(name, ty, k, m, weights)| case(name, ty, k, m, weights))
        .collect();
    let steps = [
        ("step_q4_1_repack_60_layers", ElementType::Q4_1, 60, true),
        ("step_q8_0_repack_30_layers", ElementType::Q8_0, 30, true),
        (
            "step_q4_1_repack_60_layers_cached",
            ElementType::Q4_1,
            60,
            false,
        ),
    ];
    for (name, ty, layers, distinct) in steps {
        if keep(name) {
            let p = product::step(
                ty,
                &smollm2::LAYER_PRODUCTS,
                &smollm2::LAYER_INPUTS,
                layers,
                true,
                distinct,
            );
            cases.push(Case {
                name: name.to_owned(),
                p,
            });
        }
    }
    // Warm up: page faults, scratch growth, the pool's threads.
    for _ in 0..2 {
        read.run();
        for c in &cases {
            black_box(cpu.compute(&c.p.ctx, c.p.g.as_view(), None).unwrap());
        }
    }
    let mut read_t = Vec::new();
    let mut case_t: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        read_t.push(
            fastest(reps, || {
                if threads == 1 {
                    read.run_one_thread();
                } else {
                    read.run();
                }
            })
            .as_secs_f64(),
        );
        for (c, t) in cases.iter().zip(&mut case_t) {
            let d = fastest(reps, || {
                black_box(cpu.compute(&c.p.ctx, c.p.g.as_view(), None).unwrap());
            });
            t.push(d.as_secs_f64());
        }
    }
    let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let read_best = best(&read_t);
    let read_bw = gbs(read.bytes(), read_best);
    println!(
        "{rounds} rounds x {reps} calls; fastest ms / median of rounds' fastest ms / GB/s / \
         fraction of read (best, median of rounds)"
    );
    println!(
        "{:<34} {:>7.3} {:>7.3} {:>6.1}",
        "read_64MiB",
        read_best * 1e3,
        median(read_t.clone()) * 1e3,
        read_bw
    );
    for (c, t) in cases.iter().zip(&case_t) {
        let b = best(t);
        let per_round: Vec<f64> = t
            .iter()
            .zip(&read_t)
            .map(|(&tc, &tr)| gbs(c.p.weight_bytes, tc) / gbs(read.bytes(), tr))
            .collect();
        println!(
            "{:<34} {:>7.3} {:>7.3} {:>6.1} {:>5.3} {:>5.3}",
            c.name,
            b * 1e3,
            median(t.clone()) * 1e3,
            gbs(c.p.weight_bytes, b),
            gbs(c.p.weight_bytes, b) / read_bw,
            median(per_round)
        );
    }
}
