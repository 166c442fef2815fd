//! A llama-shaped decode graph as a graph file, for tests, snapshots and benchmarks.
//!
//! Why a generator: the scheduler's costs and decisions are dominated by the repeating
//! transformer block (weights per layer, a KV cache written through views, attention over
//! cache views, a feed-forward block), so one parametrised generator covers partial offload,
//! several GPUs, caches on either side and graphs ten times larger. The tensor names, order
//! and shapes are those of the shared fixtures' llama graphs, which a test checks.

use sched::fixture::{BackendSpec, GraphFile, TensorSpec};

/// Shape and placement of a generated llama decode graph.
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: i64,
    /// Attention heads.
    pub n_head: i64,
    /// Feed-forward width.
    pub n_ff: i64,
    /// Vocabulary size.
    pub n_vocab: i64,
    /// Tokens in the batch.
    pub n_tokens: i64,
    /// Cache length.
    pub n_ctx: i64,
    /// Cache position the batch is written at.
    pub kv_head: i64,
    /// Cache entries attended to.
    pub n_kv: i64,
    /// Weight matrix type (`"f32"`, `"f16"`, `"q4_0"`, …).
    pub wtype: String,
    /// Buffer of the token embeddings.
    pub embd_buffer: String,
    /// Buffer of each layer's weights and cache (layers past the end of the list: the
    /// embeddings' buffer).
    pub layer_buffers: Vec<String>,
    /// Buffer of the output norm and projection.
    pub output_buffer: String,
    /// Buffer of each layer's KV cache (default: the layer's buffer).
    pub cache_buffers: Option<Vec<String>>,
    /// Backends in priority order.
    pub backends: Vec<BackendSpec>,
    /// Scheduler capacity.
    pub graph_size: usize,
    /// Pipeline parallelism.
    pub parallel: bool,
}

impl LlamaConfig {
    /// The small model of the shared fixtures (n_embd 64, 4 heads, n_ff 128, 100 tokens of
    /// vocabulary, 8 tokens at cache position 8 of 16), everything on one CPU backend.
    pub fn tiny(n_layer: usize) -> Self {
        LlamaConfig {
            n_layer,
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_vocab: 100,
            n_tokens: 8,
            n_ctx: 16,
            kv_head: 8,
            n_kv: 16,
            wtype: "f32".into(),
            embd_buffer: "CPU".into(),
            layer_buffers: vec!["CPU".into(); n_layer],
            output_buffer: "CPU".into(),
            cache_buffers: None,
            backends: vec![BackendSpec::cpu("CPU")],
            graph_size: 2048,
            parallel: false,
        }
    }

    /// A 7B-shaped decode step (n_embd 4096, 32 heads, n_ff 11008, 32000 vocabulary,
    /// one token at position 511 of a 4096 cache), everything on one CPU backend.
    pub fn llama_7b(n_layer: usize) -> Self {
        LlamaConfig {
            n_layer,
            n_embd: 4096,
            n_head: 32,
            n_ff: 11008,
            n_vocab: 32000,
            n_tokens: 1,
            n_ctx: 4096,
            kv_head: 511,
            n_kv: 512,
            wtype: "q4_0".into(),
            embd_buffer: "CPU".into(),
            layer_buffers: vec!["CPU".into(); n_layer],
            output_buffer: "CPU".into(),
            cache_buffers: None,
            backends: vec![BackendSpec::cpu("CPU")],
            graph_size: n_layer.saturating_mul(40).saturating_add(64).max(2048),
            parallel: false,
        }
    }

    /// Put the last `n_gpu` blocks (and, when `n_gpu > n_layer`, the output) on backend
    /// `gpu`, which is added in front of the backends if missing (llama.cpp's
    /// `n_gpu_layers`).
    pub fn offload(mut self, gpu: &str, n_gpu: usize) -> Self {
        if !self.backends.iter().any(|b| b.name == gpu) {
            self.backends.insert(0, BackendSpec::gpu(gpu));
        }
        if self.layer_buffers.len() < self.n_layer {
            self.layer_buffers
                .resize(self.n_layer, self.embd_buffer.clone());
        }
        let first = self.n_layer.saturating_sub(n_gpu);
        for b in &mut self.layer_buffers[first..self.n_layer] {
            *b = gpu.into();
        }
        if n_gpu > self.n_layer {
            self.output_buffer = gpu.into();
        }
        self
    }

    /// Buffer of layer `il`'s weights (see [`LlamaConfig::layer_buffers`]).
    fn layer_buffer(&self, il: usize) -> &String {
        self.layer_buffers.get(il).unwrap_or(&self.embd_buffer)
    }

    /// The graph file. Shapes are not checked here: building the file checks them (a head
    /// count of 0 gives heads of width 0; products and byte sizes past the integer range
    /// saturate, which building refuses as a size overflow).
    pub fn graph_file(&self, name: &str) -> GraphFile {
        let mut t: Vec<TensorSpec> = Vec::new();
        let w = self.wtype.as_str();
        let (e, h, ff) = (self.n_embd, self.n_head, self.n_ff);
        let hd = e.checked_div(h).unwrap_or(0);
        let es: usize = 2; // f16 cache
        let cache_bytes = bytes(mul(self.n_ctx, e), es);

        t.push(TensorSpec::leaf("tok_embd", w, &[e, self.n_vocab]).in_buffer(&self.embd_buffer));
        for il in 0..self.n_layer {
            let b = self.layer_buffer(il);
            let l = |n: &str| format!("{n}.{il}");
            t.push(TensorSpec::leaf(&l("attn_norm"), "f32", &[e]).in_buffer(b));
            for n in ["wq", "wk", "wv", "wo"] {
                t.push(TensorSpec::leaf(&l(n), w, &[e, e]).in_buffer(b));
            }
            t.push(TensorSpec::leaf(&l("ffn_norm"), "f32", &[e]).in_buffer(b));
            t.push(TensorSpec::leaf(&l("ffn_gate"), w, &[e, ff]).in_buffer(b));
            t.push(TensorSpec::leaf(&l("ffn_up"), w, &[e, ff]).in_buffer(b));
            t.push(TensorSpec::leaf(&l("ffn_down"), w, &[ff, e]).in_buffer(b));
        }
        t.push(TensorSpec::leaf("output_norm", "f32", &[e]).in_buffer(&self.output_buffer));
        t.push(TensorSpec::leaf("output", w, &[e, self.n_vocab]).in_buffer(&self.output_buffer));
        for il in 0..self.n_layer {
            let b = self
                .cache_buffers
                .as_ref()
                .and_then(|c| c.get(il))
                .unwrap_or(self.layer_buffer(il));
            t.push(
                TensorSpec::leaf(&format!("cache_k.{il}"), "f16", &[mul(self.n_ctx, e)])
                    .in_buffer(b),
            );
            t.push(
                TensorSpec::leaf(&format!("cache_v.{il}"), "f16", &[mul(self.n_ctx, e)])
                    .in_buffer(b),
            );
        }
        t.push(TensorSpec::leaf("inp_tokens", "i32", &[self.n_tokens]).flag("input"));
        t.push(TensorSpec::leaf("inp_pos", "i32", &[self.n_tokens]).flag("input"));
        t.push(TensorSpec::leaf("kq_mask", "f32", &[self.n_kv, self.n_tokens]).flag("input"));

        t.push(TensorSpec::op(
            "inp_embd",
            "GET_ROWS",
            &["tok_embd", "inp_tokens"],
        ));
        let mut expand = Vec::new();
        let mut inp = "inp_embd".to_owned();
        for il in 0..self.n_layer {
            let l = |n: &str| format!("{n}.{il}");
            let op = |name: &str, op: &str, src: &[&str]| TensorSpec::op(&l(name), op, src);
            let mut norm = op("norm", "RMS_NORM", &[&inp]);
            norm.eps = Some(1e-5);
            t.push(norm);
            t.push(op("attn_norm_out", "MUL", &[&l("norm"), &l("attn_norm")]));
            for (n, wn) in [("Qcur", "wq"), ("Kcur", "wk"), ("Vcur", "wv")] {
                t.push(op(n, "MUL_MAT", &[&l(wn), &l("attn_norm_out")]));
            }
            for (n, s) in [("Qr", "Qcur"), ("Kr", "Kcur")] {
                let mut r = op(n, "RESHAPE", &[&l(s)]);
                r.ne = Some(vec![hd, h, self.n_tokens]);
                t.push(r);
            }
            for (n, s) in [("Qrope", "Qr"), ("Krope", "Kr")] {
                let mut r = op(n, "ROPE", &[&l(s), "inp_pos"]);
                r.n_dims = Some(hd as i32);
                r.mode = Some(0);
                t.push(r);
            }
            let mut kv = op("k_cache_view", "VIEW", &[&l("cache_k")]);
            kv.ne = Some(vec![mul(self.n_tokens, e)]);
            kv.offset = Some(bytes(mul(self.kv_head, e), es));
            t.push(kv);
            t.push(op("k_store", "CPY", &[&l("Krope"), &l("k_cache_view")]));
            t.push(op("Vt", "TRANSPOSE", &[&l("Vcur")]));
            let mut vv = op("v_cache_view", "VIEW", &[&l("cache_v")]);
            vv.ne = Some(vec![self.n_tokens, e]);
            vv.nb = Some(vec![es, bytes(self.n_ctx, es), cache_bytes, cache_bytes]);
            vv.offset = Some(bytes(self.kv_head, es));
            t.push(vv);
            t.push(op("v_store", "CPY", &[&l("Vt"), &l("v_cache_view")]));
            let mut q = op("q", "PERMUTE", &[&l("Qrope")]);
            q.axes = Some([0, 2, 1, 3]);
            t.push(q);
            let mut k = op("k", "VIEW", &[&l("cache_k")]);
            k.ne = Some(vec![hd, self.n_kv, h]);
            k.nb = Some(vec![es, bytes(e, es), bytes(hd, es), cache_bytes]);
            k.offset = Some(0);
            t.push(k);
            t.push(op("kq", "MUL_MAT", &[&l("k"), &l("q")]));
            let mut sm = op("kq_soft", "SOFT_MAX", &[&l("kq"), "kq_mask"]);
            sm.scale = Some(1.0 / (hd as f32).sqrt());
            sm.max_bias = Some(0.0);
            t.push(sm);
            let mut v = op("v", "VIEW", &[&l("cache_v")]);
            v.ne = Some(vec![self.n_kv, hd, h]);
            v.nb = Some(vec![
                es,
                bytes(self.n_ctx, es),
                bytes(mul(self.n_ctx, hd), es),
                cache_bytes,
            ]);
            v.offset = Some(0);
            t.push(v);
            t.push(op("kqv", "MUL_MAT", &[&l("v"), &l("kq_soft")]));
            let mut m = op("kqv_merged", "PERMUTE", &[&l("kqv")]);
            m.axes = Some([0, 2, 1, 3]);
            t.push(m);
            t.push(op("kqv_cont", "CONT", &[&l("kqv_merged")]));
            let mut f = op("kqv_flat", "RESHAPE", &[&l("kqv_cont")]);
            f.ne = Some(vec![e, self.n_tokens]);
            t.push(f);
            t.push(op("attn_out", "MUL_MAT", &[&l("wo"), &l("kqv_flat")]));
            t.push(op("ffn_inp", "ADD", &[&l("attn_out"), &inp]));
            let mut n2 = op("ffn_norm0", "RMS_NORM", &[&l("ffn_inp")]);
            n2.eps = Some(1e-5);
            t.push(n2);
            t.push(op(
                "ffn_norm_out",
                "MUL",
                &[&l("ffn_norm0"), &l("ffn_norm")],
            ));
            t.push(op("gate", "MUL_MAT", &[&l("ffn_gate"), &l("ffn_norm_out")]));
            let mut a = op("gate_act", "UNARY", &[&l("gate")]);
            a.unary = Some("SILU".into());
            t.push(a);
            t.push(op("up", "MUL_MAT", &[&l("ffn_up"), &l("ffn_norm_out")]));
            t.push(op("gate_up", "MUL", &[&l("gate_act"), &l("up")]));
            t.push(op("down", "MUL_MAT", &[&l("ffn_down"), &l("gate_up")]));
            t.push(op("l_out", "ADD", &[&l("down"), &l("ffn_inp")]));
            expand.push(l("k_store"));
            expand.push(l("v_store"));
            inp = l("l_out");
        }
        let mut rn = TensorSpec::op("result_norm0", "RMS_NORM", &[&inp]);
        rn.eps = Some(1e-5);
        t.push(rn);
        t.push(TensorSpec::op(
            "result_norm",
            "MUL",
            &["result_norm0", "output_norm"],
        ));
        t.push(TensorSpec::op("logits", "MUL_MAT", &["output", "result_norm"]).flag("output"));
        expand.push("logits".into());

        GraphFile {
            name: name.into(),
            graph_size: self.graph_size,
            parallel: self.parallel,
            backends: self.backends.clone(),
            tensors: t,
            expand,
            assign: Default::default(),
        }
    }
}

/// `a · b`, saturated: absurd shapes stay absurd (and are refused when the file is built)
/// instead of wrapping into plausible ones.
fn mul(a: i64, b: i64) -> i64 {
    a.saturating_mul(b)
}

/// The bytes of `n` elements of `es` bytes, saturated; a negative count saturates too.
fn bytes(n: i64, es: usize) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX).saturating_mul(es)
}
