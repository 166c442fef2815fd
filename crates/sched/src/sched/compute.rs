//! Compute: input copies between backends, events, and the splits run one after another.

use std::time::Instant;

use backend_core::{ComputeStatus, Device, Event};
use graph::{Context, Graph, Tensor, TensorFlags, TensorName};

use super::backend_id::BackendId;
use super::{Result, Scheduler};
use crate::error::SchedError;
use crate::trace::{SpanKind, TraceSink, TraceSpan};

/// Pipeline copies: how many, which one the next compute fills, and the events that order
/// them.
pub(super) struct Pipeline {
    pub(super) n_copies: usize,
    pub(super) cur_copy: usize,
    /// `[backend * n_copies + copy]`
    pub(super) events: Vec<Option<Event>>,
}

impl Pipeline {
    pub(super) fn new(devices: &[Device], n_copies: usize) -> Pipeline {
        let mut events = Vec::with_capacity(devices.len() * n_copies);
        for d in devices {
            for _ in 0..n_copies {
                events.push(if n_copies > 1 {
                    d.event_new().ok()
                } else {
                    None
                });
            }
        }
        Pipeline {
            n_copies,
            cur_copy: 0,
            events,
        }
    }
}

impl Scheduler {
    /// Compute `graph` and wait for every backend (`ggml_backend_sched_graph_compute`).
    ///
    /// With a trace sink, the final wait for each backend that computed a split is a wait span
    /// on its track (on a backend that queues work, that is where the work's time shows).
    pub fn graph_compute(&mut self, ctx: &mut Context, graph: &Graph) -> Result<ComputeStatus> {
        let r = self.graph_compute_async(ctx, graph);
        let s = if self.hooks.trace.is_some() {
            self.synchronize_traced()
        } else {
            self.synchronize()
        };
        let status = r?;
        s?;
        Ok(status)
    }

    /// [`Scheduler::synchronize`], reporting each backend's wait as a span of the last split
    /// it computed.
    pub(super) fn synchronize_traced(&mut self) -> Result<()> {
        for (b, backend) in self.backends.iter().enumerate() {
            let t0 = Instant::now();
            backend.synchronize()?;
            let last = self.splits.list[..self.splits.n]
                .iter()
                .enumerate()
                .rev()
                .find(|(_, sp)| sp.backend.index() == b);
            if let (Some(sink), Some((k, sp))) = (self.hooks.trace.as_mut(), last) {
                sink.span(&TraceSpan {
                    kind: SpanKind::Wait,
                    backend: b,
                    split: k,
                    nodes: (sp.start, sp.end),
                    tensor: None,
                    bytes: 0,
                    waits_for: Some(b),
                    start: t0,
                    end: Instant::now(),
                });
            }
        }
        Ok(())
    }

    /// Compute `graph` without waiting for the last backend
    /// (`ggml_backend_sched_graph_compute_async`): allocates first when nothing is allocated
    /// (never allocated, or [`Scheduler::reset`] since). A graph other than the one
    /// [`Scheduler::alloc_graph`] planned, or one changed since (ggml would run the old
    /// plan's node ranges over it), is [`SchedError::GraphNotAllocated`]. Computing the
    /// allocated graph again neither splits nor allocates: with pipeline copies each compute
    /// fills and reads the input copies of [`Scheduler::cur_copy`] and then moves on to the
    /// next copy, as ggml does.
    pub fn graph_compute_async(
        &mut self,
        ctx: &mut Context,
        graph: &Graph,
    ) -> Result<ComputeStatus> {
        if !self.state.is_reset && !self.state.is_alloc {
            self.reset();
        }
        if self.state.is_alloc && self.state.planned != Some(graph.stamp()) {
            // The splits are node ranges of the graph they were made for; run over another
            // graph (or this one changed since) they would compute the wrong nodes. Planning
            // the new graph here could move inputs the caller already wrote, so the caller
            // decides: `alloc_graph` (or `reset`) first.
            return Err(SchedError::GraphNotAllocated);
        }
        if !self.state.is_alloc {
            self.alloc_graph(ctx, graph)?;
        }
        // The plan and its allocation are reused as they are: every pipeline copy of every
        // input has its own allocated tensor, and the rewritten sources are pointed at those
        // of `cur_copy`, which compute fills (ggml's seed fills them but leaves the sources
        // on the copy current at split time).
        self.apply_rewrites(ctx);
        let r = self.compute_splits(ctx, graph);
        self.restore_rewrites(ctx);
        r
    }

    /// Wait for every backend (`ggml_backend_sched_synchronize`).
    ///
    /// Every backend is waited for even when one reports an error (the first error is
    /// returned): stopping at the first would leave another backend's queued error behind, to
    /// fail an unrelated later call.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for b in &self.backends {
            let r = b.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        Ok(first?)
    }

    pub(super) fn event(&self, b: usize, c: usize) -> Option<&Event> {
        self.pipeline.events[b * self.pipeline.n_copies + c].as_ref()
    }

    pub(super) fn compute_splits(
        &mut self,
        ctx: &mut Context,
        graph: &Graph,
    ) -> Result<ComputeStatus> {
        for si in 0..self.splits.n {
            let split_backend_id = self.splits.list[si].backend.index();
            let split_backend = self.backends[split_backend_id].clone();
            let event = self
                .event(split_backend_id, self.pipeline.cur_copy)
                .cloned();
            let (start, end) = (self.splits.list[si].start, self.splits.list[si].end);
            // The trace's span for this split, started at `t` (only read with a sink).
            let span = |kind, t: Instant, tensor: Option<TensorName>| TraceSpan {
                kind,
                backend: split_backend_id,
                split: si,
                nodes: (start, end),
                tensor,
                bytes: 0,
                waits_for: None,
                start: t,
                end: t,
            };

            for k in 0..self.splits.list[si].inputs.len() {
                let input = self.splits.list[si].inputs[k];
                let Some(ib) = self.bid(input).get().map(BackendId::index) else {
                    let name = ctx.get(input).map_or("?", Tensor::name).to_owned();
                    return Err(SchedError::UnassignedInput(name));
                };
                let input_backend = &self.backends[ib];
                // invariant: the splits are current (`planned` matched, and `reset` or a new
                // split pass would have cleared it), and a split pass registers an input only
                // after making its copies for every pipeline copy in the current copy epoch
                let copy = self
                    .get_copy(input, split_backend_id, self.pipeline.cur_copy)
                    .expect("every split input has copies");
                let tracing = self.hooks.trace.is_some();
                let name = if tracing {
                    Some(TensorName::new(ctx.get(input)?.name()))
                } else {
                    None
                };
                let bytes = ctx.get(input)?.nbytes();
                let mut t = tracing.then(Instant::now);
                let waited =
                    |trace: &mut Option<Box<dyn TraceSink>>, t: &mut Option<Instant>, on: usize| {
                        if let (Some(sink), Some(t0)) = (trace.as_mut(), *t) {
                            let now = Instant::now();
                            sink.span(&TraceSpan {
                                end: now,
                                waits_for: Some(on),
                                ..span(SpanKind::Wait, t0, name)
                            });
                            *t = Some(now);
                        }
                    };
                if ctx.get(input)?.flags().contains(TensorFlags::INPUT) {
                    // user inputs are copied at once: the user may overwrite them after return
                    match &event {
                        Some(e) => e.synchronize()?,
                        None => split_backend.synchronize()?,
                    }
                    waited(&mut self.hooks.trace, &mut t, split_backend_id);
                    backend_core::tensor_copy(ctx, input, copy)?;
                } else {
                    // wait until the split backend is done with the copy's previous contents
                    match &event {
                        Some(e) => split_backend.event_wait(e)?,
                        None => split_backend.synchronize()?,
                    }
                    waited(&mut self.hooks.trace, &mut t, split_backend_id);
                    let queued = split_backend.implementation().cpy_tensor_async(
                        input_backend,
                        ctx.get(input)?,
                        ctx.get(copy)?,
                    )?;
                    if !queued {
                        input_backend.synchronize()?;
                        match &event {
                            Some(e) => e.synchronize()?,
                            None => split_backend.synchronize()?,
                        }
                        waited(&mut self.hooks.trace, &mut t, ib);
                        backend_core::tensor_copy(ctx, input, copy)?;
                    }
                }
                if let (Some(sink), Some(t0)) = (self.hooks.trace.as_mut(), t) {
                    sink.span(&TraceSpan {
                        end: Instant::now(),
                        bytes,
                        ..span(SpanKind::Copy, t0, name)
                    });
                }
            }

            let t = self.hooks.trace.is_some().then(Instant::now);
            // `graph` is the graph the splits were made for (its stamp was checked by the
            // caller), and the split pass only cuts ranges inside its node list.
            let split_nodes = &graph.nodes()[start..end];
            let status = match self.hooks.callback.as_mut() {
                None => split_backend
                    .graph_compute_async(ctx, graph::GraphView::new(split_nodes, &[]))?,
                Some(cb) => {
                    let mut status = ComputeStatus::Success;
                    let mut j0 = 0;
                    while j0 < split_nodes.len() {
                        let mut t = split_nodes[j0];
                        let mut need = cb(ctx, t, true);
                        let mut j1 = j0;
                        while !need && j1 + 1 < split_nodes.len() {
                            j1 += 1;
                            t = split_nodes[j1];
                            need = cb(ctx, t, true);
                        }
                        let view = graph::GraphView::new(&split_nodes[j0..=j1], &[]);
                        status = split_backend.graph_compute_async(ctx, view)?;
                        if status != ComputeStatus::Success {
                            break;
                        }
                        split_backend.synchronize()?;
                        if need && !cb(ctx, t, false) {
                            break;
                        }
                        j0 = j1 + 1;
                    }
                    status
                }
            };
            if let (Some(sink), Some(t0)) = (self.hooks.trace.as_mut(), t) {
                sink.span(&TraceSpan {
                    end: Instant::now(),
                    ..span(SpanKind::Compute, t0, None)
                });
            }
            if status != ComputeStatus::Success {
                return Ok(status);
            }

            if !self.splits.list[si].inputs.is_empty()
                && let Some(e) = &event
            {
                split_backend.event_record(e)?;
            }
        }
        self.pipeline.cur_copy = (self.pipeline.cur_copy + 1) % self.pipeline.n_copies;
        Ok(ComputeStatus::Success)
    }
}
