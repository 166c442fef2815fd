//! The decode engine: weights placed once, a KV cache, a worst-case plan reserved once, then
//! per step build → allocate → compute → read the last position's logits.
//!
//! Why this shape: it is the loop an inference engine runs. The scheduler reserves compute
//! memory once for the largest step (a full micro-batch attending over the whole cache), so a
//! step only re-splits and re-assigns a freshly built graph inside that memory. The prompt
//! goes through in micro-batches of at most `n_ubatch` tokens, then generation feeds one token
//! per step. A step that fails (bad input, a backend error) does not advance the cache: the
//! cells it may have written lie past the used ones and are masked until overwritten.
//!
//! With `offload > 0` the last blocks' weights (and their KV cache) move to the in-process
//! test device; with `rpc` endpoints they go to remote devices instead (ggml's `rpc-server`,
//! ours, or `embedded`: our server started in this process), shared in contiguous runs.

use std::time::{Duration, Instant};

use backend_core::{Backend, Buffer, BufferType, WeightBufferTypes, tensor_get, tensor_set};
use graph::{Checkpoint, Context, Graph, Op, TensorId};
use sched::Scheduler;

use crate::error::{LlmError, Result};
use crate::graph::{StepShape, StepTensors, build_step, graph_capacity};
use crate::hparams::Hparams;
use crate::kv_cache::{KvCache, fill_mask};
use crate::sampler::Sampler;
use crate::weights::{LlamaWeights, ModelFile};

pub use backend_rpc_server::EMBEDDED;

/// How to set up a [`Llama`].
#[derive(Clone, Debug)]
pub struct LlamaOptions {
    /// CPU threads; 0 = the machine's available parallelism.
    pub threads: usize,
    /// KV cache cells (the context size).
    pub n_ctx: usize,
    /// Largest prompt micro-batch.
    pub n_ubatch: usize,
    /// Blocks (the last ones) placed on the test device, or on the remote devices when `rpc`
    /// names any (there `0` means half the blocks, rounded up).
    pub offload: usize,
    /// Remote devices: `HOST:PORT` of servers speaking ggml's RPC protocol, or [`EMBEDDED`].
    pub rpc: Vec<String>,
    /// Record per-op compute times (computes node by node, a little slower).
    pub profile: bool,
    /// Place the CPU's weights in the CPU device's extra buffer types where its kernels take
    /// them (`CPU_REPACK`: matrices of the types it has an interleaved layout for, copied and
    /// repacked at load), as llama.cpp does by default; `false` keeps every weight in place
    /// in the mapped file (llama.cpp's `--no-repack`, `use_extra_bufts = false`).
    pub extra_buffer_types: bool,
    /// Cells a step attends over are padded to a multiple of this: a positive multiple of
    /// [`N_KV_PAD`](crate::N_KV_PAD) (64, the default). llama.cpp pads to 256; every
    /// multiple of 64 gives the same bits, the smaller ones with less work.
    pub kv_pad: usize,
}

impl Default for LlamaOptions {
    fn default() -> Self {
        LlamaOptions {
            threads: 0,
            n_ctx: 2048,
            n_ubatch: 512,
            offload: 0,
            rpc: Vec::new(),
            profile: false,
            extra_buffer_types: true,
            kv_pad: crate::N_KV_PAD,
        }
    }
}

/// Where a step's time went, summed over steps since the last [`Llama::take_timings`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimings {
    /// Steps counted.
    pub steps: usize,
    /// Building the graph.
    pub build: Duration,
    /// Splitting, assigning and allocating it (the scheduler).
    pub schedule: Duration,
    /// Writing the inputs (tokens, positions, mask).
    pub inputs: Duration,
    /// Computing.
    pub compute: Duration,
    /// Reading the logits back.
    pub readback: Duration,
    /// Compute time per op kind `(name, time, nodes)` when profiling, largest first.
    pub ops: Vec<(String, Duration, usize)>,
}

/// One generation's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generation {
    /// New tokens, in order; ends with the end-of-generation token when one was produced.
    pub tokens: Vec<u32>,
    /// Time to process the prompt.
    pub prompt_time: Duration,
    /// Time to generate the new tokens after the first.
    pub gen_time: Duration,
}

/// A llama-architecture model ready to decode.
///
/// ```no_run
/// use llm::{Llama, LlamaOptions, Sampler, Sampling};
/// let file = llm::open_gguf(&llm::find_model(None)?)?;
/// let mut model = Llama::new(&file, LlamaOptions { threads: 2, n_ctx: 512, ..Default::default() })?;
/// let mut sampler = Sampler::new(Sampling::Greedy);
/// let out = model.generate(&[19556, 905], 8, &mut sampler, &[0, 2, 4], |_, _| {})?;
/// assert!(out.tokens.len() <= 8);
/// # Ok::<(), llm::LlmError>(())
/// ```
pub struct Llama {
    hp: Hparams,
    ctx: Context,
    weights: LlamaWeights,
    cache: KvCache,
    after_model: Checkpoint,
    sched: Scheduler,
    graph: Graph,
    n_ubatch: usize,
    // Reused per step so a decode step does not allocate.
    ids: Vec<u8>,
    pos: Vec<u8>,
    mask: Vec<f32>,
    mask_bytes: Vec<u8>,
    logits_bytes: Vec<u8>,
    logits: Vec<f32>,
    timings: StepTimings,
    profile: Option<sched::OpTimer>,
    _weight_buffers: Vec<Buffer>,
    // Declared last: embedded servers stop after every connection to them is dropped.
    _servers: Vec<backend_rpc_server::ServerHandle>,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("hp", &self.hp)
            .field("cache", &self.cache)
            .field("sched", &self.sched)
            .finish_non_exhaustive()
    }
}

impl Llama {
    /// Reads the hyperparameters, creates and places the weights, creates the KV cache and
    /// the backends, and reserves compute memory for the worst-case step.
    pub fn new(file: &dyn ModelFile, opts: LlamaOptions) -> Result<Self> {
        let t0 = Instant::now();
        let hp = Hparams::from_metadata(file)?;
        if opts.n_ubatch == 0 {
            return Err(LlmError::InvalidOption(
                "n_ubatch must be at least 1".into(),
            ));
        }
        crate::kv_cache::check_pad(opts.kv_pad)?;
        let n_layer = hp.n_layer;
        let offload = if !opts.rpc.is_empty() && opts.offload == 0 {
            n_layer.div_ceil(2)
        } else {
            opts.offload
        };
        if offload > n_layer {
            return Err(LlmError::InvalidOption(format!(
                "--offload {offload} but the model has {n_layer} blocks"
            )));
        }
        let mut ctx = Context::new();
        let weights = LlamaWeights::create(&mut ctx, &hp, file)?;

        backend_cpu::register();
        let threads = if opts.threads == 0 {
            backend_cpu::default_n_threads()
        } else {
            opts.threads
        };
        let cpu_device = backend_cpu::cpu_device();
        let cpu = cpu_device.init_backend(&format!("n_threads={threads}"))?;
        let first = n_layer - offload;
        let offloaded = weights.layer_tensors(first..n_layer)?;
        let extra = WeightBufferTypes::new(&cpu_device, opts.extra_buffer_types);
        let selected = weights.select_extra_buffer_types(&mut ctx, &extra, &offloaded)?;
        let mut buffers = Vec::new();
        let mut not_mapped = offloaded.clone();
        for buft in extra.types() {
            let ids: Vec<TensorId> = selected
                .iter()
                .filter(|(_, b)| b == buft)
                .map(|(id, _)| *id)
                .collect();
            if ids.is_empty() {
                continue;
            }
            let buf = weights.place_copied(&mut ctx, file, buft, &ids)?;
            tracing::info!(
                buffer_type = buft.name(),
                tensors = ids.len(),
                bytes = buf.size(),
                "weights copied into an extra buffer type of the CPU"
            );
            not_mapped.extend(ids);
            buffers.push(buf);
        }
        let file_buffer = LlamaWeights::file_buffer(file, &cpu_device)?;
        let mapped = weights.place_in_file_buffer(&mut ctx, file, &file_buffer, &not_mapped)?;
        buffers.push(file_buffer);
        let mut backends: Vec<Backend> = Vec::new();
        let mut layer_bufts: Vec<BufferType> = vec![cpu_device.buffer_type(); n_layer];
        let mut servers = Vec::new();
        if !opts.rpc.is_empty() {
            let config = backend_rpc::RpcConfig::default();
            let (devices, handles) =
                backend_rpc_server::connect_all(&opts.rpc, &cpu_device, threads, &config)
                    .map_err(|e| LlmError::Backend(format!("rpc {e}")))?;
            servers = handles;
            for (i, (endpoint, device)) in devices.iter().enumerate() {
                let run = share(offload, devices.len(), i);
                if run.is_empty() {
                    continue;
                }
                let layers = first + run.start..first + run.end;
                let ids = weights.layer_tensors(layers.clone())?;
                let backend = device.init_backend("")?;
                let buft = device.buffer_type();
                let buf = weights.place_copied(&mut ctx, file, &buft, &ids)?;
                tracing::info!(endpoint = %endpoint, device = device.name(), layers = ?layers,
                    bytes = buf.size(), "blocks copied to the remote device");
                for l in layers {
                    layer_bufts[l] = buft.clone();
                }
                buffers.push(buf);
                backends.push(backend);
            }
        } else if offload > 0 {
            let device = test_device::register()?;
            let backend = device.init_backend("")?;
            let buft = device.buffer_type();
            let buf = weights.place_copied(&mut ctx, file, &buft, &offloaded)?;
            tracing::info!(
                device = device.name(),
                blocks = offload,
                bytes = buf.size(),
                "last blocks copied to the device"
            );
            for b in &mut layer_bufts[first..] {
                *b = buft.clone();
            }
            buffers.push(buf);
            backends.push(backend);
        }
        backends.push(cpu);
        let mut cache = KvCache::new(&mut ctx, &hp, opts.n_ctx, &layer_bufts)?;
        cache.set_pad(opts.kv_pad)?;
        let after_model = ctx.checkpoint();
        let cap = graph_capacity(n_layer);
        let sched = Scheduler::builder(backends).graph_size(2 * cap).build()?;
        let mut m = Llama {
            n_ubatch: opts.n_ubatch.min(opts.n_ctx),
            hp,
            ctx,
            weights,
            cache,
            after_model,
            sched,
            graph: Graph::new(cap),
            ids: Vec::new(),
            pos: Vec::new(),
            mask: Vec::new(),
            mask_bytes: Vec::new(),
            logits_bytes: Vec::new(),
            logits: Vec::new(),
            timings: StepTimings::default(),
            profile: None,
            _weight_buffers: buffers,
            _servers: servers,
        };
        m.reserve()?;
        if opts.profile {
            m.enable_profile();
        }
        tracing::info!(mapped_bytes = mapped, threads, n_ctx = opts.n_ctx,
            elapsed = ?t0.elapsed(), "model loaded (other weights used in place from the mapped file)");
        Ok(m)
    }

    /// Drops the last step's graph tensors and builds the graph of a step of `shape`.
    fn build(&mut self, shape: StepShape) -> Result<StepTensors> {
        self.ctx.rewind(self.after_model);
        build_step(
            &mut self.ctx,
            &mut self.graph,
            &self.hp,
            &self.weights,
            &self.cache,
            shape,
        )
    }

    /// Plans compute memory once for the largest step: a full micro-batch over every cell.
    fn reserve(&mut self) -> Result<()> {
        let shape = StepShape {
            n_tokens: self.n_ubatch,
            kv_head: 0,
            n_kv: self.cache.size(),
        };
        self.build(shape)?;
        self.sched.reserve(&mut self.ctx, &self.graph)?;
        let n = self.n_ubatch;
        self.ids.reserve(n * 4);
        self.pos.reserve(n * 4);
        self.mask.reserve(n * self.cache.size());
        self.mask_bytes.reserve(n * self.cache.size() * 4);
        self.logits_bytes.resize(self.hp.n_vocab * 4, 0);
        self.logits.resize(self.hp.n_vocab, 0.0);
        for i in 0..self.sched.n_backends() {
            tracing::info!(
                backend = i,
                bytes = self.sched.buffer_size(i).unwrap_or(0),
                "compute buffer reserved"
            );
        }
        Ok(())
    }

    fn enable_profile(&mut self) {
        self.profile = Some(sched::OpTimer::install(&mut self.sched, op_name));
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.hp
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Forgets every token in the cache.
    pub fn clear(&mut self) {
        self.cache.clear();
    }

    /// Step timings since the last call.
    pub fn take_timings(&mut self) -> StepTimings {
        let mut t = std::mem::take(&mut self.timings);
        if let Some(p) = &self.profile {
            t.ops = p.take();
        }
        t
    }

    /// Appends `tokens` to the cache in micro-batches and returns the logits after the last
    /// one. On error the cache holds what it held before the failing micro-batch.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.hp.n_vocab) {
            return Err(LlmError::BadToken {
                id,
                n_vocab: self.hp.n_vocab,
            });
        }
        self.cache.check_room(tokens.len())?;
        for chunk in tokens.chunks(self.n_ubatch) {
            self.step(chunk)?;
        }
        Ok(&self.logits)
    }

    /// The logits of the last evaluated position.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn step(&mut self, tokens: &[u32]) -> Result<()> {
        let t0 = Instant::now();
        let n = tokens.len();
        let shape = StepShape {
            n_tokens: n,
            kv_head: self.cache.used(),
            n_kv: self.cache.n_kv(n),
        };
        let t = self.build(shape)?;
        let t1 = Instant::now();
        self.sched.reset();
        self.sched.alloc_graph(&mut self.ctx, &self.graph)?;
        let t2 = Instant::now();
        // Byte I/O into buffers kept across steps, not `tensor_set_slice` / `tensor_get_vec`:
        // those allocate their staging (and result) vector on every call, and a decode step
        // allocates nothing once warm (`tests/no_alloc.rs`).
        self.ids.clear();
        self.ids
            .extend(tokens.iter().flat_map(|&x| (x as i32).to_le_bytes()));
        self.pos.clear();
        self.pos
            .extend((0..n).flat_map(|i| ((shape.kv_head + i) as i32).to_le_bytes()));
        fill_mask(&mut self.mask, shape.kv_head, n, shape.n_kv);
        self.mask_bytes.clear();
        self.mask_bytes
            .extend(self.mask.iter().flat_map(|x| x.to_le_bytes()));
        tensor_set(&self.ctx, t.tokens, 0, &self.ids)?;
        tensor_set(&self.ctx, t.positions, 0, &self.pos)?;
        tensor_set(&self.ctx, t.mask, 0, &self.mask_bytes)?;
        let t3 = Instant::now();
        self.sched.graph_compute(&mut self.ctx, &self.graph)?;
        let t4 = Instant::now();
        tensor_get(&self.ctx, t.logits, 0, &mut self.logits_bytes)?;
        for (l, b) in self
            .logits
            .iter_mut()
            .zip(self.logits_bytes.chunks_exact(4))
        {
            *l = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        let t5 = Instant::now();
        self.cache.commit(n);
        let tm = &mut self.timings;
        tm.steps += 1;
        tm.build += t1 - t0;
        tm.schedule += t2 - t1;
        tm.inputs += t3 - t2;
        tm.compute += t4 - t3;
        tm.readback += t5 - t4;
        Ok(())
    }

    /// Greedy or sampled continuation of `prompt` from an empty cache: up to `n_new` tokens,
    /// stopping after a token in `stop` (which is included). `on_token(token, logits)` sees
    /// each new token and the logits it was chosen from.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_new: usize,
        sampler: &mut Sampler,
        stop: &[u32],
        mut on_token: impl FnMut(u32, &[f32]),
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        let need = prompt.len().saturating_add(n_new.saturating_sub(1));
        if need > self.cache.size() {
            return Err(LlmError::ContextFull {
                used: 0,
                requested: need,
                n_ctx: self.cache.size(),
            });
        }
        self.cache.clear();
        let mut out = Generation::default();
        if n_new == 0 {
            return Ok(out);
        }
        let t0 = Instant::now();
        self.eval(prompt)?;
        out.prompt_time = t0.elapsed();
        let t1 = Instant::now();
        loop {
            let tok = sampler.sample(&self.logits);
            on_token(tok, &self.logits);
            out.tokens.push(tok);
            if stop.contains(&tok) || out.tokens.len() == n_new {
                break;
            }
            self.eval(&[tok])?;
        }
        out.gen_time = t1.elapsed();
        Ok(out)
    }

    /// The scheduler's plan of the next single-token step, in the `GGML_SCHED_DEBUG` layout.
    pub fn plan(&mut self, level: u32) -> Result<String> {
        self.plan_next_step()?;
        Ok(self.sched.layout(&self.ctx, &self.graph, level).to_string())
    }

    /// The scheduler's plan of the next single-token step as Graphviz DOT
    /// ([`sched::dot::write_dot`]: splits as clusters, tensors coloured by backend, weights and
    /// KV cache shaped apart), headed by `title`; render it with [`sched::dot::render`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let file = llm::open_gguf(&llm::find_model(None)?)?;
    /// let mut model = llm::Llama::new(&file, llm::LlamaOptions::default())?;
    /// let dot = model.plan_dot("SmolLM2 decode step")?;
    /// sched::dot::render(&dot, std::path::Path::new("plan.svg"))?;
    /// # Ok(()) }
    /// ```
    pub fn plan_dot(&mut self, title: &str) -> Result<String> {
        self.plan_next_step()?;
        let mut out = String::new();
        sched::dot::write_dot(&self.sched, &self.ctx, &self.graph, title, &mut out);
        Ok(out)
    }

    /// Build and place the graph of the next single-token step without computing it.
    fn plan_next_step(&mut self) -> Result<()> {
        let shape = StepShape {
            n_tokens: 1,
            kv_head: self.cache.used().min(self.cache.size() - 1),
            n_kv: self.cache.n_kv(1),
        };
        self.build(shape)?;
        self.sched.reset();
        self.sched.alloc_graph(&mut self.ctx, &self.graph)?;
        Ok(())
    }

    /// Install or remove the scheduler's trace sink ([`sched::trace`]): every later step
    /// reports its input copies, event waits and split computes to it, one track per backend
    /// ([`Llama::backend_names`]). Returns the sink replaced.
    pub fn set_trace_sink(
        &mut self,
        sink: Option<Box<dyn sched::trace::TraceSink>>,
    ) -> Option<Box<dyn sched::trace::TraceSink>> {
        self.sched.set_trace_sink(sink)
    }

    /// Names of the scheduler's backends, in its order (the tracks of a trace).
    pub fn backend_names(&self) -> Vec<String> {
        self.sched.backend_names()
    }

    /// Every weight's name in the file with the name of the buffer type it lives in
    /// (`"CPU_Mapped"`: in place in the file; `"CPU_REPACK"`: copied into the CPU's repacked
    /// layout; a device's buffer type when offloaded), in file order of the model's tensors.
    pub fn weight_buffer_types(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for (id, name) in self.weights.all() {
            let buf = backend_core::tensor_buffer(&self.ctx, id)?
                .ok_or_else(|| LlmError::Backend(format!("weight {name} has no buffer")))?;
            out.push((name.to_owned(), buf.buffer_type().name().to_owned()));
        }
        Ok(out)
    }

    /// Splits of the last planned graph.
    pub fn n_splits(&self) -> usize {
        self.sched.n_splits()
    }
}

/// The op's name, with the weight type for matrix products (`MUL_MAT(q4_1)`).
fn op_name(ctx: &Context, t: TensorId) -> String {
    let Ok(tensor) = ctx.get(t) else {
        return String::new();
    };
    match tensor.op() {
        Op::Unary(u) => format!("UNARY({u:?})"),
        Op::MulMat => {
            let ty = tensor.src(0).and_then(|s| ctx.get(s).ok()).map(|s| s.ty());
            format!("MUL_MAT({})", ty.map_or("?", |t| t.name()))
        }
        op => op.name().to_owned(),
    }
}

/// The range of the `n` offloaded blocks (counted from the first offloaded one) that remote
/// device `i` of `k` takes: contiguous runs, the first `n % k` devices one block more.
fn share(n: usize, k: usize, i: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / k, n % k);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn offloaded_blocks_are_shared_in_contiguous_runs() {
        assert_eq!(
            (0..2).map(|i| share(5, 2, i)).collect::<Vec<_>>(),
            [0..3, 3..5]
        );
        assert_eq!(
            (0..3).map(|i| share(2, 3, i)).collect::<Vec<_>>(),
            [0..1, 1..2, 2..2]
        );
    }
}
