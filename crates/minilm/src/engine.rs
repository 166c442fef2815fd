//! The embedding engine: weights placed once, then per batch build → schedule → compute → read.
//!
//! Why the scheduler even on one backend: it is what an engine uses, and it both assigns and
//! allocates compute memory (through the graph allocator), so the single-CPU path exercises
//! the same code as the split one. With `offload > 0` the last layers' weights are copied to
//! the in-process test device (memory that is not host memory), so the scheduler cuts the
//! graph into splits on two backends and inserts the copies between them.
//!
//! With remote devices (`rpc`), the offloaded layers go to them instead: each endpoint is a
//! server speaking ggml's RPC protocol (ggml's `rpc-server` or ours), or `embedded`, our own
//! server started in this process on a loopback port, so a real network split can be shown
//! without setting anything up. Several remote devices share the offloaded layers in
//! contiguous runs, earlier devices taking earlier layers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use backend_core::{Backend, Buffer, tensor_get_vec, tensor_set_slice};
use graph::{Checkpoint, Context, Op, TensorId};
use sched::Scheduler;

use crate::bert::{BertGraph, GraphInputs, build_graph, graph_capacity, l2_normalize};
use crate::config::{BertConfig, PoolingConfig, SentenceConfig};
use crate::error::{MinilmError, Result};
use crate::locate::find_model_dir;
use crate::model::{BertWeights, LayerWeights};
use crate::tokenize::{Batch, Tokenizer};
use crate::weights::WeightFile;

/// How to set up an [`Embedder`].
#[derive(Clone, Debug, Default)]
pub struct EmbedderOptions {
    /// Model directory; `None` looks it up ([`find_model_dir`]).
    pub model_dir: Option<PathBuf>,
    /// CPU threads; 0 = the machine's available parallelism.
    pub threads: usize,
    /// Place the weights of the last `offload` layers on the test device, or on the remote
    /// devices when `rpc` names any (there `0` means half the layers, rounded up).
    pub offload: usize,
    /// Remote devices: `HOST:PORT` of servers speaking ggml's RPC protocol 7.0.0, or
    /// [`EMBEDDED`] for our own server started in-process on a loopback port.
    pub rpc: Vec<String>,
    /// Sentences per batch; 0 = all sentences in one batch.
    pub batch_size: usize,
    /// Record per-op compute times (through the scheduler's eval callback, which computes node
    /// by node, so total time rises a little).
    pub profile: bool,
}

pub use backend_rpc_server::EMBEDDED;

/// Compute time per op kind, from [`Embedder::take_profile`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpProfile {
    /// `(op name, total time, nodes computed)`, largest time first.
    pub ops: Vec<(String, Duration, usize)>,
}

fn op_name(op: Op) -> String {
    match op {
        Op::Unary(u) => format!("UNARY({u:?})"),
        op => op.name().to_owned(),
    }
}

/// all-MiniLM-L6-v2 through the workspace's backends.
///
/// ```no_run
/// use minilm::{Embedder, EmbedderOptions};
/// let mut e = Embedder::new(EmbedderOptions { threads: 2, ..Default::default() })?;
/// let v = e.embed(&["A man is playing guitar", "Someone plays an instrument"])?;
/// assert_eq!(v[0].len(), 384);
/// println!("cosine = {}", minilm::cosine(&v[0], &v[1]));
/// # Ok::<(), minilm::MinilmError>(())
/// ```
pub struct Embedder {
    cfg: BertConfig,
    tokenizer: Tokenizer,
    ctx: Context,
    weights: BertWeights,
    after_weights: Checkpoint,
    sched: Scheduler,
    opts: EmbedderOptions,
    profile: Option<sched::OpTimer>,
    // Buffers holding the weights; the mapped file lives as long as its buffer.
    _weight_buffers: Vec<Buffer>,
    _file: WeightFile,
    // Embedded RPC servers: declared last so they stop after every connection to them is
    // dropped (the scheduler's backends and the weight buffers above).
    _servers: Vec<backend_rpc_server::ServerHandle>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("opts", &self.opts)
            .field("sched", &self.sched)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Finds and maps the model, creates the backends and places the weights.
    pub fn new(opts: EmbedderOptions) -> Result<Self> {
        let t0 = Instant::now();
        let dir = find_model_dir(opts.model_dir.as_deref())?;
        let cfg = BertConfig::from_file(&dir.join("config.json"))?;
        PoolingConfig::from_file(&dir.join("1_Pooling").join("config.json"), cfg.hidden_size)?;
        let max_len = SentenceConfig::from_file(
            &dir.join("sentence_bert_config.json"),
            cfg.max_position_embeddings,
        )?
        .max_seq_length
        .min(cfg.max_position_embeddings);
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"), max_len)?;
        let file = WeightFile::open(&dir.join("model.safetensors"))?;
        let n_layers = cfg.num_hidden_layers;
        let offload = if !opts.rpc.is_empty() && opts.offload == 0 {
            n_layers.div_ceil(2)
        } else {
            opts.offload
        };
        if offload > n_layers {
            return Err(MinilmError::Unsupported(format!(
                "--offload {offload} but the model has {n_layers} layers"
            )));
        }

        let mut ctx = Context::new();
        let weights = BertWeights::create(&mut ctx, &file, &cfg)?;
        let offloaded = weights.last_layers(offload);

        backend_cpu::register();
        let threads = if opts.threads == 0 {
            backend_cpu::default_n_threads()
        } else {
            opts.threads
        };
        let cpu_device = backend_cpu::cpu_device();
        let cpu = cpu_device.init_backend(&format!("n_threads={threads}"))?;

        let file_buffer = BertWeights::file_buffer(&file, &cpu_device)?;
        let mapped = weights.place_in_file_buffer(&mut ctx, &file, &file_buffer, &offloaded)?;
        let mut buffers = vec![file_buffer];
        let mut backends: Vec<Backend> = Vec::new();
        let mut servers = Vec::new();
        if !opts.rpc.is_empty() {
            let config = backend_rpc::RpcConfig::default();
            let (devices, handles) =
                backend_rpc_server::connect_all(&opts.rpc, &cpu_device, threads, &config)
                    .map_err(|e| MinilmError::Backend(format!("rpc {e}")))?;
            servers = handles;
            // Contiguous runs of the offloaded layers, earlier devices taking earlier layers.
            let first = n_layers - offload;
            for (i, (endpoint, device)) in devices.iter().enumerate() {
                let layers = share(offload, devices.len(), i);
                if layers.is_empty() {
                    continue;
                }
                let ids: Vec<TensorId> = weights.layers[first + layers.start..first + layers.end]
                    .iter()
                    .flat_map(LayerWeights::all)
                    .collect();
                let backend = device.init_backend("")?;
                let buf = weights.place_copied(&mut ctx, &file, &device.buffer_type(), &ids)?;
                tracing::info!(
                    endpoint = %endpoint,
                    device = device.name(),
                    layers = ?((first + layers.start)..(first + layers.end)),
                    bytes = buf.size(),
                    "weights of these layers copied to the remote device"
                );
                buffers.push(buf);
                backends.push(backend);
            }
        } else if offload > 0 {
            let device = test_device::register()?;
            let backend = device.init_backend("")?;
            let buf = weights.place_copied(&mut ctx, &file, &device.buffer_type(), &offloaded)?;
            tracing::info!(
                device = device.name(),
                layers = offload,
                bytes = buf.size(),
                "weights of the last layers copied to the device"
            );
            buffers.push(buf);
            backends.push(backend);
        }
        backends.push(cpu);
        tracing::info!(
            dir = %dir.display(),
            mapped_bytes = mapped,
            threads,
            elapsed = ?t0.elapsed(),
            "model loaded (weights used in place from the mapped file)"
        );

        let after_weights = ctx.checkpoint();
        let sched = Scheduler::builder(backends)
            .graph_size(2 * graph_capacity(&cfg))
            .build()
            .map_err(|e| MinilmError::Backend(e.to_string()))?;
        let mut e = Embedder {
            cfg,
            tokenizer,
            ctx,
            weights,
            after_weights,
            sched,
            profile: None,
            opts,
            _weight_buffers: buffers,
            _file: file,
            _servers: servers,
        };
        if e.opts.profile {
            e.enable_profile();
        }
        Ok(e)
    }

    fn enable_profile(&mut self) {
        self.profile = Some(sched::OpTimer::install(&mut self.sched, |ctx, t| {
            ctx.get(t).map(|t| op_name(t.op())).unwrap_or_default()
        }));
    }

    /// The model's configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Per-op compute times since the last call (empty unless `profile` was set).
    pub fn take_profile(&mut self) -> OpProfile {
        OpProfile {
            ops: self
                .profile
                .as_ref()
                .map(sched::OpTimer::take)
                .unwrap_or_default(),
        }
    }

    /// Unit-length embeddings of `sentences`, in order, computed in batches of
    /// `batch_size`.
    pub fn embed<S: AsRef<str>>(&mut self, sentences: &[S]) -> Result<Vec<Vec<f32>>> {
        if sentences.is_empty() {
            return Err(MinilmError::NoInput);
        }
        let bs = if self.opts.batch_size == 0 {
            sentences.len()
        } else {
            self.opts.batch_size
        };
        let mut out = Vec::with_capacity(sentences.len());
        for (i, chunk) in sentences.chunks(bs).enumerate() {
            let t = Instant::now();
            let batch = self.tokenizer.batch(chunk)?;
            tracing::debug!(
                batch = i,
                sentences = chunk.len(),
                tokens = batch.n_tokens,
                "tokenised"
            );
            out.extend(self.embed_batch(&batch)?);
            tracing::info!(
                batch = i,
                sentences = chunk.len(),
                padded_tokens = batch.n_tokens,
                elapsed = ?t.elapsed(),
                "batch embedded"
            );
        }
        Ok(out)
    }

    /// Builds this batch's graph and lets the scheduler split and allocate it.
    fn prepare(&mut self, batch: &Batch) -> Result<BertGraph> {
        self.ctx.rewind(self.after_weights);
        let g = build_graph(
            &mut self.ctx,
            &self.weights,
            &self.cfg,
            batch.n_tokens,
            batch.n_batch(),
        )?;
        self.sched.reset();
        self.sched
            .alloc_graph(&mut self.ctx, &g.graph)
            .map_err(|e| MinilmError::Backend(e.to_string()))?;
        Ok(g)
    }

    /// Unit-length embeddings of one tokenised batch.
    pub fn embed_batch(&mut self, batch: &Batch) -> Result<Vec<Vec<f32>>> {
        if batch.n_batch() == 0 {
            return Err(MinilmError::NoInput);
        }
        let t0 = Instant::now();
        let g = self.prepare(batch)?;
        let t1 = Instant::now();
        let inp = GraphInputs::new(batch);
        let ctx = &self.ctx;
        // Typed writes: each checks the tensor's element type and length first.
        tensor_set_slice(ctx, g.ids, &inp.ids)?;
        tensor_set_slice(ctx, g.type_ids, &inp.type_ids)?;
        tensor_set_slice(ctx, g.positions, &inp.positions)?;
        tensor_set_slice(ctx, g.mask, &inp.mask)?;
        tensor_set_slice(ctx, g.pool, &inp.pool)?;
        self.sched
            .graph_compute(&mut self.ctx, &g.graph)
            .map_err(|e| MinilmError::Backend(e.to_string()))?;
        let t2 = Instant::now();
        let h = self.cfg.hidden_size;
        let mut v = tensor_get_vec::<f32>(&self.ctx, g.output)?;
        l2_normalize(&mut v, h);
        tracing::debug!(
            nodes = g.graph.n_nodes(),
            splits = self.sched.n_splits(),
            plan = ?(t1 - t0),
            compute = ?(t2 - t1),
            "graph computed"
        );
        Ok(v.chunks_exact(h).map(<[f32]>::to_vec).collect())
    }

    /// The scheduler's split plan for a batch of `sentences`, in the `GGML_SCHED_DEBUG`
    /// layout (`level` 1: splits; 2: also every node).
    pub fn plan<S: AsRef<str>>(&mut self, sentences: &[S], level: u32) -> Result<String> {
        let batch = self.tokenizer.batch(sentences)?;
        let g = self.prepare(&batch)?;
        Ok(self.sched.layout(&self.ctx, &g.graph, level).to_string())
    }

    /// The scheduler's plan for a batch of `sentences` as Graphviz DOT
    /// ([`sched::dot::write_dot`]), headed by `title`; render it with [`sched::dot::render`].
    pub fn plan_dot<S: AsRef<str>>(&mut self, sentences: &[S], title: &str) -> Result<String> {
        let batch = self.tokenizer.batch(sentences)?;
        let g = self.prepare(&batch)?;
        let mut out = String::new();
        sched::dot::write_dot(&self.sched, &self.ctx, &g.graph, title, &mut out);
        Ok(out)
    }

    /// Install or remove the scheduler's trace sink ([`sched::trace`]): every later compute
    /// reports its input copies, waits and split computes to it. Returns the sink replaced.
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

    /// Splits of the last planned graph.
    pub fn n_splits(&self) -> usize {
        self.sched.n_splits()
    }
}

/// The range of the `n` offloaded layers (counted from the first offloaded one) that remote
/// device `i` of `k` takes: contiguous runs, the first `n % k` devices one layer more.
fn share(n: usize, k: usize, i: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / k, n % k);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn offloaded_layers_are_shared_in_contiguous_runs() {
        // 5 layers over 2 devices: 3 then 2; over 3 devices: 2, 2, 1.
        assert_eq!(
            (0..2).map(|i| share(5, 2, i)).collect::<Vec<_>>(),
            [0..3, 3..5]
        );
        assert_eq!(
            (0..3).map(|i| share(5, 3, i)).collect::<Vec<_>>(),
            [0..2, 2..4, 4..5]
        );
        // More devices than layers: the last ones get nothing.
        assert_eq!(
            (0..3).map(|i| share(2, 3, i)).collect::<Vec<_>>(),
            [0..1, 1..2, 2..2]
        );
        assert_eq!(share(6, 1, 0), 0..6);
    }
}
