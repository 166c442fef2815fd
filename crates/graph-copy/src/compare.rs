//! Running one graph on two backends node by node.
//!
//! Both backends get their own copy of the graph (made with [`graph_copy`] onto each one's
//! default buffer type), so the caller's tensors are never written and each backend computes
//! on memory it can use. Node by node, each backend computes the one-node view of its copy;
//! the callback then sees both results. View ops compute nothing and are skipped.
//!
//! A backend that does not support a node does not stop the walk: the node is computed on the
//! other backend, its result copied across so that later nodes see the same input, and the
//! node is listed in [`CompareReport::unsupported`]. Only a node neither backend supports ends
//! the walk early ([`CompareReport::complete`] is then false).

use backend_core::{Backend, tensor_get, tensor_set};
use graph::{Context, Graph, Op, TensorId};

use crate::copy::{CopyOptions, GraphCopy, GraphCopyError, graph_copy_with};

/// One computed node, as handed to the comparison callback.
#[derive(Debug)]
pub struct NodeComparison<'a> {
    /// Position in the graph's node list.
    pub index: usize,
    /// The node (the same id in both contexts).
    pub id: TensorId,
    /// Backend 1's context: read the result with `tensor_get(ctx1, id, ..)`.
    pub ctx1: &'a Context,
    /// Backend 2's context.
    pub ctx2: &'a Context,
}

impl NodeComparison<'_> {
    /// The node's op (`Op::None` when `ctx1` does not hold `id`: the fields are public).
    pub fn op(&self) -> Op {
        self.ctx1.get(self.id).map_or(Op::None, |t| t.op())
    }
}

/// A node one backend could not compute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// Position in the graph's node list.
    pub index: usize,
    /// The node.
    pub id: TensorId,
    /// Op name (`"MUL_MAT"`, or `"UNARY(SILU)"` for unary ops).
    pub op: String,
    /// The backend that does not support it.
    pub backend: String,
}

/// A node after which a guard region of one backend's copy was found overwritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardViolation {
    /// Position of the node in the graph's node list.
    pub index: usize,
    /// The node whose computation wrote out of bounds.
    pub id: TensorId,
    /// Its op label.
    pub op: String,
    /// The backend that computed it.
    pub backend: String,
    /// The tensor the damaged guard follows (`None`: the guard before the first tensor).
    pub after: Option<TensorId>,
}

/// What a comparison did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompareReport {
    /// Out-of-bounds writes caught by guard regions (only with
    /// [`CopyOptions::guard_bytes`] > 0).
    pub guard_violations: Vec<GuardViolation>,
    /// Nodes computed on both backends and handed to the callback.
    pub compared: usize,
    /// Nodes skipped on one backend because it does not support them.
    pub unsupported: Vec<Unsupported>,
    /// Whether the callback asked to stop.
    pub stopped_by_callback: bool,
    /// Whether every node was visited (false when a node neither backend supports, or the
    /// callback, ended the walk).
    pub complete: bool,
}

/// `UNARY(SILU)` for unary ops, the op name otherwise.
pub(crate) fn op_label(op: Op) -> String {
    match op {
        Op::Unary(u) => format!("UNARY({})", u.name()),
        other => other.name().to_owned(),
    }
}

fn guards(
    copy: &GraphCopy,
    backend: &Backend,
    index: usize,
    id: TensorId,
    op: Op,
    report: &mut CompareReport,
) -> Result<(), GraphCopyError> {
    for after in copy.check_guards()? {
        report.guard_violations.push(GuardViolation {
            index,
            id,
            op: op_label(op),
            backend: backend.name().to_owned(),
            after,
        });
    }
    Ok(())
}

fn copy_result(from: &Context, to: &Context, id: TensorId) -> Result<(), GraphCopyError> {
    let mut bytes = vec![0u8; from[id].nbytes()];
    tensor_get(from, id, 0, &mut bytes)?;
    tensor_set(to, id, 0, &bytes)?;
    Ok(())
}

/// Compute `graph` of `ctx` on `backend1` and `backend2` node by node, calling `callback`
/// after each node both computed; the callback returns `false` to stop
/// (`ggml_backend_compare_graph_backend`).
///
/// The graph must be allocated (its data are the inputs); it is copied onto both backends
/// and never written.
///
/// ```
/// use backend_core::{tensor_alloc, tensor_get};
/// use graph::{Context, ElementType, Graph, Op};
/// use test_device::{TestDevice, TestDeviceConfig};
///
/// let a = TestDevice::create(TestDeviceConfig::named("A"))?;
/// // B computes no ADD: the comparison reports it instead of failing.
/// let b = TestDevice::create(TestDeviceConfig::named("B").supported_ops([Op::Scale]))?;
/// let mut ctx = Context::new();
/// let x = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// let y = ctx.add(x, x)?;
/// let mut g = Graph::new(8);
/// g.build_forward_expand(&mut ctx, y)?;
/// let buf = a.buffer_type().alloc_buffer(1024)?;
/// tensor_alloc(&mut ctx, &buf, x, 0)?;
/// tensor_alloc(&mut ctx, &buf, y, 128)?;
/// let (ba, bb) = (a.init_backend("")?, b.init_backend("")?);
/// let report = graph_copy::compare_graph_backends(&ba, &bb, &ctx, &g, |_| true)?;
/// assert_eq!(report.compared, 0);
/// assert!(report.unsupported.iter().any(|u| u.op == "ADD" && u.backend == "B"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compare_graph_backends(
    backend1: &Backend,
    backend2: &Backend,
    ctx: &Context,
    graph: &Graph,
    callback: impl FnMut(&NodeComparison<'_>) -> bool,
) -> Result<CompareReport, GraphCopyError> {
    compare_graph_backends_with(
        backend1,
        backend2,
        ctx,
        graph,
        &CopyOptions::default(),
        callback,
    )
}

/// [`compare_graph_backends`] with layout options for both copies; with guard regions, each
/// node's computation is followed by a check of its backend's guards.
pub fn compare_graph_backends_with(
    backend1: &Backend,
    backend2: &Backend,
    ctx: &Context,
    graph: &Graph,
    opts: &CopyOptions,
    mut callback: impl FnMut(&NodeComparison<'_>) -> bool,
) -> Result<CompareReport, GraphCopyError> {
    let c1: GraphCopy = graph_copy_with(ctx, graph, &backend1.default_buffer_type(), opts)?;
    let c2: GraphCopy = graph_copy_with(ctx, graph, &backend2.default_buffer_type(), opts)?;
    let (ctx1, ctx2) = (c1.ctx(), c2.ctx());
    let nodes = c1.graph().nodes();
    let mut report = CompareReport::default();
    for (index, &id) in nodes.iter().enumerate() {
        let op = ctx1[id].op();
        if op == Op::None || op.is_view_op() {
            continue;
        }
        let one = graph::GraphView::new(std::slice::from_ref(&id), &[]);
        let s1 = backend1.supports_op(ctx1, id);
        let s2 = backend2.supports_op(ctx2, id);
        for (ok, b) in [(s1, backend1), (s2, backend2)] {
            if !ok {
                report.unsupported.push(Unsupported {
                    index,
                    id,
                    op: op_label(op),
                    backend: b.name().to_owned(),
                });
            }
        }
        match (s1, s2) {
            (true, true) => {
                backend1.graph_compute(ctx1, one)?;
                guards(&c1, backend1, index, id, op, &mut report)?;
                backend2.graph_compute(ctx2, one)?;
                guards(&c2, backend2, index, id, op, &mut report)?;
                report.compared += 1;
                let cmp = NodeComparison {
                    index,
                    id,
                    ctx1,
                    ctx2,
                };
                if !callback(&cmp) {
                    report.stopped_by_callback = true;
                    return Ok(report);
                }
            }
            (true, false) => {
                backend1.graph_compute(ctx1, one)?;
                guards(&c1, backend1, index, id, op, &mut report)?;
                copy_result(ctx1, ctx2, id)?;
            }
            (false, true) => {
                backend2.graph_compute(ctx2, one)?;
                guards(&c2, backend2, index, id, op, &mut report)?;
                copy_result(ctx2, ctx1, id)?;
            }
            (false, false) => {
                tracing::warn!(
                    node = index,
                    op = op.name(),
                    "neither backend computes this node"
                );
                return Ok(report);
            }
        }
    }
    report.complete = true;
    Ok(report)
}
