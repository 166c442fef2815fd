//! `plan-inspector [--debug] FILE.graph.json`: print the scheduler's plan for a graph file.
//!
//! Prints the plan-file JSON (`fixtures/FORMAT.md`) on stdout, or with `--debug` the
//! `GGML_SCHED_DEBUG=2` layout. A graph the scheduler rejects prints `{"error": ...}` and
//! exits with status 1; a usage error exits with status 2.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use sched::fixture::GraphFile;

fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

fn main() -> ExitCode {
    let mut debug = false;
    let mut file = None;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--debug" => debug = true,
            "-h" | "--help" => {
                println!("usage: plan-inspector [--debug] FILE.graph.json");
                return ExitCode::SUCCESS;
            }
            _ if file.is_none() => file = Some(a),
            _ => {
                eprintln!("usage: plan-inspector [--debug] FILE.graph.json");
                return ExitCode::from(2);
            }
        }
    }
    let Some(file) = file else {
        eprintln!("usage: plan-inspector [--debug] FILE.graph.json");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            println!("{}", error_json(&format!("{file}: {e}")));
            return ExitCode::from(1);
        }
    };
    let result = GraphFile::from_json(&text).and_then(|g| {
        if debug {
            g.debug_layout()
        } else {
            g.plan().map(|p| p.to_json())
        }
    });
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", error_json(&e.to_string()));
            ExitCode::from(1)
        }
    }
}
