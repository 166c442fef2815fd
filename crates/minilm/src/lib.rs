//! all-MiniLM-L6-v2 sentence embeddings computed through this workspace's graph, allocator,
//! scheduler and backends.
//!
//! Why this crate exists: it is the proof that the backend layer serves an inference engine.
//! It does what an engine does — maps a real weights file and uses it in place, builds a
//! compute graph per batch, lets the scheduler place each op on a backend (optionally moving
//! the last layers' weights to a second device — in process, or a remote one over ggml's RPC
//! protocol — so the graph really splits), allocates compute
//! memory, runs, and reads the output — and its results are checked against an independent
//! implementation (candle's BERT) in the tests.
//!
//! The pieces, in the order a run uses them:
//! - [`find_model_dir`] locates the model files (installed Python package, env var or flag);
//! - [`WeightFile`] maps `model.safetensors` and lists its tensors;
//! - [`Tokenizer`] turns sentences into a padded [`Batch`];
//! - [`BertWeights`] creates the weight tensors and places them (file buffer or device copy);
//! - [`build_graph`] builds the encoder and mean pooling for one batch;
//! - [`l2_normalize`] finishes the embedding on the host.

mod bert;
mod config;
mod engine;
mod error;
mod locate;
mod model;
#[cfg(feature = "candle")]
pub mod reference;
mod tokenize;
mod weights;

pub use bert::{BertGraph, GraphInputs, build_graph, cosine, graph_capacity, l2_normalize};
pub use config::{BertConfig, PoolingConfig, SentenceConfig};
pub use engine::{EMBEDDED, Embedder, EmbedderOptions, OpProfile};
pub use error::{INSTALL_HINT, MinilmError, Result};
pub use locate::{MODEL_DIR_ENV, PYTHON_PACKAGE, REQUIRED_FILES, find_model_dir, is_model_dir};
pub use model::{BertWeights, LayerWeights};
pub use tokenize::{Batch, Tokenizer};
pub use weights::{WeightFile, WeightInfo};
