//! The test device plugin's "AVX2" variant: the same registry, scoring 2 on machines that run
//! AVX2 and 0 (cannot run) elsewhere, so that `load_best("test")` picks it exactly where it
//! would run best. (A real variant would also be compiled with `-C target-feature=+avx2`.)

use backend_core::{Registry, Result};
use test_device::{TestDevice, TestDeviceConfig, TestRegistry};

fn registry() -> Result<Registry> {
    let dev = TestDevice::create(TestDeviceConfig::named("TEST0-AVX2"))?;
    Ok(Registry::new(TestRegistry::new(vec![dev])))
}

fn score() -> u32 {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if std::arch::is_x86_feature_detected!("avx2") {
        return 2;
    }
    0
}

backend_core::export_backend_plugin!(name: "TEST", score: score, init: registry);
