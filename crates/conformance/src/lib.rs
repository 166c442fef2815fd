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
//! ```no_run
//! // In a backend crate's tests/conformance.rs:
//! # fn my_backend() -> backend_core::Backend { unimplemented!() }
//! # fn cpu_backend() -> backend_core::Backend { unimplemented!() }
//! #[test]
//! fn conformance() {
//!     let backend = my_backend();
//!     let cpu = cpu_backend();
//!     conformance::check_contract(&backend, Some(&cpu)).assert_passed();
//!     conformance::check_ops(&backend, &cpu, &conformance::OpOptions::default()).assert_passed();
//! }
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
