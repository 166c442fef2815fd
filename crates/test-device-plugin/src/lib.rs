//! The test device as a backend plugin: this crate builds only a `cdylib`
//! (`libtest_device_plugin.so` on Linux) that exports the `"TEST"` registry, with one default
//! test device `"TEST0"`, through [`backend_core::export_backend_plugin!`]. It is the
//! "portable" variant and scores 1 everywhere; the example `backend_test_avx2` is the same
//! device scoring 2 where the CPU kernels take their AVX2 path (0 elsewhere), and the other
//! examples are libraries the loader must refuse. The loader's tests (`tests/plugin.rs`) build
//! them all, load them, and compare computations through the scheduler with the linked test
//! device, bit for bit.
//!
//! Why a crate of its own: `test-device` stays an ordinary `rlib` that the scheduler's tests
//! link, and the plugin is a thin shell over it, as a third-party backend's would be.

use backend_core::{Registry, Result};
use test_device::{TestDevice, TestDeviceConfig, TestRegistry};

/// The registry the plugin exports: `"TEST"` over one default test device.
fn registry() -> Result<Registry> {
    let dev = TestDevice::create(TestDeviceConfig::default())?;
    Ok(Registry::new(TestRegistry::new(vec![dev])))
}

backend_core::export_backend_plugin!(name: "TEST", score: || 1, init: registry);
