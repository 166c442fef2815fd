//! The byte format of ggml's RPC protocol 7.0.0: framing, commands, `rpc_tensor` and the
//! serialized graph.
//!
//! Why hand-written little-endian codecs and not a `#[repr(packed)]` struct cast: the wire
//! structs are packed and unaligned, and the server decodes bytes chosen by strangers. Reading
//! field by field from a slice with explicit bounds is total (every input gives a value or a
//! [`WireError`]), needs no `unsafe`, and is what the fuzz tests exercise.
//!
//! Framing: a request is `cmd: u8 | size: u64 | payload`; a response (only for some commands)
//! is `size: u64 | payload`. There are no error responses: a server that dislikes a request
//! closes the connection.
//!
//! Every command's request and response payload is one struct here (`AllocBufferRequest`,
//! `AllocBufferResponse`, …; GRAPH_COMPUTE's is [`GraphMessage`]), with one `encode` and one
//! `decode` ([`Payload`]) that the client and the server both use: a field order written
//! once cannot disagree between the two sides, and the tests check each struct against the
//! bytes ggml's own client and server exchanged.

use std::fmt;

/// Protocol major version we speak (`RPC_PROTO_MAJOR_VERSION`).
pub const PROTO_MAJOR: u8 = 7;
/// Protocol minor version we speak; a server with a higher minor is refused.
pub const PROTO_MINOR: u8 = 0;
/// Protocol patch version we report.
pub const PROTO_PATCH: u8 = 0;
/// Size of the transport capability block in HELLO (`RPC_CONN_CAPS_SIZE`).
pub const CONN_CAPS_SIZE: usize = 24;
/// Size of one serialized `rpc_tensor`.
pub const RPC_TENSOR_SIZE: usize = 296;
/// Number of ops of the ggml the protocol version is tied to (`GGML_OP_COUNT`).
pub const GGML_OP_COUNT: u32 = 101;
/// Number of type ids of that ggml (`GGML_TYPE_COUNT`).
pub const GGML_TYPE_COUNT: u32 = 43;
/// Tensor flag that makes ggml's CPU backend compute a node (`GGML_TENSOR_FLAG_COMPUTE`).
pub const FLAG_COMPUTE: i32 = 16;
/// Request header size: command byte plus payload size.
pub const REQUEST_HEADER_SIZE: usize = 9;
/// Fixed part of a SET_TENSOR payload before the data: tensor, cache flag, offset
/// ([`SetTensorRequest`]).
pub const SET_TENSOR_FIXED: usize = SetTensorRequest::SIZE;
/// Size of a GET_ALLOC_SIZE payload: device, tensor and ten sources ([`GetAllocSizeRequest`]).
pub const GET_ALLOC_SIZE_SIZE: usize = GetAllocSizeRequest::SIZE;

/// The commands (`enum rpc_cmd`), numbered as on the wire.
///
/// ```
/// use backend_rpc::wire::Command;
/// assert_eq!(Command::from_u8(14), Some(Command::Hello));
/// assert_eq!(Command::from_u8(18), None); // RPC_CMD_NONE is never valid on the wire
/// assert!(Command::GetTensor.has_response());
/// assert!(!Command::SetTensor.has_response());
/// assert_eq!(Command::GetAlignment.fixed_request_size(), Some(4));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    /// Allocate a buffer: device u32, size u64 → remote_ptr u64, size u64.
    AllocBuffer = 0,
    /// Buffer alignment of a device: device u32 → u64.
    GetAlignment = 1,
    /// Max buffer size of a device: device u32 → u64.
    GetMaxSize = 2,
    /// Base address of a buffer: remote_ptr u64 → u64.
    BufferGetBase = 3,
    /// Free a buffer: remote_ptr u64; no response.
    FreeBuffer = 4,
    /// Fill a buffer: remote_ptr u64, value u8; no response.
    BufferClear = 5,
    /// Write bytes: tensor, cache flag u8, offset u64, data; no response.
    SetTensor = 6,
    /// Write from the server's cache by hash: tensor, offset u64, hash u64 → u8.
    SetTensorHash = 7,
    /// Read bytes: tensor, offset u64, size u64 → the bytes.
    GetTensor = 8,
    /// Copy between two tensors of the server: src, dst → u8.
    CopyTensor = 9,
    /// Compute a graph; no response.
    GraphCompute = 10,
    /// Free and total memory: device u32 → u64, u64.
    GetDeviceMemory = 11,
    /// Initialise a tensor in its buffer; no response.
    InitTensor = 12,
    /// Bytes a tensor needs: device u32, tensor, 10 sources → u64.
    GetAllocSize = 13,
    /// Handshake: caps \[24\] → major, minor, patch, pad, caps \[24\].
    Hello = 14,
    /// Number of devices: empty → u32.
    DeviceCount = 15,
    /// Run the stored graph again: device u32; no response.
    GraphRecompute = 16,
    /// Fill bytes of a tensor: tensor, offset u64, size u64, value u8; no response.
    MemsetTensor = 17,
}

impl Command {
    /// The command with wire number `b` (18 = NONE and above are invalid).
    pub fn from_u8(b: u8) -> Option<Self> {
        use Command::*;
        Some(match b {
            0 => AllocBuffer,
            1 => GetAlignment,
            2 => GetMaxSize,
            3 => BufferGetBase,
            4 => FreeBuffer,
            5 => BufferClear,
            6 => SetTensor,
            7 => SetTensorHash,
            8 => GetTensor,
            9 => CopyTensor,
            10 => GraphCompute,
            11 => GetDeviceMemory,
            12 => InitTensor,
            13 => GetAllocSize,
            14 => Hello,
            15 => DeviceCount,
            16 => GraphRecompute,
            17 => MemsetTensor,
            _ => return None,
        })
    }

    /// Whether the server answers this command.
    pub fn has_response(self) -> bool {
        !matches!(
            self,
            Command::FreeBuffer
                | Command::BufferClear
                | Command::SetTensor
                | Command::GraphCompute
                | Command::InitTensor
                | Command::GraphRecompute
                | Command::MemsetTensor
        )
    }

    /// The exact payload size of a fixed-size request (`None` for SET_TENSOR and
    /// GRAPH_COMPUTE, whose size varies).
    pub fn fixed_request_size(self) -> Option<usize> {
        use Command::*;
        Some(match self {
            AllocBuffer => AllocBufferRequest::SIZE,
            GetAlignment => GetAlignmentRequest::SIZE,
            GetMaxSize => GetMaxSizeRequest::SIZE,
            GetDeviceMemory => GetDeviceMemoryRequest::SIZE,
            GraphRecompute => GraphRecomputeRequest::SIZE,
            BufferGetBase => BufferGetBaseRequest::SIZE,
            FreeBuffer => FreeBufferRequest::SIZE,
            BufferClear => BufferClearRequest::SIZE,
            SetTensorHash => SetTensorHashRequest::SIZE,
            GetTensor => GetTensorRequest::SIZE,
            CopyTensor => CopyTensorRequest::SIZE,
            InitTensor => InitTensorRequest::SIZE,
            GetAllocSize => GetAllocSizeRequest::SIZE,
            Hello => HelloRequest::SIZE,
            DeviceCount => DeviceCountRequest::SIZE,
            MemsetTensor => MemsetTensorRequest::SIZE,
            SetTensor | GraphCompute => return None,
        })
    }

    /// The exact response payload size, where it does not depend on the request
    /// (GET_TENSOR's is the requested size).
    pub fn fixed_response_size(self) -> Option<usize> {
        use Command::*;
        Some(match self {
            AllocBuffer => AllocBufferResponse::SIZE,
            GetDeviceMemory => GetDeviceMemoryResponse::SIZE,
            GetAlignment => GetAlignmentResponse::SIZE,
            GetMaxSize => GetMaxSizeResponse::SIZE,
            BufferGetBase => BufferGetBaseResponse::SIZE,
            GetAllocSize => GetAllocSizeResponse::SIZE,
            SetTensorHash => SetTensorHashResponse::SIZE,
            CopyTensor => CopyTensorResponse::SIZE,
            Hello => HelloResponse::SIZE,
            DeviceCount => DeviceCountResponse::SIZE,
            FreeBuffer | BufferClear | SetTensor | GetTensor | GraphCompute | InitTensor
            | GraphRecompute | MemsetTensor => return None,
        })
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    #[error("{what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A size field does not match what the structure requires.
    #[error("{what}: size {got}, expected {expected}")]
    BadSize {
        /// What was being read.
        what: &'static str,
        /// Expected size.
        expected: u64,
        /// Size found.
        got: u64,
    },
    /// A count is above the configured limit.
    #[error("{what}: {got} exceeds the limit {limit}")]
    OverLimit {
        /// What was counted.
        what: &'static str,
        /// Value found.
        got: u64,
        /// Limit.
        limit: u64,
    },
}

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Read `buf` from its start; `what` names the structure in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated {
                what: self.what,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            });
        }
        // In range: `pos <= buf.len()` always holds and `n <= buf.len() - pos` was checked.
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A little-endian i32.
    pub fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Error unless every byte was consumed.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.remaining() != 0 {
            return Err(WireError::BadSize {
                what: self.what,
                expected: self.pos as u64,
                got: self.buf.len() as u64,
            });
        }
        Ok(())
    }
}

/// One tensor as it travels (`struct rpc_tensor`, packed, 296 bytes).
///
/// `data` is an absolute address in the server's address space (buffer base + offset);
/// `id`, `src` and `view_src` are client-chosen opaque ids (0 = none).
///
/// ```
/// use backend_rpc::wire::{RpcTensor, RPC_TENSOR_SIZE};
/// let mut t = RpcTensor::default();
/// t.id = 1;
/// t.ne = [4, 1, 1, 1];
/// t.nb = [4, 16, 16, 16];
/// t.set_name("a");
/// let mut bytes = Vec::new();
/// t.encode(&mut bytes);
/// assert_eq!(bytes.len(), RPC_TENSOR_SIZE);
/// assert_eq!(RpcTensor::decode(&bytes)?, t);
/// assert_eq!(t.name_str(), "a");
/// # Ok::<(), backend_rpc::wire::WireError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RpcTensor {
    /// Client-chosen id (0 = null).
    pub id: u64,
    /// ggml type id.
    pub ty: u32,
    /// Remote buffer handle (`remote_ptr`) or 0.
    pub buffer: u64,
    /// Extents (32-bit on the wire).
    pub ne: [u32; 4],
    /// Byte strides (32-bit on the wire).
    pub nb: [u32; 4],
    /// ggml op id.
    pub op: u32,
    /// Raw op parameters.
    pub op_params: [i32; 16],
    /// Tensor flags.
    pub flags: i32,
    /// Source ids.
    pub src: [u64; 10],
    /// View source id.
    pub view_src: u64,
    /// Byte offset into the view source.
    pub view_offs: u64,
    /// Absolute server address of the first byte, or 0.
    pub data: u64,
    /// NUL-padded name.
    pub name: [u8; 64],
    /// Uses of the node inside the graph (only in GRAPH_COMPUTE).
    pub use_count: i32,
}

impl Default for RpcTensor {
    fn default() -> Self {
        RpcTensor {
            id: 0,
            ty: 0,
            buffer: 0,
            ne: [0; 4],
            nb: [0; 4],
            op: 0,
            op_params: [0; 16],
            flags: 0,
            src: [0; 10],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; 64],
            use_count: 0,
        }
    }
}

impl fmt::Debug for RpcTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcTensor")
            .field("id", &format_args!("{:#x}", self.id))
            .field("ty", &self.ty)
            .field("buffer", &format_args!("{:#x}", self.buffer))
            .field("ne", &self.ne)
            .field("nb", &self.nb)
            .field("op", &self.op)
            .field("flags", &self.flags)
            .field("src", &self.src)
            .field("view_src", &self.view_src)
            .field("view_offs", &self.view_offs)
            .field("data", &format_args!("{:#x}", self.data))
            .field("name", &self.name_str())
            .finish()
    }
}

impl RpcTensor {
    /// Append the 296 wire bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(RPC_TENSOR_SIZE);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.ty.to_le_bytes());
        out.extend_from_slice(&self.buffer.to_le_bytes());
        for v in self.ne {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in self.nb {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.op.to_le_bytes());
        for v in self.op_params {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.flags.to_le_bytes());
        for v in self.src {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.view_src.to_le_bytes());
        out.extend_from_slice(&self.view_offs.to_le_bytes());
        out.extend_from_slice(&self.data.to_le_bytes());
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&self.use_count.to_le_bytes());
    }

    /// Read one tensor from the reader.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut t = RpcTensor {
            id: r.u64()?,
            ty: r.u32()?,
            buffer: r.u64()?,
            ..Default::default()
        };
        for v in &mut t.ne {
            *v = r.u32()?;
        }
        for v in &mut t.nb {
            *v = r.u32()?;
        }
        t.op = r.u32()?;
        for v in &mut t.op_params {
            *v = r.i32()?;
        }
        t.flags = r.i32()?;
        for v in &mut t.src {
            *v = r.u64()?;
        }
        t.view_src = r.u64()?;
        t.view_offs = r.u64()?;
        t.data = r.u64()?;
        t.name.copy_from_slice(r.bytes(64)?);
        t.use_count = r.i32()?;
        Ok(t)
    }

    /// Decode exactly one tensor from `bytes` (at least 296 bytes; the rest is ignored).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        Self::read(&mut Reader::new(bytes, "rpc_tensor"))
    }

    /// Set the name (at most 63 bytes are kept, the rest of the field is zero).
    pub fn set_name(&mut self, name: &str) {
        self.name = [0; 64];
        let n = name.len().min(63);
        self.name[..n].copy_from_slice(&name.as_bytes()[..n]);
    }

    /// The name up to its first NUL, lossily decoded.
    pub fn name_str(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(64);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// Append a request header (`cmd`, `size`) to `out`.
pub fn put_header(out: &mut Vec<u8>, cmd: Command, size: u64) {
    out.push(cmd as u8);
    out.extend_from_slice(&size.to_le_bytes());
}

/// A serialized graph (GRAPH_COMPUTE payload).
///
/// ```
/// use backend_rpc::wire::{GraphMessage, RpcTensor};
/// let leaf = RpcTensor { id: 1, ..Default::default() };
/// let node = RpcTensor { id: 2, op: 2, src: [1, 1, 0, 0, 0, 0, 0, 0, 0, 0], ..Default::default() };
/// let g = GraphMessage { device: 0, nodes: vec![2], tensors: vec![leaf, node] };
/// let bytes = g.encode();
/// assert_eq!(bytes.len(), 12 + 8 + 2 * 296);
/// assert_eq!(GraphMessage::decode(&bytes, 16, 16)?, g);
/// # Ok::<(), backend_rpc::wire::WireError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GraphMessage {
    /// Target device index.
    pub device: u32,
    /// Node ids in execution order (0 = a null node).
    pub nodes: Vec<u64>,
    /// Every tensor the nodes reference, each once.
    pub tensors: Vec<RpcTensor>,
}

impl GraphMessage {
    /// Payload size for `n_nodes` nodes and `n_tensors` tensors.
    /// Saturates instead of overflowing (no payload can be that large anyway).
    pub fn encoded_size(n_nodes: usize, n_tensors: usize) -> usize {
        n_nodes
            .saturating_mul(8)
            .saturating_add(n_tensors.saturating_mul(RPC_TENSOR_SIZE))
            .saturating_add(12)
    }

    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_size(self.nodes.len(), self.tensors.len()));
        out.extend_from_slice(&self.device.to_le_bytes());
        // The counts are u32 on the wire; a graph of 2^32 nodes or tensors cannot be built in
        // memory (each tensor is hundreds of bytes), so the casts below do not truncate.
        out.extend_from_slice(&(self.nodes.len() as u32).to_le_bytes());
        for n in &self.nodes {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&(self.tensors.len() as u32).to_le_bytes());
        for t in &self.tensors {
            t.encode(&mut out);
        }
        out
    }

    /// Decode a payload, refusing more than `max_nodes` nodes or `max_tensors` tensors and any
    /// size that does not add up exactly. Counts are checked against the payload length before
    /// anything is allocated.
    pub fn decode(bytes: &[u8], max_nodes: u32, max_tensors: u32) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "graph");
        let device = r.u32()?;
        let n_nodes = r.u32()?;
        if n_nodes > max_nodes {
            return Err(WireError::OverLimit {
                what: "graph nodes",
                got: n_nodes.into(),
                limit: max_nodes.into(),
            });
        }
        // In u64: a u32 count times 8 cannot overflow it, whatever usize is.
        if (r.remaining() as u64) < 8 * u64::from(n_nodes) + 4 {
            return Err(WireError::Truncated {
                what: "graph node list",
                need: Self::encoded_size(n_nodes as usize, 0),
                have: bytes.len(),
            });
        }
        let mut nodes = Vec::with_capacity(n_nodes as usize);
        for _ in 0..n_nodes {
            nodes.push(r.u64()?);
        }
        let n_tensors = r.u32()?;
        if n_tensors > max_tensors {
            return Err(WireError::OverLimit {
                what: "graph tensors",
                got: n_tensors.into(),
                limit: max_tensors.into(),
            });
        }
        let expected = Self::encoded_size(n_nodes as usize, n_tensors as usize);
        if bytes.len() != expected {
            return Err(WireError::BadSize {
                what: "graph",
                expected: expected as u64,
                got: bytes.len() as u64,
            });
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            tensors.push(RpcTensor::read(&mut r)?);
        }
        r.finish()?;
        Ok(GraphMessage {
            device,
            nodes,
            tensors,
        })
    }
}

/// FNV-1a 64 over `data`, the hash SET_TENSOR_HASH and the server cache use.
///
/// ```
/// assert_eq!(backend_rpc::wire::fnv1a64(b""), 0xcbf29ce484222325);
/// assert_eq!(backend_rpc::wire::fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
/// ```
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One request or response payload: the bytes after the header (request) or after the size
/// (response), encoded and decoded in one place for the client and the server alike.
///
/// Why a trait: the client sends what the server decodes, and both go through the same
/// `encode`/`read` pair, so a field laid out twice (once per side) cannot drift. `decode`
/// is total: short, long or malformed bytes give a [`WireError`], never a panic.
///
/// ```
/// use backend_rpc::wire::{AllocBufferRequest, Payload, WireError};
/// let req = AllocBufferRequest { device: 0, size: 96 };
/// let bytes = req.to_bytes();
/// assert_eq!(bytes, [0, 0, 0, 0, 96, 0, 0, 0, 0, 0, 0, 0]);
/// assert_eq!(AllocBufferRequest::decode(&bytes)?, req);
/// let short = AllocBufferRequest::decode(&bytes[..11]);
/// assert!(matches!(short, Err(WireError::Truncated { need: 12, have: 11, .. })), "{short:?}");
/// # Ok::<(), backend_rpc::wire::WireError>(())
/// ```
pub trait Payload: Sized {
    /// What errors call it (`"ALLOC_BUFFER request"`).
    const WHAT: &'static str;
    /// Append the payload bytes to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Read the payload from `r`, leaving what follows it.
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError>;
    /// Decode exactly one payload: every byte of `bytes` used, none missing.
    fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, Self::WHAT);
        let v = Self::read(&mut r)?;
        r.finish()?;
        Ok(v)
    }
    /// The payload bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// A payload of one size whatever its values (every message but SET_TENSOR's data, GET_TENSOR's
/// answer and GRAPH_COMPUTE).
pub trait FixedPayload: Payload {
    /// Its size in bytes.
    const SIZE: usize;
}

/// A request: its command, and the type of the server's answer ([`NoResponse`] for the
/// commands the server does not answer).
///
/// ```
/// use backend_rpc::wire::{Command, FixedPayload, GetAlignmentRequest, Request};
/// assert_eq!(GetAlignmentRequest::COMMAND, Command::GetAlignment);
/// assert_eq!(Some(GetAlignmentRequest::SIZE), Command::GetAlignment.fixed_request_size());
/// ```
pub trait Request: Payload {
    /// The command byte it travels with.
    const COMMAND: Command;
    /// What the server answers.
    type Response: Payload;
}

/// One field of a fixed-layout message, little-endian.
trait Field: Sized {
    const SIZE: usize;
    fn put(&self, out: &mut Vec<u8>);
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError>;
}

impl Field for u8 {
    const SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        r.u8()
    }
}

/// A flag byte: 1 or 0 when written; any non-zero byte reads as `true` (as ggml reads it).
impl Field for bool {
    const SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(r.u8()? != 0)
    }
}

impl Field for u32 {
    const SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        r.u32()
    }
}

impl Field for u64 {
    const SIZE: usize = 8;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        r.u64()
    }
}

impl Field for [u8; CONN_CAPS_SIZE] {
    const SIZE: usize = CONN_CAPS_SIZE;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut a = [0u8; CONN_CAPS_SIZE];
        a.copy_from_slice(r.bytes(CONN_CAPS_SIZE)?);
        Ok(a)
    }
}

impl Field for RpcTensor {
    const SIZE: usize = RPC_TENSOR_SIZE;
    fn put(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        RpcTensor::read(r)
    }
}

impl Field for [RpcTensor; 10] {
    const SIZE: usize = 10 * RPC_TENSOR_SIZE;
    fn put(&self, out: &mut Vec<u8>) {
        for t in self {
            t.encode(out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut a = [RpcTensor::default(); 10];
        for t in &mut a {
            *t = RpcTensor::read(r)?;
        }
        Ok(a)
    }
}

/// A fixed-layout message: its fields in wire order, each written and read by [`Field`].
macro_rules! message {
    ($(#[$m:meta])* $name:ident, $what:literal { $($(#[$fm:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub struct $name {
            $($(#[$fm])* pub $field: $ty,)*
        }

        impl Payload for $name {
            const WHAT: &'static str = $what;
            #[allow(unused_variables)]
            fn encode(&self, out: &mut Vec<u8>) {
                out.reserve(<Self as FixedPayload>::SIZE);
                $(Field::put(&self.$field, out);)*
            }
            #[allow(unused_variables)]
            fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
                // Struct expressions evaluate their fields in the order written: wire order.
                Ok($name { $($field: Field::get(r)?,)* })
            }
        }

        impl FixedPayload for $name {
            const SIZE: usize = 0 $(+ <$ty as Field>::SIZE)*;
        }
    };
}

/// `$req` is sent with `$cmd` and answered with `$resp`.
macro_rules! request {
    ($req:ident => $cmd:ident, $resp:ty) => {
        impl Request for $req {
            const COMMAND: Command = Command::$cmd;
            type Response = $resp;
        }
    };
}

/// The answer of a command the server does not answer: no bytes, none sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NoResponse;

impl Payload for NoResponse {
    const WHAT: &'static str = "no response";
    fn encode(&self, _out: &mut Vec<u8>) {}
    fn read(_r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(NoResponse)
    }
}

impl FixedPayload for NoResponse {
    const SIZE: usize = 0;
}

message!(
    /// HELLO: the client's transport capabilities (all zero: plain TCP).
    HelloRequest, "HELLO request" {
        /// `conn_caps`.
        caps: [u8; CONN_CAPS_SIZE],
    }
);
request!(HelloRequest => Hello, HelloResponse);

/// HELLO's answer: the server's protocol version and capabilities (the pad byte after the
/// version is written as 0 and ignored when read).
///
/// ```
/// use backend_rpc::wire::{HelloResponse, Payload};
/// let r = HelloResponse { major: 7, minor: 0, patch: 0, caps: [0; 24] };
/// assert_eq!(r.to_bytes()[..4], [7, 0, 0, 0]);
/// assert_eq!(HelloResponse::decode(&r.to_bytes())?, r);
/// # Ok::<(), backend_rpc::wire::WireError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HelloResponse {
    /// Protocol major version.
    pub major: u8,
    /// Protocol minor version.
    pub minor: u8,
    /// Protocol patch version.
    pub patch: u8,
    /// `conn_caps`.
    pub caps: [u8; CONN_CAPS_SIZE],
}

impl Payload for HelloResponse {
    const WHAT: &'static str = "HELLO response";
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.major, self.minor, self.patch, 0]);
        self.caps.put(out);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let (major, minor, patch, _pad) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        let caps = Field::get(r)?;
        Ok(HelloResponse {
            major,
            minor,
            patch,
            caps,
        })
    }
}

impl FixedPayload for HelloResponse {
    const SIZE: usize = 4 + CONN_CAPS_SIZE;
}

message!(
    /// DEVICE_COUNT: no payload.
    DeviceCountRequest, "DEVICE_COUNT request" {}
);
request!(DeviceCountRequest => DeviceCount, DeviceCountResponse);

message!(
    /// DEVICE_COUNT's answer.
    DeviceCountResponse, "DEVICE_COUNT response" {
        /// Devices the server has.
        count: u32,
    }
);

message!(
    /// GET_ALIGNMENT: a device's buffer alignment.
    GetAlignmentRequest, "GET_ALIGNMENT request" {
        /// Device index.
        device: u32,
    }
);
request!(GetAlignmentRequest => GetAlignment, GetAlignmentResponse);

message!(
    /// GET_ALIGNMENT's answer.
    GetAlignmentResponse, "GET_ALIGNMENT response" {
        /// Alignment in bytes.
        alignment: u64,
    }
);

message!(
    /// GET_MAX_SIZE: a device's largest buffer.
    GetMaxSizeRequest, "GET_MAX_SIZE request" {
        /// Device index.
        device: u32,
    }
);
request!(GetMaxSizeRequest => GetMaxSize, GetMaxSizeResponse);

message!(
    /// GET_MAX_SIZE's answer.
    GetMaxSizeResponse, "GET_MAX_SIZE response" {
        /// Largest buffer in bytes.
        max_size: u64,
    }
);

message!(
    /// GET_DEVICE_MEMORY: a device's free and total memory.
    GetDeviceMemoryRequest, "GET_DEVICE_MEMORY request" {
        /// Device index.
        device: u32,
    }
);
request!(GetDeviceMemoryRequest => GetDeviceMemory, GetDeviceMemoryResponse);

message!(
    /// GET_DEVICE_MEMORY's answer.
    GetDeviceMemoryResponse, "GET_DEVICE_MEMORY response" {
        /// Free bytes.
        free: u64,
        /// Total bytes.
        total: u64,
    }
);

message!(
    /// ALLOC_BUFFER: allocate `size` bytes on a device.
    AllocBufferRequest, "ALLOC_BUFFER request" {
        /// Device index.
        device: u32,
        /// Bytes wanted.
        size: u64,
    }
);
request!(AllocBufferRequest => AllocBuffer, AllocBufferResponse);

message!(
    /// ALLOC_BUFFER's answer; `remote_ptr == 0` is the protocol's "allocation failed".
    AllocBufferResponse, "ALLOC_BUFFER response" {
        /// The buffer's handle (0: none).
        remote_ptr: u64,
        /// Its size.
        remote_size: u64,
    }
);

message!(
    /// BUFFER_GET_BASE: a buffer's base address.
    BufferGetBaseRequest, "BUFFER_GET_BASE request" {
        /// The buffer's handle.
        remote_ptr: u64,
    }
);
request!(BufferGetBaseRequest => BufferGetBase, BufferGetBaseResponse);

message!(
    /// BUFFER_GET_BASE's answer.
    BufferGetBaseResponse, "BUFFER_GET_BASE response" {
        /// Server address of the buffer's first byte.
        base_ptr: u64,
    }
);

message!(
    /// FREE_BUFFER: free a buffer (no answer).
    FreeBufferRequest, "FREE_BUFFER request" {
        /// The buffer's handle.
        remote_ptr: u64,
    }
);
request!(FreeBufferRequest => FreeBuffer, NoResponse);

message!(
    /// BUFFER_CLEAR: fill a whole buffer with one byte (no answer).
    BufferClearRequest, "BUFFER_CLEAR request" {
        /// The buffer's handle.
        remote_ptr: u64,
        /// The byte.
        value: u8,
    }
);
request!(BufferClearRequest => BufferClear, NoResponse);

message!(
    /// SET_TENSOR's fixed part; the data bytes follow it in the same payload (see
    /// [`SetTensorRequest::split`]). No answer.
    SetTensorRequest, "SET_TENSOR request" {
        /// Destination tensor.
        tensor: RpcTensor,
        /// Ask a caching server to keep the data under its hash.
        cache: bool,
        /// Byte offset into the tensor.
        offset: u64,
    }
);
request!(SetTensorRequest => SetTensor, NoResponse);

impl SetTensorRequest {
    /// The fixed part of a whole SET_TENSOR payload, and the data after it.
    ///
    /// ```
    /// use backend_rpc::wire::{Payload, RpcTensor, SetTensorRequest};
    /// let req = SetTensorRequest { tensor: RpcTensor::default(), cache: false, offset: 8 };
    /// let mut payload = req.to_bytes();
    /// payload.extend_from_slice(&[1, 2, 3]);
    /// assert_eq!(SetTensorRequest::split(&payload)?, (req, &[1u8, 2, 3][..]));
    /// # Ok::<(), backend_rpc::wire::WireError>(())
    /// ```
    pub fn split(payload: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new(payload, Self::WHAT);
        let req = Self::read(&mut r)?;
        let data = r.bytes(r.remaining())?;
        Ok((req, data))
    }
}

message!(
    /// SET_TENSOR_HASH: write from the server's cache the data with this hash.
    SetTensorHashRequest, "SET_TENSOR_HASH request" {
        /// Destination tensor.
        tensor: RpcTensor,
        /// Byte offset into the tensor.
        offset: u64,
        /// FNV-1a 64 of the data ([`fnv1a64`]).
        hash: u64,
    }
);
request!(SetTensorHashRequest => SetTensorHash, SetTensorHashResponse);

message!(
    /// SET_TENSOR_HASH's answer.
    SetTensorHashResponse, "SET_TENSOR_HASH response" {
        /// Written from the cache; `false`: send the data with SET_TENSOR.
        found: bool,
    }
);

message!(
    /// GET_TENSOR: read `size` bytes of a tensor from `offset`; the answer is those bytes
    /// ([`TensorData`]).
    GetTensorRequest, "GET_TENSOR request" {
        /// Source tensor.
        tensor: RpcTensor,
        /// Byte offset into the tensor.
        offset: u64,
        /// Bytes wanted.
        size: u64,
    }
);
request!(GetTensorRequest => GetTensor, TensorData);

/// GET_TENSOR's answer: the bytes themselves (as many as were asked for).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TensorData(pub Vec<u8>);

impl Payload for TensorData {
    const WHAT: &'static str = "GET_TENSOR response";
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TensorData(r.bytes(r.remaining())?.to_vec()))
    }
}

message!(
    /// COPY_TENSOR: copy `src` into `dst`, both on this server.
    CopyTensorRequest, "COPY_TENSOR request" {
        /// Source tensor.
        src: RpcTensor,
        /// Destination tensor.
        dst: RpcTensor,
    }
);
request!(CopyTensorRequest => CopyTensor, CopyTensorResponse);

message!(
    /// COPY_TENSOR's answer.
    CopyTensorResponse, "COPY_TENSOR response" {
        /// Copied; `false`: the server could not (the client copies through the host).
        copied: bool,
    }
);

message!(
    /// INIT_TENSOR: initialise a tensor in its buffer (no answer).
    InitTensorRequest, "INIT_TENSOR request" {
        /// The tensor.
        tensor: RpcTensor,
    }
);
request!(InitTensorRequest => InitTensor, NoResponse);

message!(
    /// GET_ALLOC_SIZE: bytes a tensor needs in a device's buffers; sources with id 0 are
    /// absent.
    GetAllocSizeRequest, "GET_ALLOC_SIZE request" {
        /// Device index.
        device: u32,
        /// The tensor.
        tensor: RpcTensor,
        /// Its sources.
        srcs: [RpcTensor; 10],
    }
);
request!(GetAllocSizeRequest => GetAllocSize, GetAllocSizeResponse);

message!(
    /// GET_ALLOC_SIZE's answer.
    GetAllocSizeResponse, "GET_ALLOC_SIZE response" {
        /// Bytes.
        alloc_size: u64,
    }
);

message!(
    /// GRAPH_RECOMPUTE: compute the stored graph again (no answer).
    GraphRecomputeRequest, "GRAPH_RECOMPUTE request" {
        /// Device index.
        device: u32,
    }
);
request!(GraphRecomputeRequest => GraphRecompute, NoResponse);

message!(
    /// MEMSET_TENSOR: fill `size` bytes of a tensor from `offset` (no answer).
    MemsetTensorRequest, "MEMSET_TENSOR request" {
        /// The tensor.
        tensor: RpcTensor,
        /// Byte offset into the tensor.
        offset: u64,
        /// Bytes to fill.
        size: u64,
        /// The byte.
        value: u8,
    }
);
request!(MemsetTensorRequest => MemsetTensor, NoResponse);
