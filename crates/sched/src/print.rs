//! Human-readable plans: the seed's `GGML_SCHED_DEBUG` layout and the plan-file JSON.
//!
//! The layout is the one llama.cpp users paste into bug reports, so it is kept column for
//! column (fixed widths, truncation, the `NULL` backend of input copies); the only addition
//! is the cause column, which the seed has but compiles out.

use std::fmt::Write as _;

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

pub(crate) fn write_layout(
    s: &Scheduler,
    ctx: &Context,
    graph: &Graph,
    level: u32,
    out: &mut String,
) {
    let splits = s.splits();
    // Split backends are indices of `s.backends()` (the split pass takes them from assigned
    // backends); `cur < splits.len()` is checked before each use.
    let mut cur = 0;
    for (i, &node) in graph.nodes().iter().enumerate() {
        if cur < splits.len() && i == splits[cur].start() {
            let sp = &splits[cur];
            let _ = write!(
                out,
                "\n## SPLIT #{}: {} # {} inputs",
                cur,
                s.backends()[sp.backend()].name(),
                sp.inputs().len()
            );
            for (j, &inp) in sp.inputs().iter().enumerate() {
                if j == 0 {
                    out.push_str(": ");
                }
                let (name, size) = name_size(ctx, inp);
                let _ = write!(out, "[{} ({:>5.5})] ", name, fmt_size(size));
            }
            out.push('\n');
            cur += 1;
        }
        let Ok(t) = ctx.get(node) else { continue };
        if t.op().is_view_op() {
            continue;
        }
        if level > 1 {
            let _ = write!(
                out,
                "node #{:3} ({:>10.10}): {:>20.20} ({:>5.5}) [{:>5.5} {:>8.8}]:",
                i,
                t.op().name(),
                t.name(),
                fmt_size(t.nbytes()),
                backend_name(s, node),
                s.tensor_cause(node)
            );
            for j in 0..MAX_SRC {
                let Some(src) = s.effective_src(ctx, node, j) else {
                    continue;
                };
                let (name, size) = name_size(ctx, src);
                let _ = write!(
                    out,
                    " {:>20.20} ({:>5.5}) [{:>5.5} {:>8.8}]",
                    name,
                    fmt_size(size),
                    backend_name(s, src),
                    s.tensor_cause(src)
                );
            }
            out.push('\n');
        }
    }
}
