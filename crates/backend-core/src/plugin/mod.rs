//! Backends loaded at run time: a backend crate built as a `cdylib` exports one C-ABI entry
//! point ([`export_backend_plugin!`](crate::export_backend_plugin)), and
//! [`GlobalRegistry::load`](crate::GlobalRegistry::load) and its siblings open such libraries,
//! check them, and register their registries.
//!
//! # The boundary, and why it is shaped so
//!
//! Rust has no stable ABI: a trait object's vtable layout, a `Vec`'s fields, an enum's
//! discriminants may differ between two compilers or two versions of a crate. Passing
//! `Registry`, `Device` or `Backend` handles across a library boundary is therefore sound only
//! when both sides were built by the same compiler against the same crates (ggml has the same
//! constraint for its C++ types, and so keeps a C struct of function pointers at its
//! boundary). This module splits the boundary in two:
//!
//! 1. **A hand-written `#[repr(C)]` entry** ([`PluginEntry`]): the ABI version (always the
//!    first field, so any host can read it), a build fingerprint, the registry name, a score
//!    function and an init function. Everything in it is plain C data, readable whatever
//!    built the plugin.
//! 2. **Rust objects, only on an exact fingerprint match.** [`BUILD_FINGERPRINT`] names the
//!    entry ABI, this crate's version, a hash of this crate's sources (the trait layouts), the
//!    target, and the exact compiler (version, commit, LLVM). The host calls `init`, which
//!    hands over a [`Registry`](crate::Registry) trait object, only if the plugin's
//!    fingerprint equals its own; otherwise loading fails with
//!    [`PluginError::Fingerprint`]. It then compares [`type_identity`] (the `TypeId`s of the
//!    exchanged types) with its own: the same sources built with another resolution of the
//!    dependency graph (other features) are another compilation, refused with
//!    [`PluginError::TypeIdentity`]. A version mismatch, a missing symbol and a score of 0
//!    are refused before anything of the plugin but its entry, identity and score functions
//!    has run.
//!
//! Why not full C vtables (or `abi_stable`): every trait here (buffer types, buffers,
//! backends, devices, events) would need a C mirror, with graphs, tensors and errors
//! translated at each call; that is most of this crate again, and a second copy of every
//! contract to keep in step. What the checks cannot see: the global allocator. Build plugins
//! from the same workspace and `Cargo.lock` as the host, and keep both on the system
//! allocator (a counting wrapper over it is fine): memory allocated on one side is freed on
//! the other.
//!
//! # Lifetime
//!
//! The library stays loaded while any handle from it lives: the registry, its devices, their
//! buffer types, and every buffer, backend and event made from them are host-side wrappers
//! that hold the library and delegate. [`GlobalRegistry::unload`](crate::GlobalRegistry::unload)
//! refuses ([`PluginError::Busy`]) while any such handle is held outside the registry;
//! otherwise it removes the registry and drops every object of the plugin (its memory is
//! freed, its threads joined by its own drops).
//!
//! The plugin's *code* is never unmapped once any of its Rust code has run. Rust code
//! registers destructors for its thread-locals on each thread it runs on (the plugin carries
//! its own `std`, `tracing`, `parking_lot`), and the C runtime calls them when that thread
//! exits, which may be long after an unload; with the library closed, that call jumps into
//! unmapped memory (a test reproduces the segfault). `dlclose` is therefore never called for
//! such a library; one refused before its Rust code ran (no entry point, another ABI version
//! or fingerprint) is closed. Loading the same file again after an unload maps nothing new
//! and runs its init afresh.
//!
//! Answers of [`Registry::extension`](crate::Registry::extension) and graph plans are not
//! wrapped, so `unload` does not count them: use them only while holding the registry or the
//! backend they came from.
//!
//! Downcasting a plugin's handle to its concrete type (`as_any`) does not reach the plugin's
//! types: the host sees its wrappers, and a separately built crate's types are not the host's
//! anyway. Backend-specific entry points go through [`Registry::extension`](crate::Registry::extension).

mod abi;
mod load;
#[cfg(test)]
mod tests;
mod wrap;

use std::path::PathBuf;

use crate::error::BackendError;

#[doc(hidden)]
pub use abi::{__call_init, __call_score};
pub use abi::{
    BUILD_FINGERPRINT, InitSlot, PLUGIN_ABI_VERSION, PLUGIN_ENTRY_SYMBOL, PluginEntry, PluginStr,
    type_identity,
};
pub use load::search_dirs_from;

#[cfg(test)]
pub(crate) use load::install_in_process;
pub(crate) use load::{LoadedPlugin, Probe, candidates, install, probe};

/// The environment variable listing plugin directories (a path list, like `PATH`), searched
/// before the executable's directory.
pub const PLUGIN_PATH_ENV: &str = "BACKEND_PLUGIN_PATH";

/// Why a plugin could not be loaded or unloaded. Every load failure names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The file could not be opened as a shared library.
    #[error("{}: cannot open as a library: {reason}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library is not a backend plugin (no entry point, or a malformed one).
    #[error("{}: not a backend plugin: {reason}", path.display())]
    NotAPlugin {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// The plugin's entry has another layout version.
    #[error("{}: plugin ABI version {found}, this host reads version {expected}", path.display())]
    AbiVersion {
        /// The file.
        path: PathBuf,
        /// The plugin's version.
        found: u32,
        /// [`PLUGIN_ABI_VERSION`].
        expected: u32,
    },
    /// The plugin was built by another compiler or against another `backend-core`: handing
    /// over Rust objects would be unsound.
    #[error("{}: plugin build fingerprint differs from the host's\n  plugin: {found}\n  host:   {expected}", path.display())]
    Fingerprint {
        /// The file.
        path: PathBuf,
        /// The plugin's fingerprint.
        found: String,
        /// [`BUILD_FINGERPRINT`].
        expected: String,
    },
    /// The plugin was built from the same sources by the same compiler, but its dependency graph
    /// was resolved otherwise (other features of a shared dependency): its `backend-core` and
    /// `graph` types are not the host's ([`type_identity`] differs).
    #[error(
        "{}: plugin built against another compilation of backend-core and graph (other \
         dependency features or versions: build it in the host's workspace with the host's \
         features)",
        path.display()
    )]
    TypeIdentity {
        /// The file.
        path: PathBuf,
    },
    /// The plugin scores 0: it cannot run on this machine.
    #[error("{}: backend {name} cannot run on this machine (score 0)", path.display())]
    CannotRun {
        /// The file.
        path: PathBuf,
        /// Its registry name.
        name: String,
    },
    /// A registry of that name is already registered.
    #[error("{}: a registry named {name} is already registered", path.display())]
    AlreadyLoaded {
        /// The file.
        path: PathBuf,
        /// The registry name.
        name: String,
    },
    /// The plugin's init failed.
    #[error("{}: plugin init failed: {source}", path.display())]
    Init {
        /// The file.
        path: PathBuf,
        /// The plugin's error.
        source: BackendError,
    },
    /// `load_best` found no candidate that can run here.
    #[error("no loadable plugin for backend {name} in {dirs:?} ({tried} candidate files)")]
    NoCandidate {
        /// The backend name.
        name: String,
        /// The directories searched.
        dirs: Vec<PathBuf>,
        /// How many files matched the name.
        tried: usize,
    },
    /// No plugin of that name is loaded.
    #[error("no plugin named {name} is loaded")]
    NotLoaded {
        /// The registry name.
        name: String,
    },
    /// Handles from the plugin are still held; it stays loaded and registered.
    #[error("{}: plugin {name} is in use (handles from it are still held)", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
        /// The registry name.
        name: String,
    },
}

impl PluginError {
    /// The file the error is about, if any.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            PluginError::Open { path, .. }
            | PluginError::NotAPlugin { path, .. }
            | PluginError::AbiVersion { path, .. }
            | PluginError::Fingerprint { path, .. }
            | PluginError::TypeIdentity { path }
            | PluginError::CannotRun { path, .. }
            | PluginError::AlreadyLoaded { path, .. }
            | PluginError::Init { path, .. }
            | PluginError::Busy { path, .. } => Some(path),
            PluginError::NoCandidate { .. } | PluginError::NotLoaded { .. } => None,
        }
    }
}

/// What [`GlobalRegistry::load_all`](crate::GlobalRegistry::load_all) did.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Registries loaded, in search order.
    pub loaded: Vec<crate::Registry>,
    /// Files that matched the plugin name pattern but did not load.
    pub failed: Vec<PluginError>,
}
