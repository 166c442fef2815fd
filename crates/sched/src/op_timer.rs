//! Compute time per op kind, measured through the scheduler's eval callback.
//!
//! Engines that want a profile of a graph run (which op classes take the time) install one
//! [`OpTimer`]: it asks the scheduler about every node, so each node runs as its own piece
//! and its wall time from the question to the answer is its compute time. That per-node split
//! is what makes the figures exact and also what makes a profiled run slower: install it only
//! when a profile is wanted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graph::{Context, TensorId};

use crate::Scheduler;

/// Per-op-kind compute time of the nodes a scheduler ran, keyed by a name the caller derives
/// from each node (e.g. `MUL_MAT(q4_1)`).
///
/// ```
/// use sched::OpTimer;
/// # fn demo(sched: &mut sched::Scheduler) {
/// let timer = OpTimer::install(sched, |ctx, t| {
///     ctx.get(t).map(|t| t.op().name().to_owned()).unwrap_or_default()
/// });
/// // ... sched.graph_compute(...) ...
/// for (op, time, nodes) in timer.take() {
///     println!("{op}: {time:?} over {nodes} nodes");
/// }
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct OpTimer {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    started: Option<Instant>,
    per_op: BTreeMap<String, (Duration, usize)>,
}

impl OpTimer {
    /// Installs a timer as `sched`'s eval callback (replacing any other), naming each computed
    /// node with `name`.
    pub fn install(
        sched: &mut Scheduler,
        name: impl Fn(&Context, TensorId) -> String + Send + 'static,
    ) -> OpTimer {
        let timer = OpTimer::default();
        let state = Arc::clone(&timer.state);
        sched.set_eval_callback(Some(Box::new(
            move |ctx: &Context, t: TensorId, ask: bool| {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                if ask {
                    st.started = Some(Instant::now());
                } else {
                    let dt = st.started.take().map(|s| s.elapsed()).unwrap_or_default();
                    let e = st.per_op.entry(name(ctx, t)).or_default();
                    e.0 += dt;
                    e.1 += 1;
                }
                true
            },
        )));
        timer
    }

    /// The times since the last call, as `(op name, total time, nodes)`, longest first.
    pub fn take(&self) -> Vec<(String, Duration, usize)> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut ops: Vec<_> = std::mem::take(&mut st.per_op)
            .into_iter()
            .map(|(k, (d, n))| (k, d, n))
            .collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.1));
        ops
    }
}
