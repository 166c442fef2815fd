//! The llama graph, KV cache and decode loop on a small synthetic model (random F32
//! weights), checked against a naive forward pass written from the spec; and the typed
//! errors of bad input, each leaving the model usable.

mod common;

use common::{Meta, Synthetic, max_diff};
use graph::ElementType;
use llm::{Llama, LlamaOptions, LlmError, Sampler, Sampling};

fn opts(n_ctx: usize, n_ubatch: usize) -> LlamaOptions {
    LlamaOptions {
        threads: 2,
        n_ctx,
        n_ubatch,
        ..Default::default()
    }
}

const TOKENS: [u32; 9] = [3, 17, 42, 8, 8, 0, 49, 23, 5];
/// Q rounded to F16 for K·Q and probabilities rounded to F16 for V·P in the graph, not in
/// the reference: differences of a few 1e-3 on logits of magnitude ~1.
const TOL: f32 = 2e-2;

#[test]
fn prompt_logits_match_the_naive_reference() {
    let m = Synthetic::tiny(1);
    let mut llama = Llama::new(&m, opts(64, 512)).unwrap();
    for n in [1, 2, 5, TOKENS.len()] {
        llama.clear();
        let got = llama.eval(&TOKENS[..n]).unwrap().to_vec();
        let want = m.reference_logits(&TOKENS[..n]);
        let d = max_diff(&got, &want);
        assert!(d < TOL, "{n} tokens: max logit difference {d}");
    }
}

#[test]
fn micro_batches_and_single_steps_agree_with_one_batch() {
    let m = Synthetic::tiny(2);
    let mut one = Llama::new(&m, opts(64, 512)).unwrap();
    let whole = one.eval(&TOKENS).unwrap().to_vec();
    // Micro-batches of 4 (4 + 4 + 1), then token by token.
    let mut small = Llama::new(&m, opts(64, 4)).unwrap();
    let batched = small.eval(&TOKENS).unwrap().to_vec();
    assert_eq!(small.cache().used(), TOKENS.len());
    small.clear();
    let mut stepped = Vec::new();
    for t in TOKENS {
        stepped = small.eval(&[t]).unwrap().to_vec();
    }
    assert!(
        max_diff(&whole, &batched) < 1e-3,
        "{}",
        max_diff(&whole, &batched)
    );
    assert!(
        max_diff(&whole, &stepped) < 1e-3,
        "{}",
        max_diff(&whole, &stepped)
    );
    let want = m.reference_logits(&TOKENS);
    assert!(max_diff(&stepped, &want) < TOL);
}

#[test]
fn greedy_generation_follows_the_reference_argmax() {
    let m = Synthetic::tiny(3);
    let mut llama = Llama::new(&m, opts(64, 512)).unwrap();
    let mut s = Sampler::new(Sampling::Greedy);
    let mut seen = Vec::new();
    let g = llama
        .generate(&TOKENS[..3], 6, &mut s, &[], |t, l| {
            seen.push((t, l.to_vec()))
        })
        .unwrap();
    assert_eq!(g.tokens.len(), 6);
    let mut ctx: Vec<u32> = TOKENS[..3].to_vec();
    for (t, logits) in seen {
        let want = m.reference_logits(&ctx);
        assert!(max_diff(&logits, &want) < TOL);
        assert_eq!(t, llm::greedy(&logits));
        ctx.push(t);
    }
}

#[test]
fn bad_input_is_a_typed_error_and_the_model_stays_usable() {
    let m = Synthetic::tiny(4);
    let mut llama = Llama::new(&m, opts(16, 512)).unwrap();
    llama.eval(&TOKENS[..4]).unwrap();
    let before = llama.logits().to_vec();
    assert!(matches!(llama.eval(&[]), Err(LlmError::EmptyPrompt)));
    assert!(matches!(
        llama.eval(&[50]),
        Err(LlmError::BadToken { id: 50, .. })
    ));
    assert!(matches!(
        llama.eval(&[1; 13]),
        Err(LlmError::ContextFull {
            used: 4,
            requested: 13,
            n_ctx: 16
        })
    ));
    assert_eq!(llama.cache().used(), 4);
    assert_eq!(llama.logits(), &before[..]);
    // The cache still continues the same sequence.
    let next = llama.eval(&TOKENS[4..]).unwrap().to_vec();
    let want = m.reference_logits(&TOKENS);
    assert!(max_diff(&next, &want) < TOL);
    let mut s = Sampler::new(Sampling::Greedy);
    assert!(matches!(
        llama.generate(&TOKENS, 9, &mut s, &[], |_, _| {}),
        Err(LlmError::ContextFull { .. })
    ));
    assert!(matches!(
        llama.generate(&[], 3, &mut s, &[], |_, _| {}),
        Err(LlmError::EmptyPrompt)
    ));
    let g = llama.generate(&TOKENS, 8, &mut s, &[], |_, _| {}).unwrap();
    assert_eq!(g.tokens.len(), 8);
}

#[test]
fn bad_files_are_typed_errors() {
    let base = Synthetic::tiny(5);
    let o = || opts(16, 512);
    let mut m = base.clone();
    m.meta
        .insert("general.architecture".into(), Meta::Str("falcon".into()));
    assert!(matches!(Llama::new(&m, o()), Err(LlmError::UnknownArchitecture(a)) if a == "falcon"));

    let mut m = base.clone();
    m.tensors.remove("blk.1.ffn_up.weight");
    assert!(
        matches!(Llama::new(&m, o()), Err(LlmError::MissingTensor(n)) if n == "blk.1.ffn_up.weight")
    );

    let mut m = base.clone();
    m.tensors.get_mut("blk.0.attn_k.weight").unwrap().ne = [64, 64, 1, 1];
    assert!(
        matches!(Llama::new(&m, o()), Err(LlmError::WrongShape { name, .. }) if name == "blk.0.attn_k.weight")
    );

    let mut m = base.clone();
    m.tensors.get_mut("blk.0.attn_norm.weight").unwrap().ty = ElementType::F16;
    assert!(
        matches!(Llama::new(&m, o()), Err(LlmError::WrongType { name, .. }) if name == "blk.0.attn_norm.weight")
    );

    let mut m = base.clone();
    m.tensors.get_mut("output_norm.weight").unwrap().offset = m.data.len();
    assert!(matches!(Llama::new(&m, o()), Err(LlmError::Gguf(_))));

    let mut m = base.clone();
    m.meta
        .insert("llama.attention.head_count_kv".into(), Meta::Uint(3));
    assert!(matches!(
        Llama::new(&m, o()),
        Err(LlmError::BadMetadata { .. })
    ));
}

#[test]
fn offloaded_blocks_on_the_test_device_give_the_same_logits() {
    let m = Synthetic::tiny(6);
    let mut cpu = Llama::new(&m, opts(64, 512)).unwrap();
    let want = cpu.eval(&TOKENS).unwrap().to_vec();
    let mut off = Llama::new(
        &m,
        LlamaOptions {
            offload: 1,
            ..opts(64, 512)
        },
    )
    .unwrap();
    let mut got = off.eval(&TOKENS[..5]).unwrap().to_vec();
    for &t in &TOKENS[5..] {
        got = off.eval(&[t]).unwrap().to_vec();
    }
    assert!(off.n_splits() > 1, "the graph should split across devices");
    assert!(max_diff(&got, &want) < 1e-3, "{}", max_diff(&got, &want));
}
