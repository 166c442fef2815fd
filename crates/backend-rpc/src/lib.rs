//! Remote devices over TCP, wire-compatible with ggml's `rpc-server` (RPC protocol 7.0.0): the
//! client, and the protocol code our server shares with it.
//!
//! Why speak ggml's protocol instead of our own: users who spread a model over machines
//! already run llama.cpp's `rpc-server` there. This crate lets them use those servers from
//! Rust as ordinary [`backend_core::Device`]s, so the scheduler can place layers on them.
//!
//! Why the server is another crate (`backend-rpc-server`, with the `rpc-server` binary): a
//! program that only offloads to remote devices should not compile a CPU backend, its kernels
//! and a log subscriber. This crate depends on `graph` and `backend-core` only; the server
//! crate depends on it for the byte format, so both sides encode and decode every message with
//! the same code.
//!
//! * [`wire`]: framing, commands, `rpc_tensor`, graph serialization (byte-exact with ggml).
//! * [`mapping`]: our ops and types ↔ protocol 7.0.0 numbers, one table.
//! * client: [`connect`] / [`add_server`] give one device per remote device; its buffer type,
//!   buffers and backends send every request through one connection per endpoint.
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
pub mod mapping;
pub mod wire;

pub use client::{RpcConfig, RpcError, add_server, connect, parse_endpoints};
