//! Soak the `rpc-server` binary with load and hostile clients on loopback, and print requests/s,
//! round-trip latency of a one-node graph (p50, p99, max) and the server's resident memory
//! before and after (`cargo xtask rpc-soak [--secs 60] [--clients 32] [--json]`).
//!
//! The server is the `rpc-server` built next to this example (`target/<profile>/rpc-server`;
//! the xtask builds both), or `--server PATH`. The run and its checks are those of the CI test
//! `tests/hostile.rs`, longer: every fault kind again and again while the clients compute. It
//! fails (exit 1) if a client saw a wrong result or an error, the server died or panicked, or
//! its resident memory did not come back to within 5% of the baseline.
//!
//! Output: one line of text on stdout, or one JSON object with `--json`; errors on stderr.
// A command-line program: printing is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/soak/mod.rs"]
mod soak;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: rpc_soak [--secs 60] [--clients 32] [--cap-mib 512] [--idle-timeout-s 2]
                [--elements 256] [--warmup-secs 5] [--server PATH]
                [--server-arg ARG]... [--json]";

struct Args {
    cfg: soak::SoakConfig,
    server: Option<PathBuf>,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        cfg: soak::SoakConfig {
            clients: 32,
            duration: Duration::from_secs(60),
            warmup: Duration::from_secs(5),
            server_cap_mib: 512,
            idle_timeout_s: 2,
            elements: 256,
            extra_args: Vec::new(),
        },
        server: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--json" {
            a.json = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        const VALUED: [&str; 8] = [
            "--secs",
            "--warmup-secs",
            "--clients",
            "--cap-mib",
            "--idle-timeout-s",
            "--elements",
            "--server",
            "--server-arg",
        ];
        if !VALUED.contains(&flag.as_str()) {
            return Err(format!("unknown option {flag}"));
        }
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = || val.parse::<u64>().map_err(|e| format!("{flag} {val}: {e}"));
        match flag.as_str() {
            "--secs" => a.cfg.duration = Duration::from_secs(num()?),
            "--warmup-secs" => a.cfg.warmup = Duration::from_secs(num()?),
            "--clients" => a.cfg.clients = num()?.clamp(1, 1024) as usize,
            "--cap-mib" => a.cfg.server_cap_mib = num()?.max(64),
            "--idle-timeout-s" => a.cfg.idle_timeout_s = num()?.max(1),
            "--elements" => a.cfg.elements = num()?.clamp(1, 1 << 20) as usize,
            "--server" => a.server = Some(PathBuf::from(&val)),
            "--server-arg" => a.cfg.extra_args.push(val),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

/// `rpc-server` next to the directory of this executable (`target/<profile>/examples/..`).
fn sibling_server() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no directory above this executable")?;
    let bin = dir.join("rpc-server");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build it (cargo build --release -p backend-rpc-server --bin rpc-server) or pass --server",
            bin.display()
        ))
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("rpc_soak: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let bin = match args.server.map_or_else(sibling_server, Ok) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rpc_soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "rpc_soak: {} clients for {:?} against {}, server cap {} MiB",
        args.cfg.clients,
        args.cfg.duration,
        bin.display(),
        args.cfg.server_cap_mib
    );
    let r = match soak::soak(&bin, &args.cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rpc_soak: FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", r.json());
    } else {
        println!(
            "{} clients, {:.1} s: {} round trips, {:.0} requests/s; one-node graph p50 {:.2} ms, \
             p99 {:.2} ms, max {:.2} ms; server RSS start {} KiB, before {} KiB, peak {} KiB, \
             after {} KiB; faults stall {} / mid-graph {} / oversized {} / memory hog {} / \
             graph hog {} (hog held {} MiB, {} graph messages held)",
            r.clients,
            r.secs,
            r.requests,
            r.requests_per_s,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.rss_start_kib,
            r.rss_before_kib,
            r.rss_peak_kib,
            r.rss_after_kib,
            r.faults[0],
            r.faults[1],
            r.faults[2],
            r.faults[3],
            r.faults[4],
            r.hog_mib,
            r.graph_hogs_held
        );
    }
    if !r.rss_back_to_baseline(0.05) {
        eprintln!(
            "rpc_soak: FAILED: server RSS {} KiB after, {} KiB before (more than 5% apart)",
            r.rss_after_kib, r.rss_before_kib
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
