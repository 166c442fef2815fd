//! The `plan-inspector` binary on bad input: each failure prints exactly one JSON object
//! `{"error": "..."}` on stdout and exits with status 1 (2 for a usage error, with nothing on
//! stdout); a valid file prints its plan and exits with 0.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plan-inspector"))
        .args(args)
        .output()
        .expect("run plan-inspector")
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plan-inspector-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The error message of a failed run; checks status 1 and a lone JSON object on stdout.
fn error_of(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is JSON");
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 1, "only the error: {stdout}");
    obj["error"].as_str().expect("error is a string").to_owned()
}

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/graphs")
}

#[test]
fn a_missing_file_is_a_json_error() {
    let e = error_of(&run(&["/nonexistent/none.graph.json"]));
    assert!(e.starts_with("/nonexistent/none.graph.json: "), "{e}");
}

#[test]
fn text_that_is_not_json_is_a_json_error() {
    let p = scratch("garbage.graph.json", "this is { not json");
    let e = error_of(&run(&[p.to_str().unwrap()]));
    assert!(!e.is_empty());
    let e = error_of(&run(&["--debug", p.to_str().unwrap()]));
    assert!(!e.is_empty());
}

#[test]
fn json_that_is_not_a_graph_file_is_a_json_error() {
    for (name, text) in [
        ("empty-object.graph.json", "{}"),
        ("array.graph.json", "[1, 2, 3]"),
        (
            "unknown-op.graph.json",
            r#"{"name":"x","graph_size":16,"backends":[{"name":"CPU","device_type":"cpu"}],
               "tensors":[{"name":"a","op":"NO_SUCH_OP","type":"f32","ne":[4]}],"expand":["a"]}"#,
        ),
    ] {
        let p = scratch(name, text);
        let e = error_of(&run(&[p.to_str().unwrap()]));
        assert!(!e.is_empty(), "{name}");
    }
}

#[test]
fn a_graph_the_scheduler_rejects_is_a_json_error() {
    let p = graphs().join("error-split-inputs-overflow.graph.json");
    let e = error_of(&run(&[p.to_str().unwrap()]));
    assert!(e.contains("inputs"), "{e}");
}

#[test]
fn a_valid_graph_prints_its_plan_and_exits_0() {
    let p = graphs().join("llama-gpu-partial-L4-k2.graph.json");
    let out = run(&[p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    assert!(v.get("error").is_none());
}

#[test]
fn usage_errors_exit_2_with_nothing_on_stdout() {
    for args in [&[][..], &["a.json", "b.json"][..]] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}
