//! A llama-shaped model that really computes (random weights), for the execution tests: the
//! graph of `test_fixtures::llama_file` (RMS norm, rotary attention over an f16 KV cache
//! written through CPY into cache views, SiLU-gated feed-forward), built into a context by
//! `test_fixtures::in_context` so that weights and caches are placed in real buffers of real
//! backends.
//!
//! The reference for every comparison is the same model, same weights, same inputs, placed
//! entirely in CPU memory, allocated by the graph allocator and computed by the CPU backend
//! alone: no scheduler involved.

#![allow(dead_code)] // each test binary uses part of this module

use backend_core::{
    Backend, Buffer, BufferType, BufferUsage, Device, tensor_alloc, tensor_get, tensor_set,
};
use graph::{Context, ElementType, Graph, TensorId};
use graph_alloc::GraphAllocator;
use test_fixtures::in_context;

/// Shapes of the model (its placement fields are not used: [`Model::build`] places by group),
/// with `Cfg::tiny(n_layer)` the shared fixtures' small model and `wtype` `"f32"` or `"f16"`.
pub use test_fixtures::llama_file::LlamaConfig as Cfg;

/// Where a group of weights lives: group 0 is the token embeddings, 1..=n_layer the layers
/// (weights and KV cache), n_layer + 1 the output norm and projection.
pub type Place<'a> = &'a dyn Fn(usize) -> BufferType;

/// Token embeddings and layers 0..n_cpu on the CPU, the other layers and the output on `dev`
/// (llama.cpp's partial offload).
pub fn offload(cpu: &Backend, dev: &Device, n_cpu: usize) -> impl Fn(usize) -> BufferType + use<> {
    let (c, d) = (cpu.default_buffer_type(), dev.buffer_type());
    move |g| if g <= n_cpu { c.clone() } else { d.clone() }
}

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

/// The intermediate results [`Model::id`] finds, per layer, in this order (`"attn_out.0"`).
const NAMED: [&str; 5] = ["attn_norm_out", "Krope", "kq_soft", "attn_out", "l_out"];

/// The range a weight is drawn from: < 0 for a norm weight (near 1), else uniform in
/// `[-r, r)`; matrices scaled by their input width.
fn fill_range(name: &str, cfg: &Cfg) -> f32 {
    let se = 1.0 / (cfg.n_embd as f32).sqrt();
    match name.split('.').next().unwrap_or(name) {
        "attn_norm" | "ffn_norm" | "output_norm" => -1.0,
        "ffn_down" => 1.0 / (cfg.n_ff as f32).sqrt(),
        "tok_embd" | "cache_k" | "cache_v" => 1.0,
        _ => se,
    }
}

/// One weights buffer of `buft` holding `ids` one after the other, filled from `rng`.
fn fill_group(
    ctx: &mut Context,
    ids: &[TensorId],
    buft: &BufferType,
    cfg: &Cfg,
    rng: &mut Rng,
) -> Buffer {
    let align = buft.alignment().max(1);
    let mut size = 0;
    let mut offs = Vec::new();
    for &id in ids {
        size = usize::next_multiple_of(size, align);
        offs.push(size);
        size += buft.alloc_size(&ctx[id]);
    }
    let buf = buft.alloc_buffer(size).unwrap();
    buf.set_usage(BufferUsage::Weights);
    for (&id, &o) in ids.iter().zip(&offs) {
        tensor_alloc(ctx, &buf, id, o).unwrap();
        let n = ctx[id].nelements() as usize;
        let r = fill_range(ctx[id].name(), cfg);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                if r < 0.0 {
                    rng.uniform(0.8, 1.2)
                } else {
                    rng.uniform(-r, r)
                }
            })
            .collect();
        tensor_set(ctx, id, 0, &encode(ctx[id].ty(), &v)).unwrap();
    }
    buf
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
        // the file names each leaf's buffer after its group
        let group_names: Vec<String> = (0..=cfg.n_layer + 1).map(|g| g.to_string()).collect();
        let file = Cfg {
            embd_buffer: group_names[0].clone(),
            layer_buffers: group_names[1..=cfg.n_layer].to_vec(),
            output_buffer: group_names[cfg.n_layer + 1].clone(),
            cache_buffers: None,
            graph_size: 4096,
            ..cfg.clone()
        }
        .graph_file("model");
        let mut ctx = Context::new();
        let mut buffers = Vec::new();
        let built = in_context::build(&file, &mut ctx, |ctx, leafs| {
            // one weights buffer per group, filled from the seed, groups in order
            let mut rng = Rng::new(seed);
            for (g, group) in group_names.iter().enumerate() {
                let ids: Vec<TensorId> = leafs
                    .iter()
                    .filter(|l| l.1 == group.as_str())
                    .map(|l| l.0)
                    .collect();
                buffers.push(fill_group(ctx, &ids, &place(g), cfg, &mut rng));
            }
        })
        .unwrap();
        let named = (0..cfg.n_layer)
            .flat_map(|il| NAMED.iter().map(move |n| format!("{n}.{il}")))
            .map(|n| {
                let id = built.id(&n);
                (n, id)
            })
            .collect();
        Model {
            cfg: cfg.clone(),
            ctx,
            tokens: built.id("inp_tokens"),
            pos: built.id("inp_pos"),
            mask: built.id("kq_mask"),
            logits: built.id("logits"),
            caches: (0..cfg.n_layer)
                .map(|il| {
                    let kv = |n: &str| built.id(&format!("{n}.{il}"));
                    (kv("cache_k"), kv("cache_v"))
                })
                .collect(),
            named,
            buffers,
            graph: built.graph, // last: the ids above are read from `built`
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
