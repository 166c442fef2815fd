//! Nodes whose sources were rewired with `Context::set_src` after construction: the shapes
//! the constructor checked no longer hold, so `supports_op` must refuse what the kernels
//! cannot index, and the compute must return a typed error instead of panicking.

mod common;

use backend_core::BackendError;
use common::*;
use cpu_kernels::CpuCompute;
use graph::{Context, ElementType as T, Graph};

/// Rope whose positions were swapped for an i32 tensor with enough elements along
/// dimension 0 but an empty dimension 1: the kernel reads `pos[i2, 0, 0, 0]`.
#[test]
fn rope_with_empty_rewired_positions_is_refused() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_3d(T::F32, 4, 2, 3).unwrap();
    let pos = ctx.new_tensor_1d(T::I32, 3).unwrap();
    let r = ctx.rope(a, pos, 4, 0).unwrap();
    let empty = ctx.new_tensor_2d(T::I32, 3, 0).unwrap();
    ctx.set_src(r, 1, Some(empty)).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, r).unwrap();
    let _buf = alloc_all(&mut ctx);
    set_f32(&ctx, a, &[1.0; 24]);
    assert!(!cpu_kernels::supports_op(&ctx, r));
    let cpu = CpuCompute::new(1);
    let e = cpu.compute(&ctx, g.as_view(), None).unwrap_err();
    assert!(matches!(e, BackendError::UnsupportedOp { .. }), "{e}");
    // Positions of the right shape again: the same context and engine compute.
    ctx.set_src(r, 1, Some(pos)).unwrap();
    set_i32(&ctx, pos, &[0, 1, 2]);
    cpu.compute(&ctx, g.as_view(), None).unwrap();
    assert_eq!(read(&ctx, r)[..4], [1.0; 4]);
}

/// A transposed q8_0 matrix has rows of 36 elements, not whole 32-element blocks: the block
/// kernels filled only the whole blocks and left the rest of each row as stale scratch (a
/// silent wrong result). Reading rows of it and multiplying by it are refused. (Copying into
/// it is refused by the graph already: the copy's result would be a q8_0 row of 36.)
#[test]
fn quantized_rows_of_partial_blocks_are_refused() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(T::Q8_0, 32, 36).unwrap();
    let wt = ctx.transpose(w).unwrap();
    let rows = ctx.new_tensor_1d(T::I32, 2).unwrap();
    let got = ctx.get_rows(wt, rows).unwrap();
    let y = ctx.new_tensor_2d(T::F32, 36, 3).unwrap();
    let prod = ctx.mul_mat(wt, y).unwrap();
    let _buf = alloc_all(&mut ctx);
    set_i32(&ctx, rows, &[0, 1]);
    let cpu = CpuCompute::new(1);
    for node in [got, prod] {
        assert!(
            !cpu_kernels::supports_op(&ctx, node),
            "{:?}",
            ctx[node].op()
        );
        let mut g = Graph::new(8);
        g.build_forward_expand(&mut ctx, node).unwrap();
        let e = cpu.compute(&ctx, g.as_view(), None).unwrap_err();
        assert!(matches!(e, BackendError::UnsupportedOp { .. }), "{e}");
    }
}
