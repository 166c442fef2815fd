//! The global registry: lookups, typed errors for unknown names, idempotent and thread-safe
//! registration, "initialise the best backend".

mod common;

use std::sync::{Arc, Barrier};

use backend_core::*;
use common::*;

fn reg(name: &str, devices: Vec<Device>) -> Registry {
    Registry::new(TestRegistry {
        name: name.to_owned(),
        devices,
    })
}

#[test]
fn unknown_names_are_typed_errors() {
    let g = GlobalRegistry::default();
    assert!(g.registry("nope").is_none());
    assert_eq!(
        g.find_registry("nope").unwrap_err(),
        BackendError::NotFound {
            what: "registry",
            name: "nope".into()
        }
    );
    assert!(matches!(
        g.device_by_name("nope"),
        Err(BackendError::NotFound { what: "device", .. })
    ));
    assert!(matches!(
        g.init_by_name("nope", ""),
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(g.init_best(), Err(BackendError::NotFound { .. })));
    assert_eq!(g.device_count(), 0);
}

#[test]
fn lookups_by_name_and_type() {
    let g = GlobalRegistry::default();
    let a = test_device("GPU0", true);
    let b = test_device("GPU1", true);
    assert!(g.register(reg("Test", vec![a.clone(), b.clone()])));
    assert_eq!(g.device_count(), 2);
    assert_eq!(g.devices(), vec![a.clone(), b.clone()]);
    assert_eq!(g.device_by_name("gpu1").unwrap(), b);
    assert_eq!(g.device_by_type(DeviceType::Gpu), Some(a.clone()));
    assert_eq!(g.device_by_type(DeviceType::Cpu), None);
    assert_eq!(g.find_registry("test").unwrap().name(), "Test");
    let best = g.init_best().unwrap();
    assert_eq!(best.device(), a);
    // params go to the device; a bad one is a typed error
    assert!(matches!(
        g.init_by_name("GPU0", "threads=banana"),
        Err(BackendError::InvalidParams { .. })
    ));
    assert!(matches!(
        g.init_by_type(DeviceType::Accel, ""),
        Err(BackendError::NotFound { .. })
    ));
}

#[test]
fn registration_is_idempotent_and_thread_safe() {
    let g = Arc::new(GlobalRegistry::default());
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let g = g.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let r = reg("Same", vec![test_device("D", false)]);
                barrier.wait();
                g.register(r)
            })
        })
        .collect();
    let added = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|&a| a)
        .count();
    assert_eq!(added, 1, "exactly one registration wins");
    assert_eq!(g.registries().len(), 1);
    assert_eq!(g.device_count(), 1);
    // registering the same handle again is a no-op
    let first = g.registries()[0].clone();
    assert!(!g.register(first.clone()));
    assert_eq!(g.registries(), vec![first]);
}

#[test]
fn extensions_by_name() {
    use std::any::Any;
    struct WithExt;
    impl RegistryImpl for WithExt {
        fn name(&self) -> &str {
            "ext"
        }
        fn devices(&self) -> Vec<Device> {
            Vec::new()
        }
        fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
            let double: fn(u32) -> u32 = |x| 2 * x;
            (name == "double").then(|| Arc::new(double) as Arc<dyn Any + Send + Sync>)
        }
    }
    let r = Registry::new(WithExt);
    assert_eq!(r.extension_as::<fn(u32) -> u32>("double").unwrap()(21), 42);
    assert!(r.extension("triple").is_none());
    // the default is "no extensions"
    assert!(reg("plain", vec![]).extension("double").is_none());
}
