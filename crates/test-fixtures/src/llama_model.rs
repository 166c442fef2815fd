//! [`LlamaConfig`], [`LlamaModel`], [`LlamaModel::decode_graph`]: a llama-shaped decode graph
//! (weights, F16 KV cache, one token) of about 32 nodes per layer, built directly in a
//! [`graph::Context`].
//!
//! Why: the allocator's memory benchmarks and the scheduler's decode-step benchmark need a
//! realistic graph of any size without loading a model.

use graph::{Context, ElementType, Graph, GraphError, RopeParams, TensorId};

/// Shape of a llama-style model for [`LlamaModel`].
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: i64,
    /// Attention heads (head size `n_embd / n_head`).
    pub n_head: i64,
    /// Feed-forward width.
    pub n_ff: i64,
    /// Vocabulary size.
    pub n_vocab: i64,
    /// Positions in the KV cache (all of them attended to).
    pub n_ctx: i64,
    /// Type of the matrix weights.
    pub wtype: ElementType,
    /// Type of the KV cache.
    pub kv_type: ElementType,
}

impl LlamaConfig {
    /// A 7B-shaped model (n_embd 4096, 32 heads, n_ff 11008, vocab 32000) with `n_layer`
    /// blocks, Q4_0 weights and an F16 KV cache of 256 positions.
    pub fn llama_7b(n_layer: usize) -> Self {
        LlamaConfig {
            n_layer,
            n_embd: 4096,
            n_head: 32,
            n_ff: 11008,
            n_vocab: 32000,
            n_ctx: 256,
            wtype: ElementType::Q4_0,
            kv_type: ElementType::F16,
        }
    }
}

/// The weights of one block.
#[derive(Copy, Clone, Debug)]
pub struct LlamaLayer {
    /// Attention norm (F32 `[n_embd]`).
    pub attn_norm: TensorId,
    /// Query, key, value and output projections.
    pub wq: TensorId,
    /// Key projection.
    pub wk: TensorId,
    /// Value projection.
    pub wv: TensorId,
    /// Output projection.
    pub wo: TensorId,
    /// Feed-forward norm.
    pub ffn_norm: TensorId,
    /// Feed-forward gate, down and up projections.
    pub w_gate: TensorId,
    /// Down projection.
    pub w_down: TensorId,
    /// Up projection.
    pub w_up: TensorId,
    /// Key cache (`[n_embd * n_ctx]`).
    pub k_cache: TensorId,
    /// Value cache, stored transposed (`[n_ctx * n_embd]`).
    pub v_cache: TensorId,
}

/// The tensors of a llama-shaped model, created without storage: allocate
/// [`LlamaModel::weights`] and [`LlamaModel::kv_cache`] (for example with
/// [`graph_alloc::alloc_ctx_tensors`]) before building graphs.
///
/// ```
/// use graph::Context;
/// use graph_alloc::{alloc_ctx_tensors, GraphAllocator};
/// use test_fixtures::{FakeBufferType, LlamaConfig, LlamaModel};
/// let mut ctx = Context::new();
/// let model = LlamaModel::new(&mut ctx, LlamaConfig { n_embd: 256, n_ff: 512,
///     n_vocab: 1000, ..LlamaConfig::llama_7b(2) })?;
/// let host = FakeBufferType::new("host", 32).into_buffer_type();
/// alloc_ctx_tensors(&mut ctx, model.weights.iter().copied(), &host)?;
/// alloc_ctx_tensors(&mut ctx, model.kv_cache.iter().copied(), &host)?;
/// let g = model.decode_graph(&mut ctx)?;
/// assert_eq!(g.graph.n_nodes(), 2 * 32 + 4);
/// let mut galloc = GraphAllocator::new(&[host]);
/// galloc.alloc_graph(&mut ctx, &g.graph)?;
/// assert!(ctx[g.logits].has_storage());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct LlamaModel {
    /// The configuration.
    pub config: LlamaConfig,
    /// Token embeddings.
    pub tok_embd: TensorId,
    /// The blocks.
    pub layers: Vec<LlamaLayer>,
    /// Final norm.
    pub output_norm: TensorId,
    /// Output projection.
    pub output: TensorId,
    /// Every weight, in creation order.
    pub weights: Vec<TensorId>,
    /// Every KV cache tensor, in creation order.
    pub kv_cache: Vec<TensorId>,
}

/// One decode step's graph and its inputs and output.
#[derive(Clone, Debug)]
pub struct LlamaDecode {
    /// The graph.
    pub graph: Graph,
    /// Token id input (I32 `[1]`, INPUT).
    pub tokens: TensorId,
    /// Position input (I32 `[1]`, INPUT).
    pub pos: TensorId,
    /// Attention mask input (F32 `[n_ctx, 1]`, INPUT).
    pub mask: TensorId,
    /// Logits (F32 `[n_vocab, 1]`, OUTPUT).
    pub logits: TensorId,
}

impl LlamaModel {
    /// Create the weights and the KV cache in `ctx` (no storage).
    pub fn new(ctx: &mut Context, config: LlamaConfig) -> Result<Self, GraphError> {
        let c = config;
        let mut weights = Vec::new();
        let mut kv_cache = Vec::new();
        let mut w = |ctx: &mut Context, ty, ne0, ne1, name: &str| -> Result<TensorId, GraphError> {
            let t = if ne1 == 0 {
                ctx.new_tensor_1d(ty, ne0)?
            } else {
                ctx.new_tensor_2d(ty, ne0, ne1)?
            };
            ctx.set_name(t, name)?;
            weights.push(t);
            Ok(t)
        };
        let tok_embd = w(ctx, c.wtype, c.n_embd, c.n_vocab, "token_embd.weight")?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            let attn_norm = w(ctx, ElementType::F32, c.n_embd, 0, "attn_norm")?;
            let wq = w(ctx, c.wtype, c.n_embd, c.n_embd, "wq")?;
            let wk = w(ctx, c.wtype, c.n_embd, c.n_embd, "wk")?;
            let wv = w(ctx, c.wtype, c.n_embd, c.n_embd, "wv")?;
            let wo = w(ctx, c.wtype, c.n_embd, c.n_embd, "wo")?;
            let ffn_norm = w(ctx, ElementType::F32, c.n_embd, 0, "ffn_norm")?;
            let w_gate = w(ctx, c.wtype, c.n_embd, c.n_ff, "ffn_gate")?;
            let w_down = w(ctx, c.wtype, c.n_ff, c.n_embd, "ffn_down")?;
            let w_up = w(ctx, c.wtype, c.n_embd, c.n_ff, "ffn_up")?;
            layers.push(LlamaLayer {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                ffn_norm,
                w_gate,
                w_down,
                w_up,
                k_cache: wq, // placeholders, set below
                v_cache: wq,
            });
        }
        let output_norm = w(ctx, ElementType::F32, c.n_embd, 0, "output_norm")?;
        let output = w(ctx, c.wtype, c.n_embd, c.n_vocab, "output")?;
        for l in &mut layers {
            l.k_cache = ctx.new_tensor_1d(c.kv_type, c.n_embd * c.n_ctx)?;
            ctx.set_name(l.k_cache, "cache_k")?;
            l.v_cache = ctx.new_tensor_1d(c.kv_type, c.n_embd * c.n_ctx)?;
            ctx.set_name(l.v_cache, "cache_v")?;
            kv_cache.push(l.k_cache);
            kv_cache.push(l.v_cache);
        }
        Ok(LlamaModel {
            config,
            tok_embd,
            layers,
            output_norm,
            output,
            weights,
            kv_cache,
        })
    }

    /// Build the graph of one decode step: one token at the last cache position, attending
    /// to all `n_ctx` positions (llama.cpp's non-flash-attention layout: K and V written into
    /// the cache with CPY nodes, V stored transposed). About 32 nodes per layer.
    pub fn decode_graph(&self, ctx: &mut Context) -> Result<LlamaDecode, GraphError> {
        let c = self.config;
        let hd = c.n_embd / c.n_head;
        let n_past = (c.n_ctx - 1) as usize;
        let kvs = c.kv_type.type_size();
        let eps = 1e-5;
        let mut graph = Graph::new(c.n_layer * 40 + 64);

        let tokens = ctx.new_tensor_1d(ElementType::I32, 1)?;
        ctx.set_name(tokens, "inp_tokens")?;
        ctx.set_input(tokens)?;
        let pos = ctx.new_tensor_1d(ElementType::I32, 1)?;
        ctx.set_name(pos, "inp_pos")?;
        ctx.set_input(pos)?;
        let mask = ctx.new_tensor_2d(ElementType::F32, c.n_ctx, 1)?;
        ctx.set_name(mask, "kq_mask")?;
        ctx.set_input(mask)?;

        let mut inp = ctx.get_rows(self.tok_embd, tokens)?;
        for l in &self.layers {
            let mut cur = ctx.rms_norm(inp, eps)?;
            cur = ctx.mul(cur, l.attn_norm)?;

            let q = ctx.mul_mat(l.wq, cur)?;
            let q = ctx.reshape_3d(q, hd, c.n_head, 1)?;
            let q = ctx.rope_ext(q, pos, hd as i32, 0, RopeParams::default())?;
            let k = ctx.mul_mat(l.wk, cur)?;
            let k = ctx.reshape_3d(k, hd, c.n_head, 1)?;
            let k = ctx.rope_ext(k, pos, hd as i32, 0, RopeParams::default())?;
            let v = ctx.mul_mat(l.wv, cur)?;

            // store K and V of this token in the cache
            let k_slot = ctx.view_1d(l.k_cache, c.n_embd, kvs * c.n_embd as usize * n_past)?;
            let k_store = ctx.cpy(k, k_slot)?;
            graph.build_forward_expand(ctx, k_store)?;
            let v_slot =
                ctx.view_2d(l.v_cache, 1, c.n_embd, kvs * c.n_ctx as usize, kvs * n_past)?;
            let vt = ctx.transpose(v)?;
            let v_store = ctx.cpy(vt, v_slot)?;
            graph.build_forward_expand(ctx, v_store)?;

            // attention over the whole cache
            let kk = ctx.view_3d(
                l.k_cache,
                hd,
                c.n_ctx,
                c.n_head,
                kvs * c.n_embd as usize,
                kvs * hd as usize,
                0,
            )?;
            let qp = ctx.permute(q, [0, 2, 1, 3])?;
            let kq = ctx.mul_mat(kk, qp)?;
            let kq = ctx.soft_max_ext(kq, Some(mask), 1.0 / (hd as f32).sqrt(), 0.0)?;
            let vv = ctx.view_3d(
                l.v_cache,
                c.n_ctx,
                hd,
                c.n_head,
                kvs * c.n_ctx as usize,
                kvs * c.n_ctx as usize * hd as usize,
                0,
            )?;
            let kqv = ctx.mul_mat(vv, kq)?;
            let merged = ctx.permute(kqv, [0, 2, 1, 3])?;
            cur = ctx.cont_shape(merged, &[c.n_embd, 1])?;
            cur = ctx.mul_mat(l.wo, cur)?;
            let ffn_inp = ctx.add(cur, inp)?;

            cur = ctx.rms_norm(ffn_inp, eps)?;
            cur = ctx.mul(cur, l.ffn_norm)?;
            let up = ctx.mul_mat(l.w_up, cur)?;
            let gate = ctx.mul_mat(l.w_gate, cur)?;
            let gate = ctx.silu(gate)?;
            cur = ctx.mul(gate, up)?;
            cur = ctx.mul_mat(l.w_down, cur)?;
            inp = ctx.add(cur, ffn_inp)?;
        }
        let mut cur = ctx.rms_norm(inp, eps)?;
        cur = ctx.mul(cur, self.output_norm)?;
        let logits = ctx.mul_mat(self.output, cur)?;
        ctx.set_name(logits, "result_output")?;
        ctx.set_output(logits)?;
        graph.build_forward_expand(ctx, logits)?;
        Ok(LlamaDecode {
            graph,
            tokens,
            pos,
            mask,
            logits,
        })
    }
}
