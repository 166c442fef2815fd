//! The plan of one graph as data (the fixture plan-file format), for printing and comparing.

use std::fmt::Write as _;

use graph::{Context, Graph};

use crate::sched::Scheduler;

/// One split of a [`Plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSplit {
    /// Backend name.
    pub backend: String,
    /// First node index.
    pub start: usize,
    /// One past the last node index.
    pub end: usize,
    /// Names of the tensors copied in, in registration order.
    pub inputs: Vec<String>,
}

/// A node or leaf of a [`Plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanTensor {
    /// Tensor name.
    pub name: String,
    /// Op name (nodes only).
    pub op: Option<&'static str>,
    /// Assigned backend's name, `None` where none was.
    pub backend: Option<String>,
}

/// What the scheduler decided for a graph, in the plan-file shape (`fixtures/FORMAT.md`).
///
/// ```
/// use sched::fixture::GraphFile;
/// let file: GraphFile = serde_json::from_str(r#"{
///   "graph_size": 16, "backends": [{"name": "CPU", "device_type": "cpu"}],
///   "tensors": [{"name": "x", "type": "f32", "ne": [4], "flags": ["input"]},
///               {"name": "y", "op": "SCALE", "src": ["x"], "scale": 2.0}],
///   "expand": ["y"]}"#)?;
/// let plan = file.plan()?;
/// assert_eq!(plan.n_splits, 1);
/// assert_eq!(plan.nodes[0].backend.as_deref(), Some("CPU"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Number of splits.
    pub n_splits: usize,
    /// Number of pipeline copies.
    pub n_copies: usize,
    /// The splits.
    pub splits: Vec<PlanSplit>,
    /// Every graph node in graph order.
    pub nodes: Vec<PlanTensor>,
    /// Every graph leaf in graph order.
    pub leafs: Vec<PlanTensor>,
    /// Compute buffer bytes per backend, in backend order.
    pub buffer_sizes: Vec<(String, usize)>,
}

impl Plan {
    /// The plan `sched` made for `graph` in its last split. Tensors `ctx` does not hold (the
    /// plan's inputs printed against another context, or one rewound since) are named `?`.
    pub fn from_scheduler(sched: &Scheduler, ctx: &Context, graph: &Graph) -> Plan {
        let name = |t| {
            ctx.get(t)
                .map_or_else(|_| "?".to_owned(), |t| t.name().to_owned())
        };
        // `tensor_backend` and the splits name only indices of `sched.backends()`.
        let bname = |t| {
            sched
                .tensor_backend(t)
                .map(|b| sched.backends()[b].name().to_owned())
        };
        Plan {
            n_splits: sched.n_splits(),
            n_copies: sched.n_copies(),
            splits: sched
                .splits()
                .iter()
                .map(|s| PlanSplit {
                    backend: s.backend().name().to_owned(),
                    start: s.start(),
                    end: s.end(),
                    inputs: s.inputs().iter().map(|&t| name(t)).collect(),
                })
                .collect(),
            nodes: graph
                .nodes()
                .iter()
                .map(|&t| PlanTensor {
                    name: name(t),
                    op: ctx.get(t).ok().map(|t| t.op().name()),
                    backend: bname(t),
                })
                .collect(),
            leafs: graph
                .leafs()
                .iter()
                .map(|&t| PlanTensor {
                    name: name(t),
                    op: None,
                    backend: bname(t),
                })
                .collect(),
            buffer_sizes: (0..sched.n_backends())
                .map(|b| {
                    (
                        sched.backends()[b].name().to_owned(),
                        sched.buffer_size(b).unwrap_or(0),
                    )
                })
                .collect(),
        }
    }

    /// The plan-file JSON, one split / node / leaf per line like the reference's files.
    pub fn to_json(&self) -> String {
        let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let b = |s: &Option<String>| s.as_deref().map_or("null".to_owned(), q);
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"n_splits\":{},\"n_copies\":{},\n\"splits\":[",
            self.n_splits, self.n_copies
        );
        for (i, s) in self.splits.iter().enumerate() {
            let inputs: Vec<String> = s.inputs.iter().map(|n| q(n)).collect();
            let _ = write!(
                o,
                "{}\n{{\"backend\":{},\"start\":{},\"end\":{},\"inputs\":[{}]}}",
                if i > 0 { "," } else { "" },
                q(&s.backend),
                s.start,
                s.end,
                inputs.join(",")
            );
        }
        o.push_str("],\n\"nodes\":[");
        for (i, n) in self.nodes.iter().enumerate() {
            let _ = write!(
                o,
                "{}\n{{\"name\":{},\"op\":{},\"backend\":{}}}",
                if i > 0 { "," } else { "" },
                q(&n.name),
                q(n.op.unwrap_or("NONE")),
                b(&n.backend)
            );
        }
        o.push_str("],\n\"leafs\":[");
        for (i, n) in self.leafs.iter().enumerate() {
            let _ = write!(
                o,
                "{}\n{{\"name\":{},\"backend\":{}}}",
                if i > 0 { "," } else { "" },
                q(&n.name),
                b(&n.backend)
            );
        }
        o.push_str("],\n\"buffer_sizes\":{");
        for (i, (n, s)) in self.buffer_sizes.iter().enumerate() {
            let _ = write!(o, "{}{}:{}", if i > 0 { "," } else { "" }, q(n), s);
        }
        o.push_str("}}\n");
        o
    }
}
