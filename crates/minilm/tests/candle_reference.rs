//! Our embeddings (graph → scheduler → backends) against candle's BERT from the same files:
//! every embedding's cosine similarity ≥ 0.99999 and max absolute difference ≤ 1e-4, with
//! all weights on the CPU and with the last 3 layers' weights on the test device.
#![cfg(feature = "candle")]

mod common;

use minilm::{Embedder, EmbedderOptions, Tokenizer, reference::CandleBert};

fn check(offload: usize) {
    let Some(dir) = common::model_dir() else {
        return;
    };
    let mut ours = Embedder::new(EmbedderOptions {
        model_dir: Some(dir.clone()),
        threads: 2,
        offload,
        ..Default::default()
    })
    .unwrap();
    let got = ours.embed(&common::SENTENCES).unwrap();
    if offload > 0 {
        assert!(
            ours.n_splits() > 1,
            "offload {offload} should split the graph"
        );
    }

    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), 256).unwrap();
    let batch = tok.batch(&common::SENTENCES).unwrap();
    assert!(
        batch.lengths.iter().any(|&l| l < batch.n_tokens),
        "needs padding"
    );
    let want = CandleBert::load(&dir).unwrap().embed(&batch).unwrap();

    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), 384);
        let cos = minilm::cosine(g, w);
        let diff = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            cos >= 0.99999,
            "offload {offload}, sentence {i}: cosine {cos}"
        );
        assert!(
            diff <= 1e-4,
            "offload {offload}, sentence {i}: max abs diff {diff}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore = "maps files, runs python and BLAS-sized work")]
fn matches_candle_on_the_cpu() {
    check(0);
}

#[test]
#[cfg_attr(miri, ignore = "maps files, runs python and BLAS-sized work")]
fn matches_candle_with_the_last_three_layers_on_the_test_device() {
    check(3);
}

#[test]
#[cfg_attr(miri, ignore = "maps files and runs python")]
fn a_sentence_embeds_the_same_alone_and_in_a_padded_batch() {
    let Some(dir) = common::model_dir() else {
        return;
    };
    let mut e = Embedder::new(EmbedderOptions {
        model_dir: Some(dir),
        threads: 2,
        ..Default::default()
    })
    .unwrap();
    let batch = e.embed(&common::SENTENCES).unwrap();
    let alone = e.embed(&common::SENTENCES[2..3]).unwrap();
    let cos = minilm::cosine(&batch[2], &alone[0]);
    assert!(
        cos >= 0.99999,
        "padding changed the embedding: cosine {cos}"
    );
}
