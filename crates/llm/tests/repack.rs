//! Weights in the CPU device's extra buffer type (`CPU_REPACK`): by default the matrices of a
//! type the CPU has an interleaved layout for are copied there at load, every other weight
//! stays in place in the mapped file, and the logits are bit for bit those of the model with
//! every weight in the file (`extra_buffer_types: false`, llama.cpp's `--no-repack`).

#![allow(clippy::print_stderr)]

mod common;

use common::Synthetic;
use graph::ElementType;
use llm::{Llama, LlamaOptions};

fn opts(extra: bool) -> LlamaOptions {
    LlamaOptions {
        threads: 2,
        n_ctx: 64,
        n_ubatch: 512,
        extra_buffer_types: extra,
        ..Default::default()
    }
}

/// The logits' bits after a prompt of 5 tokens and after each of 3 single-token steps.
fn logits(model: &mut Llama, prompt: &[u32]) -> Vec<Vec<u32>> {
    model.clear();
    let mut out = vec![bits(model.eval(prompt).unwrap())];
    for t in [7, 1, 30] {
        out.push(bits(model.eval(&[t]).unwrap()));
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Buffer type names of the weights, by weight name.
fn placement(model: &Llama) -> Vec<(String, String)> {
    model.weight_buffer_types().unwrap()
}

#[test]
fn quantized_matrices_go_to_cpu_repack_and_the_logits_keep_their_bits() {
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        let m = Synthetic::tiny(11).quantized(ty);
        let mut packed = Llama::new(&m, opts(true)).unwrap();
        let mut plain = Llama::new(&m, opts(false)).unwrap();
        for (name, buft) in placement(&packed) {
            let matrix = m.tensors[&name].ty == ty;
            let want = if matrix { "CPU_REPACK" } else { "CPU_Mapped" };
            assert_eq!(buft, want, "{ty:?} {name}");
        }
        assert!(placement(&plain).iter().all(|(_, b)| b == "CPU_Mapped"));
        let prompt = [3, 17, 42, 8, 8];
        assert_eq!(
            logits(&mut packed, &prompt),
            logits(&mut plain, &prompt),
            "{ty:?}"
        );
    }
}

#[test]
fn weights_without_a_repacked_layout_stay_in_the_file() {
    // F32 matrices, norms and the tied embeddings (read by the row lookup).
    let m = Synthetic::tiny(12);
    let model = Llama::new(&m, opts(true)).unwrap();
    assert!(placement(&model).iter().all(|(_, b)| b == "CPU_Mapped"));
}

/// SmolLM2 (Q4_1 blocks, tied Q8_0 embeddings): every Q4_1 matrix is repacked, the rest
/// stays mapped, and the logits of a prompt and three steps have the same bits with and
/// without the extra buffer types.
#[test]
fn smollm2_logits_keep_their_bits() {
    let Some(file) = common::golden::model_or_skip("repack") else {
        return;
    };
    let mut packed = Llama::new(&file, opts(true)).unwrap();
    let mut plain = Llama::new(&file, opts(false)).unwrap();
    let placed = placement(&packed);
    let n = placed.iter().filter(|(_, b)| b == "CPU_REPACK").count();
    eprintln!("{n} of {} weights in CPU_REPACK", placed.len());
    for (name, buft) in &placed {
        let q4_1 = file.tensor(name).unwrap().ty() == ElementType::Q4_1;
        let want = if q4_1 { "CPU_REPACK" } else { "CPU_Mapped" };
        assert_eq!(buft, want, "{name}");
    }
    assert_eq!(n, 210, "30 blocks of 7 Q4_1 matrices");
    assert!(placement(&plain).iter().all(|(_, b)| b == "CPU_Mapped"));
    let prompt = [504, 3575, 282, 4649, 314];
    assert_eq!(logits(&mut packed, &prompt), logits(&mut plain, &prompt));
}
