//! SmolLM2 with blocks on other devices decodes the same tokens as on the CPU alone, by the
//! agreement rule (identical up to a first difference that the CPU-only run scored within
//! 0.25 of its best): the last blocks on the in-process test device (`--offload`), on our
//! RPC server started in-process (`--rpc embedded`), and shared by two real ggml
//! `rpc-server`s.

#![allow(clippy::print_stderr)]

mod common;

use common::golden::{self, real};
use llm::{Llama, LlamaOptions};

/// Two prompts: ChatML "Hi" (31 tokens) and a plain one.
fn prompts() -> Vec<Vec<u32>> {
    let hi = "1 9690 198 2683 359 253 5356 5646 11173 3365 3511 308 34519 28 7018 411 407 19712 8182 2 198 1 4093 198 26843 2 198 1 520 9531 198";
    vec![
        hi.split(' ').map(|s| s.parse().unwrap()).collect(),
        vec![504, 3575, 282, 4649, 314], // "The capital of France is"
    ]
}

const N: usize = 8;

fn opts() -> LlamaOptions {
    LlamaOptions {
        threads: 2,
        n_ctx: 256,
        ..Default::default()
    }
}

fn check(name: &str, file: &gguf::GgufFile, o: LlamaOptions) {
    let mut cpu = Llama::new(file, opts()).unwrap();
    let mut other = Llama::new(file, o).unwrap();
    for p in prompts() {
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

#[test]
fn offloaded_blocks_on_the_test_device() {
    let Some(file) = golden::model_or_skip("offload") else {
        return;
    };
    check(
        "offload 10",
        &file,
        LlamaOptions {
            offload: 10,
            ..opts()
        },
    );
}

#[test]
fn blocks_on_an_embedded_rpc_server() {
    let Some(file) = golden::model_or_skip("rpc embedded") else {
        return;
    };
    check(
        "rpc embedded",
        &file,
        LlamaOptions {
            rpc: vec![llm::EMBEDDED.into()],
            offload: 6,
            ..opts()
        },
    );
}

#[test]
fn blocks_shared_by_two_real_ggml_rpc_servers() {
    let Some(file) = golden::model_or_skip("rpc real") else {
        return;
    };
    let (Some(a), Some(b)) = (real::start(), real::start()) else {
        return;
    };
    check(
        "two ggml rpc-servers",
        &file,
        LlamaOptions {
            rpc: vec![a.1.clone(), b.1.clone()],
            offload: 8,
            ..opts()
        },
    );
}
