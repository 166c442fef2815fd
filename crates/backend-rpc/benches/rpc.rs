//! Loopback benchmarks of the RPC client: set/get bandwidth for 1 MiB and 64 MiB tensors and
//! the round trip of a one-node graph.
//!
//! Against our server in-process (CPU device), and, when `RPC_SERVER_BIN` points at ggml's
//! `rpc-server` (see `.ci/rpc-server-build.sh`), against that server too.
//! Run: `RPC_SERVER_BIN=… cargo bench -p backend-rpc --bench rpc`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_core::{Device, tensor_alloc, tensor_get, tensor_set};
use backend_rpc::{RpcConfig, Server, ServerConfig, connect};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use graph::{Context, ElementType, Graph};

struct Real(Child);
impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn real_server() -> Option<(Real, String)> {
    let bin = std::env::var("RPC_SERVER_BIN").ok()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let ep = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&ep).is_err() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    Some((Real(child), ep))
}

fn set_get(c: &mut Criterion, label: &str, dev: &Device) {
    let mut group = c.benchmark_group(format!("rpc_{label}"));
    group.sample_size(10);
    for mib in [1usize, 64] {
        let n = mib << 20;
        let buf = dev.buffer_type().alloc_buffer(n).expect("alloc");
        let mut ctx = Context::new();
        let t = ctx
            .new_tensor_1d(ElementType::I8, n as i64)
            .expect("tensor");
        tensor_alloc(&mut ctx, &buf, t, 0).expect("place");
        let data = vec![7u8; n];
        let mut back = vec![0u8; n];
        group.throughput(Throughput::Bytes(n as u64));
        group.bench_with_input(BenchmarkId::new("set", format!("{mib}MiB")), &n, |b, _| {
            b.iter(|| {
                tensor_set(&ctx, t, 0, &data).expect("set");
                // SET_TENSOR has no answer: a 1-byte get makes it a full round trip.
                tensor_get(&ctx, t, 0, &mut back[..1]).expect("sync");
            })
        });
        group.bench_with_input(BenchmarkId::new("get", format!("{mib}MiB")), &n, |b, _| {
            b.iter(|| tensor_get(&ctx, t, 0, &mut back).expect("get"))
        });
    }
    group.finish();
}

fn one_node_graph(c: &mut Criterion, label: &str, dev: &Device) {
    let backend = dev.init_backend("").expect("backend");
    let buf = dev.buffer_type().alloc_buffer(4096).expect("alloc");
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 16).expect("a");
    let b = ctx.new_tensor_1d(ElementType::F32, 16).expect("b");
    let s = ctx.add(a, b).expect("add");
    for (i, t) in [a, b, s].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 64 * i).expect("place");
    }
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, s).expect("graph");
    if backend.graph_compute(&ctx, g.as_view()).is_err() {
        return; // this server cannot compute ADD (yet)
    }
    let mut out = [0u8; 64];
    c.bench_function(&format!("rpc_{label}/one_node_graph_roundtrip"), |bch| {
        bch.iter(|| {
            backend.graph_compute(&ctx, g.as_view()).expect("compute");
            tensor_get(&ctx, s, 0, &mut out).expect("get");
        })
    });
}

fn benches(c: &mut Criterion) {
    let cfg = RpcConfig::default();
    let dev = backend_cpu::cpu_device();
    let server = Server::new(dev, Arc::new(backend_cpu::init), ServerConfig::default());
    let handle = server.spawn("127.0.0.1:0").expect("spawn");
    let ours = connect(&handle.endpoint(), &cfg)
        .expect("connect")
        .remove(0);
    set_get(c, "our_server", &ours);
    one_node_graph(c, "our_server", &ours);
    if let Some((_guard, ep)) = real_server() {
        let real = connect(&ep, &cfg).expect("connect").remove(0);
        set_get(c, "ggml_server", &real);
        one_node_graph(c, "ggml_server", &real);
    }
}

criterion_group!(group, benches);
criterion_main!(group);
