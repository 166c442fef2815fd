//! Compute graphs: nodes and leafs in ggml's build order.
//!
//! Why the order matters: every allocator offset and every scheduler split depends on it, so
//! `build_forward_expand` reproduces ggml's depth-first post-order over sources in slot order
//! exactly. The walk is iterative (an explicit stack), so graphs deeper than the thread's stack
//! are fine, and the visited set is a direct-address table over tensor indices that also records
//! each tensor's generation, so a tensor made after a `Context::rewind` in a reused slot is not
//! mistaken for the one visited before.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::context::Context;
use crate::error::GraphError;
use crate::op::Op;
use crate::tensor::{MAX_SRC, TensorFlags, TensorId};

/// ggml's default graph size (`GGML_DEFAULT_GRAPH_SIZE`).
pub const DEFAULT_GRAPH_SIZE: usize = 2048;

/// A computation graph (`ggml_cgraph`): nodes (computed tensors and parameters) and leafs
/// (`NONE` tensors: weights, inputs, constants), each in a valid execution order, with a
/// capacity for each list.
///
/// ```
/// use graph::{Context, ElementType, Graph};
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// let s = ctx.sqr(a)?;
/// let t = ctx.sqr(a)?;
/// let u = ctx.add(s, t)?;
/// let mut g = Graph::new(8);
/// g.build_forward_expand(&mut ctx, u)?;
/// assert_eq!(g.nodes(), &[s, t, u]);
/// assert_eq!(g.leafs(), &[a]);
/// assert_eq!(ctx[a].name(), "leaf_0"); // unnamed tensors get ggml's names
/// assert_eq!(ctx[t].name(), "node_1");
/// # Ok::<(), graph::GraphError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Graph {
    capacity: usize,
    nodes: Vec<TensorId>,
    leafs: Vec<TensorId>,
    /// `generation + 1` of the visited tensor at each index; 0 = not visited.
    visited: Vec<u32>,
    /// Scratch for the iterative walk, kept to avoid allocating per expand.
    stack: Vec<(TensorId, u8)>,
    added: Vec<TensorId>,
    /// Tensors given a default name by the current expand, unnamed again if it fails.
    named: Vec<TensorId>,
    /// See [`Graph::stamp`].
    stamp: u64,
}

/// Source of [`Graph::stamp`] values: a process-wide counter, so no two graph states ever
/// share a stamp unless one is a clone of the other (2^64 mutations do not happen).
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn next_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

/// A read-only window over a range of a graph's nodes (`ggml_graph_view`): what a backend
/// computes for one split.
#[derive(Copy, Clone, Debug)]
pub struct GraphView<'a> {
    /// The nodes, in execution order.
    pub nodes: &'a [TensorId],
    /// The leafs (empty for a node-range view, as in ggml).
    pub leafs: &'a [TensorId],
}

impl<'a> GraphView<'a> {
    /// A view over explicit node and leaf lists.
    pub fn new(nodes: &'a [TensorId], leafs: &'a [TensorId]) -> Self {
        GraphView { nodes, leafs }
    }
    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new(DEFAULT_GRAPH_SIZE)
    }
}

impl Graph {
    /// An empty graph with room for `capacity` nodes and `capacity` leafs.
    pub fn new(capacity: usize) -> Self {
        Graph {
            capacity,
            nodes: Vec::new(),
            leafs: Vec::new(),
            visited: Vec::new(),
            stack: Vec::new(),
            added: Vec::new(),
            named: Vec::new(),
            stamp: next_stamp(),
        }
    }

    /// An identity of the graph's current node and leaf lists: every call that can change
    /// them (expand, add, extend, clear) gives the graph a new, never used stamp; a clone keeps
    /// it (its lists are equal). Equal stamps therefore mean equal lists, in O(1): the
    /// scheduler keeps the stamp of the graph it planned and re-plans when asked to compute a
    /// graph with another one. Costs one relaxed atomic increment per mutating call.
    ///
    /// ```
    /// use graph::{Context, ElementType, Graph};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
    /// let mut g = Graph::new(8);
    /// let empty = g.stamp();
    /// g.build_forward_expand(&mut ctx, a)?;
    /// assert_ne!(g.stamp(), empty);
    /// assert_eq!(g.clone().stamp(), g.stamp());
    /// assert_ne!(Graph::new(8).stamp(), empty);
    /// # Ok::<(), graph::GraphError>(())
    /// ```
    #[inline]
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Capacity for nodes (and, separately, for leafs).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Nodes in execution order.
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }

    /// Leafs in discovery order.
    pub fn leafs(&self) -> &[TensorId] {
        &self.leafs
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Number of leafs.
    pub fn n_leafs(&self) -> usize {
        self.leafs.len()
    }

    /// Node `i`; negative `i` counts from the end, like `ggml_graph_node`.
    pub fn node(&self, i: isize) -> Option<TensorId> {
        let n = self.nodes.len() as isize;
        let j = if i < 0 { n + i } else { i };
        if (0..n).contains(&j) {
            Some(self.nodes[j as usize])
        } else {
            None
        }
    }

    /// The whole graph as a view.
    pub fn as_view(&self) -> GraphView<'_> {
        GraphView {
            nodes: &self.nodes,
            leafs: &self.leafs,
        }
    }

    /// Nodes `i0..i1` as a view with no leafs (`ggml_graph_view`); a range that is not inside
    /// the node list is [`GraphError::IndexOutOfRange`].
    pub fn view(&self, range: std::ops::Range<usize>) -> Result<GraphView<'_>, GraphError> {
        let (start, end) = (range.start, range.end);
        let nodes = self.nodes.get(range).ok_or(GraphError::IndexOutOfRange {
            what: "node range end",
            index: end.max(start),
            limit: self.nodes.len(),
        })?;
        Ok(GraphView { nodes, leafs: &[] })
    }

    fn is_visited(&self, id: TensorId) -> bool {
        self.visited
            .get(id.index())
            .is_some_and(|&g| g == id.generation.wrapping_add(1))
    }

    fn set_visited(&mut self, id: TensorId, on: bool) {
        let i = id.index();
        if self.visited.len() <= i {
            self.visited.resize(i + 1, 0);
        }
        self.visited[i] = if on { id.generation.wrapping_add(1) } else { 0 };
    }

    /// Whether `id` was reached by an expand (`ggml_hash_contains(visited, t)`).
    pub fn contains(&self, id: TensorId) -> bool {
        self.is_visited(id)
    }

    /// Add `t` and everything it depends on (through `src`, not `view_src`), in ggml's
    /// depth-first post-order over source slots 0..10 (`ggml_build_forward_expand`). Tensors
    /// already in the graph are skipped, so repeated calls accumulate. Unnamed tensors are named
    /// `leaf_<i>` / `node_<i>`. On error (capacity, stale id) the graph and the tensors' names
    /// are left as they were.
    pub fn build_forward_expand(
        &mut self,
        ctx: &mut Context,
        t: TensorId,
    ) -> Result<(), GraphError> {
        ctx.get(t)?;
        self.stamp = next_stamp();
        let (n0, l0) = (self.nodes.len(), self.leafs.len());
        self.added.clear();
        self.named.clear();
        let r = self.expand(ctx, t);
        if r.is_err() {
            for &id in &self.named {
                if let Ok(t) = ctx.get_mut(id) {
                    t.name = crate::tensor::TensorName::EMPTY;
                }
            }
            for i in 0..self.added.len() {
                let id = self.added[i];
                self.set_visited(id, false);
            }
            self.nodes.truncate(n0);
            self.leafs.truncate(l0);
            self.stack.clear();
        }
        r
    }

    fn expand(&mut self, ctx: &mut Context, root: TensorId) -> Result<(), GraphError> {
        if self.is_visited(root) {
            return Ok(());
        }
        self.set_visited(root, true);
        self.added.push(root);
        self.stack.clear();
        self.stack.push((root, 0));
        while let Some(&mut (id, ref mut next)) = self.stack.last_mut() {
            if (*next as usize) < MAX_SRC {
                let k = *next as usize;
                *next += 1;
                if let Some(s) = ctx.get(id)?.src[k] {
                    ctx.get(s)?;
                    if !self.is_visited(s) {
                        self.set_visited(s, true);
                        self.added.push(s);
                        self.stack.push((s, 0));
                    }
                }
                continue;
            }
            self.stack.pop();
            self.append(ctx, id)?;
        }
        Ok(())
    }

    /// `Ok` when `n` more entries fit in a list (`what`: "nodes" or "leafs") of `len`.
    #[inline]
    fn room(&self, len: usize, n: usize, what: &'static str) -> Result<(), GraphError> {
        if n > self.capacity.saturating_sub(len) {
            return Err(GraphError::GraphFull {
                capacity: self.capacity,
                what,
            });
        }
        Ok(())
    }

    fn append(&mut self, ctx: &mut Context, id: TensorId) -> Result<(), GraphError> {
        // `id` was checked live before it was pushed on the stack (`expand`), and the walk
        // creates and rewinds nothing, so the lookup cannot fail.
        let t = ctx.get_mut(id)?;
        if t.op == Op::None && !t.flags.contains(TensorFlags::PARAM) {
            self.room(self.leafs.len(), 1, "leafs")?;
            if t.name.is_empty() {
                t.name = leaf_name("leaf_", self.leafs.len());
                self.named.push(id);
            }
            self.leafs.push(id);
        } else {
            self.room(self.nodes.len(), 1, "nodes")?;
            if t.name.is_empty() {
                t.name = leaf_name("node_", self.nodes.len());
                self.named.push(id);
            }
            self.nodes.push(id);
        }
        Ok(())
    }

    /// Append a node without touching the visited set or checking uniqueness
    /// (`ggml_graph_add_node`).
    #[inline]
    pub fn add_node(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.room(self.nodes.len(), 1, "nodes")?;
        self.stamp = next_stamp();
        self.nodes.push(id);
        Ok(())
    }

    /// Append `ids` as nodes without touching the visited set or checking uniqueness (many
    /// [`Graph::add_node`] calls with one capacity check). When they do not all fit, none is
    /// added and the error is returned.
    ///
    /// ```
    /// use graph::{Context, ElementType, Graph, GraphError};
    /// let mut ctx = Context::new();
    /// let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
    /// let b = ctx.sqr(a)?;
    /// let c = ctx.sqr(b)?;
    /// let mut g = Graph::new(2);
    /// g.extend_nodes(&[b, c])?;
    /// assert_eq!(g.nodes(), &[b, c]);
    /// // a third node does not fit: nothing is added
    /// assert!(matches!(g.extend_nodes(&[a]), Err(GraphError::GraphFull { .. })));
    /// assert_eq!(g.n_nodes(), 2);
    /// # Ok::<(), GraphError>(())
    /// ```
    #[inline]
    pub fn extend_nodes(&mut self, ids: &[TensorId]) -> Result<(), GraphError> {
        self.room(self.nodes.len(), ids.len(), "nodes")?;
        self.stamp = next_stamp();
        self.nodes.extend_from_slice(ids);
        Ok(())
    }

    /// Append a leaf without touching the visited set (for builders that lay out their own
    /// graph, like the scheduler's allocation graph).
    #[inline]
    pub fn add_leaf(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.room(self.leafs.len(), 1, "leafs")?;
        self.stamp = next_stamp();
        self.leafs.push(id);
        Ok(())
    }

    /// Append `ids` as leafs without touching the visited set (many [`Graph::add_leaf`]
    /// calls with one capacity check). When they do not all fit, none is added and the
    /// error is returned.
    #[inline]
    pub fn extend_leafs(&mut self, ids: &[TensorId]) -> Result<(), GraphError> {
        self.room(self.leafs.len(), ids.len(), "leafs")?;
        self.stamp = next_stamp();
        self.leafs.extend_from_slice(ids);
        Ok(())
    }

    /// Empty the graph, keeping its capacity and memory (`ggml_graph_clear`).
    pub fn clear(&mut self) {
        self.stamp = next_stamp();
        self.nodes.clear();
        self.leafs.clear();
        self.visited.iter_mut().for_each(|w| *w = 0);
    }

    /// Change the capacity (the graph is cleared).
    pub fn reset_capacity(&mut self, capacity: usize) {
        self.clear();
        self.capacity = capacity;
    }

    /// The first leaf, then node, named `name` (`ggml_graph_get_tensor`).
    pub fn get_tensor(&self, ctx: &Context, name: &str) -> Option<TensorId> {
        self.leafs
            .iter()
            .chain(&self.nodes)
            .copied()
            .find(|&id| ctx.get(id).is_ok_and(|t| t.name() == name))
    }
}

fn leaf_name(prefix: &str, i: usize) -> crate::tensor::TensorName {
    use std::fmt::Write;
    let mut n = crate::tensor::TensorName::EMPTY;
    let _ = write!(n, "{prefix}{i}");
    n
}
