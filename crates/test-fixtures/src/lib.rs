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
//!   needs its bytes, independently of any allocator.
//! * [`llama_file`]: a llama-shaped decode graph as a scheduler graph file, with placement
//!   across CPU and GPUs.
//!
//! ```
//! use test_fixtures::FakeBufferType;
//! let buft = FakeBufferType::new("host", 32).into_buffer_type();
//! let buffer = buft.alloc_buffer(1 << 40)?; // a terabyte, and no memory used
//! assert_eq!(buffer.size(), 1 << 40);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod fake_buffer;
pub mod lifetimes;
pub mod llama_file;
pub mod llama_model;

pub use fake_buffer::{FakeBufferType, FakeMemoryStats};
pub use lifetimes::{Lifetime, lifetimes, live_bytes_lower_bound};
pub use llama_model::{LlamaConfig, LlamaDecode, LlamaLayer, LlamaModel};
