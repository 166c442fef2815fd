//! The instruction-set paths the kernels choose between at run time, and which of them this
//! CPU runs.
//!
//! Every kernel has a portable form; faster forms need CPU features, checked once at run time
//! by the dispatch. [`isa_paths`] reports each path with the features it needs and the
//! dispatch's own answer (the same predicate the kernels call, not a second opinion), so a
//! program or a CI log can say which paths this machine exercises. The tests use the same
//! report to decide which paths they can compare, and say on stderr which they ran.
//!
//! ```
//! let paths = cpu_kernels::isa_paths();
//! // The portable kernels run everywhere and need nothing.
//! assert_eq!(paths[0].name, "portable");
//! assert!(paths[0].runs_here && paths[0].needs.is_empty());
//! // One line for a log: "portable, avx2 run here; avx512 cannot (lacks avx512f, …); …".
//! let line = cpu_kernels::isa_summary();
//! assert!(line.starts_with("portable"));
//! ```

/// One run-time path of the kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsaPath {
    /// Short name of the path (`portable`, `avx2`, `avx512`, …).
    pub name: &'static str,
    /// What runs on it.
    pub what: &'static str,
    /// The CPU features it needs, as `is_x86_feature_detected!` names them.
    pub needs: &'static [&'static str],
    /// Whether the kernels' dispatch takes this path on this CPU.
    pub runs_here: bool,
}

const AVX2: &[&str] = &["avx2", "fma", "f16c"];
const AVX512: &[&str] = &[
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
];
const AVX512_GFNI: &[&str] = &[
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
    "gfni",
];
const AVX512_VBMI_GFNI: &[&str] = &[
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
    "avx512vbmi",
    "gfni",
];

/// Every run-time path of the kernels, the portable one first, with whether the dispatch
/// takes it on this CPU. Under Miri and off x86-64 only the portable path runs.
pub fn isa_paths() -> Vec<IsaPath> {
    let x86 = x86_answers();
    vec![
        IsaPath {
            name: "portable",
            what: "every kernel, in the summation orders the others reproduce",
            needs: &[],
            runs_here: true,
        },
        IsaPath {
            name: "avx2",
            what: "quantized dot products, f16 rows and conversions",
            needs: AVX2,
            runs_here: x86.avx2,
        },
        IsaPath {
            name: "avx512",
            what: "quantized dot products in 16 lanes, q4_1/q8_0 one-column rows",
            needs: AVX512,
            runs_here: x86.avx512,
        },
        IsaPath {
            name: "avx512-gfni",
            what: "q4 high nibbles by one affine transform",
            needs: AVX512_GFNI,
            runs_here: x86.avx512_gfni,
        },
        IsaPath {
            name: "avx512-vbmi-gfni",
            what: "q4_0 sixteen-row tiles",
            needs: AVX512_VBMI_GFNI,
            runs_here: x86.q4tiles,
        },
        IsaPath {
            name: "avx512f-gemm",
            what: "the f32 GEMM micro-kernel",
            needs: &["avx512f"],
            runs_here: x86.sgemm,
        },
    ]
}

/// The dispatch's own predicates, one per path.
#[derive(Default)]
struct X86Answers {
    avx2: bool,
    avx512: bool,
    avx512_gfni: bool,
    q4tiles: bool,
    sgemm: bool,
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn x86_answers() -> X86Answers {
    X86Answers {
        avx2: crate::quant::has_avx2_fma_f16c(),
        avx512: crate::qmv512::available(),
        avx512_gfni: crate::qmv512::available() && crate::qmv512::has_gfni(),
        q4tiles: crate::q4tiles::available(),
        sgemm: crate::sgemm::Kernel::best().is_some(),
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn x86_answers() -> X86Answers {
    X86Answers::default()
}

/// One line for logs: `portable, avx2 run here; avx512 cannot (lacks avx512f, …); …`.
pub fn isa_summary() -> String {
    let paths = isa_paths();
    let ran: Vec<&str> = paths
        .iter()
        .filter(|p| p.runs_here)
        .map(|p| p.name)
        .collect();
    let mut line = format!("{} run here", ran.join(", "));
    for p in paths.iter().filter(|p| !p.runs_here) {
        let lacks: Vec<&str> = p.needs.iter().copied().filter(|f| !cpu_has(f)).collect();
        if lacks.is_empty() {
            line.push_str(&format!("; {} not taken", p.name));
        } else {
            line.push_str(&format!("; {} cannot (lacks {})", p.name, lacks.join(", ")));
        }
    }
    line
}

/// Whether the CPU has feature `name` (an `is_x86_feature_detected!` name), asked directly,
/// independently of the dispatch's predicates. Unknown names and other targets: `false`.
pub(crate) fn cpu_has(name: &str) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::is_x86_feature_detected as has;
        match name {
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "f16c" => has!("f16c"),
            "avx512f" => has!("avx512f"),
            "avx512bw" => has!("avx512bw"),
            "avx512vl" => has!("avx512vl"),
            "avx512vnni" => has!("avx512vnni"),
            "avx512vbmi" => has!("avx512vbmi"),
            "gfni" => has!("gfni"),
            _ => false,
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = name;
        false
    }
}

/// Test support: whether a test may compare the kernels of path `name`.
///
/// Says on stderr (once per process and path) that the path ran or why it could not. Under
/// CI (`CI` set), a path that the dispatch refuses although the CPU has every feature it
/// needs is a failure: a test would otherwise skip a kernel this machine can run, and the
/// kernels themselves would never take it.
#[cfg(test)]
#[allow(clippy::print_stderr)] // a skipped path says so
pub(crate) fn test_gate(name: &str) -> bool {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SAID: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

    let path = isa_paths()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no ISA path named {name}"));
    let lacks: Vec<&str> = path.needs.iter().copied().filter(|f| !cpu_has(f)).collect();
    if !path.runs_here && lacks.is_empty() && !cfg!(miri) && std::env::var_os("CI").is_some() {
        panic!(
            "ISA path {name}: this CPU has {:?}, but the dispatch does not take it (a test would skip it)",
            path.needs
        );
    }
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(path.name) {
        if path.runs_here {
            eprintln!("ISA path {name}: ran");
        } else if lacks.is_empty() {
            eprintln!("ISA path {name}: SKIPPED (not taken on this target)");
        } else {
            eprintln!(
                "ISA path {name}: SKIPPED, this CPU lacks {}",
                lacks.join(", ")
            );
        }
    }
    path.runs_here
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path runs exactly where the CPU has every feature it lists: the dispatch's
    /// predicates and the declared needs agree (on x86-64 outside Miri).
    #[test]
    fn paths_run_where_the_cpu_has_what_they_need() {
        for p in isa_paths() {
            let has_all = p.needs.iter().all(|f| cpu_has(f));
            if cfg!(all(target_arch = "x86_64", not(miri))) {
                assert_eq!(p.runs_here, has_all, "{}: needs {:?}", p.name, p.needs);
            } else {
                assert_eq!(p.runs_here, p.needs.is_empty(), "{}", p.name);
            }
            assert_eq!(test_gate(p.name), p.runs_here);
        }
        assert!(isa_summary().starts_with("portable"));
    }

    #[test]
    fn unknown_features_are_absent() {
        assert!(!cpu_has("no-such-feature"));
    }
}
