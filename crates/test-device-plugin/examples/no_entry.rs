//! A shared library that is no backend plugin: it exports a function, but not the entry point.

/// Not the entry point.
#[unsafe(no_mangle)]
pub extern "C" fn not_a_backend() -> u32 {
    7
}
