//! The kit run, as CI does, against the CPU backend (1 thread against N threads) and the
//! test device against the CPU backend. A failing case is a real disagreement between two
//! backends: the report printed on failure names the op, the shapes and the NMSE.

use backend_core::Backend;
use conformance::{CaseOutcome, OpOptions, OpReport};
use test_device::{TestDevice, TestDeviceConfig};

fn cpu(threads: usize) -> Backend {
    let b = backend_cpu::init().expect("cpu backend");
    backend_cpu::CpuBackend::from_backend(&b)
        .expect("a CPU backend")
        .set_n_threads(threads);
    b
}

/// Threads for the "N threads" side: at least 3, so work is really split even on a
/// two-core machine.
fn many() -> usize {
    backend_cpu::default_n_threads().max(3)
}

/// Every case either passed or is listed as unsupported by the backend under test; and the
/// supported set is not empty (a backend that supports nothing would pass vacuously).
fn assert_meaningful(report: &OpReport) {
    report.assert_passed();
    let passed = report
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, CaseOutcome::Passed { .. }))
        .count();
    assert!(passed > 50, "only {passed} cases passed:\n{report}");
}

#[test]
fn cpu_honours_the_contract() {
    let b = cpu(2);
    let host = cpu(1);
    let report = conformance::check_contract(&b, Some(&host));
    report.assert_passed();
}

#[test]
fn cpu_one_thread_matches_cpu_many_threads() {
    let one = cpu(1);
    let n = cpu(many());
    let report = conformance::check_ops(&one, &n, &OpOptions::default());
    assert_meaningful(&report);
    // Same kernels, same machine: every op the CPU has is supported on both sides.
    assert!(report.unsupported_ops().is_empty(), "{report}");
}

#[test]
fn test_device_honours_the_contract_with_a_host_backend() {
    let dev = TestDevice::create(TestDeviceConfig::named("KIT-HOST").alignment(256)).unwrap();
    let backend = dev.init_backend("").unwrap();
    let host = cpu(1);
    let report = conformance::check_contract(&backend, Some(&host));
    report.assert_passed();
}

#[test]
fn test_device_matches_the_cpu() {
    let dev = TestDevice::create(TestDeviceConfig::named("KIT-OPS")).unwrap();
    let backend = dev.init_backend("").unwrap();
    let report = conformance::check_ops(&backend, &cpu(many()), &OpOptions::default());
    assert_meaningful(&report);
    // The device runs the CPU kernels: it supports exactly what the CPU supports.
    assert!(report.unsupported_ops().is_empty(), "{report}");
}

#[test]
fn test_device_with_threads_and_latency_matches_the_cpu() {
    let dev = TestDevice::create(
        TestDeviceConfig::named("KIT-SLOW")
            .compute_threads(3)
            .default_latency(std::time::Duration::from_micros(200))
            .transfer_latency(std::time::Duration::from_micros(100)),
    )
    .unwrap();
    let backend = dev.init_backend("").unwrap();
    let opts = OpOptions {
        filter: Some("MUL_MAT".into()),
        ..Default::default()
    };
    let report = conformance::check_ops(&backend, &cpu(1), &opts);
    report.assert_passed();
    assert!(
        report
            .cases
            .iter()
            .any(|c| matches!(c.outcome, CaseOutcome::Passed { .. })),
        "{report}"
    );
}

/// The CPU backend with one wrong kernel: after each compute, the first element of every
/// SCALE result is zeroed. The kit must fail exactly the SCALE case.
struct WrongScale(Backend);

impl backend_core::BackendImpl for WrongScale {
    fn name(&self) -> &str {
        "WRONG-SCALE"
    }
    fn guid(&self) -> backend_core::Guid {
        [9; 16]
    }
    fn device(&self) -> backend_core::Device {
        self.0.device()
    }
    fn graph_compute(
        &self,
        ctx: &graph::Context,
        g: graph::GraphView<'_>,
    ) -> backend_core::Result<backend_core::ComputeStatus> {
        let status = self.0.graph_compute(ctx, g)?;
        for &n in g.nodes {
            if ctx[n].op() == graph::Op::Scale {
                backend_core::tensor_set(ctx, n, 0, &0f32.to_le_bytes())?;
            }
        }
        Ok(status)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn the_kit_catches_a_wrong_kernel() {
    let broken = Backend::new(WrongScale(cpu(1)));
    let report = conformance::check_ops(&broken, &cpu(1), &OpOptions::default());
    let failed: Vec<&str> = report.failed().map(|c| c.op.as_str()).collect();
    assert_eq!(failed, ["SCALE"], "{report}");
}
