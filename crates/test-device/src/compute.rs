//! Computing nodes on the device: the CPU kernels, pointed at device memory.

use std::sync::Arc;

use backend_core::{BackendError, Result};
use graph::{Context, TensorId};

use crate::device::Core;

/// Whether the kernels compute the op of `op`. Until the CPU kernels crate takes a pointer
/// resolver (see the crate's report), the device computes nothing and says so: only `NONE`
/// and view ops, which compute nothing.
pub(crate) fn kernels_support(ctx: &Context, op: TensorId) -> bool {
    ctx.get(op).is_ok_and(|t| crate::backend::is_noop(t.op()))
}

/// Compute `nodes` of `ctx` in order, on the worker, each after its configured latency and
/// under the bus.
pub(crate) fn run_nodes(core: &Arc<Core>, ctx: &Context, nodes: &[TensorId]) -> Result<()> {
    for &id in nodes {
        let op = ctx.get(id)?.op();
        if crate::backend::is_noop(op) {
            continue;
        }
        let latency = core.config.latency_of(op);
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let _bus = core.bus.lock();
        return Err(BackendError::UnsupportedOp {
            backend: core.config.name.clone(),
            op: op.name(),
            tensor: id,
        });
    }
    Ok(())
}
