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
/// Fixed part of a SET_TENSOR payload before the data: tensor, cache flag, offset.
pub const SET_TENSOR_FIXED: usize = RPC_TENSOR_SIZE + 1 + 8;
/// Size of a GET_ALLOC_SIZE payload: device, tensor and ten sources.
pub const GET_ALLOC_SIZE_SIZE: usize = 4 + RPC_TENSOR_SIZE * 11;

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
            AllocBuffer => 12,
            GetAlignment | GetMaxSize | GetDeviceMemory | GraphRecompute => 4,
            BufferGetBase | FreeBuffer => 8,
            BufferClear => 9,
            SetTensorHash | GetTensor => RPC_TENSOR_SIZE + 16,
            CopyTensor => 2 * RPC_TENSOR_SIZE,
            InitTensor => RPC_TENSOR_SIZE,
            GetAllocSize => GET_ALLOC_SIZE_SIZE,
            Hello => CONN_CAPS_SIZE,
            DeviceCount => 0,
            MemsetTensor => RPC_TENSOR_SIZE + 17,
            SetTensor | GraphCompute => return None,
        })
    }

    /// The exact response payload size, where it does not depend on the request
    /// (GET_TENSOR's is the requested size).
    pub fn fixed_response_size(self) -> Option<usize> {
        use Command::*;
        Some(match self {
            AllocBuffer | GetDeviceMemory => 16,
            GetAlignment | GetMaxSize | BufferGetBase | GetAllocSize => 8,
            SetTensorHash | CopyTensor => 1,
            Hello => 4 + CONN_CAPS_SIZE,
            DeviceCount => 4,
            _ => return None,
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
