//! Our client against our server serving the CPU backend, checked by the conformance kit
//! (contract and every op against the local CPU backend), and a scheduler splitting a graph
//! between the local CPU and the remote server, bit for bit equal to the CPU alone.

use std::sync::Arc;
use std::time::Duration;

use backend_core::{Backend, BufferUsage, Device, tensor_alloc, tensor_get, tensor_set};
use backend_rpc::{RpcConfig, connect};
use backend_rpc_server::{Server, ServerConfig, ServerHandle};
use graph::{Context, ElementType, Graph, TensorId};

fn remote() -> (ServerHandle, Device) {
    let server = Server::new(
        backend_cpu::cpu_device(),
        Arc::new(backend_cpu::init),
        ServerConfig::default(),
    );
    let h = server.spawn("127.0.0.1:0").unwrap();
    let cfg = RpcConfig {
        connect_timeout: Duration::from_secs(2),
        io_timeout: Some(Duration::from_secs(60)),
    };
    let dev = connect(&h.endpoint(), &cfg).unwrap().remove(0);
    (h, dev)
}

#[test]
fn rpc_honours_the_contract() {
    let (_h, dev) = remote();
    let backend = dev.init_backend("").unwrap();
    let host = backend_cpu::init().unwrap();
    conformance::check_contract(&backend, Some(&host)).assert_passed();
}

#[test]
fn rpc_ops_match_the_local_cpu() {
    let (_h, dev) = remote();
    let backend = dev.init_backend("").unwrap();
    // F32 and the fixtures' types only: the client claims every op it can send (protocol 7
    // cannot ask the server what it computes), and our server computes element-wise ops in
    // F32 only; it answers a graph it cannot compute by closing the connection, the protocol
    // having no error reply.
    let opts = conformance::OpOptions {
        claimed_types: false,
        ..conformance::OpOptions::default()
    };
    let report = conformance::check_ops(&backend, &backend_cpu::init().unwrap(), &opts);
    report.assert_passed();
    let passed = report
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, conformance::CaseOutcome::Passed { .. }))
        .count();
    assert!(passed > 50, "only {passed} cases ran:\n{report}");
    // The client refuses exactly one kind of node on purpose: a MUL_MAT whose src1 elements
    // are not contiguous (ggml's rpc-server aborts on it; see `abort_guards.rs`). Everything
    // else must run remotely.
    let unsupported: Vec<&conformance::CaseResult> = report
        .cases
        .iter()
        .filter(|c| c.outcome == conformance::CaseOutcome::Unsupported)
        .collect();
    assert!(
        !unsupported.is_empty(),
        "the transposed-src1 products must be refused"
    );
    for c in unsupported {
        assert!(
            c.op == "MUL_MAT" && c.desc.contains("(transposed b)"),
            "unexpectedly unsupported: {} {}\n{report}",
            c.op,
            c.desc
        );
    }
}

/// Three layers `softmax(w3 · rms_norm(w2 · silu(w1 · x)))`; `w2` placed by `remote_w2`.
struct Mlp {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    out: TensorId,
    _bufs: Vec<backend_core::Buffer>,
}

fn values(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5).to_le_bytes()
        })
        .collect()
}

fn mlp(local: &Backend, w2_buft: &backend_core::BufferType) -> Mlp {
    let mut ctx = Context::new();
    let f = ElementType::F32;
    let w1 = ctx.new_tensor_2d(f, 64, 96).unwrap();
    let w2 = ctx.new_tensor_2d(f, 96, 64).unwrap();
    let w3 = ctx.new_tensor_2d(f, 64, 40).unwrap();
    let mut bufs = Vec::new();
    for (i, (w, buft)) in [
        (w1, local.default_buffer_type()),
        (w2, w2_buft.clone()),
        (w3, local.default_buffer_type()),
    ]
    .into_iter()
    .enumerate()
    {
        let b = buft.alloc_buffer(buft.alloc_size(&ctx[w])).unwrap();
        b.set_usage(BufferUsage::Weights);
        tensor_alloc(&mut ctx, &b, w, 0).unwrap();
        tensor_set(
            &ctx,
            w,
            0,
            &values(ctx[w].nelements() as usize, 100 + i as u64),
        )
        .unwrap();
        bufs.push(b);
    }
    let x = ctx.new_tensor_2d(f, 64, 12).unwrap();
    ctx.set_input(x).unwrap();
    let h = ctx.mul_mat(w1, x).unwrap();
    let h = ctx.silu(h).unwrap();
    let h = ctx.mul_mat(w2, h).unwrap();
    let h = ctx.rms_norm(h, 1e-5).unwrap();
    let h = ctx.mul_mat(w3, h).unwrap();
    let out = ctx.soft_max_ext(h, None, 1.0, 0.0).unwrap();
    ctx.set_output(out).unwrap();
    let mut graph = Graph::new(64);
    graph.build_forward_expand(&mut ctx, out).unwrap();
    Mlp {
        ctx,
        graph,
        x,
        out,
        _bufs: bufs,
    }
}

#[test]
fn scheduler_split_between_local_cpu_and_remote_equals_cpu_alone() {
    let (_h, dev) = remote();
    let cpu = backend_cpu::init().unwrap();
    // the reference: everything in local CPU memory, the CPU backend alone
    let mut r = mlp(&cpu, &cpu.default_buffer_type());
    let mut ga = graph_alloc::GraphAllocator::new(&[cpu.default_buffer_type()]);
    ga.alloc_graph(&mut r.ctx, &r.graph).unwrap();
    // the split: w2 on the server
    let mut m = mlp(&cpu, &dev.buffer_type());
    let mut s = sched::Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu.clone()])
        .graph_size(64)
        .build()
        .unwrap();
    for step in 0..4u64 {
        let input = values(64 * 12, step);
        tensor_set(&r.ctx, r.x, 0, &input).unwrap();
        cpu.graph_compute(&r.ctx, r.graph.as_view()).unwrap();
        let mut want = vec![0u8; r.ctx[r.out].nbytes()];
        tensor_get(&r.ctx, r.out, 0, &mut want).unwrap();

        s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
        let on: Vec<usize> = s.splits().iter().map(|x| x.backend_index()).collect();
        assert!(on.contains(&0) && on.contains(&1), "splits on {on:?}");
        tensor_set(&m.ctx, m.x, 0, &input).unwrap();
        s.graph_compute(&mut m.ctx, &m.graph).unwrap();
        let mut got = vec![0u8; m.ctx[m.out].nbytes()];
        tensor_get(&m.ctx, m.out, 0, &mut got).unwrap();
        assert!(got == want, "step {step}: differs from the CPU alone");
    }
}
