//! A plugin that cannot run anywhere (score 0): loading it is refused before its init runs.

use backend_core::{BackendError, Registry, Result};

fn registry() -> Result<Registry> {
    Err(BackendError::failed(
        "ZERO",
        "init must not run for a score of 0",
    ))
}

backend_core::export_backend_plugin!(name: "ZERO", score: || 0, init: registry);
