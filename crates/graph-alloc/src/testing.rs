//! Test and benchmark fixtures (not part of the allocator API proper).
//!
//! Why they live in the library: the allocator's tests, its benchmark and the scheduler's
//! benchmark all need the same pieces, and none of them needs real memory:
//!
//! * [`FakeBufferType`]: a buffer type whose buffers hold no bytes (set/get are no-ops), with a
//!   configurable alignment, maximum size, extra per-tensor padding and a refusal threshold,
//!   plus shared [`FakeMemoryStats`] counting live buffers and bytes, so tests can inject
//!   allocation failures and check that nothing leaks. A 4 GB model "fits" without using RAM.
//! * [`LlamaConfig`], [`LlamaModel`], [`LlamaModel::decode_graph`]: a llama-shaped decode graph
//!   (weights, F16 KV cache, one token) of about 32 nodes per layer.
//! * [`lifetimes`] and [`live_bytes_lower_bound`]: an allocator-independent view of when each
//!   tensor needs its bytes, to check plans and to measure how far a plan is from the least
//!   memory any plan could use.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{BufferImpl, BufferType, BufferTypeImpl};
use graph::{Context, ElementType, Graph, GraphError, RopeParams, Tensor, TensorFlags, TensorId};

/// Counters shared by a [`FakeBufferType`] and every buffer it made.
#[derive(Debug)]
pub struct FakeMemoryStats {
    live_bytes: AtomicUsize,
    live_buffers: AtomicUsize,
    allocs: AtomicUsize,
    refusals: AtomicUsize,
    limit: AtomicUsize,
}

impl FakeMemoryStats {
    /// Bytes in buffers not yet freed.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::SeqCst)
    }
    /// Buffers not yet freed.
    pub fn live_buffers(&self) -> usize {
        self.live_buffers.load(Ordering::SeqCst)
    }
    /// Successful allocations so far.
    pub fn allocs(&self) -> usize {
        self.allocs.load(Ordering::SeqCst)
    }
    /// Refused allocations so far.
    pub fn refusals(&self) -> usize {
        self.refusals.load(Ordering::SeqCst)
    }
    /// Refuse every later allocation larger than `bytes`.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::SeqCst);
    }
}

/// A buffer type whose buffers hold no memory (see the module docs).
///
/// ```
/// use graph_alloc::testing::FakeBufferType;
/// let fake = FakeBufferType::new("fake", 64).with_limit(1000);
/// let stats = fake.stats();
/// let buft = fake.into_buffer_type();
/// let b = buft.alloc_buffer(1000)?;
/// assert!(buft.alloc_buffer(1001).is_err());
/// assert_eq!((stats.live_bytes(), stats.refusals()), (1000, 1));
/// drop(b);
/// assert_eq!(stats.live_buffers(), 0);
/// # Ok::<(), backend_core::BackendError>(())
/// ```
#[derive(Debug)]
pub struct FakeBufferType {
    name: String,
    alignment: usize,
    max_size: usize,
    extra: usize,
    stats: Arc<FakeMemoryStats>,
}

impl FakeBufferType {
    /// A fake buffer type with this name and alignment, unbounded.
    pub fn new(name: &str, alignment: usize) -> Self {
        FakeBufferType {
            name: name.to_owned(),
            alignment,
            max_size: usize::MAX,
            extra: 0,
            stats: Arc::new(FakeMemoryStats {
                live_bytes: AtomicUsize::new(0),
                live_buffers: AtomicUsize::new(0),
                allocs: AtomicUsize::new(0),
                refusals: AtomicUsize::new(0),
                limit: AtomicUsize::new(usize::MAX),
            }),
        }
    }
    /// Report `max` as the maximum buffer size.
    pub fn with_max_size(mut self, max: usize) -> Self {
        self.max_size = max;
        self
    }
    /// Let every tensor need `extra` bytes beyond its `nbytes` (like a backend padding rows).
    pub fn with_extra_alloc_size(mut self, extra: usize) -> Self {
        self.extra = extra;
        self
    }
    /// Refuse allocations larger than `bytes` (changeable later through the stats).
    pub fn with_limit(self, bytes: usize) -> Self {
        self.stats.set_limit(bytes);
        self
    }
    /// The shared counters.
    pub fn stats(&self) -> Arc<FakeMemoryStats> {
        self.stats.clone()
    }
    /// Wrap it in a handle.
    pub fn into_buffer_type(self) -> BufferType {
        BufferType::new(self)
    }
}

impl BufferTypeImpl for FakeBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc_buffer(&self, size: usize) -> backend_core::Result<Box<dyn BufferImpl>> {
        if size > self.stats.limit.load(Ordering::SeqCst) {
            self.stats.refusals.fetch_add(1, Ordering::SeqCst);
            return Err(backend_core::BackendError::AllocationFailed {
                buffer_type: self.name.clone(),
                size,
            });
        }
        self.stats.allocs.fetch_add(1, Ordering::SeqCst);
        self.stats.live_buffers.fetch_add(1, Ordering::SeqCst);
        self.stats.live_bytes.fetch_add(size, Ordering::SeqCst);
        Ok(Box::new(FakeBuffer {
            size,
            stats: self.stats.clone(),
        }))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        tensor.nbytes() + self.extra
    }
}

struct FakeBuffer {
    size: usize,
    stats: Arc<FakeMemoryStats>,
}

impl Drop for FakeBuffer {
    fn drop(&mut self) {
        self.stats.live_buffers.fetch_sub(1, Ordering::SeqCst);
        self.stats.live_bytes.fetch_sub(self.size, Ordering::SeqCst);
    }
}

impl BufferImpl for FakeBuffer {
    fn memset_tensor(&self, _: &Tensor, _: u8, _: usize, _: usize) -> backend_core::Result<()> {
        Ok(())
    }
    fn set_tensor(&self, _: &Tensor, _: usize, _: &[u8]) -> backend_core::Result<()> {
        Ok(())
    }
    fn get_tensor(&self, _: &Tensor, _: usize, data: &mut [u8]) -> backend_core::Result<()> {
        data.fill(0);
        Ok(())
    }
    fn clear(&self, _: u8) -> backend_core::Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------------------------------------
// llama-shaped decode graph

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
/// [`crate::alloc_ctx_tensors`]) before building graphs.
///
/// ```
/// use graph::Context;
/// use graph_alloc::{alloc_ctx_tensors, GraphAllocator, testing::*};
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

// ---------------------------------------------------------------------------------------------
// lifetimes and the live-bytes lower bound

/// When a tensor needs its bytes, in node positions: from `first` (−1 = before the first node:
/// leafs and INPUT tensors, which the user fills before the graph runs) to `last` inclusive
/// (`n_nodes` = until after the graph: outputs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// First position at which the bytes must be reserved.
    pub first: isize,
    /// Last position at which they are read or written.
    pub last: isize,
}

/// The lifetime of every non-view tensor without storage that `nodes` and `leafs` mention
/// (the tensors a graph allocator must place), computed from the graph alone, independently
/// of any allocator: call it before allocating. Indexed by `TensorId::index`.
///
/// A tensor is live from its production (or first use, or −1 for leafs and INPUT tensors) to
/// its last use, directly or through a view, or to the end for OUTPUT tensors and roots of
/// OUTPUT views.
pub fn lifetimes(ctx: &Context, nodes: &[TensorId], leafs: &[TensorId]) -> Vec<Option<Lifetime>> {
    let mut lt: Vec<Option<Lifetime>> = vec![None; ctx.len()];
    let end = nodes.len() as isize;
    let needs_bytes = |id: TensorId| {
        let t = &ctx[id];
        !t.is_view() && !t.has_storage()
    };
    let touch = |lt: &mut Vec<Option<Lifetime>>, id: TensorId, at: isize| {
        if !needs_bytes(id) {
            return;
        }
        let e = lt[id.index()].get_or_insert(Lifetime {
            first: at,
            last: at,
        });
        e.first = e.first.min(at);
        e.last = e.last.max(at);
    };
    let user_filled = |t: &Tensor| t.flags().contains(TensorFlags::INPUT);
    for &l in leafs {
        touch(&mut lt, l, -1);
    }
    for (i, &n) in nodes.iter().enumerate() {
        let i = i as isize;
        let t = &ctx[n];
        touch(&mut lt, n, if user_filled(t) { -1 } else { i });
        if let Some(root) = t.view_src() {
            touch(&mut lt, root, i);
        }
        for &s in t.srcs().iter().flatten() {
            let st = &ctx[s];
            touch(&mut lt, s, if user_filled(st) { -1 } else { i });
            touch(&mut lt, s, i);
            if let Some(root) = st.view_src() {
                touch(&mut lt, root, i);
            }
        }
    }
    for &n in nodes.iter().chain(leafs) {
        let t = &ctx[n];
        if t.flags().contains(TensorFlags::OUTPUT) {
            touch(&mut lt, t.view_src().unwrap_or(n), end);
        }
    }
    lt
}

/// The most bytes that must be reserved at once, in one group of tensors: the maximum over
/// node positions of the summed `size` of the tensors of the group live at that position,
/// where a node whose op may run in place does not count one same-layout, non-OUTPUT source
/// that dies at it (that source's bytes can be its result's). `size` gives a tensor's padded
/// size, or `None` for tensors outside the group. No allocator that honours the lifetimes of
/// [`lifetimes`] can use less.
pub fn live_bytes_lower_bound(
    ctx: &Context,
    nodes: &[TensorId],
    lifetimes: &[Option<Lifetime>],
    size: impl Fn(TensorId) -> Option<usize>,
) -> usize {
    let mut sized: Vec<(Lifetime, usize)> = Vec::new();
    let mut size_of = vec![None; lifetimes.len()];
    for id in ctx.ids() {
        if let (Some(l), Some(s)) = (lifetimes[id.index()], size(id)) {
            sized.push((l, s));
            size_of[id.index()] = Some(s);
        }
    }
    let mut best = 0usize;
    for i in -1..=nodes.len() as isize {
        let mut bytes: usize = sized
            .iter()
            .filter(|(l, _)| l.first <= i && i <= l.last)
            .map(|&(_, s)| s)
            .sum();
        if i >= 0 && (i as usize) < nodes.len() {
            let t = &ctx[nodes[i as usize]];
            if t.op().can_inplace() && !t.is_view() && size_of[nodes[i as usize].index()].is_some()
            {
                let credit = t
                    .srcs()
                    .iter()
                    .flatten()
                    .filter(|&&s| {
                        let st = &ctx[s];
                        lifetimes[s.index()].is_some_and(|l| l.last == i)
                            && st.same_layout(t)
                            && !st.flags().contains(TensorFlags::OUTPUT)
                    })
                    .filter_map(|&s| size_of[s.index()])
                    .max()
                    .unwrap_or(0);
                bytes -= credit;
            }
        }
        best = best.max(bytes);
    }
    best
}
