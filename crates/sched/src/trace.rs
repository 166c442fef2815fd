//! A picture of a run: what [`Scheduler::graph_compute`](crate::Scheduler::graph_compute) did,
//! span by span, as a Chrome trace-event file (open it in <https://ui.perfetto.dev> or
//! `chrome://tracing`).
//!
//! The scheduler reports to an optional [`TraceSink`] (installed with
//! [`Scheduler::set_trace_sink`](crate::Scheduler::set_trace_sink)); without one, computing
//! costs one branch per split and input, and no clock is read. Each [`TraceSpan`] is one
//! input copy, one wait (an event wait or a backend synchronize before a copy) or one split's
//! compute, on the track of the backend that runs the split, with the split's index and node
//! range and the bytes copied.
//!
//! Times are host times: a span covers the scheduler's call. On a backend that computes
//! synchronously (the CPU) that is the work itself; on one that queues work (the test device,
//! GPUs) a compute span covers the submission, and the time the device then takes shows up in
//! the waits that follow: before a later split's copies, or at the end of `graph_compute`,
//! where the wait for each backend is a span on that backend's track. Spans on different
//! tracks never run at once on the host; overlap between backends shows as one backend's
//! spans running while another's queued work is still unfinished (up to the wait for it).
//!
//! Why not `tracing-chrome`: it puts spans on one track per thread (or per span id), and the
//! scheduler issues every backend's work from one thread, so it cannot draw one track per
//! backend; it also takes its times when a `tracing` span is entered, as a process-wide
//! subscriber layer, while this sink is per scheduler and free when absent. The writer here is
//! small and typed: [`ChromeTrace`] collects spans and serialises `serde` structs of the
//! trace-event format's complete (`"X"`) and metadata (`"M"`) events.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use graph::TensorName;
use serde::Serialize;

/// What a [`TraceSpan`] covers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanKind {
    /// One split's compute.
    Compute,
    /// One input copy into the split's backend.
    Copy,
    /// Waiting: before a copy, for the split backend's event or for a backend to finish;
    /// at the end of `graph_compute`, for the backend to finish the split's queued work.
    Wait,
}

impl SpanKind {
    /// The span's name in the trace.
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Compute => "compute",
            SpanKind::Copy => "copy",
            SpanKind::Wait => "wait",
        }
    }
}

/// One span of a run, reported to a [`TraceSink`].
#[derive(Copy, Clone, Debug)]
pub struct TraceSpan {
    /// What it covers.
    pub kind: SpanKind,
    /// The backend whose track it belongs to: the split's backend.
    pub backend: usize,
    /// The split's index.
    pub split: usize,
    /// The split's node range `[start, end)` in the user graph.
    pub nodes: (usize, usize),
    /// Copies: the tensor copied; waits: the tensor whose copy waits.
    pub tensor: Option<TensorName>,
    /// Copies: bytes copied; otherwise 0.
    pub bytes: usize,
    /// Waits: the backend waited for.
    pub waits_for: Option<usize>,
    /// When the call began.
    pub start: Instant,
    /// When it returned.
    pub end: Instant,
}

/// Receives the spans of a run (see the module docs).
pub trait TraceSink: Send {
    /// One span, reported when it ends.
    fn span(&mut self, span: &TraceSpan);
}

/// Collects spans and writes them as a Chrome trace-event file. Clones share one collection,
/// so a clone can be given to the scheduler and the original kept to write the file.
///
/// ```
/// use sched::trace::ChromeTrace;
/// let trace = ChromeTrace::new(vec!["GPU0".into(), "CPU".into()]);
/// // sched.set_trace_sink(Some(Box::new(trace.clone())));  ... compute ...
/// let mut json = Vec::new();
/// trace.write_json(&mut json)?;
/// let v: serde_json::Value = serde_json::from_slice(&json)?;
/// assert_eq!(v["traceEvents"][0]["args"]["name"], "GPU0"); // one named track per backend
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ChromeTrace {
    backends: Arc<Vec<String>>,
    origin: Instant,
    spans: Arc<Mutex<Vec<TraceSpan>>>,
}

impl ChromeTrace {
    /// An empty trace whose tracks are named after `backends` (in the scheduler's order);
    /// times count from now.
    pub fn new(backends: Vec<String>) -> Self {
        ChromeTrace {
            backends: Arc::new(backends),
            origin: Instant::now(),
            spans: Arc::default(),
        }
    }

    /// The spans collected so far.
    pub fn spans(&self) -> Vec<TraceSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Writes `{"traceEvents": [...], "displayTimeUnit": "ms"}`: a `thread_name` metadata
    /// event per backend (tid = backend index), then a complete event per span with times in
    /// microseconds since [`ChromeTrace::new`].
    pub fn write_json(&self, w: impl Write) -> serde_json::Result<()> {
        let spans = self.spans();
        let us = |t: Instant| t.saturating_duration_since(self.origin).as_nanos() as f64 / 1e3;
        let mut events: Vec<Event<'_>> = Vec::with_capacity(spans.len() + self.backends.len());
        for (i, name) in self.backends.iter().enumerate() {
            events.push(Event {
                name: "thread_name",
                cat: "__metadata",
                ph: "M",
                ts: 0.0,
                dur: None,
                pid: 1,
                tid: i,
                args: Args::Track { name },
            });
        }
        let names: Vec<Option<String>> = spans
            .iter()
            .map(|s| s.tensor.map(|t| t.as_str().to_owned()))
            .collect();
        for (s, tensor) in spans.iter().zip(&names) {
            let (start, end) = (us(s.start), us(s.end));
            events.push(Event {
                name: s.kind.name(),
                cat: "sched",
                ph: "X",
                ts: start,
                dur: Some((end - start).max(0.0)),
                pid: 1,
                tid: s.backend,
                args: Args::Span {
                    split: s.split,
                    nodes: format!("{}..{}", s.nodes.0, s.nodes.1),
                    tensor: tensor.as_deref(),
                    bytes: (s.kind == SpanKind::Copy).then_some(s.bytes),
                    waits_for: s
                        .waits_for
                        .and_then(|b| self.backends.get(b).map(String::as_str)),
                },
            });
        }
        serde_json::to_writer(
            w,
            &TraceFile {
                trace_events: events,
                display_time_unit: "ms",
            },
        )
    }
}

impl ChromeTrace {
    /// The collected spans as a timeline in Graphviz DOT (one lane per backend, a box per span
    /// at its place in time: computes in the backend's colour, copies red, waits grey), for a
    /// picture where no trace viewer is at hand, e.g. a README. Positions are pinned
    /// (`layout=neato`), so [`crate::dot::render`] draws it as laid out here.
    pub fn timeline_dot(&self, title: &str) -> String {
        use std::fmt::Write as _;
        const WIDTH: f64 = 12.0; // inches for the whole run
        const LANE: f64 = 0.55;
        const LEFT: f64 = 1.1; // lane names
        let spans = self.spans();
        let us = |t: Instant| t.saturating_duration_since(self.origin).as_nanos() as f64 / 1e3;
        let t0 = spans
            .iter()
            .map(|s| us(s.start))
            .fold(f64::INFINITY, f64::min);
        let t1 = spans.iter().map(|s| us(s.end)).fold(0.0, f64::max);
        let (t0, total) = if t0.is_finite() && t1 > t0 {
            (t0, t1 - t0)
        } else {
            (0.0, 1.0)
        };
        let x = |t: f64| LEFT + (t - t0) / total * WIDTH;
        let n = self.backends.len();
        // lane 0 on top
        let y = |lane: usize| (n - lane) as f64 * LANE;
        let mut o = String::new();
        let _ = writeln!(o, "digraph trace {{");
        let _ = writeln!(
            o,
            "  graph [layout=neato, fontname=\"Helvetica\", fontsize=12, labelloc=t, labeljust=l, \
             label={}];",
            quote(&format!(
                "{title} — {} spans, {:.2} ms; compute: backend colour, copy: red, wait: grey",
                spans.len(),
                total / 1e3
            ))
        );
        let _ = writeln!(
            o,
            "  node [shape=box, style=filled, fixedsize=true, fontname=\"Helvetica\", fontsize=8, \
             penwidth=0.5, label=\"\"];"
        );
        for (lane, name) in self.backends.iter().enumerate() {
            let _ = writeln!(
                o,
                "  lane{lane} [pos=\"{:.3},{:.3}!\", width={:.3}, height=0.3, shape=plaintext, \
                 style=\"\", fontsize=11, label={}];",
                LEFT / 2.0,
                y(lane),
                LEFT - 0.1,
                quote(name)
            );
        }
        // time axis: about 6 ticks at a round step
        let step = nice_step(total / 6.0);
        let decimals = (-(step / 1e3).log10().floor()).max(0.0) as usize;
        let mut k = 0u32;
        loop {
            let t = f64::from(k) * step;
            if t > total + 1e-9 {
                break;
            }
            let _ = writeln!(
                o,
                "  tick{k} [pos=\"{:.3},{:.3}!\", width=0.8, height=0.2, shape=plaintext, style=\"\", \
                 fontsize=9, label={}];",
                x(t0 + t),
                y(n - 1) - LANE * 0.75,
                quote(&format!("{:.*} ms", decimals, t / 1e3))
            );
            k += 1;
        }
        for (i, s) in spans.iter().enumerate() {
            let (a, b) = (us(s.start), us(s.end));
            let w = ((b - a) / total * WIDTH).max(0.01);
            let (fill, h) = match s.kind {
                SpanKind::Compute => (lane_colour(s.backend, n), 0.34),
                SpanKind::Copy => ("#d62728", 0.22),
                SpanKind::Wait => ("#d9d9d9", 0.2),
            };
            let label = match s.kind {
                SpanKind::Compute if w > 0.45 => format!("split {}", s.split),
                SpanKind::Wait if w > 1.2 => format!("waiting for split {}", s.split),
                _ => String::new(),
            };
            let tip = format!(
                "{} · split {} · nodes {}..{}{}{} · {:.1} µs",
                s.kind.name(),
                s.split,
                s.nodes.0,
                s.nodes.1,
                s.tensor
                    .map_or(String::new(), |t| format!(" · {}", t.as_str())),
                if s.kind == SpanKind::Copy {
                    format!(" · {} bytes", s.bytes)
                } else {
                    String::new()
                },
                b - a
            );
            let _ = writeln!(
                o,
                "  s{i} [pos=\"{:.4},{:.3}!\", width={w:.4}, height={h}, fillcolor=\"{fill}\", \
                 color=\"{fill}\", label={}, tooltip={}];",
                x(a) + w / 2.0,
                y(s.backend),
                quote(&label),
                quote(&tip)
            );
        }
        let _ = writeln!(o, "}}");
        o
    }
}

/// A round step (1, 2 or 5 times a power of ten) near `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    }
}

fn lane_colour(backend: usize, n: usize) -> &'static str {
    crate::dot::backend_colour(backend, n)
}

fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

impl TraceSink for ChromeTrace {
    fn span(&mut self, span: &TraceSpan) {
        if let Ok(mut s) = self.spans.lock() {
            s.push(*span);
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TraceFile<'a> {
    trace_events: Vec<Event<'a>>,
    display_time_unit: &'static str,
}

#[derive(Serialize)]
struct Event<'a> {
    name: &'static str,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: usize,
    args: Args<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Track {
        name: &'a str,
    },
    Span {
        split: usize,
        nodes: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        tensor: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<usize>,
        #[serde(skip_serializing_if = "Option::is_none")]
        waits_for: Option<&'a str>,
    },
}
