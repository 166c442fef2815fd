//! Opening a library, checking its entry, and installing its registry.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::PluginError;
use super::abi::{
    BUILD_FINGERPRINT, InitSlot, PLUGIN_ABI_VERSION, PLUGIN_ENTRY_SYMBOL, PluginEntry,
    type_identity,
};
use super::wrap::{Anchor, PluginRegistry};
use crate::registry::Registry;

/// A library whose entry passed every check, with its score; nothing of it has run but its
/// entry and score functions.
pub(crate) struct Probe {
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    pub(crate) score: u32,
    init: unsafe extern "C" fn(*mut std::ffi::c_void),
    library: Arc<Mapped>,
}

/// A library whose Rust code has run (its score, its init, its objects): never closed.
///
/// Why: Rust code registers destructors for its thread-locals on every thread it runs on (the
/// plugin's own copy of `std`, `tracing`, `parking_lot` …), and the C runtime calls them when
/// that thread exits, long after an `unload`. Were the library unmapped by then, that call
/// would jump into nothing (observed: a segfault at the exit of the thread that unloaded a
/// plugin after computing with it). So dropping the last handle releases the plugin's objects
/// (its memory, its threads) but leaves its code mapped for the rest of the process; loading
/// the same file again maps nothing new. Libraries refused before any of their Rust code ran
/// (no entry, another ABI version or fingerprint) are closed.
pub(crate) struct Mapped {
    _library: std::mem::ManuallyDrop<libloading::Library>,
}

/// Open `path` and check its entry: symbol, ABI version, fingerprint. The score is read but
/// not judged (0 is the caller's decision).
pub(crate) fn probe(path: &Path) -> Result<Probe, PluginError> {
    let path_buf = path.to_path_buf();
    // SAFETY: opening a library runs its initialisers. A file is only opened on an explicit
    // request (`load`) or from the plugin search directories, whose contents the user
    // controls; what the library exports is checked below before any Rust object crosses.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| PluginError::Open {
        path: path_buf.clone(),
        reason: e.to_string(),
    })?;
    let entry_fn: extern "C" fn() -> *const PluginEntry = {
        // SAFETY: the symbol, if present, is the function `export_backend_plugin!` generates,
        // of exactly this type; a library that exports the name with another type violates
        // the plugin contract, which no loader can detect.
        let sym = unsafe {
            library.get::<extern "C" fn() -> *const PluginEntry>(
                format!("{PLUGIN_ENTRY_SYMBOL}\0").as_bytes(),
            )
        }
        .map_err(|e| PluginError::NotAPlugin {
            path: path_buf.clone(),
            reason: format!("no `{PLUGIN_ENTRY_SYMBOL}` symbol ({e})"),
        })?;
        *sym
    };
    let entry = entry_fn();
    if entry.is_null() {
        return Err(PluginError::NotAPlugin {
            path: path_buf,
            reason: "the entry point returned a null pointer".to_owned(),
        });
    }
    // SAFETY: every version of the entry starts with its version as a `u32`, and the pointer
    // is to static data of the library, which stays loaded while `library` lives.
    let abi_version = unsafe { entry.cast::<u32>().read() };
    if abi_version != PLUGIN_ABI_VERSION {
        return Err(PluginError::AbiVersion {
            path: path_buf,
            found: abi_version,
            expected: PLUGIN_ABI_VERSION,
        });
    }
    // SAFETY: the version matches, so the pointee is a `PluginEntry` of this layout, static in
    // the library, which outlives this borrow (`library` is held until the end of the probe).
    let entry = unsafe { &*entry };
    // SAFETY: the strings point at static text of the library, still loaded.
    let fingerprint = unsafe { entry.fingerprint.get() };
    if fingerprint != Some(BUILD_FINGERPRINT) {
        return Err(PluginError::Fingerprint {
            path: path_buf,
            found: fingerprint.unwrap_or("(not UTF-8)").to_owned(),
            expected: BUILD_FINGERPRINT.to_owned(),
        });
    }
    // SAFETY: as above.
    let name = unsafe { entry.name.get() }
        .ok_or_else(|| PluginError::NotAPlugin {
            path: path_buf.clone(),
            reason: "the registry name is not UTF-8".to_owned(),
        })?
        .to_owned();
    let (score_fn, init, identity_fn) = (entry.score, entry.init, entry.type_identity);
    // From here on the library's Rust code runs, so it is never closed (see `Mapped`).
    let library = Arc::new(Mapped {
        _library: std::mem::ManuallyDrop::new(library),
    });
    // Same compiler and sources; now the same compilation of the exchanged types.
    if identity_fn() != type_identity() {
        return Err(PluginError::TypeIdentity { path: path_buf });
    }
    // The fingerprint matched: same compiler and backend-core, so the generated functions
    // behave as `export_backend_plugin!` writes them (panics caught, no unwinding out).
    let score = score_fn();
    Ok(Probe {
        path: path_buf,
        name,
        score,
        init,
        library,
    })
}

/// A loaded plugin, as the global registry keeps it.
pub(crate) struct LoadedPlugin {
    pub(crate) path: PathBuf,
    pub(crate) registry: Arc<PluginRegistry>,
}

impl LoadedPlugin {
    /// The registry handle (the one the global registry lists).
    pub(crate) fn handle(&self) -> Registry {
        Registry::from_arc(self.registry.clone())
    }
}

/// Run a probed plugin's `init` and wrap what it returns. Refuses a score of 0.
pub(crate) fn install(probe: Probe) -> Result<LoadedPlugin, PluginError> {
    if probe.score == 0 {
        return Err(PluginError::CannotRun {
            path: probe.path,
            name: probe.name,
        });
    }
    let mut slot: InitSlot = None;
    // SAFETY: the fingerprint matched, so the plugin was built by this compiler against this
    // backend-core and its `init` writes an `InitSlot` exactly as we read it; `slot` is live
    // and writable for the call.
    unsafe { (probe.init)((&raw mut slot).cast()) };
    let inner = match slot {
        Some(Ok(r)) => r,
        Some(Err(source)) => {
            return Err(PluginError::Init {
                path: probe.path,
                source,
            });
        }
        None => {
            return Err(PluginError::NotAPlugin {
                path: probe.path,
                reason: "init returned without a registry".to_owned(),
            });
        }
    };
    if !inner.name().eq_ignore_ascii_case(&probe.name) {
        return Err(PluginError::NotAPlugin {
            path: probe.path,
            reason: format!(
                "the entry names registry {:?} but init made {:?}",
                probe.name,
                inner.name()
            ),
        });
    }
    let anchor: Anchor = probe.library;
    Ok(LoadedPlugin {
        path: probe.path,
        registry: PluginRegistry::wrap(inner, anchor),
    })
}

/// Install an in-process registry as if it came from `path` (tests of the bookkeeping that
/// need no library, e.g. under Miri).
#[cfg(test)]
pub(crate) fn install_in_process(path: &Path, inner: Registry, anchor: Anchor) -> LoadedPlugin {
    LoadedPlugin {
        path: path.to_path_buf(),
        registry: PluginRegistry::wrap(inner, anchor),
    }
}

/// The directories plugins are searched in: each entry of `env` (a path list, as in `PATH`),
/// then the directory of `exe`.
///
/// ```
/// use std::path::{Path, PathBuf};
/// let var = std::env::join_paths(["/opt/backends", "/usr/lib/app"]).unwrap();
/// let dirs = backend_core::plugin::search_dirs_from(Some(&var), Some(Path::new("/bin/app")));
/// assert_eq!(dirs, [PathBuf::from("/opt/backends"), "/usr/lib/app".into(), "/bin".into()]);
/// ```
pub fn search_dirs_from(env: Option<&std::ffi::OsStr>, exe: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env
        .map(|v| {
            std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push(dir.to_path_buf());
    }
    dirs
}

/// Whether `file` is a plugin library name: `{DLL_PREFIX}backend_…{DLL_SUFFIX}`, and, for
/// `name`, `…backend_{name}{DLL_SUFFIX}` or `…backend_{name}_{variant}{DLL_SUFFIX}`
/// (`-` may stand for `_`; the name is compared case-insensitively).
pub(crate) fn plugin_file_matches(file: &str, name: Option<&str>) -> bool {
    let Some(stem) = file
        .strip_prefix(std::env::consts::DLL_PREFIX)
        .and_then(|f| f.strip_suffix(std::env::consts::DLL_SUFFIX))
    else {
        return false;
    };
    let stem = stem.replace('-', "_").to_ascii_lowercase();
    let Some(rest) = stem.strip_prefix("backend_") else {
        return false;
    };
    match name {
        None => !rest.is_empty(),
        Some(n) => {
            let n = n.replace('-', "_").to_ascii_lowercase();
            rest == n
                || rest
                    .strip_prefix(&n)
                    .is_some_and(|v| v.starts_with('_') && v.len() > 1)
        }
    }
}

/// The plugin files in `dirs` (each directory's in name order, directories in order).
pub(crate) fn candidates(dirs: &[PathBuf], name: Option<&str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .and_then(|f| f.to_str())
                        .is_some_and(|f| plugin_file_matches(f, name))
            })
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}
