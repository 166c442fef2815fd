//! Every graph file of the shared fixtures against the reference's plan file.
//!
//! Nodes, leafs, splits (backend, range, inputs in registration order), `n_splits` and
//! `n_copies` must be equal; compute buffer sizes equal or smaller. Error plans only need to
//! be errors.

use std::path::{Path, PathBuf};

use sched::fixture::GraphFile;
use serde_json::Value;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Compare one fixture; `Err` describes the first difference.
fn check(graph_path: &Path) -> Result<(), String> {
    let plan_path = graph_path.with_file_name(
        graph_path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace(".graph.json", ".plan.json"),
    );
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let file = GraphFile::from_json(&std::fs::read_to_string(graph_path).unwrap())
        .map_err(|e| e.to_string())?;
    let got = file.plan();
    if expected.get("error").is_some() {
        return match got {
            Err(_) => Ok(()),
            Ok(_) => Err("expected an error, got a plan".into()),
        };
    }
    let got = got.map_err(|e| format!("unexpected error: {e}"))?;
    let got: Value = serde_json::from_str(&got.to_json()).map_err(|e| e.to_string())?;
    for key in ["n_splits", "n_copies", "splits", "nodes", "leafs"] {
        if got[key] != expected[key] {
            let (g, e) = (&got[key], &expected[key]);
            if let (Some(g), Some(e)) = (g.as_array(), e.as_array()) {
                for (i, (a, b)) in g.iter().zip(e).enumerate() {
                    if a != b {
                        return Err(format!("{key}[{i}]: got {a}, expected {b}"));
                    }
                }
                return Err(format!(
                    "{key}: got {} entries, expected {}",
                    g.len(),
                    e.len()
                ));
            }
            return Err(format!("{key}: got {g}, expected {e}"));
        }
    }
    let (gs, es) = (&got["buffer_sizes"], &expected["buffer_sizes"]);
    let es = es.as_object().ok_or("no buffer_sizes")?;
    for (name, e) in es {
        let g = gs[name]
            .as_u64()
            .ok_or(format!("no buffer size for {name}"))?;
        let e = e.as_u64().unwrap();
        if g > e {
            return Err(format!(
                "buffer size of {name}: got {g}, expected at most {e}"
            ));
        }
    }
    Ok(())
}

#[test]
fn every_shared_fixture_matches_its_plan() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".graph.json"))
        .collect();
    files.sort();
    assert!(files.len() >= 12, "fixtures missing");
    let mut failures = Vec::new();
    for f in &files {
        if let Err(e) = check(f) {
            failures.push(format!("{}: {e}", f.file_name().unwrap().to_str().unwrap()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
