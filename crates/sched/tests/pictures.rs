//! The plan picture (`sched::dot`) of a llama fixture: the DOT it writes, and the SVG that
//! Graphviz's `dot` makes of it through the plan inspector.
//!
//! The SVG tests need `dot` (Debian: `graphviz`; `.ci/run` installs it). Without it they say
//! they were skipped, except under CI (`CI` set), where they fail.

#![allow(clippy::print_stderr)] // a skipped test says so

use std::path::{Path, PathBuf};
use std::process::Command;

use sched::fixture::GraphFile;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.graph.json"))
}

fn graph_file(name: &str) -> GraphFile {
    GraphFile::from_json(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// The DOT statement lines that declare `name`'s node (its id starts with its position).
fn node_lines<'a>(dot: &'a str, name: &str) -> Vec<&'a str> {
    dot.lines()
        .filter(|l| !l.contains("->") && !l.contains("\"copy into split"))
        .filter(|l| l.contains(&format!(" {name} · ")))
        .collect()
}

#[test]
fn dot_of_the_two_gpu_llama_has_every_split_tensor_and_copy() {
    let file = graph_file("llama-2gpu-L4");
    let plan = file.plan().unwrap();
    let dot = file.dot("llama-2gpu-L4").unwrap();
    assert!(dot.starts_with("digraph plan {") && dot.trim_end().ends_with('}'));

    // Every split is a cluster labelled with its backend and node range.
    for (k, sp) in plan.splits.iter().enumerate() {
        let header = format!("subgraph cluster_split{k} {{");
        assert!(dot.contains(&header), "no cluster for split {k}");
        let label = format!("split {k}: {} · nodes {}..{}", sp.backend, sp.start, sp.end);
        assert!(dot.contains(&label), "split {k}: no label {label:?}");
        // Every input copy: a red node in the split's cluster and a thick red edge into it.
        for input in &sp.inputs {
            let copy_node = dot
                .lines()
                .find(|l| {
                    l.contains(&header)
                        && l.contains("#d62728")
                        && l.contains(&format!("copy into split {k} of "))
                        && l.contains(&format!(" {input} · "))
                })
                .unwrap_or_else(|| panic!("split {k}: no copy node for {input}"));
            assert!(copy_node.contains("copy "), "{copy_node}");
            assert!(
                dot.lines().any(|l| l.contains("->")
                    && l.contains("penwidth=2.4")
                    && l.contains(&format!("\"copy into split {k} of "))
                    && l.contains(&format!(" {input} · "))),
                "split {k}: no copy edge for {input}"
            );
        }
    }
    // Every node and leaf is drawn once, filled with its backend's colour and with the
    // assigning rule in its id (the SVG <title>).
    for t in plan.nodes.iter().chain(&plan.leafs) {
        let lines = node_lines(&dot, &t.name);
        assert_eq!(lines.len(), 1, "{}: {lines:?}", t.name);
        let backend = t.backend.as_deref().unwrap();
        assert!(
            lines[0].contains(&format!(" · {backend} · ")),
            "{}",
            lines[0]
        );
    }
    let line = |name: &str| node_lines(&dot, name)[0];
    assert!(line("Qcur.0").contains("1.wgt0: pass 1, follows the weight in source 0"));
    assert!(line("inp_pos").contains("1.inp"));
    // Weights, KV cache, graph inputs, views and ops are shaped apart.
    assert!(line("wq.0").contains("shape=cylinder"));
    assert!(line("cache_k.0").contains("shape=box3d"));
    assert!(line("inp_pos").contains("shape=invhouse"));
    assert!(line("k.0").contains("dashed"));
    assert!(line("kq.0").contains("rounded"));
}

/// Whether `dot` can be run; under CI its absence is a failure.
fn have_dot() -> bool {
    let ok = Command::new("dot")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but Graphviz's `dot` is missing (apt-get install graphviz)"
        );
        eprintln!("SKIPPED: Graphviz's `dot` is not installed");
    }
    ok
}

#[test]
fn plan_inspector_draws_an_svg_and_keeps_stdout_for_the_plan() {
    if !have_dot() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sched-pictures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (svg, dot) = (dir.join("plan.svg"), dir.join("plan.dot"));
    let out = Command::new(env!("CARGO_BIN_EXE_plan-inspector"))
        .arg("--svg")
        .arg(&svg)
        .arg("--dot")
        .arg(&dot)
        .arg(fixture("llama-2gpu-L4"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // stdout is still exactly the plan JSON.
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["n_splits"], 3);

    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg"), "not an SVG");
    for k in 0..3 {
        assert!(svg.contains(&format!("<title>cluster_split{k}</title>")));
    }
    // Hovering a node shows the rule that placed it.
    assert!(svg.contains("<title>#"), "nodes have no titles");
    assert!(
        svg.lines()
            .any(|l| l.starts_with("<title>") && l.contains("Qcur.0") && l.contains("1.wgt0")),
        "no title with Qcur.0's rule"
    );
    assert_eq!(
        std::fs::read_to_string(&dot).unwrap(),
        graph_file("llama-2gpu-L4")
            .dot("llama-2gpu-L4.graph.json")
            .unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn render_reports_a_dot_syntax_error() {
    if !have_dot() {
        return;
    }
    let out = std::env::temp_dir().join(format!("sched-bad-{}.svg", std::process::id()));
    let err = sched::dot::render("digraph { a -> }", &out).unwrap_err();
    assert!(
        matches!(err, sched::dot::RenderError::Failed { .. }),
        "{err}"
    );
}

/// A large plan (here about 600 nodes) asks `dot` for its cheaper layout, which it can then
/// draw; a fixture-sized one keeps the full layout.
#[test]
fn a_large_plan_asks_for_the_cheaper_layout_and_is_drawn() {
    let big = test_fixtures::llama_file::LlamaConfig::tiny(16)
        .offload("GPU0", 8)
        .graph_file("big");
    let dot = big.dot("big").unwrap();
    assert!(
        dot.contains("nslimit=1"),
        "a large plan keeps the costly layout"
    );
    let small = graph_file("llama-2gpu-L4").dot("small").unwrap();
    assert!(
        !small.contains("nslimit"),
        "a small plan lost the full layout"
    );
    if !have_dot() {
        return;
    }
    let out = std::env::temp_dir().join(format!("sched-big-plan-{}.svg", std::process::id()));
    sched::dot::render(&dot, &out).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(svg.contains("cluster_split"), "the clusters are drawn");
}
