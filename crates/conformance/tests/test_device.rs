//! The kit run against the test device, as CI does.

use test_device::{TestDevice, TestDeviceConfig};

#[test]
fn test_device_honours_the_contract() {
    let dev = TestDevice::create(
        TestDeviceConfig::named("KIT")
            .alignment(256)
            .max_buffer_size(64 << 20),
    )
    .unwrap();
    let backend = dev.init_backend("").unwrap();
    let report = conformance::check_contract(&backend, None);
    report.assert_passed();
    // Everything that applies to a device without a host backend ran.
    let skipped: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| matches!(c.outcome, conformance::Outcome::Skipped(_)))
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        skipped
            .iter()
            .all(|n| n.contains("host") || n.contains("compute")),
        "{skipped:?}"
    );
}

#[test]
fn a_device_restricted_to_some_ops_lists_the_rest_as_unsupported() {
    let reference = TestDevice::create(TestDeviceConfig::named("REF")).unwrap();
    let dev = TestDevice::create(TestDeviceConfig::named("NONE").supported_ops([])).unwrap();
    let opts = conformance::OpOptions {
        filter: Some("SQR".into()),
        ..Default::default()
    };
    let report = conformance::check_ops(
        &dev.init_backend("").unwrap(),
        &reference.init_backend("").unwrap(),
        &opts,
    );
    assert!(report.passed());
    assert!(!report.cases.is_empty());
    for c in &report.cases {
        assert!(c.op.starts_with("SQR"), "{}", c.op);
        // the reference computes SQR, the restricted device does not
        assert_eq!(c.outcome, conformance::CaseOutcome::Unsupported, "{report}");
    }
    assert!(report.unsupported_ops().contains(&"SQR"), "{report}");
    assert!(report.to_string().contains("not supported"), "{report}");
}

/// A backend that forgets to record events: the kit must notice.
struct ForgetfulEvents(backend_core::Backend);

impl backend_core::BackendImpl for ForgetfulEvents {
    fn name(&self) -> &str {
        "FORGETFUL"
    }
    fn guid(&self) -> backend_core::Guid {
        [7; 16]
    }
    fn device(&self) -> backend_core::Device {
        self.0.device()
    }
    fn set_tensor_async(
        &self,
        ctx: &graph::Context,
        t: graph::TensorId,
        offset: usize,
        data: &[u8],
    ) -> backend_core::Result<()> {
        self.0.tensor_set_async(ctx, t, offset, data)
    }
    fn synchronize(&self) -> backend_core::Result<()> {
        self.0.synchronize()
    }
    fn graph_compute(
        &self,
        ctx: &graph::Context,
        g: graph::GraphView<'_>,
    ) -> backend_core::Result<backend_core::ComputeStatus> {
        self.0.graph_compute_async(ctx, g)
    }
    fn event_record(&self, _event: &backend_core::Event) -> backend_core::Result<()> {
        Ok(()) // the bug: nothing is recorded, so Event::synchronize returns at once
    }
    fn event_wait(&self, event: &backend_core::Event) -> backend_core::Result<()> {
        self.0.event_wait(event)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn the_kit_catches_a_backend_whose_events_do_not_order_work() {
    let dev = TestDevice::create(
        TestDeviceConfig::named("SLOW").transfer_latency(std::time::Duration::from_millis(200)),
    )
    .unwrap();
    let broken = backend_core::Backend::new(ForgetfulEvents(dev.init_backend("").unwrap()));
    let report = conformance::check_contract(&broken, None);
    let failed: Vec<&str> = report.failed().map(|c| c.name.as_str()).collect();
    // Which event check trips first depends on scheduling (the checks race the slow stream on
    // purpose), so require that the kit flags the events, not one particular check.
    assert!(failed.iter().any(|n| n.starts_with("events/")), "{report}");
}
