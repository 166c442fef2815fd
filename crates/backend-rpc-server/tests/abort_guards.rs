//! Layouts ggml's CPU backend asserts on (aborting a real `rpc-server`) are refused by the
//! client before anything is sent: `supports_op` is false and `graph_compute` returns a typed
//! error, and the connection stays usable.

mod common;

use backend_core::{BackendError, tensor_alloc};
use backend_rpc::{RpcConfig, connect};
use backend_rpc_server::ServerConfig;
use graph::{Context, ElementType, Graph};

#[test]
fn mul_mat_with_transposed_src1_is_refused_before_sending() {
    let server = common::mem_server(ServerConfig::default());
    let handle = server.spawn("127.0.0.1:0").unwrap();
    let dev = connect(&handle.endpoint(), &RpcConfig::default())
        .unwrap()
        .remove(0);

    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ElementType::F32, 64, 16).unwrap();
    let bt = ctx.new_tensor_2d(ElementType::F32, 7, 64).unwrap();
    let b = ctx.transpose(bt).unwrap(); // nb[0] = 28 bytes, not 4
    let bad = ctx.mul_mat(a, b).unwrap();
    let bc = ctx.new_tensor_2d(ElementType::F32, 64, 7).unwrap();
    let good = ctx.mul_mat(a, bc).unwrap();
    assert!(!dev.supports_op(&ctx, bad));
    assert!(dev.supports_op(&ctx, good));

    // The memory-only server cannot compute, but the refusal must come from the client: a
    // typed UnsupportedOp naming the node, and the connection still answers afterwards.
    let buf = dev.buffer_type().alloc_buffer(1 << 16).unwrap();
    for (i, t) in [a, bt, bad].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 8192 * i).unwrap();
    }
    backend_core::view_init(&mut ctx, b).unwrap();
    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, bad).unwrap();
    let backend = dev.init_backend("").unwrap();
    let err = backend.graph_compute(&ctx, g.as_view()).unwrap_err();
    assert!(
        matches!(err, BackendError::UnsupportedOp { tensor, .. } if tensor == bad),
        "{err}"
    );
    backend.synchronize().unwrap();
    assert_eq!(dev.buffer_type().alloc_buffer(64).unwrap().size(), 64);
}
