//! The padding of the cells a step attends over changes the work, not the results: SmolLM2's
//! logits have the same bits with the visible cells padded to 64 (our default), 128 or 256
//! (llama.cpp's), over a prompt taken as one batch and single-token steps across the
//! padding's boundaries.

mod common;

use llm::{Llama, LlamaOptions};

/// The logits' bits after a 60-token prompt (one batch) and after each of ten single-token
/// steps (positions 60 to 69: the 64-cell padding grows to 128 on the way).
fn logits(model: &mut Llama) -> Vec<Vec<u32>> {
    let prompt: Vec<u32> = (0..60).map(|i| 10 + (i * 37) % 4000).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut out = vec![bits(model.eval(&prompt).unwrap())];
    for t in 0..10 {
        out.push(bits(model.eval(&[100 + t]).unwrap()));
    }
    out
}

#[test]
fn smollm2_logits_keep_their_bits_for_every_kv_padding() {
    let Some(file) = common::golden::model_or_skip("kv_pad") else {
        return;
    };
    let run = |kv_pad: usize| {
        let opts = LlamaOptions {
            threads: 2,
            n_ctx: 512,
            kv_pad,
            ..Default::default()
        };
        logits(&mut Llama::new(&file, opts).unwrap())
    };
    let llama_cpp = run(256);
    for pad in [64, 128] {
        let ours = run(pad);
        let differ = ours.iter().zip(&llama_cpp).position(|(a, b)| a != b);
        assert!(differ.is_none(), "padding {pad}: step {differ:?} differs");
    }
}

#[test]
fn a_padding_that_is_not_a_multiple_of_64_is_refused() {
    let m = common::Synthetic::tiny(3);
    for kv_pad in [0, 32, 100] {
        let opts = LlamaOptions {
            kv_pad,
            ..Default::default()
        };
        let Err(err) = Llama::new(&m, opts) else {
            panic!("padding {kv_pad} accepted");
        };
        assert!(
            matches!(err, llm::LlmError::InvalidOption(_)),
            "{kv_pad}: {err}"
        );
    }
}
