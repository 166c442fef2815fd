//! What `backend_core` itself does with events: the device check on record, and the
//! "unsupported" defaults of devices and backends without events, against a small in-test
//! device.
//!
//! The ordering contract (an event completes at the recorded point and no later, waits order
//! another stream without blocking the caller) is a backend's to keep, so it is tested where
//! a real backend makes ordering observable: the test device, whose streams can be paused
//! (`crates/test-device/tests/device.rs`).

mod common;

use backend_core::*;
use common::*;
use graph::{GraphView, TensorId};

fn compute(b: &Backend) {
    let ctx = graph::Context::new();
    let nodes: [TensorId; 0] = [];
    b.graph_compute_async(&ctx, GraphView::new(&nodes, &nodes))
        .unwrap();
}

#[test]
fn event_of_another_device_is_refused_and_nothing_changes() {
    let dev_a = test_device("A", true);
    let dev_b = test_device("B", true);
    let b = dev_b.init_backend("").unwrap();
    let ev = dev_a.event_new().unwrap();
    compute(&b);
    let err = b.event_record(&ev).unwrap_err();
    assert_eq!(
        err,
        BackendError::EventDeviceMismatch {
            event_device: "A".into(),
            backend: "B".into(),
            backend_device: "B".into(),
        }
    );
    let recorded = ev
        .implementation()
        .as_any()
        .downcast_ref::<TestEvent>()
        .unwrap()
        .recorded
        .lock()
        .unwrap()
        .is_some();
    assert!(!recorded, "a refused record leaves the event untouched");
    assert_eq!(TestBackend::of(&b).queued(), 1);
    let r = ev.check_device(&b);
    assert!(
        matches!(r, Err(BackendError::EventDeviceMismatch { .. })),
        "{r:?}"
    );
    let a = dev_a.init_backend("").unwrap();
    assert!(ev.check_device(&a).is_ok());
}

#[test]
fn devices_without_events_say_unsupported() {
    let dev = test_device("plain", false);
    assert!(!dev.caps().events);
    assert!(matches!(
        dev.event_new(),
        Err(BackendError::Unsupported { what: "events", .. })
    ));
}

#[test]
fn backends_without_event_support_say_unsupported() {
    // A backend that keeps the default event methods.
    struct Bare(Device);
    impl BackendImpl for Bare {
        fn name(&self) -> &str {
            "bare"
        }
        fn guid(&self) -> Guid {
            [0; 16]
        }
        fn device(&self) -> Device {
            self.0.clone()
        }
        fn graph_compute(&self, _: &graph::Context, _: GraphView<'_>) -> Result<ComputeStatus> {
            Ok(ComputeStatus::Success)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    let dev = test_device("A", true);
    let bare = Backend::new(Bare(dev.clone()));
    let ev = dev.event_new().unwrap();
    assert!(matches!(
        bare.event_record(&ev),
        Err(BackendError::Unsupported { .. })
    ));
    assert!(matches!(
        bare.event_wait(&ev),
        Err(BackendError::Unsupported { .. })
    ));
    // plans default to unsupported too
    let ctx = graph::Context::new();
    let nodes: [TensorId; 0] = [];
    assert!(matches!(
        bare.graph_plan_create(&ctx, GraphView::new(&nodes, &nodes)),
        Err(BackendError::Unsupported {
            what: "graph plans",
            ..
        })
    ));
}

#[test]
fn events_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Event>();
    assert_send_sync::<Backend>();
    assert_send_sync::<Device>();
    assert_send_sync::<Buffer>();
    assert_send_sync::<BufferType>();
    assert_send_sync::<Registry>();
    assert_send_sync::<HostMemory>();
}
