//! Op checks: every op over generated shapes and types, computed on the backend under test
//! and on a reference backend, node by node through [`graph_copy::compare_graph_backends_with`].
//!
//! Each case builds a small graph in a fresh context, places it in the reference backend's
//! memory, fills the inputs from a seeded generator, and lets the comparison copy it onto
//! both backends with guard bytes around every tensor. A case fails when a node's result
//! differs by more than the op's NMSE threshold, when NaN/Inf appear on one side only, or when
//! a guard region was overwritten. Cases the backend does not support are listed, not failed;
//! cases the reference does not support are skipped.
//!
//! Element-wise ops (unary, binary, SQR, SQRT, SCALE) are also run in every type beyond F32
//! that the backend claims through `supports_op` (F16, BF16): a claim is a promise, so it is
//! checked, and types not claimed are not listed. Where the reference lacks the op in that
//! type (the CPU computes element-wise ops in F32 only), it computes the op via F32 from the
//! same inputs and rounds the result to the type, so the claim is still compared.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use backend_core::{Backend, Buffer, tensor_alloc, view_init};
use graph::{Context, ElementType, Graph, GraphError, Op, TensorId, UnaryOp, rope_mode};
use graph_copy::{CopyOptions, compare_graph_backends_with, graph_copy};

use crate::values::{Rng, nmse, read_values, write_values};

/// What the op checks measure.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Compare every case with the reference (the default).
    #[default]
    Correctness,
    /// Compare, then time each passing case on the backend under test and report GFLOP/s
    /// (matrix products) or GB/s (everything else).
    Perf,
}

/// Options of [`check_ops`].
///
/// ```
/// let opts = conformance::OpOptions { filter: Some("MUL_MAT".into()), ..Default::default() };
/// assert_eq!(opts.guard_bytes, 64);
/// ```
#[derive(Clone, Debug)]
pub struct OpOptions {
    /// Correctness or perf.
    pub mode: Mode,
    /// Only cases whose op label contains this text (e.g. `"MUL_MAT"`, `"UNARY(GELU)"`).
    pub filter: Option<String>,
    /// Guard bytes around every tensor of both copies.
    pub guard_bytes: usize,
    /// Seed of the input generator.
    pub seed: u64,
    /// Time spent per case in perf mode (at least three runs are made).
    pub perf_time: Duration,
    /// Multiplies every NMSE threshold (a backend with a lower-precision accumulator may ask
    /// for more room, visibly).
    pub tolerance_scale: f64,
    /// Also run the element-wise cases in every type beyond F32 that the backend claims
    /// (default `true`). Turn it off only for a backend that cannot know what it computes:
    /// a client of ggml's RPC protocol 7 claims every op it can send, since the protocol has
    /// no way to ask, and ggml's CPU server aborts its whole process on some of those
    /// claims (F16 SCALE).
    pub claimed_types: bool,
}

impl Default for OpOptions {
    fn default() -> Self {
        OpOptions {
            mode: Mode::Correctness,
            filter: None,
            guard_bytes: 64,
            seed: 0x5EED,
            perf_time: Duration::from_millis(100),
            tolerance_scale: 1.0,
            claimed_types: true,
        }
    }
}

/// How one case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum CaseOutcome {
    /// Every node within its threshold; the worst NMSE seen.
    Passed {
        /// Largest NMSE over the case's nodes.
        max_nmse: f64,
    },
    /// A node differed, a non-finite value appeared on one side only, a guard was hit, or a
    /// backend call failed.
    Failed(String),
    /// The backend under test does not compute the case's op with these types/shapes.
    Unsupported,
    /// The reference does not compute it either: nothing to compare with.
    ReferenceUnsupported,
    /// The graph cannot be built (the op constructor refused the shapes).
    NotConstructible(String),
}

/// One case: op label, shape/type description, outcome, and perf figure in perf mode.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// `"ADD"`, `"UNARY(SILU)"`, …
    pub op: String,
    /// Shapes and types, e.g. `"a=[16,5,3,2] f32, b=[16,1,3,1] f32 (broadcast)"`.
    pub desc: String,
    /// How it ended.
    pub outcome: CaseOutcome,
    /// Perf mode: `"12.3 GFLOP/s"` or `"4.5 GB/s"`.
    pub perf: Option<String>,
}

/// Every case's result, with a summary per op.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpReport {
    /// Backend under test.
    pub backend: String,
    /// Reference backend.
    pub reference: String,
    /// Every case, in the order run.
    pub cases: Vec<CaseResult>,
}

impl OpReport {
    /// The failed cases.
    pub fn failed(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, CaseOutcome::Failed(_)))
    }
    /// Whether no case failed.
    pub fn passed(&self) -> bool {
        self.failed().next().is_none()
    }
    /// Op labels with at least one case the backend does not support.
    pub fn unsupported_ops(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .cases
            .iter()
            .filter(|c| c.outcome == CaseOutcome::Unsupported)
            .map(|c| c.op.as_str())
            .collect();
        v.dedup();
        v
    }
    /// Per op label: (passed, failed, unsupported, skipped) case counts.
    pub fn summary(&self) -> BTreeMap<&str, [usize; 4]> {
        let mut m: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
        for c in &self.cases {
            let k = match c.outcome {
                CaseOutcome::Passed { .. } => 0,
                CaseOutcome::Failed(_) => 1,
                CaseOutcome::Unsupported => 2,
                _ => 3,
            };
            m.entry(c.op.as_str()).or_default()[k] += 1;
        }
        m
    }
    /// For tests: panic with the report if any case failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(self.passed(), "op checks failed:\n{self}");
    }
}

impl fmt::Display for OpReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} against {}", self.backend, self.reference)?;
        for c in &self.cases {
            let what = match &c.outcome {
                CaseOutcome::Passed { max_nmse } => format!("ok   (nmse {max_nmse:.2e})"),
                CaseOutcome::Failed(m) => format!("FAIL {m}"),
                CaseOutcome::Unsupported => "not supported".to_owned(),
                CaseOutcome::ReferenceUnsupported => "skip (reference does not support)".to_owned(),
                CaseOutcome::NotConstructible(e) => format!("skip ({e})"),
            };
            let perf = c
                .perf
                .as_deref()
                .map(|p| format!("  {p}"))
                .unwrap_or_default();
            writeln!(f, "  {:<16} {:<58} {what}{perf}", c.op, c.desc)?;
        }
        writeln!(f, "summary (passed/failed/unsupported/skipped):")?;
        for (op, [p, x, u, s]) in self.summary() {
            writeln!(f, "  {op:<16} {p:>3} {x:>3} {u:>3} {s:>3}")?;
        }
        Ok(())
    }
}

/// How an input is filled.
#[derive(Copy, Clone, Debug)]
enum Fill {
    /// Uniform in [lo, hi).
    Uniform(f32, f32),
    /// Integers in [0, n).
    Index(u32),
    /// A causal attention mask `[n_kv, rows]`: 0 where cell `c <= past + row`, else −∞.
    Causal {
        /// Cells per row.
        n_kv: u32,
        /// Cells before the first row's own.
        past: u32,
    },
}

struct Built {
    inputs: Vec<(TensorId, Fill)>,
    out: TensorId,
    flops: Option<f64>,
}

type Build = Box<dyn Fn(&mut Context) -> Result<Built, GraphError>>;

struct Spec {
    desc: String,
    build: Build,
}

fn spec(
    desc: impl Into<String>,
    build: impl Fn(&mut Context) -> Result<Built, GraphError> + 'static,
) -> Spec {
    Spec {
        desc: desc.into(),
        build: Box::new(build),
    }
}

fn one(inputs: Vec<(TensorId, Fill)>, out: TensorId) -> Result<Built, GraphError> {
    Ok(Built {
        inputs,
        out,
        flops: None,
    })
}

const U: Fill = Fill::Uniform(-1.0, 1.0);

fn ty_name(t: ElementType) -> String {
    format!("{t:?}").to_lowercase()
}

/// Every case the kit runs.
fn cases() -> Vec<Spec> {
    use ElementType::{F16, F32, I32};
    let mut v = Vec::new();
    const SH: [i64; 4] = [16, 5, 3, 2];

    for u in UnaryOp::ALL {
        let range = if u == UnaryOp::Exp {
            Fill::Uniform(-3.0, 3.0)
        } else {
            Fill::Uniform(-2.0, 2.0)
        };
        v.push(spec(
            format!("x=[16,5,3,2] f32 ({})", u.name().to_lowercase()),
            move |c| {
                let x = c.new_tensor(F32, &SH)?;
                let y = c.unary(x, u)?;
                one(vec![(x, range)], y)
            },
        ));
        // Unary ops take operands whose rows are contiguous (ggml_is_contiguous_1); a view
        // of every other row of a matrix is the non-contiguous layout they must handle.
        v.push(spec(
            format!(
                "x=view([16,5] rows of [32,5]) f32 ({})",
                u.name().to_lowercase()
            ),
            move |c| {
                let x = c.new_tensor(F32, &[32, 5])?;
                let p = c.view_2d(x, 16, 5, 32 * 4, 16 * 4)?;
                let y = c.unary(p, u)?;
                one(vec![(x, range)], y)
            },
        ));
    }

    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
        let bfill = if op == Op::Div {
            Fill::Uniform(0.5, 2.0)
        } else {
            U
        };
        let bin = move |c: &mut Context, a: TensorId, b: TensorId| match op {
            Op::Add => c.add(a, b),
            Op::Sub => c.sub(a, b),
            Op::Mul => c.mul(a, b),
            _ => c.div(a, b),
        };
        for (bne, what) in [
            ([16i64, 5, 3, 2], "same shape"),
            ([16, 1, 3, 1], "broadcast"),
            ([1, 5, 1, 2], "broadcast"),
        ] {
            v.push(spec(
                format!("a=[16,5,3,2] b={bne:?} f32 ({what})"),
                move |c| {
                    let a = c.new_tensor(F32, &SH)?;
                    let b = c.new_tensor(F32, &bne)?;
                    let y = bin(c, a, b)?;
                    one(vec![(a, U), (b, bfill)], y)
                },
            ));
        }
        v.push(spec(
            "a=permute([16,3,5,2],0213) b=[16,5,3,2] f32 (permuted)",
            move |c| {
                let a0 = c.new_tensor(F32, &[16, 3, 5, 2])?;
                let a = c.permute(a0, [0, 2, 1, 3])?;
                let b = c.new_tensor(F32, &SH)?;
                let y = bin(c, a, b)?;
                one(vec![(a0, U), (b, bfill)], y)
            },
        ));
    }

    v.push(spec("x=[16,5,3,2] f32", |c| {
        let x = c.new_tensor(F32, &SH)?;
        let y = c.sqr(x)?;
        one(vec![(x, Fill::Uniform(-2.0, 2.0))], y)
    }));
    v.push(spec("x=permute([16,3,5,2],0213) f32", |c| {
        let x = c.new_tensor(F32, &[16, 3, 5, 2])?;
        let p = c.permute(x, [0, 2, 1, 3])?;
        let y = c.sqr(p)?;
        one(vec![(x, U)], y)
    }));
    v.push(spec("x=[16,5,3,2] f32", |c| {
        let x = c.new_tensor(F32, &SH)?;
        let y = c.sqrt(x)?;
        one(vec![(x, Fill::Uniform(0.0, 4.0))], y)
    }));
    v.push(spec("x=[16,5,3,2] f32 s=0.75", |c| {
        let x = c.new_tensor(F32, &SH)?;
        let y = c.scale(x, 0.75)?;
        one(vec![(x, U)], y)
    }));
    for ne in [[64i64, 5, 3, 2], [33, 7, 1, 1]] {
        v.push(spec(format!("x={ne:?} f32 eps=1e-5"), move |c| {
            let x = c.new_tensor(F32, &ne)?;
            let y = c.norm(x, 1e-5)?;
            one(vec![(x, U)], y)
        }));
        v.push(spec(format!("x={ne:?} f32 eps=1e-6"), move |c| {
            let x = c.new_tensor(F32, &ne)?;
            let y = c.rms_norm(x, 1e-6)?;
            one(vec![(x, U)], y)
        }));
    }

    for ta in [F32, F16] {
        for (ane, bne, what) in [
            ([64i64, 16, 1, 1], [64i64, 7, 1, 1], "plain"),
            ([64, 16, 1, 1], [64, 7, 3, 1], "broadcast a"),
            ([64, 16, 3, 1], [64, 7, 3, 2], "batched"),
            ([256, 32, 1, 1], [256, 32, 1, 1], "square"),
        ] {
            v.push(spec(
                format!("a={ane:?} {} b={bne:?} f32 ({what})", ty_name(ta)),
                move |c| {
                    let a = c.new_tensor(ta, &ane)?;
                    let b = c.new_tensor(F32, &bne)?;
                    let y = c.mul_mat(a, b)?;
                    let flops = 2.0 * (ane[0] * ane[1] * bne[1] * bne[2] * bne[3]) as f64;
                    Ok(Built {
                        inputs: vec![(a, U), (b, U)],
                        out: y,
                        flops: Some(flops),
                    })
                },
            ));
        }
        v.push(spec(
            format!(
                "a=[64,16] {} b=transpose([7,64]) f32 (transposed b)",
                ty_name(ta)
            ),
            move |c| {
                let a = c.new_tensor(ta, &[64, 16])?;
                let bt = c.new_tensor(F32, &[7, 64])?;
                let b = c.transpose(bt)?;
                let y = c.mul_mat(a, b)?;
                Ok(Built {
                    inputs: vec![(a, U), (bt, U)],
                    out: y,
                    flops: Some(2.0 * 64.0 * 16.0 * 7.0),
                })
            },
        ));
        v.push(spec(
            format!("a=[32,10] {} rows=[6] i32", ty_name(ta)),
            move |c| {
                let a = c.new_tensor(ta, &[32, 10])?;
                let r = c.new_tensor(I32, &[6])?;
                let y = c.get_rows(a, r)?;
                one(vec![(a, U), (r, Fill::Index(10))], y)
            },
        ));
    }

    v.push(spec("x=[32,6,2] f32 scale=0.5", |c| {
        let x = c.new_tensor(F32, &[32, 6, 2])?;
        let y = c.soft_max_ext(x, None, 0.5, 0.0)?;
        one(vec![(x, Fill::Uniform(-4.0, 4.0))], y)
    }));
    for mt in [F32, F16] {
        v.push(spec(
            format!("x=[32,6,2] f32 mask=[32,6] {} scale=0.125", ty_name(mt)),
            move |c| {
                let x = c.new_tensor(F32, &[32, 6, 2])?;
                let m = c.new_tensor(mt, &[32, 6])?;
                let y = c.soft_max_ext(x, Some(m), 0.125, 0.0)?;
                one(
                    vec![(x, Fill::Uniform(-4.0, 4.0)), (m, Fill::Uniform(-2.0, 0.0))],
                    y,
                )
            },
        ));
    }
    for (mode, mname) in [(rope_mode::NORMAL, "normal"), (rope_mode::NEOX, "neox")] {
        for n_dims in [64, 32] {
            v.push(spec(
                format!("x=[64,4,5] f32 pos=[5] n_dims={n_dims} {mname}"),
                move |c| {
                    let x = c.new_tensor(F32, &[64, 4, 5])?;
                    let p = c.new_tensor(I32, &[5])?;
                    let y = c.rope(x, p, n_dims, mode)?;
                    one(vec![(x, U), (p, Fill::Index(100))], y)
                },
            ));
        }
    }
    for (from, to) in [(F32, F16), (F16, F32), (F32, F32)] {
        v.push(spec(
            format!("[16,5,3] {} -> {}", ty_name(from), ty_name(to)),
            move |c| {
                let a = c.new_tensor(from, &[16, 5, 3])?;
                let b = c.new_tensor(to, &[16, 5, 3])?;
                let y = c.cpy(a, b)?;
                one(vec![(a, U), (b, U)], y)
            },
        ));
    }
    v.push(spec("permute([16,3,5],021) f32 -> [16,5,3] f32", |c| {
        let a0 = c.new_tensor(F32, &[16, 3, 5])?;
        let a = c.permute(a0, [0, 2, 1, 3])?;
        let b = c.new_tensor(F32, &[16, 5, 3])?;
        let y = c.cpy(a, b)?;
        one(vec![(a0, U), (b, U)], y)
    }));
    v.push(spec("transpose([16,5]) f32", |c| {
        let x = c.new_tensor(F32, &[16, 5])?;
        let t = c.transpose(x)?;
        let y = c.cont(t)?;
        one(vec![(x, U)], y)
    }));
    v.push(spec("permute([16,3,5,2],2103) f32", |c| {
        let x = c.new_tensor(F32, &[16, 3, 5, 2])?;
        let p = c.permute(x, [2, 1, 0, 3])?;
        let y = c.cont(p)?;
        one(vec![(x, U)], y)
    }));
    v.push(spec("x=[16,5,3] f32", |c| {
        let x = c.new_tensor(F32, &[16, 5, 3])?;
        let y = c.dup(x)?;
        one(vec![(x, U)], y)
    }));
    quantized_cases(&mut v);
    llama_cases(&mut v);
    large_cases(&mut v);
    v
}

/// The shapes of a llama decode step (SmolLM2-135M: head dim 64, 9 query heads over 3 KV
/// heads, F16 KV cache): normal-mode RoPE with freq base 100000 on `[64, heads, tokens]`,
/// K/V written into F16 cache views (V transposed: a strided destination), `K·Q` with the
/// query heads broadcast over the KV heads (GQA), SOFT_MAX with scale 0.125 and a causal
/// F32 mask of −∞ entries broadcast over the heads, `V·P`, and the heads merged by PERMUTE
/// + CONT.
fn llama_cases(v: &mut Vec<Spec>) {
    use ElementType::{F16, F32, I32};
    let p = graph::RopeParams {
        freq_base: 100_000.0,
        ..Default::default()
    };
    v.push(spec(
        "x=[64,9,5] f32 pos=[5] n_dims=64 normal base=1e5 (llama)",
        move |c| {
            let x = c.new_tensor(F32, &[64, 9, 5])?;
            let pos = c.new_tensor(I32, &[5])?;
            let y = c.rope_ext(x, pos, 64, rope_mode::NORMAL, p)?;
            one(vec![(x, U), (pos, Fill::Index(512))], y)
        },
    ));
    v.push(spec(
        "[192,3] f32 -> view(cells 5..8 of [192,32]) f16 (llama K cache)",
        |c| {
            let cache = c.new_tensor(F16, &[192, 32])?;
            let nb1 = c[cache].nb()[1];
            let dst = c.view_2d(cache, 192, 3, nb1, 5 * nb1)?;
            let k = c.new_tensor(F32, &[192, 3])?;
            let y = c.cpy(k, dst)?;
            one(vec![(k, U), (cache, U)], y)
        },
    ));
    v.push(spec(
        "transpose([192,3]) f32 -> view(columns 5..8 of [32,192]) f16 (llama V cache)",
        |c| {
            let cache = c.new_tensor(F16, &[32, 192])?;
            let nb1 = c[cache].nb()[1];
            let dst = c.view_2d(cache, 3, 192, nb1, 5 * 2)?;
            let x = c.new_tensor(F32, &[192, 3])?;
            let xt = c.transpose(x)?;
            let y = c.cpy(xt, dst)?;
            one(vec![(x, U), (cache, U)], y)
        },
    ));
    for n in [1i64, 4] {
        v.push(spec(
            format!("attention n_kv=32 tokens={n} heads=9 kv_heads=3 f16 cache (llama GQA)"),
            move |c| {
                let kc = c.new_tensor(F16, &[192, 32])?;
                let vc = c.new_tensor(F16, &[32, 192])?;
                let q = c.new_tensor(F32, &[64, 9, n])?;
                let mask = c.new_tensor(F32, &[32, n])?;
                let (kb, vb) = (c[kc].nb(), c[vc].nb());
                let k = c.view_3d(kc, 64, 32, 3, kb[1], 128, 0)?;
                let vv = c.view_3d(vc, 32, 64, 3, vb[1], vb[1] * 64, 0)?;
                let qp = c.permute(q, [0, 2, 1, 3])?;
                let kq = c.mul_mat(k, qp)?;
                let pr = c.soft_max_ext(kq, Some(mask), 0.125, 0.0)?;
                let kqv = c.mul_mat(vv, pr)?;
                let merged = c.permute(kqv, [0, 2, 1, 3])?;
                let out = c.cont(merged)?;
                Ok(Built {
                    inputs: vec![
                        (kc, U),
                        (vc, U),
                        (q, U),
                        (mask, Fill::Causal { n_kv: 32, past: 20 }),
                    ],
                    out,
                    flops: Some(2.0 * 2.0 * 64.0 * 32.0 * 9.0 * n as f64),
                })
            },
        ));
    }
}

/// Block-quantized weights (and bf16): made inside the graph by a CPY from f32, since the
/// generator writes per-element values only. The CPY node itself is not compared (block
/// bytes have no per-element value); the product or row lookup using it is.
fn quantized_cases(v: &mut Vec<Spec>) {
    use ElementType::{BF16, F32, I32, Q4_0, Q4_1, Q8_0};
    for ty in [Q8_0, Q4_0, Q4_1, BF16] {
        for (ane, bne, what) in [
            ([64i64, 16, 1, 1], [64i64, 3, 1, 1], "thin"),
            ([64, 16, 2, 1], [64, 20, 2, 1], "wide"),
        ] {
            v.push(spec(
                format!(
                    "a=[{},{},{}] {} b={bne:?} f32 ({what})",
                    ane[0],
                    ane[1],
                    ane[2],
                    ty_name(ty)
                ),
                move |c| {
                    let a32 = c.new_tensor(F32, &ane)?;
                    let aq = c.new_tensor(ty, &ane)?;
                    let a = c.cpy(a32, aq)?;
                    let b = c.new_tensor(F32, &bne)?;
                    let y = c.mul_mat(a, b)?;
                    let flops = 2.0 * (ane[0] * ane[1] * bne[1] * bne[2]) as f64;
                    Ok(Built {
                        inputs: vec![(a32, U), (b, U)],
                        out: y,
                        flops: Some(flops),
                    })
                },
            ));
        }
        v.push(spec(
            format!("a=[64,10] {} rows=[6] i32", ty_name(ty)),
            move |c| {
                let a32 = c.new_tensor(F32, &[64, 10])?;
                let aq = c.new_tensor(ty, &[64, 10])?;
                let a = c.cpy(a32, aq)?;
                let r = c.new_tensor(I32, &[6])?;
                let y = c.get_rows(a, r)?;
                one(vec![(a32, U), (r, Fill::Index(10))], y)
            },
        ));
    }
}

/// Cases big enough that the CPU kernels split them over threads (above their single-thread
/// work threshold), so that one thread against many threads compares different code paths.
fn large_cases(v: &mut Vec<Spec>) {
    use ElementType::{F16, F32, I32, Q8_0};
    v.push(spec("a=[4096,12] b=[4096,1] f32 (large, broadcast)", |c| {
        let a = c.new_tensor(F32, &[4096, 12])?;
        let b = c.new_tensor(F32, &[4096, 1])?;
        let y = c.add(a, b)?;
        one(vec![(a, U), (b, U)], y)
    }));
    v.push(spec("x=[4096,12] f32 (large)", |c| {
        let x = c.new_tensor(F32, &[4096, 12])?;
        let y = c.unary(x, UnaryOp::Silu)?;
        one(vec![(x, Fill::Uniform(-2.0, 2.0))], y)
    }));
    v.push(spec("x=[1024,48] f32 eps=1e-6 (large)", |c| {
        let x = c.new_tensor(F32, &[1024, 48])?;
        let y = c.rms_norm(x, 1e-6)?;
        one(vec![(x, U)], y)
    }));
    v.push(spec("x=[512,32,4] f32 mask=[512,32] f16 (large)", |c| {
        let x = c.new_tensor(F32, &[512, 32, 4])?;
        let m = c.new_tensor(F16, &[512, 32])?;
        let y = c.soft_max_ext(x, Some(m), 0.125, 0.0)?;
        one(
            vec![(x, Fill::Uniform(-4.0, 4.0)), (m, Fill::Uniform(-2.0, 0.0))],
            y,
        )
    }));
    v.push(spec("x=[128,8,64] f32 pos=[64] neox (large)", |c| {
        let x = c.new_tensor(F32, &[128, 8, 64])?;
        let p = c.new_tensor(I32, &[64])?;
        let y = c.rope(x, p, 128, rope_mode::NEOX)?;
        one(vec![(x, U), (p, Fill::Index(4096))], y)
    }));
    for (ty, bcols, what) in [
        (F32, 32, "gemm"),
        (F16, 32, "gemm"),
        (F32, 3, "thin"),
        (F16, 3, "thin"),
        (Q8_0, 3, "thin"),
        (Q8_0, 32, "gemm"),
    ] {
        v.push(spec(
            format!(
                "a=[512,128] {} b=[512,{bcols}] f32 (large {what})",
                ty_name(ty)
            ),
            move |c| {
                let a32 = c.new_tensor(F32, &[512, 128])?;
                let a = if ty == F32 {
                    a32
                } else {
                    let aq = c.new_tensor(ty, &[512, 128])?;
                    c.cpy(a32, aq)?
                };
                let b = c.new_tensor(F32, &[512, bcols])?;
                let y = c.mul_mat(a, b)?;
                Ok(Built {
                    inputs: vec![(a32, U), (b, U)],
                    out: y,
                    flops: Some(2.0 * 512.0 * 128.0 * bcols as f64),
                })
            },
        ));
    }
    v.push(spec("[1024,64] f32 -> f16 (large)", |c| {
        let a = c.new_tensor(F32, &[1024, 64])?;
        let b = c.new_tensor(F16, &[1024, 64])?;
        let y = c.cpy(a, b)?;
        one(vec![(a, U), (b, U)], y)
    }));
}

/// `UNARY(SILU)` for unary ops, the op name otherwise.
fn op_label(op: Op) -> String {
    match op {
        Op::Unary(u) => format!("UNARY({})", u.name()),
        other => other.name().to_owned(),
    }
}

/// The NMSE a node may show against the reference: exact-ish for elementwise f32 ops, room
/// for summation order in reductions and products, and for half-precision rounding.
///
/// Public (as `conformance::nmse_threshold`) so that tests comparing graphs of their own,
/// outside the kit's cases, hold them to the same limits.
///
/// ```
/// use graph::{Context, ElementType};
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_2d(ElementType::F16, 8, 4)?;
/// let b = ctx.new_tensor_2d(ElementType::F32, 8, 2)?;
/// let y = ctx.mul_mat(a, b)?;
/// assert_eq!(conformance::nmse_threshold(&ctx, y), 5e-4);
/// # Ok::<(), graph::GraphError>(())
/// ```
pub fn threshold(ctx: &Context, node: TensorId) -> f64 {
    let t = &ctx[node];
    let base: f64 = match t.op() {
        Op::MulMat => 5e-4,
        Op::Norm | Op::RmsNorm | Op::SoftMax | Op::Rope => 1e-6,
        Op::Unary(
            UnaryOp::Gelu
            | UnaryOp::GeluErf
            | UnaryOp::Tanh
            | UnaryOp::Exp
            | UnaryOp::Sigmoid
            | UnaryOp::Silu,
        ) => 1e-6,
        _ => 1e-7,
    };
    let half = std::iter::once(node)
        .chain(t.srcs().iter().flatten().copied())
        .any(|id| matches!(ctx[id].ty(), ElementType::F16 | ElementType::BF16));
    if half { base.max(1e-5) } else { base }
}

/// Place every tensor of `g` (leafs, nodes and view roots) in one buffer of `backend`'s
/// default type, at offsets aligned to it, in id order; views get their roots' storage.
/// Tests of backend crates that build graphs of their own use it to stage them.
///
/// ```
/// use graph::{Context, ElementType, Graph};
/// let backend = backend_cpu::init()?;
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// let t = ctx.scale(a, 2.0)?;
/// let mut g = Graph::new(8);
/// g.build_forward_expand(&mut ctx, t)?;
/// let _buf = conformance::place_graph(&mut ctx, &g, &backend)?;
/// assert!(ctx[a].has_storage() && ctx[t].has_storage());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn place_graph(ctx: &mut Context, g: &Graph, backend: &Backend) -> Result<Buffer, String> {
    let buft = backend.default_buffer_type();
    let a = buft.alignment().max(1);
    let mut ids: Vec<TensorId> = g.leafs().iter().chain(g.nodes()).copied().collect();
    let roots: Vec<TensorId> = ids.iter().filter_map(|&i| ctx[i].view_src()).collect();
    ids.extend(roots);
    ids.sort();
    ids.dedup();
    let mut places = Vec::new();
    let mut size = 0usize;
    for &id in &ids {
        if !ctx[id].is_view() {
            let o = size.next_multiple_of(a);
            places.push((id, o));
            size = o + buft.alloc_size(&ctx[id]);
        }
    }
    let buf = buft.alloc_buffer(size).map_err(|e| e.to_string())?;
    for (id, o) in places {
        tensor_alloc(ctx, &buf, id, o).map_err(|e| e.to_string())?;
    }
    for &id in &ids {
        if ctx[id].is_view() && !ctx[id].has_storage() {
            view_init(ctx, id).map_err(|e| e.to_string())?;
        }
    }
    Ok(buf)
}

/// Run every op case on `backend` and on `reference` and compare them.
///
/// `reference` is normally the CPU backend; its default buffer type holds the inputs.
///
/// ```
/// use test_device::{TestDevice, TestDeviceConfig};
/// let dev = TestDevice::create(TestDeviceConfig::named("D").supported_ops([]))?;
/// let reference = TestDevice::create(TestDeviceConfig::named("R").supported_ops([]))?;
/// let opts = conformance::OpOptions { filter: Some("SQRT".into()), ..Default::default() };
/// let report = conformance::check_ops(&dev.init_backend("")?, &reference.init_backend("")?, &opts);
/// assert_eq!(report.cases.len(), 1);
/// assert_eq!(report.cases[0].outcome, conformance::CaseOutcome::ReferenceUnsupported);
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub fn check_ops(backend: &Backend, reference: &Backend, opts: &OpOptions) -> OpReport {
    let mut report = OpReport {
        backend: backend.name().to_owned(),
        reference: reference.name().to_owned(),
        cases: Vec::new(),
    };
    let mut rng = Rng::new(opts.seed);
    for s in cases() {
        let mut ctx = Context::new();
        let built = (s.build)(&mut ctx);
        let op = match &built {
            Ok(b) => op_label(ctx[b.out].op()),
            Err(_) => "?".to_owned(),
        };
        if let Some(f) = &opts.filter
            && !op.contains(f.as_str())
        {
            continue;
        }
        let mut result = CaseResult {
            op,
            desc: s.desc.clone(),
            outcome: CaseOutcome::Passed { max_nmse: 0.0 },
            perf: None,
        };
        match built {
            Err(e) => result.outcome = CaseOutcome::NotConstructible(e.to_string()),
            Ok(b) => run_case(&mut ctx, b, backend, reference, opts, &mut rng, &mut result),
        }
        tracing::debug!(op = %result.op, desc = %result.desc, outcome = ?result.outcome, "op case");
        report.cases.push(result);
    }
    if opts.claimed_types {
        typed_elementwise(backend, reference, opts, &mut rng, &mut report);
    }
    report
}

/// An element-wise case over any element type: `build(ctx, ty, via_f32)` makes its inputs in
/// `ty` and computes the op in `ty`, or, with `via_f32`, converts the inputs to F32, computes
/// the op in F32 and converts the result back to `ty` (how a reference without the op in
/// `ty` computes the same values).
struct TypedSpec {
    /// Description with `{ty}` where the type name goes.
    desc: String,
    build: TypedBuild,
}

type TypedBuild = Box<dyn Fn(&mut Context, ElementType, bool) -> Result<Built, GraphError>>;

fn typed_spec(
    desc: impl Into<String>,
    build: impl Fn(&mut Context, ElementType, bool) -> Result<Built, GraphError> + 'static,
) -> TypedSpec {
    TypedSpec {
        desc: desc.into(),
        build: Box::new(build),
    }
}

/// `x` itself, or `x` converted to F32 when computing via F32.
fn lift(c: &mut Context, x: TensorId, via_f32: bool) -> Result<TensorId, GraphError> {
    if !via_f32 {
        return Ok(x);
    }
    let ne = c.get(x)?.ne();
    let f = c.new_tensor(ElementType::F32, &ne)?;
    c.cpy(x, f)
}

/// `y` itself, or `y` converted back to `ty` when computing via F32.
fn lower(
    c: &mut Context,
    y: TensorId,
    ty: ElementType,
    via_f32: bool,
) -> Result<TensorId, GraphError> {
    if !via_f32 {
        return Ok(y);
    }
    let ne = c.get(y)?.ne();
    let t = c.new_tensor(ty, &ne)?;
    c.cpy(y, t)
}

/// The element-wise ops (unary, binary with and without broadcast, SQR, SQRT, SCALE) in the
/// types beyond F32 they may be claimed in. F32 is covered by [`cases`].
fn typed_cases() -> Vec<TypedSpec> {
    const SH: [i64; 4] = [16, 5, 3, 2];
    let mut v = Vec::new();
    for u in UnaryOp::ALL {
        let range = if u == UnaryOp::Exp {
            Fill::Uniform(-3.0, 3.0)
        } else {
            Fill::Uniform(-2.0, 2.0)
        };
        v.push(typed_spec(
            format!("x=[16,5,3,2] {{ty}} ({})", u.name().to_lowercase()),
            move |c, ty, via| {
                let x = c.new_tensor(ty, &SH)?;
                let xl = lift(c, x, via)?;
                let y = c.unary(xl, u)?;
                let y = lower(c, y, ty, via)?;
                one(vec![(x, range)], y)
            },
        ));
    }
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
        let bfill = if op == Op::Div {
            Fill::Uniform(0.5, 2.0)
        } else {
            U
        };
        for (bne, what) in [
            ([16i64, 5, 3, 2], "same shape"),
            ([16, 1, 3, 1], "broadcast"),
        ] {
            v.push(typed_spec(
                format!("a=[16,5,3,2] b={bne:?} {{ty}} ({what})"),
                move |c, ty, via| {
                    let a = c.new_tensor(ty, &SH)?;
                    let b = c.new_tensor(ty, &bne)?;
                    let (al, bl) = (lift(c, a, via)?, lift(c, b, via)?);
                    let y = match op {
                        Op::Add => c.add(al, bl),
                        Op::Sub => c.sub(al, bl),
                        Op::Mul => c.mul(al, bl),
                        _ => c.div(al, bl),
                    }?;
                    let y = lower(c, y, ty, via)?;
                    one(vec![(a, U), (b, bfill)], y)
                },
            ));
        }
    }
    for (op, range) in [
        (Op::Sqr, Fill::Uniform(-2.0, 2.0)),
        (Op::Sqrt, Fill::Uniform(0.0, 4.0)),
        (Op::Scale, U),
    ] {
        v.push(typed_spec(
            format!("x=[16,5,3,2] {{ty}} ({})", op.name().to_lowercase()),
            move |c, ty, via| {
                let x = c.new_tensor(ty, &SH)?;
                let xl = lift(c, x, via)?;
                let y = match op {
                    Op::Sqr => c.sqr(xl),
                    Op::Sqrt => c.sqrt(xl),
                    _ => c.scale(xl, 0.75),
                }?;
                let y = lower(c, y, ty, via)?;
                one(vec![(x, range)], y)
            },
        ));
    }
    v
}

/// Whether `backend` computes every computed node of `g`.
fn supports_graph(backend: &Backend, ctx: &Context, g: &Graph) -> bool {
    g.nodes()
        .iter()
        .filter(|&&n| !(ctx[n].op() == Op::None || ctx[n].op().is_view_op()))
        .all(|&n| backend.supports_op(ctx, n))
}

/// The element-wise cases in every type beyond F32 the backend claims (its `supports_op`
/// says yes). Types it does not claim are not listed: they are not part of what it offers.
/// When the reference computes the op in that type too, the case runs like any other;
/// otherwise the reference computes it via F32 from the same inputs and the results are
/// compared (without guard bytes, which only the node-by-node comparison places).
fn typed_elementwise(
    backend: &Backend,
    reference: &Backend,
    opts: &OpOptions,
    rng: &mut Rng,
    report: &mut OpReport,
) {
    for s in typed_cases() {
        for ty in [ElementType::F16, ElementType::BF16] {
            let mut ctx = Context::new();
            let Ok(b) = (s.build)(&mut ctx, ty, false) else {
                continue; // the op cannot be built in this type: nobody can claim it
            };
            let op = op_label(ctx[b.out].op());
            if let Some(f) = &opts.filter
                && !op.contains(f.as_str())
            {
                continue;
            }
            let mut g = Graph::new(16);
            if g.build_forward_expand(&mut ctx, b.out).is_err()
                || !supports_graph(backend, &ctx, &g)
            {
                continue;
            }
            let mut result = CaseResult {
                op,
                desc: s.desc.replace("{ty}", &ty_name(ty)),
                outcome: CaseOutcome::Passed { max_nmse: 0.0 },
                perf: None,
            };
            if supports_graph(reference, &ctx, &g) {
                run_case(&mut ctx, b, backend, reference, opts, rng, &mut result);
            } else {
                result.desc.push_str(" (reference via f32)");
                result.outcome =
                    match run_via_f32(&s, ty, (ctx, g, b), backend, reference, opts, rng) {
                        Ok(outcome) => outcome,
                        Err(e) => CaseOutcome::Failed(e),
                    };
            }
            tracing::debug!(op = %result.op, desc = %result.desc, outcome = ?result.outcome, "op case");
            report.cases.push(result);
        }
    }
}

/// Compute the case on `backend` in `ty` and on `reference` via F32, from the same input
/// values, and compare the outputs.
fn run_via_f32(
    s: &TypedSpec,
    ty: ElementType,
    (mut ctx, g, b): (Context, Graph, Built),
    backend: &Backend,
    reference: &Backend,
    opts: &OpOptions,
    rng: &mut Rng,
) -> Result<CaseOutcome, String> {
    let mut rctx = Context::new();
    let rb = (s.build)(&mut rctx, ty, true).map_err(|e| e.to_string())?;
    let mut rg = Graph::new(32);
    rg.build_forward_expand(&mut rctx, rb.out)
        .map_err(|e| e.to_string())?;
    if !supports_graph(reference, &rctx, &rg) {
        return Ok(CaseOutcome::ReferenceUnsupported);
    }
    let _buf = place_graph(&mut ctx, &g, backend).map_err(|e| format!("allocating: {e}"))?;
    let _rbuf = place_graph(&mut rctx, &rg, reference).map_err(|e| format!("allocating: {e}"))?;
    for (&(t, fill), &(rt, _)) in b.inputs.iter().zip(&rb.inputs) {
        let vals = input_values(fill, ctx[t].nelements() as usize, rng);
        write_values(&ctx, t, &vals).map_err(|e| format!("writing inputs: {e}"))?;
        write_values(&rctx, rt, &vals).map_err(|e| format!("writing inputs: {e}"))?;
    }
    backend
        .graph_compute(&ctx, g.as_view())
        .map_err(|e| format!("{}: {e}", backend.name()))?;
    reference
        .graph_compute(&rctx, rg.as_view())
        .map_err(|e| format!("{}: {e}", reference.name()))?;
    let read = |c: &Context, t: TensorId| match read_values(c, t) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err("result type has no values".to_owned()),
        Err(e) => Err(format!("reading results: {e}")),
    };
    let (want, got) = (read(&rctx, rb.out)?, read(&ctx, b.out)?);
    let limit = threshold(&ctx, b.out) * opts.tolerance_scale;
    Ok(match nmse(&want, &got) {
        Ok(e) if e <= limit => CaseOutcome::Passed { max_nmse: e },
        Ok(e) => CaseOutcome::Failed(format!(
            "{}: nmse {e:.3e} > {limit:.1e}",
            op_label(ctx[b.out].op())
        )),
        Err(m) => CaseOutcome::Failed(format!("{}: {m:?}", op_label(ctx[b.out].op()))),
    })
}

/// `n` input values drawn as `fill` says.
fn input_values(fill: Fill, n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| match fill {
            Fill::Uniform(lo, hi) => rng.uniform(lo, hi),
            Fill::Index(k) => rng.uniform(0.0, k as f32).floor().min(k as f32 - 1.0),
            Fill::Causal { n_kv, past } => {
                let (row, c) = (i / n_kv as usize, i % n_kv as usize);
                if c <= past as usize + row {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            }
        })
        .collect()
}

fn run_case(
    ctx: &mut Context,
    b: Built,
    backend: &Backend,
    reference: &Backend,
    opts: &OpOptions,
    rng: &mut Rng,
    result: &mut CaseResult,
) {
    let mut g = Graph::new(16);
    if let Err(e) = g.build_forward_expand(ctx, b.out) {
        result.outcome = CaseOutcome::NotConstructible(e.to_string());
        return;
    }
    let computed = |id: &&TensorId| !(ctx[**id].op() == Op::None || ctx[**id].op().is_view_op());
    if !g
        .nodes()
        .iter()
        .filter(computed)
        .all(|&n| reference.supports_op(ctx, n))
    {
        result.outcome = CaseOutcome::ReferenceUnsupported;
        return;
    }
    if !g
        .nodes()
        .iter()
        .filter(computed)
        .all(|&n| backend.supports_op(ctx, n))
    {
        result.outcome = CaseOutcome::Unsupported;
        return;
    }
    let _buf = match place_graph(ctx, &g, reference) {
        Ok(buf) => buf,
        Err(e) => {
            result.outcome = CaseOutcome::Failed(format!("allocating inputs: {e}"));
            return;
        }
    };
    for &(t, fill) in &b.inputs {
        let vals = input_values(fill, ctx[t].nelements() as usize, rng);
        if let Err(e) = write_values(ctx, t, &vals) {
            result.outcome = CaseOutcome::Failed(format!("writing inputs: {e}"));
            return;
        }
    }
    let copy_opts = CopyOptions {
        guard_bytes: opts.guard_bytes,
    };
    let mut worst = 0.0f64;
    let mut failure: Option<String> = None;
    let cmp = compare_graph_backends_with(reference, backend, ctx, &g, &copy_opts, |n| {
        let (a, bv) = match (read_values(n.ctx1, n.id), read_values(n.ctx2, n.id)) {
            (Ok(Some(a)), Ok(Some(b))) => (a, b),
            (Ok(None), _) | (_, Ok(None)) => return true,
            (Err(e), _) | (_, Err(e)) => {
                failure = Some(format!("node {} reading results: {e}", n.index));
                return false;
            }
        };
        let limit = threshold(n.ctx1, n.id) * opts.tolerance_scale;
        match nmse(&a, &bv) {
            Ok(e) if e <= limit => {
                worst = worst.max(e);
                true
            }
            Ok(e) => {
                failure = Some(format!(
                    "node {} ({}): nmse {e:.3e} > {limit:.1e}",
                    n.index,
                    op_label(n.op())
                ));
                false
            }
            Err(m) => {
                failure = Some(format!("node {} ({}): {m:?}", n.index, op_label(n.op())));
                false
            }
        }
    });
    result.outcome = match cmp {
        Err(e) => CaseOutcome::Failed(format!("comparison: {e}")),
        Ok(_) if failure.is_some() => CaseOutcome::Failed(failure.unwrap_or_default()),
        Ok(r) if !r.guard_violations.is_empty() => {
            let v = &r.guard_violations[0];
            CaseOutcome::Failed(format!(
                "{} wrote out of bounds computing node {} ({}): guard after {:?} damaged",
                v.backend, v.index, v.op, v.after
            ))
        }
        Ok(r) if !r.unsupported.is_empty() => CaseOutcome::Unsupported,
        Ok(_) => CaseOutcome::Passed { max_nmse: worst },
    };
    if opts.mode == Mode::Perf && matches!(result.outcome, CaseOutcome::Passed { .. }) {
        result.perf = Some(
            perf(ctx, &g, backend, b.flops, opts.perf_time)
                .unwrap_or_else(|e| format!("perf failed: {e}")),
        );
    }
}

/// Time `g` on `backend` (a copy in its memory): GFLOP/s when `flops` is known, else GB/s
/// of bytes read and written by the computed nodes.
fn perf(
    ctx: &Context,
    g: &Graph,
    backend: &Backend,
    flops: Option<f64>,
    min: Duration,
) -> Result<String, String> {
    let copy = graph_copy(ctx, g, &backend.default_buffer_type()).map_err(|e| e.to_string())?;
    let (c, gv) = (copy.ctx(), copy.graph().as_view());
    backend.graph_compute(c, gv).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut runs = 0u32;
    while runs < 3 || start.elapsed() < min {
        backend.graph_compute(c, gv).map_err(|e| e.to_string())?;
        runs += 1;
    }
    let per_run = start.elapsed().as_secs_f64() / runs as f64;
    Ok(match flops {
        Some(f) => format!("{:.2} GFLOP/s", f / per_run / 1e9),
        None => {
            let bytes: usize = g
                .nodes()
                .iter()
                .filter(|&&n| !(c[n].op() == Op::None || c[n].op().is_view_op()))
                .map(|&n| {
                    c[n].nbytes()
                        + c[n]
                            .srcs()
                            .iter()
                            .flatten()
                            .map(|&s| c[s].nbytes())
                            .sum::<usize>()
                })
                .sum();
            format!("{:.2} GB/s", bytes as f64 / per_run / 1e9)
        }
    })
}
