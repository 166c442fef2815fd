//! The server under load and hostile clients (stalled, dying mid-graph, oversized prefixes,
//! memory hogs), against a real `rpc-server` process; the long run is `cargo xtask rpc-soak`.
//! Also the memory caps' accounting (buffers and graph messages), on sessions without sockets.

mod soak;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use backend_rpc::wire::{Command, GraphMessage, RpcTensor};
use backend_rpc_server::{GRAPH_FREE_BYTES, Server, ServerConfig, ServerError, Session};

/// ALLOC_BUFFER through a session: the handle (0 = refused).
fn alloc(s: &mut Session, size: u64) -> u64 {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend_from_slice(&size.to_le_bytes());
    let r = s
        .handle(Command::AllocBuffer as u8, &p)
        .unwrap()
        .expect("ALLOC_BUFFER answers");
    u64::from_le_bytes(r[..8].try_into().unwrap())
}

fn hello(s: &mut Session) {
    s.handle(Command::Hello as u8, &[0; 24]).unwrap();
}

#[test]
fn server_memory_cap_is_shared_and_given_back() {
    let cfg = ServerConfig {
        max_buffer_size: 1 << 20,
        max_client_memory: 3 << 20,
        max_server_memory: 4 << 20,
        ..ServerConfig::default()
    };
    let server = Server::new(backend_cpu::cpu_device(), Arc::new(backend_cpu::init), cfg);
    let (mut a, mut b) = (server.session(), server.session());
    hello(&mut a);
    hello(&mut b);
    // Per buffer, per client, then per server.
    assert_eq!(alloc(&mut a, (1 << 20) + 1), 0);
    for _ in 0..3 {
        assert_ne!(alloc(&mut a, 1 << 20), 0);
    }
    assert_eq!(alloc(&mut a, 1 << 20), 0, "client cap");
    assert_ne!(alloc(&mut b, 1 << 20), 0);
    assert_eq!(server.held_bytes(), 4 << 20);
    assert_eq!(alloc(&mut b, 1 << 20), 0, "server cap");
    // A refusal leaves the session usable; freeing gives the bytes back.
    let h = alloc(&mut a, 0);
    assert_ne!(h, 0);
    a.handle(Command::FreeBuffer as u8, &h.to_le_bytes())
        .unwrap();
    a.handle(Command::FreeBuffer as u8, &1u64.to_le_bytes())
        .unwrap();
    assert_eq!(server.held_bytes(), 3 << 20);
    assert_ne!(alloc(&mut b, 1 << 20), 0);
    // A session that goes away (a client that died) gives back all it held.
    drop(a);
    assert_eq!(server.held_bytes(), 2 << 20);
    drop(b);
    assert_eq!(server.held_bytes(), 0);
}

/// A GRAPH_COMPUTE over buffer 1 of a session: `leaves` four-float leaves side by side and
/// one node adding the first two (its result after the leaves).
fn graph_message(leaves: u64) -> Vec<u8> {
    let tensor = |id: u64, slot: u64| RpcTensor {
        id,
        buffer: 1,
        ne: [4, 1, 1, 1],
        nb: [4, 16, 16, 16],
        data: (1 << 40) + 16 * slot,
        ..Default::default()
    };
    let mut tensors: Vec<RpcTensor> = (0..leaves).map(|i| tensor(i + 1, i)).collect();
    let mut add = tensor(leaves + 1, leaves);
    add.op = 2;
    add.src[0] = 1;
    add.src[1] = 2;
    tensors.push(add);
    GraphMessage {
        device: 0,
        nodes: vec![leaves + 1],
        tensors,
    }
    .encode()
}

fn is_cap(e: &ServerError, who: &str) -> bool {
    matches!(e, ServerError::MemoryCap { whose, .. } if *whose == who)
}

#[test]
fn graph_messages_are_charged_to_the_caps() {
    let cfg = ServerConfig {
        max_buffer_size: 2 << 20,
        max_client_memory: 2 << 20,
        max_server_memory: 4 << 20,
        ..ServerConfig::default()
    };
    let server = Server::new(backend_cpu::cpu_device(), Arc::new(backend_cpu::init), cfg);
    let (big, small) = (graph_message(300), graph_message(2));
    let size = big.len() as u64;
    assert!(size > GRAPH_FREE_BYTES && small.len() as u64 <= GRAPH_FREE_BYTES);
    let mut a = server.session();
    hello(&mut a);
    assert_ne!(alloc(&mut a, 301 * 16), 0);
    // Computed and stored: the stored graph stays charged, the message's charge came back.
    a.handle(Command::GraphCompute as u8, &big).unwrap();
    let stored = server.held_bytes() - 301 * 16;
    assert!(
        stored > 0 && stored < 4 * size,
        "stored graph charged {stored}"
    );
    a.handle(Command::GraphRecompute as u8, &0u32.to_le_bytes())
        .unwrap();
    assert_eq!(server.held_bytes(), 301 * 16 + stored);
    // Two more clients fill the server cap with buffers but for 100 kB.
    let (mut b, mut c) = (server.session(), server.session());
    hello(&mut b);
    hello(&mut c);
    assert_ne!(alloc(&mut b, 2 << 20), 0);
    let room = (4 << 20) - server.held_bytes();
    assert_ne!(alloc(&mut c, room - 100_000), 0);
    // The next large graph is refused from its header, before its payload is read; the graph
    // it replaces is dropped, and its charge given back.
    let e = a.admit(Command::GraphCompute as u8, size).unwrap_err();
    assert!(is_cap(&e, "server"), "{e}");
    assert_eq!(server.held_bytes(), 301 * 16 + (2 << 20) + room - 100_000);
    // The same through `handle` alone (the payload already read).
    let e = a.handle(Command::GraphCompute as u8, &big).unwrap_err();
    assert!(is_cap(&e, "server"), "{e}");
    drop(a);
    // Small graphs are a connection's fixed overhead: the others keep computing.
    b.handle(Command::GraphCompute as u8, &small).unwrap();
    c.handle(Command::GraphCompute as u8, &small).unwrap();
    // Past the client cap: b holds 2 MiB of buffers.
    drop(c);
    let e = b.handle(Command::GraphCompute as u8, &big).unwrap_err();
    assert!(is_cap(&e, "client"), "{e}");
    assert_eq!(server.held_bytes(), 2 << 20);
    // With room again, a fresh client's large graph goes through.
    let mut d = server.session();
    hello(&mut d);
    assert_ne!(alloc(&mut d, 301 * 16), 0);
    d.handle(Command::GraphCompute as u8, &big).unwrap();
    assert_eq!(server.held_bytes(), (2 << 20) + 301 * 16 + stored);
    // A charge admitted for one size does not cover a payload of another (or another command).
    d.admit(Command::GraphCompute as u8, GRAPH_FREE_BYTES + 1)
        .unwrap();
    d.handle(Command::GraphCompute as u8, &big).unwrap();
    assert_eq!(server.held_bytes(), (2 << 20) + 301 * 16 + stored);
    d.admit(Command::GraphCompute as u8, size).unwrap();
    d.handle(Command::DeviceCount as u8, &[]).unwrap();
    assert_eq!(server.held_bytes(), (2 << 20) + 301 * 16);
    d.handle(Command::GraphCompute as u8, &big).unwrap();
    // A free drops the stored graph (ggml's rule) and its charge.
    d.handle(Command::FreeBuffer as u8, &1u64.to_le_bytes())
        .unwrap();
    assert_eq!(server.held_bytes(), 2 << 20);
    drop((b, d));
    assert_eq!(server.held_bytes(), 0);
}

/// Every fault kind while 32 clients compute: the server serves them all, stays up, never
/// panics, and its resident memory comes back to the baseline.
#[test]
fn server_survives_hostile_clients_under_load() {
    let cfg = soak::SoakConfig {
        clients: 32,
        duration: Duration::from_secs(
            std::env::var("RPC_SOAK_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(8),
        ),
        warmup: Duration::from_secs(3),
        server_cap_mib: 128,
        idle_timeout_s: 2,
        elements: 256,
        extra_args: Vec::new(),
    };
    let r = soak::soak(Path::new(env!("CARGO_BIN_EXE_rpc-server")), &cfg).unwrap();
    // The figures, for whoever reads the test log.
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{}", r.json());
    }
    assert!(r.faults.iter().all(|&n| n >= 1), "{:?}", r.faults);
    assert!(r.requests >= 32, "{} round trips", r.requests);
    assert!(
        r.rss_back_to_baseline(0.05),
        "RSS {} KiB before, {} KiB after",
        r.rss_before_kib,
        r.rss_after_kib
    );
}

/// SET_TENSOR and GET_TENSOR move bulk data between the socket and the buffer in 1 MiB
/// chunks; sizes and offsets that are not chunk multiples come back byte for byte.
#[test]
fn bulk_data_streams_in_chunks() {
    use backend_core::{tensor_alloc, tensor_get, tensor_set};
    use graph::{Context, ElementType};
    let server = Server::new(
        backend_cpu::cpu_device(),
        Arc::new(backend_cpu::init),
        ServerConfig::default(),
    );
    let h = server.spawn("127.0.0.1:0").unwrap();
    let rpc = backend_rpc::RpcConfig {
        connect_timeout: Duration::from_secs(5),
        io_timeout: Some(Duration::from_secs(30)),
    };
    let dev = backend_rpc::connect(&h.endpoint(), &rpc).unwrap().remove(0);
    let n = (7 << 20) / 2 + 7;
    let buf = dev.buffer_type().alloc_buffer(n + 64).unwrap();
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::I8, n as i64).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 64).unwrap();
    let data: Vec<u8> = (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    tensor_set(&ctx, t, 0, &data).unwrap();
    let mut back = vec![0u8; n];
    tensor_get(&ctx, t, 0, &mut back).unwrap();
    assert!(back == data);
    // A window across chunk boundaries, written and read at an odd offset.
    let (off, len) = ((1 << 20) - 3, (2 << 20) + 5);
    let patch = vec![0xc3u8; len];
    tensor_set(&ctx, t, off, &patch).unwrap();
    let mut win = vec![0u8; len + 2];
    tensor_get(&ctx, t, off - 1, &mut win).unwrap();
    assert_eq!(win[0], data[off - 1]);
    assert!(win[1..=len].iter().all(|&b| b == 0xc3));
    assert_eq!(win[len + 1], data[off + len]);
    assert_eq!(server.held_bytes(), (n + 64) as u64);
}
