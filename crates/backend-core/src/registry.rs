//! Registries: how backend crates announce their devices, and the global registry engines
//! enumerate.
//!
//! There is no central list of backends: each backend crate registers its [`Registry`] (for
//! example from its own `register()` function) and the global registry only keeps what it is
//! given. Registration is thread-safe and idempotent by registry name. A device can also be
//! registered on its own ([`GlobalRegistry::register_device`], ggml's
//! `ggml_backend_device_register`), for a crate that drives one device and has no registry of
//! its own; either way a device names the registry it belongs to, if any, through
//! [`Device::registry`].
//!
//! A registry's backend-specific entry points are looked up by name
//! ([`Registry::extension`], ggml's `get_proc_address`); [`Registry::proc_address`] does the same
//! with a [`ProcName`] that also fixes the answer's type (see [`crate::proc`]).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::backend::Backend;
use crate::device::{Device, DeviceType};
use crate::error::{BackendError, Result};
use crate::proc::{self, BackendFeature, ProcName};

/// What a backend crate implements once (`ggml_backend_reg_i`).
pub trait RegistryImpl: Send + Sync + 'static {
    /// Name of the backend family, e.g. `"CPU"`.
    fn name(&self) -> &str;
    /// Its devices.
    fn devices(&self) -> Vec<Device>;
    /// An extension point by name (`get_proc_address`): backend-specific functions or objects,
    /// downcast by the caller to the type the backend documents.
    fn extension(&self, _name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        None
    }
}

/// A handle to a backend family's registry.
#[derive(Clone)]
pub struct Registry(Arc<dyn RegistryImpl>);

impl Registry {
    /// Wrap an implementation. Create it once (e.g. in a `OnceLock`) and clone the handle:
    /// equality is identity.
    pub fn new(imp: impl RegistryImpl) -> Self {
        Registry(Arc::new(imp))
    }
    /// Wrap a shared implementation.
    pub fn from_arc(imp: Arc<dyn RegistryImpl>) -> Self {
        Registry(imp)
    }
    /// The implementation. Backend-specific entry points are reached through
    /// [`Registry::extension`] rather than downcasting.
    pub fn implementation(&self) -> &dyn RegistryImpl {
        &*self.0
    }
    /// Name.
    pub fn name(&self) -> &str {
        self.0.name()
    }
    /// Devices.
    pub fn devices(&self) -> Vec<Device> {
        self.0.devices()
    }
    /// An extension by name (`ggml_backend_reg_get_proc_address`); `None` if unknown.
    pub fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.0.extension(name)
    }
    /// An extension by name, downcast to the type the backend documents for it. `None` if the
    /// name is unknown or the type is not the documented one.
    ///
    /// ```
    /// # use backend_core::*;
    /// # use std::{any::Any, sync::Arc};
    /// struct Reg;
    /// impl RegistryImpl for Reg {
    ///     fn name(&self) -> &str { "demo" }
    ///     fn devices(&self) -> Vec<Device> { Vec::new() }
    ///     fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
    ///         let answer: fn() -> u32 = || 42;
    ///         (name == "answer").then(|| Arc::new(answer) as Arc<dyn Any + Send + Sync>)
    ///     }
    /// }
    /// let reg = Registry::new(Reg);
    /// let f = reg.extension_as::<fn() -> u32>("answer").unwrap();
    /// assert_eq!(f(), 42);
    /// assert!(reg.extension_as::<String>("answer").is_none());
    /// assert!(reg.extension("question").is_none());
    /// ```
    pub fn extension_as<T: Any + Send + Sync>(&self, name: &str) -> Option<Arc<T>> {
        self.0.extension(name)?.downcast::<T>().ok()
    }

    /// The answer to a typed proc-address name (`ggml_backend_reg_get_proc_address` with the
    /// cast `ggml-backend.h` declares for that name): `None` if the registry does not answer
    /// the name or answers it with another type.
    ///
    /// ```
    /// # use backend_core::*;
    /// # use std::{any::Any, sync::Arc};
    /// const ANSWER: ProcName<fn() -> u32> = ProcName::new("demo_answer");
    /// struct Reg;
    /// impl RegistryImpl for Reg {
    ///     fn name(&self) -> &str { "demo" }
    ///     fn devices(&self) -> Vec<Device> { Vec::new() }
    ///     fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
    ///         match name {
    ///             n if ANSWER == *n => ANSWER.answer(|| 42),
    ///             _ => None,
    ///         }
    ///     }
    /// }
    /// let reg = Registry::new(Reg);
    /// assert_eq!(reg.proc_address(ANSWER).unwrap()(), 42);
    /// assert!(reg.proc_address(proc::GET_FEATURES).is_none());
    /// assert!(reg.features().is_empty());
    /// ```
    pub fn proc_address<T: Any + Send + Sync>(&self, name: ProcName<T>) -> Option<Arc<T>> {
        self.extension_as::<T>(name.name())
    }

    /// The registry's feature list, through its [`proc::GET_FEATURES`] entry point (ggml's
    /// `ggml_backend_get_features`); empty when the registry has none.
    pub fn features(&self) -> Vec<BackendFeature> {
        self.proc_address(proc::GET_FEATURES)
            .map(|f| f(self))
            .unwrap_or_default()
    }
}

impl PartialEq for Registry {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Registry {}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registry({})", self.name())
    }
}

/// The process-wide set of registries.
///
/// ```
/// use backend_core::{BackendError, GlobalRegistry};
/// let global = GlobalRegistry::get();
/// assert!(global.registry("no such backend").is_none());
/// let r = global.device_by_name("no such device");
/// assert!(matches!(r, Err(BackendError::NotFound { what: "device", .. })), "{r:?}");
/// ```
#[derive(Default)]
pub struct GlobalRegistry {
    entries: RwLock<Vec<Entry>>,
}

/// One registration, kept in registration order so that devices enumerate in that order.
#[derive(Clone)]
enum Entry {
    Registry(Registry),
    /// A device registered on its own ([`GlobalRegistry::register_device`]).
    Device(Device),
}

impl Entry {
    fn devices(&self) -> Vec<Device> {
        match self {
            Entry::Registry(r) => r.devices(),
            Entry::Device(d) => vec![d.clone()],
        }
    }
}

impl GlobalRegistry {
    /// The global registry.
    pub fn get() -> &'static GlobalRegistry {
        static G: OnceLock<GlobalRegistry> = OnceLock::new();
        G.get_or_init(GlobalRegistry::default)
    }

    /// Add `reg` unless one with the same name is there; returns whether it was added.
    pub fn register(&self, reg: Registry) -> bool {
        let mut entries = self.entries.write();
        if entries
            .iter()
            .any(|e| matches!(e, Entry::Registry(r) if r.name() == reg.name()))
        {
            return false;
        }
        tracing::debug!(registry = reg.name(), "registered backend registry");
        entries.push(Entry::Registry(reg));
        true
    }

    /// Add one device on its own (ggml's `ggml_backend_device_register`), for a device whose
    /// crate has no registry to register; it enumerates after the devices registered before
    /// it. Returns whether it was added: a device of the same name already enumerated (on its
    /// own or through a registry) is not added again, so registration is idempotent.
    ///
    /// The device keeps answering [`Device::registry`] as its implementation says; registering
    /// it does not register that registry.
    ///
    /// ```
    /// use backend_core::GlobalRegistry;
    ///
    /// let global = GlobalRegistry::default(); // a private one; `GlobalRegistry::get()` in use
    /// let dev = backend_cpu::cpu_device();
    /// assert!(global.register_device(dev.clone()));
    /// assert!(!global.register_device(dev.clone()));
    /// assert_eq!(global.devices(), vec![dev.clone()]);
    /// assert_eq!(global.device_by_name("cpu")?, dev);
    /// assert!(global.registries().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_device(&self, device: Device) -> bool {
        let mut entries = self.entries.write();
        if entries
            .iter()
            .flat_map(Entry::devices)
            .any(|d| d.name() == device.name())
        {
            return false;
        }
        tracing::debug!(device = device.name(), "registered device");
        entries.push(Entry::Device(device));
        true
    }

    /// Every registry, in registration order.
    pub fn registries(&self) -> Vec<Registry> {
        self.entries
            .read()
            .iter()
            .filter_map(|e| match e {
                Entry::Registry(r) => Some(r.clone()),
                Entry::Device(_) => None,
            })
            .collect()
    }

    /// The registry named `name` (case-insensitive).
    pub fn registry(&self, name: &str) -> Option<Registry> {
        self.registries()
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(name))
    }

    /// The registry named `name` (case-insensitive), or [`BackendError::NotFound`].
    pub fn find_registry(&self, name: &str) -> Result<Registry> {
        self.registry(name)
            .ok_or_else(|| BackendError::not_found("registry", name))
    }

    /// Number of devices over all registries and devices registered on their own
    /// (`ggml_backend_dev_count`).
    pub fn device_count(&self) -> usize {
        self.entries.read().iter().map(|e| e.devices().len()).sum()
    }

    /// Every device of every registry and every device registered on its own, in
    /// registration order.
    pub fn devices(&self) -> Vec<Device> {
        self.entries
            .read()
            .iter()
            .flat_map(Entry::devices)
            .collect()
    }

    /// The device named `name` (case-insensitive).
    pub fn device_by_name(&self, name: &str) -> Result<Device> {
        self.devices()
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| BackendError::NotFound {
                what: "device",
                name: name.to_owned(),
            })
    }

    /// The first device of type `ty`.
    pub fn device_by_type(&self, ty: DeviceType) -> Option<Device> {
        self.devices().into_iter().find(|d| d.device_type() == ty)
    }

    /// A backend on the first device of type `ty` (`ggml_backend_init_by_type`).
    pub fn init_by_type(&self, ty: DeviceType, params: &str) -> Result<Backend> {
        let dev = self
            .device_by_type(ty)
            .ok_or_else(|| BackendError::NotFound {
                what: "device of type",
                name: format!("{ty:?}"),
            })?;
        dev.init_backend(params)
    }

    /// A backend on the device named `name`.
    pub fn init_by_name(&self, name: &str, params: &str) -> Result<Backend> {
        self.device_by_name(name)?.init_backend(params)
    }

    /// The best available backend, like ggml's `ggml_backend_init_best`: the first GPU that
    /// initialises, otherwise the first CPU. [`BackendError::NotFound`] when there is neither
    /// (nothing registered yet: call your backend crates' `register()` first).
    pub fn init_best(&self) -> Result<Backend> {
        self.init_best_of(&[DeviceType::Gpu, DeviceType::Cpu])
    }

    /// The first device, by the order of `preference` and then registration order, that
    /// initialises a backend with empty parameters. Failures of earlier candidates are logged
    /// and skipped; the last failure is returned when none works.
    pub fn init_best_of(&self, preference: &[DeviceType]) -> Result<Backend> {
        let devices = self.devices();
        let mut last = BackendError::not_found("device of type", format!("{preference:?}"));
        for &ty in preference {
            for dev in devices.iter().filter(|d| d.device_type() == ty) {
                match dev.init_backend("") {
                    Ok(b) => return Ok(b),
                    Err(e) => {
                        tracing::warn!(device = dev.name(), error = %e, "backend init failed");
                        last = e;
                    }
                }
            }
        }
        Err(last)
    }
}
