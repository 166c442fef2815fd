//! Kernel throughput with 2 threads: MUL_MAT (square, and llama decode shapes with f32 and
//! q4_0 weights) in GFLOP/s (criterion's "elem/s" = FLOP/s), elementwise ADD in GB/s (also
//! in place), GELU_ERF in elements/s.
//!
//! `cargo bench -p cpu-kernels --bench kernels`; `BENCH_LARGE=1` adds MUL_MAT 4096³ f32.

use std::hint::black_box;

use cpu_kernels::CpuCompute;
use cpu_kernels::doc_support::host_buffer;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use graph::{Context, ElementType, Graph, TensorId};

struct Setup {
    ctx: Context,
    g: Graph,
    _buf: backend_core::Buffer,
}

fn alloc(ctx: &mut Context, ids: &[TensorId]) -> backend_core::Buffer {
    let mut total = 0;
    let mut offs = Vec::new();
    for &id in ids {
        let off = usize::next_multiple_of(total, 64);
        offs.push(off);
        total = off + ctx[id].nbytes();
    }
    let buf = host_buffer(total);
    for (&id, off) in ids.iter().zip(offs) {
        backend_core::tensor_alloc(ctx, &buf, id, off).unwrap();
    }
    // Deterministic small values everywhere (q4_0 blocks: any bytes are valid, but keep the
    // f16 scales finite: 0x3c3c is 1.06).
    buf.clear(0x3c).unwrap();
    buf
}

fn mul_mat(ty: ElementType, k: i64, m: i64, n: i64) -> Setup {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, k, n).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let buf = alloc(&mut ctx, &[w, x, y]);
    Setup { ctx, g, _buf: buf }
}

fn bench_mul_mat(c: &mut Criterion) {
    let cpu = CpuCompute::new(2);
    let mut group = c.benchmark_group("mul_mat");
    group.sample_size(10);
    let mut cases = vec![
        ("f32_1024x1024x1024", ElementType::F32, 1024, 1024, 1024),
        ("f32_4096x4096_x1", ElementType::F32, 4096, 4096, 1),
        ("f32_4096x4096_x32", ElementType::F32, 4096, 4096, 32),
        ("q4_0_4096x4096_x1", ElementType::Q4_0, 4096, 4096, 1),
        ("q4_0_4096x4096_x32", ElementType::Q4_0, 4096, 4096, 32),
    ];
    if std::env::var_os("BENCH_LARGE").is_some() {
        cases.push(("f32_4096x4096x4096", ElementType::F32, 4096, 4096, 4096));
    }
    for (name, ty, k, m, n) in cases {
        let s = mul_mat(ty, k, m, n);
        group.throughput(Throughput::Elements((2 * k * m * n) as u64));
        group.bench_function(name, |b| {
            b.iter(|| black_box(cpu.compute(&s.ctx, s.g.as_view(), None).unwrap()))
        });
    }
    group.finish();
}

fn bench_add(c: &mut Criterion) {
    let cpu = CpuCompute::new(2);
    let mut group = c.benchmark_group("add");
    for (name, n0, n1) in [("f32_4096x1024", 4096i64, 1024i64), ("f32_4096x8", 4096, 8)] {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(ElementType::F32, n0, n1).unwrap();
        let b = ctx.new_tensor_2d(ElementType::F32, n0, n1).unwrap();
        let y = ctx.add(a, b).unwrap();
        let mut g = Graph::new(8);
        g.build_forward_expand(&mut ctx, y).unwrap();
        let _buf = alloc(&mut ctx, &[a, b, y]);
        group.throughput(Throughput::Bytes((3 * n0 * n1 * 4) as u64));
        group.bench_function(name, |bch| {
            bch.iter(|| black_box(cpu.compute(&ctx, g.as_view(), None).unwrap()))
        });
    }
    {
        let (n0, n1) = (4096i64, 1024i64);
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(ElementType::F32, n0, n1).unwrap();
        let b = ctx.new_tensor_2d(ElementType::F32, n0, n1).unwrap();
        let y = ctx.add_inplace(a, b).unwrap();
        let mut g = Graph::new(8);
        g.build_forward_expand(&mut ctx, y).unwrap();
        let _buf = alloc(&mut ctx, &[a, b]);
        backend_core::view_init(&mut ctx, y).unwrap();
        group.throughput(Throughput::Bytes((3 * n0 * n1 * 4) as u64));
        group.bench_function("f32_4096x1024_inplace", |bch| {
            bch.iter(|| black_box(cpu.compute(&ctx, g.as_view(), None).unwrap()))
        });
    }
    // Baseline on the same machine and load: one thread copying 2 × 16 MiB.
    let src = vec![1u8; 4096 * 1024 * 4 * 2];
    let mut dst = vec![0u8; src.len()];
    group.throughput(Throughput::Bytes((2 * src.len()) as u64));
    group.bench_function("memcpy_32MiB_baseline", |bch| {
        bch.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    group.finish();
}

fn bench_unary(c: &mut Criterion) {
    let cpu = CpuCompute::new(2);
    let mut group = c.benchmark_group("unary");
    let (n0, n1) = (1536i64, 256i64);
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ElementType::F32, n0, n1).unwrap();
    let y = ctx.unary(a, graph::UnaryOp::GeluErf).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let _buf = alloc(&mut ctx, &[a, y]);
    // Inputs spread over [-4, 4): every range of erf is exercised.
    let vals: Vec<u8> = (0..n0 * n1)
        .flat_map(|i| ((i * 7919 % 8192) as f32 / 1024.0 - 4.0).to_le_bytes())
        .collect();
    backend_core::tensor_set(&ctx, a, 0, &vals).unwrap();
    group.throughput(Throughput::Elements((n0 * n1) as u64));
    group.bench_function("gelu_erf_1536x256", |bch| {
        bch.iter(|| black_box(cpu.compute(&ctx, g.as_view(), None).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, bench_mul_mat, bench_add, bench_unary);
criterion_main!(benches);
