//! Remote devices over TCP, wire-compatible with ggml's `rpc-server` (RPC protocol 7.0.0),
//! and a hardened server of our own.
//!
//! Why speak ggml's protocol instead of our own: users who spread a model over machines
//! already run llama.cpp's `rpc-server` there. The client half of this crate lets them use those
//! servers from Rust as ordinary [`backend_core::Device`]s, so the scheduler can place layers on
//! them; the server half ([`Server`], binary `rpc-server`) serves our CPU backend over the same
//! protocol and cannot be crashed by a bad packet.
//!
//! * [`wire`]: framing, commands, `rpc_tensor`, graph serialization (byte-exact with ggml).
//! * [`mapping`]: our ops and types ↔ protocol 7.0.0 numbers, one table.
//! * client: [`connect`] / [`add_server`] give one device per remote device; its buffer type,
//!   buffers and backends send every request through one connection per endpoint.
//! * server: [`Server`] and [`Session`] (the per-connection state machine, socket-free).
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
//! use backend_rpc::{add_server, RpcConfig};
//! let devices = add_server("127.0.0.1:50052", &RpcConfig::default())?;
//! let backend = devices[0].init_backend("")?;
//! let buffer = devices[0].buffer_type().alloc_buffer(1 << 20)?;
//! println!("{} with {} bytes remote", backend.name(), buffer.size());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;
mod endpoints;
pub mod mapping;
mod server;
pub mod wire;

pub use client::{RpcConfig, RpcError, add_server, connect, parse_endpoints};
pub use endpoints::{ConnectAllError, EMBEDDED, RemoteDevices, connect_all};
pub use server::{
    BackendFactory, GRAPH_FREE_BYTES, Server, ServerConfig, ServerError, ServerHandle, Session,
};
