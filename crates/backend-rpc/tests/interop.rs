//! Our client against a real ggml `rpc-server` (protocol 7.0.0) built from the PyPI sdist by
//! `.ci/rpc-server-build.sh`. Skipped, with a message, when `RPC_SERVER_BIN` is not set; fails
//! instead when `CI` is set.

mod common;

use std::time::Duration;

use backend_core::{tensor_alloc, tensor_copy, tensor_get, tensor_memset, tensor_set};
use backend_rpc::{RpcConfig, connect};
use graph::{Context, ElementType, Graph, UnaryOp};

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn from_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn real_server_buffers_and_graphs() {
    let Some(server) = common::real::start() else {
        return;
    };
    let cfg = RpcConfig {
        io_timeout: Some(Duration::from_secs(30)),
        ..RpcConfig::default()
    };
    let dev = connect(&server.1, &cfg).unwrap().remove(0);
    let (free, total) = dev.memory();
    assert!(total > 0 && free <= total);
    let buft = dev.buffer_type();
    assert_eq!(buft.alignment(), 32);
    let backend = dev.init_backend("").unwrap();

    let (m, k, n) = (8usize, 16usize, 4usize);
    let mut ctx = Context::new();
    let a = ctx
        .new_tensor_2d(ElementType::F32, k as i64, m as i64)
        .unwrap();
    let b = ctx
        .new_tensor_2d(ElementType::F32, k as i64, n as i64)
        .unwrap();
    let mm = ctx.mul_mat(a, b).unwrap(); // m x n
    let c = ctx
        .new_tensor_2d(ElementType::F32, m as i64, n as i64)
        .unwrap();
    let s = ctx.add(mm, c).unwrap();
    let r = ctx.unary(s, UnaryOp::Relu).unwrap();
    let sc = ctx.scale(r, 0.5).unwrap();
    let cp = ctx
        .new_tensor_2d(ElementType::F32, m as i64, n as i64)
        .unwrap();
    ctx.set_output(sc).unwrap();
    let buf = buft.alloc_buffer(8192).unwrap();
    for (i, t) in [a, b, mm, c, s, r, sc, cp].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 1024 * i).unwrap();
    }
    let av: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let bv: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
    let cv: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.125 - 1.0).collect();
    tensor_set(&ctx, a, 0, &f32s(&av)).unwrap();
    tensor_set(&ctx, b, 0, &f32s(&bv)).unwrap();
    tensor_set(&ctx, c, 0, &f32s(&cv)).unwrap();
    let mut back = vec![0u8; m * k * 4];
    tensor_get(&ctx, a, 0, &mut back).unwrap();
    assert_eq!(from_f32s(&back), av);

    let mut g = Graph::default();
    g.build_forward_expand(&mut ctx, sc).unwrap();
    backend.graph_compute(&ctx, g.as_view()).unwrap();
    let mut out = vec![0u8; m * n * 4];
    tensor_get(&ctx, sc, 0, &mut out).unwrap();
    // Naive reference: out[j][i] = 0.5 * relu(sum_l a[i][l] * b[j][l] + c[j][i]).
    let got = from_f32s(&out);
    for j in 0..n {
        for i in 0..m {
            let dot: f32 = (0..k).map(|l| av[i * k + l] * bv[j * k + l]).sum();
            let want = 0.5 * (dot + cv[j * m + i]).max(0.0);
            assert!(
                (got[j * m + i] - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{i},{j}"
            );
        }
    }
    // Server-side copy, memset, clear.
    tensor_copy(&ctx, sc, cp).unwrap();
    let mut o2 = vec![0u8; m * n * 4];
    tensor_get(&ctx, cp, 0, &mut o2).unwrap();
    assert_eq!(o2, out);
    tensor_memset(&ctx, cp, 0, 0, 16).unwrap();
    tensor_get(&ctx, cp, 0, &mut o2).unwrap();
    assert!(o2[..16].iter().all(|&x| x == 0));
    assert_eq!(o2[16..], out[16..]);
    buf.clear(0).unwrap();
    tensor_get(&ctx, sc, 0, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0));
}
