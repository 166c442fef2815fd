//! The one error type of the crate: every way a file can be unreadable has its own variant,
//! naming the field, key or tensor at fault and where it sits in the file.

use std::path::PathBuf;

/// Result with [`GgufError`].
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// What is wrong with a GGUF file, or with a request made of one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening or mapping the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found (zero-padded if the file is shorter).
        found: [u8; 4],
    },
    /// A version other than 2 or 3.
    #[error("GGUF version {0} is not supported (only 2 and 3 are)")]
    UnsupportedVersion(u32),
    /// A big-endian file (its version reads byte-swapped).
    #[error("big-endian GGUF files are not supported (version field {0:#010x})")]
    BigEndian(u32),
    /// The file ends before a field does.
    #[error("truncated: {what} needs {needed} bytes at offset {offset}, only {available} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A count read as signed is negative.
    #[error("{what} is negative ({value})")]
    Negative {
        /// The field.
        what: &'static str,
        /// Its value.
        value: i64,
    },
    /// A count whose elements cannot possibly fit in the bytes left (checked before anything
    /// is allocated for them).
    #[error(
        "{what} {count} at offset {offset} cannot fit in the {available} bytes left \
         (at least {min_size} bytes each)"
    )]
    CountTooLarge {
        /// The counted thing.
        what: &'static str,
        /// The count.
        count: u64,
        /// Where the count was read.
        offset: u64,
        /// Bytes left after it.
        available: u64,
        /// The smallest encoding of one element.
        min_size: u64,
    },
    /// A string that is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 {
        /// The field.
        what: &'static str,
        /// Where its bytes start.
        offset: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("bool at offset {offset} is {byte}, not 0 or 1")]
    BadBool {
        /// Where it is.
        offset: u64,
        /// The byte.
        byte: u8,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("unknown metadata value type {0}")]
    BadValueType(u32),
    /// An array whose elements are arrays (llama.cpp refuses them too).
    #[error("arrays of arrays are not supported")]
    NestedArray,
    /// A metadata key of length zero.
    #[error("empty metadata key")]
    EmptyKey,
    /// The same key twice.
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    /// Something wrong inside metadata pair `index` (`key` is empty if the key itself could
    /// not be read).
    #[error("metadata pair {index} `{key}`: {source}")]
    InKv {
        /// Position of the pair in the file.
        index: u64,
        /// Its key, if read.
        key: String,
        /// What is wrong.
        source: Box<GgufError>,
    },
    /// `general.alignment` is not a power of two, or not a u32.
    #[error("general.alignment: {0}")]
    BadAlignment(String),
    /// Something wrong inside tensor info `index` (`name` is empty if the name itself could
    /// not be read).
    #[error("tensor info {index} `{name}`: {source}")]
    InTensor {
        /// Position of the record in the file.
        index: u64,
        /// Its name, if read.
        name: String,
        /// What is wrong.
        source: Box<GgufError>,
    },
    /// A tensor name of 64 bytes or more (ggml keeps names in 64 bytes with a NUL).
    #[error("name is {0} bytes long (at most 63 allowed)")]
    NameTooLong(usize),
    /// Two tensors with one name.
    #[error("duplicate tensor name")]
    DuplicateTensor,
    /// More than 4 dimensions.
    #[error("{0} dimensions (at most 4 allowed)")]
    TooManyDims(u32),
    /// A ggml type id this crate does not know (or ggml removed).
    #[error("unknown ggml type id {0}")]
    UnknownType(u32),
    /// The row length is not a whole number of blocks.
    #[error("row length {ne0} is not a multiple of the {ty} block size {block}")]
    PartialBlock {
        /// Row length.
        ne0: u64,
        /// The type's name.
        ty: &'static str,
        /// Its block size.
        block: u64,
    },
    /// The element count or byte size overflows.
    #[error("shape {0:?} overflows the element count or byte size")]
    SizeOverflow([u64; 4]),
    /// A data offset other than the running sum of the padded sizes before it.
    #[error("data offset {found}, expected {expected} (tensors must be packed in file order)")]
    BadOffset {
        /// The offset in the file.
        found: u64,
        /// The running sum.
        expected: u64,
    },
    /// Tensor data beyond the end of the file.
    #[error("data bytes {start}..{end} of the file lie beyond its end ({file_len} bytes)")]
    OutOfFile {
        /// First byte (from the start of the file).
        start: u64,
        /// One past the last.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A metadata key that is not there.
    #[error("metadata key `{0}` not found")]
    MissingKey(String),
    /// A metadata value of another type than asked for.
    #[error("metadata key `{key}` holds {found}, not {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What was asked for.
        expected: &'static str,
        /// What it holds.
        found: String,
    },
    /// A tensor name that is not in the file.
    #[error("tensor `{0}` not found")]
    MissingTensor(String),
    /// Creating the graph tensor failed.
    #[error(transparent)]
    Graph(#[from] graph::GraphError),
    /// Creating the buffer or placing the tensor failed.
    #[error(transparent)]
    Backend(#[from] backend_core::BackendError),
}

impl GgufError {
    /// The innermost error, past the [`GgufError::InKv`] / [`GgufError::InTensor`] context.
    ///
    /// ```
    /// let err = gguf::Header::parse(b"GGUF\x01\0\0\0").unwrap_err();
    /// assert!(matches!(err.root(), gguf::GgufError::UnsupportedVersion(1)));
    /// ```
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::InKv { source, .. } | GgufError::InTensor { source, .. } => source.root(),
            other => other,
        }
    }
}
