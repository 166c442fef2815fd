//! The model's weights as graph tensors, and where their bytes live.
//!
//! Why weights are tensors of the same [`Context`] as each step's graph: a graph names its
//! sources by [`TensorId`], so the weights (and the KV cache) are created once at the start of
//! the context and every step builds after a checkpoint and rewinds to it. The scheduler sees
//! each weight's buffer — the memory-mapped file on the CPU, or a device buffer for offloaded
//! blocks — and runs the ops that use it on the backend that owns it.

use backend_core::{
    Buffer, BufferType, BufferUsage, Device, HostMemory, WeightBufferTypes, tensor_alloc,
    tensor_set,
};
use graph::{Context, ElementType, TensorId};

use crate::error::{LlmError, Result};
use crate::hparams::{Hparams, Metadata};

/// One tensor of a model file: type, ggml-order shape and place in the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// Element type.
    pub ty: ElementType,
    /// Extents, innermost (row length) first; missing dimensions are 1.
    pub ne: [i64; 4],
    /// Byte offset in the data section.
    pub offset: usize,
    /// Byte size.
    pub size: usize,
}

/// A model file: metadata, a tensor table and the data section the tensors live in.
pub trait ModelFile: Metadata {
    /// The tensor called `name`.
    fn tensor(&self, name: &str) -> Option<TensorEntry>;
    /// The whole data section (tensor offsets are relative to its start).
    fn data(&self) -> &[u8];
    /// The data section as host memory a CPU buffer can be placed over (no copy).
    fn host_memory(&self) -> HostMemory;
}

/// Weights of one transformer block.
#[derive(Clone, Copy, Debug)]
pub struct LayerWeights {
    /// RMS norm scale before attention `[n_embd]`.
    pub attn_norm: TensorId,
    /// Query projection `[n_embd, n_embd]`.
    pub wq: TensorId,
    /// Key projection `[n_embd, n_embd_kv]`.
    pub wk: TensorId,
    /// Value projection `[n_embd, n_embd_kv]`.
    pub wv: TensorId,
    /// Attention output projection `[n_embd, n_embd]`.
    pub wo: TensorId,
    /// RMS norm scale before the feed-forward `[n_embd]`.
    pub ffn_norm: TensorId,
    /// Gate projection `[n_embd, n_ff]`.
    pub ffn_gate: TensorId,
    /// Up projection `[n_embd, n_ff]`.
    pub ffn_up: TensorId,
    /// Down projection `[n_ff, n_embd]`.
    pub ffn_down: TensorId,
}

impl LayerWeights {
    /// Every tensor of the block.
    pub fn all(&self) -> [TensorId; 9] {
        [
            self.attn_norm,
            self.wq,
            self.wk,
            self.wv,
            self.wo,
            self.ffn_norm,
            self.ffn_gate,
            self.ffn_up,
            self.ffn_down,
        ]
    }
}

/// Every weight of the model, as tensors of one [`Context`], named as in the file.
#[derive(Clone, Debug)]
pub struct LlamaWeights {
    /// Token embeddings `[n_embd, n_vocab]`.
    pub tok_embd: TensorId,
    /// The blocks, first to last.
    pub layers: Vec<LayerWeights>,
    /// Final RMS norm scale `[n_embd]`.
    pub output_norm: TensorId,
    /// Output projection `[n_embd, n_vocab]`; the token embeddings when the file has no
    /// `output.weight` (tied, as SmolLM2).
    pub output: TensorId,
    names: Vec<(TensorId, String)>,
}

/// Types the matrix products and the embedding lookup accept.
const MATRIX_TYPES: [ElementType; 5] = [
    ElementType::F32,
    ElementType::F16,
    ElementType::Q4_0,
    ElementType::Q4_1,
    ElementType::Q8_0,
];

impl LlamaWeights {
    /// Creates one metadata-only tensor per weight in `ctx`, checking each one's presence,
    /// shape and type against `hp`.
    pub fn create(ctx: &mut Context, hp: &Hparams, file: &dyn ModelFile) -> Result<Self> {
        let (e, kv, ff, nv) = (
            hp.n_embd as i64,
            hp.n_embd_kv() as i64,
            hp.n_ff as i64,
            hp.n_vocab as i64,
        );
        let mut names = Vec::new();
        let mut get = |ctx: &mut Context,
                       name: &str,
                       ne: &[i64],
                       matrix: bool|
         -> Result<TensorId> {
            let t = file
                .tensor(name)
                .ok_or_else(|| LlmError::MissingTensor(name.to_owned()))?;
            let mut want = [1i64; 4];
            want[..ne.len()].copy_from_slice(ne);
            if t.ne != want {
                return Err(LlmError::WrongShape {
                    name: name.to_owned(),
                    got: t.ne.to_vec(),
                    want: want.to_vec(),
                });
            }
            let ok = if matrix {
                MATRIX_TYPES.contains(&t.ty)
            } else {
                t.ty == ElementType::F32
            };
            if !ok {
                return Err(LlmError::WrongType {
                    name: name.to_owned(),
                    ty: t.ty,
                    why: if matrix {
                        "matrices must be f32, f16, q4_0, q4_1 or q8_0"
                    } else {
                        "norm scales must be f32"
                    },
                });
            }
            let expect = t.ty.row_size(ne[0] as usize) * (t.ne[1] * t.ne[2] * t.ne[3]) as usize;
            let in_range = t
                .offset
                .checked_add(t.size)
                .is_some_and(|end| end <= file.data().len());
            if t.size != expect || !in_range {
                return Err(LlmError::Gguf(format!(
                    "tensor {name}: {} bytes at offset {} do not fit the data section of {} bytes \
                     or its shape ({expect} bytes)",
                    t.size,
                    t.offset,
                    file.data().len()
                )));
            }
            let id = ctx.new_tensor(t.ty, ne)?;
            ctx.set_name(id, name)?;
            names.push((id, name.to_owned()));
            Ok(id)
        };
        let tok_embd = get(ctx, "token_embd.weight", &[e, nv], true)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let mut w = |ctx: &mut Context, n: &str, ne: &[i64], m: bool| {
                get(ctx, &format!("blk.{l}.{n}.weight"), ne, m)
            };
            layers.push(LayerWeights {
                attn_norm: w(ctx, "attn_norm", &[e], false)?,
                wq: w(ctx, "attn_q", &[e, e], true)?,
                wk: w(ctx, "attn_k", &[e, kv], true)?,
                wv: w(ctx, "attn_v", &[e, kv], true)?,
                wo: w(ctx, "attn_output", &[e, e], true)?,
                ffn_norm: w(ctx, "ffn_norm", &[e], false)?,
                ffn_gate: w(ctx, "ffn_gate", &[e, ff], true)?,
                ffn_up: w(ctx, "ffn_up", &[e, ff], true)?,
                ffn_down: w(ctx, "ffn_down", &[ff, e], true)?,
            });
        }
        let output_norm = get(ctx, "output_norm.weight", &[e], false)?;
        let output = if file.tensor("output.weight").is_some() {
            get(ctx, "output.weight", &[e, nv], true)?
        } else {
            tok_embd
        };
        Ok(LlamaWeights {
            tok_embd,
            layers,
            output_norm,
            output,
            names,
        })
    }

    /// Every weight tensor with its name in the file.
    pub fn all(&self) -> impl Iterator<Item = (TensorId, &str)> {
        self.names.iter().map(|(id, n)| (*id, n.as_str()))
    }

    /// Whether the output projection is the token embedding matrix.
    pub fn is_tied(&self) -> bool {
        self.output == self.tok_embd
    }

    /// The weights of blocks `range` (`InvalidOption` when it is not inside the blocks).
    pub fn layer_tensors(&self, range: std::ops::Range<usize>) -> Result<Vec<TensorId>> {
        let blocks = self.layers.get(range.clone()).ok_or_else(|| {
            LlmError::InvalidOption(format!(
                "blocks {range:?} of a model of {} blocks",
                self.layers.len()
            ))
        })?;
        Ok(blocks.iter().flat_map(LayerWeights::all).collect())
    }

    /// For every weight not in `except`, the first of `extra`'s buffer types in which its
    /// device computes every op of a step that reads it (a matrix: a product with a column;
    /// the token embeddings: the row lookup, and the output product when tied; a norm scale:
    /// the scaling), the way llama.cpp places weights in a device's extra buffer types.
    /// Weights without one are left out (they stay in the mapped file). A tied embedding
    /// matrix needs the lookup, which no repacked layout serves, so it stays mapped (llama.cpp
    /// loads a second, repacked copy for the output product instead).
    pub fn select_extra_buffer_types(
        &self,
        ctx: &mut Context,
        extra: &WeightBufferTypes,
        except: &[TensorId],
    ) -> Result<Vec<(TensorId, BufferType)>> {
        if extra.types().next().is_none() {
            return Ok(Vec::new());
        }
        let cp = ctx.checkpoint();
        let res = self.select_in(ctx, extra, except);
        ctx.rewind(cp);
        res
    }

    fn select_in(
        &self,
        ctx: &mut Context,
        extra: &WeightBufferTypes,
        except: &[TensorId],
    ) -> Result<Vec<(TensorId, BufferType)>> {
        let mut out = Vec::new();
        for (id, _) in self.all() {
            if except.contains(&id) {
                continue;
            }
            let (ty, ne) = (ctx.get(id)?.ty(), ctx.get(id)?.ne());
            let mut uses = Vec::new();
            if ne[1] == 1 {
                let x = ctx.new_tensor_1d(ElementType::F32, ne[0])?;
                uses.push(ctx.mul(x, id)?);
            } else {
                let x = ctx.new_tensor_2d(ElementType::F32, ne[0], 1)?;
                if id == self.tok_embd {
                    let rows = ctx.new_tensor_1d(ElementType::I32, 1)?;
                    uses.push(ctx.get_rows(id, rows)?);
                }
                if id != self.tok_embd || self.is_tied() {
                    uses.push(ctx.mul_mat(id, x)?);
                }
            }
            if let Some(buft) = extra.select(ctx, id, &uses)? {
                tracing::debug!(
                    tensor = ctx.get(id)?.name(),
                    ty = ty.name(),
                    buffer_type = buft.name(),
                    "weight placed in an extra buffer type"
                );
                out.push((id, buft));
            }
        }
        Ok(out)
    }

    /// A buffer over the file's whole data section on `device` (the CPU), usage weights.
    pub fn file_buffer(file: &dyn ModelFile, device: &Device) -> Result<Buffer> {
        let buffer = device.buffer_from_host_memory(file.host_memory(), file.data().len())?;
        buffer.set_usage(BufferUsage::Weights);
        Ok(buffer)
    }

    /// Places every weight not in `except` in `buffer` (from [`LlamaWeights::file_buffer`])
    /// at its offset in the data section: no bytes move. Returns the bytes placed.
    pub fn place_in_file_buffer(
        &self,
        ctx: &mut Context,
        file: &dyn ModelFile,
        buffer: &Buffer,
        except: &[TensorId],
    ) -> Result<usize> {
        let mut n = 0;
        for (id, name) in self.all() {
            if except.contains(&id) {
                continue;
            }
            let t = file
                .tensor(name)
                .ok_or_else(|| LlmError::MissingTensor(name.to_owned()))?;
            tensor_alloc(ctx, buffer, id, t.offset)?;
            n += t.size;
        }
        Ok(n)
    }

    /// Allocates one weights buffer of `buft` for `ids`, places them back to back (aligned)
    /// and copies their bytes from the file. Keep the buffer as long as the tensors are used.
    pub fn place_copied(
        &self,
        ctx: &mut Context,
        file: &dyn ModelFile,
        buft: &BufferType,
        ids: &[TensorId],
    ) -> Result<Buffer> {
        let align = buft.alignment().max(1);
        let mut offsets = Vec::with_capacity(ids.len());
        let mut size = 0usize;
        for &id in ids {
            offsets.push(size);
            let n = buft.alloc_size(ctx.get(id)?).next_multiple_of(align);
            size = size
                .checked_add(n)
                .ok_or_else(|| LlmError::Backend("weights too large for one buffer".into()))?;
        }
        let buffer = buft.alloc_buffer(size.max(1))?;
        buffer.set_usage(BufferUsage::Weights);
        for (&id, &off) in ids.iter().zip(&offsets) {
            tensor_alloc(ctx, &buffer, id, off)?;
            let name = self
                .names
                .iter()
                .find(|(t, _)| *t == id)
                .map(|(_, n)| n.as_str())
                .ok_or_else(|| LlmError::MissingTensor(format!("tensor #{}", id.index())))?;
            let t = file
                .tensor(name)
                .ok_or_else(|| LlmError::MissingTensor(name.to_owned()))?;
            let bytes = file
                .data()
                .get(t.offset..t.offset + t.size)
                .ok_or_else(|| LlmError::Gguf(format!("tensor {name} outside the data section")))?;
            tensor_set(ctx, id, 0, bytes)?;
        }
        Ok(buffer)
    }
}
