//! The RPC server under load and hostile clients, driven against a real `rpc-server` process.
//!
//! Shared by the CI test (`tests/hostile.rs`, short) and the soak command
//! (`examples/rpc_soak.rs`, `cargo xtask rpc-soak`). Everything is on loopback and bounded in
//! count and time. The server runs as a child process so that its resident memory
//! (`/proc/PID/status`, `VmRSS`) can be read before and after, with nothing of the clients in it.
//!
//! * Load: `clients` threads, each with its own connection through our client, upload two
//!   vectors, compute their sum (a one-node graph) and read it back, checking every result;
//!   the latency of that round trip is recorded.
//! * Faults, in a loop on one more thread while the load runs: a client stalled in the middle
//!   of a message (cut by the server's idle timeout), a client that disconnects in the middle
//!   of a graph, a length prefix past the limits, and a client that allocates (and touches)
//!   buffers until the server's memory cap refuses it, and then dies without freeing them. While
//!   that hog holds the cap, a client of ours asking for memory must get a typed
//!   `AllocationFailed`; after it died, the same request must succeed. Last, graph hogs: clients
//!   that each announce a 16 MiB GRAPH_COMPUTE, send all of it but the last byte and stall,
//!   until the server refuses one for its memory cap (closing it at once); what the accepted
//!   ones hold must stay within the cap.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use backend_core::{BackendError, Device, tensor_alloc, tensor_get, tensor_set};
use backend_rpc::wire::{Command as Cmd, put_header};
use backend_rpc::{RpcConfig, connect};
use graph::{Context, ElementType, GraphView};

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// Load clients.
    pub clients: usize,
    /// Length of the load phase.
    pub duration: Duration,
    /// Length of the warm-up before the baseline is read.
    pub warmup: Duration,
    /// The server's memory cap (`--max-server-mib`).
    pub server_cap_mib: u64,
    /// The server's idle timeout (`--idle-timeout-s`), which cuts stalled clients.
    pub idle_timeout_s: u64,
    /// Elements of each vector of the one-node graph.
    pub elements: usize,
    /// More `rpc-server` flags.
    pub extra_args: Vec<String>,
}

/// What was measured.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Load clients.
    pub clients: usize,
    /// Seconds the load phase ran.
    pub secs: f64,
    /// Round trips (upload, compute, read back) completed by the load clients.
    pub requests: u64,
    /// Round trips per second.
    pub requests_per_s: f64,
    /// Median round-trip latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile round-trip latency, milliseconds.
    pub p99_ms: f64,
    /// Slowest round trip, milliseconds.
    pub max_ms: f64,
    /// Server RSS right after start, KiB.
    pub rss_start_kib: u64,
    /// Server RSS after a warm-up round with every client, all gone again (the baseline), KiB.
    pub rss_before_kib: u64,
    /// Highest server RSS seen during the load, KiB.
    pub rss_peak_kib: u64,
    /// Server RSS after the load and faults, every client gone, KiB.
    pub rss_after_kib: u64,
    /// Faults injected, by kind: stall, disconnect mid-graph, oversized prefix, memory hog,
    /// graph hog.
    pub faults: [u64; FAULT_KINDS],
    /// Bytes the memory hogs got before the cap refused them (the last hog), MiB.
    pub hog_mib: u64,
    /// Stalled 16 MiB graph messages the server held before it refused the next one (the last
    /// graph hog round).
    pub graph_hogs_held: u64,
}

/// Kinds of fault [`phase`] injects.
pub const FAULT_KINDS: usize = 5;

impl SoakReport {
    /// `after` within `tol` (a fraction) of `before`.
    pub fn rss_back_to_baseline(&self, tol: f64) -> bool {
        let (b, a) = (self.rss_before_kib as f64, self.rss_after_kib as f64);
        (a - b).abs() <= tol * b
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        format!(
            concat!(
                "{{\"clients\":{},\"secs\":{:.1},\"requests\":{},\"requests_per_s\":{:.1},",
                "\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\"rss_start_kib\":{},",
                "\"rss_before_kib\":{},\"rss_peak_kib\":{},\"rss_after_kib\":{},",
                "\"faults\":{{\"stall\":{},\"disconnect_mid_graph\":{},\"oversized_prefix\":{},",
                "\"memory_hog\":{},\"graph_hog\":{}}},\"hog_mib\":{},\"graph_hogs_held\":{}}}"
            ),
            self.clients,
            self.secs,
            self.requests,
            self.requests_per_s,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.rss_start_kib,
            self.rss_before_kib,
            self.rss_peak_kib,
            self.rss_after_kib,
            self.faults[0],
            self.faults[1],
            self.faults[2],
            self.faults[3],
            self.faults[4],
            self.hog_mib,
            self.graph_hogs_held,
        )
    }
}

/// A `rpc-server` child process; killed on drop.
pub struct ServerProc {
    child: Child,
    /// `HOST:PORT`.
    pub endpoint: String,
    /// Lines of its log that mention a panic.
    panics: Arc<Mutex<Vec<String>>>,
    /// Clients connected minus clients gone, from its log.
    clients: Arc<AtomicI64>,
}

impl ServerProc {
    /// Start `bin` on an ephemeral loopback port with `args`; wait until it listens.
    pub fn start(bin: &Path, args: &[String]) -> Result<Self, String> {
        let mut child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = mpsc::channel();
        let panics = Arc::new(Mutex::new(Vec::new()));
        let p2 = panics.clone();
        let clients = Arc::new(AtomicI64::new(0));
        let c2 = clients.clone();
        // Drain the log for the whole run (a full pipe would block the server).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(ep) = line.split("endpoint=").nth(1) {
                    let ep = ep.split_whitespace().next().unwrap_or("").to_owned();
                    let _ = tx.send(ep);
                }
                if line.contains("client connected") {
                    c2.fetch_add(1, Ordering::SeqCst);
                } else if line.contains("client disconnected")
                    || line.contains("closing client connection")
                {
                    c2.fetch_sub(1, Ordering::SeqCst);
                }
                if line.contains("panicked") {
                    p2.lock().unwrap().push(line);
                }
            }
        });
        let endpoint = rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "the server did not report its endpoint".to_owned())?;
        Ok(ServerProc {
            child,
            endpoint,
            panics,
            clients,
        })
    }

    /// Resident memory of the server, KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }

    /// Still running, and no panic in its log.
    pub fn healthy(&mut self) -> Result<(), String> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Err(format!("the server exited: {st}"));
        }
        let p = self.panics.lock().unwrap();
        if !p.is_empty() {
            return Err(format!("the server panicked: {}", p.join("\n")));
        }
        Ok(())
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` of process `pid` in KiB (0 if unreadable).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The `rpc-server` flags a soak uses.
pub fn server_args(cfg: &SoakConfig) -> Vec<String> {
    [
        "--threads",
        "1",
        "--max-clients",
        &(cfg.clients + 16).to_string(),
        "--max-server-mib",
        &cfg.server_cap_mib.to_string(),
        "--max-client-mib",
        &cfg.server_cap_mib.to_string(),
        "--max-set-mib",
        "16",
        "--idle-timeout-s",
        &cfg.idle_timeout_s.to_string(),
    ]
    .map(str::to_owned)
    .into_iter()
    .chain(cfg.extra_args.iter().cloned())
    .collect()
}

fn rpc_config() -> RpcConfig {
    RpcConfig {
        connect_timeout: Duration::from_secs(5),
        io_timeout: Some(Duration::from_secs(30)),
    }
}

fn f32s(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 20) as f32 / 64.0)
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One load client: connect, then round trips until `stop`; returns the latencies.
fn load_client(
    endpoint: &str,
    elements: usize,
    seed: u32,
    stop: &AtomicBool,
) -> Result<Vec<Duration>, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("load client {seed}: {what}: {e}");
    let dev = connect(endpoint, &rpc_config())
        .map_err(|e| err("connect", &e))?
        .remove(0);
    let backend = dev.init_backend("").map_err(|e| err("backend", &e))?;
    let mut ctx = Context::new();
    let n = elements as i64;
    let a = ctx
        .new_tensor_1d(ElementType::F32, n)
        .map_err(|e| err("a", &e))?;
    let b = ctx
        .new_tensor_1d(ElementType::F32, n)
        .map_err(|e| err("b", &e))?;
    let sum = ctx.add(a, b).map_err(|e| err("add", &e))?;
    let row = elements * 4;
    let buf = dev
        .buffer_type()
        .alloc_buffer(3 * row)
        .map_err(|e| err("alloc", &e))?;
    for (i, id) in [a, b, sum].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, id, i * row).map_err(|e| err("place", &e))?;
    }
    let mut lat = Vec::new();
    let mut out = vec![0u8; row];
    let mut round = 0u32;
    while !stop.load(Ordering::Relaxed) {
        round = round.wrapping_add(1);
        let (va, vb) = (f32s(elements, seed ^ round), f32s(elements, round));
        let t0 = Instant::now();
        tensor_set(&ctx, a, 0, &bytes(&va)).map_err(|e| err("set", &e))?;
        tensor_set(&ctx, b, 0, &bytes(&vb)).map_err(|e| err("set", &e))?;
        backend
            .graph_compute(&ctx, GraphView::new(&[sum], &[]))
            .map_err(|e| err("compute", &e))?;
        tensor_get(&ctx, sum, 0, &mut out).map_err(|e| err("get", &e))?;
        lat.push(t0.elapsed());
        let want = bytes(&va.iter().zip(&vb).map(|(x, y)| x + y).collect::<Vec<_>>());
        if out != want {
            return Err(format!("load client {seed}: wrong sum in round {round}"));
        }
    }
    Ok(lat)
}

/// A raw connection that has done HELLO.
fn raw_client(endpoint: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(endpoint).map_err(|e| format!("raw connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut msg = Vec::new();
    put_header(&mut msg, Cmd::Hello, 24);
    msg.extend_from_slice(&[0; 24]);
    s.write_all(&msg).map_err(|e| format!("raw hello: {e}"))?;
    let mut resp = [0u8; 36];
    s.read_exact(&mut resp)
        .map_err(|e| format!("raw hello answer: {e}"))?;
    Ok(s)
}

/// ALLOC_BUFFER on a raw connection: the handle (0 = refused).
fn raw_alloc(s: &mut TcpStream, size: u64) -> Result<u64, String> {
    let mut msg = Vec::new();
    put_header(&mut msg, Cmd::AllocBuffer, 12);
    msg.extend_from_slice(&0u32.to_le_bytes());
    msg.extend_from_slice(&size.to_le_bytes());
    s.write_all(&msg).map_err(|e| format!("alloc: {e}"))?;
    let mut resp = [0u8; 24];
    s.read_exact(&mut resp)
        .map_err(|e| format!("alloc answer: {e}"))?;
    Ok(u64::from_le_bytes(resp[8..16].try_into().unwrap()))
}

/// BUFFER_CLEAR (touches every page of the buffer on the server).
fn raw_clear(s: &mut TcpStream, handle: u64, value: u8) -> Result<(), String> {
    let mut msg = Vec::new();
    put_header(&mut msg, Cmd::BufferClear, 9);
    msg.extend_from_slice(&handle.to_le_bytes());
    msg.push(value);
    s.write_all(&msg).map_err(|e| format!("clear: {e}"))
}

/// Wait until the server closes `s` (EOF or reset), at most `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return Ok(t0.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!("not closed within {limit:?}"));
            }
            Err(_) => return Ok(t0.elapsed()),
        }
        if t0.elapsed() > limit {
            return Err(format!("not closed within {limit:?}"));
        }
    }
}

/// A client stalled in the middle of a SET_TENSOR: the idle timeout must cut it.
pub fn fault_stall(endpoint: &str, idle_timeout_s: u64) -> Result<(), String> {
    let mut s = raw_client(endpoint)?;
    let mut msg = Vec::new();
    put_header(&mut msg, Cmd::SetTensor, 4096);
    msg.extend_from_slice(&[0u8; 100]);
    s.write_all(&msg).map_err(|e| format!("stall: {e}"))?;
    closed_within(&mut s, Duration::from_secs(idle_timeout_s + 10))
        .map(drop)
        .map_err(|e| format!("stalled client: {e}"))
}

/// A client that allocates and fills a buffer, then disconnects halfway through a graph.
pub fn fault_disconnect_mid_graph(endpoint: &str) -> Result<(), String> {
    let mut s = raw_client(endpoint)?;
    let h = raw_alloc(&mut s, 4 << 20)?;
    if h == 0 {
        return Err("mid-graph client: 4 MiB refused".into());
    }
    raw_clear(&mut s, h, 0x5a)?;
    let mut msg = Vec::new();
    put_header(&mut msg, Cmd::GraphCompute, 12 + 8 + 2 * 296);
    msg.extend_from_slice(&0u32.to_le_bytes());
    msg.extend_from_slice(&1u32.to_le_bytes());
    msg.extend_from_slice(&2u64.to_le_bytes());
    msg.extend_from_slice(&2u32.to_le_bytes());
    msg.extend_from_slice(&[0u8; 150]);
    s.write_all(&msg).map_err(|e| format!("mid-graph: {e}"))?;
    Ok(())
}

/// Length prefixes past every limit: the server must close at once, reading nothing more.
pub fn fault_oversized(endpoint: &str, round: u64) -> Result<(), String> {
    let mut s = raw_client(endpoint)?;
    let (cmd, size) = match round % 3 {
        0 => (Cmd::SetTensor, u64::MAX),
        1 => (Cmd::GraphCompute, 1 << 40),
        _ => (Cmd::GetAlignment, 1 << 33),
    };
    let mut msg = Vec::new();
    put_header(&mut msg, cmd, size);
    msg.extend_from_slice(&[0u8; 64]);
    s.write_all(&msg).map_err(|e| format!("oversized: {e}"))?;
    closed_within(&mut s, Duration::from_secs(10))
        .map(drop)
        .map_err(|e| format!("oversized {cmd} prefix of {size}: {e}"))
}

/// A client that allocates 8 MiB buffers (touching them) until the server refuses; while it
/// holds them, a probe (our client on its own connection) must get a typed refusal; then the
/// hog dies without freeing anything and the same request must succeed. Returns MiB held.
pub fn fault_memory_hog(endpoint: &str, cap_mib: u64) -> Result<u64, String> {
    const CHUNK: u64 = 8 << 20;
    let mut s = raw_client(endpoint)?;
    let mut held = 0u64;
    loop {
        let h = raw_alloc(&mut s, CHUNK)?;
        if h == 0 {
            break;
        }
        raw_clear(&mut s, h, 0xa5)?;
        held += CHUNK;
        if held > (cap_mib << 20) {
            return Err(format!("the hog got {held} bytes past a {cap_mib} MiB cap"));
        }
    }
    // The cap leaves room for the load clients' small buffers and the probe's request: the hog
    // got at least the cap minus those and one chunk.
    if held + CHUNK + (16 << 20) < (cap_mib << 20) {
        return Err(format!("the hog was refused early, at {held} bytes"));
    }
    // Connected only now: the server's idle timeout would cut a probe left waiting.
    let probe: Device = connect(endpoint, &rpc_config())
        .map_err(|e| format!("probe: {e}"))?
        .remove(0);
    match probe.buffer_type().alloc_buffer(CHUNK as usize) {
        Err(BackendError::AllocationFailed { .. }) => {}
        Ok(_) => return Err("an allocation past the server cap succeeded".into()),
        Err(e) => return Err(format!("refusal is not AllocationFailed: {e}")),
    }
    drop(s);
    // The server frees the dead hog's buffers when it sees the connection close.
    let t0 = Instant::now();
    loop {
        match probe.buffer_type().alloc_buffer(CHUNK as usize) {
            Ok(b) => {
                drop(b);
                return Ok(held >> 20);
            }
            Err(BackendError::AllocationFailed { .. })
                if t0.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("memory of a dead hog was not freed: {e}")),
        }
    }
}

/// Payload of one graph hog's message.
const GRAPH_HOG_BYTES: u64 = 16 << 20;

/// Graph hogs: raw clients that each announce a [`GRAPH_HOG_BYTES`] GRAPH_COMPUTE, send all
/// of it but the last byte and stall, until the server refuses one for its memory cap; a
/// refused one is closed at once, so its write fails. The accepted ones must hold less than
/// the cap (counting their payloads alone), and at least one must get in (the charges of
/// earlier rounds were given back). Returns how many the server held.
pub fn fault_graph_hog(endpoint: &str, cap_mib: u64) -> Result<u64, String> {
    let most = (cap_mib << 20) / GRAPH_HOG_BYTES;
    let t0 = Instant::now();
    loop {
        let mut held = Vec::new();
        let mut refused = false;
        while !refused {
            let mut s = raw_client(endpoint)?;
            s.set_write_timeout(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
            let mut msg = Vec::new();
            put_header(&mut msg, Cmd::GraphCompute, GRAPH_HOG_BYTES);
            // Zeros: device 0, no nodes, no tensors, then bytes that will never add up; the
            // server cannot know before the last byte.
            msg.resize(msg.len() + GRAPH_HOG_BYTES as usize - 1, 0);
            if s.write_all(&msg).is_ok() {
                held.push(s);
            } else {
                refused = true;
            }
            if held.len() as u64 > most {
                return Err(format!(
                    "the server held {} graph messages of {GRAPH_HOG_BYTES} bytes past a \
                     {cap_mib} MiB cap",
                    held.len()
                ));
            }
        }
        if !held.is_empty() {
            return Ok(held.len() as u64);
        }
        // Nothing got in: the last round's charges may not be given back yet.
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("no graph message of 16 MiB is accepted any more".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// What [`phase`] returns: sorted latencies, seconds the load ran, fault counts, the last memory
/// hog's MiB and the last graph hog round's held messages.
type PhaseResult = (Vec<Duration>, f64, [u64; FAULT_KINDS], u64, u64);

/// Run load clients for `secs` (with faults on one more thread when `faults`); returns the
/// sorted latencies, the seconds the load ran, the fault counts and the last hog size.
fn phase(
    server: &ServerProc,
    cfg: &SoakConfig,
    secs: Duration,
    faults: bool,
    peak: &AtomicU64,
) -> Result<PhaseResult, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let ep = server.endpoint.clone();
    let loads: Vec<_> = (0..cfg.clients)
        .map(|i| {
            let (ep, stop, n) = (ep.clone(), stop.clone(), cfg.elements);
            std::thread::spawn(move || load_client(&ep, n, i as u32 + 1, &stop))
        })
        .collect();
    let fault_thread = faults.then(|| {
        let (ep, stop, cfg) = (ep.clone(), stop.clone(), cfg.clone());
        std::thread::spawn(move || -> Result<([u64; FAULT_KINDS], u64, u64), String> {
            // Let the load clients connect and allocate first.
            std::thread::sleep(Duration::from_millis(500));
            let mut counts = [0u64; FAULT_KINDS];
            let (mut hog, mut graph_hogs) = (0, 0);
            let mut round = 0u64;
            // Each kind at least once, however short the phase.
            let kinds = FAULT_KINDS as u64;
            while !stop.load(Ordering::Relaxed) || round < kinds {
                match round % kinds {
                    0 => fault_stall(&ep, cfg.idle_timeout_s)?,
                    1 => fault_disconnect_mid_graph(&ep)?,
                    2 => fault_oversized(&ep, round / kinds)?,
                    3 => hog = fault_memory_hog(&ep, cfg.server_cap_mib)?,
                    _ => graph_hogs = fault_graph_hog(&ep, cfg.server_cap_mib)?,
                }
                counts[(round % kinds) as usize] += 1;
                round += 1;
            }
            Ok((counts, hog, graph_hogs))
        })
    });
    let t0 = Instant::now();
    while t0.elapsed() < secs {
        std::thread::sleep(Duration::from_millis(100));
        peak.fetch_max(server.rss_kib(), Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in loads {
        lat.extend(t.join().map_err(|_| "a load client panicked")??);
    }
    let load_secs = t0.elapsed().as_secs_f64();
    let (counts, hog, graph_hogs) = match fault_thread {
        Some(t) => {
            // The fault round in progress finishes (a stall lasts the idle timeout).
            while !t.is_finished() {
                std::thread::sleep(Duration::from_millis(100));
                peak.fetch_max(server.rss_kib(), Ordering::Relaxed);
            }
            t.join().map_err(|_| "the fault thread panicked")??
        }
        None => ([0; FAULT_KINDS], 0, 0),
    };
    lat.sort_unstable();
    Ok((lat, load_secs, counts, hog, graph_hogs))
}

/// The server's RSS once its log says every client is gone and the RSS has not changed for
/// 1.5 s (the binary's trimmer runs every 0.5 s), waiting at most 10 s for each.
fn settled_rss(server: &ServerProc) -> u64 {
    let t0 = Instant::now();
    while server.clients.load(Ordering::SeqCst) > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut last, mut same) = (server.rss_kib(), 0);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let now = server.rss_kib();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same >= 7 {
            break;
        }
    }
    last
}

/// Start `bin`, warm it up with every client for a second, then run the load with faults.
pub fn soak(bin: &Path, cfg: &SoakConfig) -> Result<SoakReport, String> {
    let mut server = ServerProc::start(bin, &server_args(cfg))?;
    let mut r = SoakReport {
        clients: cfg.clients,
        rss_start_kib: server.rss_kib(),
        ..SoakReport::default()
    };
    let peak = AtomicU64::new(0);
    // Warm-up: every client once and every fault kind once, so that code pages, thread
    // stacks and allocator arenas of a serving server are in the baseline.
    phase(&server, cfg, cfg.warmup, true, &peak)?;
    r.rss_before_kib = settled_rss(&server);
    let (lat, secs, faults, hog, graph_hogs) = phase(&server, cfg, cfg.duration, true, &peak)?;
    r.secs = secs;
    r.rss_after_kib = settled_rss(&server);
    r.rss_peak_kib = peak.load(Ordering::Relaxed);
    server.healthy()?;
    r.requests = lat.len() as u64;
    r.requests_per_s = r.requests as f64 / r.secs;
    r.p50_ms = percentile(&lat, 0.50);
    r.p99_ms = percentile(&lat, 0.99);
    r.max_ms = lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e3);
    r.faults = faults;
    r.hog_mib = hog;
    r.graph_hogs_held = graph_hogs;
    Ok(r)
}
