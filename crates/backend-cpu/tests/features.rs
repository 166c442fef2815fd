//! The CPU feature list (`ggml_backend_get_features`): what it holds matches the processor.

use backend_core::proc;
use backend_cpu::{KERNELS_FEATURE, cpu_registry, features};

fn value<'a>(list: &'a [backend_core::BackendFeature], name: &str) -> Option<&'a str> {
    list.iter()
        .find(|f| f.name == name)
        .map(|f| f.value.as_str())
}

#[test]
fn the_list_is_the_same_through_every_door_and_well_formed() {
    let list = features();
    let reg = cpu_registry();
    assert_eq!(reg.proc_address(proc::GET_FEATURES).unwrap()(&reg), list);
    assert_eq!(reg.features(), list);
    assert_eq!(features(), list, "detected once, the same every call");
    let mut names: Vec<&str> = list.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), list.len(), "no name twice");
    assert_eq!(value(&list, "REPACK"), Some("1"));
    assert_eq!(list.last().unwrap().name, KERNELS_FEATURE);
    for f in &list[..list.len() - 1] {
        assert_eq!(f.value, "1", "{f}");
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[test]
fn x86_flags_match_the_standard_library_detection() {
    use std::arch::is_x86_feature_detected as has;
    let list = features();
    let expected = [
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
    ];
    for (name, present) in expected {
        assert_eq!(value(&list, name).is_some(), present, "{name}");
    }
    // ggml's order: the flags present, in the order of the table above
    let order: Vec<&str> = expected
        .iter()
        .filter(|(_, p)| *p)
        .map(|(n, _)| *n)
        .collect();
    let got: Vec<&str> = list
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| order.contains(n))
        .collect();
    assert_eq!(got, order);
    // AMX_INT8 only where Linux lists the flag
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let amx = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "amx_int8"));
    assert_eq!(value(&list, "AMX_INT8").is_some(), amx);
    // the kernels' path follows the same detection
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512 =
        avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
    let path = if avx512 {
        "AVX512"
    } else if avx2 {
        "AVX2"
    } else {
        "SCALAR"
    };
    assert_eq!(value(&list, KERNELS_FEATURE), Some(path));
}
