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

#[test]
fn devices_registered_on_their_own_enumerate_in_registration_order() {
    let g = GlobalRegistry::default();
    let a = test_device("A0", false);
    let lone = test_device("Lone", false);
    let b = test_device("B0", false);
    assert!(g.register(reg("RegA", vec![a.clone()])));
    assert!(g.register_device(lone.clone()));
    assert!(g.register(reg("RegB", vec![b.clone()])));
    assert_eq!(g.devices(), vec![a.clone(), lone.clone(), b.clone()]);
    assert_eq!(g.device_count(), 3);
    assert_eq!(g.device_by_name("lone").unwrap(), lone);
    // a device on its own is no registry
    let names: Vec<String> = g.registries().iter().map(|r| r.name().to_owned()).collect();
    assert_eq!(names, ["RegA", "RegB"]);
    // idempotent by device name, whether the name came on its own or through a registry
    assert!(!g.register_device(lone.clone()));
    assert!(!g.register_device(test_device("A0", false)));
    assert_eq!(g.device_count(), 3);
    // a lone device of type GPU is found by type and initialised like any other
    assert_eq!(g.device_by_type(DeviceType::Gpu), Some(a));
    assert_eq!(g.init_by_name("Lone", "").unwrap().device(), lone);
}

#[test]
fn a_device_without_a_registry_says_so() {
    // `TestDevice` keeps the default `DeviceImpl::registry`
    let dev = test_device("Free", false);
    assert!(dev.registry().is_none());
    let g = GlobalRegistry::default();
    assert!(g.register_device(dev.clone()));
    assert!(g.devices()[0].registry().is_none());
}

#[test]
fn typed_proc_names_answer_only_their_type() {
    use std::any::Any;
    const DOUBLE: ProcName<fn(u32) -> u32> = ProcName::new("double");
    const DOUBLE_AS_U64: ProcName<fn(u64) -> u64> = ProcName::new("double");
    struct WithProc;
    impl RegistryImpl for WithProc {
        fn name(&self) -> &str {
            "proc"
        }
        fn devices(&self) -> Vec<Device> {
            Vec::new()
        }
        fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
            match name {
                n if DOUBLE == *n => DOUBLE.answer(|x| 2 * x),
                n if proc::GET_FEATURES == *n => proc::GET_FEATURES
                    .answer(|r| vec![BackendFeature::new("REG", r.name().to_owned())]),
                _ => None,
            }
        }
    }
    let r = Registry::new(WithProc);
    assert_eq!(r.proc_address(DOUBLE).unwrap()(21), 42);
    assert!(
        r.proc_address(DOUBLE_AS_U64).is_none(),
        "same name, other type"
    );
    assert!(r.proc_address(proc::SET_N_THREADS).is_none());
    assert_eq!(r.features(), vec![BackendFeature::new("REG", "proc")]);
    assert_eq!(r.features()[0].to_string(), "REG = proc");
    assert!(reg("plain", vec![]).features().is_empty());
    assert_eq!(format!("{DOUBLE:?}"), "ProcName(double)");
}
