//! A GGUF file as the [`ModelFile`] the model is built from.
//!
//! The `gguf` crate parses and bounds-checks the file; this adapter only exposes its
//! metadata and tensor table through the crate's small [`Metadata`] / [`ModelFile`] traits,
//! which synthetic models in tests implement too.

use std::path::Path;

use backend_core::HostMemory;
use gguf::{Array, GgufFile, Value};

use crate::error::{LlmError, Result};
use crate::hparams::Metadata;
use crate::weights::{ModelFile, TensorEntry};

/// Opens and parses a GGUF file (memory-mapped).
///
/// ```no_run
/// let file = llm::open_gguf(&llm::find_model(None)?)?;
/// assert!(file.tensor("token_embd.weight").is_ok());
/// # Ok::<(), llm::LlmError>(())
/// ```
pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    GgufFile::open(path).map_err(|e| LlmError::Gguf(format!("{}: {e}", path.display())))
}

impl Metadata for GgufFile {
    fn string(&self, key: &str) -> Option<&str> {
        match self.metadata().get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    fn uint(&self, key: &str) -> Option<u64> {
        match *self.metadata().get(key)? {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    fn float(&self, key: &str) -> Option<f32> {
        match *self.metadata().get(key)? {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    fn array_len(&self, key: &str) -> Option<usize> {
        match self.metadata().get(key)? {
            Value::Array(a) => Some(Array::len(a)),
            _ => None,
        }
    }
}

impl ModelFile for GgufFile {
    fn tensor(&self, name: &str) -> Option<TensorEntry> {
        let t = GgufFile::tensor(self, name).ok()?;
        Some(TensorEntry {
            ty: t.ty(),
            ne: t.ne_i64(),
            offset: usize::try_from(t.offset()).ok()?,
            size: usize::try_from(t.nbytes()).ok()?,
        })
    }

    fn data(&self) -> &[u8] {
        GgufFile::data(self)
    }

    fn host_memory(&self) -> HostMemory {
        GgufFile::host_memory(self)
    }
}
