//! The llama graph for one step: a batch of new tokens in, the last token's logits out.
//!
//! Why one builder for every step: the prompt's micro-batches and each single-token decode
//! step differ only in the number of new tokens, where they land in the KV cache and how many
//! cells attention reads, so the graph is rebuilt per step with those three numbers and the
//! scheduler re-plans it cheaply within memory reserved once for the worst case.
//!
//! Per block, as llama.cpp builds it (`src/models/llama.cpp`, plain attention path):
//! RMS norm → Q/K/V projections → RoPE (normal mode) on Q and K → K and V copied (CPY, F32 →
//! F16) into the cache views of this step's cells → `KQ = K·Q` over the visible cells (GQA:
//! query head `h` reads KV head `h / group` through the matrix product's broadcast) →
//! `soft_max_ext(KQ, mask, 1/√d)` → `V·KQ` → heads merged → output projection + residual →
//! RMS norm → SwiGLU feed-forward + residual. The last block keeps only the last token's
//! column after the attention output (llama.cpp's `inp_out_ids`), and the output head —
//! RMS norm, then the output matrix (the token embeddings when tied) — runs for it alone.

use graph::{Context, ElementType, Graph, RopeParams, TensorId};

use crate::error::{LlmError, Result};
use crate::hparams::Hparams;
use crate::kv_cache::KvCache;
use crate::weights::LlamaWeights;

/// RoPE mode "normal" (adjacent pairs), llama's.
const ROPE_NORMAL: i32 = 0;

/// Names a tensor from format arguments without a heap allocation (a step must not allocate).
fn name(id: TensorId, ctx: &mut Context, args: std::fmt::Arguments<'_>) -> Result<()> {
    struct Buf {
        bytes: [u8; 64],
        len: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            // Truncate at a character boundary when full (names are short ASCII here).
            let room = self.bytes.len() - self.len;
            let mut n = s.len().min(room);
            while !s.is_char_boundary(n) {
                n -= 1;
            }
            self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let mut b = Buf {
        bytes: [0; 64],
        len: 0,
    };
    let _ = std::fmt::write(&mut b, args);
    let s = std::str::from_utf8(&b.bytes[..b.len]).unwrap_or_default();
    ctx.set_name(id, s)?;
    Ok(())
}

/// The tensors of one step's graph a caller reads or writes.
#[derive(Clone, Copy, Debug)]
pub struct StepTensors {
    /// Input: token ids, I32 `[n_tokens]`.
    pub tokens: TensorId,
    /// Input: positions, I32 `[n_tokens]`.
    pub positions: TensorId,
    /// Input: attention mask, F32 `[n_kv, n_tokens]`.
    pub mask: TensorId,
    /// Output: the last token's logits, F32 `[n_vocab, 1]`.
    pub logits: TensorId,
}

/// The shape of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// New tokens in this step.
    pub n_tokens: usize,
    /// Cache cell of the first new token (= tokens already in the cache).
    pub kv_head: usize,
    /// Cells attention reads (`kv_head + n_tokens` rounded up, see [`KvCache::n_kv`]).
    pub n_kv: usize,
}

/// Nodes plus leafs a graph of `n_layer` blocks needs (with room to spare).
pub fn graph_capacity(n_layer: usize) -> usize {
    64 * n_layer + 256
}

/// Builds the step's graph into `graph` (cleared first) with new tensors in `ctx`.
///
/// ```
/// use llm::{KvCache, StepShape};
/// // The prompt's first micro-batch of 31 tokens, then the first decode step.
/// let prompt = StepShape { n_tokens: 31, kv_head: 0, n_kv: 256 };
/// let decode = StepShape { n_tokens: 1, kv_head: 31, n_kv: 256 };
/// assert!(prompt.n_kv >= prompt.kv_head + prompt.n_tokens);
/// assert!(decode.n_kv >= decode.kv_head + decode.n_tokens);
/// assert!(llm::graph_capacity(30) > 30 * 40);
/// ```
pub fn build_step(
    ctx: &mut Context,
    graph: &mut Graph,
    hp: &Hparams,
    w: &LlamaWeights,
    cache: &KvCache,
    s: StepShape,
) -> Result<StepTensors> {
    let n_kv_ok = s.n_tokens >= 1
        && s.kv_head
            .checked_add(s.n_tokens)
            .is_some_and(|end| end <= s.n_kv)
        && s.n_kv <= cache.size();
    if !n_kv_ok || w.layers.len() != hp.n_layer || cache.n_layer() != hp.n_layer {
        return Err(LlmError::InvalidOption(format!(
            "step {s:?} does not fit a cache of {} cells, or {} weight blocks / {} cache blocks \
             for {} blocks",
            cache.size(),
            w.layers.len(),
            cache.n_layer(),
            hp.n_layer
        )));
    }
    hp.validate()?;
    graph.clear();
    let n = s.n_tokens as i64;
    let hd = hp.head_dim() as i64;
    let (n_head, n_head_kv) = (hp.n_head as i64, hp.n_head_kv as i64);
    let n_embd = hp.n_embd as i64;
    let n_embd_kv = hp.n_embd_kv();
    let n_kv = s.n_kv as i64;
    let es = ElementType::F16.type_size();
    let n_ctx = cache.size();
    let rope = RopeParams {
        n_ctx_orig: hp.n_ctx_train as i32,
        freq_base: hp.rope_freq_base,
        freq_scale: hp.rope_freq_scale,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };

    let tokens = ctx.new_tensor_1d(ElementType::I32, n)?;
    ctx.set_name(tokens, "inp_tokens")?;
    ctx.set_input(tokens)?;
    let positions = ctx.new_tensor_1d(ElementType::I32, n)?;
    ctx.set_name(positions, "inp_pos")?;
    ctx.set_input(positions)?;
    let mask = ctx.new_tensor_2d(ElementType::F32, n_kv, n)?;
    ctx.set_name(mask, "kq_mask")?;
    ctx.set_input(mask)?;

    let mut x = ctx.get_rows(w.tok_embd, tokens)?;
    ctx.set_name(x, "inp_embd")?;
    let last = hp.n_layer.saturating_sub(1);
    for (l, lw) in w.layers.iter().enumerate() {
        let cur = ctx.rms_norm(x, hp.rms_eps)?;
        let cur = ctx.mul(cur, lw.attn_norm)?;
        name(cur, ctx, format_args!("attn_norm-{l}"))?;

        let q = ctx.mul_mat(lw.wq, cur)?;
        let k = ctx.mul_mat(lw.wk, cur)?;
        let v = ctx.mul_mat(lw.wv, cur)?;
        // The three products next to each other in the graph (as llama.cpp adds them): the
        // CPU backend runs products of one input that follow each other as one job.
        for p in [q, k, v] {
            graph.build_forward_expand(ctx, p)?;
        }
        let q = ctx.reshape_3d(q, hd, n_head, n)?;
        let k = ctx.reshape_3d(k, hd, n_head_kv, n)?;
        let q = ctx.rope_ext(q, positions, hp.n_rot as i32, ROPE_NORMAL, rope)?;
        name(q, ctx, format_args!("Qcur-{l}"))?;
        let k = ctx.rope_ext(k, positions, hp.n_rot as i32, ROPE_NORMAL, rope)?;
        name(k, ctx, format_args!("Kcur-{l}"))?;

        // Store this step's keys and values in their cells before attention reads them.
        let k_cells = ctx.view_1d(
            cache.k(l)?,
            n * n_embd_kv as i64,
            s.kv_head * n_embd_kv * es,
        )?;
        let k_store = ctx.cpy(k, k_cells)?;
        graph.build_forward_expand(ctx, k_store)?;
        let vt = ctx.transpose(v)?;
        let v_cells = ctx.view_2d(cache.v(l)?, n, n_embd_kv as i64, n_ctx * es, s.kv_head * es)?;
        let v_store = ctx.cpy(vt, v_cells)?;
        graph.build_forward_expand(ctx, v_store)?;

        // Attention over the visible cells.
        let qp = ctx.permute(q, [0, 2, 1, 3])?;
        let kview = ctx.view_3d(
            cache.k(l)?,
            hd,
            n_kv,
            n_head_kv,
            n_embd_kv * es,
            hd as usize * es,
            0,
        )?;
        let kq = ctx.mul_mat(kview, qp)?;
        let kq = ctx.soft_max_ext(kq, Some(mask), hp.attn_scale(), 0.0)?;
        let vview = ctx.view_3d(
            cache.v(l)?,
            n_kv,
            hd,
            n_head_kv,
            n_ctx * es,
            n_ctx * hd as usize * es,
            0,
        )?;
        let kqv = ctx.mul_mat(vview, kq)?;
        let merged = ctx.permute(kqv, [0, 2, 1, 3])?;
        let merged = ctx.cont(merged)?;
        let merged = ctx.reshape_2d(merged, n_embd, n)?;
        let mut cur = ctx.mul_mat(lw.wo, merged)?;
        name(cur, ctx, format_args!("attn_out-{l}"))?;

        if l == last && n > 1 {
            // Only the last token's row goes on to the output head.
            let nb1 = ctx[cur].nb()[1];
            cur = ctx.view_2d(cur, n_embd, 1, nb1, (s.n_tokens - 1) * nb1)?;
            let nb1 = ctx[x].nb()[1];
            x = ctx.view_2d(x, n_embd, 1, nb1, (s.n_tokens - 1) * nb1)?;
        }
        let ffn_inp = ctx.add(cur, x)?;
        let cur = ctx.rms_norm(ffn_inp, hp.rms_eps)?;
        let cur = ctx.mul(cur, lw.ffn_norm)?;
        let gate = ctx.mul_mat(lw.ffn_gate, cur)?;
        let up = ctx.mul_mat(lw.ffn_up, cur)?;
        graph.build_forward_expand(ctx, gate)?;
        graph.build_forward_expand(ctx, up)?;
        let act = ctx.silu(gate)?;
        let act = ctx.mul(act, up)?;
        let down = ctx.mul_mat(lw.ffn_down, act)?;
        x = ctx.add(down, ffn_inp)?;
        name(x, ctx, format_args!("l_out-{l}"))?;
    }
    let cur = ctx.rms_norm(x, hp.rms_eps)?;
    let cur = ctx.mul(cur, w.output_norm)?;
    ctx.set_name(cur, "result_norm")?;
    let logits = ctx.mul_mat(w.output, cur)?;
    ctx.set_name(logits, "result_output")?;
    ctx.set_output(logits)?;
    graph.build_forward_expand(ctx, logits)?;
    Ok(StepTensors {
        tokens,
        positions,
        mask,
        logits,
    })
}
