//! A real ggml `rpc-server` (built by `.ci/rpc-server-build.sh`, path in `RPC_SERVER_BIN`) on
//! a free loopback port, killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running server; `.1` is its `HOST:PORT`.
pub struct Real(pub Child, pub String);

impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the server, or says on stderr why the test is skipped and returns `None`.
///
/// Under CI (`CI` set) a missing `RPC_SERVER_BIN` is a failure, not a skip: a broken server
/// build must not silently remove the interop proof. (Miri cannot start processes: it skips.)
pub fn start() -> Option<Real> {
    let Ok(bin) = std::env::var("RPC_SERVER_BIN") else {
        assert!(
            std::env::var_os("CI").is_none() || cfg!(miri),
            "CI is set but RPC_SERVER_BIN is not: the interop tests need ggml's rpc-server \
             (.ci/rpc-server-build.sh)"
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "skipped: set RPC_SERVER_BIN (see .ci/rpc-server-build.sh) to run the interop tests"
            );
        }
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
        .stdout(Stdio::null())
        // RPC_SERVER_LOG=1 shows the server's own messages (e.g. why it closed a connection).
        .stderr(if std::env::var_os("RPC_SERVER_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("start rpc-server");
    let ep = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    // Poll with connect; ggml's server serves one client at a time and a probe is a client,
    // so wait for the probe's disconnect to be processed.
    while std::net::TcpStream::connect(&ep).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "rpc-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    Some(Real(child, ep))
}
