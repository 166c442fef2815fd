//! The compute cost of the decode-step (one- and four-column) quantized products with their
//! weights in L2, on one thread, as CPU time per call:
//! `cargo bench -p cpu-kernels --bench thin_cpu`.
//!
//! Why CPU time and why L2: from DRAM a mat-vec product is as fast as its memory streams
//! allow, and the machine's other tenants move that by a third from one minute to the next;
//! what a kernel itself costs shows when its 590 KB of weights stay in L2 and the clock is
//! the calling thread's own (`CLOCK_THREAD_CPUTIME_ID`), which time spent descheduled does
//! not advance. With one thread the pool's worker is not used, so the whole product runs on
//! the measured thread.
//!
//! Rows: q4_0, q4_1 and q8_0 weights, 4096 × 256, against 1 and 4 columns, in the CPU
//! buffer type (the plain layout: `q4tiles` for q4_0, the sixteen-row kernels for q4_1 and
//! q8_0) and in `CPU_REPACK`. Printed: the fastest of `THIN_ROUNDS` (default 7) rounds'
//! mean µs per call over `THIN_REPS` (default 300) calls, then that as weight bytes per
//! CPU-second. `THIN_CASES=q8_0_x1,q4_1` keeps the rows whose names contain one of the words;
//! `THIN_K` and `THIN_M` change the shape (`THIN_M=64`: 280 KB of q8_0, well inside L2), and
//! `THIN_N=8,16` the column counts (default 1 and 4).
#![allow(clippy::print_stdout)]

use std::hint::black_box;

use cpu_kernels::CpuCompute;
use graph::ElementType;
use product::{cpu_weights, product};

#[path = "support/product.rs"]
mod product;

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let reps = env("THIN_REPS", 300).max(1);
    let rounds = env("THIN_ROUNDS", 7).max(1);
    let filter = std::env::var("THIN_CASES").unwrap_or_default();
    let keep = |name: &str| filter.is_empty() || filter.split(',').any(|w| name.contains(w));
    let ns: Vec<i64> = std::env::var("THIN_N")
        .ok()
        .map(|v| v.split(',').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4]);
    let cpu = CpuCompute::new(1);
    let (k, m) = (env("THIN_K", 4096) as i64, env("THIN_M", 256) as i64);
    println!("one thread, weights {k} x {m} in L2; fastest round's mean CPU time per call");
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        for repack in [false, true] {
            for &n in &ns {
                let layout = if repack { "repack" } else { "plain" };
                let name = format!("{ty:?}_x{n}_{layout}").to_lowercase();
                if !keep(&name) {
                    continue;
                }
                let p = product(ty, k, m, n, cpu_weights(repack));
                let run = || black_box(cpu.compute(&p.ctx, p.g.as_view(), None).unwrap());
                (0..20).for_each(|_| {
                    run();
                });
                let best = (0..rounds)
                    .map(|_| {
                        let t = thread_cpu_ns();
                        (0..reps).for_each(|_| {
                            run();
                        });
                        (thread_cpu_ns() - t) as f64 / reps as f64
                    })
                    .fold(f64::INFINITY, f64::min);
                println!(
                    "{:<28} {:>9.2} us {:>7.1} GB/s",
                    name,
                    best / 1e3,
                    p.weight_bytes as f64 / best,
                );
            }
        }
    }
}
