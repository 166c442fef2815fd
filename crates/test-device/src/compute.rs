//! Computing nodes on the device: the CPU kernels, pointed at device memory.
//!
//! Why the CPU kernels: the device must compute for real (a scheduler test that only moves
//! bytes proves nothing), and computing with the very kernels the CPU backend uses makes a
//! graph split between the two bit-for-bit comparable with the CPU alone. The kernels reach
//! device memory through a [`MemoryResolver`] that answers only for this device's buffers,
//! and only while the caller holds the device's bus, so a node whose tensors live in host
//! memory (or on another device) fails with an error, as on a real accelerator.

use std::ptr::NonNull;
use std::sync::Arc;

use backend_core::{BackendError, Buffer, ComputeStatus, Result};
use cpu_kernels::{ComputeOptions, CpuCompute, MemoryResolver};
use graph::{Context, GraphView, TensorId};

use crate::buffer::TestBuffer;
use crate::device::Core;
use crate::memory::BusGuard;

/// Whether the kernels compute the op of `op` (the device's configured op list is applied
/// by the caller, `TestDevice::supports_op`).
pub(crate) fn kernels_support(ctx: &Context, op: TensorId) -> bool {
    cpu_kernels::supports_op(ctx, op)
}

/// Resolves this device's buffers to their memory while the bus is held.
struct DeviceMemory<'a> {
    core: &'a Arc<Core>,
    bus: &'a BusGuard<'a>,
}

// SAFETY: a pointer is returned only for a `TestBuffer` of this device; it is the base of its
// `DeviceAlloc`, valid for the allocation's size, which is the buffer's size. The allocation
// lives as long as the buffer, which the compute's context keeps alive through the tensors'
// storage handles for the whole call. `self.bus` proves the device's bus is held for the
// whole call, and every other access to device memory (transfers, other streams' computes)
// takes that bus first, so only the kernels touch the bytes meanwhile.
unsafe impl MemoryResolver for DeviceMemory<'_> {
    fn base_ptr(&self, buffer: &Buffer) -> Option<NonNull<u8>> {
        let tb = buffer
            .implementation()?
            .as_any()
            .downcast_ref::<TestBuffer>()?;
        if !Arc::ptr_eq(&tb.core, self.core) {
            return None; // another device's memory
        }
        debug_assert_eq!(tb.mem.size(), buffer.size());
        Some(tb.mem.base_ptr(self.bus))
    }
}

/// Compute `nodes` of `ctx` in order, on the worker, each after its configured latency and
/// under the bus.
pub(crate) fn run_nodes(
    core: &Arc<Core>,
    kernels: &CpuCompute,
    ctx: &Context,
    nodes: &[TensorId],
) -> Result<()> {
    let opts = ComputeOptions {
        n_threads: core.config.compute_threads,
        abort: None,
    };
    for id in nodes {
        let op = ctx.get(*id)?.op();
        if crate::backend::is_noop(op) {
            continue;
        }
        let latency = core.config.latency_of(op);
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let bus = core.bus.lock();
        let mem = DeviceMemory { core, bus: &bus };
        let one = std::slice::from_ref(id);
        match kernels.compute_resolved(ctx, GraphView::new(one, &[]), &opts, &mem)? {
            ComputeStatus::Success => {}
            other => {
                return Err(BackendError::failed(
                    &core.config.name,
                    format!("kernels stopped with {other:?} without an abort callback"),
                ));
            }
        }
    }
    Ok(())
}
