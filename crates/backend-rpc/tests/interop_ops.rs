//! Every op the fixtures use, computed by a real ggml `rpc-server` through our client and
//! compared with our CPU backend, node by node, with the conformance kit's NMSE limits.
//!
//! Two parts: the kit's own op cases (`conformance::check_ops`, the remote backend against
//! the local CPU), and the fixture ops or parameters the kit does not cover — matrix products
//! with q8_0/q4_0 weights, SOFT_MAX with ALiBi (`max_bias`), and ops reading through VIEWs
//! with offsets and strides and through RESHAPE — compared the same way
//! ([`graph_copy::compare_graph_backends_with`] and [`conformance::nmse_threshold`]).
//! At the end every fixture op must have passed at least once: an op the client declined
//! (`supports_op` false) would otherwise go unnoticed. Skipped, with a message, when
//! `RPC_SERVER_BIN` is not set; fails instead when `CI` is set.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use backend_core::{Backend, Buffer, tensor_get, tensor_set};
use backend_rpc::{RpcConfig, connect};
use conformance::{CaseOutcome, OpOptions, check_ops, nmse_threshold};
use graph::{Context, ElementType, Graph, Op, TensorId};
use graph_copy::{CopyOptions, compare_graph_backends_with};

/// `UNARY(SILU)` for unary ops, the op name otherwise (the kit's labels).
fn label(op: Op) -> String {
    match op {
        Op::Unary(u) => format!("UNARY({})", u.name()),
        other => other.name().to_owned(),
    }
}

/// Σ(a−b)² / Σa², written here from the definition (Σ(a−b)² when `a` is all zeros).
fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        assert_eq!(x.is_finite(), y.is_finite(), "{x} vs {y}");
        if x.is_finite() {
            num += (f64::from(x) - f64::from(y)).powi(2);
            den += f64::from(x).powi(2);
        }
    }
    if den > 0.0 { num / den } else { num }
}

/// Deterministic values in [lo, hi).
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// One extra case: a graph whose leafs are filled by `inputs` (f32 values, converted to the
/// leaf's type: f32, f16 or i32).
struct Case {
    desc: &'static str,
    ctx: Context,
    out: TensorId,
    inputs: Vec<(TensorId, f32, f32)>,
}

fn build(
    desc: &'static str,
    f: impl FnOnce(&mut Context) -> (TensorId, Vec<(TensorId, f32, f32)>),
) -> Case {
    let mut ctx = Context::new();
    let (out, inputs) = f(&mut ctx);
    Case {
        desc,
        ctx,
        out,
        inputs,
    }
}

fn extra_cases() -> Vec<Case> {
    use ElementType::{F16, F32, I32, Q4_0, Q8_0};
    let mut v = Vec::new();
    for ty in [Q8_0, Q4_0] {
        for (ane, bne) in [([64i64, 16, 1], [64i64, 7, 1]), ([96, 8, 2], [96, 5, 2])] {
            v.push(build(
                if ty == Q8_0 {
                    "a q8_0 (cpy from f32) x b f32"
                } else {
                    "a q4_0 (cpy from f32) x b f32"
                },
                |c| {
                    let a32 = c.new_tensor(F32, &ane).unwrap();
                    let aq = c.new_tensor(ty, &ane).unwrap();
                    let a = c.cpy(a32, aq).unwrap();
                    let b = c.new_tensor(F32, &bne).unwrap();
                    (
                        c.mul_mat(a, b).unwrap(),
                        vec![(a32, -1.0, 1.0), (b, -1.0, 1.0)],
                    )
                },
            ));
        }
        v.push(build("get_rows from quantized", |c| {
            let a32 = c.new_tensor(F32, &[64, 10]).unwrap();
            let aq = c.new_tensor(ty, &[64, 10]).unwrap();
            let a = c.cpy(a32, aq).unwrap();
            let r = c.new_tensor(I32, &[6]).unwrap();
            (
                c.get_rows(a, r).unwrap(),
                vec![(a32, -1.0, 1.0), (r, 0.0, 10.0)],
            )
        }));
    }
    for mt in [F32, F16] {
        v.push(build(
            "soft_max mask, scale 0.125, max_bias 8 (alibi, 4 heads)",
            |c| {
                let x = c.new_tensor(F32, &[32, 6, 4]).unwrap();
                let m = c.new_tensor(mt, &[32, 6]).unwrap();
                let y = c.soft_max_ext(x, Some(m), 0.125, 8.0).unwrap();
                (y, vec![(x, -4.0, 4.0), (m, -2.0, 0.0)])
            },
        ));
    }
    v.push(build(
        "cont(view_2d with row stride and byte offset)",
        |c| {
            let x = c.new_tensor(F32, &[16, 10]).unwrap();
            let w = c.view_2d(x, 8, 5, 16 * 4, (2 * 16 + 4) * 4).unwrap();
            (c.cont(w).unwrap(), vec![(x, -1.0, 1.0)])
        },
    ));
    v.push(build("mul_mat(view of weight rows at an offset, b)", |c| {
        let w = c.new_tensor(F32, &[32, 12]).unwrap();
        let rows = c.view_2d(w, 32, 6, 32 * 4, 3 * 32 * 4).unwrap();
        let b = c.new_tensor(F32, &[32, 4]).unwrap();
        (
            c.mul_mat(rows, b).unwrap(),
            vec![(w, -1.0, 1.0), (b, -1.0, 1.0)],
        )
    }));
    v.push(build(
        "add(reshape [16,6]->[32,3], b), scale(view_1d at offset)",
        |c| {
            let x = c.new_tensor(F32, &[16, 6]).unwrap();
            let r = c.reshape_2d(x, 32, 3).unwrap();
            let b = c.new_tensor(F32, &[32, 1]).unwrap();
            let s = c.add(r, b).unwrap();
            let tail = c.view_1d(s, 40, 24 * 4).unwrap();
            (
                c.scale(tail, -1.5).unwrap(),
                vec![(x, -1.0, 1.0), (b, -1.0, 1.0)],
            )
        },
    ));
    v.push(build(
        "rms_norm(transpose) cont, permute 1023 into mul",
        |c| {
            let x = c.new_tensor(F32, &[8, 16]).unwrap();
            let t = c.transpose(x).unwrap();
            let tc = c.cont(t).unwrap();
            let n = c.rms_norm(tc, 1e-6).unwrap();
            let y = c.new_tensor(F32, &[8, 16]).unwrap();
            let p = c.permute(y, [1, 0, 2, 3]).unwrap();
            let pc = c.cont(p).unwrap();
            (c.mul(n, pc).unwrap(), vec![(x, -1.0, 1.0), (y, -1.0, 1.0)])
        },
    ));
    v
}

/// Places every tensor of `g` in one buffer of `backend`'s default type (views get their
/// roots' storage) and fills the inputs.
fn place(case: &mut Case, g: &Graph, backend: &Backend) -> Buffer {
    let buf = conformance::place_graph(&mut case.ctx, g, backend).unwrap();
    let ctx = &mut case.ctx;
    for (i, &(t, lo, hi)) in case.inputs.iter().enumerate() {
        let n = ctx[t].nelements() as usize;
        let vals = values(n, 1000 + i as u64, lo, hi);
        let bytes: Vec<u8> = match ctx[t].ty() {
            ElementType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ElementType::F16 => vals
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            ElementType::I32 => vals
                .iter()
                .flat_map(|&x| (x as i32).to_le_bytes())
                .collect(),
            other => panic!("no input generator for {other:?}"),
        };
        tensor_set(ctx, t, 0, &bytes).unwrap();
    }
    buf
}

/// A contiguous f32 result, or `None` for other types (quantized CPY results).
fn read_f32(ctx: &Context, id: TensorId) -> Option<Vec<f32>> {
    let t = &ctx[id];
    if t.ty() != ElementType::F32 || !t.is_contiguous() {
        return None;
    }
    let mut raw = vec![0u8; t.nbytes()];
    tensor_get(ctx, id, 0, &mut raw).unwrap();
    Some(
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

#[test]
fn fixture_ops_on_the_real_server_match_our_cpu() {
    let Some(server) = common::real::start() else {
        return;
    };
    let cfg = RpcConfig {
        io_timeout: Some(Duration::from_secs(60)),
        ..RpcConfig::default()
    };
    let dev = connect(&server.1, &cfg).unwrap().remove(0);
    let remote = dev.init_backend("").unwrap();
    let cpu = backend_cpu::init().unwrap();

    // Op label → passed node or case count, for the coverage check at the end.
    let mut passed: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();

    // 1. The kit's cases, in F32 and the fixtures' types only: our client, like ggml's, claims
    // every op it can send (protocol 7 cannot ask the server), and ggml's CPU server aborts
    // its whole process on some element-wise ops in F16 (SCALE), which the kit would run
    // for a backend claiming them.
    let opts = OpOptions {
        claimed_types: false,
        ..OpOptions::default()
    };
    let report = check_ops(&remote, &cpu, &opts);
    if std::env::var_os("RPC_SERVER_LOG").is_some() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("{report}");
        }
    }
    for c in &report.cases {
        match &c.outcome {
            CaseOutcome::Passed { .. } => *passed.entry(c.op.clone()).or_default() += 1,
            CaseOutcome::Failed(m) => failures.push(format!("kit {} {}: {m}", c.op, c.desc)),
            _ => {}
        }
    }

    // 2. What the kit does not cover.
    for mut case in extra_cases() {
        let mut g = Graph::new(32);
        g.build_forward_expand(&mut case.ctx, case.out).unwrap();
        let _buf = place(&mut case, &g, &cpu);
        let mut seen = Vec::new();
        let cmp = compare_graph_backends_with(
            &cpu,
            &remote,
            &case.ctx,
            &g,
            &CopyOptions { guard_bytes: 64 },
            |n| {
                let (Some(a), Some(b)) = (read_f32(n.ctx1, n.id), read_f32(n.ctx2, n.id)) else {
                    return true;
                };
                let e = nmse(&a, &b);
                let limit = nmse_threshold(n.ctx1, n.id);
                let l = label(n.op());
                if std::env::var_os("RPC_SERVER_LOG").is_some() {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!(
                            "  extra: {:<60} node {} {l:<10} nmse {e:.2e} (limit {limit:.0e})",
                            case.desc, n.index
                        );
                    }
                }
                if e <= limit {
                    seen.push(l);
                } else {
                    failures.push(format!(
                        "{}: node {} ({l}) nmse {e:.3e} > {limit:.1e}",
                        case.desc, n.index
                    ));
                }
                true
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.desc));
        assert!(
            cmp.unsupported.is_empty(),
            "{}: {:?}",
            case.desc,
            cmp.unsupported
        );
        assert!(
            cmp.guard_violations.is_empty(),
            "{}: {:?}",
            case.desc,
            cmp.guard_violations
        );
        assert!(
            !seen.is_empty() || !failures.is_empty(),
            "{}: no node was compared",
            case.desc
        );
        for l in seen {
            *passed.entry(l).or_default() += 1;
        }
    }

    assert!(
        failures.is_empty(),
        "{}\n\nkit report:\n{report}",
        failures.join("\n")
    );
    // Every op of the fixtures' table passed somewhere (VIEW/RESHAPE/PERMUTE/TRANSPOSE are
    // not computed; the cases above read through them).
    for op in [
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "SCALE",
        "MUL_MAT",
        "GET_ROWS",
        "RMS_NORM",
        "NORM",
        "SOFT_MAX",
        "ROPE",
        "UNARY(SILU)",
        "UNARY(GELU)",
        "UNARY(RELU)",
        "CONT",
        "DUP",
        "CPY",
    ] {
        assert!(
            passed.get(op).is_some_and(|&n| n > 0),
            "{op} never passed: {passed:?}\n{report}"
        );
    }
    // The kit must not have been skipped wholesale.
    let kit_passed = report
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, CaseOutcome::Passed { .. }))
        .count();
    assert!(
        kit_passed > 50,
        "only {kit_passed} kit cases passed:\n{report}"
    );
}
