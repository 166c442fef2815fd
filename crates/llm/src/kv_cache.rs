//! The KV cache: per block, F16 keys and values of every cell, in buffers of their own.
//!
//! Why its own buffers, outside the compute memory the scheduler plans: the cache outlives
//! every step's graph, so it is allocated once, zeroed, and each step's graph only *views* it.
//! Each block's cache lives on the device that holds the block's weights (a CPU buffer, the
//! test device, or a remote server), so attention runs where the weights are and only
//! activations cross devices.
//!
//! Layout, as llama.cpp's plain (non-flash-attention) path: keys `[n_embd_kv, n_ctx]` (a
//! token's keys contiguous, heads one after another), values transposed `[n_ctx, n_embd_kv]`
//! (one value dimension's cells contiguous) so that `V · probs` is a plain matrix product.
//! One sequence: cell `i` holds position `i`.

use backend_core::{Buffer, BufferType, BufferUsage, tensor_alloc};
use graph::{Context, ElementType, TensorId};

use crate::error::{LlmError, Result};
use crate::hparams::Hparams;

/// Cells visible to a step are padded to a multiple of this by default (see
/// [`KvCache::set_pad`]).
///
/// llama.cpp pads its unified cache to 256 cells. Any multiple of 64 gives the same bits:
/// the padding cells are masked (their probabilities are exactly 0, their keys only add
/// rows), and the attention's f16 sums run in chunks of 64 (`ggml_vec_dot_f16`'s AVX-512
/// order) or 16 (tinyBLAS), where each cell keeps its lane whatever the length, a masked
/// cell adds an exact zero, and both orders are chosen alike for every multiple of 64. So we
/// pad to 64: a short context's step reads and multiplies a quarter of the cells.
pub const N_KV_PAD: usize = 64;

/// `InvalidOption` unless `pad` is a positive multiple of [`N_KV_PAD`].
pub(crate) fn check_pad(pad: usize) -> Result<()> {
    if pad == 0 || !pad.is_multiple_of(N_KV_PAD) {
        return Err(LlmError::InvalidOption(format!(
            "KV padding {pad} must be a positive multiple of {N_KV_PAD}"
        )));
    }
    Ok(())
}

/// The KV cache of one sequence.
///
/// ```
/// use graph::Context;
/// use llm::{Hparams, KvCache, LlmError};
/// backend_cpu::register();
/// let hp = Hparams::smollm2_135m();
/// let mut ctx = Context::new();
/// let cpu = backend_cpu::cpu_device().buffer_type();
/// let cache = KvCache::new(&mut ctx, &hp, 512, &vec![cpu; hp.n_layer])?;
/// assert_eq!(ctx[cache.k(0)?].ne(), [192, 512, 1, 1]); // keys: one cell per column
/// assert_eq!(ctx[cache.v(0)?].ne(), [512, 192, 1, 1]); // values: transposed
/// let r = cache.k(hp.n_layer); // no such block
/// assert!(matches!(r, Err(LlmError::InvalidOption(_))), "{r:?}");
/// assert_eq!(cache.n_kv(31), 64); // a 31-token prompt attends over 64 (padded) cells
/// let r = cache.check_room(513);
/// assert!(matches!(r, Err(LlmError::ContextFull { requested: 513, n_ctx: 512, .. })), "{r:?}");
/// # Ok::<(), llm::LlmError>(())
/// ```
#[derive(Debug)]
pub struct KvCache {
    size: usize,
    /// Visible cells are padded to a multiple of this.
    pad: usize,
    n_embd_kv: usize,
    k: Vec<TensorId>,
    v: Vec<TensorId>,
    used: usize,
    buffers: Vec<Buffer>,
}

impl KvCache {
    /// Creates the cache tensors for `n_ctx` cells in `ctx` and one zeroed buffer per
    /// distinct buffer type in `layer_bufts` (one entry per block: where its cache lives).
    pub fn new(
        ctx: &mut Context,
        hp: &Hparams,
        n_ctx: usize,
        layer_bufts: &[BufferType],
    ) -> Result<Self> {
        if n_ctx == 0 || n_ctx > 1 << 20 {
            return Err(LlmError::InvalidOption(format!(
                "context size {n_ctx} must be 1..=1048576"
            )));
        }
        if layer_bufts.len() != hp.n_layer {
            return Err(LlmError::InvalidOption(format!(
                "{} cache placements for {} blocks",
                layer_bufts.len(),
                hp.n_layer
            )));
        }
        let n_embd_kv = hp.n_embd_kv();
        let mut k = Vec::with_capacity(hp.n_layer);
        let mut v = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let kt = ctx.new_tensor_2d(ElementType::F16, n_embd_kv as i64, n_ctx as i64)?;
            ctx.set_name(kt, &format!("cache_k_l{l}"))?;
            let vt = ctx.new_tensor_2d(ElementType::F16, n_ctx as i64, n_embd_kv as i64)?;
            ctx.set_name(vt, &format!("cache_v_l{l}"))?;
            k.push(kt);
            v.push(vt);
        }
        // One buffer per distinct buffer type, holding the caches of the blocks placed there.
        let mut buffers = Vec::new();
        let mut done = vec![false; hp.n_layer];
        for first in 0..hp.n_layer {
            if done[first] {
                continue;
            }
            let buft = &layer_bufts[first];
            let members: Vec<usize> = (first..hp.n_layer)
                .filter(|&l| layer_bufts[l].id() == buft.id())
                .collect();
            let align = buft.alignment().max(1);
            let mut size = 0usize;
            let mut offsets = Vec::with_capacity(members.len() * 2);
            for &l in &members {
                for t in [k[l], v[l]] {
                    offsets.push((t, size));
                    let n = buft.alloc_size(ctx.get(t)?).next_multiple_of(align);
                    size = size
                        .checked_add(n)
                        .ok_or_else(|| LlmError::InvalidOption("KV cache too large".into()))?;
                }
                done[l] = true;
            }
            let buffer = buft.alloc_buffer(size)?;
            buffer.set_usage(BufferUsage::Any);
            buffer.clear(0)?;
            for (t, off) in offsets {
                tensor_alloc(ctx, &buffer, t, off)?;
            }
            tracing::debug!(
                buffer = buffer.name(),
                bytes = size,
                blocks = members.len(),
                "KV cache buffer"
            );
            buffers.push(buffer);
        }
        Ok(KvCache {
            size: n_ctx,
            pad: N_KV_PAD,
            n_embd_kv,
            k,
            v,
            used: 0,
            buffers,
        })
    }

    /// Cells in the cache (the context size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Cells holding tokens (the next token's position).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Key cache of block `l`, `[n_embd_kv, n_ctx]` F16 (`InvalidOption` past the last block).
    pub fn k(&self, l: usize) -> Result<TensorId> {
        self.k.get(l).copied().ok_or_else(|| self.no_block(l))
    }

    /// Value cache of block `l`, transposed: `[n_ctx, n_embd_kv]` F16 (`InvalidOption` past
    /// the last block).
    pub fn v(&self, l: usize) -> Result<TensorId> {
        self.v.get(l).copied().ok_or_else(|| self.no_block(l))
    }

    fn no_block(&self, l: usize) -> LlmError {
        LlmError::InvalidOption(format!(
            "block {l} of a KV cache of {} blocks",
            self.k.len()
        ))
    }

    /// Blocks the cache has room for.
    pub fn n_layer(&self) -> usize {
        self.k.len()
    }

    /// Width of one cell's keys.
    pub fn n_embd_kv(&self) -> usize {
        self.n_embd_kv
    }

    /// The buffers holding the cache.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Checks that `n_tokens` more cells fit.
    pub fn check_room(&self, n_tokens: usize) -> Result<()> {
        if n_tokens > self.size - self.used {
            return Err(LlmError::ContextFull {
                used: self.used,
                requested: n_tokens,
                n_ctx: self.size,
            });
        }
        Ok(())
    }

    /// Cells a step of `n_tokens` new tokens attends over: the used cells plus the new
    /// ones, rounded up to the padding ([`N_KV_PAD`] unless [`KvCache::set_pad`] chose
    /// another), at most the cache size.
    pub fn n_kv(&self, n_tokens: usize) -> usize {
        (self.used + n_tokens)
            .next_multiple_of(self.pad)
            .max(self.pad)
            .min(self.size)
    }

    /// Pads the visible cells to a multiple of `pad` cells, a positive multiple of
    /// [`N_KV_PAD`] (256 is llama.cpp's padding; the results are the same bits, see
    /// [`N_KV_PAD`]). Anything else is an `InvalidOption` and changes nothing.
    ///
    /// ```
    /// # use graph::Context;
    /// # use llm::{Hparams, KvCache, LlmError};
    /// # backend_cpu::register();
    /// # let hp = Hparams::smollm2_135m();
    /// # let mut ctx = Context::new();
    /// # let cpu = backend_cpu::cpu_device().buffer_type();
    /// let mut cache = KvCache::new(&mut ctx, &hp, 512, &vec![cpu; hp.n_layer])?;
    /// cache.set_pad(256)?;
    /// assert_eq!(cache.n_kv(31), 256);
    /// let r = cache.set_pad(32); // not a multiple of 64
    /// assert!(matches!(r, Err(LlmError::InvalidOption(_))), "{r:?}");
    /// # Ok::<(), llm::LlmError>(())
    /// ```
    pub fn set_pad(&mut self, pad: usize) -> Result<()> {
        check_pad(pad)?;
        self.pad = pad;
        Ok(())
    }

    /// Marks `n` more cells as holding tokens (after a successful step).
    pub(crate) fn commit(&mut self, n: usize) {
        self.used = (self.used + n).min(self.size);
    }

    /// Forgets every token (the cells' stale contents are masked out, never read).
    pub fn clear(&mut self) {
        self.used = 0;
    }

    /// Keeps only the first `n` cells' tokens.
    pub fn truncate(&mut self, n: usize) {
        self.used = self.used.min(n);
    }
}

/// Writes the causal mask for `n_tokens` new tokens at positions `used..used + n_tokens`
/// over `n_kv` cells into `out` (row-major `[n_tokens][n_kv]`): 0 where the cell's position is
/// at most the token's, −∞ elsewhere (future and empty cells).
pub fn fill_mask(out: &mut Vec<f32>, used: usize, n_tokens: usize, n_kv: usize) {
    out.clear();
    for i in 0..n_tokens {
        let pos = used + i;
        out.extend((0..n_kv).map(|j| if j <= pos { 0.0 } else { f32::NEG_INFINITY }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_causal_and_hides_empty_cells() {
        let mut m = Vec::new();
        fill_mask(&mut m, 2, 2, 4);
        let inf = f32::NEG_INFINITY;
        assert_eq!(m, [0.0, 0.0, 0.0, inf, 0.0, 0.0, 0.0, 0.0]);
    }
}
