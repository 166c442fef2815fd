//! BERT's weights as graph tensors, and where their bytes live.
//!
//! Why weights are tensors of the same [`Context`] as each step's graph: a graph names its
//! sources by [`TensorId`], so weights are created once at the start of the context and every
//! batch builds after a checkpoint and rewinds to it. The scheduler then sees each weight's
//! buffer (mapped file on the CPU, or a device buffer for offloaded layers) and runs the ops
//! that use it on the backend that owns it.

use backend_core::{Buffer, BufferType, BufferUsage, Device, tensor_alloc, tensor_set};
use graph::{Context, ElementType, TensorId};

use crate::config::BertConfig;
use crate::error::{MinilmError, Result};
use crate::weights::WeightFile;

/// Weights of one encoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// Query projection `[hidden, hidden]` and bias.
    pub q_w: TensorId,
    /// Query bias.
    pub q_b: TensorId,
    /// Key projection.
    pub k_w: TensorId,
    /// Key bias.
    pub k_b: TensorId,
    /// Value projection.
    pub v_w: TensorId,
    /// Value bias.
    pub v_b: TensorId,
    /// Attention output projection.
    pub o_w: TensorId,
    /// Attention output bias.
    pub o_b: TensorId,
    /// Layer norm after attention: scale.
    pub ln1_w: TensorId,
    /// Layer norm after attention: shift.
    pub ln1_b: TensorId,
    /// Feed-forward up projection `[hidden, intermediate]` (ggml order).
    pub up_w: TensorId,
    /// Feed-forward up bias.
    pub up_b: TensorId,
    /// Feed-forward down projection.
    pub down_w: TensorId,
    /// Feed-forward down bias.
    pub down_b: TensorId,
    /// Layer norm after the feed-forward: scale.
    pub ln2_w: TensorId,
    /// Layer norm after the feed-forward: shift.
    pub ln2_b: TensorId,
}

impl LayerWeights {
    /// Every tensor of the layer.
    pub fn all(&self) -> [TensorId; 16] {
        [
            self.q_w,
            self.q_b,
            self.k_w,
            self.k_b,
            self.v_w,
            self.v_b,
            self.o_w,
            self.o_b,
            self.ln1_w,
            self.ln1_b,
            self.up_w,
            self.up_b,
            self.down_w,
            self.down_b,
            self.ln2_w,
            self.ln2_b,
        ]
    }
}

/// Every weight of the model, as tensors of one [`Context`], each named as in the file.
#[derive(Clone, Debug)]
pub struct BertWeights {
    /// Word embeddings `[hidden, vocab]` (ggml order).
    pub word_emb: TensorId,
    /// Position embeddings `[hidden, max_positions]`.
    pub pos_emb: TensorId,
    /// Token type embeddings `[hidden, type_vocab]`.
    pub type_emb: TensorId,
    /// Embedding layer norm: scale.
    pub emb_ln_w: TensorId,
    /// Embedding layer norm: shift.
    pub emb_ln_b: TensorId,
    /// The encoder layers, first to last.
    pub layers: Vec<LayerWeights>,
    /// File name of each tensor (indexed like [`BertWeights::all`]).
    names: Vec<(TensorId, String)>,
}

impl BertWeights {
    /// Creates one metadata-only tensor per weight in `ctx`, checking each against `cfg`.
    /// Names may carry a `bert.` prefix (checkpoints saved from `BertModel` wrappers).
    pub fn create(ctx: &mut Context, file: &WeightFile, cfg: &BertConfig) -> Result<Self> {
        let prefix = if file.info("embeddings.word_embeddings.weight").is_some() {
            ""
        } else {
            "bert."
        };
        let h = cfg.hidden_size as i64;
        let ff = cfg.intermediate_size as i64;
        let mut names = Vec::new();
        let mut get = |ctx: &mut Context, name: &str, ne: &[i64]| -> Result<TensorId> {
            let full = format!("{prefix}{name}");
            let info = file.info(&full).ok_or_else(|| MinilmError::BadWeight {
                name: full.clone(),
                why: "missing from the file".into(),
            })?;
            if info.ne() != ne {
                return Err(MinilmError::BadWeight {
                    name: full,
                    why: format!("shape {:?}, expected {:?} (ggml order)", info.ne(), ne),
                });
            }
            if info.ty != ElementType::F32 {
                return Err(MinilmError::BadWeight {
                    name: full,
                    why: format!("type {}, only f32 is supported", info.ty),
                });
            }
            let id = ctx.new_tensor(info.ty, ne)?;
            ctx.set_name(id, &short_name(&full))?;
            names.push((id, full));
            Ok(id)
        };
        let word_emb = get(
            ctx,
            "embeddings.word_embeddings.weight",
            &[h, cfg.vocab_size as i64],
        )?;
        let pos_emb = get(
            ctx,
            "embeddings.position_embeddings.weight",
            &[h, cfg.max_position_embeddings as i64],
        )?;
        let type_emb = get(
            ctx,
            "embeddings.token_type_embeddings.weight",
            &[h, cfg.type_vocab_size as i64],
        )?;
        let emb_ln_w = get(ctx, "embeddings.LayerNorm.weight", &[h])?;
        let emb_ln_b = get(ctx, "embeddings.LayerNorm.bias", &[h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{l}.");
            let mut w = |ctx: &mut Context, n: &str, ne: &[i64]| get(ctx, &format!("{p}{n}"), ne);
            layers.push(LayerWeights {
                q_w: w(ctx, "attention.self.query.weight", &[h, h])?,
                q_b: w(ctx, "attention.self.query.bias", &[h])?,
                k_w: w(ctx, "attention.self.key.weight", &[h, h])?,
                k_b: w(ctx, "attention.self.key.bias", &[h])?,
                v_w: w(ctx, "attention.self.value.weight", &[h, h])?,
                v_b: w(ctx, "attention.self.value.bias", &[h])?,
                o_w: w(ctx, "attention.output.dense.weight", &[h, h])?,
                o_b: w(ctx, "attention.output.dense.bias", &[h])?,
                ln1_w: w(ctx, "attention.output.LayerNorm.weight", &[h])?,
                ln1_b: w(ctx, "attention.output.LayerNorm.bias", &[h])?,
                up_w: w(ctx, "intermediate.dense.weight", &[h, ff])?,
                up_b: w(ctx, "intermediate.dense.bias", &[ff])?,
                down_w: w(ctx, "output.dense.weight", &[ff, h])?,
                down_b: w(ctx, "output.dense.bias", &[h])?,
                ln2_w: w(ctx, "output.LayerNorm.weight", &[h])?,
                ln2_b: w(ctx, "output.LayerNorm.bias", &[h])?,
            });
        }
        Ok(BertWeights {
            word_emb,
            pos_emb,
            type_emb,
            emb_ln_w,
            emb_ln_b,
            layers,
            names,
        })
    }

    /// Every weight tensor with its name in the file.
    pub fn all(&self) -> impl Iterator<Item = (TensorId, &str)> {
        self.names.iter().map(|(id, n)| (*id, n.as_str()))
    }

    /// The weights of the last `n` layers (those `--offload n` moves to a device).
    pub fn last_layers(&self, n: usize) -> Vec<TensorId> {
        let skip = self.layers.len().saturating_sub(n);
        self.layers[skip..]
            .iter()
            .flat_map(LayerWeights::all)
            .collect()
    }

    /// Places every weight not in `except` in `buffer`, a buffer over
    /// [`WeightFile::host_memory`], at its offset in the file's data section: no bytes move.
    pub fn place_in_file_buffer(
        &self,
        ctx: &mut Context,
        file: &WeightFile,
        buffer: &Buffer,
        except: &[TensorId],
    ) -> Result<usize> {
        let mut n = 0;
        for (id, name) in self.all() {
            if except.contains(&id) {
                continue;
            }
            let info = file.info(name).ok_or_else(|| MinilmError::BadWeight {
                name: name.to_owned(),
                why: "vanished from the table".into(),
            })?;
            tensor_alloc(ctx, buffer, id, info.range.start)?;
            n += info.range.len();
        }
        Ok(n)
    }

    /// Allocates one weights buffer of `buft` for `ids`, places them in it back to back
    /// (aligned), and copies their bytes from the file. Returns the buffer, which must be
    /// kept alive as long as the tensors are used.
    pub fn place_copied(
        &self,
        ctx: &mut Context,
        file: &WeightFile,
        buft: &BufferType,
        ids: &[TensorId],
    ) -> Result<Buffer> {
        let align = buft.alignment().max(1);
        let mut offsets = Vec::with_capacity(ids.len());
        let mut size = 0usize;
        for &id in ids {
            offsets.push(size);
            size += buft.alloc_size(ctx.get(id)?).next_multiple_of(align);
        }
        let buffer = buft.alloc_buffer(size)?;
        buffer.set_usage(BufferUsage::Weights);
        for (&id, &off) in ids.iter().zip(&offsets) {
            tensor_alloc(ctx, &buffer, id, off)?;
            let name = self.file_name(id).ok_or_else(|| MinilmError::BadWeight {
                name: ctx[id].name().to_owned(),
                why: "not a weight of this model".into(),
            })?;
            let info = file.info(name).ok_or_else(|| MinilmError::BadWeight {
                name: name.to_owned(),
                why: "vanished from the table".into(),
            })?;
            tensor_set(ctx, id, 0, file.bytes(info))?;
        }
        Ok(buffer)
    }

    /// A buffer over the whole mapped data section on `device` (the CPU), with usage
    /// `weights`.
    pub fn file_buffer(file: &WeightFile, device: &Device) -> Result<Buffer> {
        let buffer = device.buffer_from_host_memory(file.host_memory(), file.data_len())?;
        buffer.set_usage(BufferUsage::Weights);
        Ok(buffer)
    }

    fn file_name(&self, id: TensorId) -> Option<&str> {
        self.names
            .iter()
            .find(|(t, _)| *t == id)
            .map(|(_, n)| n.as_str())
    }
}

/// Tensor names are limited in length; keep the informative tail of the file name
/// (`encoder.layer.3.attention.self.query.weight` → `l3.attn.q.weight`).
fn short_name(full: &str) -> String {
    let s = full.strip_prefix("bert.").unwrap_or(full);
    s.replace("encoder.layer.", "l")
        .replace("attention.self.query", "attn.q")
        .replace("attention.self.key", "attn.k")
        .replace("attention.self.value", "attn.v")
        .replace("attention.output.dense", "attn.out")
        .replace("attention.output.LayerNorm", "attn.ln")
        .replace("intermediate.dense", "ffn.up")
        .replace("output.dense", "ffn.down")
        .replace("output.LayerNorm", "ffn.ln")
        .replace("embeddings.", "emb.")
        .replace("LayerNorm", "ln")
        .replace("_embeddings", "")
}
