//! Greedy decoding of SmolLM2-135M agrees with llama.cpp's (plain attention path, F16 KV
//! cache, 2 threads): the committed goldens `tests/golden/greedy-nofa.jsonl` come from
//! llama.cpp itself (`reference/make-goldens.sh`). We follow llama.cpp's non-flash-attention
//! path; the flash-attention goldens are compared too, by the same rule, to show how close
//! the two reference paths leave us.

#![allow(clippy::print_stderr)]

mod common;

use common::golden::{self, Outcome};
use llm::{Llama, LlamaOptions};

/// Prompts of `greedy-nofa.jsonl` whose first divergence is wider than the rule allows with
/// today's CPU kernels (whose f16 and vector-exp orders follow ggml's AVX-512 build, while the
/// goldens come from its AVX2 build; logits then differ by up to ~0.7 on this model). Each is
/// still decoded and reported; the test fails if any other prompt breaks the rule, and also
/// if a listed one starts to agree (then remove it from the list). llama.cpp's own AVX-512
/// build (same sources, same settings) makes the same choice as we do at the listed step.
const KNOWN_WIDER: &[(usize, &str)] = &[(
    4,
    "Kyoto trip (chat): step 1, ours 1296 vs llama.cpp 306, 0.35 below its best",
)];

fn run_file(name: &str, known: &[(usize, &str)]) {
    let Some(file) = golden::model_or_skip(name) else {
        return;
    };
    let runs = golden::load(name);
    assert!(runs.len() >= 10, "{name}: {} prompts", runs.len());
    // Our tokenizer and ChatML rendering give llama.cpp's prompt tokens.
    let tok = tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
    let inputs: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(golden::golden_dir().join("prompts.json")).expect("prompts.json"),
    )
    .expect("prompts.json parses");
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
    let mut model = Llama::new(
        &file,
        LlamaOptions {
            threads: 2,
            n_ctx: 512,
            ..Default::default()
        },
    )
    .expect("model loads");
    let mut failures = Vec::new();
    let mut worst = 0f32;
    for (i, run) in runs.iter().enumerate() {
        match golden::compare(&mut model, run) {
            Ok(Outcome {
                agreed,
                near_tie,
                max_logit_diff,
            }) => {
                worst = worst.max(max_logit_diff);
                eprintln!(
                    "{name} #{i}: {agreed}/{} steps identical{}, largest logit difference {max_logit_diff:.6}",
                    run.tokens.len(),
                    near_tie.map_or(String::new(), |(s, o, t, g)| format!(
                        ", then a near tie at step {s} (ours {o}, llama.cpp {t}, gap {g:.4})"
                    ))
                );
            }
            Err(e) if known.iter().any(|(k, _)| *k == i) => {
                eprintln!("{name} #{i}: KNOWN wider divergence: {e}");
                continue;
            }
            Err(e) => failures.push(format!("#{i} {:?}: {e}", run.prompt)),
        }
        if let Some((_, what)) = known.iter().find(|(k, _)| *k == i) {
            failures.push(format!(
                "#{i} now agrees by the rule; remove it from KNOWN_WIDER ({what})"
            ));
        }
    }
    eprintln!("{name}: largest logit difference over all prompts {worst:.6}");
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn greedy_agrees_with_llama_cpp_without_flash_attention() {
    run_file("greedy-nofa.jsonl", KNOWN_WIDER);
}

/// The same rule against llama.cpp's native build on an AVX-512 machine
/// (`greedy-nofa-native.jsonl`, whose summation orders our kernels follow): every prompt,
/// with no exception list.
#[test]
fn greedy_agrees_with_llama_cpp_native_build() {
    run_file("greedy-nofa-native.jsonl", &[]);
}

/// llama.cpp's default path (flash attention) computes attention differently (F16 Q and
/// accumulator for short batches); informational: `cargo test -p llm --test agreement --
/// --ignored` shows how far our (plain-path) decode is from it.
#[test]
#[ignore = "we follow the plain attention path; run on demand to compare with flash attention"]
fn greedy_against_llama_cpp_with_flash_attention() {
    run_file("greedy-fa.jsonl", &[]);
}

/// Our kernels follow the summation orders of ggml's AVX-512 build, so the prompt processed
/// as one batch (f16 products in tinyBLAS's order) must reproduce llama.cpp's native
/// (AVX-512) build, `greedy-nofa-native.jsonl`: the same greedy tokens and its top-5 logits to
/// 1e-3 at every step. Two prompts keep it short: the ChatML "Hi" prompt (31 tokens) and the
/// fibonacci one. A RoPE rounding 1 ulp off (the first product of a rotated pair fused
/// instead of the second) moved the "Hi" step-0 top logit from 32.032 to 31.644.
#[test]
fn batched_prompts_reproduce_llama_cpp_native_build() {
    const PROMPTS: [usize; 2] = [0, 9];
    const TOL: f32 = 1e-3;
    let name = "greedy-nofa-native.jsonl";
    let Some(file) = golden::model_or_skip(name) else {
        return;
    };
    let runs = golden::load(name);
    let mut model = Llama::new(
        &file,
        LlamaOptions {
            threads: 2,
            n_ctx: 512,
            ..Default::default()
        },
    )
    .expect("model loads");
    for i in PROMPTS {
        let run = &runs[i];
        model.clear();
        let ours = golden::greedy_tokens(&mut model, &run.prompt_tokens, run.tokens.len());
        let got: Vec<u32> = ours.iter().map(|s| s.0).collect();
        assert_eq!(got, run.tokens, "#{i}: greedy tokens");
        let mut worst = 0f32;
        for (step, ((_, logits), top5)) in ours.iter().zip(&run.top5).enumerate() {
            for &(id, theirs) in top5 {
                let d = (logits[id as usize] - theirs).abs();
                worst = worst.max(d);
                assert!(
                    d <= TOL,
                    "#{i} step {step}: logit of {id} is {} here, {theirs} in llama.cpp",
                    logits[id as usize]
                );
            }
        }
        eprintln!("{name} #{i}: largest top-5 logit difference {worst:.6}");
    }
}
