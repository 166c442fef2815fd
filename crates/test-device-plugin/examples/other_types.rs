//! A plugin with the host's fingerprint whose exchanged types are another compilation (its
//! `type_identity` answers another hash, as a build with other dependency features would):
//! refused before `init` hands over any Rust object.

use backend_core::plugin::{BUILD_FINGERPRINT, PLUGIN_ABI_VERSION, PluginEntry, PluginStr};

extern "C" fn score() -> u32 {
    1
}

extern "C" fn other_type_identity() -> u64 {
    !backend_core::plugin::type_identity()
}

unsafe extern "C" fn init(_slot: *mut std::ffi::c_void) {}

static ENTRY: PluginEntry = PluginEntry {
    abi_version: PLUGIN_ABI_VERSION,
    fingerprint: PluginStr::new(BUILD_FINGERPRINT),
    type_identity: other_type_identity,
    name: PluginStr::new("OTHER_TYPES"),
    score,
    init,
};

/// The entry point: the right fingerprint, other types.
#[unsafe(no_mangle)]
pub extern "C" fn backend_core_plugin_entry() -> *const PluginEntry {
    &ENTRY
}
