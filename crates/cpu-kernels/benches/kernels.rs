//! Kernel throughput with 2 threads: MUL_MAT (square, llama decode shapes with f32 and q4_0
//! weights, and a 512-token prompt batch with q4_0 weights) in GFLOP/s (criterion's
//! "elem/s" = FLOP/s), elementwise ADD in GB/s (also in place), GELU_ERF in elements/s.
//!
//! `bench_llama` adds SmolLM2-135M's shapes (q4_1 decode step, q8_0 output head, q4_1
//! prompts, and the f16 attention products of a decode step).
//!
//! `cargo bench -p cpu-kernels --bench kernels`; `BENCH_LARGE=1` adds MUL_MAT 4096³ f32,
//! `BENCH_THREADS=N` uses N threads instead of 2.
//!
//! `mul_mat/read_64MiB_baseline` is the ceiling for the memory-bound decode shapes: two
//! threads summing the two halves of a 64 MiB buffer (the size of the f32 4096×4096
//! weights) with AVX2 loads, eight streams per thread (`support/read_baseline.rs`), in
//! GB/s. `f32_4096x4096_x1` reads the same 64 MiB per call, so its time divided into the
//! baseline's is the fraction of the achievable read bandwidth it reaches
//! (`benches/matvec.rs` measures it and the other mat-vec types larger than L3 against the
//! same read in interleaved rounds). `benches/ggml-matvec-bench.sh` times ggml's CPU
//! backend on the same shapes, to run back to back with this bench.
//!
//! The `q4_1_4096x4096_x{1,32,512}` and `q8_0_4096x4096_x{1,32,512}` rows are the types ggml
//! 0.25.3 has no x86 repacked layout for: the driver's rows of the same names run its default
//! path.
//!
//! The `q4_0_4096x4096_x{1,32,512}_repack` rows run the q4_0 shapes with the weights in the
//! CPU device's `CPU_REPACK` buffer type (rows interleaved for the kernels,
//! `cpu_kernels::repack`), the counterpart of the ggml driver's `*_repack` rows; the q4_1 and
//! q8_0 `_repack` rows do the same for the layouts ggml lacks on x86 (compare them with the
//! driver's plain q4_1 and q8_0 rows: what llama.cpp runs such weights with here).
//!
//! `BENCH_MIN=1` makes the `mul_mat` group report, for each sample, its fastest call (times
//! the iteration count) instead of the sample's total: on a shared machine where the two
//! threads are often descheduled (load average 5 on 2 cores while these figures were taken)
//! the mean wall time measures the other jobs more than the kernel, while the fastest call
//! is the time of a call that kept both cores. The ggml driver reports the same statistic.

#[path = "support/place.rs"]
mod place;
#[path = "support/read_baseline.rs"]
mod read_baseline;
#[path = "support/smollm2.rs"]
mod smollm2;

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpu_kernels::CpuCompute;
use criterion::{Bencher, Criterion, Throughput, criterion_group, criterion_main};
use graph::{Context, ElementType, Graph, TensorId};
use read_baseline::ReadBaseline;

struct Setup {
    ctx: Context,
    g: Graph,
    _buf: backend_core::Buffer,
}

/// `ids` one after another in the CPU backend's own buffer type (64-byte aligned), as a
/// model's weights loaded into the backend have it. In the crate's test host buffer (16 bytes
/// past a cache line: a `Vec<u64>` from the allocator) the f32 mat-vec read a little slower:
/// on one thread 0.84–1.09 of the read ceiling, mostly about 0.9, against 0.98–1.05 aligned
/// (`benches/matvec.rs`, `f32_4096x4096_x1_host`).
fn alloc(ctx: &mut Context, ids: &[TensorId]) -> backend_core::Buffer {
    place::place(ctx, ids, |bytes| {
        backend_cpu::cpu_buffer_type()
            .alloc_buffer(bytes)
            .expect("CPU buffer")
    })
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

/// [`mul_mat`] for weights of `ty` (q4_0, q4_1 or q8_0), `k` × `m`, in a CPU_REPACK buffer (with
/// the same 0x3c bytes, written through `set_tensor`, which repacks them), and that buffer.
fn mul_mat_repack(ty: ElementType, k: i64, m: i64, n: i64) -> (Setup, backend_core::Buffer) {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, k, n).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let wbuf = backend_cpu::cpu_repack_buffer_type()
        .alloc_buffer(ctx[w].nbytes())
        .unwrap();
    backend_core::tensor_alloc(&mut ctx, &wbuf, w, 0).unwrap();
    backend_core::tensor_set(&ctx, w, 0, &vec![0x3c; ctx[w].nbytes()]).unwrap();
    let buf = alloc(&mut ctx, &[x, y]);
    (Setup { ctx, g, _buf: buf }, wbuf)
}

/// Threads per compute: 2, or `BENCH_THREADS` (to compare one core's kernels while another
/// job holds the other core; the ggml driver takes the same count as its second argument).
fn threads() -> usize {
    std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// `b.iter(f)`, or with `BENCH_MIN` set the fastest call of each sample times the
/// sample's iteration count (see the module docs).
fn timed<R>(b: &mut Bencher<'_>, mut f: impl FnMut() -> R) {
    if std::env::var_os("BENCH_MIN").is_none() {
        return b.iter(f);
    }
    b.iter_custom(|iters| {
        let mut best = Duration::MAX;
        for _ in 0..iters {
            let t = Instant::now();
            black_box(f());
            best = best.min(t.elapsed());
        }
        best * u32::try_from(iters).unwrap_or(u32::MAX)
    });
}

fn bench_mul_mat(c: &mut Criterion) {
    let cpu = CpuCompute::new(threads());
    let mut group = c.benchmark_group("mul_mat");
    group.sample_size(10);
    let mut cases = vec![
        ("f32_1024x1024x1024", ElementType::F32, 1024, 1024, 1024),
        ("f32_4096x4096_x1", ElementType::F32, 4096, 4096, 1),
        ("f32_4096x4096_x32", ElementType::F32, 4096, 4096, 32),
        ("q4_0_4096x4096_x1", ElementType::Q4_0, 4096, 4096, 1),
        ("q4_0_4096x4096_x32", ElementType::Q4_0, 4096, 4096, 32),
        ("q4_0_4096x4096_x512", ElementType::Q4_0, 4096, 4096, 512),
        ("q4_1_4096x4096_x1", ElementType::Q4_1, 4096, 4096, 1),
        ("q4_1_4096x4096_x32", ElementType::Q4_1, 4096, 4096, 32),
        ("q4_1_4096x4096_x512", ElementType::Q4_1, 4096, 4096, 512),
        ("q8_0_4096x4096_x1", ElementType::Q8_0, 4096, 4096, 1),
        ("q8_0_4096x4096_x32", ElementType::Q8_0, 4096, 4096, 32),
        ("q8_0_4096x4096_x512", ElementType::Q8_0, 4096, 4096, 512),
    ];
    if std::env::var_os("BENCH_LARGE").is_some() {
        cases.push(("f32_4096x4096x4096", ElementType::F32, 4096, 4096, 4096));
    }
    bench_read_baseline(&mut group);
    for (name, ty, k, m, n) in cases {
        let s = mul_mat(ty, k, m, n);
        group.throughput(Throughput::Elements((2 * k * m * n) as u64));
        group.bench_function(name, |b| {
            timed(b, || {
                black_box(cpu.compute(&s.ctx, s.g.as_view(), None).unwrap())
            })
        });
    }
    // The q4_0, q4_1 and q8_0 shapes again with the weights in the CPU device's CPU_REPACK buffer type
    // (interleaved rows, `cpu_kernels::repack`), as ggml-matvec-bench.sh's `*_repack` rows.
    for (ty, n) in [1, 32, 512]
        .map(|n| (ElementType::Q4_0, n))
        .into_iter()
        .chain([1, 32, 512].map(|n| (ElementType::Q4_1, n)))
        .chain([1, 32, 512].map(|n| (ElementType::Q8_0, n)))
    {
        let s = mul_mat_repack(ty, 4096, 4096, n);
        group.throughput(Throughput::Elements((2 * 4096 * 4096 * n) as u64));
        group.bench_function(format!("{}_4096x4096_x{n}_repack", ty.name()), |b| {
            timed(b, || {
                black_box(cpu.compute(&s.0.ctx, s.0.g.as_view(), None).unwrap())
            })
        });
    }
    bench_llama(&cpu, &mut group);
    group.finish();
}

/// SmolLM2-135M's products (`llm` crate, `llama-decode` spec §2): `q4_1_llama_30_layers_x1`
/// is the thirty blocks' seven q4_1 products of one decode step (576 → 576, 192, 192, 576,
/// 1536, 1536; 1536 → 576) on distinct weights, 66 MB streamed per call as in a real step;
/// `q8_0_576x49152_x1` the tied output head (28 MB); then one block's largest product with
/// a 512-token prompt and every q4_1 shape (and the head's, as q4_1) with a 64-token prompt;
/// `f16_attention_30_layers_kv512_x1` is the step's attention products over 512 cells
/// ([`f16_attention`]; `f16_attention_mha_…` the same without grouped-query heads, nine KV
/// heads), `f16_attention_pp64_kv256` one block's for a 64-token prompt. Throughput: bytes of weights (GB/s) for the decode shapes,
/// FLOP/s for the prompts.
fn bench_llama(
    cpu: &CpuCompute,
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let shapes = smollm2::LAYER_PRODUCTS;
    for repack in [false, true] {
        let (s, weight_bytes) = llama_decode(&shapes, repack);
        group.throughput(Throughput::Bytes(weight_bytes as u64));
        let name = if repack {
            "q4_1_llama_30_layers_x1_repack"
        } else {
            "q4_1_llama_30_layers_x1"
        };
        group.bench_function(name, |b| {
            timed(b, || {
                black_box(cpu.compute(&s.0.ctx, s.0.g.as_view(), None).unwrap())
            })
        });
    }
    bench_llama_rest(cpu, group);
}

/// The thirty blocks' q4_1 products of a decode step (`shapes`: `(k, m)` per block), the
/// weights in a plain buffer or in a CPU_REPACK one; the setup (and the weights' buffer)
/// and the weights' bytes.
fn llama_decode(shapes: &[(i64, i64)], repack: bool) -> ((Setup, backend_core::Buffer), usize) {
    let mut ctx = Context::new();
    let mut ids = Vec::new();
    let mut ws = Vec::new();
    let mut outs = Vec::new();
    let mut weight_bytes = 0;
    for _ in 0..30 {
        for &(k, m) in shapes {
            let w = ctx.new_tensor_2d(ElementType::Q4_1, k, m).unwrap();
            let x = ctx.new_tensor_2d(ElementType::F32, k, 1).unwrap();
            let y = ctx.mul_mat(w, x).unwrap();
            weight_bytes += ctx[w].nbytes();
            if repack {
                ws.push(w);
            } else {
                ids.push(w);
            }
            ids.extend([x, y]);
            outs.push(y);
        }
    }
    let mut g = Graph::new(512);
    for &y in &outs {
        g.build_forward_expand(&mut ctx, y).unwrap();
    }
    let wbuf = if repack {
        place::place(&mut ctx, &ws, |bytes| {
            backend_cpu::cpu_repack_buffer_type()
                .alloc_buffer(bytes)
                .unwrap()
        })
    } else {
        backend_cpu::cpu_buffer_type().alloc_buffer(0).unwrap()
    };
    let buf = alloc(&mut ctx, &ids);
    ((Setup { ctx, g, _buf: buf }, wbuf), weight_bytes)
}

/// The rest of [`bench_llama`]: the output head, attention, and the prompt shapes.
fn bench_llama_rest(
    cpu: &CpuCompute,
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let head = mul_mat(ElementType::Q8_0, 576, 49152, 1);
    group.throughput(Throughput::Bytes(
        head.ctx[head.g.nodes()[0]]
            .src(0)
            .map_or(0, |w| head.ctx[w].nbytes()) as u64,
    ));
    group.bench_function("q8_0_576x49152_x1", |b| {
        timed(b, || {
            black_box(cpu.compute(&head.ctx, head.g.as_view(), None).unwrap())
        })
    });
    drop(head);
    for (name, kv_heads) in [
        ("f16_attention_30_layers_kv512_x1", 3),
        ("f16_attention_mha_30_layers_kv512_x1", 9),
    ] {
        let attn = f16_attention(512, kv_heads);
        group.throughput(Throughput::Elements((2 * 2 * 30 * 9 * 64 * 512) as u64));
        group.bench_function(name, |b| {
            timed(b, || {
                black_box(cpu.compute(&attn.ctx, attn.g.as_view(), None).unwrap())
            })
        });
    }
    let prompts = [
        (576, 576, 64),
        (576, 192, 64),
        (576, 1536, 64),
        (1536, 576, 64),
        (576, 49152, 64),
        (576, 1536, 512),
    ];
    for (k, m, n) in prompts {
        let s = mul_mat(ElementType::Q4_1, k, m, n);
        group.throughput(Throughput::Elements((2 * k * m * n) as u64));
        group.bench_function(format!("q4_1_{k}x{m}_x{n}"), |b| {
            timed(b, || {
                black_box(cpu.compute(&s.ctx, s.g.as_view(), None).unwrap())
            })
        });
        drop(s);
        let s = mul_mat_repack(ElementType::Q4_1, k, m, n);
        group.bench_function(format!("q4_1_{k}x{m}_x{n}_repack"), |b| {
            timed(b, || {
                black_box(cpu.compute(&s.0.ctx, s.0.g.as_view(), None).unwrap())
            })
        });
    }
    let attn = f16_attention_prompt(64, 256);
    group.throughput(Throughput::Elements((2 * 2 * 9 * 64 * 64 * 256) as u64));
    group.bench_function("f16_attention_pp64_kv256", |b| {
        timed(b, || {
            black_box(cpu.compute(&attn.ctx, attn.g.as_view(), None).unwrap())
        })
    });
}

/// One block's attention products for a prompt of `n` tokens over `n_kv` cells: `K·Q` (f16
/// `[64, n_kv, 3]` × f32 `[64, n, 9]`) and `V·P` (f16 `[n_kv, 64, 3]` × f32 `[n_kv, n, 9]`).
fn f16_attention_prompt(n: i64, n_kv: i64) -> Setup {
    let mut ctx = Context::new();
    let k = ctx.new_tensor_3d(ElementType::F16, 64, n_kv, 3).unwrap();
    let q = ctx.new_tensor_3d(ElementType::F32, 64, n, 9).unwrap();
    let kq = ctx.mul_mat(k, q).unwrap();
    let v = ctx.new_tensor_3d(ElementType::F16, n_kv, 64, 3).unwrap();
    let p = ctx.new_tensor_3d(ElementType::F32, n_kv, n, 9).unwrap();
    let kqv = ctx.mul_mat(v, p).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, kq).unwrap();
    g.build_forward_expand(&mut ctx, kqv).unwrap();
    let buf = alloc(&mut ctx, &[k, q, kq, v, p, kqv]);
    Setup { ctx, g, _buf: buf }
}

/// The attention products of a SmolLM2-135M decode step over `n_kv` cached cells, thirty
/// blocks of `K·Q` (f16 `[64, n_kv, kv_heads]` × f32 `[64, 1, 9]`: nine query heads over
/// `kv_heads` KV heads, three in the model; nine is attention without grouped-query heads)
/// and `V·P` (f16 `[n_kv, 64, kv_heads]` × f32 `[n_kv, 1, 9]`); each block has its own cache.
fn f16_attention(n_kv: i64, kv_heads: i64) -> Setup {
    let mut ctx = Context::new();
    let mut ids = Vec::new();
    let mut outs = Vec::new();
    for _ in 0..30 {
        let k = ctx
            .new_tensor_3d(ElementType::F16, 64, n_kv, kv_heads)
            .unwrap();
        let q = ctx.new_tensor_3d(ElementType::F32, 64, 1, 9).unwrap();
        let kq = ctx.mul_mat(k, q).unwrap();
        let v = ctx
            .new_tensor_3d(ElementType::F16, n_kv, 64, kv_heads)
            .unwrap();
        let p = ctx.new_tensor_3d(ElementType::F32, n_kv, 1, 9).unwrap();
        let kqv = ctx.mul_mat(v, p).unwrap();
        ids.extend([k, q, kq, v, p, kqv]);
        outs.extend([kq, kqv]);
    }
    let mut g = Graph::new(128);
    for &y in &outs {
        g.build_forward_expand(&mut ctx, y).unwrap();
    }
    let buf = alloc(&mut ctx, &ids);
    Setup { ctx, g, _buf: buf }
}

/// `mul_mat/read_64MiB_baseline`: the main thread reads the first half of a 64 MiB buffer
/// while a helper thread (started once) reads the second half ([`ReadBaseline`]).
fn bench_read_baseline(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let read = ReadBaseline::new(64 << 20);
    group.throughput(Throughput::Bytes(read.bytes() as u64));
    group.bench_function("read_64MiB_baseline", |b| timed(b, || read.run()));
}

fn bench_add(c: &mut Criterion) {
    let cpu = CpuCompute::new(threads());
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
    let cpu = CpuCompute::new(threads());
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
