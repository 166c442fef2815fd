//! The weights file: memory-mapped, parsed once, used in place.
//!
//! Why a map and not a read: the 87 MiB of weights are only ever read, so mapping the file
//! lets the CPU backend compute straight from the page cache — no copy, no second resident
//! copy, and start-up does not touch pages a run never needs. The safetensors header gives, for
//! each tensor, its type, its shape (outermost first, PyTorch order) and its byte range in the
//! data section; [`WeightFile`] keeps that table and hands out the data section as
//! [`HostMemory`] for a buffer over it.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend_core::HostMemory;
use graph::ElementType;
use memmap2::Mmap;

use crate::error::{MinilmError, Result};

/// One tensor of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightInfo {
    /// Element type.
    pub ty: ElementType,
    /// Shape as stored: outermost dimension first (PyTorch order).
    pub shape: Vec<usize>,
    /// Byte range inside the data section (not the file).
    pub range: Range<usize>,
}

impl WeightInfo {
    /// ggml-order extents: innermost first, so a `[out, in]` linear weight becomes
    /// `ne = [in, out]`, the layout `mul_mat` wants for its first operand.
    pub fn ne(&self) -> Vec<i64> {
        self.shape.iter().rev().map(|&d| d as i64).collect()
    }
}

/// A memory-mapped safetensors file and its tensor table.
///
/// ```no_run
/// let dir = minilm::find_model_dir(None)?;
/// let file = minilm::WeightFile::open(&dir.join("model.safetensors"))?;
/// let emb = file.info("embeddings.word_embeddings.weight").unwrap();
/// assert_eq!(emb.shape, [30522, 384]);
/// assert_eq!(file.bytes(emb).len(), 30522 * 384 * 4);
/// # Ok::<(), minilm::MinilmError>(())
/// ```
#[derive(Debug)]
pub struct WeightFile {
    path: PathBuf,
    map: Arc<Mmap>,
    data_start: usize,
    table: BTreeMap<String, WeightInfo>,
}

/// The data section of a mapped file, as the bytes a host-memory buffer is placed over.
/// Keeps the map alive for as long as any buffer uses it.
struct DataSection {
    map: Arc<Mmap>,
    start: usize,
}

impl AsRef<[u8]> for DataSection {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..]
    }
}

impl WeightFile {
    /// Maps and parses `path`. Only f32, f16 and bf16 tensors are accepted as weights; other
    /// tensors (BERT's i64 `position_ids`) are listed with `ty = None` and skipped.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| MinilmError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Another process truncating
        // or rewriting the file while we run would change the bytes under us (or fault); that
        // is the accepted contract of memory-mapped model files, as in every inference engine,
        // and no Rust invariant depends on the bytes' values (they are read as plain numbers).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_map(path, Arc::new(map))
    }

    fn from_map(path: &Path, map: Arc<Mmap>) -> Result<Self> {
        let bad = |message: String| MinilmError::Safetensors {
            path: path.to_owned(),
            message,
        };
        let (header_len, meta) =
            safetensors::SafeTensors::read_metadata(&map[..]).map_err(|e| bad(e.to_string()))?;
        let data_start = 8 + header_len;
        let data_len = map.len().saturating_sub(data_start);
        let mut table = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let ty = match info.dtype {
                safetensors::Dtype::F32 => ElementType::F32,
                safetensors::Dtype::F16 => ElementType::F16,
                safetensors::Dtype::BF16 => ElementType::BF16,
                safetensors::Dtype::I32 => ElementType::I32,
                _ => continue,
            };
            let (a, b) = info.data_offsets;
            if a > b || b > data_len {
                return Err(bad(format!(
                    "{name}: data range {a}..{b} outside {data_len}"
                )));
            }
            let n: usize = info.shape.iter().product();
            if n * ty.type_size() != b - a {
                return Err(bad(format!(
                    "{name}: {} bytes for shape {:?}",
                    b - a,
                    info.shape
                )));
            }
            table.insert(
                name,
                WeightInfo {
                    ty,
                    shape: info.shape.clone(),
                    range: a..b,
                },
            );
        }
        tracing::debug!(
            path = %path.display(),
            tensors = table.len(),
            data_start,
            "weights mapped"
        );
        Ok(WeightFile {
            path: path.to_owned(),
            map,
            data_start,
            table,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor called `name`.
    pub fn info(&self, name: &str) -> Option<&WeightInfo> {
        self.table.get(name)
    }

    /// Every usable tensor, by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &WeightInfo)> {
        self.table.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The tensor's bytes, in place in the map.
    pub fn bytes(&self, info: &WeightInfo) -> &[u8] {
        &self.map[self.data_start..][info.range.clone()]
    }

    /// Size of the data section in bytes.
    pub fn data_len(&self) -> usize {
        self.map.len() - self.data_start
    }

    /// Where the data section starts in the file. A buffer over [`WeightFile::host_memory`]
    /// sees tensor `t` at offset `t.range.start`.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// The data section as read-only host memory that a CPU buffer can be placed over. The
    /// memory keeps the map alive.
    pub fn host_memory(&self) -> HostMemory {
        HostMemory::read_only(DataSection {
            map: Arc::clone(&self.map),
            start: self.data_start,
        })
    }
}
