//! A llama-shaped model that really computes (random weights), for the execution tests: the
//! same graph as `test_fixtures::llama_file` (RMS norm, rotary attention over an f16 KV cache written
//! through CPY into cache views, SiLU-gated feed-forward), built with graph ops directly so
//! that weights and caches can be placed in real buffers of real backends.
//!
//! The reference for every comparison is the same model, same weights, same inputs, placed
//! entirely in CPU memory, allocated by the graph allocator and computed by the CPU backend
//! alone: no scheduler involved.

#![allow(dead_code)] // each test binary uses part of this module

use backend_core::{
    Backend, Buffer, BufferType, BufferUsage, tensor_alloc, tensor_get, tensor_set,
};
use graph::{Context, ElementType, Graph, TensorId};
use graph_alloc::GraphAllocator;

/// Shapes of the model.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub n_layer: usize,
    pub n_embd: i64,
    pub n_head: i64,
    pub n_ff: i64,
    pub n_vocab: i64,
    pub n_tokens: i64,
    pub n_ctx: i64,
    pub kv_head: i64,
    pub n_kv: i64,
    /// Weight matrices' type: F32 or F16.
    pub wtype: ElementType,
}

impl Cfg {
    pub fn tiny(n_layer: usize) -> Self {
        Cfg {
            n_layer,
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_vocab: 100,
            n_tokens: 8,
            n_ctx: 16,
            kv_head: 8,
            n_kv: 16,
            wtype: ElementType::F32,
        }
    }
}

/// Where a group of weights lives: group 0 is the token embeddings, 1..=n_layer the layers
/// (weights and KV cache), n_layer + 1 the output norm and projection.
pub type Place<'a> = &'a dyn Fn(usize) -> BufferType;

/// A tiny deterministic generator (splitmix64).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn encode(ty: ElementType, v: &[f32]) -> Vec<u8> {
    match ty {
        ElementType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ElementType::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        ElementType::I32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        other => panic!("no encoder for {other:?} in this test"),
    }
}

/// The model: context, graph, inputs, output, caches, and the buffers holding the weights.
pub struct Model {
    pub cfg: Cfg,
    pub ctx: Context,
    pub graph: Graph,
    pub tokens: TensorId,
    pub pos: TensorId,
    pub mask: TensorId,
    pub logits: TensorId,
    /// `(cache_k, cache_v)` per layer.
    pub caches: Vec<(TensorId, TensorId)>,
    /// Intermediate results by name (`"attn_out.0"`, `"kq_soft.1"`, …).
    pub named: Vec<(String, TensorId)>,
    pub buffers: Vec<Buffer>,
}

impl Model {
    /// Build the model with weights placed by `place` and filled from `seed`.
    pub fn build(cfg: &Cfg, place: Place<'_>, seed: u64) -> Model {
        let mut ctx = Context::new();
        let (e, h, ff, t) = (cfg.n_embd, cfg.n_head, cfg.n_ff, cfg.n_tokens);
        let hd = e / h;
        let es = 2usize; // f16 cache
        let w = cfg.wtype;
        let f32_ = ElementType::F32;

        // leafs: (group, tensor, fill range)
        let mut leafs: Vec<(usize, TensorId, f32)> = Vec::new();
        let mut leaf = |ctx: &mut Context, g: usize, ty, ne: &[i64], name: &str, r: f32| {
            let id = ctx.new_tensor(ty, ne).unwrap();
            ctx.set_name(id, name).unwrap();
            leafs.push((g, id, r));
            id
        };
        let tok_embd = leaf(&mut ctx, 0, w, &[e, cfg.n_vocab], "tok_embd", 1.0);
        struct Layer {
            attn_norm: TensorId,
            wq: TensorId,
            wk: TensorId,
            wv: TensorId,
            wo: TensorId,
            ffn_norm: TensorId,
            gate: TensorId,
            up: TensorId,
            down: TensorId,
            cache_k: TensorId,
            cache_v: TensorId,
        }
        let mut layers = Vec::new();
        for il in 0..cfg.n_layer {
            let g = il + 1;
            let se = 1.0 / (e as f32).sqrt();
            let sf = 1.0 / (ff as f32).sqrt();
            let n = |s: &str| format!("{s}.{il}");
            layers.push(Layer {
                attn_norm: leaf(&mut ctx, g, f32_, &[e], &n("attn_norm"), -1.0),
                wq: leaf(&mut ctx, g, w, &[e, e], &n("wq"), se),
                wk: leaf(&mut ctx, g, w, &[e, e], &n("wk"), se),
                wv: leaf(&mut ctx, g, w, &[e, e], &n("wv"), se),
                wo: leaf(&mut ctx, g, w, &[e, e], &n("wo"), se),
                ffn_norm: leaf(&mut ctx, g, f32_, &[e], &n("ffn_norm"), -1.0),
                gate: leaf(&mut ctx, g, w, &[e, ff], &n("ffn_gate"), se),
                up: leaf(&mut ctx, g, w, &[e, ff], &n("ffn_up"), se),
                down: leaf(&mut ctx, g, w, &[ff, e], &n("ffn_down"), sf),
                cache_k: leaf(
                    &mut ctx,
                    g,
                    ElementType::F16,
                    &[cfg.n_ctx * e],
                    &n("cache_k"),
                    1.0,
                ),
                cache_v: leaf(
                    &mut ctx,
                    g,
                    ElementType::F16,
                    &[cfg.n_ctx * e],
                    &n("cache_v"),
                    1.0,
                ),
            });
        }
        let og = cfg.n_layer + 1;
        let output_norm = leaf(&mut ctx, og, f32_, &[e], "output_norm", -1.0);
        let output = leaf(
            &mut ctx,
            og,
            w,
            &[e, cfg.n_vocab],
            "output",
            1.0 / (e as f32).sqrt(),
        );

        // one weights buffer per group, filled from the seed
        let mut buffers = Vec::new();
        let mut rng = Rng::new(seed);
        for g in 0..=og {
            let ids: Vec<(TensorId, f32)> = leafs
                .iter()
                .filter(|l| l.0 == g)
                .map(|l| (l.1, l.2))
                .collect();
            let buft = place(g);
            let align = buft.alignment().max(1);
            let mut size = 0;
            let mut offs = Vec::new();
            for &(id, _) in &ids {
                size = usize::next_multiple_of(size, align);
                offs.push(size);
                size += buft.alloc_size(&ctx[id]);
            }
            let buf = buft.alloc_buffer(size).unwrap();
            buf.set_usage(BufferUsage::Weights);
            for (&(id, r), &o) in ids.iter().zip(&offs) {
                tensor_alloc(&mut ctx, &buf, id, o).unwrap();
                let n = ctx[id].nelements() as usize;
                // r < 0: a norm weight near 1; else uniform in [-r, r)
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        if r < 0.0 {
                            rng.uniform(0.8, 1.2)
                        } else {
                            rng.uniform(-r, r)
                        }
                    })
                    .collect();
                tensor_set(&ctx, id, 0, &encode(ctx[id].ty(), &v)).unwrap();
            }
            buffers.push(buf);
        }

        let tokens = ctx.new_tensor_1d(ElementType::I32, t).unwrap();
        let pos = ctx.new_tensor_1d(ElementType::I32, t).unwrap();
        let mask = ctx.new_tensor_2d(f32_, cfg.n_kv, t).unwrap();
        for (id, n) in [(tokens, "inp_tokens"), (pos, "inp_pos"), (mask, "kq_mask")] {
            ctx.set_name(id, n).unwrap();
            ctx.set_input(id).unwrap();
        }

        let mut graph = Graph::new(4096);
        let mut named = Vec::new();
        let c = &mut ctx;
        let mut inp = c.get_rows(tok_embd, tokens).unwrap();
        c.set_name(inp, "inp_embd").unwrap();
        for (il, l) in layers.iter().enumerate() {
            let mut name = |c: &mut Context, id: TensorId, s: &str| {
                let n = format!("{s}.{il}");
                c.set_name(id, &n).unwrap();
                named.push((n, id));
                id
            };
            let norm = c.rms_norm(inp, 1e-5).unwrap();
            let x = c.mul(norm, l.attn_norm).unwrap();
            let x = name(c, x, "attn_norm_out");
            let q = c.mul_mat(l.wq, x).unwrap();
            let k = c.mul_mat(l.wk, x).unwrap();
            let v = c.mul_mat(l.wv, x).unwrap();
            let qr = c.reshape_3d(q, hd, h, t).unwrap();
            let kr = c.reshape_3d(k, hd, h, t).unwrap();
            let qrope = c.rope(qr, pos, hd as i32, 0).unwrap();
            let krope = c.rope(kr, pos, hd as i32, 0).unwrap();
            let krope = name(c, krope, "Krope");
            let kview = c
                .view_1d(l.cache_k, t * e, (cfg.kv_head * e) as usize * es)
                .unwrap();
            let kstore = c.cpy(krope, kview).unwrap();
            let vt = c.transpose(v).unwrap();
            let vview = c
                .view_2d(
                    l.cache_v,
                    t,
                    e,
                    cfg.n_ctx as usize * es,
                    cfg.kv_head as usize * es,
                )
                .unwrap();
            let vstore = c.cpy(vt, vview).unwrap();
            graph.build_forward_expand(c, kstore).unwrap();
            graph.build_forward_expand(c, vstore).unwrap();
            let qp = c.permute(qrope, [0, 2, 1, 3]).unwrap();
            let kc = c
                .view_3d(
                    l.cache_k,
                    hd,
                    cfg.n_kv,
                    h,
                    e as usize * es,
                    hd as usize * es,
                    0,
                )
                .unwrap();
            let kq = c.mul_mat(kc, qp).unwrap();
            let kq = c
                .soft_max_ext(kq, Some(mask), 1.0 / (hd as f32).sqrt(), 0.0)
                .unwrap();
            let kq = name(c, kq, "kq_soft");
            let vc = c
                .view_3d(
                    l.cache_v,
                    cfg.n_kv,
                    hd,
                    h,
                    cfg.n_ctx as usize * es,
                    (cfg.n_ctx * hd) as usize * es,
                    0,
                )
                .unwrap();
            let kqv = c.mul_mat(vc, kq).unwrap();
            let merged = c.permute(kqv, [0, 2, 1, 3]).unwrap();
            let cont = c.cont(merged).unwrap();
            let flat = c.reshape_2d(cont, e, t).unwrap();
            let attn = c.mul_mat(l.wo, flat).unwrap();
            let attn = name(c, attn, "attn_out");
            let ffn_inp = c.add(attn, inp).unwrap();
            let n2 = c.rms_norm(ffn_inp, 1e-5).unwrap();
            let n2 = c.mul(n2, l.ffn_norm).unwrap();
            let gate = c.mul_mat(l.gate, n2).unwrap();
            let gate = c.silu(gate).unwrap();
            let up = c.mul_mat(l.up, n2).unwrap();
            let gu = c.mul(gate, up).unwrap();
            let down = c.mul_mat(l.down, gu).unwrap();
            let out = c.add(down, ffn_inp).unwrap();
            inp = name(c, out, "l_out");
        }
        let rn = c.rms_norm(inp, 1e-5).unwrap();
        let rn = c.mul(rn, output_norm).unwrap();
        let logits = c.mul_mat(output, rn).unwrap();
        c.set_name(logits, "logits").unwrap();
        c.set_output(logits).unwrap();
        graph.build_forward_expand(c, logits).unwrap();

        Model {
            cfg: cfg.clone(),
            ctx,
            graph,
            tokens,
            pos,
            mask,
            logits,
            caches: layers.iter().map(|l| (l.cache_k, l.cache_v)).collect(),
            named,
            buffers,
        }
    }

    /// The input values of step `step`: random tokens and positions, a causal mask with
    /// extra random holes (never hiding a token from itself).
    pub fn inputs(cfg: &Cfg, step: u64) -> [Vec<u8>; 3] {
        let mut r = Rng::new(0xC0FFEE ^ step.wrapping_mul(0x1234_5678_9ABC_DEF1));
        let t = cfg.n_tokens as usize;
        let toks: Vec<f32> = (0..t).map(|_| r.below(cfg.n_vocab as u64) as f32).collect();
        let base = r.below(2000) as f32;
        let pos: Vec<f32> = (0..t).map(|i| base + i as f32).collect();
        let mut mask = Vec::with_capacity(t * cfg.n_kv as usize);
        for i in 0..t as i64 {
            for j in 0..cfg.n_kv {
                let own = j == cfg.kv_head + i;
                let visible = j <= cfg.kv_head + i && (own || r.below(4) != 0);
                mask.push(if visible { 0.0 } else { f32::NEG_INFINITY });
            }
        }
        [
            encode(ElementType::I32, &toks),
            encode(ElementType::I32, &pos),
            encode(ElementType::F32, &mask),
        ]
    }

    /// Write step `step`'s inputs (the inputs must have memory).
    pub fn set_inputs(&self, step: u64) {
        let [a, b, c] = Self::inputs(&self.cfg, step);
        tensor_set(&self.ctx, self.tokens, 0, &a).unwrap();
        tensor_set(&self.ctx, self.pos, 0, &b).unwrap();
        tensor_set(&self.ctx, self.mask, 0, &c).unwrap();
    }

    /// Bytes of tensor `id`.
    pub fn bytes(&self, id: TensorId) -> Vec<u8> {
        let mut v = vec![0u8; self.ctx[id].nbytes()];
        tensor_get(&self.ctx, id, 0, &mut v).unwrap();
        v
    }

    pub fn logits(&self) -> Vec<u8> {
        self.bytes(self.logits)
    }

    /// Every cache's bytes.
    pub fn caches(&self) -> Vec<Vec<u8>> {
        self.caches
            .iter()
            .flat_map(|&(k, v)| [self.bytes(k), self.bytes(v)])
            .collect()
    }

    pub fn id(&self, name: &str) -> TensorId {
        self.named
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
            .1
    }
}

/// The CPU backend with `n` threads.
pub fn cpu(n: usize) -> Backend {
    let b = backend_cpu::init().unwrap();
    backend_cpu::CpuBackend::from_backend(&b)
        .unwrap()
        .set_n_threads(n);
    b
}

/// The reference: the model entirely in CPU memory, computed by the CPU backend alone.
pub struct Reference {
    pub model: Model,
    cpu: Backend,
}

impl Reference {
    /// `keep`: intermediate tensors (by name) to keep readable after compute.
    pub fn new(cfg: &Cfg, seed: u64, keep: &[&str]) -> Reference {
        let cpu = cpu(2);
        let buft = cpu.default_buffer_type();
        let mut model = Model::build(cfg, &|_| buft.clone(), seed);
        for n in keep {
            let id = model.id(n);
            model.ctx.set_output(id).unwrap();
        }
        let mut ga = GraphAllocator::new(&[buft]);
        ga.alloc_graph(&mut model.ctx, &model.graph).unwrap();
        // the allocator's buffer must live as long as the model
        model.buffers.push(ga.buffer(0).unwrap().clone());
        Reference { model, cpu }
    }

    /// Compute step `step`; return the logits.
    pub fn step(&mut self, step: u64) -> Vec<u8> {
        self.model.set_inputs(step);
        let st = self
            .cpu
            .graph_compute(&self.model.ctx, self.model.graph.as_view())
            .unwrap();
        assert_eq!(st, backend_core::ComputeStatus::Success);
        self.model.logits()
    }
}
