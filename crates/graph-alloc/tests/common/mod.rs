//! Helpers shared by the integration tests.
#![allow(dead_code)]

use backend_core::BufferType;
use graph::{Context, TensorId};
use graph_alloc::alloc_ctx_tensors;
use test_fixtures::FakeBufferType;

/// A CPU-like buffer type: alignment 32, unbounded.
pub fn cpu_like() -> BufferType {
    FakeBufferType::new("CPU", 32).into_buffer_type()
}

/// Offset of `id` inside its buffer (panics if unallocated: a test failure).
pub fn off(ctx: &Context, id: TensorId) -> usize {
    ctx[id]
        .storage()
        .unwrap_or_else(|| panic!("{id:?} ({}) has no storage", ctx[id].name()))
        .offset
}

/// Give `ids` storage in a separate weights buffer, so the graph allocator ignores them.
pub fn preallocate(ctx: &mut Context, ids: &[TensorId]) {
    let buft = FakeBufferType::new("weights", 32).into_buffer_type();
    let buf = alloc_ctx_tensors(ctx, ids.iter().copied(), &buft)
        .expect("weights")
        .expect("something to allocate");
    // tensors keep the buffer alive through their storage
    drop(buf);
}
