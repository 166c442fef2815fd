//! A hardened server for ggml's RPC protocol 7.0.0 in front of one local device, and the
//! `rpc-server` binary that serves our CPU backend with it.
//!
//! Why a crate of its own: the server and its binary need a CPU backend, its kernels and a log
//! subscriber, which a program that only uses remote devices (the `backend-rpc` client) should
//! not compile. The byte format and the op mapping are `backend-rpc`'s
//! ([`backend_rpc::wire`], [`backend_rpc::mapping`]), so client and server encode and decode
//! every message with the same code.
//!
//! * [`Server`] and [`Session`] (the per-connection state machine, socket-free).
//! * [`connect_all`]: a user's list of endpoints to devices, [`EMBEDDED`] starting our server
//!   in-process.
//!
//! # The `rpc-server` binary
//!
//! ```text
//! rpc-server [--host 127.0.0.1] [--port 50052] [--threads N] [--max-clients 16]
//!            [--max-buffer-mib 16384] [--max-client-mib 65536] [--max-server-mib 65536]
//!            [--max-set-mib 1024] [--idle-timeout-s 0] [--malloc-arenas 1]
//! ```
//!
//! | flag | [`ServerConfig`] field | limits |
//! |---|---|---|
//! | `--max-clients` | `max_clients` | clients served at once; more are refused at accept |
//! | `--max-buffer-mib` | `max_buffer_size` | one buffer |
//! | `--max-client-mib` | `max_client_memory` | all buffers of one client (per-client cap) |
//! | `--max-server-mib` | `max_server_memory` | all buffers of all clients (server cap) |
//! | `--max-set-mib` | `max_set_size` | one SET_TENSOR payload |
//! | `--idle-timeout-s` | `idle_timeout` | silence (or unread answers) before a client is cut; 0 = never |
//! | `--malloc-arenas` | (process) | glibc malloc arenas; 1 by default, 0 = glibc's default |
//!
//! An allocation past a memory cap is refused with the protocol's failure answer (a null
//! buffer); our client turns it into [`backend_core::BackendError::AllocationFailed`] and the
//! connection stays usable. A message past a size limit closes that client's connection only.
//! Every connection has its own thread, so a stalled client holds one slot of `--max-clients`
//! (until the idle timeout, when one is set) and never blocks the others; when a client goes,
//! everything it held is freed and its bytes go back to the server's account, and the binary
//! hands freed pages back to the OS. `cargo xtask rpc-soak` measures all of this under load.
//!
//! ```no_run
//! use backend_rpc_server::{Server, ServerConfig};
//! let device = backend_cpu::cpu_device();
//! let server = Server::new(device, std::sync::Arc::new(backend_cpu::init), ServerConfig::default());
//! let handle = server.spawn("127.0.0.1:0")?;
//! println!("serving on {}", handle.endpoint());
//! # Ok::<(), std::io::Error>(())
//! ```

mod endpoints;
mod server;

pub use endpoints::{ConnectAllError, EMBEDDED, RemoteDevices, connect_all};
pub use server::{
    BackendFactory, GRAPH_FREE_BYTES, Server, ServerConfig, ServerError, ServerHandle, Session,
};
