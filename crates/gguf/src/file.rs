//! A GGUF file held in memory (normally a read-only map) with its parsed header, and the
//! bridge to the backend layer: its data section as [`HostMemory`], a weights buffer over it,
//! and graph tensors placed in that buffer at their file offsets.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use backend_core::{Buffer, BufferUsage, Device, HostMemory};
use graph::{Context, TensorId};

use crate::error::{GgufError, Result};
use crate::header::Header;
use crate::tensor::TensorInfo;

/// Whatever holds the file's bytes: a `memmap2::Mmap`, a `Vec<u8>`, …
type Owner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A parsed GGUF file whose tensors are used in place.
///
/// ```no_run
/// use gguf::GgufFile;
/// let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
/// let meta = file.metadata();
/// assert_eq!(meta.str("general.architecture")?, "llama");
///
/// // Weights used straight from the map: one CPU buffer over the data section, then one
/// // graph tensor per weight placed in it at its file offset (no copy).
/// let cpu = backend_cpu::cpu_device();
/// let buffer = file.weights_buffer(&cpu)?;
/// let mut ctx = graph::Context::new();
/// let embd = file.place_tensor(&mut ctx, &buffer, "token_embd.weight")?;
/// assert_eq!(ctx[embd].ne()[0], 576);
/// # Ok::<(), gguf::GgufError>(())
/// ```
#[derive(Clone)]
pub struct GgufFile {
    bytes: Owner,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.len())
            .field("header", &self.header)
            .finish()
    }
}

/// The data section of the file as the bytes a host-memory buffer is placed over; keeps the
/// whole file (the map) alive for as long as any buffer uses it.
struct DataSection {
    bytes: Owner,
    start: usize,
}

impl AsRef<[u8]> for DataSection {
    fn as_ref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.start..]
    }
}

impl GgufFile {
    /// Maps the file at `path` read-only and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: a read-only, private map; memmap2 keeps it valid until the `Mmap` is dropped,
        // and this crate only ever reads it as plain bytes (every value is decoded with bounds
        // checks, no type is overlaid on it). Another process truncating or rewriting the file
        // while it is mapped would change the bytes under us or fault (SIGBUS): that is the
        // accepted contract of memory-mapped model files in every inference engine.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        tracing::debug!(path = %path.display(), len = map.len(), "gguf mapped");
        Self::from_bytes(map)
    }

    /// Parses a file already in memory (`Vec<u8>`, `Box<[u8]>`, a map made elsewhere…).
    ///
    /// ```
    /// let mut bytes = b"GGUF".to_vec();
    /// bytes.extend(2u32.to_le_bytes());
    /// bytes.extend([0u8; 16]); // no tensors, no metadata
    /// let file = gguf::GgufFile::from_bytes(bytes)?;
    /// assert_eq!(file.header().version(), 2);
    /// assert!(file.tensors().is_empty());
    /// # Ok::<(), gguf::GgufError>(())
    /// ```
    pub fn from_bytes<T>(bytes: T) -> Result<Self>
    where
        T: AsRef<[u8]> + Send + Sync + 'static,
    {
        let bytes: Owner = Arc::new(bytes);
        let all = (*bytes).as_ref();
        let header = Header::parse(all)?;
        header.check_bounds(all.len() as u64)?;
        Ok(GgufFile { bytes, header })
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }

    /// The file's length in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the file is empty (never, for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The key/value pairs.
    pub fn metadata(&self) -> &crate::Metadata {
        self.header.metadata()
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.header.tensors()
    }

    /// The tensor called `name`, or [`GgufError::MissingTensor`].
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensor(name)
    }

    /// Start of the data section in the file (clamped to the file's end when a file without
    /// tensors stops before its padding).
    fn data_start(&self) -> usize {
        usize::try_from(self.header.data_offset()).map_or(self.len(), |s| s.min(self.len()))
    }

    /// The data section: from [`Header::data_offset`] to the end of the file.
    pub fn data(&self) -> &[u8] {
        &self.as_bytes()[self.data_start()..]
    }

    /// A tensor's bytes, in place.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        let data = self.data();
        // Bounds were checked when the file was opened; an info from another file is refused.
        usize::try_from(info.offset())
            .ok()
            .zip(usize::try_from(info.nbytes()).ok())
            .and_then(|(start, n)| data.get(start..start.checked_add(n)?))
            .ok_or(GgufError::OutOfFile {
                start: info.offset(),
                end: info.offset().saturating_add(info.nbytes()),
                file_len: data.len() as u64,
            })
    }

    /// The data section as read-only host memory; a buffer over it sees each tensor at
    /// [`TensorInfo::offset`]. The memory keeps the file (the map) alive.
    pub fn host_memory(&self) -> HostMemory {
        HostMemory::read_only(DataSection {
            bytes: Arc::clone(&self.bytes),
            start: self.data_start(),
        })
    }

    /// A buffer of `device` over the data section (`buffer_from_host_memory`), with usage
    /// [`BufferUsage::Weights`] so the scheduler treats it as weights. Writes through it are
    /// refused (the memory is read-only).
    pub fn weights_buffer(&self, device: &Device) -> Result<Buffer> {
        let max_tensor = self
            .tensors()
            .iter()
            .map(|t| t.nbytes() as usize)
            .max()
            .unwrap_or(0);
        let buffer = device.buffer_from_host_memory(self.host_memory(), max_tensor)?;
        buffer.set_usage(BufferUsage::Weights);
        Ok(buffer)
    }

    /// A new graph tensor with the type and extents of tensor `name`, named after it and
    /// placed in `buffer` at its offset. `buffer` must be this file's
    /// [`GgufFile::weights_buffer`] (or another buffer over [`GgufFile::host_memory`]).
    pub fn place_tensor(&self, ctx: &mut Context, buffer: &Buffer, name: &str) -> Result<TensorId> {
        let info = self.tensor(name)?;
        let data_len = self.data().len();
        if buffer.size() != data_len {
            return Err(backend_core::BackendError::out_of_bounds(
                "place_tensor: buffer is not over this file's data section",
                info.offset() as usize,
                info.nbytes() as usize,
                buffer.size(),
            )
            .into());
        }
        let id = ctx.new_tensor(info.ty(), &info.ne_i64())?;
        ctx.set_name(id, info.name())?;
        backend_core::tensor_alloc(ctx, buffer, id, info.offset() as usize)?;
        Ok(id)
    }
}
