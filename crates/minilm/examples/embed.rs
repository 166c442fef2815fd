//! Embed sentences with all-MiniLM-L6-v2 computed through the workspace's scheduler and
//! backends (`cargo xtask demo [ARGS]` runs this in release mode).
//!
//! Output goes to stdout (the embeddings' heads and the cosine similarity matrix, or JSON with
//! `--json`); progress and timings go to stderr through `tracing` (`RUST_LOG` to change).
// A command-line program: printing is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use minilm::{Embedder, EmbedderOptions, cosine};

const BUILT_IN: [&str; 6] = [
    "The cat sits outside",
    "A man is playing guitar",
    "The new movie is awesome",
    "A woman watches TV",
    "The dog plays in the garden",
    "The new movie is so great",
];

const USAGE: &str = "\
usage: embed [OPTIONS] [SENTENCE ...]

Embeds the sentences (or a built-in set) with all-MiniLM-L6-v2 through the scheduler.

options:
  --file F          read sentences from F, one per line (blank lines skipped)
  --json            print [{\"sentence\": ..., \"embedding\": [...]}] instead of the summary
  --plan            print the scheduler's split plan (GGML_SCHED_DEBUG layout) first
  --plan-svg F      draw the scheduler's plan of the first batch into F with Graphviz's
                    `dot` (format from F's extension: .svg, .png, ...)
  --dot F           write that plan's Graphviz DOT into F
  --trace F         write a Chrome trace-event file of the run into F (one track per
                    backend; open it in https://ui.perfetto.dev)
  --trace-picture F draw the run's timeline into F with Graphviz (.svg, .png, ...)
  --offload N       place the last N layers' weights on the test device, or on the
                    remote devices when --rpc is given (default there: half the layers)
  --rpc HOST:PORT   a remote device: a server speaking ggml's RPC protocol 7.0.0 (ggml's
                    rpc-server, or `cargo run -p backend-rpc-server --bin rpc-server`); repeatable,
                    the offloaded layers are shared in contiguous runs, in the order given.
                    `--rpc embedded` starts our server in this process on a loopback port
  --threads N       CPU threads (default: all available)
  --batch-size N    sentences per batch (default: all in one)
  --model-dir DIR   model directory (default: $MINILM_MODEL_DIR, then the pip package)
  --profile         log per-op compute times (computes node by node)
  -h, --help        this text";

struct Args {
    sentences: Vec<String>,
    json: bool,
    plan: bool,
    plan_svg: Option<PathBuf>,
    dot: Option<PathBuf>,
    trace: Option<PathBuf>,
    trace_picture: Option<PathBuf>,
    opts: EmbedderOptions,
}

fn parse() -> Result<Option<Args>, String> {
    let mut args = Args {
        sentences: Vec::new(),
        json: false,
        plan: false,
        plan_svg: None,
        dot: None,
        trace: None,
        trace_picture: None,
        opts: EmbedderOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, flag: &str| -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
    };
    let path = |v: Option<String>, flag: &str| -> Result<PathBuf, String> {
        v.map(PathBuf::from)
            .ok_or_else(|| format!("{flag} needs a file"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" => args.json = true,
            "--plan" => args.plan = true,
            "--plan-svg" => args.plan_svg = Some(path(it.next(), "--plan-svg")?),
            "--dot" => args.dot = Some(path(it.next(), "--dot")?),
            "--trace" => args.trace = Some(path(it.next(), "--trace")?),
            "--trace-picture" => {
                args.trace_picture = Some(path(it.next(), "--trace-picture")?);
            }
            "--profile" => args.opts.profile = true,
            "--offload" => args.opts.offload = num(it.next(), "--offload")?,
            "--rpc" => args
                .opts
                .rpc
                .push(it.next().ok_or("--rpc needs HOST:PORT or `embedded`")?),
            "--threads" => args.opts.threads = num(it.next(), "--threads")?,
            "--batch-size" => args.opts.batch_size = num(it.next(), "--batch-size")?,
            "--model-dir" => {
                let d = it.next().ok_or("--model-dir needs a value")?;
                args.opts.model_dir = Some(PathBuf::from(d));
            }
            "--file" => {
                let f = it.next().ok_or("--file needs a value")?;
                let text = std::fs::read_to_string(&f).map_err(|e| format!("{f}: {e}"))?;
                args.sentences.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned),
                );
            }
            "--" => args.sentences.extend(it.by_ref()),
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(format!("unknown option {s:?} (see --help)"));
            }
            _ => args.sentences.push(a),
        }
    }
    if args.sentences.is_empty() {
        args.sentences = BUILT_IN.iter().map(|s| (*s).to_owned()).collect();
    }
    Ok(Some(args))
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let mut embedder = Embedder::new(args.opts.clone())?;
    let mut out = std::io::stdout().lock();
    if args.plan {
        let plan = embedder.plan(&args.sentences, 1)?;
        writeln!(out, "## scheduler plan ({} splits)", embedder.n_splits())?;
        writeln!(out, "{}", plan.trim_end())?;
        writeln!(out)?;
    }
    if args.plan_svg.is_some() || args.dot.is_some() {
        let batch = match args.opts.batch_size {
            0 => &args.sentences[..],
            n => &args.sentences[..n.min(args.sentences.len())],
        };
        let title = format!(
            "MiniLM, {} sentences, {} backends",
            batch.len(),
            embedder.backend_names().len()
        );
        let dot = embedder.plan_dot(batch, &title)?;
        if let Some(f) = &args.dot {
            std::fs::write(f, &dot).map_err(|e| format!("{}: {e}", f.display()))?;
            tracing::info!(file = %f.display(), "plan DOT written");
        }
        if let Some(f) = &args.plan_svg {
            sched::dot::render(&dot, f)?;
            tracing::info!(file = %f.display(), "plan picture written");
        }
    }
    let tracing_on = args.trace.is_some() || args.trace_picture.is_some();
    let trace = tracing_on.then(|| {
        let t = sched::trace::ChromeTrace::new(embedder.backend_names());
        embedder.set_trace_sink(Some(Box::new(t.clone())));
        t
    });
    let t1 = Instant::now();
    let embeddings = embedder.embed(&args.sentences)?;
    if let (Some(t), Some(f)) = (&trace, &args.trace) {
        let file = std::fs::File::create(f).map_err(|e| format!("{}: {e}", f.display()))?;
        t.write_json(std::io::BufWriter::new(file))?;
        tracing::info!(file = %f.display(), spans = t.spans().len(), "trace written");
    }
    if let (Some(t), Some(f)) = (&trace, &args.trace_picture) {
        let title = format!("MiniLM run, {} sentences", args.sentences.len());
        sched::dot::render(&t.timeline_dot(&title), f)?;
        tracing::info!(file = %f.display(), "trace picture written");
    }
    let dt = t1.elapsed();
    tracing::info!(
        sentences = args.sentences.len(),
        elapsed = ?dt,
        sentences_per_s = format!("{:.1}", args.sentences.len() as f64 / dt.as_secs_f64()),
        total = ?t0.elapsed(),
        "embedded"
    );
    if args.opts.profile {
        let p = embedder.take_profile();
        let total: f64 = p.ops.iter().map(|o| o.1.as_secs_f64()).sum();
        for (op, d, n) in &p.ops {
            tracing::info!(
                op = %op,
                nodes = n,
                ms = format!("{:.2}", d.as_secs_f64() * 1e3),
                share = format!("{:.1}%", 100.0 * d.as_secs_f64() / total.max(1e-12)),
                "profile"
            );
        }
    }

    if args.json {
        let items: Vec<serde_json::Value> = args
            .sentences
            .iter()
            .zip(&embeddings)
            .map(|(s, e)| serde_json::json!({ "sentence": s, "embedding": e }))
            .collect();
        serde_json::to_writer(&mut out, &items)?;
        writeln!(out)?;
        return Ok(());
    }

    let dim = embeddings.first().map_or(0, Vec::len);
    writeln!(
        out,
        "## embeddings ({dim} dimensions, unit length; first 6 shown)"
    )?;
    for (i, (s, e)) in args.sentences.iter().zip(&embeddings).enumerate() {
        let head: Vec<String> = e.iter().take(6).map(|x| format!("{x:+.4}")).collect();
        writeln!(out, "[{i}] [{}, …]  {s}", head.join(", "))?;
    }
    writeln!(out)?;
    writeln!(out, "## cosine similarity")?;
    write!(out, "     ")?;
    for j in 0..embeddings.len() {
        write!(out, " {j:>6}")?;
    }
    writeln!(out)?;
    for (i, a) in embeddings.iter().enumerate() {
        write!(out, "[{i:>2}] ")?;
        for b in &embeddings {
            write!(out, " {:>6.3}", cosine(a, b))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
