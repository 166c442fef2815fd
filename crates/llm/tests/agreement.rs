//! Greedy decoding of SmolLM2-135M agrees with llama.cpp's (plain attention path, F16 KV
//! cache, 2 threads): the committed goldens come from llama.cpp itself
//! (`reference/make-goldens.sh`).
//!
//! * `greedy-nofa-native.jsonl`, llama.cpp's native (AVX-512) build, whose summation orders
//!   our kernels follow on every ISA: held exactly, every prompt over all its steps (the same
//!   token at every step, llama.cpp's top-5 logits within 1e-4 of ours).
//! * `greedy-nofa.jsonl` (its AVX2 build) and `greedy-fa.jsonl` (its flash-attention path) sum
//!   in other orders: held to the near-tie rule of `common::golden`, with an exception list
//!   that names the one step and token pair it excuses.

#![allow(clippy::print_stderr)]

mod common;

use common::golden::{self, GoldenRun, Mismatch, Outcome};
use llm::{Llama, LlamaOptions};

/// A divergence from a golden file that the near-tie rule does not allow but that is
/// understood: at `step` of prompt `prompt` we choose `ours` where llama.cpp chose `theirs`.
/// Any other error of that prompt still fails, and so does the prompt agreeing.
struct Excused {
    prompt: usize,
    step: usize,
    ours: u32,
    theirs: u32,
    why: &'static str,
}

/// `greedy-nofa.jsonl` (llama.cpp's AVX2 build): its f16 dot products and vector exp sum in
/// 8-lane orders where ours follow the 16-lane ones of its AVX-512 build, which moves logits of
/// this model by up to ~0.7. llama.cpp's own AVX-512 build makes our choice at this step.
const EXCUSED_AVX2: &[Excused] = &[Excused {
    prompt: 4,
    step: 1,
    ours: 1296,
    theirs: 306,
    why: "Kyoto trip (chat): 0.35 below llama.cpp's best in its AVX2 build",
}];

fn load_model(name: &str) -> Option<(Llama, Vec<GoldenRun>)> {
    let file = golden::model_or_skip(name)?;
    let runs = golden::load(name);
    assert!(runs.len() >= 10, "{name}: {} prompts", runs.len());
    // Our tokenizer and ChatML rendering give llama.cpp's prompt tokens.
    let tok = tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
    let inputs: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(golden::golden_dir().join("prompts.json")).expect("prompts.json"),
    )
    .expect("prompts.json parses");
    assert_eq!(inputs.len(), runs.len(), "{name}: one run per prompt");
    for (run, input) in runs.iter().zip(&inputs) {
        let text = input["text"].as_str().expect("text");
        let rendered = if run.chat {
            llm::render_chat(&[("user", text)], true)
        } else {
            text.to_owned()
        };
        assert_eq!(rendered, run.prompt, "prompt text of {text:?}");
        assert_eq!(
            tok.tokenize(&run.prompt, true, run.chat),
            run.prompt_tokens,
            "prompt tokens of {:?}",
            run.prompt
        );
    }
    let model = Llama::new(
        &file,
        LlamaOptions {
            threads: 2,
            n_ctx: 512,
            ..Default::default()
        },
    )
    .expect("model loads");
    Some((model, runs))
}

/// Every prompt of `name` by the near-tie rule; `excused` lists the divergences allowed
/// beyond it.
fn near_tie_file(name: &str, excused: &[Excused]) {
    let Some((mut model, runs)) = load_model(name) else {
        return;
    };
    let mut failures = Vec::new();
    let mut worst = 0f32;
    for (i, run) in runs.iter().enumerate() {
        let excuse = excused.iter().find(|e| e.prompt == i);
        match (golden::compare(&mut model, run), excuse) {
            (Ok(_), Some(e)) => failures.push(format!(
                "#{i} now agrees by the rule; remove its exception ({})",
                e.why
            )),
            (
                Ok(Outcome {
                    agreed,
                    near_tie,
                    max_logit_diff,
                }),
                None,
            ) => {
                worst = worst.max(max_logit_diff);
                eprintln!(
                    "{name} #{i}: {agreed}/{} steps identical{}, largest logit difference {max_logit_diff:.6}",
                    run.tokens.len(),
                    near_tie.map_or(String::new(), |(s, o, t, g)| format!(
                        ", then a near tie at step {s} (ours {o}, llama.cpp {t}, gap {g:.4})"
                    ))
                );
            }
            (
                Err(Mismatch::Token {
                    step, ours, theirs, ..
                }),
                Some(e),
            ) if (step, ours, theirs) == (e.step, e.ours, e.theirs) => {
                eprintln!("{name} #{i}: excused divergence at step {step}: {}", e.why);
            }
            (Err(m), _) => failures.push(format!("#{i} {:?}: {m}", run.prompt)),
        }
    }
    eprintln!("{name}: largest logit difference over all prompts {worst:.6}");
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn greedy_agrees_with_llama_cpp_avx2_build_by_the_near_tie_rule() {
    near_tie_file("greedy-nofa.jsonl", EXCUSED_AVX2);
}

/// Top-5 logits must match llama.cpp's native build to this: the printed goldens are exact
/// f32 values (`%.9g`), and the same summation orders give the same bits; the margin covers
/// only a last-ulp difference in a logit of about 30.
const EXACT_TOL: f32 = 1e-4;

/// Every prompt of llama.cpp's native build over all its steps, with no near-tie allowance
/// and no exceptions: the same token at every step and its top-5 logits within
/// [`EXACT_TOL`]. This covers the prompt processed as one batch (f16 products in tinyBLAS's
/// order), chat prompts, and the 248-token prompt whose decoding crosses 256 KV cells. A RoPE
/// rounding 1 ulp off (the first product of a rotated pair fused instead of the second)
/// once moved the "Hi" step-0 top logit from 32.032 to 31.644.
#[test]
fn greedy_reproduces_llama_cpp_native_build_exactly() {
    let name = "greedy-nofa-native.jsonl";
    let Some((mut model, runs)) = load_model(name) else {
        return;
    };
    let mut failures = Vec::new();
    let mut worst = 0f32;
    let mut steps = 0;
    for (i, run) in runs.iter().enumerate() {
        match golden::compare_exact(&mut model, run, EXACT_TOL) {
            Ok(d) => {
                worst = worst.max(d);
                steps += run.tokens.len();
            }
            Err(m) => failures.push(format!("#{i} {:?}: {m}", run.prompt)),
        }
    }
    eprintln!(
        "{name}: {steps} steps identical over {} prompts, largest top-5 logit difference {worst:.7}",
        runs.len()
    );
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

/// llama.cpp's default path (flash attention: F16 Q and accumulator for short batches)
/// computes attention in another order than ours (the plain path); held to the near-tie
/// rule.
#[test]
fn greedy_agrees_with_llama_cpp_flash_attention_by_the_near_tie_rule() {
    near_tie_file("greedy-fa.jsonl", &[]);
}
