//! The binary ops' direct path (dense f32 rows, result apart from its sources or exactly one
//! of them) against the scratch path (strided sources): same bits; and in-place results.

mod common;

use common::*;
use graph::{Context, ElementType as T, Graph, Op, TensorId};

fn graph_of(ctx: &mut Context, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(64);
    for &o in outs {
        g.build_forward_expand(ctx, o).unwrap();
    }
    g
}

const OPS: [Op; 4] = [Op::Add, Op::Sub, Op::Mul, Op::Div];

fn binop(ctx: &mut Context, op: Op, a: TensorId, b: TensorId, inplace: bool) -> TensorId {
    match (op, inplace) {
        (Op::Add, false) => ctx.add(a, b),
        (Op::Sub, false) => ctx.sub(a, b),
        (Op::Mul, false) => ctx.mul(a, b),
        (Op::Div, false) => ctx.div(a, b),
        (Op::Add, true) => ctx.add_inplace(a, b),
        (Op::Sub, true) => ctx.sub_inplace(a, b),
        (Op::Mul, true) => ctx.mul_inplace(a, b),
        (_, true) => ctx.div_inplace(a, b),
        _ => unreachable!(),
    }
    .unwrap()
}

/// Per-element f32 results worked out here, independently of the kernels.
fn expect(op: Op, x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(y)
        .map(|(&p, &q)| {
            let (p, q) = (p as f32, q as f32);
            f64::from(match op {
                Op::Add => p + q,
                Op::Sub => p - q,
                Op::Mul => p * q,
                _ => p / q,
            })
        })
        .collect()
}

#[test]
fn direct_and_scratch_paths_agree_bit_for_bit() {
    // Rows longer than one 4096-element chunk outside Miri, so chunk offsets are covered.
    let (n0, n1) = if cfg!(miri) { (40, 6) } else { (5000, 9) };
    for nth in [1, 2] {
        for op in OPS {
            let mut ctx = Context::new();
            // Dense operands (direct path) and transposed copies of the same values
            // (strided: scratch path).
            let a = ctx.new_tensor_2d(T::F32, n0, n1).unwrap();
            let b = ctx.new_tensor_2d(T::F32, n0, n1).unwrap();
            let b_row = ctx.new_tensor_2d(T::F32, n0, 1).unwrap(); // broadcast over rows
            let at0 = ctx.new_tensor_2d(T::F32, n1, n0).unwrap();
            let bt0 = ctx.new_tensor_2d(T::F32, n1, n0).unwrap();
            let at = ctx.transpose(at0).unwrap();
            let bt = ctx.transpose(bt0).unwrap();
            let direct = binop(&mut ctx, op, a, b, false);
            let bcast = binop(&mut ctx, op, a, b_row, false);
            let scratch = binop(&mut ctx, op, at, bt, false);
            let g = graph_of(&mut ctx, &[direct, bcast, scratch]);
            let _buf = alloc_all(&mut ctx);
            let mut rng = Rng::new(11);
            let va: Vec<f32> = (0..n0 * n1).map(|_| rng.f() * 4.0).collect();
            let vb: Vec<f32> = (0..n0 * n1).map(|_| rng.f() + 1.5).collect();
            set_f32(&ctx, a, &va);
            set_f32(&ctx, b, &vb);
            set_f32(&ctx, b_row, &vb[..n0 as usize]);
            // at0/bt0 hold the transposes, so at/bt read as the same logical values.
            let tr = |v: &[f32]| -> Vec<f32> {
                let (n0, n1) = (n0 as usize, n1 as usize);
                (0..n0 * n1).map(|k| v[(k % n1) * n0 + k / n1]).collect()
            };
            set_f32(&ctx, at0, &tr(&va));
            set_f32(&ctx, bt0, &tr(&vb));
            compute(&ctx, &g, nth);
            assert_eq!(
                bytes(&ctx, direct),
                bytes(&ctx, scratch),
                "{op:?} nth {nth}"
            );
            let (ra, rb) = (read(&ctx, a), read(&ctx, b));
            check("direct", &read(&ctx, direct), &expect(op, &ra, &rb), 0.0);
            let rrow: Vec<f64> = (0..ra.len()).map(|k| rb[k % n0 as usize]).collect();
            check(
                "broadcast rows",
                &read(&ctx, bcast),
                &expect(op, &ra, &rrow),
                0.0,
            );
        }
    }
}

#[test]
fn in_place_matches_per_element_results() {
    let (n0, n1) = if cfg!(miri) { (24, 4) } else { (4500, 5) };
    for nth in [1, 2] {
        for op in OPS {
            for which in 0..3 {
                let mut ctx = Context::new();
                let a = ctx.new_tensor_2d(T::F32, n0, n1).unwrap();
                let b = ctx.new_tensor_2d(T::F32, n0, n1).unwrap();
                let (x, y) = match which {
                    0 => (a, b), // result == src0
                    1 => (b, a), // result == src0 == the other tensor
                    _ => (a, a), // result == src0 == src1
                };
                let r = binop(&mut ctx, op, x, y, true);
                let g = graph_of(&mut ctx, &[r]);
                let _buf = alloc_all(&mut ctx);
                let mut rng = Rng::new(5 + which as u64);
                let va: Vec<f32> = (0..n0 * n1).map(|_| rng.f() + 2.0).collect();
                let vb: Vec<f32> = (0..n0 * n1).map(|_| rng.f() - 2.0).collect();
                set_f32(&ctx, a, &va);
                set_f32(&ctx, b, &vb);
                let (rx, ry) = (read(&ctx, x), read(&ctx, y));
                compute(&ctx, &g, nth);
                let want = expect(op, &rx, &ry);
                check("in place", &read(&ctx, r), &want, 0.0);
                check("in place (source)", &read(&ctx, x), &want, 0.0);
            }
        }
    }
}
