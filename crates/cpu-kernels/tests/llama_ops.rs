//! The ops of a llama decode step, against implementations written here from the
//! description of ggml's x86 CPU backend (the `llama-decode` spec, §3 and §4), not from the
//! kernels: quantized products bit for bit (activation quantizer and summation order), and
//! the shapes the llama graph uses (GQA broadcast, KV-cache views, masked softmax).

mod common;

use common::*;
use graph::{Context, ElementType as T, Graph, TensorId};
use half::f16;

fn graph_of(ctx: &mut Context, outs: &[TensorId]) -> Graph {
    let mut g = Graph::new(256);
    for &o in outs {
        g.build_forward_expand(ctx, o).unwrap();
    }
    g
}

const THREADS: &[usize] = if cfg!(miri) { &[2] } else { &[1, 2] };

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn half_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// One activation block quantized by ggml's AVX2 rule: `amax`, `d = amax/127`,
/// `id = 127/amax`, quants rounded half to even; returns (quants, f32(half(d)),
/// f32(half(d·Σq))).
fn quantize_block(x: &[f32]) -> ([i8; 32], f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let mut q = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        sum += r;
        *q = r as i8;
    }
    (
        q,
        f16::from_f32(d).to_f32(),
        f16::from_f32(d * sum as f32).to_f32(),
    )
}

/// ggml's AVX2 `vec_dot` of one weight row (q4_1 or q8_0 blocks) with one f32 column.
fn ggml_dot(ty: T, row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let (q, da, sa) = quantize_block(xb);
        let (w, dw): ([i32; 32], f32) = match ty {
            T::Q4_1 => {
                let blk = &row[b * 20..b * 20 + 20];
                summs = half_at(blk, 2).mul_add(sa, summs);
                let w = std::array::from_fn(|j| {
                    i32::from(if j < 16 {
                        blk[4 + j] & 15
                    } else {
                        blk[4 + j - 16] >> 4
                    })
                });
                (w, half_at(blk, 0))
            }
            _ => {
                let blk = &row[b * 34..b * 34 + 34];
                (
                    std::array::from_fn(|j| i32::from(blk[2 + j] as i8)),
                    half_at(blk, 0),
                )
            }
        };
        for (l, a) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4).map(|j| w[j] * i32::from(q[j])).sum();
            *a = (dw * da).mul_add(lane as f32, *a);
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + summs
}

/// MUL_MAT with q4_1 and q8_0 weights gives ggml's x86 bits for every element, for one
/// column (decode) and several (a prompt batch, through the many-column kernel with a
/// remainder), with 1 and 2 threads, with a broadcast batch dimension.
#[test]
fn quantized_products_are_ggml_x86_bit_for_bit() {
    let shapes: &[(i64, i64, i64, i64)] = if cfg!(miri) {
        &[(64, 9, 1, 1), (32, 8, 5, 2)]
    } else {
        &[
            (576, 40, 1, 1),
            (96, 21, 1, 3),
            (64, 17, 11, 2),
            (1536, 9, 5, 1),
        ]
    };
    for ty in [T::Q4_1, T::Q8_0] {
        for &(k, m, n, bc) in shapes {
            for &nth in THREADS {
                let mut ctx = Context::new();
                let a = ctx.new_tensor_3d(ty, k, m, 1).unwrap();
                let b = ctx.new_tensor_3d(T::F32, k, n, bc).unwrap();
                let c = ctx.mul_mat(a, b).unwrap();
                let g = graph_of(&mut ctx, &[c]);
                let _buf = alloc_all(&mut ctx);
                let mut rng = Rng::new((k + m * 3 + n) as u64);
                fill(&ctx, a, &mut rng);
                fill(&ctx, b, &mut rng);
                compute(&ctx, &g, nth);
                let w = bytes(&ctx, a);
                let x = f32s(&bytes(&ctx, b));
                let out = f32s(&bytes(&ctx, c));
                let rb = ty.row_size(k as usize);
                let (k, m, n) = (k as usize, m as usize, n as usize);
                for col in 0..n * bc as usize {
                    for r in 0..m {
                        let want =
                            ggml_dot(ty, &w[r * rb..(r + 1) * rb], &x[col * k..(col + 1) * k]);
                        let got = out[col * m + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{ty} k{k} m{m} n{n} col {col} row {r} nth{nth}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// GET_ROWS of q4_1 and q8_0 rows dequantizes exactly: `q·d + m` (one rounding: ggml's C
/// is compiled with contraction) and `q·d`.
#[test]
fn get_rows_dequantizes_q4_1_and_q8_0_exactly() {
    for ty in [T::Q4_1, T::Q8_0] {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(ty, 64, 7).unwrap();
        let ids = ctx.new_tensor_1d(T::I32, 3).unwrap();
        let c = ctx.get_rows(a, ids).unwrap();
        let g = graph_of(&mut ctx, &[c]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(5);
        fill(&ctx, a, &mut rng);
        set_i32(&ctx, ids, &[6, 0, 6]);
        compute(&ctx, &g, 1);
        let w = bytes(&ctx, a);
        let out = f32s(&bytes(&ctx, c));
        let rb = ty.row_size(64);
        for (i, &r) in [6usize, 0, 6].iter().enumerate() {
            let row = &w[r * rb..(r + 1) * rb];
            for j in 0..64 {
                let (b, e) = (j / 32, j % 32);
                let want = match ty {
                    T::Q4_1 => {
                        let blk = &row[b * 20..];
                        let q = if e < 16 {
                            blk[4 + e] & 15
                        } else {
                            blk[4 + e - 16] >> 4
                        };
                        f32::from(q).mul_add(half_at(blk, 0), half_at(blk, 2))
                    }
                    _ => {
                        let blk = &row[b * 34..];
                        f32::from(blk[2 + e] as i8) * half_at(blk, 0)
                    }
                };
                assert_eq!(
                    out[i * 64 + j].to_bits(),
                    want.to_bits(),
                    "{ty} row {r} el {j}"
                );
            }
        }
    }
}
