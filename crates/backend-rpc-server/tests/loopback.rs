//! Our client against our server (memory-only device), and against scripted fake servers for
//! the failure paths: version refusal, timeouts, lost connections, bad clients.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend_core::{
    BackendError, tensor_alloc, tensor_copy, tensor_get, tensor_memset, tensor_set,
};
use backend_rpc::wire::{Command, GraphMessage};
use backend_rpc::{RpcConfig, RpcError, connect};
use backend_rpc_server::ServerConfig;
use graph::{Context, ElementType, Graph};

fn cfg() -> RpcConfig {
    RpcConfig {
        connect_timeout: Duration::from_secs(2),
        io_timeout: Some(Duration::from_secs(10)),
    }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn buffers_and_tensor_ops_round_trip() {
    let server = common::mem_server(ServerConfig::default());
    let h = server.spawn("127.0.0.1:0").unwrap();
    let devs = connect(&h.endpoint(), &cfg()).unwrap();
    assert_eq!(devs.len(), 1);
    let dev = &devs[0];
    assert_eq!(dev.name(), format!("RPC0[{}]", h.endpoint()));
    assert_eq!(dev.memory(), (1 << 30, 2 << 30));
    let buft = dev.buffer_type();
    assert_eq!(buft.alignment(), 32);
    assert_eq!(buft.device().as_ref(), Some(dev));
    assert!(dev.supports_buft(&buft));

    let buf = buft.alloc_buffer(4096).unwrap();
    assert_eq!(buf.size(), 4096);
    assert_eq!(buf.base_address(), 1 << 40); // our server's synthetic base of handle 1
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 256).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 256).unwrap();
    tensor_alloc(&mut ctx, &buf, a, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, b, 1024).unwrap();
    let data = bytes(1024, 7);
    tensor_set(&ctx, a, 0, &data).unwrap();
    let mut back = vec![0u8; 1024];
    tensor_get(&ctx, a, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // Partial get with an offset.
    let mut part = vec![0u8; 100];
    tensor_get(&ctx, a, 300, &mut part).unwrap();
    assert_eq!(part, data[300..400]);
    // Memset a range.
    tensor_memset(&ctx, a, 0xAB, 10, 20).unwrap();
    tensor_get(&ctx, a, 0, &mut back).unwrap();
    let mut expect = data.clone();
    expect[10..30].fill(0xAB);
    assert_eq!(back, expect);
    // Server-side copy a -> b.
    tensor_copy(&ctx, a, b).unwrap();
    let mut bb = vec![0u8; 1024];
    tensor_get(&ctx, b, 0, &mut bb).unwrap();
    assert_eq!(bb, expect);
    // Clear.
    buf.clear(3).unwrap();
    tensor_get(&ctx, b, 0, &mut bb).unwrap();
    assert!(bb.iter().all(|&x| x == 3));
    // Out-of-range requests are refused on our side, the connection stays usable.
    let r = tensor_get(&ctx, a, 1000, &mut bb[..100]);
    assert!(
        matches!(
            r,
            Err(BackendError::OutOfBounds {
                what: "tensor_get",
                offset: 1000,
                size: 100,
                ..
            })
        ),
        "{r:?}"
    );
    tensor_get(&ctx, a, 0, &mut back).unwrap();
}

#[test]
fn buffers_are_freed_on_drop() {
    let server = common::mem_server(ServerConfig {
        max_client_memory: 1 << 20,
        ..ServerConfig::default()
    });
    let h = server.spawn("127.0.0.1:0").unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let buft = dev.buffer_type();
    let b1 = buft.alloc_buffer(600 << 10).unwrap();
    // Over the per-client limit while b1 lives: the server answers "no memory".
    let r = buft.alloc_buffer(600 << 10);
    assert!(
        matches!(r, Err(BackendError::AllocationFailed { size, .. }) if size == 600 << 10),
        "{r:?}"
    );
    drop(b1);
    let b2 = buft.alloc_buffer(600 << 10).unwrap();
    assert_eq!(b2.size(), 600 << 10);
}

#[test]
fn several_clients_at_once_and_bad_clients_are_isolated() {
    let server = common::mem_server(ServerConfig::default());
    let h = server.spawn("127.0.0.1:0").unwrap();
    let d1 = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let d2 = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    // A hostile client: HELLO, then a GET_TENSOR with garbage, then a huge size.
    let mut raw = std::net::TcpStream::connect(h.local_addr()).unwrap();
    raw.write_all(&[14, 24, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    raw.write_all(&[0; 24]).unwrap();
    let mut resp = [0u8; 36];
    raw.read_exact(&mut resp).unwrap();
    assert_eq!(resp[8], 7);
    let mut msg = vec![8u8];
    msg.extend_from_slice(&312u64.to_le_bytes());
    msg.extend_from_slice(&[0xff; 312]);
    raw.write_all(&msg).unwrap();
    let mut rest = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        raw.read_to_end(&mut rest).unwrap_or(0),
        0,
        "server closes on bad input"
    );

    let mut ctxs = Vec::new();
    let mut bufs = Vec::new();
    for (i, d) in [&d1, &d2].into_iter().enumerate() {
        let buf = d.buffer_type().alloc_buffer(256).unwrap();
        let mut ctx = Context::new();
        let t = ctx.new_tensor_1d(ElementType::I8, 256).unwrap();
        tensor_alloc(&mut ctx, &buf, t, 0).unwrap();
        tensor_set(&ctx, t, 0, &bytes(256, i as u8)).unwrap();
        ctxs.push((ctx, t));
        bufs.push(buf);
    }
    // Both clients' buffers have the same handle (1) and base on the server: separate sessions.
    assert_eq!(bufs[0].base_address(), bufs[1].base_address());
    for (i, (ctx, t)) in ctxs.iter().enumerate() {
        let mut back = vec![0u8; 256];
        tensor_get(ctx, *t, 0, &mut back).unwrap();
        assert_eq!(back, bytes(256, i as u8));
    }
}

/// A fake server that answers HELLO with `version` and then runs `script` on the socket.
fn fake_server(
    version: [u8; 3],
    script: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = [0u8; 33];
        s.read_exact(&mut req).unwrap();
        assert_eq!(req[0], 14);
        let mut resp = 28u64.to_le_bytes().to_vec();
        resp.extend_from_slice(&[version[0], version[1], version[2], 0]);
        resp.extend_from_slice(&[0; 24]);
        s.write_all(&resp).unwrap();
        script(s);
    });
    ep
}

#[test]
fn incompatible_versions_are_refused() {
    for v in [[8, 0, 0], [6, 0, 0], [7, 1, 0]] {
        let ep = fake_server(v, |_s| {});
        match connect(&ep, &cfg()) {
            Err(RpcError::Version { major, minor, .. }) => assert_eq!([major, minor], [v[0], v[1]]),
            other => panic!("{v:?}: {other:?}"),
        }
    }
    // A different patch is fine: the handshake passes and DEVICE_COUNT is asked next.
    let ep = fake_server([7, 0, 9], |mut s| {
        let mut req = [0u8; 9];
        s.read_exact(&mut req).unwrap();
        assert_eq!(req[0], Command::DeviceCount as u8);
        let mut r = 4u64.to_le_bytes().to_vec();
        r.extend_from_slice(&0u32.to_le_bytes());
        s.write_all(&r).unwrap();
    });
    assert_eq!(connect(&ep, &cfg()).unwrap().len(), 0);
}

#[test]
fn a_silent_server_times_out() {
    let ep = fake_server([7, 0, 0], |s| {
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let t0 = Instant::now();
    let cfg = RpcConfig {
        io_timeout: Some(Duration::from_millis(300)),
        ..cfg()
    };
    match connect(&ep, &cfg) {
        Err(RpcError::Timeout { cmd, .. }) => assert_eq!(cmd, Command::DeviceCount),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn unreachable_and_malformed_endpoints() {
    assert!(matches!(
        connect("nohostport", &cfg()),
        Err(RpcError::BadEndpoint { .. })
    ));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    drop(l);
    assert!(matches!(
        connect(&ep, &cfg()),
        Err(RpcError::Connect { .. })
    ));
}

#[test]
fn connection_loss_is_a_prompt_error_and_sticks() {
    let server = common::mem_server(ServerConfig::default());
    let h = server.spawn("127.0.0.1:0").unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let buf = dev.buffer_type().alloc_buffer(64).unwrap();
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 0).unwrap();
    h.drop_connections();
    let t0 = Instant::now();
    let mut out = [0u8; 64];
    let e = tensor_get(&ctx, t, 0, &mut out).unwrap_err();
    assert!(e.to_string().contains("connection"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    let e2 = tensor_get(&ctx, t, 0, &mut out).unwrap_err();
    assert!(e2.to_string().contains("earlier failure"), "{e2}");
    drop(buf); // FREE_BUFFER on a closed connection is ignored, not a panic
}

#[test]
fn a_refused_graph_surfaces_at_synchronize() {
    // The memory-only server computes nothing: it closes the connection, the client reports it.
    let server = common::mem_server(ServerConfig::default());
    let h = server.spawn("127.0.0.1:0").unwrap();
    let dev = connect(&h.endpoint(), &cfg()).unwrap().remove(0);
    let backend = dev.init_backend("").unwrap();
    let buf = dev.buffer_type().alloc_buffer(1024).unwrap();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let c = ctx.add(a, b).unwrap();
    for (i, t) in [a, b, c].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 32 * i).unwrap();
    }
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, c).unwrap();
    assert!(backend.supports_op(&ctx, c));
    let e = backend.graph_compute(&ctx, g.as_view()).unwrap_err();
    assert!(e.to_string().contains("connection"), "{e}");
}

/// Records every request (command, payload) and answers like the capture of vector B.
type Log = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

fn recording_server(log: Log) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        loop {
            let mut head = [0u8; 9];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let n = u64::from_le_bytes(head[1..].try_into().unwrap()) as usize;
            let mut p = vec![0u8; n];
            s.read_exact(&mut p).unwrap();
            let resp: Option<Vec<u8>> = match Command::from_u8(head[0]).unwrap() {
                Command::Hello => Some([&[7u8, 0, 0, 0][..], &[0; 24]].concat()),
                Command::DeviceCount => Some(1u32.to_le_bytes().to_vec()),
                Command::GetAlignment => Some(32u64.to_le_bytes().to_vec()),
                Command::GetMaxSize => Some(u64::MAX.to_le_bytes().to_vec()),
                Command::GetAllocSize => Some(16384u64.to_le_bytes().to_vec()),
                Command::AllocBuffer => {
                    Some([0x5566_86fd_0760u64.to_le_bytes(), 114688u64.to_le_bytes()].concat())
                }
                Command::BufferGetBase => Some(0x5566_86fe_cf80u64.to_le_bytes().to_vec()),
                Command::GetTensor => {
                    let size = u64::from_le_bytes(p[304..312].try_into().unwrap());
                    Some(vec![0; size as usize])
                }
                _ => None,
            };
            log.lock().unwrap().push((head[0], p));
            if let Some(r) = resp {
                s.write_all(&(r.len() as u64).to_le_bytes()).unwrap();
                s.write_all(&r).unwrap();
            }
        }
    });
    ep
}

#[test]
fn graph_serialization_matches_ggml_client_vector_b() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let ep = recording_server(log.clone());
    let dev = connect(&ep, &cfg()).unwrap().remove(0);
    let backend = dev.init_backend("").unwrap();
    let buf = dev.buffer_type().alloc_buffer(114688).unwrap();
    let mut ctx = Context::new();
    let mk = |ctx: &mut Context, name: &str| {
        let t = ctx.new_tensor_2d(ElementType::F32, 64, 64).unwrap();
        ctx.set_name(t, name).unwrap();
        t
    };
    let (a, b, c, d) = (
        mk(&mut ctx, "a"),
        mk(&mut ctx, "b"),
        mk(&mut ctx, "c"),
        mk(&mut ctx, "d"),
    );
    let mm = ctx.mul_mat(a, b).unwrap();
    ctx.set_name(mm, "mm").unwrap();
    let cd = ctx.mul(c, d).unwrap();
    ctx.set_name(cd, "cd").unwrap();
    let out = ctx.add(mm, cd).unwrap();
    ctx.set_name(out, "out").unwrap();
    ctx.set_output(out).unwrap();
    // The ggml allocator's layout in the capture: a, b, c, d, mm, cd, out, 16384 bytes apart.
    for (i, t) in [a, b, c, d, mm, cd, out].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 16384 * i).unwrap();
    }
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, out).unwrap();
    backend.graph_compute(&ctx, g.as_view()).unwrap();
    let log = log.lock().unwrap();
    let (cmd, payload) = log
        .iter()
        .find(|(c, _)| *c == Command::GraphCompute as u8)
        .unwrap();
    assert_eq!(*cmd, 10);
    assert_eq!(payload.len(), 2108);
    let msg = GraphMessage::decode(payload, 100, 100).unwrap();
    let base = 0x5566_86fe_cf80u64;
    let id = |t: graph::TensorId| t.index() as u64 + 1;
    assert_eq!(msg.nodes, vec![id(mm), id(cd), id(out)]);
    // name, op, flags, use_count, srcs, data offset — vector B's values.
    type Row<'a> = (&'a str, u32, i32, i32, [u64; 2], u64);
    let expect: [Row<'_>; 7] = [
        ("a", 0, 0, 1, [0, 0], 0),
        ("b", 0, 0, 1, [0, 0], 16384),
        ("mm", 29, 16, 1, [id(a), id(b)], 65536),
        ("c", 0, 0, 1, [0, 0], 32768),
        ("d", 0, 0, 1, [0, 0], 49152),
        ("cd", 7, 16, 1, [id(c), id(d)], 81920),
        ("out", 2, 18, 0, [id(mm), id(cd)], 98304),
    ];
    assert_eq!(msg.tensors.len(), 7);
    for (t, e) in msg.tensors.iter().zip(expect) {
        assert_eq!(t.name_str(), e.0);
        assert_eq!((t.op, t.flags, t.use_count), (e.1, e.2, e.3), "{}", e.0);
        assert_eq!([t.src[0], t.src[1]], e.4, "{}", e.0);
        assert_eq!(t.data, base + e.5, "{}", e.0);
        assert_eq!(t.buffer, 0x5566_86fd_0760);
        assert_eq!(t.ne, [64, 64, 1, 1]);
        assert_eq!(t.nb, [4, 256, 16384, 16384]);
        assert_eq!(t.ty, 0);
    }
    // The request sequence: handshake, device queries, allocation, then compute + barrier.
    let cmds: Vec<u8> = log.iter().map(|(c, _)| *c).collect();
    assert_eq!(&cmds[..5], &[14, 15, 1, 2, 0][..]);
    assert_eq!(cmds[5], 3);
    assert_eq!(&cmds[cmds.len() - 2..], &[10, 15]);
}
