//! Our server: protocol 7.0.0 over TCP in front of one local device (the CPU in the
//! `rpc-server` binary), hardened against hostile input.
//!
//! Why it differs from ggml's: ggml's server asserts on some bad tensors (aborting the process
//! for every client), trusts op numbers and shapes, and serves one client at a time. Here every
//! message is checked before anything is done:
//!
//! * the command byte, the HELLO-first rule and the payload size (exact for fixed-size
//!   requests, bounded by [`ServerConfig`] for SET_TENSOR and GRAPH_COMPUTE) are checked from
//!   the header, before the payload is read, and the payload buffer grows only as bytes arrive;
//! * every tensor must name a buffer of this connection and lie inside it, with checked
//!   arithmetic; types and ops must be ones we have;
//! * a graph is rebuilt with the shape-checked constructors of [`graph::Context`], and each node
//!   must come out with exactly the type, extents, strides and sources that were sent, so the
//!   kernels only ever see graphs our own API could have built;
//! * allocations are bounded per buffer, per client and for the whole server (one byte account
//!   shared by all sessions, given back when a buffer is freed or its session ends); node and
//!   tensor counts are bounded;
//! * a graph message larger than [`GRAPH_FREE_BYTES`] is charged to the same accounts before
//!   its payload is read (payload, decoded message, then the rebuilt graph while it is stored
//!   for GRAPH_RECOMPUTE), so large graphs cannot take the server past its cap either;
//! * SET_TENSOR and GET_TENSOR data moves between the socket and the buffer in 1 MiB chunks,
//!   so besides its buffers and its charged graph a client makes the server hold a bounded,
//!   fixed amount (its thread, one chunk, one graph message of at most [`GRAPH_FREE_BYTES`]).
//!
//! A bad message closes that connection with a log line; the other clients and the server go
//! on. Each connection has its own buffers (freed when it goes away) and its own backend, so
//! clients compute concurrently. [`Session`] is the whole per-connection state machine without
//! a socket, which is what the fuzz tests drive.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread::JoinHandle;
use std::time::Duration;

use backend_core::{Backend, BackendError, Buffer, Device};
use graph::{Context, ElementType, GraphError, GraphView, Op, RopeParams, TensorFlags, TensorId};

use backend_rpc::mapping::{op_from_wire, type_from_wire};
use backend_rpc::wire::{
    AllocBufferRequest, AllocBufferResponse, BufferClearRequest, BufferGetBaseRequest,
    BufferGetBaseResponse, Command, CopyTensorRequest, CopyTensorResponse, DeviceCountResponse,
    FixedPayload, FreeBufferRequest, GetAlignmentRequest, GetAlignmentResponse,
    GetAllocSizeRequest, GetAllocSizeResponse, GetDeviceMemoryRequest, GetDeviceMemoryResponse,
    GetMaxSizeRequest, GetMaxSizeResponse, GetTensorRequest, GraphMessage, GraphRecomputeRequest,
    HelloRequest, HelloResponse, InitTensorRequest, MemsetTensorRequest, PROTO_MAJOR, PROTO_MINOR,
    PROTO_PATCH, Payload, RPC_TENSOR_SIZE, RpcTensor, SET_TENSOR_FIXED, SetTensorHashRequest,
    SetTensorHashResponse, SetTensorRequest, WireError,
};

/// Limits and settings of a server.
///
/// ```
/// use backend_rpc_server::ServerConfig;
/// let cfg = ServerConfig { max_clients: 4, ..ServerConfig::default() };
/// assert!(cfg.max_buffer_size <= cfg.max_client_memory);
/// assert!(cfg.max_client_memory <= cfg.max_server_memory);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest single buffer a client may allocate (at most 2^40 bytes).
    pub max_buffer_size: u64,
    /// Most bytes one client may hold in buffers and graph messages at once.
    pub max_client_memory: u64,
    /// Most bytes all clients together may hold in buffers and graph messages at once. An
    /// allocation past it (or past [`ServerConfig::max_client_memory`]) gets the protocol's
    /// failure answer (a null buffer), which our client reports as
    /// [`backend_core::BackendError::AllocationFailed`]; the connection stays open. A graph
    /// message past it is [`ServerError::MemoryCap`]: GRAPH_COMPUTE has no failure answer, so
    /// that connection is closed.
    pub max_server_memory: u64,
    /// Largest SET_TENSOR data payload.
    pub max_set_size: u64,
    /// Most nodes in one graph.
    pub max_graph_nodes: u32,
    /// Most tensors in one graph.
    pub max_graph_tensors: u32,
    /// Most clients served at once; more are refused.
    pub max_clients: usize,
    /// Close a connection that sends nothing for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_buffer_size: 16 << 30,
            max_client_memory: 64 << 30,
            max_server_memory: 64 << 30,
            max_set_size: 1 << 30,
            max_graph_nodes: 1 << 16,
            max_graph_tensors: 1 << 18,
            max_clients: 16,
            idle_timeout: None,
        }
    }
}

/// Why a message was refused. The connection that sent it is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The command byte is not a protocol command.
    #[error("unknown command {0}")]
    UnknownCommand(u8),
    /// The first command was not HELLO, or HELLO came twice.
    #[error("{0}")]
    Handshake(&'static str),
    /// The payload size is wrong for the command.
    #[error("{cmd}: payload of {got} bytes, expected {expected}")]
    BadSize {
        /// Command.
        cmd: Command,
        /// Expected (exact or maximum).
        expected: u64,
        /// Announced.
        got: u64,
    },
    /// The bytes do not decode.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A device index other than 0.
    #[error("no device {0}")]
    BadDevice(u32),
    /// A buffer handle this connection does not own.
    #[error("unknown buffer {0:#x}")]
    UnknownBuffer(u64),
    /// A tensor description is invalid.
    #[error("bad tensor {id:#x}: {why}")]
    BadTensor {
        /// The tensor's wire id.
        id: u64,
        /// What is wrong.
        why: String,
    },
    /// A byte range leaves its buffer or tensor.
    #[error("{what}: range out of bounds")]
    OutOfBounds {
        /// Which request.
        what: &'static str,
    },
    /// The graph is malformed.
    #[error("bad graph: {0}")]
    BadGraph(String),
    /// The local backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Holding a message would take the client or the server past its memory cap.
    #[error("{what}: {need} more bytes would pass the {cap} byte {whose} memory cap")]
    MemoryCap {
        /// Which request.
        what: &'static str,
        /// Bytes the request needs.
        need: u64,
        /// The cap it would pass.
        cap: u64,
        /// `"client"` or `"server"`.
        whose: &'static str,
    },
}

/// Graph messages of at most this many bytes are not charged to the memory accounts: they are
/// part of a connection's fixed overhead (like its thread and its streaming chunk), so a
/// client holding the cap with buffers does not stop the others from computing small graphs.
/// At most [`ServerConfig::max_clients`] such messages (and the graphs rebuilt from them) are
/// held at once. Larger ones are charged before their payload is read.
pub const GRAPH_FREE_BYTES: u64 = 64 << 10;

/// What a graph message of `size` payload bytes may make the server hold while it is read and
/// decoded: the payload itself plus the decoded message (node ids as they are; each 296-byte
/// wire tensor becomes one [`RpcTensor`]; the bound takes the worst split between the two).
fn graph_message_cost(size: u64) -> u64 {
    let per_tensor = std::mem::size_of::<RpcTensor>() as u64;
    size.saturating_add(size)
        .saturating_add((size / RPC_TENSOR_SIZE as u64).saturating_mul(per_tensor))
}

/// What the graph rebuilt from a decoded message holds while it is computed and stored for
/// GRAPH_RECOMPUTE: one [`graph::Tensor`] and one id-map entry (with the map's slack) per
/// tensor, one node id per node, plus room for per-node work lists of the compute.
fn graph_build_cost(n_nodes: usize, n_tensors: usize) -> u64 {
    let per_tensor = std::mem::size_of::<graph::Tensor>() as u64 + 64;
    let per_node = std::mem::size_of::<TensorId>() as u64 + 64;
    (n_tensors as u64)
        .saturating_mul(per_tensor)
        .saturating_add((n_nodes as u64).saturating_mul(per_node))
}

/// The bytes of a fixed-size answer.
fn answer<P: FixedPayload>(p: P) -> Option<Vec<u8>> {
    Some(p.to_bytes())
}

fn bad_tensor(id: u64, why: impl Into<String>) -> ServerError {
    ServerError::BadTensor {
        id,
        why: why.into(),
    }
}

/// Makes the backend a new connection computes with.
pub type BackendFactory = Arc<dyn Fn() -> backend_core::Result<Backend> + Send + Sync>;

/// A server in front of one device. Cheap to share (`Arc`).
pub struct Server {
    device: Device,
    factory: BackendFactory,
    config: ServerConfig,
    active: AtomicUsize,
    next_conn: AtomicU64,
    conns: StdMutex<HashMap<u64, TcpStream>>,
    /// Bytes held in buffers by all sessions (the [`ServerConfig::max_server_memory`] account).
    held: AtomicU64,
    /// Sessions dropped so far.
    ended: AtomicU64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("device", &self.device)
            .field("config", &self.config)
            .finish()
    }
}

/// A running server on a background thread; dropping it stops accepting and closes every
/// client connection.
///
/// ```no_run
/// use backend_rpc_server::{Server, ServerConfig};
/// # fn dev() -> backend_core::Device { unimplemented!() }
/// let device = dev();
/// let d2 = device.clone();
/// let server = Server::new(device, std::sync::Arc::new(move || d2.init_backend("")), ServerConfig::default());
/// let handle = server.spawn("127.0.0.1:0")?;
/// println!("serving on {}", handle.endpoint());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ServerHandle {
    server: Arc<Server>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    /// `HOST:PORT` for clients.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }
    /// Abruptly close every client connection (as if the server had died), keep listening.
    pub fn drop_connections(&self) {
        self.server.drop_connections();
    }
    /// Stop accepting, close every connection, and wait for the accept loop.
    pub fn shutdown(mut self) {
        self.stop_now();
    }
    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        self.server.drop_connections();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl Server {
    /// A server for `device`; each connection computes on a backend from `factory`.
    pub fn new(device: Device, factory: BackendFactory, config: ServerConfig) -> Arc<Self> {
        Arc::new(Server {
            device,
            factory,
            config,
            active: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
            conns: StdMutex::new(HashMap::new()),
            held: AtomicU64::new(0),
            ended: AtomicU64::new(0),
        })
    }

    /// The limits.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Bytes all sessions hold in buffers now (returns to 0 when every client is gone).
    ///
    /// ```
    /// # use backend_rpc_server::{Server, ServerConfig};
    /// let dev = backend_cpu::cpu_device();
    /// let server = Server::new(dev, std::sync::Arc::new(backend_cpu::init), ServerConfig::default());
    /// assert_eq!(server.held_bytes(), 0);
    /// ```
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Sessions that have ended (clients gone, each with all it held freed). A process can
    /// watch it to hand freed memory back to the OS, as the `rpc-server` binary does.
    pub fn sessions_ended(&self) -> u64 {
        self.ended.load(Ordering::SeqCst)
    }

    /// Take `size` bytes from the server-wide account; `false` (nothing taken) past the cap.
    fn reserve(&self, size: u64) -> bool {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                h.checked_add(size)
                    .filter(|&t| t <= self.config.max_server_memory)
            })
            .is_ok()
    }

    /// Give back `size` bytes taken by [`Server::reserve`].
    fn release(&self, size: u64) {
        // Saturating: a release never exceeds what its session reserved, so this only guards
        // against our own accounting bug turning into a wrap-around.
        let _ = self
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                Some(h.saturating_sub(size))
            });
    }

    /// Take `size` bytes as a [`Reservation`], given back when it is dropped.
    fn reserve_guard(self: &Arc<Self>, size: u64) -> Option<Reservation> {
        self.reserve(size).then(|| Reservation {
            server: self.clone(),
            bytes: size,
        })
    }

    /// A fresh per-connection state machine (what each accepted client gets).
    pub fn session(self: &Arc<Self>) -> Session {
        Session {
            server: self.clone(),
            hello: false,
            buffers: HashMap::new(),
            next_handle: 1,
            allocated: 0,
            backend: None,
            stored: None,
            message: None,
        }
    }

    /// Bind `addr` and serve on a background thread.
    pub fn spawn(self: &Arc<Self>, addr: &str) -> io::Result<ServerHandle> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (server, stop2) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("rpc-accept".into())
            .spawn(move || server.accept_loop(listener, &stop2))?;
        Ok(ServerHandle {
            server: self.clone(),
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// Serve on `listener` until the process ends (what the binary does).
    pub fn serve(self: &Arc<Self>, listener: TcpListener) {
        self.accept_loop(listener, &AtomicBool::new(false));
    }

    fn drop_connections(&self) {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for s in conns.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn accept_loop(self: &Arc<Self>, listener: TcpListener, stop: &AtomicBool) {
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "?".to_owned(), |a| a.to_string());
            if self.active.load(Ordering::SeqCst) >= self.config.max_clients {
                tracing::warn!(%peer, "refusing client: too many connections");
                continue;
            }
            self.active.fetch_add(1, Ordering::SeqCst);
            let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
            if let Ok(clone) = stream.try_clone() {
                self.conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, clone);
            }
            let server = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rpc-client-{id}"))
                .spawn(move || {
                    // Gives the slot back however the thread ends (a panic would be our bug,
                    // but must not leak a slot of `max_clients`).
                    let _slot = Slot(server.clone(), id);
                    tracing::info!(%peer, "client connected");
                    server.serve_connection(stream, &peer);
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot spawn a client thread");
                self.active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn serve_connection(self: &Arc<Self>, mut stream: TcpStream, peer: &str) {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(self.config.idle_timeout);
        // A client that stops reading its answers is cut after the same time.
        let _ = stream.set_write_timeout(self.config.idle_timeout);
        let mut session = self.session();
        let why = loop {
            let mut head = [0u8; 9];
            match stream.read_exact(&mut head[..1]) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break None,
                Err(e) => break Some(format!("read: {e}")),
            }
            if let Err(e) = stream.read_exact(&mut head[1..]) {
                break Some(format!("read: {e}"));
            }
            let size = u64::from_le_bytes(head[1..9].try_into().unwrap_or_default());
            let cmd = match session.admit(head[0], size) {
                Ok(c) => c,
                Err(e) => break Some(e.to_string()),
            };
            // Bulk data goes between the socket and the buffer in chunks, so what a client
            // makes the server hold besides its buffers stays small whatever it sends or asks.
            let streamed = match cmd {
                Command::SetTensor if size >= SET_TENSOR_FIXED as u64 => Some(stream_set(
                    &session,
                    &mut stream,
                    size - SET_TENSOR_FIXED as u64,
                )),
                Command::GetTensor => Some(stream_get(&session, &mut stream)),
                _ => None,
            };
            match streamed {
                Some(Ok(())) => continue,
                Some(Err(why)) => break Some(why),
                None => {}
            }
            let mut payload = Vec::new();
            // A charged graph message gets its whole (charged) room at once: the pages are only
            // touched as bytes arrive, and read_to_end then never doubles the capacity.
            if session.message.is_some() && payload.try_reserve_exact(size as usize).is_err() {
                break Some(format!("cannot allocate a {size} byte message"));
            }
            match (&mut stream).take(size).read_to_end(&mut payload) {
                Ok(n) if n as u64 == size => {}
                Ok(_) => break Some("connection closed inside a message".into()),
                Err(e) => break Some(format!("read: {e}")),
            }
            match session.handle(head[0], &payload) {
                Ok(None) => {}
                Ok(Some(resp)) => {
                    let r = stream
                        .write_all(&(resp.len() as u64).to_le_bytes())
                        .and_then(|()| stream.write_all(&resp));
                    if let Err(e) = r {
                        break Some(format!("write: {e}"));
                    }
                }
                Err(e) => break Some(e.to_string()),
            }
        };
        match why {
            None => tracing::info!(%peer, "client disconnected"),
            Some(why) => tracing::warn!(%peer, %why, "closing client connection"),
        }
    }
}

/// Bytes taken from the server account for something a session holds other than a buffer (a
/// graph message being handled, a stored graph); given back on drop, however the holder ends.
struct Reservation {
    server: Arc<Server>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.server.release(self.bytes);
    }
}

/// A client's place in [`Server::accept_loop`]'s bookkeeping, given back on drop.
struct Slot(Arc<Server>, u64);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes moved per step between a socket and a buffer (SET_TENSOR, GET_TENSOR).
const STREAM_CHUNK: usize = 1 << 20;

/// SET_TENSOR from the socket: the fixed part, checked, then `len` data bytes straight into
/// the buffer, chunk by chunk.
fn stream_set(session: &Session, stream: &mut TcpStream, len: u64) -> Result<(), String> {
    let mut fixed = [0u8; SetTensorRequest::SIZE];
    read_message(stream, &mut fixed)?;
    let req = SetTensorRequest::decode(&fixed).map_err(|e| e.to_string())?;
    let (buf, pos) = session.set_target(&req, len).map_err(|e| e.to_string())?;
    // `len` fits the buffer (checked by `set_target`), so it fits usize and `pos + done` does.
    let len = len as usize;
    let mut staging = vec![0u8; len.min(STREAM_CHUNK)];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(STREAM_CHUNK);
        read_message(stream, &mut staging[..n])?;
        write_bytes(&buf, pos + done, &staging[..n]).map_err(|e| e.to_string())?;
        done += n;
    }
    Ok(())
}

/// GET_TENSOR to the socket: the answer goes out chunk by chunk from the buffer.
fn stream_get(session: &Session, stream: &mut TcpStream) -> Result<(), String> {
    let mut bytes = [0u8; GetTensorRequest::SIZE];
    read_message(stream, &mut bytes)?;
    let req = GetTensorRequest::decode(&bytes).map_err(|e| e.to_string())?;
    let (buf, pos, len) = session.get_source(&req).map_err(|e| e.to_string())?;
    let write = |s: &mut TcpStream, b: &[u8]| s.write_all(b).map_err(|e| format!("write: {e}"));
    write(stream, &(len as u64).to_le_bytes())?;
    let mut staging = vec![0u8; len.min(STREAM_CHUNK)];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(STREAM_CHUNK);
        read_bytes(&buf, pos + done, &mut staging[..n]).map_err(|e| e.to_string())?;
        write(stream, &staging[..n])?;
        done += n;
    }
    Ok(())
}

/// Fill `out` from the rest of a message.
fn read_message(stream: &mut TcpStream, out: &mut [u8]) -> Result<(), String> {
    stream.read_exact(out).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => "connection closed inside a message".to_owned(),
        _ => format!("read: {e}"),
    })
}

/// One remote buffer of a session.
struct SessionBuffer {
    buffer: Buffer,
    base: u64,
    size: u64,
}

/// A graph kept for GRAPH_RECOMPUTE.
struct StoredGraph {
    ctx: Context,
    nodes: Vec<TensorId>,
    /// Its charge to the memory accounts (`None` for a graph from a message of at most
    /// [`GRAPH_FREE_BYTES`]).
    charge: Option<Reservation>,
}

/// A tensor resolved against the session's buffers: where its bytes are.
struct Located {
    handle: u64,
    /// Offset of the first byte in the buffer.
    offset: u64,
    nbytes: u64,
}

/// Handles are small integers; each buffer gets a synthetic base address `handle << 40`, so
/// data addresses never reveal server memory and every buffer has room for 2^40 bytes.
const BASE_SHIFT: u32 = 40;
const MAX_HANDLE: u64 = (1 << (64 - BASE_SHIFT)) - 1;
const COPY_CHUNK: usize = 16 << 20;

/// The per-connection protocol state: handshake, buffers, stored graph, backend.
///
/// Feed it what a client sends: [`Session::check_header`] with the command byte and the
/// announced size, then [`Session::handle`] with the payload. Any error means "close the
/// connection"; the session is then dropped, which frees its buffers.
pub struct Session {
    server: Arc<Server>,
    hello: bool,
    buffers: HashMap<u64, SessionBuffer>,
    next_handle: u64,
    allocated: u64,
    backend: Option<Backend>,
    stored: Option<StoredGraph>,
    /// The charge for the graph message being read and handled, with the payload size it was
    /// taken for (see [`Session::admit`]).
    message: Option<(u64, Reservation)>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("hello", &self.hello)
            .field("buffers", &self.buffers.len())
            .field("allocated", &self.allocated)
            .finish()
    }
}

/// `ggml_nbytes` on wire fields, checked: `None` on overflow.
fn wire_nbytes(ty: ElementType, ne: [u32; 4], nb: [u32; 4]) -> Option<u64> {
    if ne.contains(&0) {
        return Some(0);
    }
    let blck = ty.block_size() as u64;
    // `ne` has no zero (above), so `ne[d] - 1` below cannot underflow; `blck` is not zero for
    // any type `type_from_wire` returns.
    let mut bytes = if blck == 1 {
        ty.type_size() as u64
    } else {
        u64::from(ne[0]).checked_mul(u64::from(nb[0]))? / blck
    };
    let start = usize::from(blck != 1);
    for d in start..4 {
        let term = u64::from(ne[d] - 1).checked_mul(u64::from(nb[d]))?;
        bytes = bytes.checked_add(term)?;
    }
    Some(bytes)
}

impl Drop for Session {
    fn drop(&mut self) {
        // The buffers themselves go with `self.buffers`; give their bytes back to the server.
        self.server.release(self.allocated);
        self.server.ended.fetch_add(1, Ordering::SeqCst);
    }
}

impl Session {
    /// Check a request header before its payload is read: known command, HELLO first and
    /// once, and a payload size the command allows.
    pub fn check_header(&self, cmd: u8, size: u64) -> Result<Command, ServerError> {
        let c = Command::from_u8(cmd).ok_or(ServerError::UnknownCommand(cmd))?;
        if !self.hello && c != Command::Hello {
            return Err(ServerError::Handshake("the first command must be HELLO"));
        }
        if self.hello && c == Command::Hello {
            return Err(ServerError::Handshake("second HELLO"));
        }
        let cfg = &self.server.config;
        match c.fixed_request_size() {
            Some(n) if n as u64 != size => Err(ServerError::BadSize {
                cmd: c,
                expected: n as u64,
                got: size,
            }),
            Some(_) => Ok(c),
            None => {
                let max = match c {
                    Command::SetTensor => {
                        (SET_TENSOR_FIXED as u64).saturating_add(cfg.max_set_size)
                    }
                    _ => GraphMessage::encoded_size(
                        cfg.max_graph_nodes as usize,
                        cfg.max_graph_tensors as usize,
                    ) as u64,
                };
                if size > max {
                    Err(ServerError::BadSize {
                        cmd: c,
                        expected: max,
                        got: size,
                    })
                } else {
                    Ok(c)
                }
            }
        }
    }

    /// [`Session::check_header`], and for a GRAPH_COMPUTE of more than [`GRAPH_FREE_BYTES`]
    /// also charge what reading and decoding it may hold to the client's and the server's
    /// memory accounts, before any of the payload is read ([`ServerError::MemoryCap`] past a
    /// cap). [`Session::handle`] gives the charge back when it is done with the message; it
    /// admits the message itself when this was not called first.
    pub fn admit(&mut self, cmd: u8, size: u64) -> Result<Command, ServerError> {
        let c = self.check_header(cmd, size)?;
        if c == Command::GraphCompute {
            // A new graph replaces the stored one (as in ggml), so that one's charge goes first.
            self.stored = None;
            self.message = None;
            if size > GRAPH_FREE_BYTES {
                let charge = self.charge("GRAPH_COMPUTE", graph_message_cost(size), 0)?;
                self.message = Some((size, charge));
            }
        }
        Ok(c)
    }

    /// Bytes this client holds in its accounts: buffers, stored graph, message being handled.
    fn held(&self) -> u64 {
        let graph = self.stored.as_ref().and_then(|g| g.charge.as_ref());
        [graph, self.message.as_ref().map(|(_, r)| r)]
            .into_iter()
            .flatten()
            .fold(self.allocated, |t, r| t.saturating_add(r.bytes))
    }

    /// Take `need` bytes from the client's cap (which already holds [`Session::held`] plus
    /// `also_held`) and from the server's.
    fn charge(
        &self,
        what: &'static str,
        need: u64,
        also_held: u64,
    ) -> Result<Reservation, ServerError> {
        let cfg = &self.server.config;
        let client = self.held().saturating_add(also_held);
        if client
            .checked_add(need)
            .is_none_or(|t| t > cfg.max_client_memory)
        {
            return Err(ServerError::MemoryCap {
                what,
                need,
                cap: cfg.max_client_memory,
                whose: "client",
            });
        }
        self.server
            .reserve_guard(need)
            .ok_or(ServerError::MemoryCap {
                what,
                need,
                cap: cfg.max_server_memory,
                whose: "server",
            })
    }

    /// Handle one complete request; `Ok(Some(bytes))` is the response payload to send.
    pub fn handle(&mut self, cmd: u8, payload: &[u8]) -> Result<Option<Vec<u8>>, ServerError> {
        let c = self.check_header(cmd, payload.len() as u64)?;
        if c != Command::GraphCompute {
            // A charge is only for the GRAPH_COMPUTE it was admitted for.
            self.message = None;
        }
        let out = match c {
            Command::Hello => {
                // Our transport has no capabilities to offer: the client's are read and
                // answered with none.
                HelloRequest::decode(payload)?;
                self.hello = true;
                answer(HelloResponse {
                    major: PROTO_MAJOR,
                    minor: PROTO_MINOR,
                    patch: PROTO_PATCH,
                    caps: [0; _],
                })
            }
            Command::DeviceCount => answer(DeviceCountResponse { count: 1 }),
            Command::GetAlignment => {
                self.device(GetAlignmentRequest::decode(payload)?.device)?;
                let a = self.server.device.buffer_type().alignment() as u64;
                answer(GetAlignmentResponse { alignment: a })
            }
            Command::GetMaxSize => {
                self.device(GetMaxSizeRequest::decode(payload)?.device)?;
                let m = (self.server.device.buffer_type().max_size() as u64).min(self.max_buffer());
                answer(GetMaxSizeResponse { max_size: m })
            }
            Command::GetDeviceMemory => {
                self.device(GetDeviceMemoryRequest::decode(payload)?.device)?;
                let (free, total) = self.server.device.memory();
                answer(GetDeviceMemoryResponse {
                    free: free as u64,
                    total: total as u64,
                })
            }
            Command::AllocBuffer => {
                let req = AllocBufferRequest::decode(payload)?;
                self.device(req.device)?;
                let (remote_ptr, remote_size) = self.alloc(req.size);
                answer(AllocBufferResponse {
                    remote_ptr,
                    remote_size,
                })
            }
            Command::BufferGetBase => {
                let h = BufferGetBaseRequest::decode(payload)?.remote_ptr;
                let b = self.buffer(h)?;
                answer(BufferGetBaseResponse { base_ptr: b.base })
            }
            Command::FreeBuffer => {
                let h = FreeBufferRequest::decode(payload)?.remote_ptr;
                let b = self
                    .buffers
                    .remove(&h)
                    .ok_or(ServerError::UnknownBuffer(h))?;
                // Cannot underflow: `allocated` is the sum of the sizes in `buffers`.
                self.allocated -= b.size;
                self.server.release(b.size);
                // ggml drops its stored graph on any free; so do we (it may point into b).
                self.stored = None;
                None
            }
            Command::BufferClear => {
                let req = BufferClearRequest::decode(payload)?;
                self.buffer(req.remote_ptr)?.buffer.clear(req.value)?;
                None
            }
            Command::SetTensor => {
                let (req, data) = SetTensorRequest::split(payload)?;
                let (buf, pos) = self.set_target(&req, data.len() as u64)?;
                write_bytes(&buf, pos, data)?;
                None
            }
            Command::SetTensorHash => {
                let req = SetTensorHashRequest::decode(payload)?;
                self.locate(&req.tensor)?;
                // No cache: always ask for the data.
                answer(SetTensorHashResponse { found: false })
            }
            Command::GetTensor => {
                let req = GetTensorRequest::decode(payload)?;
                let (buf, pos, len) = self.get_source(&req)?;
                let mut out = vec![0u8; len];
                read_bytes(&buf, pos, &mut out)?;
                Some(out)
            }
            Command::MemsetTensor => {
                let MemsetTensorRequest {
                    tensor: t,
                    offset,
                    size,
                    value,
                } = MemsetTensorRequest::decode(payload)?;
                let loc = self.locate(&t)?;
                if offset.checked_add(size).is_none_or(|e| e > loc.nbytes) {
                    return Err(ServerError::OutOfBounds {
                        what: "MEMSET_TENSOR",
                    });
                }
                let pos = self.range_in_buffer(&loc, offset, size, "MEMSET_TENSOR")?;
                memset_bytes(&self.buffer(loc.handle)?.buffer, pos, size as usize, value)?;
                None
            }
            Command::CopyTensor => {
                let CopyTensorRequest { src, dst } = CopyTensorRequest::decode(payload)?;
                let ls = self.locate(&src)?;
                let ld = self.locate(&dst)?;
                let dpos = self.range_in_buffer(&ld, 0, ls.nbytes, "COPY_TENSOR")?;
                let spos = ls.offset as usize;
                let (sb, db) = (
                    self.buffer(ls.handle)?.buffer.clone(),
                    self.buffer(ld.handle)?.buffer.clone(),
                );
                let mut staging = vec![0u8; (ls.nbytes as usize).min(COPY_CHUNK)];
                let mut done = 0usize;
                while done < ls.nbytes as usize {
                    let n = (ls.nbytes as usize - done).min(COPY_CHUNK);
                    read_bytes(&sb, spos + done, &mut staging[..n])?;
                    write_bytes(&db, dpos + done, &staging[..n])?;
                    done += n;
                }
                answer(CopyTensorResponse { copied: true })
            }
            Command::InitTensor => {
                let t = InitTensorRequest::decode(payload)?.tensor;
                if t.buffer != 0 {
                    self.locate(&t)?;
                }
                None
            }
            Command::GetAllocSize => {
                let req = GetAllocSizeRequest::decode(payload)?;
                self.device(req.device)?;
                let t = req.tensor;
                let (ty, nbytes) = check_layout(&t)?;
                let ne = t.ne.map(i64::from);
                let mut ctx = Context::new();
                let leaf = ctx
                    .new_tensor(ty, &ne)
                    .map_err(|e| bad_tensor(t.id, e.to_string()))?;
                let size =
                    (self.server.device.buffer_type().alloc_size(&ctx[leaf]) as u64).max(nbytes);
                answer(GetAllocSizeResponse { alloc_size: size })
            }
            Command::GraphCompute => {
                // Admitted by the caller for this very size, or admitted here.
                let size = payload.len() as u64;
                if self.message.as_ref().is_none_or(|&(s, _)| s != size) {
                    self.admit(cmd, size)?;
                }
                // Given back when this arm ends, however it ends. A new graph replaces the
                // stored one before it is checked (`admit` dropped it).
                let message = self.message.take().map(|(_, r)| r);
                let cfg = &self.server.config;
                let msg =
                    GraphMessage::decode(payload, cfg.max_graph_nodes, cfg.max_graph_tensors)?;
                self.device(msg.device)?;
                let charge = match &message {
                    Some(m) => Some(self.charge(
                        "GRAPH_COMPUTE",
                        graph_build_cost(msg.nodes.len(), msg.tensors.len()),
                        m.bytes,
                    )?),
                    None => None,
                };
                let mut g = self.build_graph(&msg)?;
                g.charge = charge;
                self.compute(&g)?;
                self.stored = Some(g);
                None
            }
            Command::GraphRecompute => {
                self.device(GraphRecomputeRequest::decode(payload)?.device)?;
                let g = self
                    .stored
                    .take()
                    .ok_or_else(|| ServerError::BadGraph("no stored graph".into()))?;
                let res = self.compute(&g);
                self.stored = Some(g);
                res?;
                None
            }
        };
        Ok(out)
    }

    /// Where SET_TENSOR's `len` data bytes go, from its fixed part (tensor, cache flag,
    /// offset): the buffer and the position in it, range checked.
    fn set_target(&self, req: &SetTensorRequest, len: u64) -> Result<(Buffer, usize), ServerError> {
        let loc = self.locate(&req.tensor)?;
        let pos = self.range_in_buffer(&loc, req.offset, len, "SET_TENSOR")?;
        Ok((self.buffer(loc.handle)?.buffer.clone(), pos))
    }

    /// What GET_TENSOR reads: the buffer, the position in it and the length, range checked
    /// (so the length is at most the buffer's size).
    fn get_source(&self, req: &GetTensorRequest) -> Result<(Buffer, usize, usize), ServerError> {
        let size = req.size;
        let loc = self.locate(&req.tensor)?;
        let pos = self.range_in_buffer(&loc, req.offset, size, "GET_TENSOR")?;
        // `size` lies inside a buffer of at most 2^40 bytes.
        Ok((self.buffer(loc.handle)?.buffer.clone(), pos, size as usize))
    }

    fn max_buffer(&self) -> u64 {
        self.server
            .config
            .max_buffer_size
            .min((1 << BASE_SHIFT) - 1)
    }

    fn device(&self, d: u32) -> Result<(), ServerError> {
        if d == 0 {
            Ok(())
        } else {
            Err(ServerError::BadDevice(d))
        }
    }

    fn buffer(&self, h: u64) -> Result<&SessionBuffer, ServerError> {
        self.buffers.get(&h).ok_or(ServerError::UnknownBuffer(h))
    }

    /// Allocate; `(0, 0)` when refused (the protocol's failure answer, not an error).
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let cfg = &self.server.config;
        if size > self.max_buffer()
            || self
                .held()
                .checked_add(size)
                .is_none_or(|t| t > cfg.max_client_memory)
            || self.next_handle > MAX_HANDLE
        {
            tracing::warn!(size, "refusing allocation over the client's limits");
            return (0, 0);
        }
        if !self.server.reserve(size) {
            tracing::warn!(
                size,
                held = self.server.held_bytes(),
                cap = cfg.max_server_memory,
                "refusing allocation over the server's memory cap"
            );
            return (0, 0);
        }
        // `size` <= max_buffer() < 2^40 fits usize on the 64-bit targets we build for.
        let buffer = match self.server.device.buffer_type().alloc_buffer(size as usize) {
            Ok(b) => b,
            Err(e) => {
                self.server.release(size);
                tracing::warn!(size, error = %e, "allocation failed");
                return (0, 0);
            }
        };
        // No overflow: `next_handle <= MAX_HANDLE` and `held() + size <= max_client_memory`
        // (`held() >= allocated`) were checked above.
        let h = self.next_handle;
        self.next_handle += 1;
        self.allocated += size;
        self.buffers.insert(
            h,
            SessionBuffer {
                buffer,
                base: h << BASE_SHIFT,
                size,
            },
        );
        (h, size)
    }

    /// Where `t`'s bytes are: its buffer must belong to this session and
    /// `[data, data + nbytes)` must lie inside it.
    fn locate(&self, t: &RpcTensor) -> Result<Located, ServerError> {
        let (_, nbytes) = check_layout(t)?;
        let b = self
            .buffers
            .get(&t.buffer)
            .ok_or(ServerError::UnknownBuffer(t.buffer))?;
        let offset = t
            .data
            .checked_sub(b.base)
            .ok_or_else(|| bad_tensor(t.id, "data before its buffer"))?;
        if offset.checked_add(nbytes).is_none_or(|e| e > b.size) {
            return Err(bad_tensor(t.id, "data outside its buffer"));
        }
        Ok(Located {
            handle: t.buffer,
            offset,
            nbytes,
        })
    }

    /// The buffer position of `[offset, offset + size)` past the tensor start, inside the
    /// buffer (ggml checks the buffer, not the tensor, for set/get).
    fn range_in_buffer(
        &self,
        loc: &Located,
        offset: u64,
        size: u64,
        what: &'static str,
    ) -> Result<usize, ServerError> {
        let b = self.buffer(loc.handle)?;
        let start = loc
            .offset
            .checked_add(offset)
            .ok_or(ServerError::OutOfBounds { what })?;
        if start.checked_add(size).is_none_or(|e| e > b.size) {
            return Err(ServerError::OutOfBounds { what });
        }
        Ok(start as usize)
    }

    fn build_graph(&self, msg: &GraphMessage) -> Result<StoredGraph, ServerError> {
        let mut ctx = Context::with_capacity(msg.tensors.len());
        let mut ids: HashMap<u64, TensorId> = HashMap::with_capacity(msg.tensors.len());
        for w in &msg.tensors {
            if w.id == 0 {
                return Err(ServerError::BadGraph("tensor with id 0".into()));
            }
            if ids.contains_key(&w.id) {
                return Err(ServerError::BadGraph(format!(
                    "tensor {:#x} sent twice",
                    w.id
                )));
            }
            let id = self.build_tensor(&mut ctx, &ids, w)?;
            ids.insert(w.id, id);
        }
        let mut nodes = Vec::with_capacity(msg.nodes.len());
        for &n in &msg.nodes {
            if n == 0 {
                continue;
            }
            let id = *ids
                .get(&n)
                .ok_or_else(|| ServerError::BadGraph(format!("node {n:#x} not in the list")))?;
            nodes.push(id);
        }
        Ok(StoredGraph {
            ctx,
            nodes,
            charge: None,
        })
    }

    /// Rebuild one wire tensor with our constructors and check it came out as sent.
    fn build_tensor(
        &self,
        ctx: &mut Context,
        ids: &HashMap<u64, TensorId>,
        w: &RpcTensor,
    ) -> Result<TensorId, ServerError> {
        let (ty, _) = check_layout(w)?;
        let ne = w.ne.map(i64::from);
        let lookup = |wid: u64| -> Result<Option<TensorId>, ServerError> {
            if wid == 0 {
                return Ok(None);
            }
            ids.get(&wid)
                .copied()
                .map(Some)
                .ok_or_else(|| bad_tensor(w.id, format!("refers to {wid:#x}, not sent before it")))
        };
        let mut srcs = [None; 10];
        for (slot, &s) in w.src.iter().enumerate() {
            srcs[slot] = lookup(s)?;
        }
        let view_src = lookup(w.view_src)?;
        let op = op_from_wire(w.op, w.op_params[0])
            .ok_or_else(|| bad_tensor(w.id, format!("op {} is not supported", w.op)))?;
        let p = graph::OpParams(w.op_params);
        let need = |slot: usize| {
            srcs[slot].ok_or_else(|| bad_tensor(w.id, format!("missing source {slot}")))
        };
        let inplace = view_src.is_some() && !op.is_view_op() && op != Op::Cpy;
        let ge = |e: GraphError| bad_tensor(w.id, e.to_string());
        let id = match op {
            Op::None => {
                if view_src.is_some() {
                    return Err(bad_tensor(w.id, "a leaf cannot be a view"));
                }
                ctx.new_tensor(ty, &ne).map_err(ge)?
            }
            Op::Dup => ctx.dup(need(0)?).map_err(ge)?,
            Op::Add | Op::Sub | Op::Mul | Op::Div => {
                let (a, b) = (need(0)?, need(1)?);
                match (op, inplace) {
                    (Op::Add, false) => ctx.add(a, b),
                    (Op::Add, true) => ctx.add_inplace(a, b),
                    (Op::Sub, false) => ctx.sub(a, b),
                    (Op::Sub, true) => ctx.sub_inplace(a, b),
                    (Op::Mul, false) => ctx.mul(a, b),
                    (Op::Mul, true) => ctx.mul_inplace(a, b),
                    (_, false) => ctx.div(a, b),
                    (_, true) => ctx.div_inplace(a, b),
                }
                .map_err(ge)?
            }
            Op::Sqr if inplace => ctx.sqr_inplace(need(0)?).map_err(ge)?,
            Op::Sqr => ctx.sqr(need(0)?).map_err(ge)?,
            Op::Sqrt if inplace => ctx.sqrt_inplace(need(0)?).map_err(ge)?,
            Op::Sqrt => ctx.sqrt(need(0)?).map_err(ge)?,
            Op::Norm if inplace => ctx.norm_inplace(need(0)?, p.f32(0)).map_err(ge)?,
            Op::Norm => ctx.norm(need(0)?, p.f32(0)).map_err(ge)?,
            Op::RmsNorm if inplace => ctx.rms_norm_inplace(need(0)?, p.f32(0)).map_err(ge)?,
            Op::RmsNorm => ctx.rms_norm(need(0)?, p.f32(0)).map_err(ge)?,
            Op::MulMat => ctx.mul_mat(need(0)?, need(1)?).map_err(ge)?,
            Op::Scale => {
                if p.f32(1) != 0.0 {
                    return Err(bad_tensor(w.id, "SCALE with a bias is not supported"));
                }
                if inplace {
                    ctx.scale_inplace(need(0)?, p.f32(0)).map_err(ge)?
                } else {
                    ctx.scale(need(0)?, p.f32(0)).map_err(ge)?
                }
            }
            Op::Cpy => ctx.cpy(need(0)?, need(1)?).map_err(ge)?,
            Op::Cont => {
                let a = need(0)?;
                // `a` came from `ids`, which holds only tensors made in this `ctx`.
                if ctx[a].ne() == ne {
                    ctx.cont(a).map_err(ge)?
                } else {
                    ctx.cont_shape(a, &ne).map_err(ge)?
                }
            }
            Op::Reshape => ctx.reshape(need(0)?, &ne).map_err(ge)?,
            Op::View => {
                let nb = w.nb.map(|v| v as usize);
                let offs =
                    usize::try_from(p.u64(0)).map_err(|_| bad_tensor(w.id, "view offset"))?;
                ctx.view(need(0)?, &ne, Some(nb), offs).map_err(ge)?
            }
            Op::Permute => ctx
                .permute(need(0)?, [p.i32(0), p.i32(1), p.i32(2), p.i32(3)])
                .map_err(ge)?,
            Op::Transpose => ctx.transpose(need(0)?).map_err(ge)?,
            Op::GetRows => ctx.get_rows(need(0)?, need(1)?).map_err(ge)?,
            Op::SoftMax => {
                let (a, mask) = (need(0)?, srcs[1]);
                if inplace {
                    ctx.soft_max_ext_inplace(a, mask, p.f32(0), p.f32(1))
                } else {
                    ctx.soft_max_ext(a, mask, p.f32(0), p.f32(1))
                }
                .map_err(ge)?
            }
            Op::Rope => {
                let mode = p.i32(2);
                if mode != graph::rope_mode::NORMAL && mode != graph::rope_mode::NEOX {
                    return Err(bad_tensor(
                        w.id,
                        format!("rope mode {mode} is not supported"),
                    ));
                }
                let rp = RopeParams {
                    n_ctx_orig: p.i32(4),
                    freq_base: p.f32(5),
                    freq_scale: p.f32(6),
                    ext_factor: p.f32(7),
                    attn_factor: p.f32(8),
                    beta_fast: p.f32(9),
                    beta_slow: p.f32(10),
                };
                ctx.rope_ext(need(0)?, need(1)?, p.i32(1), mode, rp)
                    .map_err(ge)?
            }
            Op::Unary(u) if inplace => ctx.unary_inplace(need(0)?, u).map_err(ge)?,
            Op::Unary(u) => ctx.unary(need(0)?, u).map_err(ge)?,
            other => return Err(bad_tensor(w.id, format!("op {other} is not supported"))),
        };
        // `id` was just made in `ctx` by one of the constructors above.
        let t = &ctx[id];
        let nb = w.nb.map(|v| v as usize);
        if t.ty() != ty || t.ne() != ne || t.nb() != nb {
            return Err(bad_tensor(
                w.id,
                format!(
                    "{op}: sent as {:?} {:?} {:?}, our constructor gives {} {:?} {:?}",
                    w.ty,
                    w.ne,
                    w.nb,
                    t.ty(),
                    t.ne(),
                    t.nb()
                ),
            ));
        }
        if *t.srcs() != srcs {
            return Err(bad_tensor(w.id, format!("{op}: unexpected sources")));
        }
        // Where its bytes are: a buffer of this session, range checked.
        let loc = self.locate(w)?;
        let buf = &self.buffer(loc.handle)?.buffer;
        ctx[id].set_storage(Some(buf.storage_at(loc.offset as usize)));
        ctx.set_flags(id, TensorFlags((w.flags as u32) & 0xF))
            .map_err(ge)?;
        ctx.set_name(id, &w.name_str()).map_err(ge)?;
        Ok(id)
    }

    fn compute(&mut self, g: &StoredGraph) -> Result<(), ServerError> {
        for &n in &g.nodes {
            if !self.server.device.supports_op(&g.ctx, n) {
                let op = g.ctx.get(n).map_or("?", |t| t.op().name());
                return Err(ServerError::BadGraph(format!(
                    "the device cannot compute {op} of node {n:?}"
                )));
            }
        }
        if self.backend.is_none() {
            self.backend = Some((self.server.factory)()?);
        }
        let backend = self.backend.as_ref().ok_or_else(|| {
            ServerError::Backend(BackendError::failed("rpc-server", "no backend"))
        })?;
        backend.graph_compute(&g.ctx, GraphView::new(&g.nodes, &[]))?;
        Ok(())
    }
}

/// Type and nbytes of a wire tensor: a type we have, `ne[0]` a multiple of its block size,
/// and no overflow. Strides are free here (views may be transposed); graph tensors are checked
/// against our constructors.
fn check_layout(t: &RpcTensor) -> Result<(ElementType, u64), ServerError> {
    let ty = type_from_wire(t.ty)
        .ok_or_else(|| bad_tensor(t.id, format!("type {} is not supported", t.ty)))?;
    if u64::from(t.ne[0]) % ty.block_size() as u64 != 0 {
        return Err(bad_tensor(
            t.id,
            "ne[0] is not a multiple of the block size",
        ));
    }
    let n = wire_nbytes(ty, t.ne, t.nb).ok_or_else(|| bad_tensor(t.id, "size overflows"))?;
    Ok((ty, n))
}

/// A one-row i8 tensor over `len` bytes at `pos` of `buf`, to reach the buffer through its
/// `BufferImpl` (which works on tensors).
fn byte_window(buf: &Buffer, pos: usize, len: usize) -> Result<(Context, TensorId), ServerError> {
    let mut ctx = Context::new();
    let id = ctx
        .new_tensor_1d(ElementType::I8, len as i64)
        .map_err(|e| ServerError::BadGraph(e.to_string()))?;
    ctx[id].set_storage(Some(buf.storage_at(pos)));
    Ok((ctx, id))
}

fn buffer_impl(buf: &Buffer) -> Result<&dyn backend_core::BufferImpl, ServerError> {
    buf.implementation().ok_or(ServerError::OutOfBounds {
        what: "empty buffer",
    })
}

fn write_bytes(buf: &Buffer, pos: usize, data: &[u8]) -> Result<(), ServerError> {
    if data.is_empty() {
        return Ok(());
    }
    let (ctx, id) = byte_window(buf, pos, data.len())?;
    buffer_impl(buf)?.set_tensor(&ctx[id], 0, data)?;
    Ok(())
}

fn read_bytes(buf: &Buffer, pos: usize, out: &mut [u8]) -> Result<(), ServerError> {
    if out.is_empty() {
        return Ok(());
    }
    let (ctx, id) = byte_window(buf, pos, out.len())?;
    buffer_impl(buf)?.get_tensor(&ctx[id], 0, out)?;
    Ok(())
}

fn memset_bytes(buf: &Buffer, pos: usize, len: usize, value: u8) -> Result<(), ServerError> {
    if len == 0 {
        return Ok(());
    }
    let (ctx, id) = byte_window(buf, pos, len)?;
    buffer_impl(buf)?.memset_tensor(&ctx[id], value, 0, len)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbytes_matches_ggml_rule() {
        // 64x64 f32 contiguous: 16384 bytes (vector B).
        assert_eq!(
            wire_nbytes(ElementType::F32, [64, 64, 1, 1], [4, 256, 16384, 16384]),
            Some(16384)
        );
        // rows padded to 20 bytes: 4 + (5-1)*4 + (3-1)*20 = 60
        assert_eq!(
            wire_nbytes(ElementType::F32, [5, 3, 1, 1], [4, 20, 60, 60]),
            Some(60)
        );
        // q4_0, 64 per row, 3 rows: 2 blocks of 18 bytes per row.
        assert_eq!(
            wire_nbytes(ElementType::Q4_0, [64, 3, 1, 1], [18, 36, 108, 108]),
            Some(108)
        );
        assert_eq!(
            wire_nbytes(ElementType::F32, [0, 3, 1, 1], [4, 0, 0, 0]),
            Some(0)
        );
        // 4 × (2^32-1)^2 overflows u64.
        assert_eq!(
            wire_nbytes(ElementType::F32, [u32::MAX; 4], [u32::MAX; 4]),
            None
        );
    }
}
