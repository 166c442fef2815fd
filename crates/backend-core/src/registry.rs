//! Registries: how backend crates announce their devices, and the global registry engines
//! enumerate.
//!
//! There is no central list of backends: each backend crate registers its [`Registry`] (for
//! example from its own `register()` function) and the global registry only keeps what it is
//! given. Registration is thread-safe and idempotent by registry name.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::backend::Backend;
use crate::device::{Device, DeviceType};
use crate::error::{BackendError, Result};

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
/// use backend_core::GlobalRegistry;
/// let global = GlobalRegistry::get();
/// assert!(global.registry("no such backend").is_none());
/// assert!(global.device_by_name("no such device").is_err());
/// ```
#[derive(Default)]
pub struct GlobalRegistry {
    regs: RwLock<Vec<Registry>>,
}

impl GlobalRegistry {
    /// The global registry.
    pub fn get() -> &'static GlobalRegistry {
        static G: OnceLock<GlobalRegistry> = OnceLock::new();
        G.get_or_init(GlobalRegistry::default)
    }

    /// Add `reg` unless one with the same name is there; returns whether it was added.
    pub fn register(&self, reg: Registry) -> bool {
        let mut regs = self.regs.write();
        if regs.iter().any(|r| r.name() == reg.name()) {
            return false;
        }
        tracing::debug!(registry = reg.name(), "registered backend registry");
        regs.push(reg);
        true
    }

    /// Every registry, in registration order.
    pub fn registries(&self) -> Vec<Registry> {
        self.regs.read().clone()
    }

    /// The registry named `name` (case-insensitive).
    pub fn registry(&self, name: &str) -> Option<Registry> {
        self.regs
            .read()
            .iter()
            .find(|r| r.name().eq_ignore_ascii_case(name))
            .cloned()
    }

    /// The registry named `name` (case-insensitive), or [`BackendError::NotFound`].
    pub fn find_registry(&self, name: &str) -> Result<Registry> {
        self.registry(name)
            .ok_or_else(|| BackendError::not_found("registry", name))
    }

    /// Number of devices over all registries (`ggml_backend_dev_count`).
    pub fn device_count(&self) -> usize {
        self.regs.read().iter().map(|r| r.devices().len()).sum()
    }

    /// Every device of every registry, in registration order.
    pub fn devices(&self) -> Vec<Device> {
        self.regs.read().iter().flat_map(|r| r.devices()).collect()
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
