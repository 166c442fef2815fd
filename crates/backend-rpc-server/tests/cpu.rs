//! Our client against our server serving the CPU backend: graphs computed remotely equal the
//! local CPU backend bit for bit, and a server killed mid-graph is a prompt client error.
//!
//! Both tests require the CPU backend to compute every op they use (they used to skip
//! themselves before the CPU kernels were merged; now a missing op is a failure).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_core::{Backend, BufferType, tensor_alloc, tensor_get, tensor_set};
use backend_rpc::{RpcConfig, connect};
use backend_rpc_server::{Server, ServerConfig};
use graph::{Context, ElementType, Graph, GraphError, TensorId, UnaryOp};

fn cfg() -> RpcConfig {
    RpcConfig {
        connect_timeout: Duration::from_secs(2),
        io_timeout: Some(Duration::from_secs(60)),
    }
}

fn values(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let x =
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0;
            (x - 0.5).to_le_bytes()
        })
        .collect()
}

/// A graph touching most mappable ops; returns (inputs, output).
fn build(ctx: &mut Context) -> (Vec<TensorId>, TensorId) {
    let a = ctx.new_tensor_2d(ElementType::F32, 64, 32).unwrap();
    let b = ctx.new_tensor_2d(ElementType::F32, 64, 16).unwrap();
    let c = ctx.new_tensor_2d(ElementType::F32, 32, 16).unwrap();
    let mm = ctx.mul_mat(a, b).unwrap(); // 32 x 16
    let s = ctx.unary(mm, UnaryOp::Silu).unwrap();
    let m = ctx.mul(s, c).unwrap();
    let n = ctx.rms_norm(m, 1e-5).unwrap();
    let sm = ctx.soft_max_ext(n, None, 0.5, 0.0).unwrap();
    let t = ctx.transpose(sm).unwrap();
    let tc = ctx.cont(t).unwrap();
    let sc = ctx.scale(tc, 3.0).unwrap();
    let out = ctx.add(sc, sc).unwrap();
    ctx.set_output(out).unwrap();
    (vec![a, b, c], out)
}

fn run(backend: &Backend, buft: &BufferType) -> Vec<u8> {
    let mut ctx = Context::new();
    let (inputs, out) = build(&mut ctx);
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, out).unwrap();
    let ids: Vec<TensorId> = ctx.ids().collect();
    let align = buft.alignment();
    let mut offs = Vec::new();
    let mut total = 0usize;
    for &id in &ids {
        if ctx[id].is_view() {
            offs.push(None);
            continue;
        }
        offs.push(Some(total));
        total += ctx[id].nbytes().div_ceil(align) * align;
    }
    let buf = buft.alloc_buffer(total).unwrap();
    for (&id, off) in ids.iter().zip(&offs) {
        if let Some(o) = off {
            tensor_alloc(&mut ctx, &buf, id, *o).unwrap();
        }
    }
    for &id in &ids {
        if ctx[id].is_view() {
            backend_core::view_init(&mut ctx, id).unwrap();
        }
    }
    for (k, &i) in inputs.iter().enumerate() {
        tensor_set(&ctx, i, 0, &values(ctx[i].nelements() as usize, k as u32)).unwrap();
    }
    backend.graph_compute(&ctx, g.as_view()).unwrap();
    let mut res = vec![0u8; ctx[out].nbytes()];
    tensor_get(&ctx, out, 0, &mut res).unwrap();
    res
}

fn cpu_server(config: ServerConfig) -> Arc<Server> {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dev = backend_cpu::cpu_device();
    Server::new(dev, Arc::new(backend_cpu::init), config)
}

/// The local CPU backend computes every op these tests use.
fn assert_cpu_computes() {
    let mut ctx = Context::new();
    let _ = build(&mut ctx);
    for id in ctx.ids() {
        assert!(
            backend_cpu::cpu_device().supports_op(&ctx, id),
            "the CPU backend does not compute {}",
            ctx[id].op().name()
        );
    }
}

#[test]
fn remote_graph_equals_local_cpu_bit_for_bit() {
    assert_cpu_computes();
    let h = cpu_server(ServerConfig::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let remote = run(&dev.init_backend("").unwrap(), &dev.buffer_type());
    let local = run(
        &backend_cpu::init().unwrap(),
        &backend_cpu::cpu_buffer_type(),
    );
    assert_eq!(remote.len(), 16 * 32 * 4);
    assert_eq!(remote, local);
    assert!(remote.iter().any(|&b| b != 0));
}

#[test]
fn server_killed_mid_graph_is_a_prompt_error() {
    assert_cpu_computes();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--threads",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ready when the port accepts.
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&endpoint).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let dev = connect(&endpoint, &cfg()).unwrap().remove(0);
    let backend = dev.init_backend("").unwrap();
    // A graph that takes a while: 30 chained 1024x1024 matmuls (64 GFLOP).
    let mut ctx = Context::new();
    const N: i64 = 1024;
    let w = ctx.new_tensor_2d(ElementType::F32, N, N).unwrap();
    let mut x = ctx.new_tensor_2d(ElementType::F32, N, N).unwrap();
    for _ in 0..30 {
        x = ctx.mul_mat(w, x).unwrap();
    }
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, x).unwrap();
    let sz = (N * N * 4) as usize;
    let buf = dev.buffer_type().alloc_buffer(32 * sz).unwrap();
    for (i, id) in ctx.ids().collect::<Vec<_>>().into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, id, i * sz).unwrap();
    }
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        child.kill().unwrap();
        child.wait().unwrap();
        Instant::now()
    });
    let res = backend.graph_compute(&ctx, g.as_view());
    let done = Instant::now();
    let killed_at = killer.join().unwrap();
    let e = res.expect_err("the server died");
    assert!(e.to_string().contains("connection"), "{e}");
    assert!(
        done.saturating_duration_since(killed_at) < Duration::from_secs(2),
        "error came {:?} after the kill",
        done.saturating_duration_since(killed_at)
    );
    // Other backends are unaffected.
    let r = run(
        &backend_cpu::init().unwrap(),
        &backend_cpu::cpu_buffer_type(),
    );
    assert_eq!(r.len(), 16 * 32 * 4);
}

/// A node whose source id went stale (its context was rewound past the source) is
/// `UnsupportedOp` on the RPC backend, as on the CPU backend, and not a panic in the graph
/// serializer; nothing is sent, and the backend computes the next graph normally.
#[test]
fn stale_source_is_unsupported_op_not_a_panic() {
    use backend_core::BackendError;
    use graph::GraphView;
    let h = cpu_server(ServerConfig::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let rpc = dev.init_backend("").unwrap();
    let cpu = backend_cpu::init().unwrap();
    for (backend, buft) in [
        (&rpc, dev.buffer_type()),
        (&cpu, backend_cpu::cpu_buffer_type()),
    ] {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
        let b = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
        let sum = ctx.add(a, b).unwrap();
        let buf = buft.alloc_buffer(3 * 64).unwrap();
        for (i, id) in [a, b, sum].into_iter().enumerate() {
            tensor_alloc(&mut ctx, &buf, id, i * 64).unwrap();
        }
        // Point `sum` at a tensor made after a checkpoint, then rewind past it: the source id
        // is stale and its index lies past the end of the context.
        let cp = ctx.checkpoint();
        let later = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
        ctx.set_src(sum, 1, Some(later)).unwrap();
        ctx.rewind(cp);
        assert_eq!(ctx.get(later).err(), Some(GraphError::StaleId(later)));
        assert!(!backend.device().supports_op(&ctx, sum));
        let nodes = [sum];
        let err = backend
            .graph_compute(&ctx, GraphView::new(&nodes, &[]))
            .expect_err("a stale source cannot be computed");
        assert!(
            matches!(err, BackendError::UnsupportedOp { tensor, .. } if tensor == sum),
            "{}: {err:?}",
            backend.name()
        );
        // The backend (and for RPC its connection) is still usable.
        ctx.set_src(sum, 1, Some(b)).unwrap();
        tensor_set(&ctx, a, 0, &values(4, 1)).unwrap();
        tensor_set(&ctx, b, 0, &values(4, 2)).unwrap();
        backend
            .graph_compute(&ctx, GraphView::new(&nodes, &[]))
            .unwrap();
        backend.synchronize().unwrap();
        let mut out = vec![0u8; 16];
        tensor_get(&ctx, sum, 0, &mut out).unwrap();
        let f = |v: &[u8], i: usize| f32::from_le_bytes(v[4 * i..4 * i + 4].try_into().unwrap());
        let (va, vb) = (values(4, 1), values(4, 2));
        for i in 0..4 {
            assert_eq!(f(&out, i), f(&va, i) + f(&vb, i));
        }
    }
}

/// A stale id deeper in the graph (a source of a source that is not itself a node) is a typed
/// error of the RPC backend, not a panic of the serializer; the connection stays usable.
#[test]
fn stale_id_below_a_node_is_a_typed_error() {
    use graph::GraphView;
    let h = cpu_server(ServerConfig::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let rpc = dev.init_backend("").unwrap();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let sum = ctx.add(a, b).unwrap();
    let sq = ctx.sqr(sum).unwrap();
    let buf = dev.buffer_type().alloc_buffer(4 * 64).unwrap();
    for (i, id) in [a, b, sum, sq].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, id, i * 64).unwrap();
    }
    let cp = ctx.checkpoint();
    let later = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    ctx.set_src(sum, 1, Some(later)).unwrap();
    ctx.rewind(cp);
    // `sq` itself can be sent (its source `sum` is live); only `sum`'s source is stale.
    let nodes = [sq];
    assert!(dev.supports_op(&ctx, sq));
    let err = rpc
        .graph_compute(&ctx, GraphView::new(&nodes, &[]))
        .expect_err("a stale id cannot be sent");
    assert!(err.to_string().contains("stale"), "{err}");
    ctx.set_src(sum, 1, Some(b)).unwrap();
    tensor_set(&ctx, a, 0, &values(4, 3)).unwrap();
    tensor_set(&ctx, b, 0, &values(4, 4)).unwrap();
    rpc.graph_compute(&ctx, GraphView::new(&[sum, sq], &[]))
        .unwrap();
    rpc.synchronize().unwrap();
    let mut out = vec![0u8; 16];
    tensor_get(&ctx, sq, 0, &mut out).unwrap();
    assert!(out.iter().any(|&x| x != 0));
}
