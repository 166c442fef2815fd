//! A list of endpoints to devices, with [`EMBEDDED`] standing for our own server in-process.
//!
//! Why here: every program that offloads over RPC (the MiniLM embedder, the Llama decoder)
//! takes a list of `HOST:PORT`s from its user and also offers a server of its own on loopback,
//! so that RPC offload can be tried without starting `rpc-server` by hand. Turning that list
//! into devices is the same everywhere, so it lives next to [`connect`](backend_rpc::connect).

use std::sync::Arc;

use backend_core::Device;

use backend_rpc::{RpcConfig, RpcError};

use crate::{BackendFactory, Server, ServerConfig, ServerHandle};

/// The endpoint that starts our RPC server in this process (loopback, ephemeral port) and
/// connects to it like to any other server.
pub const EMBEDDED: &str = "embedded";

/// Remote devices, each with the endpoint it came from.
pub type RemoteDevices = Vec<(String, Device)>;

/// Why [`connect_all`] failed, naming the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ConnectAllError {
    /// The embedded server could not listen on loopback.
    #[error("{EMBEDDED}: {0}")]
    Spawn(#[source] std::io::Error),
    /// Connecting to the endpoint, or asking it for its devices, failed.
    #[error("{endpoint}: {source}")]
    Connect {
        /// The endpoint (for [`EMBEDDED`], the address its server listens on).
        endpoint: String,
        /// What went wrong.
        #[source]
        source: RpcError,
    },
    /// The server answered but has no devices.
    #[error("{endpoint}: the server has no devices")]
    NoDevices {
        /// The endpoint.
        endpoint: String,
    },
}

impl ConnectAllError {
    /// The endpoint the error is about.
    pub fn endpoint(&self) -> &str {
        match self {
            ConnectAllError::Spawn(_) => EMBEDDED,
            ConnectAllError::Connect { endpoint, .. } | ConnectAllError::NoDevices { endpoint } => {
                endpoint
            }
        }
    }
}

/// Connects to every endpoint in order and returns each remote device with the endpoint it
/// came from, plus the handles of the servers it started.
///
/// An endpoint equal to [`EMBEDDED`] starts a [`Server`] for `local` (each connection computing
/// on `local.init_backend("n_threads={threads}")`) on `127.0.0.1:0` and connects to it; its
/// devices are listed under the address it listens on. Dropping a returned [`ServerHandle`]
/// stops that server, so keep the handles as long as the devices are in use.
///
/// ```
/// use backend_rpc::RpcConfig;
/// use backend_rpc_server::{EMBEDDED, connect_all};
/// let local = backend_cpu::cpu_device();
/// let (devices, _servers) = connect_all(&[EMBEDDED], &local, 1, &RpcConfig::default())?;
/// let (endpoint, device) = &devices[0];
/// assert!(endpoint.starts_with("127.0.0.1:"));
/// let backend = device.init_backend("")?;
/// println!("{} at {endpoint}", backend.name());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connect_all<S: AsRef<str>>(
    endpoints: &[S],
    local: &Device,
    threads: usize,
    config: &RpcConfig,
) -> Result<(RemoteDevices, Vec<ServerHandle>), ConnectAllError> {
    let mut devices = Vec::new();
    let mut servers = Vec::new();
    for endpoint in endpoints {
        let endpoint = endpoint.as_ref();
        let endpoint = if endpoint == EMBEDDED {
            let handle = embedded(local, threads)?;
            let at = handle.endpoint();
            servers.push(handle);
            at
        } else {
            endpoint.to_owned()
        };
        let found =
            backend_rpc::connect(&endpoint, config).map_err(|source| ConnectAllError::Connect {
                endpoint: endpoint.clone(),
                source,
            })?;
        if found.is_empty() {
            return Err(ConnectAllError::NoDevices { endpoint });
        }
        devices.extend(found.into_iter().map(|d| (endpoint.clone(), d)));
    }
    Ok((devices, servers))
}

/// Starts our server for `local` on a loopback port.
fn embedded(local: &Device, threads: usize) -> Result<ServerHandle, ConnectAllError> {
    let device = local.clone();
    let factory: BackendFactory =
        Arc::new(move || device.init_backend(&format!("n_threads={threads}")));
    let server = Server::new(local.clone(), factory, ServerConfig::default());
    let handle = server
        .spawn("127.0.0.1:0")
        .map_err(ConnectAllError::Spawn)?;
    tracing::info!(endpoint = %handle.endpoint(), "embedded RPC server started (our CPU backend)");
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_endpoint_is_named_in_the_error() {
        // A port nobody listens on: bind, note the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = format!("127.0.0.1:{port}");
        let local = backend_cpu::cpu_device();
        let err = connect_all(&[EMBEDDED, &at], &local, 1, &RpcConfig::default()).unwrap_err();
        assert!(matches!(&err, ConnectAllError::Connect { endpoint, .. } if *endpoint == at));
        assert_eq!(err.endpoint(), at);
        assert!(err.to_string().starts_with(&format!("{at}: ")), "{err}");
    }
}
