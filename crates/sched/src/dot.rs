//! A picture of a plan: Graphviz DOT of the scheduled graph, and rendering it with `dot`.
//!
//! Why Graphviz: the plans worth looking at have hundreds to about a thousand tensors in a
//! few splits, and what a reader needs is the splits as boxes in graph order with the data
//! flowing through them. `dot`'s layered layout with clusters does exactly that and stays
//! legible at that size; the Rust layout crates we know of (layout-rs, for one) have no
//! clusters and were not made for graphs this big. So the library writes DOT (plain text, no
//! dependency) and [`render`] hands it to the `dot` program (Debian's `graphviz` package).
//!
//! What the picture shows:
//!
//! * every split as a cluster, labelled with its index, backend, node range and inputs;
//! * every tensor filled with its backend's colour (white: none assigned); compute ops as
//!   rounded boxes, views dashed, weights as cylinders, KV-cache tensors (leafs that a `CPY`
//!   writes, or in a buffer of usage `any`) as 3-D boxes, graph inputs as inverted houses;
//! * input copies as red boxes in the split that reads them, each fed by one thick red edge
//!   from the tensor copied and labelled with the bytes copied;
//! * splits in columns, in order (top to bottom, then left to right), so that a long graph
//!   is not one very tall column;
//! * on hover (each node's SVG `<title>`), the tensor's op, shape, backend and the rule that
//!   chose the backend, e.g. `1.wgt0: pass 1, follows the weight in source 0`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use backend_core::{BufferUsage, storage_usage};
use graph::{Context, Graph, MAX_SRC, Op, TensorFlags, TensorId};

use crate::sched::{Cause, Scheduler};

/// Backend colours by backend index (a colour-blind-safe qualitative palette); the last
/// backend (always a CPU) takes grey so that offloaded work stands out.
const PALETTE: [&str; 8] = [
    "#4e79a7", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f", "#e15759",
];
const CPU_GREY: &str = "#a0a0a0";
/// Above this many nodes a plan's DOT asks `dot` for a cheaper layout (see `write_dot`).
const LARGE_PLAN_NODES: usize = 400;

/// The colour of backend `backend` of `n_backends` in the pictures (plans and traces).
pub fn backend_colour(backend: usize, n_backends: usize) -> &'static str {
    if backend + 1 == n_backends {
        CPU_GREY
    } else {
        PALETTE[backend % PALETTE.len()]
    }
}

/// `colour` mixed with white: `alpha` of the colour (hex `#rrggbb` in, out).
fn tint(colour: &str, alpha: f32) -> String {
    let c = u32::from_str_radix(colour.trim_start_matches('#'), 16).unwrap_or(0);
    let mix = |shift: u32| {
        let v = ((c >> shift) & 0xff) as f32;
        (v * alpha + 255.0 * (1.0 - alpha)).round() as u32
    };
    format!("#{:02x}{:02x}{:02x}", mix(16), mix(8), mix(0))
}

/// What a rule of [`Cause`] means, for the hover text.
pub fn cause_meaning(cause: Cause) -> String {
    match cause {
        Cause::None => "no rule recorded".into(),
        Cause::Dst => "pass 1, the tensor's own buffer".into(),
        Cause::ViewSrc => "pass 1, the buffer of the tensor it views".into(),
        Cause::Input => "pass 1, graph inputs go to the last (CPU) backend".into(),
        Cause::Offload => "pass 1, a higher-priority backend offloads an op on host weights".into(),
        Cause::Weight(i) => format!("pass 1, follows the weight in source {i}"),
        Cause::Expand => "pass 2, expanded from a neighbouring node".into(),
        Cause::Best => "pass 3, the backend with the most usable inputs".into(),
        Cause::Upgrade => {
            "pass 3, upgraded to a higher-priority backend sharing the buffer type".into()
        }
        Cause::FromViewSrc => "pass 4, a view follows the tensor it views".into(),
        Cause::FromConsumer => "pass 4, a source follows its consumer".into(),
        Cause::Copy => "pass 5, an input copy made by the scheduler".into(),
        Cause::User => "set by the user (set_tensor_backend)".into(),
    }
}

/// How a tensor is drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Compute,
    View,
    Weight,
    KvCache,
    Input,
    OtherLeaf,
}

impl Kind {
    fn shape(self) -> &'static str {
        match self {
            Kind::Compute | Kind::View => "box",
            Kind::Weight => "cylinder",
            Kind::KvCache => "box3d",
            Kind::Input => "invhouse",
            Kind::OtherLeaf => "note",
        }
    }
    fn style(self) -> &'static str {
        match self {
            Kind::Compute => "rounded,filled",
            Kind::View => "dashed,filled",
            _ => "filled",
        }
    }
}

/// The root a view chain ends at.
fn view_root(ctx: &Context, mut t: TensorId) -> TensorId {
    for _ in 0..64 {
        match ctx.get(t).ok().and_then(|x| x.view_src()) {
            Some(v) => t = v,
            None => break,
        }
    }
    t
}

fn shape_text(ctx: &Context, t: TensorId) -> String {
    let Ok(x) = ctx.get(t) else {
        return String::new();
    };
    let ne = x.ne();
    let n = x.n_dims().max(1);
    let dims: Vec<String> = ne[..n].iter().map(i64::to_string).collect();
    format!(
        "{} [{}] {}",
        x.ty().name(),
        dims.join(", "),
        bytes_text(x.nbytes())
    )
}

/// Bytes for a label: B under 1 KiB, then KiB / MiB with one decimal.
fn bytes_text(b: usize) -> String {
    if b < 1024 {
        format!("{b} B")
    } else if b < 1024 * 1024 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    }
}

/// A DOT string literal.
fn q(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Escape for an HTML-like label.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes the plan of the last split of `graph` as Graphviz DOT (see the module docs for what
/// is drawn). `title` heads the picture.
///
/// ```
/// use sched::fixture::GraphFile;
/// let file = GraphFile::from_json(r#"{
///   "graph_size": 64,
///   "backends": [{"name": "GPU0", "device_type": "gpu"}, {"name": "CPU", "device_type": "cpu"}],
///   "tensors": [
///     {"name": "w", "type": "f32", "ne": [8, 8], "buffer": "GPU0"},
///     {"name": "x", "type": "f32", "ne": [8, 2], "flags": ["input"]},
///     {"name": "y", "op": "MUL_MAT", "src": ["w", "x"]}],
///   "expand": ["y"]}"#)?;
/// let (built, sched) = file.schedule()?;
/// let mut dot = String::new();
/// sched::dot::write_dot(&sched, &built.ctx, &built.graph, "example", &mut dot);
/// assert!(dot.starts_with("digraph plan {"));
/// assert!(dot.contains("subgraph cluster_split0"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_dot(s: &Scheduler, ctx: &Context, graph: &Graph, title: &str, out: &mut String) {
    let nb = s.n_backends();
    let splits = s.splits();
    let nodes = graph.nodes();
    let leafs = graph.leafs();

    // Split of each node position; KV-cache leafs (roots of CPY destinations).
    let mut split_of = vec![usize::MAX; nodes.len()];
    for (k, sp) in splits.iter().enumerate() {
        for slot in split_of.iter_mut().take(sp.end()).skip(sp.start()) {
            *slot = k;
        }
    }
    let mut written: Vec<TensorId> = Vec::new();
    for &n in nodes {
        if let Ok(t) = ctx.get(n)
            && t.op() == Op::Cpy
            && let Some(dst) = t.src(1)
        {
            written.push(view_root(ctx, dst));
        }
    }

    // Node ids: the SVG <title> of a node is its id, so the id is the hover text.
    let id_of = |t: TensorId, pos: &str| -> String {
        let Ok(x) = ctx.get(t) else {
            return format!("{pos} ?");
        };
        let backend = s
            .tensor_backend(t)
            .map_or("no backend", |b| s.backends()[b].name());
        let cause = s.tensor_cause(t);
        let rule = if cause == Cause::None {
            String::new()
        } else {
            format!(" · {cause}: {}", cause_meaning(cause))
        };
        format!(
            "{pos} {} · {} · {} · {backend}{rule}",
            x.name(),
            x.op().name(),
            shape_text(ctx, t)
        )
    };
    let mut ids: HashMap<TensorId, String> = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        ids.insert(n, id_of(n, &format!("#{i}")));
    }
    for (i, &l) in leafs.iter().enumerate() {
        ids.entry(l)
            .or_insert_with(|| id_of(l, &format!("leaf {i}")));
    }

    let kind_of = |t: TensorId, is_leaf: bool| -> Kind {
        let Ok(x) = ctx.get(t) else {
            return Kind::OtherLeaf;
        };
        if !is_leaf {
            return if x.op().is_view_op() {
                Kind::View
            } else {
                Kind::Compute
            };
        }
        if x.flags().contains(TensorFlags::INPUT) {
            Kind::Input
        } else if written.contains(&t)
            || x.storage().and_then(storage_usage) == Some(BufferUsage::Any)
        {
            Kind::KvCache
        } else if x.storage().is_some() {
            Kind::Weight
        } else {
            Kind::OtherLeaf
        }
    };

    let node_line = |out: &mut String, t: TensorId, kind: Kind, indent: &str| {
        let Ok(x) = ctx.get(t) else { return };
        let (fill, line) = match s.tensor_backend(t) {
            Some(b) => (
                tint(backend_colour(b, nb), 0.45),
                backend_colour(b, nb).to_owned(),
            ),
            None => ("#ffffff".to_owned(), "#606060".to_owned()),
        };
        let label = if kind == Kind::Compute || kind == Kind::View {
            format!("{}\n{}", x.name(), x.op().name())
        } else {
            x.name().to_owned()
        };
        let _ = writeln!(
            out,
            "{indent}{} [label={}, shape={}, style={}, fillcolor=\"{fill}\", color=\"{line}\"{}];",
            q(&ids[&t]),
            q(&label),
            kind.shape(),
            q(kind.style()),
            if kind == Kind::View {
                ", fontsize=8, height=0.3"
            } else {
                ""
            }
        );
    };

    // Where each leaf goes: into the split of its first consumer when they share a backend
    // (keeps weight edges short), else outside every cluster.
    let mut leaf_home: HashMap<TensorId, usize> = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        let Ok(t) = ctx.get(n) else { continue };
        for src in t.srcs_used().iter().flatten() {
            if leafs.contains(src)
                && !leaf_home.contains_key(src)
                && s.tensor_backend(*src).is_some()
                && s.tensor_backend(*src) == splits.get(split_of[i]).map(|sp| sp.backend_index())
            {
                leaf_home.insert(*src, split_of[i]);
            }
        }
    }

    let _ = writeln!(out, "digraph plan {{");
    let _ = writeln!(
        out,
        "  graph [rankdir=TB, newrank=true, nodesep=0.12, ranksep=0.22, \
         fontname=\"Helvetica\", fontsize=11, labelloc=t, labeljust=l];"
    );
    if nodes.len() > LARGE_PLAN_NODES {
        // `dot`'s rank and crossing optimisation grows fast with size: a whole SmolLM2 decode
        // step (about 1,000 nodes, 300 weights) did not finish in 15 minutes, and with one
        // network-simplex pass and a tenth of the crossing-minimisation budget it draws in
        // about 13 s (the layout is then less compact, not wrong).
        let _ = writeln!(out, "  graph [nslimit=1, nslimit1=1, mclimit=0.1];");
    }
    let _ = writeln!(
        out,
        "  node [fontname=\"Helvetica\", fontsize=9, height=0.32, margin=\"0.06,0.02\", penwidth=1.2];"
    );
    let _ = writeln!(
        out,
        "  edge [color=\"#00000070\", arrowsize=0.5, penwidth=0.8];"
    );

    // Title and legend as an HTML-like label.
    let mut legend = String::new();
    let _ = write!(
        legend,
        "<table border=\"0\" cellspacing=\"2\" cellpadding=\"2\"><tr><td align=\"left\" colspan=\"{}\"><b>{}</b> — {} splits, {} nodes, {} leafs{}</td></tr><tr>",
        nb + 6,
        html(title),
        s.n_splits(),
        nodes.len(),
        leafs.len(),
        if s.n_copies() > 1 {
            format!(
                "; {} pipeline copies (this plan: copy {})",
                s.n_copies(),
                s.cur_copy()
            )
        } else {
            String::new()
        }
    );
    for b in 0..nb {
        let _ = write!(
            legend,
            "<td bgcolor=\"{}\" border=\"1\" color=\"{}\">&nbsp;{}&nbsp;</td>",
            tint(backend_colour(b, nb), 0.45),
            backend_colour(b, nb),
            html(s.backends()[b].name())
        );
    }
    let _ = write!(
        legend,
        "<td>&nbsp; rounded box: op</td><td>dashed: view</td><td>cylinder: weight</td>\
         <td>3-D box: KV cache</td><td>house: graph input</td>\
         <td><font color=\"#d62728\"><b>red: input copy</b></font></td></tr></table>"
    );
    let _ = writeln!(out, "  label=<{legend}>;");

    // Columns of splits (see the edges below) and their order.
    let column = split_columns(splits, nodes.len());
    let heads: Vec<&String> = (0..splits.len())
        .filter(|&k| k == 0 || column[k] != column[k - 1])
        .filter_map(|k| nodes.get(splits[k].start()).map(|n| &ids[n]))
        .collect();
    if heads.len() > 1 {
        // An invisible root, declared before everything else, whose out-edges keep their
        // order puts the column heads left to right in split order (a same-rank chain does
        // not hold across clusters, nor does the root when declared last).
        let _ = writeln!(
            out,
            "  \"columns\" [style=invis, shape=point, width=0, height=0, ordering=out];"
        );
        for h in &heads {
            let _ = writeln!(out, "  \"columns\" -> {} [style=invis];", q(h));
        }
    }

    for (k, sp) in splits.iter().enumerate() {
        let b = sp.backend_index();
        let inputs: Vec<String> = sp
            .inputs()
            .iter()
            .map(|&t| {
                ctx.get(t).map_or(String::from("?"), |x| {
                    format!("{} ({})", x.name(), bytes_text(x.nbytes()))
                })
            })
            .collect();
        let mut label = format!(
            "split {k}: {} · nodes {}..{}",
            s.backends()[b].name(),
            sp.start(),
            sp.end()
        );
        if !inputs.is_empty() {
            let shown: Vec<&str> = inputs.iter().take(4).map(String::as_str).collect();
            let more = if inputs.len() > 4 {
                format!(", +{} more", inputs.len() - 4)
            } else {
                String::new()
            };
            let _ = write!(label, "\ncopies in: {}{more}", shown.join(", "));
        }
        let _ = writeln!(out, "  subgraph cluster_split{k} {{");
        let _ = writeln!(
            out,
            "    label={}; style=\"rounded,filled\"; fillcolor=\"{}\"; color=\"{}\"; penwidth=2; fontsize=12;",
            q(&label),
            tint(backend_colour(b, nb), 0.12),
            backend_colour(b, nb)
        );
        for &l in leafs {
            if leaf_home.get(&l) == Some(&k) {
                node_line(out, l, kind_of(l, true), "    ");
            }
        }
        for &n in &nodes[sp.start().min(nodes.len())..sp.end().min(nodes.len())] {
            node_line(out, n, kind_of(n, false), "    ");
        }
        let _ = writeln!(out, "  }}");
    }
    // Nodes outside every split (only when the graph was not split) and homeless leafs.
    for (i, &n) in nodes.iter().enumerate() {
        if split_of[i] == usize::MAX {
            node_line(out, n, kind_of(n, false), "  ");
        }
    }
    for &l in leafs {
        if !leaf_home.contains_key(&l) {
            node_line(out, l, kind_of(l, true), "  ");
        }
    }

    // Edges. A source a split reads through an input copy goes to the copy (a red node in
    // the split's cluster) by one thick red edge labelled with the bytes copied; the
    // consumers read the copy.
    //
    // Layout: consecutive splits stack in columns of about equal node counts, and the columns
    // stand left to right in split order. Edges between columns do not constrain the ranks,
    // so each column is laid out from the top (one long graph would otherwise be one very
    // tall column); the first nodes of the columns share a rank, chained left to right by
    // invisible edges.
    // The split a tensor is drawn next to: its own, its home's, or (a leaf outside every
    // cluster) its first consumer's, so that such a leaf sits above that consumer.
    let mut near: HashMap<TensorId, usize> = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        near.insert(n, split_of[i]);
    }
    for (i, &n) in nodes.iter().enumerate() {
        let Ok(t) = ctx.get(n) else { continue };
        for src in t.srcs_used().iter().flatten() {
            near.entry(*src)
                .or_insert_with(|| leaf_home.get(src).copied().unwrap_or(split_of[i]));
        }
    }
    let col_of = |t: TensorId| -> Option<usize> { column.get(*near.get(&t)?).copied() };
    let mut copies: Vec<TensorId> = Vec::new();
    for (i, &n) in nodes.iter().enumerate() {
        let Ok(t) = ctx.get(n) else { continue };
        let here = column.get(split_of[i]).copied();
        for j in 0..MAX_SRC {
            let Some(src) = t.src(j) else { continue };
            let Some(from) = ids.get(&src).cloned() else {
                continue;
            };
            match s.effective_src(ctx, n, j) {
                Some(copy) if copy != src => {
                    let copy_id = ids
                        .entry(copy)
                        .or_insert_with(|| format!("copy into split {} of {from}", split_of[i]))
                        .clone();
                    if !copies.contains(&copy) {
                        copies.push(copy);
                        let bytes = ctx.get(src).map_or(0, |x| x.nbytes());
                        let name = ctx.get(copy).map_or("copy", |x| x.name());
                        let k = split_of[i];
                        let label = format!("{name}\ncopy {}", bytes_text(bytes));
                        let _ = writeln!(
                            out,
                            "  subgraph cluster_split{k} {{ {} [label={}, shape=box, style=\"rounded,filled\", \
                             fillcolor=\"#fde0dd\", color=\"#d62728\", fontcolor=\"#a50f15\", penwidth=2, \
                             fontsize=8, height=0.3]; }}",
                            q(&copy_id),
                            q(&label),
                        );
                        let _ = writeln!(
                            out,
                            "  {} -> {} [color=\"#d62728\", penwidth=2.4, arrowsize=0.8{}];",
                            q(&from),
                            q(&copy_id),
                            if col_of(src) == here {
                                ""
                            } else {
                                ", constraint=false"
                            }
                        );
                    }
                    let _ = writeln!(out, "  {} -> {};", q(&copy_id), q(&ids[&n]));
                }
                _ if col_of(src) != here => {
                    let _ = writeln!(out, "  {} -> {} [constraint=false];", q(&from), q(&ids[&n]));
                }
                _ => {
                    let _ = writeln!(out, "  {} -> {};", q(&from), q(&ids[&n]));
                }
            }
        }
    }
    let _ = writeln!(out, "}}");
}

/// The column of each split: consecutive splits fill a column up to about
/// `n_nodes / columns` nodes, with `columns` growing like the square root of the node count
/// (about 35 nodes high per column for each column wide, which keeps the picture roughly
/// upright).
fn split_columns(splits: &[crate::Split], n_nodes: usize) -> Vec<usize> {
    let columns = ((n_nodes as f64 / 35.0).sqrt().round() as usize).clamp(1, splits.len().max(1));
    let budget = n_nodes.div_ceil(columns).max(1);
    let mut out = Vec::with_capacity(splits.len());
    let (mut col, mut filled) = (0, 0);
    for sp in splits {
        let n = sp.end().saturating_sub(sp.start());
        if filled > 0 && filled + n > budget + budget / 8 && col + 1 < columns {
            col += 1;
            filled = 0;
        }
        filled += n;
        out.push(col);
    }
    out
}

/// Why [`render`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The `dot` program could not be started.
    #[error(
        "could not run Graphviz's `dot` ({0}); install it (Debian/Ubuntu: `apt-get install graphviz`) or write the DOT alone with --dot"
    )]
    NoDot(std::io::Error),
    /// `dot` failed.
    #[error("`dot -T{format}` failed: {stderr}")]
    Failed {
        /// The output format asked for.
        format: String,
        /// What `dot` said.
        stderr: String,
    },
    /// Writing the output file failed.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Renders DOT text to `out` with Graphviz's `dot`; the format is the file's extension
/// (`svg`, `png`, `pdf`, …; `dot` writes the DOT text itself).
///
/// ```no_run
/// sched::dot::render("digraph { a -> b }", std::path::Path::new("ab.svg"))?;
/// # Ok::<(), sched::dot::RenderError>(())
/// ```
pub fn render(dot: &str, out: &Path) -> Result<(), RenderError> {
    let format = out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("svg")
        .to_ascii_lowercase();
    if format == "dot" || format == "gv" {
        return std::fs::write(out, dot).map_err(|source| RenderError::Write {
            path: out.display().to_string(),
            source,
        });
    }
    let mut child = Command::new("dot")
        .arg(format!("-T{format}"))
        .arg("-o")
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(RenderError::NoDot)?;
    let write = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(dot.as_bytes()));
    let output = child.wait_with_output().map_err(RenderError::NoDot)?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() || matches!(write, Some(Err(_))) {
        return Err(RenderError::Failed { format, stderr });
    }
    Ok(())
}
