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
/// column (decode) and several (a prompt batch, through the many-column kernels with a
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
            // a prompt batch: eight-column tiles (with AVX-512 VNNI) and a remainder
            (256, 40, 35, 1),
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

/// RMS_NORM as ggml computes it: the f32-rounded squares summed in f64, `mean` rounded to
/// f32, `x · (1/sqrtf(mean + eps))` — bit for bit, then MUL by a broadcast weight row.
#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the other tests cover the same kernels"
)]
fn rms_norm_and_weight_are_ggml_bit_for_bit() {
    let eps = f32::from_bits(0x3727_c5ac);
    for &nth in THREADS {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(T::F32, 576, 5).unwrap();
        let w = ctx.new_tensor_1d(T::F32, 576).unwrap();
        let n = ctx.rms_norm(x, eps).unwrap();
        let y = ctx.mul(n, w).unwrap();
        let g = graph_of(&mut ctx, &[y]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(3);
        fill(&ctx, x, &mut rng);
        fill(&ctx, w, &mut rng);
        compute(&ctx, &g, nth);
        let (vx, vw) = (f32s(&bytes(&ctx, x)), f32s(&bytes(&ctx, w)));
        let out = f32s(&bytes(&ctx, y));
        for (r, row) in vx.chunks_exact(576).enumerate() {
            let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
            let mean = (sum / 576.0) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            for (i, &v) in row.iter().enumerate() {
                let want = (v * scale) * vw[i];
                assert_eq!(out[r * 576 + i].to_bits(), want.to_bits(), "row {r} el {i}");
            }
        }
    }
}

/// ROPE in llama's normal mode: adjacent pairs, one position per token, `θ_0 = pos`,
/// `θ_{i+1} = θ_i · base^(−2/n_dims)` in f32, `cosf`/`sinf`, freq base 100000, each pair
/// rotated with one fused multiply-add per output as ggml's compiled loop does; heads are
/// rotated alike, bit for bit.
#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the other tests cover the same kernels"
)]
fn rope_normal_mode_is_ggml_bit_for_bit() {
    let p = graph::RopeParams {
        freq_base: 100_000.0,
        ..Default::default()
    };
    let (hd, heads, toks) = (64usize, 9usize, 7usize);
    let positions = [0i32, 1, 2, 3, 100, 255, 511];
    for &nth in THREADS {
        let mut ctx = Context::new();
        let x = ctx
            .new_tensor_3d(T::F32, hd as i64, heads as i64, toks as i64)
            .unwrap();
        let pos = ctx.new_tensor_1d(T::I32, toks as i64).unwrap();
        let y = ctx
            .rope_ext(x, pos, hd as i32, graph::rope_mode::NORMAL, p)
            .unwrap();
        let g = graph_of(&mut ctx, &[y]);
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(8);
        fill(&ctx, x, &mut rng);
        set_i32(&ctx, pos, &positions);
        compute(&ctx, &g, nth);
        let vx = f32s(&bytes(&ctx, x));
        let out = f32s(&bytes(&ctx, y));
        let theta_scale = 100_000.0f32.powf(-2.0 / hd as f32);
        for (t, &ps) in positions.iter().enumerate() {
            for h in 0..heads {
                let base = (t * heads + h) * hd;
                let mut theta = ps as f32;
                for i in 0..hd / 2 {
                    let (c, s) = (theta.cos(), theta.sin());
                    let (x0, x1) = (vx[base + 2 * i], vx[base + 2 * i + 1]);
                    // As llama.cpp's `-march=native` builds (AVX2 and AVX-512) compute them,
                    // read back from their layer-0 `Kcur`/`Qcur` on SmolLM2: the first product
                    // of each output fused, the second rounded.
                    let w0 = x0.mul_add(c, -(x1 * s));
                    let w1 = x0.mul_add(s, x1 * c);
                    assert_eq!(out[base + 2 * i].to_bits(), w0.to_bits(), "t{t} h{h} i{i}");
                    assert_eq!(
                        out[base + 2 * i + 1].to_bits(),
                        w1.to_bits(),
                        "t{t} h{h} i{i}"
                    );
                    theta *= theta_scale;
                }
            }
        }
    }
}

/// The plain attention of a decode step with GQA (9 query heads over 3 KV heads, head `h`
/// on KV head `h / 3`): K and V written into an F16 cache through views (V transposed, a
/// non-contiguous destination), `KQ = K·Q` over the first `n_kv` cells, SOFT_MAX with scale
/// 0.125 and an F32 mask of −∞ for cells not visible, `KQV = V·P`, then the heads merged by
/// PERMUTE + CONT. Checked against f64 attention over the f16-rounded cache and
/// f16-rounded `Q` and `P` (ggml converts `src1` of an f16-weight product to f16); masked
/// cells get exactly zero probability.
#[test]
#[cfg_attr(
    miri,
    ignore = "minutes under Miri; the other tests cover the same kernels"
)]
fn gqa_attention_over_an_f16_cache_matches_naive_attention() {
    let (hd, nh, nkv_h, kv_size, n_kv, n) = (64i64, 9i64, 3i64, 32i64, 16i64, 3i64);
    let past = 10i64; // cells 0..past hold earlier tokens, the new ones go to past..past+n
    for &nth in THREADS {
        let mut ctx = Context::new();
        let kc = ctx.new_tensor_2d(T::F16, hd * nkv_h, kv_size).unwrap();
        let vc = ctx.new_tensor_2d(T::F16, kv_size, hd * nkv_h).unwrap(); // transposed V
        let q = ctx.new_tensor_3d(T::F32, hd, nh, n).unwrap();
        let k = ctx.new_tensor_2d(T::F32, hd * nkv_h, n).unwrap();
        let v = ctx.new_tensor_2d(T::F32, hd * nkv_h, n).unwrap();
        let mask = ctx.new_tensor_2d(T::F32, n_kv, n).unwrap();
        let (kb, vb) = (ctx[kc].nb(), ctx[vc].nb());
        // Store k rows at cells past..past+n; v columns likewise in the transposed cache.
        let k_dst = ctx
            .view_2d(kc, hd * nkv_h, n, kb[1], past as usize * kb[1])
            .unwrap();
        let k_cpy = ctx.cpy(k, k_dst).unwrap();
        let v_dst = ctx
            .view_2d(vc, n, hd * nkv_h, vb[1], past as usize * vb[0])
            .unwrap();
        let vt = ctx.transpose(v).unwrap();
        let v_cpy = ctx.cpy(vt, v_dst).unwrap();
        // Read views of the first n_kv cells: K [hd, n_kv, nkv_h], V^T [n_kv, hd, nkv_h].
        let kview = ctx
            .view_3d(kc, hd, n_kv, nkv_h, kb[1], hd as usize * 2, 0)
            .unwrap();
        let vview = ctx
            .view_3d(vc, n_kv, hd, nkv_h, vb[1], vb[1] * hd as usize, 0)
            .unwrap();
        let qp = ctx.permute(q, [0, 2, 1, 3]).unwrap(); // [hd, n, nh]
        let kq = ctx.mul_mat(kview, qp).unwrap(); // [n_kv, n, nh]
        let p = ctx.soft_max_ext(kq, Some(mask), 0.125, 0.0).unwrap();
        let kqv = ctx.mul_mat(vview, p).unwrap(); // [hd, n, nh]
        let merged = ctx.permute(kqv, [0, 2, 1, 3]).unwrap(); // [hd, nh, n]
        let out = ctx.cont(merged).unwrap();
        let mut g = Graph::new(64);
        for t in [k_cpy, v_cpy, out] {
            g.build_forward_expand(&mut ctx, t).unwrap();
        }
        let _buf = alloc_all(&mut ctx);
        let mut rng = Rng::new(21);
        for t in [q, k, v] {
            fill(&ctx, t, &mut rng);
        }
        // Earlier cells: arbitrary f16 values already in the cache.
        let old: Vec<f32> = (0..hd * nkv_h * kv_size)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 60.0)
            .collect();
        let as_f16 = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect()
        };
        backend_core::tensor_set(&ctx, kc, 0, &as_f16(&old)).unwrap();
        backend_core::tensor_set(&ctx, vc, 0, &as_f16(&old)).unwrap();
        // Causal mask: token j (position past + j) sees cells 0..=past + j.
        let mut m = vec![f32::NEG_INFINITY; (n_kv * n) as usize];
        for j in 0..n {
            for c in 0..=(past + j) {
                m[(j * n_kv + c) as usize] = 0.0;
            }
        }
        set_f32(&ctx, mask, &m);
        compute(&ctx, &g, nth);

        let h16 = |b: &[u8]| -> Vec<f64> {
            b.chunks_exact(2)
                .map(|c| f64::from(f16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect()
        };
        let (kcache, vcache) = (h16(&bytes(&ctx, kc)), h16(&bytes(&ctx, vc)));
        let (vq, vk, vv) = (
            f32s(&bytes(&ctx, q)),
            f32s(&bytes(&ctx, k)),
            f32s(&bytes(&ctx, v)),
        );
        let r16 = |x: f32| f64::from(f16::from_f32(x).to_f32());
        let (hd, nh, n_kv, n, kv_size, past) = (
            hd as usize,
            nh as usize,
            n_kv as usize,
            n as usize,
            kv_size as usize,
            past as usize,
        );
        let row = hd * nkv_h as usize;
        // The cache holds the new k, v (rounded to f16) and the old values elsewhere.
        for c in 0..kv_size {
            for e in 0..row {
                let (wk, wv) = if (past..past + n).contains(&c) {
                    (r16(vk[(c - past) * row + e]), r16(vv[(c - past) * row + e]))
                } else {
                    (r16(old[c * row + e]), r16(old[e * kv_size + c]))
                };
                assert_eq!(kcache[c * row + e], wk, "k cell {c} el {e}");
                assert_eq!(vcache[e * kv_size + c], wv, "v cell {c} el {e}");
            }
        }
        let got = f32s(&bytes(&ctx, out));
        let mut err = 0.0f64;
        let mut norm = 0.0f64;
        for j in 0..n {
            for h in 0..nh {
                let kvh = h / 3;
                let qv: Vec<f64> = (0..hd).map(|d| r16(vq[(j * nh + h) * hd + d])).collect();
                let mut s: Vec<f64> = (0..n_kv)
                    .map(|c| {
                        let dot: f64 = (0..hd)
                            .map(|d| kcache[c * row + kvh * hd + d] * qv[d])
                            .sum();
                        dot * 0.125 + f64::from(m[j * n_kv + c])
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                s.iter_mut()
                    .for_each(|x| *x = r16(((*x - mx).exp() / z) as f32));
                for d in 0..hd {
                    let want: f64 = (0..n_kv)
                        .map(|c| vcache[(kvh * hd + d) * kv_size + c] * s[c])
                        .sum();
                    let g = f64::from(got[(j * nh + h) * hd + d]);
                    err += (g - want).powi(2);
                    norm += want * want;
                }
            }
        }
        assert!(err / norm < 1e-6, "nth {nth}: NMSE {}", err / norm);
        // Probabilities of masked cells are exactly zero.
        let probs = f32s(&bytes(&ctx, p));
        for h in 0..nh {
            for j in 0..n {
                for c in past + j + 1..n_kv {
                    assert_eq!(probs[(h * n + j) * n_kv + c], 0.0);
                }
            }
        }
    }
}

/// `_mm512_reduce_add_ps`'s order (halves, quarters, then pairs).
fn reduce16(v: &[f32]) -> f32 {
    let t3: Vec<f32> = (0..8).map(|i| v[8 + i] + v[i]).collect();
    let t6: Vec<f32> = (0..4).map(|i| t3[4 + i] + t3[i]).collect();
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// MUL_MAT with f16 weights (the attention over an f16 cache): `src1` rounded to f16, then
/// ggml's AVX-512 orders bit for bit — `ggml_vec_dot_f16` for one column (4 × 16 lanes over
/// steps of 64, the rest in f64), llamafile's tinyBLAS for more (one 16-lane FMA chain),
/// with the GQA broadcast of the query heads over the KV heads, and without it (one column
/// per matrix: the kernel that reads the f16 rows in place, its units of 48 rows read as six
/// strided stretches, whole and cut at row counts that are not a multiple of them).
#[test]
fn f16_products_are_ggml_bit_for_bit() {
    let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
        &[(64, 4, 1), (32, 4, 2)]
    } else {
        &[
            (64, 32, 1),
            (64, 32, 4),
            (80, 12, 1),
            (256, 64, 3),
            (80, 40, 1),
            (200, 23, 1),
            (64, 100, 1),
            (136, 53, 1),
        ]
    };
    for &(k, m, n) in shapes {
        for (kv, q) in [(3, 9), (2, 2)] {
            for &nth in THREADS {
                let mut ctx = Context::new();
                let a = ctx.new_tensor_3d(T::F16, k as i64, m as i64, kv).unwrap();
                let b = ctx.new_tensor_3d(T::F32, k as i64, n as i64, q).unwrap();
                let c = ctx.mul_mat(a, b).unwrap();
                let g = graph_of(&mut ctx, &[c]);
                let _buf = alloc_all(&mut ctx);
                let mut rng = Rng::new((k + m + n) as u64);
                fill(&ctx, a, &mut rng);
                fill(&ctx, b, &mut rng);
                compute(&ctx, &g, nth);
                let w: Vec<f32> = bytes(&ctx, a)
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect();
                let x: Vec<f32> = f32s(&bytes(&ctx, b))
                    .into_iter()
                    .map(|v| f16::from_f32(v).to_f32())
                    .collect();
                let out = f32s(&bytes(&ctx, c));
                let tiny = n >= 2 && k % 16 == 0 && m % 4 == 0;
                let g = (q / kv) as usize;
                for h in 0..q as usize {
                    for j in 0..n {
                        let col = &x[(h * n + j) * k..(h * n + j + 1) * k];
                        for r in 0..m {
                            let row = &w[((h / g) * m + r) * k..((h / g) * m + r + 1) * k];
                            let want = if tiny {
                                let mut acc = [0.0f32; 16];
                                for i in 0..k {
                                    acc[i % 16] = row[i].mul_add(col[i], acc[i % 16]);
                                }
                                reduce16(&acc)
                            } else {
                                let np = k / 64 * 64;
                                let mut acc = [[0.0f32; 16]; 4];
                                for i in 0..np {
                                    let (j4, l) = ((i % 64) / 16, i % 16);
                                    acc[j4][l] = row[i].mul_add(col[i], acc[j4][l]);
                                }
                                let x16: Vec<f32> = (0..16)
                                    .map(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
                                    .collect();
                                let mut s = f64::from(reduce16(&x16));
                                for i in np..k {
                                    s += f64::from(row[i] * col[i]);
                                }
                                s as f32
                            };
                            let got = out[(h * n + j) * m + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "k{k} m{m} n{n} kv{kv} h{h} j{j} r{r}"
                            );
                        }
                    }
                }
            }
        }
    }
}
