//! A plugin whose entry claims another layout version: refused after reading only its first
//! field.

use backend_core::plugin::{PluginEntry, PluginStr, type_identity};

extern "C" fn score() -> u32 {
    1
}

unsafe extern "C" fn init(_slot: *mut std::ffi::c_void) {}

static ENTRY: PluginEntry = PluginEntry {
    abi_version: 999,
    fingerprint: PluginStr::new("from the future"),
    type_identity,
    name: PluginStr::new("FUTURE"),
    score,
    init,
};

/// The entry point, of a layout version no host knows.
#[unsafe(no_mangle)]
pub extern "C" fn backend_core_plugin_entry() -> *const PluginEntry {
    &ENTRY
}
