//! What the CPU backend reports about the processor it runs on (ggml's
//! `ggml_backend_cpu_get_features`, reached as the registry's `ggml_backend_get_features`).
//!
//! Why run-time detection: ggml's x86 flags say what its kernels were *compiled* for (one
//! build per instruction-set level), while this crate's kernels are compiled once and choose
//! their path when they run, from the same detection the standard library caches. So each
//! flag here is what this processor has (and, for the instruction sets whose state the OS must
//! save, what the OS enabled), and the `KERNELS` entry says which of the kernels' paths that
//! selects.

use std::sync::OnceLock;

use backend_core::BackendFeature;

/// Name of the entry that says which vector path `cpu-kernels` takes on this processor:
/// `"AVX512"` (AVX-512 F, BW, VL and VNNI, with AVX2, FMA and F16C), `"AVX2"` (AVX2, FMA and
/// F16C) or `"SCALAR"` (portable code; the only path off x86-64 and under Miri). Not one of
/// ggml's names: ggml builds one library per level instead.
pub const KERNELS_FEATURE: &str = "KERNELS";

/// The CPU backend's feature list, in ggml's order and spelling: one entry with value `"1"` for
/// each instruction-set extension found at run time (x86: `SSE3`, `SSSE3`, `AVX`, `AVX_VNNI`,
/// `AVX2`, `F16C`, `FMA`, `BMI2`, `AVX512` (= AVX-512 F), `AVX512_VBMI`, `AVX512_VNNI`,
/// `AVX512_BF16`, `AMX_INT8`; AArch64: `NEON`, `ARM_FMA`, `FP16_VA`, `MATMUL_INT8`, `SVE`,
/// `DOTPROD`), absent ones left out as ggml does; then `REPACK` = `"1"` (the `CPU_REPACK`
/// buffer type, [`crate::cpu_repack_buffer_type`]) and [`KERNELS_FEATURE`].
///
/// `AMX_INT8` comes from the Linux kernel's CPU flags (`/proc/cpuinfo`), which list it only
/// where the kernel enabled the AMX state; the standard library does not detect AMX yet. No
/// kernel here uses AMX. Detection runs once per process.
///
/// ```
/// use backend_core::proc;
///
/// let features = backend_cpu::features();
/// let kernels = features.iter().find(|f| f.name == backend_cpu::KERNELS_FEATURE).unwrap();
/// assert!(["AVX512", "AVX2", "SCALAR"].contains(&kernels.value.as_str()));
/// assert!(features.iter().any(|f| f.name == "REPACK" && f.value == "1"));
/// // the same list through ggml's proc-address name
/// let reg = backend_cpu::cpu_registry();
/// let get = reg.proc_address(proc::GET_FEATURES).unwrap();
/// assert_eq!(get(&reg), features);
/// assert_eq!(reg.features(), features);
/// ```
pub fn features() -> Vec<BackendFeature> {
    static F: OnceLock<Vec<BackendFeature>> = OnceLock::new();
    F.get_or_init(detect).clone()
}

fn detect() -> Vec<BackendFeature> {
    let mut out: Vec<BackendFeature> = isa_flags()
        .into_iter()
        .filter(|&(_, present)| present)
        .map(|(name, _)| BackendFeature::new(name, "1"))
        .collect();
    out.push(BackendFeature::new("REPACK", "1"));
    out.push(BackendFeature::new(KERNELS_FEATURE, kernel_path()));
    tracing::debug!(features = ?out, "CPU features detected");
    out
}

/// Every flag this architecture reports, in ggml's order, and whether it is present.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(crate) fn isa_flags() -> Vec<(&'static str, bool)> {
    use std::arch::is_x86_feature_detected as has;
    vec![
        ("SSE3", has!("sse3")),
        ("SSSE3", has!("ssse3")),
        ("AVX", has!("avx")),
        ("AVX_VNNI", has!("avxvnni")),
        ("AVX2", has!("avx2")),
        ("F16C", has!("f16c")),
        ("FMA", has!("fma")),
        ("BMI2", has!("bmi2")),
        ("AVX512", has!("avx512f")),
        ("AVX512_VBMI", has!("avx512vbmi")),
        ("AVX512_VNNI", has!("avx512vnni")),
        ("AVX512_BF16", has!("avx512bf16")),
        ("AMX_INT8", cpuinfo_has_flag("amx_int8")),
    ]
}

/// Every flag this architecture reports, in ggml's order, and whether it is present.
#[cfg(all(target_arch = "aarch64", not(miri)))]
pub(crate) fn isa_flags() -> Vec<(&'static str, bool)> {
    use std::arch::is_aarch64_feature_detected as has;
    let neon = has!("neon");
    vec![
        ("NEON", neon),
        // AArch64's Advanced SIMD always has fused multiply-add.
        ("ARM_FMA", neon),
        ("FP16_VA", has!("fp16")),
        ("MATMUL_INT8", has!("i8mm")),
        ("SVE", has!("sve")),
        ("DOTPROD", has!("dotprod")),
    ]
}

/// No detection elsewhere (and none under Miri, which cannot run `cpuid`).
#[cfg(not(any(
    all(target_arch = "x86_64", not(miri)),
    all(target_arch = "aarch64", not(miri))
)))]
pub(crate) fn isa_flags() -> Vec<(&'static str, bool)> {
    Vec::new()
}

/// Whether the `flags` line of `/proc/cpuinfo` lists `flag`; `false` where the file is missing.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn cpuinfo_has_flag(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|text| flags_line_has(&text, flag))
        .unwrap_or(false)
}

/// Whether the first `flags` line of a `/proc/cpuinfo` text lists `flag` as a whole word.
#[cfg_attr(not(all(target_arch = "x86_64", not(miri))), allow(dead_code))]
pub(crate) fn flags_line_has(cpuinfo: &str, flag: &str) -> bool {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .is_some_and(|(_, flags)| flags.split_whitespace().any(|f| f == flag))
}

/// The widest vector path `cpu-kernels` dispatches to, from its own report
/// ([`cpu_kernels::isa_paths`]: the predicates its kernels call).
pub(crate) fn kernel_path() -> &'static str {
    let paths = cpu_kernels::isa_paths();
    let runs = |name: &str| paths.iter().any(|p| p.name == name && p.runs_here);
    if runs("avx512") {
        "AVX512"
    } else if runs("avx2") {
        "AVX2"
    } else {
        "SCALAR"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_line_parsing() {
        let text = "processor: 0\nflags\t\t: fpu sse3 amx_int8 avx2\nflags : amx_tile\n";
        assert!(flags_line_has(text, "amx_int8"));
        assert!(flags_line_has(text, "sse3"));
        assert!(!flags_line_has(text, "amx"), "whole words only");
        assert!(
            !flags_line_has(text, "amx_tile"),
            "the first flags line only"
        );
        assert!(!flags_line_has("no flags here", "sse3"));
    }
}
