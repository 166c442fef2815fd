//! The graph builder against candle's BERT, through the naive evaluator of
//! `common/naive.rs`: checks the graph (shapes, permutes, mask, pooling) independently of
//! the backends.
#![cfg(feature = "candle")]

mod common;

use graph::Context;
use minilm::{BertConfig, BertWeights, GraphInputs, Tokenizer, WeightFile, build_graph};

fn le<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Runs in CI (about a minute of naive loops in a debug build): the only check of the graph
/// builder that does not go through our backends, so a graph-builder bug and a backend bug
/// cannot hide each other.
#[test]
fn naive_evaluation_of_our_graph_matches_candle() {
    let Some(dir) = common::model_dir() else {
        return;
    };
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let file = WeightFile::open(&dir.join("model.safetensors")).unwrap();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), 256).unwrap();
    // Two short sentences of different lengths: padding is exercised, the naive loops stay
    // quick in a debug build.
    let batch = tok
        .batch(&["I love pasta", "A man is playing a guitar"])
        .unwrap();
    assert!(batch.lengths[0] < batch.lengths[1]);

    let mut ctx = Context::new();
    let w = BertWeights::create(&mut ctx, &file, &cfg).unwrap();
    let g = build_graph(&mut ctx, &w, &cfg, batch.n_tokens, batch.n_batch()).unwrap();
    let inp = GraphInputs::new(&batch);

    let mut ev = common::naive::Naive::new(&ctx);
    for (id, name) in w.all() {
        ev.set(id, file.bytes(file.info(name).unwrap()).to_vec());
    }
    ev.set(g.ids, le(&inp.ids, i32::to_le_bytes));
    ev.set(g.type_ids, le(&inp.type_ids, i32::to_le_bytes));
    ev.set(g.positions, le(&inp.positions, i32::to_le_bytes));
    ev.set(g.mask, le(&inp.mask, f32::to_le_bytes));
    ev.set(g.pool, le(&inp.pool, f32::to_le_bytes));
    ev.compute(&g.graph);
    let mut ours = ev.read(g.output);
    minilm::l2_normalize(&mut ours, cfg.hidden_size);

    let reference = minilm::reference::CandleBert::load(&dir).unwrap();
    let theirs = reference.embed(&batch).unwrap();
    for (b, r) in theirs.iter().enumerate() {
        let o = &ours[b * cfg.hidden_size..(b + 1) * cfg.hidden_size];
        let cos = minilm::cosine(o, r);
        let diff = o
            .iter()
            .zip(r)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(cos >= 0.99999, "sentence {b}: cosine {cos}");
        assert!(diff <= 1e-4, "sentence {b}: max abs diff {diff}");
    }
}
