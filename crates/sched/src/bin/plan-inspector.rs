//! `plan-inspector [--debug] [--svg OUT.svg] [--dot OUT.dot] FILE.graph.json`: print the
//! scheduler's plan for a graph file.
//!
//! Prints the plan-file JSON (`fixtures/FORMAT.md`) on stdout, or with `--debug` the
//! `GGML_SCHED_DEBUG=2` layout. `--svg OUT` also draws the plan (`sched::dot`; Graphviz's `dot`
//! renders it, and the format follows OUT's extension, so `--svg plan.png` works too) and
//! `--dot OUT` writes the DOT text alone. A graph the scheduler rejects prints
//! `{"error": ...}` and exits with status 1; a usage error exits with status 2.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

use sched::fixture::GraphFile;

const USAGE: &str =
    "usage: plan-inspector [--debug] [--svg OUT.svg] [--dot OUT.dot] FILE.graph.json";

fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

struct Args {
    debug: bool,
    svg: Option<PathBuf>,
    dot: Option<PathBuf>,
    file: String,
}

fn parse() -> Result<Option<Args>, String> {
    let (mut debug, mut svg, mut dot, mut file) = (false, None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--debug" => debug = true,
            "--svg" => svg = Some(PathBuf::from(it.next().ok_or("--svg needs a file")?)),
            "--dot" => dot = Some(PathBuf::from(it.next().ok_or("--dot needs a file")?)),
            "-h" | "--help" => return Ok(None),
            _ if file.is_none() && !a.starts_with("--") => file = Some(a),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    let file = file.ok_or("no graph file given")?;
    Ok(Some(Args {
        debug,
        svg,
        dot,
        file,
    }))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("plan-inspector: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let file = &args.file;
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            println!("{}", error_json(&format!("{file}: {e}")));
            return ExitCode::from(1);
        }
    };
    let graph = match GraphFile::from_json(&text) {
        Ok(g) => g,
        Err(e) => {
            println!("{}", error_json(&e.to_string()));
            return ExitCode::from(1);
        }
    };
    if args.svg.is_some() || args.dot.is_some() {
        let title = std::path::Path::new(file)
            .file_name()
            .map_or(file.clone(), |n| n.to_string_lossy().into_owned());
        let dot = match graph.dot(&title) {
            Ok(d) => d,
            Err(e) => {
                println!("{}", error_json(&e.to_string()));
                return ExitCode::from(1);
            }
        };
        if let Some(out) = &args.dot
            && let Err(e) = std::fs::write(out, &dot)
        {
            eprintln!("plan-inspector: {}: {e}", out.display());
            return ExitCode::from(1);
        }
        if let Some(out) = &args.svg {
            if let Err(e) = sched::dot::render(&dot, out) {
                eprintln!("plan-inspector: {e}");
                return ExitCode::from(1);
            }
            eprintln!("plan-inspector: wrote {}", out.display());
        }
    }
    let result = if args.debug {
        graph.debug_layout()
    } else {
        graph.plan().map(|p| p.to_json())
    };
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
