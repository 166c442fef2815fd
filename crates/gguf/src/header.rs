//! The header: magic, version, counts, metadata, tensor infos, alignment and data offset.
//!
//! Parsing works on a byte slice and never looks past it, so it can run on the first few
//! megabytes of a file (the header of a 100 MB model ends at 1.8 MB) as well as on a whole
//! mapped file; [`Header::check_bounds`] then checks the tensors against the file's length.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::reader::Reader;
use crate::tensor::{TensorInfo, read_infos};
use crate::value::{Metadata, Value, ValueType};

/// `GGUF` in the first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`].
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Smallest encoding of a key/value pair: key length, value type, one byte of value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest encoding of a tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// A parsed GGUF header.
///
/// ```
/// // The smallest valid file: version 3, no tensors, no metadata.
/// let mut bytes = b"GGUF".to_vec();
/// bytes.extend(3u32.to_le_bytes());
/// bytes.extend(0i64.to_le_bytes());
/// bytes.extend(0i64.to_le_bytes());
/// let header = gguf::Header::parse(&bytes)?;
/// assert_eq!(header.version(), 3);
/// assert_eq!(header.alignment(), 32);
/// assert_eq!(header.data_offset(), 32); // 24 header bytes, padded to the alignment
/// # Ok::<(), gguf::GgufError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl Header {
    /// Parses the header at the start of `bytes` (a whole file or a prefix of it that holds
    /// the whole header).
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let mut r = Reader::new(bytes);
        let magic: [u8; 4] = match r.take(4, "magic") {
            Ok(m) => m.try_into().unwrap_or([0; 4]),
            Err(_) => {
                // `take(4)` failed: fewer than 4 bytes.
                let mut found = [0u8; 4];
                found[..bytes.len()].copy_from_slice(bytes);
                return Err(GgufError::BadMagic { found });
            }
        };
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32("version")?;
        if version & 0xFFFF == 0 {
            return Err(GgufError::BigEndian(version));
        }
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.signed_count("tensor count", MIN_TENSOR_INFO_SIZE)?;
        let n_kv = r.signed_count("metadata pair count", MIN_KV_SIZE)?;
        let metadata = read_metadata(&mut r, n_kv)?;
        let alignment = alignment(&metadata)?;
        let (tensors, by_name) = read_infos(&mut r, n_tensors, alignment)?;
        let data_offset =
            (r.pos() as u64)
                .checked_next_multiple_of(alignment)
                .ok_or(GgufError::BadAlignment(format!(
                    "{alignment} overflows the data offset"
                )))?;
        tracing::debug!(
            version,
            tensors = tensors.len(),
            kv = metadata.len(),
            alignment,
            data_offset,
            "gguf header parsed"
        );
        Ok(Header {
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_offset,
        })
    }

    /// Checks that every tensor's bytes lie inside a file of `file_len` bytes.
    pub fn check_bounds(&self, file_len: u64) -> Result<()> {
        for (index, t) in self.tensors.iter().enumerate() {
            let start = self.data_offset.checked_add(t.offset());
            let end = start.and_then(|s| s.checked_add(t.nbytes()));
            match (start, end) {
                (Some(_), Some(end)) if end <= file_len => {}
                _ => {
                    return Err(GgufError::InTensor {
                        index: index as u64,
                        name: t.name().to_owned(),
                        source: Box::new(GgufError::OutOfFile {
                            start: start.unwrap_or(u64::MAX),
                            end: end.unwrap_or(u64::MAX),
                            file_len,
                        }),
                    });
                }
            }
        }
        Ok(())
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// The key/value pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))
    }
    /// Alignment of the data section and of each tensor's offset.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Where the data section starts, from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    /// Bytes the tensors take in the data section, padding between them included (the end
    /// of the last tensor).
    pub fn data_size(&self) -> u64 {
        // Offsets are the running sum, so the last tensor ends the section (checked add at
        // parse time covers offset + padded size, which is ≥ offset + nbytes).
        self.tensors.last().map_or(0, |t| t.offset() + t.nbytes())
    }
}

fn read_metadata(r: &mut Reader<'_>, n_kv: usize) -> Result<Metadata> {
    let mut metadata = Metadata::default();
    for index in 0..n_kv {
        let mut key = String::new();
        let result = (|| {
            key = r.string("metadata key")?;
            let id = r.u32("metadata value type")?;
            let ty = ValueType::from_id(id).ok_or(GgufError::BadValueType(id))?;
            Value::read(r, ty)
        })();
        let in_kv = |key: String, e| GgufError::InKv {
            index: index as u64,
            key,
            source: Box::new(e),
        };
        match result {
            Ok(value) => metadata
                .push(key.clone(), value)
                .map_err(|e| in_kv(key, e))?,
            Err(e) => return Err(in_kv(key, e)),
        }
    }
    Ok(metadata)
}

fn alignment(metadata: &Metadata) -> Result<u64> {
    match metadata.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(GgufError::BadAlignment(format!(
            "{a} is not a power of two"
        ))),
        Some(other) => Err(GgufError::BadAlignment(format!(
            "holds {}, not u32",
            other.type_name()
        ))),
    }
}
