//! The C-ABI entry point a plugin exports, and the macro that generates it.

use std::ffi::c_void;

use crate::error::{BackendError, Result};
use crate::registry::Registry;

/// Version of [`PluginEntry`]'s layout. Bumped whenever the struct changes; the first field of
/// every version is this number as a `u32`, so a host can read it from any plugin.
pub const PLUGIN_ABI_VERSION: u32 = 2;

/// The symbol a plugin exports: `extern "C" fn() -> *const PluginEntry`.
pub const PLUGIN_ENTRY_SYMBOL: &str = "backend_core_plugin_entry";

/// What must match exactly between a plugin and its host before Rust objects cross the
/// boundary: the entry ABI version, this crate's version, the exact compiler (version, commit
/// and LLVM), the target, and a hash of this crate's sources (the trait layouts).
pub const BUILD_FINGERPRINT: &str = concat!(
    "abi=1; backend-core=",
    env!("CARGO_PKG_VERSION"),
    "; src=",
    env!("BACKEND_CORE_SRC_HASH"),
    "; target=",
    env!("BACKEND_CORE_TARGET"),
    "; ",
    env!("BACKEND_CORE_RUSTC"),
);

/// A string as a C struct: pointer and length of UTF-8 bytes that live as long as the
/// library.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginStr {
    /// First byte.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl PluginStr {
    /// A string over static text.
    pub const fn new(s: &'static str) -> Self {
        PluginStr {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The text.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for `'a` (for a plugin's strings: while its library is
    /// loaded).
    pub(crate) unsafe fn get<'a>(self) -> Option<&'a str> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: the caller guarantees the range is readable for 'a; the bytes are checked
        // to be UTF-8 below.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        std::str::from_utf8(bytes).ok()
    }
}

/// Where a plugin's `init` writes its registry: the host passes a pointer to `None`.
pub type InitSlot = Option<Result<Registry>>;

/// The entry point's answer (version [`PLUGIN_ABI_VERSION`]): plain C data that a host can
/// read whatever compiler built the plugin. Only `init` hands over Rust objects, and the host
/// calls it only when `fingerprint` equals its own [`BUILD_FINGERPRINT`].
#[repr(C)]
#[derive(Debug)]
pub struct PluginEntry {
    /// [`PLUGIN_ABI_VERSION`] of the plugin's build; always the first field.
    pub abi_version: u32,
    /// The plugin's [`BUILD_FINGERPRINT`].
    pub fingerprint: PluginStr,
    /// The plugin's [`type_identity`]: the host compares it with its own before it takes any
    /// Rust object.
    pub type_identity: extern "C" fn() -> u64,
    /// The registry's name (what `load_best` and `unload` look for).
    pub name: PluginStr,
    /// How well the backend runs on this machine: 0 = it cannot, higher is better.
    pub score: extern "C" fn() -> u32,
    /// Writes the registry into the [`InitSlot`] `slot` points at.
    pub init: unsafe extern "C" fn(slot: *mut c_void),
}

// SAFETY: the only non-`Sync` fields are the two `PluginStr`s, which point at immutable
// `'static` text; sharing references to it between threads is sound.
unsafe impl Sync for PluginEntry {}

impl PluginEntry {
    /// The entry of a plugin built against this crate (what [`crate::export_backend_plugin!`]
    /// generates).
    pub const fn new(
        name: &'static str,
        score: extern "C" fn() -> u32,
        init: unsafe extern "C" fn(slot: *mut c_void),
    ) -> Self {
        PluginEntry {
            abi_version: PLUGIN_ABI_VERSION,
            fingerprint: PluginStr::new(BUILD_FINGERPRINT),
            type_identity,
            name: PluginStr::new(name),
            score,
            init,
        }
    }
}

/// A hash of the identities (`TypeId`) of the types a host and a plugin hand each other, as
/// the build that calls it compiled them.
///
/// The build fingerprint sees the compiler and `backend-core`'s sources, not how cargo
/// resolved the dependency graph around them: the same sources built with other features of a
/// shared dependency (another workspace feature set, say) are another crate to the compiler,
/// whose `TypeId`s differ, so every downcast across the boundary (a tensor's storage to its
/// buffer) would fail, and layouts need not agree. Equal identities mean both sides use one
/// compilation of these types.
///
/// ```
/// // Stable within one build.
/// assert_eq!(backend_core::plugin::type_identity(), backend_core::plugin::type_identity());
/// ```
pub extern "C" fn type_identity() -> u64 {
    use std::any::TypeId;
    use std::hash::{Hash, Hasher};
    let ids = [
        TypeId::of::<crate::Buffer>(),
        TypeId::of::<crate::BufferType>(),
        TypeId::of::<crate::Backend>(),
        TypeId::of::<crate::Device>(),
        TypeId::of::<crate::Registry>(),
        TypeId::of::<crate::BackendError>(),
        TypeId::of::<graph::Context>(),
        TypeId::of::<graph::TensorStorage>(),
    ];
    // SipHash with fixed keys: the same on both sides, whose compilers the fingerprint
    // already showed to be the same.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    ids.hash(&mut h);
    h.finish()
}

/// Calls a plugin's score function; a panic counts as "cannot run here" (0).
#[doc(hidden)]
pub fn __call_score(f: fn() -> u32) -> u32 {
    std::panic::catch_unwind(f).unwrap_or(0)
}

/// Calls a plugin's registry constructor and writes its answer (a panic becomes an error)
/// into `slot`.
///
/// # Safety
/// `slot` must point at a live, writable [`InitSlot`], as the host's loader passes it.
#[doc(hidden)]
pub unsafe fn __call_init(slot: *mut c_void, name: &str, f: fn() -> Result<Registry>) {
    let answer = std::panic::catch_unwind(f).unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Err(BackendError::failed(
            name,
            format!("plugin init panicked: {why}"),
        ))
    });
    // SAFETY: the caller guarantees `slot` points at a live `InitSlot`; assigning drops the
    // `None` that was there.
    unsafe { *slot.cast::<InitSlot>() = Some(answer) };
}

/// Export a backend registry from a crate built as a `cdylib`: generates the
/// [`PLUGIN_ENTRY_SYMBOL`] function returning a static [`PluginEntry`].
///
/// * `name`: the registry's name (a `&'static str`, the same its `RegistryImpl::name`
///   answers);
/// * `score`: `fn() -> u32`, 0 when the backend cannot run on this machine (a missing CPU
///   feature, no driver), higher for a better fit;
/// * `init`: `fn() -> Result<Registry>`, called once per load, after the host checked the
///   build fingerprint and the score.
///
/// Panics in `score` or `init` are caught (score 0, an init error): none crosses the C ABI.
///
/// ```
/// use backend_core::{Registry, RegistryImpl, Device, Result};
/// struct Reg;
/// impl RegistryImpl for Reg {
///     fn name(&self) -> &str { "DEMO" }
///     fn devices(&self) -> Vec<Device> { Vec::new() }
/// }
/// fn registry() -> Result<Registry> { Ok(Registry::new(Reg)) }
/// backend_core::export_backend_plugin!(name: "DEMO", score: || 1, init: registry);
/// ```
#[macro_export]
macro_rules! export_backend_plugin {
    (name: $name:expr, score: $score:expr, init: $init:expr $(,)?) => {
        const _: () = {
            const __NAME: &str = $name;
            extern "C" fn __score() -> u32 {
                $crate::plugin::__call_score($score)
            }
            unsafe extern "C" fn __init(slot: *mut ::core::ffi::c_void) {
                // SAFETY: the host's loader calls `init` with a pointer to its `InitSlot`,
                // which is `__call_init`'s requirement.
                unsafe { $crate::plugin::__call_init(slot, __NAME, $init) }
            }
            static __ENTRY: $crate::plugin::PluginEntry =
                $crate::plugin::PluginEntry::new(__NAME, __score, __init);
            /// The backend plugin entry point (see `backend_core::plugin`).
            #[unsafe(no_mangle)]
            pub extern "C" fn backend_core_plugin_entry() -> *const $crate::plugin::PluginEntry {
                &__ENTRY
            }
        };
    };
}
