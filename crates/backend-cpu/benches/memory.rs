//! set/get/copy/memset of CPU tensors through the public checked helpers, against `std`'s
//! `copy_from_slice`/`fill` on plain `Vec`s of the same size, in the same run.
//!
//! Sizes: 4 KiB, 1 MiB and 64 MiB; 256 MiB instead of 64 MiB when `BENCH_LARGE=1`.
//! Run: `cargo bench -p backend-cpu --bench memory -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use backend_core::{tensor_alloc, tensor_copy, tensor_get, tensor_memset, tensor_set};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use graph::{Context, ElementType, TensorId};

fn sizes() -> Vec<(usize, &'static str)> {
    let large = if std::env::var("BENCH_LARGE").is_ok_and(|v| v == "1") {
        (256 << 20, "256MiB")
    } else {
        (64 << 20, "64MiB")
    };
    vec![(4 << 10, "4KiB"), (1 << 20, "1MiB"), large]
}

/// Two CPU tensors of `n` bytes in two separate buffers.
fn tensors(n: usize) -> (Context, TensorId, TensorId, Vec<backend_core::Buffer>) {
    let mut ctx = Context::new();
    let buft = backend_cpu::cpu_buffer_type();
    let a = ctx.new_tensor_1d(ElementType::I8, n as i64).unwrap();
    let b = ctx.new_tensor_1d(ElementType::I8, n as i64).unwrap();
    let ba = buft.alloc_buffer(n).unwrap();
    let bb = buft.alloc_buffer(n).unwrap();
    tensor_alloc(&mut ctx, &ba, a, 0).unwrap();
    tensor_alloc(&mut ctx, &bb, b, 0).unwrap();
    // touch every page so the first sample does not pay for page faults
    ba.clear(1).unwrap();
    bb.clear(2).unwrap();
    (ctx, a, b, vec![ba, bb])
}

fn bench(c: &mut Criterion) {
    for (n, label) in sizes() {
        let (ctx, a, b, _bufs) = tensors(n);
        let src = vec![3u8; n];
        let mut dst = vec![4u8; n];
        let slow = n >= 64 << 20;

        let mut g = c.benchmark_group("set");
        g.throughput(Throughput::Bytes(n as u64));
        if slow {
            g.sample_size(10);
        }
        g.bench_function(BenchmarkId::new("backend", label), |bch| {
            bch.iter(|| tensor_set(&ctx, a, 0, black_box(&src)).unwrap())
        });
        g.bench_function(BenchmarkId::new("std", label), |bch| {
            bch.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
        g.finish();

        let mut g = c.benchmark_group("get");
        g.throughput(Throughput::Bytes(n as u64));
        if slow {
            g.sample_size(10);
        }
        g.bench_function(BenchmarkId::new("backend", label), |bch| {
            bch.iter(|| tensor_get(&ctx, a, 0, black_box(&mut dst)).unwrap())
        });
        g.bench_function(BenchmarkId::new("std", label), |bch| {
            bch.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
        g.finish();

        let mut g = c.benchmark_group("copy");
        g.throughput(Throughput::Bytes(n as u64));
        if slow {
            g.sample_size(10);
        }
        g.bench_function(BenchmarkId::new("backend", label), |bch| {
            bch.iter(|| tensor_copy(&ctx, black_box(a), black_box(b)).unwrap())
        });
        g.bench_function(BenchmarkId::new("std", label), |bch| {
            bch.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
        g.finish();

        let mut g = c.benchmark_group("memset");
        g.throughput(Throughput::Bytes(n as u64));
        if slow {
            g.sample_size(10);
        }
        g.bench_function(BenchmarkId::new("backend", label), |bch| {
            bch.iter(|| tensor_memset(&ctx, a, black_box(7), 0, n).unwrap())
        });
        g.bench_function(BenchmarkId::new("std", label), |bch| {
            bch.iter(|| black_box(&mut dst).fill(black_box(7)))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
