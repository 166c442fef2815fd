//! Reading the llama.cpp golden files and comparing a greedy decode with them.
//!
//! The rule (issue 18, item 6): generated tokens identical up to the first step where they
//! differ; that first difference is allowed only where llama.cpp itself scored our token
//! within [`NEAR_TIE`] of its best (a near tie), and the comparison of that prompt ends there.

use std::path::{Path, PathBuf};

use llm::{Llama, Sampler, Sampling};
use serde::Deserialize;

/// Largest gap, in llama.cpp's own logits, between its best token and ours at the first step
/// where the two differ.
pub const NEAR_TIE: f32 = 0.25;

/// One line of `greedy-*.jsonl`.
#[derive(Clone, Debug, Deserialize)]
pub struct GoldenRun {
    pub prompt: String,
    pub chat: bool,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Per step, llama.cpp's five best `(id, logit)`.
    pub top5: Vec<Vec<(u32, f32)>>,
}

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The runs of golden file `name` (e.g. `greedy-nofa.jsonl`).
pub fn load(name: &str) -> Vec<GoldenRun> {
    let path = golden_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (golden files are committed)", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// The model file, or `None` (with a message) when it is not installed and `CI` is unset.
/// Under CI a missing model fails the test.
pub fn model_or_skip(test: &str) -> Option<gguf::GgufFile> {
    match llm::find_model(None) {
        Ok(p) => Some(llm::open_gguf(&p).expect("the installed model file opens")),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("{test}: SKIPPED, model not installed: {e}");
            None
        }
        Err(e) => panic!("{test}: CI is set and the model is missing: {e}"),
    }
}

/// What one prompt's comparison found.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Steps whose tokens agreed.
    pub agreed: usize,
    /// The step of an allowed near-tie divergence: (step, ours, theirs, gap in their logits).
    pub near_tie: Option<(usize, u32, u32, f32)>,
    /// Largest |our logit − llama.cpp's| over their top-5 ids and our top-5 ids (where they
    /// list them), over the compared steps.
    pub max_logit_diff: f32,
}

/// Why a decode failed a comparison with llama.cpp.
#[derive(Clone, Debug, PartialEq)]
pub enum Mismatch {
    /// At `step` we chose `ours` where llama.cpp chose `theirs`; `gap` is how far below its
    /// best llama.cpp scored our token (`None`: ours is not in its top 5).
    Token {
        step: usize,
        ours: u32,
        theirs: u32,
        gap: Option<f32>,
    },
    /// The tokens agree, but llama.cpp's logit of `id` at `step` is further from ours than the
    /// tolerance allows.
    Logit {
        step: usize,
        id: u32,
        ours: f32,
        theirs: f32,
    },
    /// We produced `ours` tokens where llama.cpp produced `theirs`.
    Length { ours: usize, theirs: usize },
    /// Decoding itself failed.
    Generate(String),
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Token {
                step,
                ours,
                theirs,
                gap: Some(gap),
            } => write!(
                f,
                "step {step}: we chose {ours}, llama.cpp {theirs}; llama.cpp scored ours {gap:.4} below its best"
            ),
            Mismatch::Token {
                step, ours, theirs, ..
            } => write!(
                f,
                "step {step}: we chose {ours}, llama.cpp {theirs}; ours is not in llama.cpp's top 5"
            ),
            Mismatch::Logit {
                step,
                id,
                ours,
                theirs,
            } => write!(
                f,
                "step {step}: the logit of {id} is {ours} here, {theirs} in llama.cpp"
            ),
            Mismatch::Length { ours, theirs } => {
                write!(f, "we produced {ours} tokens, llama.cpp {theirs}")
            }
            Mismatch::Generate(e) => write!(f, "generate failed: {e}"),
        }
    }
}

fn top5(logits: &[f32]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    ids.truncate(5);
    ids
}

/// Greedy decode of `run`'s prompt for as many steps as llama.cpp made: per step, our token
/// and our logits.
fn decode(model: &mut Llama, run: &GoldenRun) -> Result<Vec<(u32, Vec<f32>)>, Mismatch> {
    let mut sampler = Sampler::new(Sampling::Greedy);
    let mut steps: Vec<(u32, Vec<f32>)> = Vec::new();
    model
        .generate(
            &run.prompt_tokens,
            run.tokens.len(),
            &mut sampler,
            &llm::SMOLLM2_EOG,
            |t, l| steps.push((t, l.to_vec())),
        )
        .map_err(|e| Mismatch::Generate(e.to_string()))?;
    Ok(steps)
}

/// Decodes `run`'s prompt greedily with `model` and compares with llama.cpp by the near-tie
/// rule above; `Err` says where and why the comparison failed.
pub fn compare(model: &mut Llama, run: &GoldenRun) -> Result<Outcome, Mismatch> {
    let steps = decode(model, run)?;
    let mut out = Outcome::default();
    for (i, (ours, logits)) in steps.iter().enumerate() {
        let theirs = run.tokens[i];
        let their_top = &run.top5[i];
        for &(id, l) in their_top {
            out.max_logit_diff = out.max_logit_diff.max((logits[id as usize] - l).abs());
        }
        for id in top5(logits) {
            if let Some(&(_, l)) = their_top.iter().find(|(t, _)| *t == id) {
                out.max_logit_diff = out.max_logit_diff.max((logits[id as usize] - l).abs());
            }
        }
        if *ours == theirs {
            out.agreed += 1;
            continue;
        }
        let best = their_top[0].1;
        let gap = their_top
            .iter()
            .find(|(t, _)| t == ours)
            .map(|&(_, l)| best - l);
        return match gap {
            Some(g) if g <= NEAR_TIE => {
                out.near_tie = Some((i, *ours, theirs, g));
                Ok(out)
            }
            _ => Err(Mismatch::Token {
                step: i,
                ours: *ours,
                theirs,
                gap,
            }),
        };
    }
    if steps.len() != run.tokens.len() {
        return Err(Mismatch::Length {
            ours: steps.len(),
            theirs: run.tokens.len(),
        });
    }
    Ok(out)
}

/// Decodes `run`'s prompt greedily and holds it to llama.cpp exactly: the same token at every
/// step (no near-tie allowance) and each of llama.cpp's top-5 logits within `tol` of ours at
/// every step. Returns the largest top-5 logit difference.
pub fn compare_exact(model: &mut Llama, run: &GoldenRun, tol: f32) -> Result<f32, Mismatch> {
    let steps = decode(model, run)?;
    let mut worst = 0f32;
    for (step, (ours, logits)) in steps.iter().enumerate() {
        let theirs = run.tokens[step];
        if *ours != theirs {
            let best = run.top5[step][0].1;
            let gap = run.top5[step]
                .iter()
                .find(|(t, _)| t == ours)
                .map(|&(_, l)| best - l);
            return Err(Mismatch::Token {
                step,
                ours: *ours,
                theirs,
                gap,
            });
        }
        for &(id, l) in &run.top5[step] {
            let d = (logits[id as usize] - l).abs();
            worst = worst.max(d);
            if d.is_nan() || d > tol {
                return Err(Mismatch::Logit {
                    step,
                    id,
                    ours: logits[id as usize],
                    theirs: l,
                });
            }
        }
    }
    if steps.len() != run.tokens.len() {
        return Err(Mismatch::Length {
            ours: steps.len(),
            theirs: run.tokens.len(),
        });
    }
    Ok(worst)
}

/// Tokens of a greedy run of `prompt` (for comparing two configurations of ours).
pub fn greedy_tokens(model: &mut Llama, prompt: &[u32], n: usize) -> Vec<(u32, Vec<f32>)> {
    let mut sampler = Sampler::new(Sampling::Greedy);
    let mut steps = Vec::new();
    model
        .generate(prompt, n, &mut sampler, &llm::SMOLLM2_EOG, |t, l| {
            steps.push((t, l.to_vec()))
        })
        .expect("generate");
    steps
}

/// Compares a run of ours (`other`) with a reference run of ours (`base`, the CPU-only one)
/// by the same rule as against llama.cpp, the reference's logits judging a divergence.
/// Returns the largest logit difference over the compared steps.
pub fn compare_runs(base: &[(u32, Vec<f32>)], other: &[(u32, Vec<f32>)]) -> Result<f32, String> {
    let mut worst = 0f32;
    for (i, ((bt, bl), (ot, ol))) in base.iter().zip(other).enumerate() {
        worst = bl
            .iter()
            .zip(ol)
            .map(|(a, b)| (a - b).abs())
            .fold(worst, f32::max);
        if bt == ot {
            continue;
        }
        let best = bl[*bt as usize];
        let gap = best - bl[*ot as usize];
        return if gap <= NEAR_TIE {
            Ok(worst)
        } else {
            Err(format!(
                "step {i}: {ot} instead of {bt}, scored {gap:.4} below the best by the reference run"
            ))
        };
    }
    if base.len() != other.len() {
        return Err(format!("{} tokens instead of {}", other.len(), base.len()));
    }
    Ok(worst)
}

/// `other` is `base` bit for bit: the same tokens, and every logit of every step with the
/// same f32 bits. `Err` names the first step and id that differ.
pub fn identical_runs(base: &[(u32, Vec<f32>)], other: &[(u32, Vec<f32>)]) -> Result<(), String> {
    if base.len() != other.len() {
        return Err(format!("{} steps instead of {}", other.len(), base.len()));
    }
    for (step, ((bt, bl), (ot, ol))) in base.iter().zip(other).enumerate() {
        if bt != ot {
            return Err(format!("step {step}: token {ot} instead of {bt}"));
        }
        if bl.len() != ol.len() {
            return Err(format!(
                "step {step}: {} logits instead of {}",
                ol.len(),
                bl.len()
            ));
        }
        if let Some((id, (b, o))) = bl
            .iter()
            .zip(ol)
            .enumerate()
            .find(|(_, (b, o))| b.to_bits() != o.to_bits())
        {
            return Err(format!(
                "step {step}: logit of {id} is {o:e} instead of {b:e}"
            ));
        }
    }
    Ok(())
}

/// A real ggml `rpc-server` on a free loopback port, killed on drop: backend-rpc's interop
/// helper, shared so that both crates apply one rule. Without `RPC_SERVER_BIN` the test skips
/// with a message, and fails instead when `CI` is set (`.ci/run` fails when the server cannot
/// be built, so under CI a missing binary is a broken setup, not a reason to skip).
#[path = "../../../backend-rpc/tests/common/real.rs"]
pub mod real;
