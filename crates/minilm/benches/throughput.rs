//! Sentences per second for 32 sentences of about 128 tokens on 2 threads: ours (graph →
//! scheduler → CPU backend) against candle's BERT, in the same run. Before the timed part, one
//! profiled pass logs where our time goes per op (through `tracing`, to stderr).
//!
//! Run: `cargo bench -p minilm --features candle --bench throughput`; with
//! `MINILM_ROUNDS=N` it skips criterion and times one batch of ours, then one of candle's,
//! N times in turn, and prints each side's fastest and median sentences/s and their ratios
//! (stdout), for a shared machine where the two sides must see the same load.
#![allow(clippy::print_stderr)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use minilm::{Embedder, EmbedderOptions, Tokenizer, reference::CandleBert};

const THREADS: usize = 2;
const N_SENTENCES: usize = 32;

/// 32 different sentences of about 126 words of common English (one WordPiece token each),
/// i.e. about 128 tokens with `[CLS]` and `[SEP]`.
fn sentences() -> Vec<String> {
    const WORDS: [&str; 48] = [
        "the",
        "small",
        "dog",
        "runs",
        "across",
        "a",
        "green",
        "field",
        "while",
        "children",
        "play",
        "with",
        "red",
        "ball",
        "near",
        "old",
        "house",
        "and",
        "their",
        "mother",
        "reads",
        "book",
        "under",
        "tall",
        "tree",
        "in",
        "warm",
        "summer",
        "afternoon",
        "light",
        "as",
        "birds",
        "sing",
        "from",
        "high",
        "branches",
        "above",
        "quiet",
        "river",
        "that",
        "flows",
        "slowly",
        "toward",
        "distant",
        "town",
        "where",
        "people",
        "work",
    ];
    (0..N_SENTENCES)
        .map(|s| {
            let n = 122 + s % 5;
            (0..n)
                .map(|i| WORDS[(i * 7 + s * 13 + i / 5) % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,throughput=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = match minilm::find_model_dir(None) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    // candle's CPU kernels use rayon's global pool; give it the same number of threads.
    let _ = rayon_threads(THREADS);
    let text = sentences();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), 256).unwrap();
    let batch = tok.batch(&text).unwrap();
    let mean = batch.lengths.iter().sum::<usize>() as f64 / batch.n_batch() as f64;
    tracing::info!(
        sentences = batch.n_batch(),
        padded = batch.n_tokens,
        mean_tokens = mean,
        "batch"
    );

    // One profiled pass: where the time goes.
    let mut profiled = Embedder::new(EmbedderOptions {
        model_dir: Some(dir.clone()),
        threads: THREADS,
        profile: true,
        ..Default::default()
    })
    .unwrap();
    profiled.embed_batch(&batch).unwrap();
    let p = profiled.take_profile();
    let total: f64 = p.ops.iter().map(|o| o.1.as_secs_f64()).sum();
    for (op, d, n) in &p.ops {
        tracing::info!(
            op = %op,
            nodes = n,
            ms = format!("{:.1}", d.as_secs_f64() * 1e3),
            share = format!("{:.1}%", 100.0 * d.as_secs_f64() / total),
            "profile (ours, per op)"
        );
    }
    drop(profiled);

    let mut ours = Embedder::new(EmbedderOptions {
        model_dir: Some(dir.clone()),
        threads: THREADS,
        ..Default::default()
    })
    .unwrap();
    let theirs = CandleBert::load(&dir).unwrap();

    if let Some(rounds) = std::env::var("MINILM_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&r| r > 0)
    {
        interleaved(
            rounds,
            || ours.embed_batch(&batch).map(|_| ()).unwrap(),
            || theirs.embed(&batch).map(|_| ()).unwrap(),
        );
        return;
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(15))
        .configure_from_args();
    let mut g = c.benchmark_group("minilm_32x128_2threads");
    g.throughput(Throughput::Elements(N_SENTENCES as u64));
    g.bench_function("ours", |b| {
        b.iter(|| black_box(ours.embed_batch(&batch).unwrap()))
    });
    g.bench_function("candle", |b| {
        b.iter(|| black_box(theirs.embed(&batch).unwrap()))
    });
    g.finish();
    c.final_summary();
}

/// `rounds` rounds of one call of `ours` then one of `theirs`; sentences/s per side.
#[allow(clippy::print_stdout)]
fn interleaved(rounds: usize, mut ours: impl FnMut(), mut theirs: impl FnMut()) {
    let mut t = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        for (side, f) in [&mut ours as &mut dyn FnMut(), &mut theirs]
            .into_iter()
            .enumerate()
        {
            let s = std::time::Instant::now();
            f();
            t[side].push(N_SENTENCES as f64 / s.elapsed().as_secs_f64());
        }
        println!(
            "round {r}: ours {:.1} sentences/s, candle {:.1} ({:.2}x)",
            t[0][r],
            t[1][r],
            t[0][r] / t[1][r]
        );
    }
    let stat = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() - 1], v[v.len() / 2])
    };
    let ((ob, om), (cb, cm)) = (stat(&mut t[0]), stat(&mut t[1]));
    println!(
        "fastest: ours {ob:.1}, candle {cb:.1} sentences/s ({:.2}x); median: ours {om:.1}, candle {cm:.1} ({:.2}x)",
        ob / cb,
        om / cm
    );
}

fn rayon_threads(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY-free alternative to set_var: candle reads RAYON_NUM_THREADS only through rayon's
    // global pool, which we build here before candle first uses it.
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()?;
    Ok(())
}
