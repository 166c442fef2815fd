//! `rpc-server`: our CPU backend served over ggml's RPC protocol 7.0.0.
//!
//! ```text
//! rpc-server [--host 127.0.0.1] [--port 50052] [--threads N] [--max-clients 16]
//!            [--max-buffer-mib 16384] [--max-client-mib 65536] [--idle-timeout-s 0]
//! ```
//! `-H`, `-p`, `-t` are accepted as in ggml's server. Loopback by default: the protocol has no
//! authentication, so anything else is announced with a warning.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use backend_rpc::{Server, ServerConfig};

struct Args {
    host: String,
    port: u16,
    threads: usize,
    config: ServerConfig,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 50052,
        threads: backend_cpu::default_n_threads(),
        config: ServerConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "-H" | "--host" => a.host = val,
            "-p" | "--port" => a.port = num(&val)?.try_into().map_err(|_| "port > 65535")?,
            "-t" | "--threads" => a.threads = num(&val)?.max(1) as usize,
            "--max-clients" => a.config.max_clients = num(&val)?.max(1) as usize,
            "--max-buffer-mib" => a.config.max_buffer_size = num(&val)? << 20,
            "--max-client-mib" => a.config.max_client_memory = num(&val)? << 20,
            "--idle-timeout-s" => {
                let s = num(&val)?;
                a.config.idle_timeout = (s > 0).then(|| Duration::from_secs(s));
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                tracing::error!("{e}");
            }
            tracing::info!(
                "usage: rpc-server [--host H] [--port P] [--threads T] [--max-clients N] \
                 [--max-buffer-mib M] [--max-client-mib M] [--idle-timeout-s S]"
            );
            return ExitCode::from(2);
        }
    };
    let addr = format!("{}:{}", args.host, args.port);
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    if !listener.local_addr().is_ok_and(|a| a.ip().is_loopback()) {
        tracing::warn!(%addr, "listening beyond loopback: the RPC protocol has no authentication");
    }
    let threads = args.threads;
    let device = backend_cpu::cpu_device();
    let factory = Arc::new(move || {
        let b = backend_cpu::init()?;
        if let Some(cpu) = backend_cpu::CpuBackend::from_backend(&b) {
            cpu.set_n_threads(threads);
        }
        Ok(b)
    });
    tracing::info!(
        endpoint = %listener.local_addr().map_or(addr.clone(), |a| a.to_string()),
        threads,
        device = device.description(),
        "rpc-server (protocol 7.0.0) serving the CPU backend"
    );
    Server::new(device, factory, args.config).serve(listener);
    ExitCode::SUCCESS
}
