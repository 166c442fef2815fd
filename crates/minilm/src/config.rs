//! The model's JSON configuration files.
//!
//! Only the fields that change the computation are read; anything this crate does not implement
//! (another activation, relative positions, CLS pooling) is refused with
//! [`MinilmError::Unsupported`] rather than silently computed wrong.

use std::path::Path;

use serde::Deserialize;

use crate::error::{MinilmError, Result};

/// The BERT hyper-parameters from `config.json`.
///
/// ```
/// let cfg: minilm::BertConfig = serde_json::from_str(r#"{
///     "hidden_size": 384, "num_attention_heads": 12, "num_hidden_layers": 6,
///     "intermediate_size": 1536, "vocab_size": 30522, "max_position_embeddings": 512,
///     "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"
/// }"#).unwrap();
/// assert_eq!(cfg.head_dim(), 32);
/// cfg.validate().unwrap();
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct BertConfig {
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Rows of the position embedding table (longest input).
    pub max_position_embeddings: usize,
    /// Rows of the token type table.
    pub type_vocab_size: usize,
    /// Epsilon of every layer norm.
    pub layer_norm_eps: f64,
    /// Feed-forward activation; only `gelu` (the exact erf form) is implemented.
    pub hidden_act: String,
    /// Position embedding kind; only `absolute`.
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn absolute() -> String {
    "absolute".to_owned()
}

impl BertConfig {
    /// Reads `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| MinilmError::Io {
            path: path.to_owned(),
            source,
        })?;
        let cfg: BertConfig =
            serde_json::from_str(&text).map_err(|source| MinilmError::Config {
                path: path.to_owned(),
                source,
            })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Refuses configurations this crate would compute wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(MinilmError::Unsupported(s));
        if self.hidden_act != "gelu" {
            return bad(format!("hidden_act {:?} (only \"gelu\")", self.hidden_act));
        }
        if self.position_embedding_type != "absolute" {
            return bad(format!(
                "position_embedding_type {:?} (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        if self.num_attention_heads == 0
            || self.hidden_size == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return bad(format!(
                "hidden_size {} is not a positive multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.num_hidden_layers == 0
            || self.intermediate_size == 0
            || self.vocab_size == 0
            || self.max_position_embeddings == 0
            || self.type_vocab_size == 0
        {
            return bad("a zero-sized dimension".to_owned());
        }
        Ok(())
    }
}

/// `1_Pooling/config.json`: how token states become one sentence vector.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PoolingConfig {
    /// Width of the pooled vector.
    pub word_embedding_dimension: usize,
    /// Mean over real tokens (the only mode implemented).
    #[serde(default)]
    pub pooling_mode_mean_tokens: bool,
    /// CLS-token pooling (not implemented).
    #[serde(default)]
    pub pooling_mode_cls_token: bool,
    /// Max pooling (not implemented).
    #[serde(default)]
    pub pooling_mode_max_tokens: bool,
}

impl PoolingConfig {
    /// Reads the pooling config; a missing file means mean pooling (what the model ships).
    pub fn from_file(path: &Path, hidden_size: usize) -> Result<Self> {
        if !path.exists() {
            return Ok(PoolingConfig {
                word_embedding_dimension: hidden_size,
                pooling_mode_mean_tokens: true,
                pooling_mode_cls_token: false,
                pooling_mode_max_tokens: false,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| MinilmError::Io {
            path: path.to_owned(),
            source,
        })?;
        let p: PoolingConfig =
            serde_json::from_str(&text).map_err(|source| MinilmError::Config {
                path: path.to_owned(),
                source,
            })?;
        if !p.pooling_mode_mean_tokens || p.pooling_mode_cls_token || p.pooling_mode_max_tokens {
            return Err(MinilmError::Unsupported(
                "pooling other than mean over tokens".to_owned(),
            ));
        }
        if p.word_embedding_dimension != hidden_size {
            return Err(MinilmError::Unsupported(format!(
                "pooling width {} differs from hidden size {hidden_size}",
                p.word_embedding_dimension
            )));
        }
        Ok(p)
    }
}

/// `sentence_bert_config.json`: the longest input the sentence model was used with.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct SentenceConfig {
    /// Inputs are truncated to this many tokens (including `[CLS]` and `[SEP]`).
    pub max_seq_length: usize,
}

impl SentenceConfig {
    /// Reads the file; when it is absent, `default_len` is used.
    pub fn from_file(path: &Path, default_len: usize) -> Result<Self> {
        if !path.exists() {
            return Ok(SentenceConfig {
                max_seq_length: default_len,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| MinilmError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| MinilmError::Config {
            path: path.to_owned(),
            source,
        })
    }
}
