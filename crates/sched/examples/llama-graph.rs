//! Print the scheduler bench's llama decode graph as a graph file (`shared/fixtures/FORMAT.md`),
//! so that another implementation can be measured on exactly the same graph
//! (`crates/sched/benches/ggml-sched-bench.sh` feeds it to ggml's scheduler).
//!
//! Usage: `cargo run --release -p sched --example llama-graph -- [--order FILE] [LAYERS [GPU_LAYERS]]`
//!
//! Default 32 layers, everything on the CPU backend: the bench's `llama32/cpu` case; with
//! GPU_LAYERS, `LlamaConfig::offload("GPU0", GPU_LAYERS)` as in the `gpu…+cpu` cases.
//! `--order FILE` also builds the graph and writes its node and leaf names in graph order to
//! FILE (`nodes N leafs M`, then `node NAME` and `leaf NAME` lines), for comparing with
//! another implementation's build order.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::fmt::Write as _;
use std::process::ExitCode;

use test_fixtures::llama_file::LlamaConfig;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let order = match args.iter().position(|a| a == "--order") {
        Some(i) if i + 1 < args.len() => {
            let f = args.remove(i + 1);
            args.remove(i);
            Some(f)
        }
        Some(_) => {
            eprintln!("--order needs a file");
            return ExitCode::from(2);
        }
        None => None,
    };
    let mut n = [None, None];
    for (slot, a) in n.iter_mut().zip(&args) {
        match a.parse::<usize>() {
            Ok(v) => *slot = Some(v),
            Err(e) => {
                eprintln!("{a}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let mut c = LlamaConfig::llama_7b(n[0].unwrap_or(32));
    if let Some(g) = n[1] {
        c = c.offload("GPU0", g);
    }
    let file = c.graph_file("bench");
    if let Some(path) = order {
        let built = match file.build() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("build: {e}");
                return ExitCode::FAILURE;
            }
        };
        let g = &built.graph;
        let mut out = format!("nodes {} leafs {}\n", g.n_nodes(), g.n_leafs());
        for &t in g.nodes() {
            let _ = writeln!(out, "node {}", built.ctx[t].name());
        }
        for &t in g.leafs() {
            let _ = writeln!(out, "leaf {}", built.ctx[t].name());
        }
        if let Err(e) = std::fs::write(&path, out) {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("{}", file.to_json());
    ExitCode::SUCCESS
}
