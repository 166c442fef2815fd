//! Human-readable plans: the seed's `GGML_SCHED_DEBUG` layout and the plan-file JSON.
//!
//! The layout is the one llama.cpp users paste into bug reports, so it is kept column for
//! column (fixed widths, truncation, the `NULL` backend of input copies); the only addition
//! is the cause column, which the seed has but compiles out.

use std::fmt::Write;

use graph::{Context, Graph, MAX_SRC, TensorId};

use crate::sched::Scheduler;

/// `fmt_size`: whole MiB from 1 MiB on, else whole KiB.
pub fn fmt_size(bytes: usize) -> String {
    if bytes >= 1024 * 1024 {
        format!("{}M", bytes / 1024 / 1024)
    } else {
        format!("{}K", bytes / 1024)
    }
}

fn backend_name(s: &Scheduler, t: TensorId) -> &str {
    // `tensor_backend` answers only indices of `s.backends()`.
    match s.tensor_backend(t) {
        Some(b) => s.backends()[b].name(),
        None => "NULL",
    }
}

/// Name and size of `t` in `ctx`, or `?` and 0 when `ctx` does not hold it: the caller passes
/// the context, and a plan's inputs and copies need not be in it (another context, or this
/// one rewound since).
fn name_size(ctx: &Context, t: TensorId) -> (&str, usize) {
    ctx.get(t).map_or(("?", 0), |t| (t.name(), t.nbytes()))
}

/// A plan in the seed's `GGML_SCHED_DEBUG` layout, from [`Scheduler::layout`]: formatting it
/// writes the layout, so a log line or a `String` gets it without an intermediate buffer.
///
/// ```
/// use sched::fixture::GraphFile;
/// let file = GraphFile::from_json(r#"{
///   "graph_size": 16,
///   "backends": [{"name": "GPU0", "device_type": "gpu"}, {"name": "CPU", "device_type": "cpu"}],
///   "tensors": [
///     {"name": "w", "type": "f32", "ne": [8, 8], "buffer": "GPU0"},
///     {"name": "x", "type": "f32", "ne": [8, 2], "flags": ["input"]},
///     {"name": "y", "op": "MUL_MAT", "src": ["w", "x"]}],
///   "expand": ["y"]}"#)?;
/// let (b, sched) = file.schedule()?;
/// let layout: sched::Layout<'_> = sched.layout(&b.ctx, &b.graph, 2);
/// let text = format!("{layout}");
/// assert!(text.starts_with("\n## SPLIT #0: GPU0 # 1 inputs: [x (   0K)] \n"));
/// assert!(text.contains("MUL_MAT"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct Layout<'a> {
    pub(crate) sched: &'a Scheduler,
    pub(crate) ctx: &'a Context,
    pub(crate) graph: &'a Graph,
    pub(crate) level: u32,
}

impl std::fmt::Debug for Layout<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Display for Layout<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_layout(self.sched, self.ctx, self.graph, self.level, f)
    }
}

fn write_layout(
    s: &Scheduler,
    ctx: &Context,
    graph: &Graph,
    level: u32,
    out: &mut impl Write,
) -> std::fmt::Result {
    let splits = s.splits();
    // `cur < splits.len()` is checked before each use.
    let mut cur = 0;
    for (i, &node) in graph.nodes().iter().enumerate() {
        if cur < splits.len() && i == splits[cur].start() {
            let sp = &splits[cur];
            write!(
                out,
                "\n## SPLIT #{}: {} # {} inputs",
                cur,
                sp.backend().name(),
                sp.inputs().len()
            )?;
            for (j, &inp) in sp.inputs().iter().enumerate() {
                if j == 0 {
                    out.write_str(": ")?;
                }
                let (name, size) = name_size(ctx, inp);
                write!(out, "[{} ({:>5.5})] ", name, fmt_size(size))?;
            }
            out.write_char('\n')?;
            cur += 1;
        }
        let Ok(t) = ctx.get(node) else { continue };
        if t.op().is_view_op() {
            continue;
        }
        if level > 1 {
            write!(
                out,
                "node #{:3} ({:>10.10}): {:>20.20} ({:>5.5}) [{:>5.5} {:>8.8}]:",
                i,
                t.op().name(),
                t.name(),
                fmt_size(t.nbytes()),
                backend_name(s, node),
                s.tensor_cause(node)
            )?;
            for j in 0..MAX_SRC {
                let Some(src) = s.effective_src(ctx, node, j) else {
                    continue;
                };
                let (name, size) = name_size(ctx, src);
                write!(
                    out,
                    " {:>20.20} ({:>5.5}) [{:>5.5} {:>8.8}]",
                    name,
                    fmt_size(size),
                    backend_name(s, src),
                    s.tensor_cause(src)
                )?;
            }
            out.write_char('\n')?;
        }
    }
    Ok(())
}
