//! Scaffolding shared by the workspace's tests and benchmarks; never a dependency of a
//! library crate (only `[dev-dependencies]` and the benchmark crate name it).
//!
//! Why a crate of its own: the allocator's tests, its benchmark, the scheduler's tests,
//! snapshots and benchmarks all need the same fakes and generated graphs. Kept in those
//! libraries they were public API that users could mistake for part of the allocator or the
//! scheduler; kept in each test directory they would be copied.
//!
//! * [`FakeBufferType`] (module [`fake_buffer`]): buffers without bytes, with injected
//!   refusals and leak counters.
//! * [`LlamaModel`] (module [`llama_model`]): a llama-shaped decode graph built in a context.
//! * [`lifetimes`](lifetimes::lifetimes) and [`live_bytes_lower_bound`]: when each tensor
//!   needs its bytes, independently of any allocator; [`unplaced`]: what an allocator places.
//! * [`llama_file`]: a llama-shaped decode graph as a scheduler graph file, with placement
//!   across CPU and GPUs; [`in_context::build`] builds such a file's graph into a context
//!   with the weights in the caller's buffers (the scheduler's execution tests compute it).
//!
//! Why two llama generators: [`LlamaModel`] is the allocator's and the benchmark crate's
//! workload (one token, `cont_shape`, up before gate: the graph whose node count, buffer size
//! and timings against ggml `docs/benchmarks.md` records), while [`llama_file`] follows the
//! node order, names and layout of the shared fixtures' ggml-written llama graphs, which the
//! scheduler's snapshots and plans are read against. Merging them would change one of the
//! two references.
//!
//! ```
//! use test_fixtures::FakeBufferType;
//! let buft = FakeBufferType::new("host", 32).into_buffer_type();
//! let buffer = buft.alloc_buffer(1 << 40)?; // a terabyte, and no memory used
//! assert_eq!(buffer.size(), 1 << 40);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod fake_buffer;
pub mod in_context;
pub mod lifetimes;
pub mod llama_file;
pub mod llama_model;

pub use fake_buffer::{FakeBufferType, FakeMemoryStats};
pub use lifetimes::{Lifetime, lifetimes, live_bytes_lower_bound, unplaced};
pub use llama_model::{LlamaConfig, LlamaDecode, LlamaLayer, LlamaModel};
