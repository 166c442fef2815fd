//! The client: devices, buffer types, buffers and backends whose memory and compute live on a
//! remote server speaking protocol 7.0.0 (ggml's `rpc-server` or ours).
//!
//! Why one locked socket per endpoint: the protocol has no request ids, so answers can only be
//! matched to requests by order. Every handle of an endpoint (devices, buffer types, buffers,
//! backends) shares one [`Conn`] and sends whole requests under its lock. Commands without an
//! answer are pipelined; [`Backend::synchronize`](backend_core::Backend::synchronize) sends a
//! cheap DEVICE_COUNT as a barrier, so a compute failure (the server closes the connection)
//! surfaces there as a typed error. Any I/O failure closes the socket for good: later calls
//! fail at once with [`RpcError::Closed`] instead of hanging, and timeouts bound every wait.
//!
//! Every tensor is checked before it is sent (extents and strides fit the 32-bit wire fields,
//! the op and type have protocol numbers, the data lies inside a buffer of the same server),
//! because a real ggml server aborts the whole process on some bad tensors.

use std::any::Any;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use backend_core::{
    Backend, BackendError, BackendImpl, Buffer, BufferImpl, BufferType, BufferTypeImpl,
    ComputeStatus, Device, DeviceImpl, DeviceType, GlobalRegistry, Guid, Registry, RegistryImpl,
};
use graph::{Context, GraphView, Op, Tensor, TensorId};
use parking_lot::{Mutex, RwLock};

use crate::mapping::{op_to_wire, type_to_wire};
use crate::wire::{
    AllocBufferRequest, BufferClearRequest, BufferGetBaseRequest, Command, CopyTensorRequest,
    DeviceCountRequest, FLAG_COMPUTE, FixedPayload, FreeBufferRequest, GetAlignmentRequest,
    GetAllocSizeRequest, GetDeviceMemoryRequest, GetMaxSizeRequest, GetTensorRequest, GraphMessage,
    HelloRequest, MemsetTensorRequest, NoResponse, PROTO_MAJOR, PROTO_MINOR, Payload, Request,
    RpcTensor, SetTensorRequest, WireError, put_header,
};

/// Connection settings.
///
/// ```
/// use backend_rpc::RpcConfig;
/// use std::time::Duration;
/// let cfg = RpcConfig { io_timeout: Some(Duration::from_secs(5)), ..RpcConfig::default() };
/// assert_eq!(cfg.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcConfig {
    /// Longest wait for the TCP connection.
    pub connect_timeout: Duration,
    /// Longest wait for any single read or write (`None`: wait forever). A graph compute is
    /// followed by a read, so this must exceed the longest compute.
    pub io_timeout: Option<Duration>,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// What went wrong talking to a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The endpoint is not `HOST:PORT` or does not resolve.
    #[error("invalid endpoint {endpoint:?}: {why}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        why: String,
    },
    /// The TCP connection could not be made.
    #[error("{endpoint}: cannot connect: {message}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        message: String,
    },
    /// The server speaks an incompatible protocol version.
    #[error(
        "{endpoint}: server speaks RPC protocol {major}.{minor}.{patch}; this client needs {PROTO_MAJOR}.x with minor <= {PROTO_MINOR}"
    )]
    Version {
        /// The endpoint.
        endpoint: String,
        /// Server major.
        major: u8,
        /// Server minor.
        minor: u8,
        /// Server patch.
        patch: u8,
    },
    /// A read or write did not finish in time; the connection is closed.
    #[error("{endpoint}: {cmd} timed out")]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The command in flight.
        cmd: Command,
    },
    /// The connection failed during a command; it is closed.
    #[error("{endpoint}: connection lost during {cmd}: {message}")]
    ConnectionLost {
        /// The endpoint.
        endpoint: String,
        /// The command in flight.
        cmd: Command,
        /// The OS error.
        message: String,
    },
    /// An earlier failure closed the connection.
    #[error("{endpoint}: connection closed by an earlier failure")]
    Closed {
        /// The endpoint.
        endpoint: String,
    },
    /// The server answered with an unexpected size; the connection is closed.
    #[error("{endpoint}: {cmd} answer has {got} bytes, expected {expected}")]
    BadResponse {
        /// The endpoint.
        endpoint: String,
        /// The command.
        cmd: Command,
        /// Size expected.
        expected: u64,
        /// Size announced.
        got: u64,
    },
    /// The server could not allocate a buffer.
    #[error("{endpoint}: server failed to allocate {size} bytes")]
    AllocFailed {
        /// The endpoint.
        endpoint: String,
        /// Requested size.
        size: usize,
    },
    /// The server's answer has the right size but does not decode; the connection is closed.
    #[error("{endpoint}: {cmd} answer: {error}")]
    Malformed {
        /// The endpoint.
        endpoint: String,
        /// The command.
        cmd: Command,
        /// What is wrong with it.
        error: WireError,
    },
    /// A tensor cannot be described on the wire (or refers to memory of another server).
    #[error("tensor {tensor:?} cannot be sent: {why}")]
    Unsendable {
        /// The tensor.
        tensor: Option<TensorId>,
        /// Why.
        why: String,
    },
}

impl RpcError {
    fn to_backend(&self, name: &str) -> BackendError {
        BackendError::failed(name, self.to_string())
    }
}

/// One TCP connection to a server, shared by every handle of the endpoint.
pub(crate) struct Conn {
    endpoint: String,
    stream: Mutex<Option<TcpStream>>,
    /// Commands without an answer were sent since the last answer.
    pending: AtomicBool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Conn({})", self.endpoint)
    }
}

const INLINE_PART: usize = 64 * 1024;

impl Conn {
    fn connect(endpoint: &str, config: &RpcConfig) -> Result<Arc<Conn>, RpcError> {
        let bad = |why: String| RpcError::BadEndpoint {
            endpoint: endpoint.to_owned(),
            why,
        };
        if !endpoint.contains(':') {
            return Err(bad("expected HOST:PORT".into()));
        }
        let addrs: Vec<_> = endpoint
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .collect();
        let mut last = String::from("no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, config.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let stream = stream.ok_or_else(|| RpcError::Connect {
            endpoint: endpoint.to_owned(),
            message: last,
        })?;
        let setup = |s: &TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(config.io_timeout)?;
            s.set_write_timeout(config.io_timeout)
        };
        setup(&stream).map_err(|e| RpcError::Connect {
            endpoint: endpoint.to_owned(),
            message: e.to_string(),
        })?;
        let conn = Arc::new(Conn {
            endpoint: endpoint.to_owned(),
            stream: Mutex::new(Some(stream)),
            pending: AtomicBool::new(false),
        });
        let hello = conn.call(&HelloRequest::default())?;
        let (major, minor, patch) = (hello.major, hello.minor, hello.patch);
        if major != PROTO_MAJOR || minor > PROTO_MINOR {
            conn.close();
            return Err(RpcError::Version {
                endpoint: endpoint.to_owned(),
                major,
                minor,
                patch,
            });
        }
        tracing::debug!(endpoint, major, minor, patch, "connected to RPC server");
        Ok(conn)
    }

    fn close(&self) {
        *self.stream.lock() = None;
    }

    fn io_error(&self, cmd: Command, e: io::Error) -> RpcError {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => RpcError::Timeout {
                endpoint: self.endpoint.clone(),
                cmd,
            },
            io::ErrorKind::UnexpectedEof => RpcError::ConnectionLost {
                endpoint: self.endpoint.clone(),
                cmd,
                message: "server closed the connection".into(),
            },
            _ => RpcError::ConnectionLost {
                endpoint: self.endpoint.clone(),
                cmd,
                message: e.to_string(),
            },
        }
    }

    /// Send a request; read an answer of exactly `resp.len()` bytes if the command has one.
    fn exchange(
        &self,
        cmd: Command,
        parts: &[&[u8]],
        resp: Option<&mut [u8]>,
    ) -> Result<(), RpcError> {
        let mut guard = self.stream.lock();
        let Some(stream) = guard.as_mut() else {
            return Err(RpcError::Closed {
                endpoint: self.endpoint.clone(),
            });
        };
        let result = (|| -> Result<(), RpcError> {
            let size: usize = parts.iter().map(|p| p.len()).sum();
            let mut head = Vec::with_capacity(9 + size.min(INLINE_PART));
            put_header(&mut head, cmd, size as u64);
            for p in parts {
                if p.len() <= INLINE_PART {
                    head.extend_from_slice(p);
                } else {
                    stream.write_all(&head).map_err(|e| self.io_error(cmd, e))?;
                    head.clear();
                    stream.write_all(p).map_err(|e| self.io_error(cmd, e))?;
                }
            }
            if !head.is_empty() {
                stream.write_all(&head).map_err(|e| self.io_error(cmd, e))?;
            }
            let Some(resp) = resp else {
                self.pending.store(true, Ordering::Relaxed);
                return Ok(());
            };
            let mut len = [0u8; 8];
            stream
                .read_exact(&mut len)
                .map_err(|e| self.io_error(cmd, e))?;
            let got = u64::from_le_bytes(len);
            if got != resp.len() as u64 {
                return Err(RpcError::BadResponse {
                    endpoint: self.endpoint.clone(),
                    cmd,
                    expected: resp.len() as u64,
                    got,
                });
            }
            stream.read_exact(resp).map_err(|e| self.io_error(cmd, e))?;
            self.pending.store(false, Ordering::Relaxed);
            Ok(())
        })();
        if let Err(e) = &result {
            tracing::warn!(endpoint = %self.endpoint, error = %e, "RPC connection closed");
            *guard = None;
        }
        result
    }

    /// Send a request the server does not answer, with `data` after its payload (only
    /// SET_TENSOR has any).
    fn send<R: Request<Response = NoResponse>>(
        &self,
        req: &R,
        data: &[u8],
    ) -> Result<(), RpcError> {
        self.exchange(R::COMMAND, &[&req.to_bytes(), data], None)
    }

    /// Send a request and decode its fixed-size answer.
    fn call<R>(&self, req: &R) -> Result<R::Response, RpcError>
    where
        R: Request,
        R::Response: FixedPayload,
    {
        let mut resp = vec![0u8; R::Response::SIZE];
        self.exchange(R::COMMAND, &[&req.to_bytes()], Some(&mut resp))?;
        R::Response::decode(&resp).map_err(|error| {
            self.close();
            RpcError::Malformed {
                endpoint: self.endpoint.clone(),
                cmd: R::COMMAND,
                error,
            }
        })
    }

    /// Wait until everything sent so far was processed (a DEVICE_COUNT round trip), if
    /// anything without an answer was sent.
    fn sync(&self) -> Result<(), RpcError> {
        if self.pending.load(Ordering::Relaxed) {
            self.call(&DeviceCountRequest {})?;
        }
        Ok(())
    }

    fn device_count(&self) -> Result<u32, RpcError> {
        Ok(self.call(&DeviceCountRequest {})?.count)
    }
}

/// Parse a comma-separated list of endpoints the way users name RPC servers
/// (`"host1:50052,host2:50052"`).
///
/// ```
/// assert_eq!(backend_rpc::parse_endpoints(" a:1, b:2 ,"), vec!["a:1", "b:2"]);
/// ```
pub fn parse_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Connect to the server at `endpoint` (`HOST:PORT`), handshake, and return one device per
/// remote device. The devices are not registered; see [`add_server`].
pub fn connect(endpoint: &str, config: &RpcConfig) -> Result<Vec<Device>, RpcError> {
    let conn = Conn::connect(endpoint, config)?;
    let n = conn.device_count()?;
    if n > 256 {
        conn.close();
        return Err(RpcError::BadEndpoint {
            endpoint: endpoint.to_owned(),
            why: format!("server reports {n} devices"),
        });
    }
    (0..n)
        .map(|i| RpcDeviceImpl::create(conn.clone(), i))
        .collect()
}

/// Connect to `endpoint` and register its devices in the global registry under the `"RPC"`
/// registry (created on first use). Returns the new devices.
///
/// ```no_run
/// let devs = backend_rpc::add_server("127.0.0.1:50052", &Default::default())?;
/// let backend = devs[0].init_backend("")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn add_server(endpoint: &str, config: &RpcConfig) -> Result<Vec<Device>, RpcError> {
    let devs = connect(endpoint, config)?;
    let reg = rpc_registry();
    reg.devices.write().extend(devs.iter().cloned());
    GlobalRegistry::get().register(Registry::new(SharedRpcRegistry(reg)));
    Ok(devs)
}

struct RpcRegistry {
    devices: RwLock<Vec<Device>>,
}

/// The `"RPC"` registry handed to the global registry; shares the device list.
struct SharedRpcRegistry(Arc<RpcRegistry>);

impl RegistryImpl for SharedRpcRegistry {
    fn name(&self) -> &str {
        "RPC"
    }
    fn devices(&self) -> Vec<Device> {
        self.0.devices.read().clone()
    }
}

fn rpc_registry() -> Arc<RpcRegistry> {
    static REG: OnceLock<Arc<RpcRegistry>> = OnceLock::new();
    REG.get_or_init(|| {
        Arc::new(RpcRegistry {
            devices: RwLock::new(Vec::new()),
        })
    })
    .clone()
}

/// A device on a remote server.
pub(crate) struct RpcDeviceImpl {
    conn: Arc<Conn>,
    index: u32,
    name: String,
    description: String,
    buft: BufferType,
}

impl RpcDeviceImpl {
    fn create(conn: Arc<Conn>, index: u32) -> Result<Device, RpcError> {
        let alignment = conn.call(&GetAlignmentRequest { device: index })?.alignment;
        let max_size = conn.call(&GetMaxSizeRequest { device: index })?.max_size;
        if alignment == 0 || !alignment.is_power_of_two() || alignment > 1 << 20 {
            conn.close();
            return Err(RpcError::BadEndpoint {
                endpoint: conn.endpoint.clone(),
                why: format!("server reports alignment {alignment}"),
            });
        }
        let name = format!("RPC{index}[{}]", conn.endpoint);
        let imp = Arc::new_cyclic(|weak: &Weak<RpcDeviceImpl>| RpcDeviceImpl {
            conn: conn.clone(),
            index,
            description: format!("remote device {index} at {}", conn.endpoint),
            buft: BufferType::new(RpcBufferType {
                conn: conn.clone(),
                index,
                name: name.clone(),
                alignment: alignment as usize,
                max_size: usize::try_from(max_size).unwrap_or(usize::MAX),
                device: weak.clone(),
            }),
            name,
        });
        Ok(Device::from_arc(imp))
    }
}

/// Whether `t` can travel as an `rpc_tensor` (op, type and sizes).
fn wire_check(t: &Tensor, id: Option<TensorId>) -> Result<(u32, [i32; 16]), RpcError> {
    let bad = |why: String| RpcError::Unsendable { tensor: id, why };
    let (op, sub) = op_to_wire(t.op())
        .ok_or_else(|| bad(format!("op {} has no number in protocol 7.0.0", t.op())))?;
    for d in 0..4 {
        if t.ne()[d] < 0 || t.ne()[d] > i64::from(u32::MAX) {
            return Err(bad(format!("ne[{d}] = {} does not fit 32 bits", t.ne()[d])));
        }
        if t.nb()[d] > u32::MAX as usize {
            return Err(bad(format!("nb[{d}] = {} does not fit 32 bits", t.nb()[d])));
        }
    }
    let mut params = t.op_params().0;
    if let Some(s) = sub {
        params[0] = s;
    }
    Ok((op, params))
}

/// Layouts that ggml's CPU backend asserts on while computing: the real `rpc-server` would
/// abort the whole process (every client's buffers lost), not answer with an error. Refused
/// here, so `supports_op` routes such a node elsewhere and a graph holding one is never sent.
/// Found by the interop op checks (tests/interop_ops.rs).
fn compute_check(ctx: &Context, t: &Tensor) -> Result<(), String> {
    if t.op() == Op::MulMat
        && let Some(b) = t.srcs().get(1).copied().flatten()
        && let Ok(b) = ctx.get(b)
        && b.nb()[0] != b.ty().type_size()
    {
        // ggml-cpu.c, ggml_compute_forward_mul_mat: GGML_ASSERT(nb10 == type_size(src1)).
        return Err(format!(
            "MUL_MAT with a src1 whose elements are not contiguous (nb[0] = {})",
            b.nb()[0]
        ));
    }
    Ok(())
}

/// Whether node `t` of `ctx` can be sent and computed: its op and layout travel, ggml's CPU
/// backend would not assert on it, and every source and its view source are live tensors of
/// `ctx` that travel too. What `supports_op` answers, and what `graph_compute` checks of every
/// node before serializing (a stale source is an unsupported node, as on the CPU backend).
fn sendable_node(ctx: &Context, t: &Tensor) -> bool {
    if wire_check(t, None).is_err() || compute_check(ctx, t).is_err() {
        return false;
    }
    t.srcs()
        .iter()
        .flatten()
        .chain(t.view_src().iter())
        .all(|&s| ctx.get(s).is_ok_and(|st| wire_check(st, Some(s)).is_ok()))
}

/// The wire form of `t` with data in `buf` (remote handle, remote base) at the tensor's offset.
fn to_wire(
    t: &Tensor,
    id: Option<TensorId>,
    remote: Option<(u64, u64)>,
) -> Result<RpcTensor, RpcError> {
    let (op, op_params) = wire_check(t, id)?;
    let mut w = RpcTensor {
        id: id.map_or(1, |i| i.index() as u64 + 1),
        ty: type_to_wire(t.ty()),
        op,
        op_params,
        flags: t.flags().0 as i32,
        view_offs: t.view_offs() as u64,
        ..Default::default()
    };
    for d in 0..4 {
        w.ne[d] = t.ne()[d] as u32;
        w.nb[d] = t.nb()[d] as u32;
    }
    if let (Some((handle, base)), Some(st)) = (remote, t.storage()) {
        w.buffer = handle;
        w.data = base
            .checked_add(st.offset as u64)
            .ok_or_else(|| RpcError::Unsendable {
                tensor: id,
                why: "remote address overflows".into(),
            })?;
    }
    w.set_name(t.name());
    Ok(w)
}

impl DeviceImpl for RpcDeviceImpl {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        match self
            .conn
            .call(&GetDeviceMemoryRequest { device: self.index })
        {
            Ok(m) => (
                usize::try_from(m.free).unwrap_or(usize::MAX),
                usize::try_from(m.total).unwrap_or(usize::MAX),
            ),
            Err(e) => {
                tracing::warn!(device = %self.name, error = %e, "GET_DEVICE_MEMORY failed");
                (0, 0)
            }
        }
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn init_backend(&self, device: &Device, _params: &str) -> backend_core::Result<Backend> {
        Ok(Backend::new(RpcBackend {
            conn: self.conn.clone(),
            index: self.index,
            name: self.name.clone(),
            device: device.clone(),
        }))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        ctx.get(op).is_ok_and(|t| sendable_node(ctx, t))
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft
    }
}

/// The memory of one remote device.
struct RpcBufferType {
    conn: Arc<Conn>,
    index: u32,
    name: String,
    alignment: usize,
    max_size: usize,
    device: Weak<RpcDeviceImpl>,
}

impl BufferTypeImpl for RpcBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc_buffer(&self, size: usize) -> backend_core::Result<Box<dyn BufferImpl>> {
        let r = self
            .conn
            .call(&AllocBufferRequest {
                device: self.index,
                size: size as u64,
            })
            .map_err(|e| e.to_backend(&self.name))?;
        let (handle, remote_size) = (r.remote_ptr, r.remote_size);
        if handle == 0 {
            return Err(BackendError::AllocationFailed {
                buffer_type: self.name.clone(),
                size,
            });
        }
        let mut buf = RpcBuffer {
            conn: self.conn.clone(),
            handle,
            base: 0,
            size: remote_size,
            name: self.name.clone(),
        };
        if remote_size < size as u64 {
            // Dropping `buf` frees the remote allocation.
            return Err(BackendError::AllocationFailed {
                buffer_type: self.name.clone(),
                size,
            });
        }
        buf.base = self
            .conn
            .call(&BufferGetBaseRequest { remote_ptr: handle })
            .map_err(|e| e.to_backend(&self.name))?
            .base_ptr;
        if buf.base.checked_add(remote_size).is_none() {
            return Err(BackendError::failed(
                &self.name,
                "server returned a buffer base that overflows",
            ));
        }
        Ok(Box::new(buf))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        // ggml asks the server only for ops whose backends may pad; everything we can send is
        // laid out as nbytes on every server we know, but ask for MUL_MAT like ggml does.
        if tensor.op() != Op::MulMat {
            return tensor.nbytes();
        }
        let Ok(w) = to_wire(tensor, None, None) else {
            return tensor.nbytes();
        };
        let req = GetAllocSizeRequest {
            device: self.index,
            tensor: w,
            srcs: [RpcTensor::default(); 10],
        };
        match self.conn.call(&req) {
            Ok(n) => usize::try_from(n.alloc_size)
                .unwrap_or(usize::MAX)
                .max(tensor.nbytes()),
            Err(e) => {
                tracing::warn!(buffer_type = %self.name, error = %e, "GET_ALLOC_SIZE failed");
                tensor.nbytes()
            }
        }
    }
    fn device(&self) -> Option<Device> {
        self.device
            .upgrade()
            .map(|d| Device::from_arc(d as Arc<dyn DeviceImpl>))
    }
}

/// One remote allocation; freed on the server when dropped.
struct RpcBuffer {
    conn: Arc<Conn>,
    handle: u64,
    base: u64,
    size: u64,
    name: String,
}

impl RpcBuffer {
    fn wire(&self, t: &Tensor) -> backend_core::Result<RpcTensor> {
        let st = t
            .storage()
            .ok_or_else(|| BackendError::failed(&self.name, "tensor has no storage"))?;
        let end = (st.offset as u64).checked_add(t.nbytes() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(BackendError::out_of_bounds(
                "RPC tensor",
                st.offset,
                t.nbytes(),
                self.size as usize,
            ));
        }
        to_wire(t, None, Some((self.handle, self.base))).map_err(|e| e.to_backend(&self.name))
    }
}

impl Drop for RpcBuffer {
    fn drop(&mut self) {
        let req = FreeBufferRequest {
            remote_ptr: self.handle,
        };
        if let Err(e) = self.conn.send(&req, &[]) {
            tracing::debug!(buffer = %self.name, error = %e, "FREE_BUFFER not sent");
        }
    }
}

impl BufferImpl for RpcBuffer {
    fn memset_tensor(
        &self,
        tensor: &Tensor,
        value: u8,
        offset: usize,
        size: usize,
    ) -> backend_core::Result<()> {
        let req = MemsetTensorRequest {
            tensor: self.wire(tensor)?,
            offset: offset as u64,
            size: size as u64,
            value,
        };
        self.conn
            .send(&req, &[])
            .map_err(|e| e.to_backend(&self.name))
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> backend_core::Result<()> {
        let req = SetTensorRequest {
            tensor: self.wire(tensor)?,
            cache: false,
            offset: offset as u64,
        };
        self.conn
            .send(&req, data)
            .map_err(|e| e.to_backend(&self.name))
    }
    fn get_tensor(
        &self,
        tensor: &Tensor,
        offset: usize,
        data: &mut [u8],
    ) -> backend_core::Result<()> {
        let req = GetTensorRequest {
            tensor: self.wire(tensor)?,
            offset: offset as u64,
            size: data.len() as u64,
        };
        // The answer is the bytes themselves: read straight into `data`.
        self.conn
            .exchange(GetTensorRequest::COMMAND, &[&req.to_bytes()], Some(data))
            .map_err(|e| e.to_backend(&self.name))
    }
    fn cpy_tensor(&self, src: &Tensor, dst: &Tensor) -> backend_core::Result<bool> {
        let Some(src_buf) = src.storage().and_then(Buffer::from_storage) else {
            return Ok(false);
        };
        let Some(sb) = src_buf
            .implementation()
            .and_then(|b| b.as_any().downcast_ref::<RpcBuffer>())
        else {
            return Ok(false);
        };
        if !Arc::ptr_eq(&sb.conn, &self.conn) {
            return Ok(false);
        }
        let req = CopyTensorRequest {
            src: sb.wire(src)?,
            dst: self.wire(dst)?,
        };
        let r = self.conn.call(&req).map_err(|e| e.to_backend(&self.name))?;
        Ok(r.copied)
    }
    fn clear(&self, value: u8) -> backend_core::Result<()> {
        let req = BufferClearRequest {
            remote_ptr: self.handle,
            value,
        };
        self.conn
            .send(&req, &[])
            .map_err(|e| e.to_backend(&self.name))
    }
    fn base_address(&self) -> u64 {
        self.base
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stream of work on a remote device.
struct RpcBackend {
    conn: Arc<Conn>,
    index: u32,
    name: String,
    device: Device,
}

/// The guid of RPC backends.
const RPC_GUID: Guid = *b"backend-rpc-v7.0";

/// Serialize `graph` for device `device`: every node and, depth first, everything it refers
/// to (sources in order, then the view source, then the tensor), each once; nodes get the
/// COMPUTE flag and their use counts. Every tensor must live in a buffer of `conn`.
pub(crate) fn serialize_graph(
    conn: &Arc<Conn>,
    device: u32,
    ctx: &Context,
    graph: GraphView<'_>,
) -> Result<GraphMessage, RpcError> {
    let n = ctx.len();
    let mut use_count = vec![0i32; n];
    for &node in graph.nodes {
        let t = ctx.get(node).map_err(|e| RpcError::Unsendable {
            tensor: Some(node),
            why: e.to_string(),
        })?;
        compute_check(ctx, t).map_err(|why| RpcError::Unsendable {
            tensor: Some(node),
            why,
        })?;
        for s in t.srcs().iter().flatten() {
            if s.index() < n {
                use_count[s.index()] = use_count[s.index()].saturating_add(1);
            }
        }
    }
    let mut is_node = vec![false; n];
    for &node in graph.nodes {
        // In range: every node passed `ctx.get` in the loop above.
        is_node[node.index()] = true;
    }
    let mut seen = vec![false; n];
    let mut msg = GraphMessage {
        device,
        nodes: graph.nodes.iter().map(|id| id.index() as u64 + 1).collect(),
        tensors: Vec::new(),
    };
    // Iterative post-order walk: (tensor, children pushed?).
    let mut stack: Vec<(TensorId, bool)> = Vec::new();
    for &root in graph.nodes {
        stack.push((root, false));
        while let Some((id, expanded)) = stack.pop() {
            // Look the id up before indexing the side tables by it: a source or view source
            // may be stale (its index past the end after a rewind).
            let t = ctx.get(id).map_err(|e| RpcError::Unsendable {
                tensor: Some(id),
                why: e.to_string(),
            })?;
            if seen[id.index()] {
                continue;
            }
            if !expanded {
                stack.push((id, true));
                if let Some(v) = t.view_src() {
                    stack.push((v, false));
                }
                for s in t.srcs().iter().rev().flatten() {
                    stack.push((*s, false));
                }
                continue;
            }
            seen[id.index()] = true;
            let remote = remote_of(conn, t).ok_or_else(|| RpcError::Unsendable {
                tensor: Some(id),
                why: "not in a buffer of this RPC server".into(),
            })?;
            let mut w = to_wire(t, Some(id), Some(remote))?;
            for (slot, s) in t.srcs().iter().enumerate() {
                w.src[slot] = s.map_or(0, |s| s.index() as u64 + 1);
            }
            w.view_src = t.view_src().map_or(0, |s| s.index() as u64 + 1);
            if is_node[id.index()] {
                w.flags |= FLAG_COMPUTE;
            }
            w.use_count = use_count[id.index()];
            msg.tensors.push(w);
        }
    }
    Ok(msg)
}

/// The (handle, base) of the RPC buffer on `conn` that `t` lives in.
fn remote_of(conn: &Arc<Conn>, t: &Tensor) -> Option<(u64, u64)> {
    let buf = Buffer::from_storage(t.storage()?)?;
    let rb = buf.implementation()?.as_any().downcast_ref::<RpcBuffer>()?;
    let end = (t.storage()?.offset as u64).checked_add(t.nbytes() as u64)?;
    (Arc::ptr_eq(&rb.conn, conn) && end <= rb.size).then_some((rb.handle, rb.base))
}

impl BackendImpl for RpcBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn guid(&self) -> Guid {
        RPC_GUID
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn synchronize(&self) -> backend_core::Result<()> {
        self.conn.sync().map_err(|e| e.to_backend(&self.name))
    }
    fn graph_compute(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> backend_core::Result<ComputeStatus> {
        if graph.nodes.is_empty() {
            return Ok(ComputeStatus::Success);
        }
        // As the CPU backend: a stale node id is a graph error, a node that cannot run here
        // (op, layout, or a stale source) is `UnsupportedOp`, both before anything is sent.
        for &id in graph.nodes {
            let t = ctx.get(id)?;
            if !sendable_node(ctx, t) {
                return Err(BackendError::UnsupportedOp {
                    backend: self.name.clone(),
                    op: t.op().name(),
                    tensor: id,
                });
            }
        }
        let msg = serialize_graph(&self.conn, self.index, ctx, graph)
            .map_err(|e| e.to_backend(&self.name))?;
        let bytes = msg.encode();
        self.conn
            .exchange(Command::GraphCompute, &[&bytes], None)
            .map_err(|e| e.to_backend(&self.name))?;
        Ok(ComputeStatus::Success)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
