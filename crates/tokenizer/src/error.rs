//! Errors: a vocabulary the tokenizer cannot be built from, and ids outside it.

/// Result with [`TokenizerError`].
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// Why a tokenizer could not be built, or a request could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key is missing or of the wrong type.
    #[error(transparent)]
    Metadata(#[from] gguf::GgufError),
    /// `tokenizer.ggml.model` is not `gpt2` (byte-level BPE).
    #[error("tokenizer model `{0}` is not supported (only `gpt2`, byte-level BPE)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("pre-tokenizer `{0}` is not supported (only `smollm`)")]
    UnsupportedPre(String),
    /// The vocabulary is inconsistent (array lengths, special ids).
    #[error("bad vocabulary: {0}")]
    BadVocab(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
}
