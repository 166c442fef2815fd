//! The embedding engine: weights placed once, then per batch build → schedule → compute → read.
//!
//! Why the scheduler even on one backend: it is what an engine uses, and it both assigns and
//! allocates compute memory (through the graph allocator), so the single-CPU path exercises
//! the same code as the split one. With `offload > 0` the last layers' weights are copied to
//! the in-process test device (memory that is not host memory), so the scheduler cuts the
//! graph into splits on two backends and inserts the copies between them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend_core::{Backend, Buffer, tensor_get, tensor_set};
use graph::{Checkpoint, Context, Op, TensorId};
use sched::Scheduler;

use crate::bert::{BertGraph, GraphInputs, build_graph, graph_capacity, l2_normalize};
use crate::config::{BertConfig, PoolingConfig, SentenceConfig};
use crate::error::{MinilmError, Result};
use crate::locate::find_model_dir;
use crate::model::BertWeights;
use crate::tokenize::{Batch, Tokenizer};
use crate::weights::WeightFile;

/// How to set up an [`Embedder`].
#[derive(Clone, Debug, Default)]
pub struct EmbedderOptions {
    /// Model directory; `None` looks it up ([`find_model_dir`]).
    pub model_dir: Option<PathBuf>,
    /// CPU threads; 0 = the machine's available parallelism.
    pub threads: usize,
    /// Place the weights of the last `offload` layers on the test device.
    pub offload: usize,
    /// Sentences per batch; 0 = all sentences in one batch.
    pub batch_size: usize,
    /// Record per-op compute times (through the scheduler's eval callback, which computes node
    /// by node, so total time rises a little).
    pub profile: bool,
}

/// Compute time per op kind, from [`Embedder::take_profile`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpProfile {
    /// `(op name, total time, nodes computed)`, largest time first.
    pub ops: Vec<(String, Duration, usize)>,
}

#[derive(Default)]
struct ProfileState {
    started: Option<Instant>,
    per_op: BTreeMap<String, (Duration, usize)>,
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
    profile: Option<Arc<Mutex<ProfileState>>>,
    // Buffers holding the weights; the mapped file lives as long as its buffer.
    _weight_buffers: Vec<Buffer>,
    _file: WeightFile,
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
        if opts.offload > cfg.num_hidden_layers {
            return Err(MinilmError::Unsupported(format!(
                "--offload {} but the model has {} layers",
                opts.offload, cfg.num_hidden_layers
            )));
        }

        let mut ctx = Context::new();
        let weights = BertWeights::create(&mut ctx, &file, &cfg)?;
        let offloaded = weights.last_layers(opts.offload);

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
        if opts.offload > 0 {
            let device = test_device::register()?;
            let backend = device.init_backend("")?;
            let buf = weights.place_copied(&mut ctx, &file, &device.buffer_type(), &offloaded)?;
            tracing::info!(
                device = device.name(),
                layers = opts.offload,
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
        let sched = Scheduler::new(backends, None, 2 * graph_capacity(&cfg), false)
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
        };
        if e.opts.profile {
            e.enable_profile();
        }
        Ok(e)
    }

    fn enable_profile(&mut self) {
        let state = Arc::new(Mutex::new(ProfileState::default()));
        let s = Arc::clone(&state);
        self.sched.set_eval_callback(Some(Box::new(
            move |ctx: &Context, t: TensorId, ask: bool| {
                let mut st = s.lock().unwrap_or_else(|e| e.into_inner());
                if ask {
                    st.started = Some(Instant::now());
                    true
                } else {
                    let dt = st.started.take().map(|s| s.elapsed()).unwrap_or_default();
                    let name = ctx.get(t).map(|t| op_name(t.op())).unwrap_or_default();
                    let e = st.per_op.entry(name).or_default();
                    e.0 += dt;
                    e.1 += 1;
                    true
                }
            },
        )));
        self.profile = Some(state);
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
        let Some(p) = &self.profile else {
            return OpProfile::default();
        };
        let mut st = p.lock().unwrap_or_else(|e| e.into_inner());
        let mut ops: Vec<_> = std::mem::take(&mut st.per_op)
            .into_iter()
            .map(|(k, (d, n))| (k, d, n))
            .collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.1));
        OpProfile { ops }
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
        tensor_set(ctx, g.ids, 0, &le_bytes(&inp.ids, i32::to_le_bytes))?;
        tensor_set(
            ctx,
            g.type_ids,
            0,
            &le_bytes(&inp.type_ids, i32::to_le_bytes),
        )?;
        tensor_set(
            ctx,
            g.positions,
            0,
            &le_bytes(&inp.positions, i32::to_le_bytes),
        )?;
        tensor_set(ctx, g.mask, 0, &le_bytes(&inp.mask, f32::to_le_bytes))?;
        tensor_set(ctx, g.pool, 0, &le_bytes(&inp.pool, f32::to_le_bytes))?;
        self.sched
            .graph_compute(&mut self.ctx, &g.graph)
            .map_err(|e| MinilmError::Backend(e.to_string()))?;
        let t2 = Instant::now();
        let h = self.cfg.hidden_size;
        let mut bytes = vec![0u8; h * batch.n_batch() * 4];
        tensor_get(&self.ctx, g.output, 0, &mut bytes)?;
        let mut v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
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
        let mut out = String::new();
        self.sched
            .write_layout(&self.ctx, &g.graph, level, &mut out);
        Ok(out)
    }

    /// Splits of the last planned graph.
    pub fn n_splits(&self) -> usize {
        self.sched.n_splits()
    }
}

fn le_bytes<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}
