//! The test device plugin's "AVX2" variant: the same registry, scoring 2 on machines where the
//! CPU kernels take their AVX2 path (`cpu_kernels::isa_paths`, the dispatch's own answer) and
//! 0 (cannot run) elsewhere, so that `load_best("test")` picks it exactly where it runs best.
//!
//! The kernels choose their instruction-set path at run time, so this variant computes with
//! the same code as the portable one; a backend whose kernels are chosen at build time would
//! build this variant with `-C target-feature=+avx2,+fma,+f16c` instead.

use backend_core::{Registry, Result};
use test_device::{TestDevice, TestDeviceConfig, TestRegistry};

fn registry() -> Result<Registry> {
    let dev = TestDevice::create(TestDeviceConfig::named("TEST0-AVX2"))?;
    Ok(Registry::new(TestRegistry::new(vec![dev])))
}

fn score() -> u32 {
    let avx2 = cpu_kernels::isa_paths()
        .iter()
        .any(|p| p.name == "avx2" && p.runs_here);
    if avx2 { 2 } else { 0 }
}

backend_core::export_backend_plugin!(name: "TEST", score: score, init: registry);
