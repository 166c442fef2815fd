//! A plugin that claims another build (another compiler or backend-core): refused before any
//! Rust object crosses.

use backend_core::plugin::{PLUGIN_ABI_VERSION, PluginEntry, PluginStr, type_identity};

extern "C" fn score() -> u32 {
    1
}

unsafe extern "C" fn init(_slot: *mut std::ffi::c_void) {}

static ENTRY: PluginEntry = PluginEntry {
    abi_version: PLUGIN_ABI_VERSION,
    fingerprint: PluginStr::new("abi=1; backend-core=0.0.0; rustc 1.0.0 (elsewhere)"),
    type_identity,
    name: PluginStr::new("OTHER"),
    score,
    init,
};

/// The entry point, with a fingerprint that matches no host.
#[unsafe(no_mangle)]
pub extern "C" fn backend_core_plugin_entry() -> *const PluginEntry {
    &ENTRY
}
