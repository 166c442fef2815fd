//! Every op × type against naive f64 references, contiguous and not, with broadcasting.
//! Tolerances (NMSE): f32 1e-7 (1e-6 where an f32 transcendental dominates? no: all 1e-7
//! unless stated); f16 sources 1e-7 against the f16-rounded inputs, f16/bf16 results 1e-5 /
//! 1e-4 (one rounding of the output); q8_0/q4_0 matrix products 1e-4 (src1 is quantized to
//! q8_0, as ggml does).

mod common;

use common::*;
use graph::{Context, ElementType as T, Graph, Op, RopeParams, TensorId, UnaryOp, rope_mode};

const F32_TOL: f64 = 1e-7;

fn graph_of(ctx: &mut Context, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(256);
    for &o in outs {
        g.build_forward_expand(ctx, o).unwrap();
    }
    g
}

/// Threads to test with: 1 and 2 (under Miri only 2, which exercises the pool: Miri builds
/// lower the per-thread work threshold so small shapes are split too).
const THREADS: &[usize] = if cfg!(miri) { &[2] } else { &[1, 2] };

fn binop(op: Op, x: f64, y: f64) -> f64 {
    match op {
        Op::Add => x + y,
        Op::Sub => x - y,
        Op::Mul => x * y,
        _ => x / y,
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn binary_ops_broadcast_and_strides() {
    // One code path serves all four ops: Miri checks two of them.
    let ops: &[Op] = if cfg!(miri) {
        &[Op::Add, Op::Div]
    } else {
        &[Op::Add, Op::Sub, Op::Mul, Op::Div]
    };
    // (shape of a, shape of b, permute a?)
    let cases: &[([i64; 4], [i64; 4], bool)] = &[
        ([37, 5, 3, 2], [37, 5, 3, 2], false),
        ([37, 5, 3, 2], [37, 1, 1, 1], false),
        ([36, 6, 4, 2], [12, 3, 2, 1], false),
        ([16, 6, 4, 2], [16, 6, 1, 2], true),
    ];
    for &op in ops {
        for (ci, &(na, nb, perm)) in cases.iter().enumerate() {
            for &nth in THREADS {
                let mut ctx = Context::new();
                let a0 = ctx.new_tensor(T::F32, &na).unwrap();
                let b = ctx.new_tensor(T::F32, &nb).unwrap();
                // A permuted a (dims 1 and 2 swapped) has strided rows order.
                let a = if perm {
                    ctx.permute(a0, [0, 2, 1, 3]).unwrap()
                } else {
                    a0
                };
                let b = if perm {
                    // b broadcast over permuted a: needs b.ne to divide a's new extents
                    let bb = ctx.new_tensor(T::F32, &[16, 1, 6, 1]).unwrap();
                    let _ = b;
                    bb
                } else {
                    b
                };
                let c = match op {
                    Op::Add => ctx.add(a, b),
                    Op::Sub => ctx.sub(a, b),
                    Op::Mul => ctx.mul(a, b),
                    _ => ctx.div(a, b),
                }
                .unwrap();
                let g = graph_of(&mut ctx, &[c]);
                let _buf = alloc_all(&mut ctx);
                let mut rng = Rng::new(ci as u64 + 7);
                fill(&ctx, a0, &mut rng);
                fill(&ctx, b, &mut rng);
                compute(&ctx, &g, nth);
                let (va, vb) = (read(&ctx, a), read(&ctx, b));
                let (ane, bne) = (ctx[a].ne(), ctx[b].ne());
                let reference: Vec<f64> = indices(ane)
                    .into_iter()
                    .map(|i| {
                        let j = [0, 1, 2, 3].map(|d| i[d] % bne[d] as usize);
                        binop(op, va[lin(ane, i)], vb[lin(bne, j)]) as f32 as f64
                    })
                    .collect();
                check(
                    &format!("{op} case {ci} nth {nth}"),
                    &read(&ctx, c),
                    &reference,
                    F32_TOL,
                );
            }
        }
    }
}

#[test]
fn binary_in_place_and_transposed_src1() {
    for &nth in THREADS {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(T::F32, 24, 20).unwrap();
        let bt = ctx.new_tensor_2d(T::F32, 20, 24).unwrap();
        let b = ctx.transpose(bt).unwrap(); // [24, 20], strided
        let c = ctx.mul_inplace(a, b).unwrap();
        let g = graph_of(&mut ctx, &[c]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(3);
        fill(&ctx, a, &mut rng);
        fill(&ctx, bt, &mut rng);
        let (va, vb) = (read(&ctx, a), read(&ctx, b));
        compute(&ctx, &g, nth);
        let reference: Vec<f64> = va
            .iter()
            .zip(&vb)
            .map(|(x, y)| (x * y) as f32 as f64)
            .collect();
        check("mul in place", &read(&ctx, a), &reference, 0.0);
        check(
            "mul in place (result view)",
            &read(&ctx, c),
            &reference,
            0.0,
        );
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn elementwise_multithreaded_is_bit_identical() {
    let n = if cfg!(miri) { 32 } else { 4096 };
    let mut outs = Vec::new();
    for nth in [1, 2] {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(T::F32, n, 20).unwrap();
        let b = ctx.new_tensor_1d(T::F32, n).unwrap();
        let c = ctx.add(a, b).unwrap();
        // Miri perturbs transcendental results on purpose, so it checks arithmetic ops only.
        let d = if cfg!(miri) {
            ctx.sqr(c).unwrap()
        } else {
            ctx.silu(c).unwrap()
        };
        let e = ctx.scale(d, 0.3).unwrap();
        let f = if cfg!(miri) {
            ctx.div(e, b).unwrap()
        } else {
            ctx.gelu(e).unwrap()
        };
        let g = graph_of(&mut ctx, &[f]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(11);
        fill(&ctx, a, &mut rng);
        fill(&ctx, b, &mut rng);
        compute(&ctx, &g, nth);
        outs.push(bytes(&ctx, f));
    }
    assert_eq!(outs[0], outs[1]);
}

fn unary_ref(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Abs => x.abs(),
        UnaryOp::Neg => -x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Exp => x.exp(),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        _ => unreachable!(),
    }
}

/// erf by its Maclaurin series (|x| ≤ 3 here), independent of the kernel's libm.
fn erf(x: f64) -> f64 {
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0f64;
    while term.abs() > 1e-17 || n < 5.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
        if n > 200.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn unary_sqr_sqrt_scale() {
    let all = UnaryOp::ALL;
    let unary: &[UnaryOp] = if cfg!(miri) { &all[..3] } else { &all };
    for &u in unary {
        for &nth in THREADS {
            let mut ctx = Context::new();
            let a = ctx.new_tensor_3d(T::F32, 40, 7, 3).unwrap();
            let c = ctx.unary(a, u).unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            let mut rng = Rng::new(5);
            // spread inputs over [-3, 3)
            let vals: Vec<f32> = (0..40 * 7 * 3).map(|_| 3.0 * rng.f()).collect();
            set_f32(&ctx, a, &vals);
            compute(&ctx, &g, nth);
            let reference: Vec<f64> = read(&ctx, a).iter().map(|&x| unary_ref(u, x)).collect();
            check(u.name(), &read(&ctx, c), &reference, F32_TOL);
        }
    }
    let mut ctx = Context::new();
    let a0 = ctx.new_tensor_2d(T::F32, 12, 9).unwrap();
    let a = ctx.transpose(a0).unwrap();
    let s = ctx.sqr(a).unwrap();
    let q = ctx.sqrt(s).unwrap();
    let sc = ctx.scale(a0, -1.5).unwrap();
    let g = graph_of(&mut ctx, &[q, sc]);
    let _buf = alloc_all(&mut ctx);
    fill(&ctx, a0, &mut Rng::new(2));
    compute(&ctx, &g, 2);
    let va = read(&ctx, a);
    let sq: Vec<f64> = va.iter().map(|x| ((x * x) as f32) as f64).collect();
    check("sqr transposed", &read(&ctx, s), &sq, F32_TOL);
    let rt: Vec<f64> = sq.iter().map(|x| x.sqrt()).collect();
    check("sqrt", &read(&ctx, q), &rt, F32_TOL);
    let scr: Vec<f64> = read(&ctx, a0).iter().map(|x| x * -1.5).collect();
    check("scale", &read(&ctx, sc), &scr, F32_TOL);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn norms() {
    for rms in [false, true] {
        for &nth in THREADS {
            let mut ctx = Context::new();
            let a0 = ctx.new_tensor_3d(T::F32, 64, 5, 4).unwrap();
            let a = ctx.permute(a0, [0, 2, 1, 3]).unwrap();
            let c = if rms {
                ctx.rms_norm(a, 1e-5)
            } else {
                ctx.norm(a, 1e-5)
            }
            .unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            fill(&ctx, a0, &mut Rng::new(9));
            compute(&ctx, &g, nth);
            let va = read(&ctx, a);
            let mut reference = Vec::new();
            for row in va.chunks(64) {
                let n = row.len() as f64;
                if rms {
                    let ms = row.iter().map(|x| x * x).sum::<f64>() / n;
                    reference.extend(row.iter().map(|x| x / (ms + 1e-5).sqrt()));
                } else {
                    let mean = row.iter().sum::<f64>() / n;
                    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                    reference.extend(row.iter().map(|x| (x - mean) / (var + 1e-5).sqrt()));
                }
            }
            check(
                if rms { "rms_norm" } else { "norm" },
                &read(&ctx, c),
                &reference,
                F32_TOL,
            );
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn soft_max_variants() {
    // (mask type, mask ne2, max_bias)
    let cases = [
        (None, 1, 0.0f32),
        (Some(T::F32), 1, 0.0),
        (Some(T::F16), 1, 0.0),
        (Some(T::F32), 3, 8.0),
        (Some(T::F16), 1, 8.0),
    ];
    // Miri: the two mask types, with and without ALiBi, on a smaller shape.
    let cases: &[_] = if cfg!(miri) {
        &[cases[2], cases[3]]
    } else {
        &cases
    };
    for (ci, &(mty, m2, max_bias)) in cases.iter().enumerate() {
        for &nth in THREADS {
            let mut ctx = Context::new();
            let (ne0, ne1, ne2, ne3) = if cfg!(miri) {
                (9, 2, 6, 1)
            } else {
                (33, 6, 6, 2)
            };
            let a = ctx.new_tensor_4d(T::F32, ne0, ne1, ne2, ne3).unwrap();
            let mask = mty.map(|ty| ctx.new_tensor_4d(ty, ne0, ne1 + 2, m2, 1).unwrap());
            let scale = 0.7;
            let c = ctx.soft_max_ext(a, mask, scale, max_bias).unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            let mut rng = Rng::new(ci as u64);
            fill(&ctx, a, &mut rng);
            if let Some(m) = mask {
                fill(&ctx, m, &mut rng);
            }
            compute(&ctx, &g, nth);
            let va = read(&ctx, a);
            let vm = mask.map(|m| read(&ctx, m));
            let mne = mask.map(|m| ctx[m].ne());
            let n_head = ne2 as u32;
            let nhl2 = 1u32 << n_head.ilog2();
            let m0 = 2f64.powf(-(max_bias as f64) / nhl2 as f64);
            let m1 = 2f64.powf(-(max_bias as f64) / 2.0 / nhl2 as f64);
            let mut reference = Vec::new();
            for i3 in 0..ne3 as usize {
                for i2 in 0..ne2 as usize {
                    let slope = if max_bias > 0.0 {
                        let h = i2 as u32;
                        if h < nhl2 {
                            m0.powi(h as i32 + 1)
                        } else {
                            m1.powi(2 * (h - nhl2) as i32 + 1)
                        }
                    } else {
                        1.0
                    };
                    for i1 in 0..ne1 as usize {
                        let mut row: Vec<f64> = (0..ne0 as usize)
                            .map(|i0| {
                                let mut x = va[lin(ctx[a].ne(), [i0, i1, i2, i3])] * scale as f64;
                                if let (Some(vm), Some(mne)) = (&vm, mne) {
                                    x += slope
                                        * vm[lin(
                                            mne,
                                            [i0, i1, i2 % mne[2] as usize, i3 % mne[3] as usize],
                                        )];
                                }
                                x
                            })
                            .collect();
                        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let s: f64 = row.iter().map(|x| (x - mx).exp()).sum();
                        row.iter_mut().for_each(|x| *x = (*x - mx).exp() / s);
                        reference.extend(row);
                    }
                }
            }
            check(
                &format!("soft_max case {ci}"),
                &read(&ctx, c),
                &reference,
                F32_TOL,
            );
        }
    }
}

#[allow(clippy::needless_range_loop)]
fn rope_ref(
    x: &[f64],
    ne: [i64; 4],
    pos: &[i32],
    n_dims: usize,
    neox: bool,
    p: RopeParams,
) -> Vec<f64> {
    let mut out = x.to_vec();
    let theta_scale = (p.freq_base as f64).powf(-2.0 / n_dims as f64);
    let corr_dim = |n_rot: f64| {
        n_dims as f64 * (p.n_ctx_orig as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let lo = corr_dim(p.beta_fast as f64).floor().max(0.0);
    let hi = corr_dim(p.beta_slow as f64).ceil().min(n_dims as f64 - 1.0);
    for i3 in 0..ne[3] as usize {
        for i2 in 0..ne[2] as usize {
            for i1 in 0..ne[1] as usize {
                for i0 in (0..n_dims).step_by(2) {
                    let extrap = pos[i2] as f64 * theta_scale.powi(i0 as i32 / 2);
                    let interp = p.freq_scale as f64 * extrap;
                    let mut theta = interp;
                    let mut ms = p.attn_factor as f64;
                    if p.ext_factor != 0.0 {
                        let y = ((i0 / 2) as f64 - lo) / (hi - lo).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
                        theta = interp * (1.0 - mix) + extrap * mix;
                        ms *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
                    }
                    let (c, s) = (theta.cos() * ms, theta.sin() * ms);
                    let (j0, j1) = if neox {
                        (i0 / 2, i0 / 2 + n_dims / 2)
                    } else {
                        (i0, i0 + 1)
                    };
                    let k0 = lin(ne, [j0, i1, i2, i3]);
                    let k1 = lin(ne, [j1, i1, i2, i3]);
                    out[k0] = x[k0] * c - x[k1] * s;
                    out[k1] = x[k0] * s + x[k1] * c;
                }
            }
        }
    }
    out
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn rope_modes_and_yarn() {
    let yarn = RopeParams {
        n_ctx_orig: 4096,
        freq_base: 10000.0,
        freq_scale: 0.25,
        ext_factor: 1.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let scaled = RopeParams {
        freq_base: 500000.0,
        freq_scale: 0.5,
        attn_factor: 0.9,
        ..RopeParams::default()
    };
    let cases = [
        (rope_mode::NORMAL, 32usize, RopeParams::default()),
        (rope_mode::NEOX, 32, RopeParams::default()),
        (rope_mode::NORMAL, 16, scaled),
        (rope_mode::NEOX, 24, scaled),
        (rope_mode::NORMAL, 32, yarn),
        (rope_mode::NEOX, 32, yarn),
    ];
    for (ci, &(mode, n_dims, p)) in cases.iter().enumerate() {
        for &nth in THREADS {
            let mut ctx = Context::new();
            let ne = [32i64, 4, 5, 1];
            let a = ctx.new_tensor(T::F32, &ne[..3]).unwrap();
            let pos = ctx.new_tensor_1d(T::I32, 5).unwrap();
            let c = ctx.rope_ext(a, pos, n_dims as i32, mode, p).unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            fill(&ctx, a, &mut Rng::new(4));
            let positions = [0, 1, 7, 100, 1234];
            set_i32(&ctx, pos, &positions);
            compute(&ctx, &g, nth);
            let reference = rope_ref(
                &read(&ctx, a),
                ne,
                &positions,
                n_dims,
                mode == rope_mode::NEOX,
                p,
            );
            // f32 sin/cos of large angles built by repeated multiplication: 1e-6 allowed.
            check(&format!("rope case {ci}"), &read(&ctx, c), &reference, 1e-6);
        }
    }
}

#[test]
fn get_rows_all_types() {
    for ty in [T::F32, T::F16, T::BF16, T::Q8_0, T::Q4_0, T::Q4_1, T::I32] {
        for &nth in THREADS {
            let mut ctx = Context::new();
            let a = ctx.new_tensor_3d(ty, 64, 10, 2).unwrap();
            let rows = ctx.new_tensor_2d(T::I32, 4, 2).unwrap();
            let c = ctx.get_rows(a, rows).unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            if ty == T::I32 {
                let v: Vec<i32> = (0..64 * 10 * 2).map(|i| i * 3 - 7).collect();
                set_i32(&ctx, a, &v);
            } else {
                fill(&ctx, a, &mut Rng::new(8));
            }
            let idx = [9, 0, 3, 3, 1, 8, 2, 0];
            set_i32(&ctx, rows, &idx);
            compute(&ctx, &g, nth);
            let va = read(&ctx, a);
            let mut reference = Vec::new();
            for i11 in 0..2 {
                for i10 in 0..4 {
                    let r = idx[i11 * 4 + i10] as usize;
                    for i0 in 0..64 {
                        reference.push(va[lin([64, 10, 2, 1], [i0, r, i11, 0])]);
                    }
                }
            }
            check(&format!("get_rows {ty}"), &read(&ctx, c), &reference, 0.0);
        }
    }
}

#[test]
fn get_rows_bad_index_is_an_error() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(T::F32, 8, 3).unwrap();
    let rows = ctx.new_tensor_1d(T::I32, 2).unwrap();
    let c = ctx.get_rows(a, rows).unwrap();
    let g = graph_of(&mut ctx, &[c]);
    let _buf = alloc_all(&mut ctx);
    set_i32(&ctx, rows, &[1, 3]);
    let cpu = cpu_kernels::CpuCompute::new(1);
    assert!(matches!(
        cpu.compute(&ctx, g.as_view(), None),
        Err(backend_core::BackendError::OutOfBounds { .. })
    ));
    set_i32(&ctx, rows, &[1, 2]);
    assert!(cpu.compute(&ctx, g.as_view(), None).is_ok());
}

/// Regression (found by the scheduler's property test): the graph accepts, like ggml, a row
/// table with more matrices in dimension 2 than the source has in dimension 3; the kernel read
/// past the source's extents and its row check panicked. It now refuses the node.
#[test]
fn get_rows_with_more_index_matrices_than_source_matrices_is_refused() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_3d(T::I32, 1, 4, 4).unwrap();
    let rows = ctx.new_tensor_3d(T::I32, 1, 4, 4).unwrap();
    let c = ctx.get_rows(a, rows).unwrap();
    assert!(!cpu_kernels::supports_op(&ctx, c));
    let g = graph_of(&mut ctx, &[c]);
    let _buf = alloc_all(&mut ctx);
    set_i32(&ctx, rows, &[0; 16]);
    let cpu = cpu_kernels::CpuCompute::new(1);
    assert!(matches!(
        cpu.compute(&ctx, g.as_view(), None),
        Err(backend_core::BackendError::UnsupportedOp { .. })
    ));
}

/// Regression (found by the scheduler's property test): a matrix product over an inner
/// dimension of 0 (a view with `ne0 = 0`) split rows into chunks of 0 and panicked; its result
/// is all zeros.
#[test]
fn mul_mat_with_an_empty_inner_dimension_is_zero() {
    let mut ctx = Context::new();
    let a0 = ctx.new_tensor_1d(T::F32, 8).unwrap();
    // rows 21 bytes apart: not directly usable as f32 slices, so they are converted
    let a = ctx.view_2d(a0, 0, 2, 21, 0).unwrap();
    let b = ctx.new_tensor_2d(T::F32, 0, 3).unwrap();
    let c = ctx.mul_mat(a, b).unwrap();
    assert_eq!(ctx[c].ne(), [2, 3, 1, 1]);
    let g = graph_of(&mut ctx, &[c]);
    let _buf = alloc_all(&mut ctx);
    backend_core::tensor_memset(&ctx, c, 0x7f, 0, 24).unwrap();
    let cpu = cpu_kernels::CpuCompute::new(1);
    cpu.compute(&ctx, g.as_view(), None).unwrap();
    assert_eq!(read(&ctx, c), vec![0.0; 6]);
}

fn mul_mat_ref(va: &[f64], ane: [i64; 4], vb: &[f64], bne: [i64; 4]) -> Vec<f64> {
    let (k, m, n) = (ane[0] as usize, ane[1] as usize, bne[1] as usize);
    let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
    let mut out = Vec::new();
    for i3 in 0..bne[3] as usize {
        for i2 in 0..bne[2] as usize {
            for j in 0..n {
                for i in 0..m {
                    let mut s = 0.0;
                    for kk in 0..k {
                        s += va[lin(ane, [kk, i, i2 / r2 as usize, i3 / r3 as usize])]
                            * vb[lin(bne, [kk, j, i2, i3])];
                    }
                    out.push(s);
                }
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn mul_mat_case(
    ty: T,
    k: i64,
    m: i64,
    n: i64,
    batch: [i64; 2],
    bcast: [i64; 2],
    src1_transposed: bool,
    nth: usize,
) {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_4d(ty, k, m, batch[0], batch[1]).unwrap();
    let bne = [k, n, batch[0] * bcast[0], batch[1] * bcast[1]];
    let (b0, b) = if src1_transposed {
        let b0 = ctx.new_tensor_4d(T::F32, n, k, bne[2], bne[3]).unwrap();
        let bt = ctx.transpose(b0).unwrap();
        (b0, bt)
    } else {
        let b0 = ctx.new_tensor(T::F32, &bne).unwrap();
        (b0, b0)
    };
    let c = ctx.mul_mat(a, b).unwrap();
    let g = graph_of(&mut ctx, &[c]);
    let _buf = alloc_all(&mut ctx);
    let mut rng = Rng::new((k * 31 + m * 7 + n) as u64);
    fill(&ctx, a, &mut rng);
    fill(&ctx, b0, &mut rng);
    compute(&ctx, &g, nth);
    // ggml converts src1 to the weights' dot type first: f16 or bf16 for those weights.
    let vb: Vec<f64> = read(&ctx, b)
        .into_iter()
        .map(|v| match ty {
            T::F16 => half::f16::from_f64(v).to_f64(),
            T::BF16 => half::bf16::from_f64(v).to_f64(),
            _ => v,
        })
        .collect();
    let reference = mul_mat_ref(&read(&ctx, a), ctx[a].ne(), &vb, ctx[b].ne());
    let tol = match ty {
        T::F32 | T::F16 | T::BF16 => F32_TOL,
        _ => 1e-4,
    };
    check(
        &format!("mul_mat {ty} k{k} m{m} n{n} {batch:?}x{bcast:?} t{src1_transposed} nth{nth}"),
        &read(&ctx, c),
        &reference,
        tol,
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn mul_mat_thin_all_types() {
    for ty in [T::F32, T::F16, T::BF16, T::Q8_0, T::Q4_0, T::Q4_1] {
        for &nth in THREADS {
            mul_mat_case(ty, 64, 40, 1, [1, 1], [1, 1], false, nth);
            mul_mat_case(ty, 96, 19, 3, [2, 1], [2, 2], false, nth);
            mul_mat_case(ty, 64, 17, 5, [1, 2], [1, 1], true, nth);
        }
    }
}

/// Batched products (at least 16 columns): the gemm path for bf16 weights and for f32 from
/// 80 columns (f32 below that: the tiles), for q4_0 the dot path with its four-column calls
/// (33 = 8 · 4 + 1 columns, 20 = 5 · 4), for q8_0 and q4_1 the dot path's tiles.
#[test]
#[cfg_attr(miri, ignore = "gemm path: large shapes and SIMD")]
fn mul_mat_batched_all_types() {
    for ty in [T::F32, T::F16, T::BF16, T::Q8_0, T::Q4_0, T::Q4_1] {
        for &nth in THREADS {
            mul_mat_case(ty, 128, 70, 33, [1, 1], [1, 1], false, nth);
            mul_mat_case(ty, 64, 48, 20, [2, 1], [1, 2], true, nth);
        }
    }
    for &nth in THREADS {
        mul_mat_case(T::F32, 96, 40, 90, [1, 1], [1, 1], false, nth);
        mul_mat_case(T::F32, 64, 33, 81, [2, 1], [1, 2], true, nth);
    }
}

/// The f32 tiles' edges: row counts that are not a multiple of the 4-row tiles or the
/// 16-row units, column counts that are not a multiple of the 3-column tiles, lengths cut
/// into several passes (1024 floats each below 32 columns, 256 at 79) with a tail that is
/// not a multiple of 8, a strided src1, and src0 rows that are not f32-aligned (a view at
/// a byte offset of 2), which the tiles read from a copy.
#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; mul_mat_thin_small_for_miri covers the tiles"
)]
fn mul_mat_tiles_f32_edges() {
    for &nth in THREADS {
        for (k, m, n) in [
            (8, 16, 4),
            (37, 5, 5),
            (2500, 23, 7),
            (3001, 17, 79),
            (1030, 50, 31),
        ] {
            mul_mat_case(T::F32, k, m, n, [1, 1], [1, 1], false, nth);
            mul_mat_case(T::F32, k, m, n, [1, 1], [1, 1], true, nth);
        }
        mul_mat_case(T::F32, 40, 21, 6, [2, 3], [2, 1], false, nth);
        // Weights at a byte offset of 2: no row is f32-aligned, so the tiles read a copy.
        let mut ctx = Context::new();
        let a0 = ctx.new_tensor_2d(T::F32, 46, 19).unwrap();
        let a = ctx.view_2d(a0, 45, 19, 46 * 4, 2).unwrap();
        let b = ctx.new_tensor_2d(T::F32, 45, 8).unwrap();
        let c = ctx.mul_mat(a, b).unwrap();
        let g = graph_of(&mut ctx, &[c]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(91);
        fill(&ctx, a0, &mut rng);
        fill(&ctx, b, &mut rng);
        compute(&ctx, &g, nth);
        let reference = mul_mat_ref(&read(&ctx, a), ctx[a].ne(), &read(&ctx, b), ctx[b].ne());
        check("misaligned src0", &read(&ctx, c), &reference, F32_TOL);
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn mul_mat_permuted_src0_attention_shape() {
    // KQ: K cache viewed as [head_dim, n_kv, n_head] from a [head_dim, n_head, n_kv] tensor.
    for n in [1i64, 20] {
        if cfg!(miri) && n > 1 {
            continue;
        }
        let mut ctx = Context::new();
        let kc = ctx.new_tensor_3d(T::F16, 32, 4, 24).unwrap();
        let k = ctx.permute(kc, [0, 2, 1, 3]).unwrap(); // [32, 24, 4]
        let q0 = ctx.new_tensor_3d(T::F32, 32, 4, n).unwrap();
        let q = ctx.permute(q0, [0, 2, 1, 3]).unwrap(); // [32, n, 4]
        let c = ctx.mul_mat(k, q).unwrap();
        let g = graph_of(&mut ctx, &[c]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(77);
        fill(&ctx, kc, &mut rng);
        fill(&ctx, q0, &mut rng);
        compute(&ctx, &g, 2);
        let reference = mul_mat_ref(&read(&ctx, k), ctx[k].ne(), &read(&ctx, q), ctx[q].ne());
        check("kq", &read(&ctx, c), &reference, F32_TOL);
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the Miri subset covers the same memory paths"
)]
fn copies_between_float_types() {
    let tys = [T::F32, T::F16, T::BF16];
    for &from in &tys {
        for &to in &tys {
            for &nth in THREADS {
                let mut ctx = Context::new();
                let a0 = ctx.new_tensor_3d(from, 20, 6, 3).unwrap();
                let a = ctx.permute(a0, [1, 0, 2, 3]).unwrap(); // [6, 20, 3], strided
                let dst = ctx.new_tensor_3d(to, 6, 20, 3).unwrap();
                let c = ctx.cpy(a, dst).unwrap();
                let cont = ctx.cont(a).unwrap();
                let reshaped = ctx.cont_shape(a, &[60, 6]).unwrap();
                let dup = ctx.dup(a0).unwrap();
                let g = graph_of(&mut ctx, &[c, cont, reshaped, dup]);
                let _buf = alloc_all(&mut ctx);
                fill(&ctx, a0, &mut Rng::new(1));
                compute(&ctx, &g, nth);
                let va = read(&ctx, a);
                let round = |x: f64| match to {
                    T::F32 => x,
                    T::F16 => half::f16::from_f64(x).to_f64(),
                    _ => half::bf16::from_f64(x).to_f64(),
                };
                let expect: Vec<f64> = va.iter().map(|&x| round(x)).collect();
                check(&format!("cpy {from}->{to}"), &read(&ctx, dst), &expect, 0.0);
                check("cont", &read(&ctx, cont), &va, 0.0);
                check("cont reshaped", &read(&ctx, reshaped), &va, 0.0);
                check("dup", &read(&ctx, dup), &read(&ctx, a0), 0.0);
                assert!(ctx[cont].is_contiguous());
            }
        }
    }
}

#[test]
fn copy_into_kv_cache_view_and_quantize() {
    let mut ctx = Context::new();
    let cache = ctx.new_tensor_2d(T::F16, 16, 8).unwrap();
    let x = ctx.new_tensor_2d(T::F32, 16, 3).unwrap();
    let slot = ctx
        .view_2d(cache, 16, 3, ctx[cache].nb()[1], 2 * ctx[cache].nb()[1])
        .unwrap();
    let c = ctx.cpy(x, slot).unwrap();
    let xq = ctx.new_tensor_2d(T::F32, 64, 3).unwrap();
    let q8 = ctx.new_tensor_2d(T::Q8_0, 64, 3).unwrap();
    let q4 = ctx.new_tensor_2d(T::Q4_0, 64, 3).unwrap();
    let c8 = ctx.cpy(xq, q8).unwrap();
    let c4 = ctx.cpy(xq, q4).unwrap();
    let g = graph_of(&mut ctx, &[c, c8, c4]);
    let _buf = alloc_all(&mut ctx);
    let mut rng = Rng::new(12);
    fill(&ctx, x, &mut rng);
    fill(&ctx, xq, &mut rng);
    compute(&ctx, &g, 2);
    let vc = read(&ctx, cache);
    let vx = read(&ctx, x);
    for (k, &v) in vx.iter().enumerate() {
        assert_eq!(vc[32 + k], half::f16::from_f64(v).to_f64());
    }
    assert!(vc[..32].iter().chain(&vc[80..]).all(|&v| v == 0.0));
    let vq = read(&ctx, xq);
    // q8_0: error at most half a step (d/2) per element; q4_0: at most one step.
    for (ty, out, step) in [
        (T::Q8_0, read(&ctx, q8), 127.0),
        (T::Q4_0, read(&ctx, q4), 8.0),
    ] {
        for blk in 0..6 {
            let xs = &vq[blk * 32..blk * 32 + 32];
            let amax = xs.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let d = amax / step;
            for (o, x) in out[blk * 32..blk * 32 + 32].iter().zip(xs) {
                assert!(
                    (o - x).abs()
                        <= d * 0.51 + 1e-3 * d + if ty == T::Q4_0 { d * 0.5 } else { 0.0 },
                    "{ty}: {o} vs {x} (d {d})"
                );
            }
        }
        check(
            &format!("quantize {ty}"),
            &out,
            &vq,
            if ty == T::Q8_0 { 1e-4 } else { 1e-2 },
        );
    }
}

#[test]
fn unsupported_nodes_are_reported() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(T::F16, 8, 2).unwrap();
    let b = ctx.new_tensor_2d(T::F16, 8, 2).unwrap();
    let c = ctx.add(a, b).unwrap(); // f16 add is not implemented
    assert!(!cpu_kernels::supports_op(&ctx, c));
    let w = ctx.new_tensor_2d(T::Q5_0, 32, 2).unwrap();
    let x = ctx.new_tensor_2d(T::F32, 32, 2).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    assert!(!cpu_kernels::supports_op(&ctx, y));
    let g = graph_of(&mut ctx, &[c, y]);
    let _buf = alloc_all(&mut ctx);
    let cpu = cpu_kernels::CpuCompute::new(1);
    assert!(matches!(
        cpu.compute(&ctx, g.as_view(), None),
        Err(backend_core::BackendError::UnsupportedOp { .. })
    ));
    let r = cpu.plan(&ctx, g.as_view()).map(|_| ());
    assert!(
        matches!(r, Err(backend_core::BackendError::UnsupportedOp { tensor, .. }) if tensor == c),
        "{r:?}"
    );
}

#[test]
fn unallocated_tensor_is_an_error() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(T::F32, 8).unwrap();
    let c = ctx.sqr(a).unwrap();
    let g = graph_of(&mut ctx, &[c]);
    let cpu = cpu_kernels::CpuCompute::new(1);
    assert!(matches!(
        cpu.compute(&ctx, g.as_view(), None),
        Err(backend_core::BackendError::NotAllocated(_))
    ));
}

/// The Miri subset's matrix products: the thin (dot-product) path for a plain and a block
/// type, the f32 tiles, broadcast and a transposed src1, at the smallest shapes that still
/// cover them.
#[test]
fn mul_mat_thin_small_for_miri() {
    for ty in [T::F32, T::Q4_0] {
        mul_mat_case(ty, 32, 3, 1, [1, 1], [1, 1], false, 2);
        mul_mat_case(ty, 32, 2, 2, [1, 1], [2, 1], true, 1);
        // f32: the tiles (from 4 columns); q4_0: a four-column call and one more.
        mul_mat_case(ty, 32, 5, 5, [1, 1], [1, 1], true, 2);
    }
}

/// The thin path's edges: row counts that are not a multiple of the row groups (8 f32 rows,
/// 8 q4_0 rows) or of the 16-row units, lengths that are not a multiple of the vector width
/// (8 or 16 floats), a transposed (strided) src1, and shapes large enough to be split over
/// two threads, where one thread's rows end and the other's begin.
#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; mul_mat_thin_small_for_miri covers the same memory paths"
)]
fn mul_mat_thin_row_groups_and_tails() {
    for ty in [T::F32, T::F16, T::Q4_0] {
        for &nth in THREADS {
            for (k, m) in [(24, 1), (37, 7), (40, 9), (129, 13), (203, 23)] {
                if ty == T::Q4_0 && k % 32 != 0 {
                    continue;
                }
                mul_mat_case(ty, k, m, 1, [1, 1], [1, 1], false, nth);
                mul_mat_case(ty, k, m, 2, [1, 1], [1, 1], true, nth);
            }
            let k = if ty == T::Q4_0 { 224 } else { 203 };
            mul_mat_case(ty, k, 301, 1, [1, 1], [1, 1], false, nth);
            mul_mat_case(ty, k, 77, 3, [2, 1], [1, 1], true, nth);
        }
    }
}

/// One-column plain q4_0 and q4_1 products over blocks of 64 rows: on Intel cores with
/// AVX-512 those go as four interleaved calls a block (call `t` taking rows `t, t + 4, ..`)
/// where the rows' stride spreads over the L1 sets (k = 4096), and as calls over
/// consecutive rows where it does not (k = 8192 for q4_1, 16384 for q4_0); each result must
/// land in its own row, the rows past the last whole block included (m = 64 · 2 + 19).
#[test]
#[cfg_attr(miri, ignore = "SIMD kernels; large rows")]
fn mul_mat_one_column_row_orders() {
    for (ty, ks) in [(T::Q4_1, [4096, 8192]), (T::Q4_0, [4096, 16384])] {
        for k in ks {
            for &nth in THREADS {
                mul_mat_case(ty, k, 64 * 2 + 19, 1, [1, 1], [1, 1], false, nth);
            }
        }
    }
}

/// Thin products give the same bits on one thread and on two: each row's dot product is
/// computed by one kernel call whatever thread claims it and whatever rows share its group
/// (and, for q4_0, whatever columns share its call: 6 columns are a call of four and two
/// of one).
#[test]
fn mul_mat_thin_threads_agree_bit_for_bit() {
    let (k, m) = if cfg!(miri) { (64, 21) } else { (1024, 1003) };
    for ty in [T::F32, T::Q4_0, T::Q4_1] {
        for n in [1i64, 3, 6] {
            let mut outs = Vec::new();
            for nth in [1, 2] {
                let mut ctx = Context::new();
                let a = ctx.new_tensor_2d(ty, k, m).unwrap();
                let b = ctx.new_tensor_2d(T::F32, k, n).unwrap();
                let c = ctx.mul_mat(a, b).unwrap();
                let g = graph_of(&mut ctx, &[c]);
                let _buf = alloc_all(&mut ctx);
                let mut rng = Rng::new(5);
                fill(&ctx, a, &mut rng);
                fill(&ctx, b, &mut rng);
                compute(&ctx, &g, nth);
                outs.push(bytes(&ctx, c));
            }
            assert_eq!(outs[0], outs[1], "{ty} n{n}");
        }
    }
}

/// Batched f32 products (the blocked path from 80 columns: our AVX-512 product, or the
/// `gemm` crate without AVX-512) give the same bits on one thread and on two, with shapes
/// that leave short row panels and column panels and several inner blocks, and a broadcast
/// over dimension 2.
#[test]
#[cfg_attr(miri, ignore = "the blocked path is not taken under Miri")]
fn mul_mat_batched_f32_threads_agree_bit_for_bit() {
    for (k, m, n, b2) in [(400, 100, 96, 1), (800, 53, 85, 3), (64, 130, 129, 2)] {
        let mut outs = Vec::new();
        for nth in [1, 2] {
            let mut ctx = Context::new();
            let a = ctx.new_tensor_3d(T::F32, k, m, 1).unwrap();
            let b = ctx.new_tensor_3d(T::F32, k, n, b2).unwrap();
            let c = ctx.mul_mat(a, b).unwrap();
            let g = graph_of(&mut ctx, &[c]);
            let _buf = alloc_all(&mut ctx);
            let mut rng = Rng::new(17);
            fill(&ctx, a, &mut rng);
            fill(&ctx, b, &mut rng);
            compute(&ctx, &g, nth);
            if nth == 1 {
                let reference =
                    mul_mat_ref(&read(&ctx, a), ctx[a].ne(), &read(&ctx, b), ctx[b].ne());
                check(
                    &format!("f32 k{k} m{m} n{n}"),
                    &read(&ctx, c),
                    &reference,
                    F32_TOL,
                );
            }
            outs.push(bytes(&ctx, c));
        }
        assert_eq!(outs[0], outs[1], "k{k} m{m} n{n}");
    }
}
