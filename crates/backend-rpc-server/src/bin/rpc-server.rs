//! `rpc-server`: our CPU backend served over ggml's RPC protocol 7.0.0.
//!
//! ```text
//! rpc-server [--host 127.0.0.1] [--port 50052] [--threads N] [--max-clients 16]
//!            [--max-buffer-mib 16384] [--max-client-mib 65536] [--max-server-mib 65536]
//!            [--max-set-mib 1024] [--idle-timeout-s 0] [--malloc-arenas 1]
//! ```
//!
//! * `--max-buffer-mib`: largest single buffer a client may allocate.
//! * `--max-client-mib`: most memory (buffers and graph messages) one client may hold at once.
//! * `--max-server-mib`: most memory (buffers and graph messages) all clients together may
//!   hold at once.
//! * `--max-set-mib`: largest SET_TENSOR payload (what one message may make the server buffer).
//! * `--idle-timeout-s`: close a client that sends nothing (or reads nothing) for this long;
//!   it also cuts a client stalled in the middle of a message (0: never).
//! * `--malloc-arenas`: glibc malloc arenas the server's threads share (0: glibc's default of
//!   up to 8 per core, which keeps more freed memory resident).
//!
//! An allocation past a memory cap is answered with the protocol's failure reply (a null
//! buffer): the client gets a typed error and keeps its connection. A message past a size cap
//! closes that client's connection; the other clients are served on.
//! `-H`, `-p`, `-t` are accepted as in ggml's server. Loopback by default: the protocol has no
//! authentication, so anything else is announced with a warning.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use backend_rpc_server::{Server, ServerConfig};

struct Args {
    host: String,
    port: u16,
    threads: usize,
    arenas: u64,
    config: ServerConfig,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 50052,
        threads: backend_cpu::default_n_threads(),
        arenas: 1,
        config: ServerConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        let mib = |m: u64| {
            m.checked_mul(1 << 20)
                .ok_or_else(|| format!("{flag} {m}: too large"))
        };
        match flag.as_str() {
            "-H" | "--host" => a.host = val,
            "-p" | "--port" => a.port = num(&val)?.try_into().map_err(|_| "port > 65535")?,
            "-t" | "--threads" => a.threads = num(&val)?.max(1) as usize,
            "--max-clients" => a.config.max_clients = num(&val)?.max(1) as usize,
            "--max-buffer-mib" => a.config.max_buffer_size = mib(num(&val)?)?,
            "--max-client-mib" => a.config.max_client_memory = mib(num(&val)?)?,
            "--max-server-mib" => a.config.max_server_memory = mib(num(&val)?)?,
            "--max-set-mib" => a.config.max_set_size = mib(num(&val)?)?,
            "--malloc-arenas" => a.arenas = num(&val)?,
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
                 [--max-buffer-mib M] [--max-client-mib M] [--max-server-mib M] \
                 [--max-set-mib M] [--idle-timeout-s S] [--malloc-arenas N]"
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
    // Clients allocate and free buffers all day: have large buffers come straight from the
    // kernel, keep small allocations in the main arena (`malloc_trim` leaves the free top pages
    // of glibc's other arenas resident, up to 8 arenas per core), and give freed pages back
    // whenever clients went away, so the server's resident memory follows what its clients
    // hold now rather than the peak of every past client (`cargo xtask rpc-soak` checks it;
    // with two arenas it came back within 3-8%, with one within 1%).
    let _ = backend_cpu::return_large_frees_to_os(1 << 20);
    if args.arenas > 0 {
        let _ = backend_cpu::limit_heap_arenas(args.arenas as usize);
    }
    let server = Server::new(device, factory, args.config);
    let watched = server.clone();
    let trimmer = std::thread::Builder::new()
        .name("rpc-trim".into())
        .spawn(move || {
            let mut seen = 0;
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let ended = watched.sessions_ended();
                if ended != seen {
                    seen = ended;
                    backend_cpu::release_free_memory();
                }
            }
        });
    if let Err(e) = trimmer {
        tracing::warn!(error = %e, "no memory trimming thread");
    }
    server.serve(listener);
    ExitCode::SUCCESS
}
