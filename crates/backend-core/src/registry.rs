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
    /// Wrap an implementation.
    pub fn new(imp: impl RegistryImpl) -> Self {
        Registry(Arc::new(imp))
    }
    /// Name.
    pub fn name(&self) -> &str {
        self.0.name()
    }
    /// Devices.
    pub fn devices(&self) -> Vec<Device> {
        self.0.devices()
    }
    /// An extension by name.
    pub fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.0.extension(name)
    }
}

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

    /// The best available backend, like ggml's `ggml_backend_init_best`: a GPU if there is
    /// one, otherwise a CPU.
    pub fn init_best(&self) -> Result<Backend> {
        self.init_by_type(DeviceType::Gpu, "")
            .or_else(|_| self.init_by_type(DeviceType::Cpu, ""))
    }
}
