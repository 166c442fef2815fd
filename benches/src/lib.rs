//! Cross-crate benchmarks and the model they run.
//!
//! Each crate benchmarks its own job (`backend-cpu`: copies against `memcpy`; `cpu-kernels`:
//! GFLOP/s; `graph-alloc` and `sched`: planning time and allocations per call). What no single
//! crate can show is the cost of the layer as a whole on a real step, so this crate holds
//! [`DecodeBench`]: a llama-shaped model (Q4_0 weights, F16 KV cache) with real data in CPU
//! memory, whose decode step is run either through the [`sched::Scheduler`] or with a plain
//! [`graph_alloc::GraphAllocator`] and the CPU backend directly. The difference between the two
//! is the scheduler's overhead on a real computation.
//!
//! ```
//! use benches::DecodeBench;
//! let mut bench = DecodeBench::new(benches::tiny_config(), 1)?;
//! let via_sched = bench.step_scheduled()?;
//! let direct = bench.step_direct()?;
//! assert_eq!(via_sched, direct); // same kernels, same plan: bit-identical logits
//! # Ok::<(), benches::Error>(())
//! ```

use backend_core::{Backend, tensor_get, tensor_set};
use graph::{Checkpoint, Context, ElementType, TensorId};
use graph_alloc::{GraphAllocator, alloc_ctx_tensors};
use sched::Scheduler;
use test_fixtures::{LlamaConfig, LlamaModel};

/// Any error of the layers this crate drives.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A small model that still has every op of a llama decode step (2 layers, n_embd 256).
pub fn tiny_config() -> LlamaConfig {
    LlamaConfig {
        n_embd: 256,
        n_head: 8,
        n_ff: 512,
        n_vocab: 512,
        n_ctx: 64,
        ..LlamaConfig::llama_7b(2)
    }
}

/// The benchmark's model: 8 layers, n_embd 1024, n_ff 2816, 8192-token vocabulary, 256 cached
/// positions, Q4_0 weights (about 60 MB), F16 cache.
pub fn bench_config() -> LlamaConfig {
    LlamaConfig {
        n_embd: 1024,
        n_head: 16,
        n_ff: 2816,
        n_vocab: 8192,
        n_ctx: 256,
        ..LlamaConfig::llama_7b(8)
    }
}

/// A model with data, a CPU backend, a scheduler and a plain graph allocator.
pub struct DecodeBench {
    ctx: Context,
    model: LlamaModel,
    step: Checkpoint,
    cpu: Backend,
    sched: Scheduler,
    galloc: GraphAllocator,
    _buffers: Vec<backend_core::Buffer>,
}

/// A deterministic byte stream (xorshift) for weights.
fn fill(seed: &mut u64, out: &mut [u8]) {
    for b in out {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = (*seed >> 24) as u8;
    }
}

/// Bytes for a tensor of `ty` with `n` elements whose values are small and finite.
fn weight_bytes(seed: &mut u64, ty: ElementType, n: usize) -> Vec<u8> {
    match ty {
        ElementType::F32 => {
            let mut raw = vec![0u8; n];
            fill(seed, &mut raw);
            raw.iter()
                .flat_map(|&b| (1.0 + (b as f32 - 128.0) / 1024.0).to_le_bytes())
                .collect()
        }
        ElementType::Q4_0 => {
            let blocks = n / 32;
            let mut out = vec![0u8; blocks * 18];
            for block in out.chunks_exact_mut(18) {
                block[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                fill(seed, &mut block[2..]);
            }
            out
        }
        ElementType::F16 => (0..n)
            .flat_map(|i| half::f16::from_f32((i % 7) as f32 / 16.0).to_le_bytes())
            .collect(),
        other => vec![0u8; other.row_size(n)],
    }
}

impl DecodeBench {
    /// Build the model in CPU memory with deterministic data and a CPU backend of `n_threads`.
    pub fn new(config: LlamaConfig, n_threads: usize) -> Result<Self, Error> {
        backend_cpu::register();
        let cpu = backend_cpu::init()?;
        if let Some(c) = backend_cpu::CpuBackend::from_backend(&cpu) {
            c.set_n_threads(n_threads);
        }
        let buft = backend_cpu::cpu_buffer_type();
        let mut ctx = Context::new();
        let model = LlamaModel::new(&mut ctx, config)?;
        let mut buffers = Vec::new();
        for set in [&model.weights, &model.kv_cache] {
            if let Some(b) = alloc_ctx_tensors(&mut ctx, set.iter().copied(), &buft)? {
                buffers.push(b);
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for &t in model.weights.iter().chain(&model.kv_cache) {
            let (ty, n) = (ctx[t].ty(), ctx[t].nelements() as usize);
            tensor_set(&ctx, t, 0, &weight_bytes(&mut seed, ty, n))?;
        }
        let step = ctx.checkpoint();
        let sched = Scheduler::builder(vec![cpu.clone()])
            .graph_size(4096)
            .build()?;
        let galloc = GraphAllocator::new(&[buft]);
        Ok(DecodeBench {
            ctx,
            model,
            step,
            cpu,
            sched,
            galloc,
            _buffers: buffers,
        })
    }

    fn build(&mut self) -> Result<(graph::Graph, [TensorId; 4]), Error> {
        self.ctx.rewind(self.step);
        let d = self.model.decode_graph(&mut self.ctx)?;
        Ok((d.graph, [d.tokens, d.pos, d.mask, d.logits]))
    }

    fn set_inputs(&self, ids: [TensorId; 4]) -> Result<(), Error> {
        let c = self.model.config;
        tensor_set(&self.ctx, ids[0], 0, &7i32.to_le_bytes())?;
        tensor_set(&self.ctx, ids[1], 0, &((c.n_ctx - 1) as i32).to_le_bytes())?;
        let mask: Vec<u8> = (0..c.n_ctx).flat_map(|_| 0f32.to_le_bytes()).collect();
        tensor_set(&self.ctx, ids[2], 0, &mask)?;
        Ok(())
    }

    fn logits(&self, ids: [TensorId; 4]) -> Result<Vec<u8>, Error> {
        let n = self.ctx[ids[3]].nbytes();
        let mut out = vec![0u8; n];
        tensor_get(&self.ctx, ids[3], 0, &mut out)?;
        Ok(out)
    }

    /// One decode step through the scheduler: build, reset, allocate, set inputs, compute.
    /// Returns the logits' bytes.
    pub fn step_scheduled(&mut self) -> Result<Vec<u8>, Error> {
        let (graph, ids) = self.build()?;
        self.sched.reset();
        self.sched.alloc_graph(&mut self.ctx, &graph)?;
        self.set_inputs(ids)?;
        self.sched.graph_compute(&mut self.ctx, &graph)?;
        self.logits(ids)
    }

    /// The same step without the scheduler: the graph allocator places the graph and the CPU
    /// backend computes it.
    pub fn step_direct(&mut self) -> Result<Vec<u8>, Error> {
        let (graph, ids) = self.build()?;
        self.galloc.alloc_graph(&mut self.ctx, &graph)?;
        self.set_inputs(ids)?;
        self.cpu.graph_compute(&self.ctx, graph.as_view())?;
        self.logits(ids)
    }

    /// Only the scheduler's planning part of a step (build, reset, alloc_graph).
    pub fn plan_scheduled(&mut self) -> Result<(), Error> {
        let (graph, _) = self.build()?;
        self.sched.reset();
        self.sched.alloc_graph(&mut self.ctx, &graph)?;
        Ok(())
    }
}
