//! The run trace (`sched::trace`): the scheduler computing a llama-shaped model over the test
//! device and the CPU with a [`ChromeTrace`] sink, and the trace-event file it writes.
//!
//! The file must name one track per backend and hold, for every compute, one span per split
//! (with its node range) preceded by that split's input copies (with the bytes copied); the
//! spans of one track must not overlap. Tracing must not change the results.

mod common;

use std::collections::BTreeMap;

use common::{Cfg, Model, Reference};
use sched::Scheduler;
use sched::trace::ChromeTrace;
use serde_json::Value;
use test_device::{TestDevice, TestDeviceConfig};

const SEED: u64 = 7;

/// One span read back from the file.
#[derive(Debug)]
struct Span {
    name: String,
    tid: u64,
    ts: f64,
    end: f64,
    split: u64,
    nodes: String,
    tensor: Option<String>,
    bytes: Option<u64>,
}

fn read(json: &[u8]) -> (BTreeMap<u64, String>, Vec<Span>) {
    let v: Value = serde_json::from_slice(json).expect("the trace is JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let mut tracks = BTreeMap::new();
    let mut spans = Vec::new();
    for e in events {
        let tid = e["tid"].as_u64().unwrap();
        match e["ph"].as_str().unwrap() {
            "M" => {
                assert_eq!(e["name"], "thread_name");
                tracks.insert(tid, e["args"]["name"].as_str().unwrap().to_owned());
            }
            "X" => {
                let ts = e["ts"].as_f64().unwrap();
                spans.push(Span {
                    name: e["name"].as_str().unwrap().to_owned(),
                    tid,
                    ts,
                    end: ts + e["dur"].as_f64().unwrap(),
                    split: e["args"]["split"].as_u64().unwrap(),
                    nodes: e["args"]["nodes"].as_str().unwrap().to_owned(),
                    tensor: e["args"]["tensor"].as_str().map(str::to_owned),
                    bytes: e["args"]["bytes"].as_u64(),
                });
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    (tracks, spans)
}

#[test]
fn trace_of_a_pipelined_run_has_every_split_and_ordered_non_overlapping_spans() {
    let cfg = Cfg::tiny(2);
    let dev = TestDevice::create(TestDeviceConfig::default()).unwrap();
    let cpu = common::cpu(2);
    // layer 1 on the CPU, layer 2 and the output on the device: splits on both backends
    let place = common::offload(&cpu, &dev, 1);
    let mut model = Model::build(&cfg, &place, SEED);
    let mut sched = Scheduler::builder(vec![dev.init_backend("").unwrap(), cpu])
        .graph_size(4096)
        .copies(2)
        .build()
        .unwrap();
    let names = sched.backend_names();
    let trace = ChromeTrace::new(names.clone());
    assert!(
        sched
            .set_trace_sink(Some(Box::new(trace.clone())))
            .is_none()
    );

    let mut reference = Reference::new(&cfg, SEED, &[]);
    let steps = 3;
    for step in 0..steps {
        sched.alloc_graph(&mut model.ctx, &model.graph).unwrap();
        model.set_inputs(step);
        sched.graph_compute(&mut model.ctx, &model.graph).unwrap();
        assert!(
            model.logits() == reference.step(step),
            "step {step}: tracing changed the result"
        );
    }
    // The sink comes back out; later computes are not traced.
    assert!(sched.set_trace_sink(None).is_some());
    let splits: Vec<(usize, usize, usize, Vec<String>)> = sched
        .splits()
        .iter()
        .map(|s| {
            let inputs = s
                .inputs()
                .iter()
                .map(|&t| model.ctx[t].name().to_owned())
                .collect();
            (s.backend_index(), s.start(), s.end(), inputs)
        })
        .collect();
    assert!(splits.iter().any(|s| s.0 == 0) && splits.iter().any(|s| s.0 == 1));

    let mut json = Vec::new();
    trace.write_json(&mut json).unwrap();
    let (tracks, spans) = read(&json);

    // One named track per backend.
    let want: BTreeMap<u64, String> = names
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, n)| (i as u64, n))
        .collect();
    assert_eq!(tracks, want);

    // Every split of every compute: one compute span on its backend's track, with its node
    // range, after its input copies (tensor and bytes as planned).
    let computes: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].name == "compute")
        .collect();
    assert_eq!(computes.len(), splits.len() * steps as usize);
    let mut prev_end = 0;
    for (n, &i) in computes.iter().enumerate() {
        let k = n % splits.len();
        let (backend, start, end, inputs) = &splits[k];
        let c = &spans[i];
        assert_eq!((c.split, c.tid), (k as u64, *backend as u64), "{c:?}");
        assert_eq!(c.nodes, format!("{start}..{end}"));
        // The final waits of the previous compute (no tensor) come first; then this split's
        // copies and the waits before them.
        let before: Vec<&Span> = spans[prev_end..i]
            .iter()
            .filter(|s| !(s.name == "wait" && s.tensor.is_none()))
            .collect();
        let copies: Vec<&Span> = before
            .iter()
            .copied()
            .filter(|s| s.name == "copy")
            .collect();
        let copied: Vec<&str> = copies
            .iter()
            .map(|s| s.tensor.as_deref().unwrap())
            .collect();
        assert_eq!(copied, *inputs, "split {k}: copies");
        for s in &before {
            assert_eq!((s.split, s.tid), (k as u64, *backend as u64), "{s:?}");
            // 1 ns of slack for the float microseconds
            assert!(
                s.end <= c.ts + 1e-3,
                "{s:?} ends after the compute starts {c:?}"
            );
            assert!(s.name == "copy" || s.name == "wait", "{s:?}");
        }
        for s in &copies {
            assert!(s.bytes.is_some_and(|b| b > 0), "{s:?}");
        }
        prev_end = i + 1;
    }
    // After each compute's last split: one final wait per backend that computed a split, on
    // its track, for the last split it computed, after that split's compute.
    let finals: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "wait" && s.tensor.is_none())
        .collect();
    let backends_used: std::collections::BTreeSet<usize> = splits.iter().map(|s| s.0).collect();
    assert_eq!(finals.len(), backends_used.len() * steps as usize);
    for f in &finals {
        let k = f.split as usize;
        assert_eq!(f.tid, splits[k].0 as u64);
        assert_eq!(
            splits[k + 1..].iter().find(|s| s.0 == splits[k].0),
            None,
            "{f:?}"
        );
        let compute = spans
            .iter()
            .rfind(|s| s.name == "compute" && s.split == f.split && s.ts <= f.ts)
            .expect("a compute before the final wait");
        assert!(compute.end <= f.ts + 1e-3, "{f:?} before {compute:?}");
    }
    assert!(
        spans[prev_end..]
            .iter()
            .all(|s| s.name == "wait" && s.tensor.is_none()),
        "only final waits after the last compute"
    );

    // Spans of one track never overlap.
    for tid in tracks.keys() {
        let mut on: Vec<&Span> = spans.iter().filter(|s| s.tid == *tid).collect();
        on.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        for w in on.windows(2) {
            assert!(
                w[0].end <= w[1].ts,
                "overlap on track {tid}: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }

    // The timeline picture: one lane per backend, one pinned box per span.
    let timeline = trace.timeline_dot("test");
    assert!(timeline.contains("layout=neato"));
    for (i, name) in names.iter().enumerate() {
        assert!(timeline.contains(&format!("lane{i} [")) && timeline.contains(name));
    }
    let boxes = timeline
        .lines()
        .filter(|l| l.trim_start().starts_with('s') && l.contains("!\", width="))
        .count();
    assert_eq!(boxes, spans.len());
}
