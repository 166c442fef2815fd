//! Loopback benchmarks of the RPC client: set/get bandwidth for 1 MiB and 64 MiB tensors and
//! the round trip of a one-node graph.
//!
//! Three pairs in one run: our client against our server in-process (CPU device); and, when
//! `RPC_SERVER_BIN` points at ggml's `rpc-server` (see `.ci/rpc-server-build.sh`), our client
//! against that server and ggml's own client against the same server. ggml's client is a small
//! C++ driver built by `benches/ggml-client-bench.sh` in the server's scratch directory (or
//! named by `GGML_CLIENT_BENCH`); criterion times it through `iter_custom`: the driver runs
//! the requested number of iterations and reports the elapsed time, so both clients are
//! measured by the same loop shape (a set is followed by a 1-byte get, a graph compute by a
//! 64-byte get of its result).
//! Run: `RPC_SERVER_BIN=… cargo bench -p backend-rpc-server --bench rpc`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_core::{Device, tensor_alloc, tensor_get, tensor_set};
use backend_rpc::{RpcConfig, connect};
use backend_rpc_server::{Server, ServerConfig};
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

/// ggml's own client (the C++ driver) connected to `endpoint`.
struct GgmlClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for GgmlClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GgmlClient {
    fn start(endpoint: &str) -> Option<GgmlClient> {
        let bin = match std::env::var("GGML_CLIENT_BENCH") {
            Ok(b) => b,
            Err(_) => {
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/ggml-client-bench.sh");
                let out = Command::new("bash")
                    .arg(script)
                    .stderr(Stdio::inherit())
                    .output()
                    .ok()?;
                if !out.status.success() {
                    return None;
                }
                String::from_utf8(out.stdout)
                    .ok()?
                    .lines()
                    .last()?
                    .trim()
                    .to_owned()
            }
        };
        let mut child = Command::new(bin)
            .arg(endpoint)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let stdin = child.stdin.take()?;
        let mut stdout = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        stdout.read_line(&mut line).ok()?;
        (line.trim() == "ready").then_some(GgmlClient {
            child,
            stdin,
            stdout,
        })
    }

    /// Runs `op` `iters` times in the driver; the time it measured.
    fn run(&mut self, op: &str, iters: u64) -> Duration {
        writeln!(self.stdin, "{op} {iters}").expect("driver stdin");
        self.stdin.flush().expect("driver stdin");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("driver stdout");
        Duration::from_nanos(
            line.trim()
                .parse()
                .expect("driver answered with nanoseconds"),
        )
    }
}

fn ggml_client(c: &mut Criterion, endpoint: &str) {
    let Some(mut client) = GgmlClient::start(endpoint) else {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "skipped ggml's client: benches/ggml-client-bench.sh could not build or start it"
            );
        }
        return;
    };
    let mut group = c.benchmark_group("rpc_ggml_client_ggml_server");
    group.sample_size(10);
    for mib in [1usize, 64] {
        group.throughput(Throughput::Bytes((mib << 20) as u64));
        for what in ["set", "get"] {
            let op = format!("{what}{mib}");
            group.bench_function(BenchmarkId::new(what, format!("{mib}MiB")), |b| {
                b.iter_custom(|iters| client.run(&op, iters))
            });
        }
    }
    group.finish();
    c.bench_function(
        "rpc_ggml_client_ggml_server/one_node_graph_roundtrip",
        |b| b.iter_custom(|iters| client.run("graph", iters)),
    );
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
        {
            let real = connect(&ep, &cfg).expect("connect").remove(0);
            set_get(c, "ggml_server", &real);
            one_node_graph(c, "ggml_server", &real);
        }
        // ggml's server serves one client at a time: ours has disconnected (every handle of
        // the connection dropped above), so ggml's client gets the same server next.
        ggml_client(c, &ep);
    }
}

criterion_group!(group, benches);
criterion_main!(group);
