//! Tokenisation and batching.
//!
//! Sentences of one batch are padded to the longest one (not to a fixed length): attention cost
//! grows with the square of the padded length, and the padding mask and pooling weights make
//! the result independent of how much padding there is.

use std::path::Path;

use crate::error::{MinilmError, Result};

/// A batch of tokenised sentences, padded to the longest.
///
/// Token `t` of sentence `b` is at index `b * n_tokens + t` of [`Batch::ids`] and
/// [`Batch::type_ids`]; positions at or past `lengths[b]` are padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Padded length (the longest sentence's token count).
    pub n_tokens: usize,
    /// Token ids, `n_batch * n_tokens`, padding = the pad id.
    pub ids: Vec<i32>,
    /// Token type ids, same layout.
    pub type_ids: Vec<i32>,
    /// Real token count of each sentence (including `[CLS]` and `[SEP]`).
    pub lengths: Vec<usize>,
}

impl Batch {
    /// Sentences in the batch.
    pub fn n_batch(&self) -> usize {
        self.lengths.len()
    }

    /// Builds a batch from per-sentence token ids (all type 0), padding with `pad_id`.
    ///
    /// ```
    /// let b = minilm::Batch::from_ids(&[vec![101, 7, 102], vec![101, 102]], 0);
    /// assert_eq!(b.n_tokens, 3);
    /// assert_eq!(b.ids, [101, 7, 102, 101, 102, 0]);
    /// assert_eq!(b.lengths, [3, 2]);
    /// ```
    pub fn from_ids(seqs: &[Vec<i32>], pad_id: i32) -> Batch {
        let n_tokens = seqs.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(n_tokens * seqs.len());
        for s in seqs {
            ids.extend_from_slice(s);
            ids.extend(std::iter::repeat_n(pad_id, n_tokens - s.len()));
        }
        Batch {
            n_tokens,
            type_ids: vec![0; ids.len()],
            ids,
            lengths: seqs.iter().map(Vec::len).collect(),
        }
    }

    /// The attention mask as 0/1 per token, `n_batch * n_tokens` (what HF models take).
    pub fn attention_mask(&self) -> Vec<u32> {
        let mut m = Vec::with_capacity(self.ids.len());
        for &len in &self.lengths {
            m.extend((0..self.n_tokens).map(|t| u32::from(t < len)));
        }
        m
    }
}

/// The model's WordPiece tokenizer, with truncation to the model's longest input and no
/// padding (batches are padded by [`Batch`]).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_len: usize,
    pad_id: i32,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("max_len", &self.max_len)
            .field("pad_id", &self.pad_id)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`; inputs are truncated to `max_len` tokens.
    pub fn from_file(path: &Path, max_len: usize) -> Result<Self> {
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| MinilmError::Tokenizer(format!("{}: {e}", path.display())))?;
        let pad_id = inner
            .get_padding()
            .map(|p| p.pad_id)
            .or_else(|| inner.token_to_id("[PAD]"))
            .unwrap_or(0);
        inner.with_padding(None);
        inner
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(|e| MinilmError::Tokenizer(e.to_string()))?;
        Ok(Tokenizer {
            inner,
            max_len,
            pad_id: i32::try_from(pad_id)
                .map_err(|_| MinilmError::Tokenizer("pad id out of range".into()))?,
        })
    }

    /// Longest input in tokens.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Token ids of one sentence, with `[CLS]` and `[SEP]`.
    pub fn encode(&self, sentence: &str) -> Result<Vec<i32>> {
        let enc = self
            .inner
            .encode(sentence, true)
            .map_err(|e| MinilmError::Tokenizer(e.to_string()))?;
        enc.get_ids()
            .iter()
            .map(|&id| i32::try_from(id).map_err(|_| MinilmError::Tokenizer("id too large".into())))
            .collect()
    }

    /// Tokenises `sentences` into one padded batch.
    pub fn batch<S: AsRef<str>>(&self, sentences: &[S]) -> Result<Batch> {
        if sentences.is_empty() {
            return Err(MinilmError::NoInput);
        }
        let seqs = sentences
            .iter()
            .map(|s| self.encode(s.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Batch::from_ids(&seqs, self.pad_id))
    }
}
