//! Debug-layout snapshots of our own graph files (`tests/graphs/*.graph.json`).
//!
//! The graph files are written by `write_graph_files` (ignored; run it with `--ignored` after
//! changing a case) from the cases below, and each snapshot was read against the seed's rules
//! before it was accepted.

use std::path::{Path, PathBuf};

use sched::fixture::{BackendSpec, GraphFile, OpsSpec, TensorSpec};
use test_fixtures::llama_file::LlamaConfig;

fn graphs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/graphs")
}

fn op(name: &str, op: &str, src: &[&str]) -> TensorSpec {
    TensorSpec::op(name, op, src)
}

fn except(b: BackendSpec, ops: &[&str]) -> BackendSpec {
    BackendSpec {
        supports_ops: Some(OpsSpec::Except {
            except: ops.iter().map(|s| (*s).to_owned()).collect(),
        }),
        ..b
    }
}

fn only(b: BackendSpec, ops: &[&str]) -> BackendSpec {
    BackendSpec {
        supports_ops: Some(OpsSpec::Only {
            only: ops.iter().map(|s| (*s).to_owned()).collect(),
        }),
        ..b
    }
}

fn blas() -> BackendSpec {
    only(
        BackendSpec {
            name: "BLAS".into(),
            device_type: "accel".into(),
            buffer_type: Some("CPU".into()),
            host: Some(true),
            ..Default::default()
        },
        &["MUL_MAT"],
    )
}

fn small(
    name: &str,
    backends: Vec<BackendSpec>,
    tensors: Vec<TensorSpec>,
    expand: &[&str],
) -> GraphFile {
    GraphFile {
        name: name.into(),
        graph_size: 256,
        parallel: false,
        backends,
        tensors,
        expand: expand.iter().map(|s| (*s).to_owned()).collect(),
        assign: Default::default(),
    }
}

/// CPU-computed tensors c0..c{n-1} all consumed by a GPU accumulation chain.
fn many_inputs(name: &str, n: usize, pair_at: Option<usize>) -> GraphFile {
    let mut t = vec![TensorSpec::leaf("wg", "f32", &[64, 64]).in_buffer("GPU0")];
    for i in 0..n {
        t.push(TensorSpec::leaf(&format!("wc{i}"), "f32", &[64, 64]).in_buffer("CPU"));
    }
    t.push(TensorSpec::leaf("x", "f32", &[64, 4]).flag("input"));
    for i in 0..n {
        t.push(op(&format!("c{i}"), "MUL_MAT", &[&format!("wc{i}"), "x"]));
    }
    t.push(op("h", "MUL_MAT", &["wg", "x"]));
    let mut prev = "h".to_owned();
    let mut i = 0;
    while i < n {
        let name = format!("acc{i}");
        if Some(i) == pair_at && i + 1 < n {
            // one node with two new inputs at once
            t.push(op(
                &format!("pair{i}"),
                "ADD",
                &[&format!("c{i}"), &format!("c{}", i + 1)],
            ));
            t.push(op(&name, "ADD", &[&prev, &format!("pair{i}")]));
            i += 2;
        } else {
            t.push(op(&name, "ADD", &[&prev, &format!("c{i}")]));
            i += 1;
        }
        prev = name;
    }
    let mut out = op("out", "SCALE", &[&prev]).flag("output");
    out.scale = Some(0.5);
    t.push(out);
    let mut expand: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    expand.push("out".into());
    GraphFile {
        name: name.into(),
        graph_size: 256,
        parallel: false,
        backends: vec![BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")],
        tensors: t,
        expand,
        assign: Default::default(),
    }
}

fn cases() -> Vec<(&'static str, GraphFile)> {
    let mut v: Vec<(&'static str, GraphFile)> = Vec::new();
    let l = |n: usize| LlamaConfig::tiny(n);

    // weights on each backend
    v.push(("llama-cpu-only-L2", l(2).graph_file("cpu only")));
    v.push((
        "llama-gpu-full-L2",
        l(2).offload("GPU0", 3).graph_file("all on GPU"),
    ));
    v.push((
        "llama-gpu-partial-L4-k2",
        l(4).offload("GPU0", 2).graph_file("2 of 4 layers"),
    ));
    v.push((
        "llama-gpu-partial-L4-k4",
        l(4).offload("GPU0", 4).graph_file("layers, not output"),
    ));
    let mut q = l(3).offload("GPU0", 2);
    q.wtype = "q4_0".into();
    v.push((
        "llama-gpu-partial-L3-q4_0",
        q.graph_file("quantized weights"),
    ));
    // offload of ops on host weights
    let mut c = l(2);
    c.backends.insert(
        0,
        BackendSpec {
            offload_ops: vec!["MUL_MAT".into()],
            ..BackendSpec::gpu("GPU0")
        },
    );
    v.push((
        "llama-cpuweights-offload-mul_mat-L2",
        c.graph_file("offload MUL_MAT"),
    ));
    let mut c = l(2);
    c.backends.insert(0, BackendSpec::gpu("GPU0"));
    v.push((
        "llama-cpuweights-gpu-idle-L2",
        c.graph_file("GPU without offload"),
    ));
    // an op unsupported in the middle of a GPU run
    let mut c = l(2).offload("GPU0", 3);
    c.backends[0] = except(BackendSpec::gpu("GPU0"), &["ROPE"]);
    v.push(("llama-gpu-no-rope-L2", c.graph_file("ROPE on CPU")));
    let mut c = l(2).offload("GPU0", 3);
    c.backends[0] = except(BackendSpec::gpu("GPU0"), &["UNARY"]);
    v.push(("llama-gpu-no-unary-L2", c.graph_file("SILU on CPU")));
    // KV cache on the CPU while weights are on the GPU
    let mut c = l(2).offload("GPU0", 3);
    c.cache_buffers = Some(vec!["CPU".into(); 2]);
    v.push(("llama-gpu-cache-on-cpu-L2", c.graph_file("cache on host")));
    // CPY into a view of a cache the GPU cannot write: rejected
    let mut c = l(1).offload("GPU0", 2);
    c.backends[0] = except(BackendSpec::gpu("GPU0"), &["CPY"]);
    v.push(("error-llama-gpu-no-cpy-L1", c.graph_file("rejected")));
    // a backend sharing the CPU buffer type
    let mut c = l(2);
    c.backends.insert(0, blas());
    v.push(("llama-blas-L2", c.graph_file("BLAS + CPU")));
    let mut c = l(2).offload("GPU0", 1);
    c.backends.insert(1, blas());
    v.push(("llama-gpu-blas-L2", c.graph_file("GPU + BLAS + CPU")));
    // two GPU-type backends
    let mut c = l(4).offload("GPU1", 5);
    c.backends.insert(0, BackendSpec::gpu("GPU0"));
    c.layer_buffers[0] = "GPU0".into();
    c.layer_buffers[1] = "GPU0".into();
    v.push(("llama-2gpu-L4", c.graph_file("split layers")));
    let mut c2 = c.clone();
    c2.backends[1].reads_buffer_types = vec!["GPU0".into()];
    v.push((
        "llama-2gpu-L4-gpu1-reads-gpu0",
        c2.graph_file("peer access"),
    ));
    let mut c3 = c.clone();
    c3.backends[0].buffer_type = Some("VRAM".into());
    c3.backends[1].buffer_type = Some("VRAM".into());
    for b in c3.layer_buffers.iter_mut() {
        *b = "VRAM".into();
    }
    c3.output_buffer = "VRAM".into();
    v.push((
        "llama-2gpu-shared-buft-L4",
        c3.graph_file("upgrade to GPU0"),
    ));
    // parallel copies
    let mut c = l(2).offload("GPU0", 3);
    c.parallel = true;
    v.push(("llama-gpu-full-L2-parallel", c.graph_file("pipeline")));
    let mut c = l(4).offload("GPU0", 2);
    c.parallel = true;
    v.push((
        "llama-gpu-partial-L4-parallel",
        c.graph_file("pipeline, partial"),
    ));
    // user assignments
    let mut f = l(2).offload("GPU0", 3).graph_file("user");
    f.assign.insert("kq.0".into(), "CPU".into());
    f.assign.insert("ffn_inp.1".into(), "CPU".into());
    v.push(("llama-gpu-full-L2-assign", f));
    let mut f = l(2).graph_file("user on GPU");
    f.backends.insert(0, BackendSpec::gpu("GPU0"));
    f.assign.insert("attn_out.1".into(), "GPU0".into());
    f.assign.insert("logits".into(), "GPU0".into());
    v.push(("llama-cpuweights-assign-gpu-L2", f));
    // larger
    v.push((
        "llama-gpu-partial-L10-k7",
        l(10).offload("GPU0", 7).graph_file("10 layers"),
    ));

    // views of weights
    v.push((
        "weight-views-gpu-and-cpu",
        small(
            "weight views",
            vec![BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")],
            vec![
                TensorSpec::leaf("w", "f32", &[64, 128]).in_buffer("GPU0"),
                TensorSpec::leaf("wc", "f32", &[64, 64]).in_buffer("CPU"),
                TensorSpec::leaf("x", "f32", &[64, 4]).flag("input"),
                {
                    let mut t = op("w_top", "VIEW", &["w"]);
                    t.ne = Some(vec![64, 64]);
                    t
                },
                op("wc_t", "TRANSPOSE", &["wc"]),
                op("wc_tc", "CONT", &["wc_t"]),
                op("h1", "MUL_MAT", &["w_top", "x"]),
                op("h2", "MUL_MAT", &["wc_tc", "h1"]),
                op("h3", "MUL_MAT", &["wc", "h2"]),
                op("out", "ADD", &["h3", "h1"]).flag("output"),
            ],
            &["out"],
        ),
    ));
    // a weight no backend can use with its op: copied to the op's backend
    v.push((
        "weight-copied-get_rows-unsupported-on-cpu",
        small(
            "weight copied",
            vec![
                BackendSpec::gpu("GPU0"),
                except(BackendSpec::cpu("CPU"), &["GET_ROWS"]),
            ],
            vec![
                TensorSpec::leaf("tok", "f32", &[64, 100]).in_buffer("CPU"),
                TensorSpec::leaf("w", "f32", &[64, 64]).in_buffer("GPU0"),
                TensorSpec::leaf("ids", "i32", &[4]).flag("input"),
                op("emb", "GET_ROWS", &["tok", "ids"]),
                op("h", "MUL_MAT", &["w", "emb"]).flag("output"),
            ],
            &["h"],
        ),
    ));
    // ROPE does not follow its weight source
    v.push((
        "rope-exempt-from-weights",
        small(
            "rope",
            vec![BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")],
            vec![
                TensorSpec::leaf("wr", "f32", &[16, 4, 8]).in_buffer("GPU0"),
                TensorSpec::leaf("pos", "i32", &[8]).flag("input"),
                TensorSpec::leaf("wc", "f32", &[16, 16]).in_buffer("CPU"),
                {
                    let mut t = op("r", "ROPE", &["wr", "pos"]);
                    t.n_dims = Some(16);
                    t
                },
                {
                    let mut t = op("rr", "RESHAPE", &["r"]);
                    t.ne = Some(vec![16, 32]);
                    t
                },
                op("h", "MUL_MAT", &["wc", "rr"]).flag("output"),
            ],
            &["h"],
        ),
    ));
    // input flags: inputs consumed only on the GPU
    v.push((
        "inputs-only-used-on-gpu",
        small(
            "inputs",
            vec![BackendSpec::gpu("GPU0"), BackendSpec::cpu("CPU")],
            vec![
                TensorSpec::leaf("w", "f32", &[32, 32]).in_buffer("GPU0"),
                TensorSpec::leaf("x", "f32", &[32, 4]).flag("input"),
                TensorSpec::leaf("mask", "f32", &[32, 4]).flag("input"),
                TensorSpec::leaf("bias", "f32", &[32]).flag("input"),
                op("h", "MUL_MAT", &["w", "x"]),
                op("hb", "ADD", &["h", "bias"]),
                {
                    let mut t = op("p", "SOFT_MAX", &["hb", "mask"]);
                    t.scale = Some(0.5);
                    t
                },
                op("out", "MUL", &["p", "x"]).flag("output"),
            ],
            &["out"],
        ),
    ));
    // the split input limit
    v.push((
        "split-inputs-11-into-gpu",
        many_inputs("11 inputs", 11, None),
    ));
    v.push((
        "split-inputs-25-into-gpu",
        many_inputs("25 inputs", 25, None),
    ));
    v.push((
        "error-split-inputs-overflow",
        many_inputs("two new inputs at 9", 11, Some(8)),
    ));
    // nodes plus leafs beyond the reference's hash set: rejected
    let mut f = many_inputs("too large", 6, None);
    f.graph_size = 16;
    v.push(("error-graph-larger-than-hash-set", f));
    v
}

#[test]
#[ignore = "writes tests/graphs from the cases; run after changing a case"]
fn write_graph_files() {
    std::fs::create_dir_all(graphs_dir()).unwrap();
    for (name, f) in cases() {
        std::fs::write(graphs_dir().join(format!("{name}.graph.json")), f.to_json()).unwrap();
    }
}

#[test]
fn graph_files_are_up_to_date() {
    for (name, f) in cases() {
        let p = graphs_dir().join(format!("{name}.graph.json"));
        let on_disk = GraphFile::from_json(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(on_disk, f, "{name}: run write_graph_files");
    }
}

/// Every case is a different graph: a case whose knob the generator ignores (as
/// `cache_buffers` once was) would otherwise snapshot another case's plan under its own name.
#[test]
fn no_two_cases_are_the_same_graph() {
    let cases = cases();
    for (i, (a, fa)) in cases.iter().enumerate() {
        for (b, fb) in &cases[i + 1..] {
            let (mut fa, mut fb) = (fa.clone(), fb.clone());
            fa.name.clear();
            fb.name.clear();
            assert_ne!(fa, fb, "cases {a} and {b} describe the same graph");
        }
    }
}

fn describe(f: &GraphFile) -> String {
    match f.schedule() {
        Err(e) => format!("error: {e}\n"),
        Ok((b, s)) => {
            let mut out = format!(
                "n_splits {} n_copies {}\nbuffer sizes:",
                s.n_splits(),
                s.n_copies()
            );
            for i in 0..s.n_backends() {
                out.push_str(&format!(
                    " {}={}",
                    s.backends()[i].name(),
                    s.buffer_size(i).unwrap()
                ));
            }
            out.push('\n');
            s.write_layout(&b.ctx, &b.graph, 2, &mut out);
            out
        }
    }
}

#[test]
fn debug_layout_snapshots() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(graphs_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".graph.json"))
        .collect();
    files.sort();
    assert!(files.len() >= 25);
    for p in files {
        let name = p
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".graph.json")
            .to_owned();
        let f = GraphFile::from_json(&std::fs::read_to_string(&p).unwrap()).unwrap();
        insta::assert_snapshot!(name, describe(&f));
    }
}
