//! The conformance kit: what a backend crate runs from its own tests to show it honours the
//! backend contract and computes what the reference (CPU) backend computes — the role of
//! ggml's `test-backend-ops`.
//!
//! Two entry points:
//! * [`check_contract`]: buffer types, buffers, tensors, async operations and events, checked
//!   against values the checks compute themselves ([`Report`]).
//! * [`check_ops`]: every op over generated shapes (contiguous, permuted, broadcast) and
//!   types, computed node by node on the backend and on a reference backend through
//!   [`graph_copy::compare_graph_backends_with`], with NMSE thresholds per op and type, exact
//!   NaN/Inf agreement, and guard bytes around every tensor to catch out-of-bounds writes
//!   ([`OpReport`], with a per-op summary of supported and unsupported ops). In
//!   [`Mode::Perf`] each passing case is also timed (GFLOP/s or GB/s).
//!
//! Why a library and not a binary: a backend crate calls the kit from its own `#[test]`s,
//! against its own backend, with its own reference, so `cargo test` in that crate is the
//! conformance run.
//!
//! ```
//! // In a backend crate, this is the body of a test in tests/conformance.rs; the backend
//! // under test here is the test device, the reference is the CPU backend.
//! use test_device::{TestDevice, TestDeviceConfig};
//!
//! let backend = TestDevice::create(TestDeviceConfig::named("MINE"))?.init_backend("")?;
//! let cpu = backend_cpu::init()?;
//! conformance::check_contract(&backend, Some(&cpu)).assert_passed();
//! let opts = conformance::OpOptions { filter: Some("SOFT_MAX".into()), ..Default::default() };
//! conformance::check_ops(&backend, &cpu, &opts).assert_passed();
//! # Ok::<(), backend_core::BackendError>(())
//! ```

mod contract;
mod ops;
mod report;
mod values;

pub use contract::check_contract;
pub use ops::{
    CaseOutcome, CaseResult, Mode, OpOptions, OpReport, check_ops, place_graph,
    threshold as nmse_threshold,
};
pub use report::{Check, Outcome, Report};

/// The code blocks of the workspace's `README.md` and `docs/*.md`, and the scheduler's
/// `two_backends` example, compiled and run as this crate's doctests so that the guides cannot
/// drift from the API. This crate hosts them because its (dev-)dependencies cover every crate the snippets use. Blocks that are not Rust
/// carry another language (`text`, `sh`, `toml`) and are not compiled.
#[cfg(doctest)]
mod workspace_docs {
    #[doc = include_str!("../../../README.md")]
    struct Readme;
    #[doc = include_str!("../../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../../docs/writing-a-backend.md")]
    struct WritingABackend;
    #[doc = include_str!("../../../docs/benchmarks.md")]
    struct Benchmarks;
    /// The engine example of `docs/writing-a-backend.md`, run as a doctest: `cargo xtask ci`
    /// builds examples but does not run them, and this one checks its own result.
    #[doc = concat!("```rust\n", include_str!("../../sched/examples/two_backends.rs"), "```")]
    struct TwoBackendsExample;
}
