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
//!
//! Registries can also come from shared libraries opened at run time
//! ([`GlobalRegistry::load`], [`GlobalRegistry::load_best`], [`GlobalRegistry::load_all`],
//! [`GlobalRegistry::unload`]); [`crate::plugin`] says what crosses that boundary and why.

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use crate::backend::Backend;
use crate::device::{Device, DeviceType};
use crate::error::{BackendError, Result};
use crate::plugin::{self as plugin, LoadReport, LoadedPlugin, PluginError};
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
    /// Plugins loaded from shared libraries. Locked before `entries` when both are.
    plugins: Mutex<Vec<LoadedPlugin>>,
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

/// Loading backends from shared libraries ([`crate::plugin`]).
impl GlobalRegistry {
    /// The directories [`GlobalRegistry::load_all`] and [`GlobalRegistry::load_best`] search:
    /// those listed in [`plugin::PLUGIN_PATH_ENV`] (a path list), then the executable's.
    pub fn plugin_search_dirs() -> Vec<PathBuf> {
        let exe = std::env::current_exe().ok();
        plugin::search_dirs_from(
            std::env::var_os(plugin::PLUGIN_PATH_ENV).as_deref(),
            exe.as_deref(),
        )
    }

    /// Load the backend plugin at `path` and register its registry, which is returned.
    ///
    /// Refused with a [`PluginError`] naming the file: a file that is no library or exports
    /// no entry point, another entry ABI version, another build fingerprint (compiler or
    /// `backend-core`), a score of 0, a name already registered, a failing init. Nothing is
    /// registered then (see [`crate::plugin`] for when the library is closed again).
    ///
    /// ```no_run
    /// use backend_core::GlobalRegistry;
    /// let reg = GlobalRegistry::get().load("target/debug/libbackend_demo.so")?;
    /// for dev in reg.devices() {
    ///     println!("{}: {}", dev.name(), dev.description());
    /// }
    /// # Ok::<(), backend_core::plugin::PluginError>(())
    /// ```
    pub fn load(&self, path: impl AsRef<Path>) -> std::result::Result<Registry, PluginError> {
        let probe = plugin::probe(path.as_ref())?;
        self.install(probe)
    }

    /// Register an already wrapped plugin (the bookkeeping tests, which need no library).
    #[cfg(test)]
    pub(crate) fn install_loaded(&self, loaded: LoadedPlugin) {
        let mut plugins = self.plugins.lock();
        assert!(self.register(loaded.handle()));
        plugins.push(loaded);
    }

    fn install(&self, probe: plugin::Probe) -> std::result::Result<Registry, PluginError> {
        let mut plugins = self.plugins.lock();
        if self.registry(&probe.name).is_some() {
            return Err(PluginError::AlreadyLoaded {
                path: probe.path,
                name: probe.name,
            });
        }
        let loaded = plugin::install(probe)?;
        let reg = loaded.handle();
        if !self.register(reg.clone()) {
            // The init made a registry of another name that is taken.
            return Err(PluginError::AlreadyLoaded {
                path: loaded.path.clone(),
                name: reg.name().to_owned(),
            });
        }
        tracing::info!(registry = reg.name(), path = %loaded.path.display(), "loaded backend plugin");
        plugins.push(loaded);
        Ok(reg)
    }

    /// [`GlobalRegistry::load_best_from`] over [`GlobalRegistry::plugin_search_dirs`].
    pub fn load_best(&self, name: &str) -> std::result::Result<Registry, PluginError> {
        self.load_best_from(name, &Self::plugin_search_dirs())
    }

    /// Load the variant of backend `name` that runs best here: of the files
    /// `{DLL_PREFIX}backend_{name}{DLL_SUFFIX}` and `{DLL_PREFIX}backend_{name}_{variant}{DLL_SUFFIX}`
    /// in `dirs` (`-` may stand for `_`), each one's score is read and the highest wins (the
    /// first found among equals); a score of 0 means "cannot run here". Candidates that fail
    /// their checks are logged and skipped; [`PluginError::NoCandidate`] when none can run.
    ///
    /// ```no_run
    /// use backend_core::GlobalRegistry;
    /// // libbackend_cpu_portable.so scores 1, libbackend_cpu_avx2.so 2 where AVX2 runs
    /// let dirs = vec![std::path::PathBuf::from("/opt/my-app/backends")];
    /// let cpu = GlobalRegistry::get().load_best_from("cpu", &dirs)?;
    /// # Ok::<(), backend_core::plugin::PluginError>(())
    /// ```
    pub fn load_best_from(
        &self,
        name: &str,
        dirs: &[PathBuf],
    ) -> std::result::Result<Registry, PluginError> {
        let files = plugin::candidates(dirs, Some(name));
        let tried = files.len();
        let mut best: Option<plugin::Probe> = None;
        for f in files {
            match plugin::probe(&f) {
                Ok(p) if !p.name.eq_ignore_ascii_case(name) => {
                    tracing::warn!(path = %f.display(), registry = p.name, "plugin file name and registry name differ; skipped");
                }
                Ok(p) => {
                    tracing::debug!(path = %f.display(), score = p.score, "plugin candidate");
                    if p.score > 0 && best.as_ref().is_none_or(|b| p.score > b.score) {
                        best = Some(p);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "plugin candidate skipped"),
            }
        }
        match best {
            Some(p) => self.install(p),
            None => Err(PluginError::NoCandidate {
                name: name.to_owned(),
                dirs: dirs.to_vec(),
                tried,
            }),
        }
    }

    /// [`GlobalRegistry::load_all_from`] over [`GlobalRegistry::plugin_search_dirs`].
    pub fn load_all(&self) -> LoadReport {
        self.load_all_from(&Self::plugin_search_dirs())
    }

    /// Load every backend found in `dirs` (files `{DLL_PREFIX}backend_*{DLL_SUFFIX}`): of the
    /// files that name the same registry, the best-scoring variant, as
    /// [`GlobalRegistry::load_best_from`] picks it. Registries already registered are left
    /// alone (reported as [`PluginError::AlreadyLoaded`]); files that fail their checks are
    /// reported, not fatal.
    ///
    /// ```no_run
    /// use backend_core::GlobalRegistry;
    /// let report = GlobalRegistry::get().load_all(); // BACKEND_PLUGIN_PATH, then beside the exe
    /// for e in &report.failed {
    ///     eprintln!("skipped: {e}"); // each names its file
    /// }
    /// let names: Vec<_> = report.loaded.iter().map(|r| r.name().to_owned()).collect();
    /// ```
    pub fn load_all_from(&self, dirs: &[PathBuf]) -> LoadReport {
        let mut report = LoadReport::default();
        let mut best: Vec<plugin::Probe> = Vec::new();
        let mut cannot_run: Vec<PluginError> = Vec::new();
        for f in plugin::candidates(dirs, None) {
            match plugin::probe(&f) {
                Ok(p) if p.score == 0 => cannot_run.push(PluginError::CannotRun {
                    path: p.path,
                    name: p.name,
                }),
                Ok(p) => match best
                    .iter_mut()
                    .find(|b| b.name.eq_ignore_ascii_case(&p.name))
                {
                    Some(b) if p.score > b.score => *b = p,
                    Some(_) => {}
                    None => best.push(p),
                },
                Err(e) => report.failed.push(e),
            }
        }
        // A variant that cannot run is only a failure when no other variant of its name can.
        report.failed.extend(cannot_run.into_iter().filter(|e| {
            !matches!(e, PluginError::CannotRun { name, .. }
                if best.iter().any(|b| b.name.eq_ignore_ascii_case(name)))
        }));
        for p in best {
            match self.install(p) {
                Ok(r) => report.loaded.push(r),
                Err(e) => report.failed.push(e),
            }
        }
        report
    }

    /// The plugins loaded now: registry name and file.
    pub fn loaded_plugins(&self) -> Vec<(String, PathBuf)> {
        self.plugins
            .lock()
            .iter()
            .map(|p| (p.handle().name().to_owned(), p.path.clone()))
            .collect()
    }

    /// Unregister the plugin whose registry is named `name` (case-insensitive) and drop every
    /// object of it (its code stays mapped: see [`crate::plugin`]). [`PluginError::Busy`] while any handle from it (its registry, a device, a
    /// buffer type, buffer, backend or event) is held anywhere but in this registry: then
    /// nothing changes. [`PluginError::NotLoaded`] if no plugin has that name.
    ///
    /// ```no_run
    /// use backend_core::{GlobalRegistry, plugin::PluginError};
    /// let global = GlobalRegistry::get();
    /// let reg = global.load("plugins/libbackend_mine.so")?;
    /// let backend = reg.devices()[0].init_backend("")?;
    /// assert!(matches!(global.unload("mine"), Err(PluginError::Busy { .. })));
    /// drop((reg, backend));
    /// global.unload("mine")?; // unregistered, its objects dropped
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unload(&self, name: &str) -> std::result::Result<(), PluginError> {
        let mut plugins = self.plugins.lock();
        let i = plugins
            .iter()
            .position(|p| p.handle().name().eq_ignore_ascii_case(name))
            .ok_or_else(|| PluginError::NotLoaded {
                name: name.to_owned(),
            })?;
        let mut entries = self.entries.write();
        // Owners of the registry wrapper: the record and the global entry.
        if plugins[i].registry.busy(2) {
            return Err(PluginError::Busy {
                path: plugins[i].path.clone(),
                name: name.to_owned(),
            });
        }
        let rec = plugins.remove(i);
        let handle = rec.handle();
        let mut removed = Vec::new();
        entries.retain(|e| match e {
            Entry::Registry(r) if *r == handle => {
                removed.push(e.clone());
                false
            }
            _ => true,
        });
        drop(entries);
        drop(plugins);
        tracing::info!(registry = handle.name(), path = %rec.path.display(), "unloading backend plugin");
        // Dropped here, outside the locks: the plugin's objects (its threads joined by their
        // own drops), then the library.
        drop(removed);
        drop(handle);
        drop(rec);
        Ok(())
    }
}
