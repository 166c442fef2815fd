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

/// Decodes `run`'s prompt greedily with `model` and compares with llama.cpp by the rule
/// above; `Err` says where and why the comparison failed.
pub fn compare(model: &mut Llama, run: &GoldenRun) -> Result<Outcome, String> {
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
        .map_err(|e| format!("generate failed: {e}"))?;
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
        return match their_top.iter().find(|(t, _)| t == ours) {
            Some(&(_, l)) if best - l <= NEAR_TIE => {
                out.near_tie = Some((i, *ours, theirs, best - l));
                Ok(out)
            }
            Some(&(_, l)) => Err(format!(
                "step {i}: we chose {ours}, llama.cpp {theirs}; llama.cpp scored ours {:.4} below its best (more than {NEAR_TIE})",
                best - l
            )),
            None => Err(format!(
                "step {i}: we chose {ours}, llama.cpp {theirs}; ours is not in llama.cpp's top 5 {their_top:?}"
            )),
        };
    }
    if steps.len() != run.tokens.len() {
        return Err(format!(
            "we produced {} tokens, llama.cpp {}",
            steps.len(),
            run.tokens.len()
        ));
    }
    Ok(out)
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

/// A real ggml `rpc-server` on a free loopback port, killed on drop: backend-rpc's interop
/// helper, shared so that both crates apply one rule. Without `RPC_SERVER_BIN` the test skips
/// with a message, and fails instead when `CI` is set (`.ci/run` fails when the server cannot
/// be built, so under CI a missing binary is a broken setup, not a reason to skip).
#[path = "../../../backend-rpc/tests/common/real.rs"]
pub mod real;
