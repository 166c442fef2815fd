//! The pictures `generate --plan-svg/--dot/--trace` draw come from the model's real plan and
//! run: a decode step offloaded to the test device is drawn as several clusters with both
//! backends' tensors, and a traced generation reports, for every step, a compute span of each
//! split on its backend's track, with the input copies of a split before its compute.

mod common;

use common::golden;
use llm::{Llama, LlamaOptions, Sampler, Sampling};
use sched::trace::{ChromeTrace, SpanKind};

fn offloaded() -> LlamaOptions {
    LlamaOptions {
        threads: 2,
        n_ctx: 64,
        offload: 4,
        ..Default::default()
    }
}

#[test]
fn plan_dot_draws_every_split_of_a_decode_step() {
    let Some(file) = golden::model_or_skip("plan dot") else {
        return;
    };
    let mut model = Llama::new(&file, offloaded()).unwrap();
    let dot = model.plan_dot("decode step").unwrap();
    let splits = model.n_splits();
    assert!(
        splits >= 2,
        "4 offloaded blocks should split the step, got {splits}"
    );
    // A split's cluster may be opened more than once (its nodes, then its input copies).
    let clusters: std::collections::BTreeSet<&str> = dot
        .split("subgraph ")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next())
        .collect();
    let want: std::collections::BTreeSet<String> =
        (0..splits).map(|k| format!("cluster_split{k}")).collect();
    assert_eq!(
        clusters,
        want.iter().map(String::as_str).collect(),
        "one cluster per split"
    );
    for name in model.backend_names() {
        assert!(
            dot.contains(&name),
            "backend {name} is missing from the DOT"
        );
    }
    assert!(dot.contains("decode step"), "the title is drawn");
    // The plan is of a step not yet computed: the model still decodes afterwards.
    let mut sampler = Sampler::new(Sampling::Greedy);
    let out = model
        .generate(&[504, 3575, 282], 2, &mut sampler, &[], |_, _| {})
        .unwrap();
    assert_eq!(out.tokens.len(), 2);
}

#[test]
fn trace_of_a_generation_has_every_split_of_every_step() {
    let Some(file) = golden::model_or_skip("trace") else {
        return;
    };
    let mut model = Llama::new(&file, offloaded()).unwrap();
    let trace = ChromeTrace::new(model.backend_names());
    model.set_trace_sink(Some(Box::new(trace.clone())));
    let mut sampler = Sampler::new(Sampling::Greedy);
    let n_new = 3;
    // A 3-token prompt is one step, then one step per new token but the last.
    model
        .generate(&[504, 3575, 282], n_new, &mut sampler, &[], |_, _| {})
        .unwrap();
    let steps = n_new;
    let splits = model.n_splits();
    let spans = trace.spans();
    let computes: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Compute)
        .collect();
    assert_eq!(
        computes.len(),
        steps * splits,
        "one compute span per split per step"
    );
    let backends: std::collections::BTreeSet<usize> = computes.iter().map(|s| s.backend).collect();
    assert_eq!(backends.len(), 2, "both backends computed");
    // Every copy ends before the compute of its split (in the same step) starts.
    for (i, c) in spans
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == SpanKind::Copy)
    {
        let compute = spans[i..]
            .iter()
            .find(|s| s.kind == SpanKind::Compute && s.split == c.split)
            .expect("a copy is followed by its split's compute");
        assert!(c.end <= compute.start, "copy after its compute began");
    }
    let mut json = Vec::new();
    trace.write_json(&mut json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > spans.len());
}
