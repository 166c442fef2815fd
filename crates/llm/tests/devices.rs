//! SmolLM2 with blocks on other devices:
//!
//! * on the in-process test device (`--offload`) and on our RPC server started in-process
//!   (`--rpc embedded`), both of which compute with our own CPU kernels, it decodes every
//!   golden prompt exactly as the CPU alone does: the same tokens and every logit with the
//!   same bits;
//! * shared by two real ggml `rpc-server`s (ggml's kernels, another summation order), it
//!   decodes the same tokens by the agreement rule (identical up to a first difference that
//!   the CPU-only run scored within 0.25 of its best).

#![allow(clippy::print_stderr)]

mod common;

use common::golden::{self, real};
use llm::{Llama, LlamaOptions};

/// Every golden prompt with llama.cpp's step count (up to 32; the 248-token prompt crosses
/// 256 KV cells).
fn golden_prompts() -> Vec<(Vec<u32>, usize)> {
    golden::load("greedy-nofa-native.jsonl")
        .into_iter()
        .map(|r| (r.prompt_tokens, r.tokens.len()))
        .collect()
}

fn opts() -> LlamaOptions {
    LlamaOptions {
        threads: 2,
        n_ctx: 512,
        ..Default::default()
    }
}

/// Every golden prompt decoded with `o` gives the CPU-only run's tokens and logits, bit for
/// bit, through a split graph.
fn check_identical(name: &str, file: &gguf::GgufFile, o: LlamaOptions) {
    let mut cpu = Llama::new(file, opts()).unwrap();
    let mut other = Llama::new(file, o).unwrap();
    let prompts = golden_prompts();
    let mut steps = 0;
    for (i, (p, n)) in prompts.iter().enumerate() {
        cpu.clear();
        other.clear();
        let base = golden::greedy_tokens(&mut cpu, p, *n);
        let got = golden::greedy_tokens(&mut other, p, *n);
        assert!(other.n_splits() > 1, "{name}: the graph should be split");
        if let Err(e) = golden::identical_runs(&base, &got) {
            panic!("{name}, prompt #{i}: {e}");
        }
        steps += got.len();
    }
    eprintln!(
        "{name}: {steps} steps over {} prompts, every logit identical to the CPU's",
        prompts.len()
    );
}

#[test]
fn offloaded_blocks_on_the_test_device_compute_the_cpus_bits() {
    let Some(file) = golden::model_or_skip("offload") else {
        return;
    };
    check_identical(
        "offload 10",
        &file,
        LlamaOptions {
            offload: 10,
            ..opts()
        },
    );
}

#[test]
fn blocks_on_an_embedded_rpc_server_compute_the_cpus_bits() {
    let Some(file) = golden::model_or_skip("rpc embedded") else {
        return;
    };
    check_identical(
        "rpc embedded",
        &file,
        LlamaOptions {
            rpc: vec![llm::EMBEDDED.into()],
            offload: 6,
            ..opts()
        },
    );
}

/// Two prompts: ChatML "Hi" (31 tokens) and a plain one, 8 steps each.
fn short_prompts() -> Vec<Vec<u32>> {
    let hi = "1 9690 198 2683 359 253 5356 5646 11173 3365 3511 308 34519 28 7018 411 407 19712 8182 2 198 1 4093 198 26843 2 198 1 520 9531 198";
    vec![
        hi.split(' ').map(|s| s.parse().unwrap()).collect(),
        vec![504, 3575, 282, 4649, 314], // "The capital of France is"
    ]
}

#[test]
fn blocks_shared_by_two_real_ggml_rpc_servers() {
    const N: usize = 8;
    let Some(file) = golden::model_or_skip("rpc real") else {
        return;
    };
    let (Some(a), Some(b)) = (real::start(), real::start()) else {
        return;
    };
    let name = "two ggml rpc-servers";
    let mut cpu = Llama::new(&file, opts()).unwrap();
    let mut other = Llama::new(
        &file,
        LlamaOptions {
            rpc: vec![a.1.clone(), b.1.clone()],
            offload: 8,
            ..opts()
        },
    )
    .unwrap();
    for p in short_prompts() {
        cpu.clear();
        other.clear();
        let base = golden::greedy_tokens(&mut cpu, &p, N);
        let got = golden::greedy_tokens(&mut other, &p, N);
        assert!(other.n_splits() > 1, "{name}: the graph should be split");
        match golden::compare_runs(&base, &got) {
            Ok(d) => eprintln!(
                "{name}: {} tokens agree, largest logit difference {d:.6}",
                got.len()
            ),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}
