//! [`build`]: a graph file's graph built into the caller's context, its weights placed in the
//! caller's own buffers.
//!
//! Why: [`GraphFile::build`] puts every leaf in planning-only buffers made from the file's
//! backends, which is what plans and snapshots need. The scheduler's execution tests need the
//! same graph with weights in buffers of real backends, holding values, and computed. Building
//! it from the file keeps one definition of the llama graph ([`crate::llama_file`]) for both,
//! so what is planned in the snapshots is what is computed in the execution tests.
//!
//! ```
//! use backend_core::tensor_alloc;
//! use graph::{Context, TensorFlags};
//! use test_fixtures::{FakeBufferType, in_context, llama_file::LlamaConfig};
//! let file = LlamaConfig::tiny(1).graph_file("one layer");
//! let buft = FakeBufferType::new("host", 32).into_buffer_type();
//! let mut ctx = Context::new();
//! let mut keep = Vec::new();
//! let built = in_context::build(&file, &mut ctx, |ctx, leafs| {
//!     // every weight of the file in one buffer, one after the other
//!     let size: usize = leafs.iter().map(|&(id, _)| buft.alloc_size(&ctx[id]).next_multiple_of(32)).sum();
//!     let buffer = buft.alloc_buffer(size).unwrap();
//!     let mut offset = 0;
//!     for &(id, _) in leafs {
//!         tensor_alloc(ctx, &buffer, id, offset).unwrap();
//!         offset += buft.alloc_size(&ctx[id]).next_multiple_of(32);
//!     }
//!     keep.push(buffer);
//! })?;
//! assert_eq!(built.graph.n_nodes(), 1 + 33 + 3); // embeddings, one layer, output
//! assert!(ctx[built.id("logits")].flags().contains(TensorFlags::OUTPUT));
//! # Ok::<(), graph::GraphError>(())
//! ```

use std::collections::HashMap;

use graph::{Context, ElementType, Graph, GraphError, TensorId, UnaryOp};
use sched::fixture::{GraphFile, TensorSpec};

/// The graph of a file built by [`build`], and its tensors by name.
#[derive(Clone, Debug)]
pub struct InContext {
    /// The graph, expanded from the file's `expand` list, of the file's capacity.
    pub graph: Graph,
    /// Every tensor of the file by name.
    pub names: HashMap<String, TensorId>,
}

impl InContext {
    /// The tensor named `name`.
    ///
    /// # Panics
    /// If the file has no such tensor.
    pub fn id(&self, name: &str) -> TensorId {
        *self
            .names
            .get(name)
            .unwrap_or_else(|| panic!("no tensor {name:?} in the graph file"))
    }
}

/// Create the file's tensors in `ctx` (leafs first, in file order), hand the leafs the file
/// puts in a buffer to `place` as `(tensor, buffer name)` in file order (it must give them
/// storage: views of them are made next), then make the ops, set the flags and expand the
/// graph. The file's backends, usages and assignments are not used.
///
/// # Panics
/// On a file this crate's generators do not write: a leaf without type or extents, an unknown
/// type, op or unary function, or an op without its parameters (scaffolding, not a parser:
/// [`GraphFile::build`] is the one with typed errors).
pub fn build(
    file: &GraphFile,
    ctx: &mut Context,
    place: impl FnOnce(&mut Context, &[(TensorId, &str)]),
) -> Result<InContext, GraphError> {
    let mut names = HashMap::new();
    let mut placed = Vec::new();
    for t in file.tensors.iter().filter(|t| t.op.is_none()) {
        let ty: ElementType = field(&t.ty, t, "type")
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        let id = ctx.new_tensor(ty, field(&t.ne, t, "ne"))?;
        ctx.set_name(id, &t.name)?;
        names.insert(t.name.clone(), id);
        if let Some(b) = &t.buffer {
            placed.push((id, b.as_str()));
        }
    }
    place(ctx, &placed);
    for t in file.tensors.iter().filter(|t| t.op.is_some()) {
        let src: Vec<TensorId> = t.src.iter().map(|s| names[s]).collect();
        let id = op(ctx, t, &src)?;
        ctx.set_name(id, &t.name)?;
        names.insert(t.name.clone(), id);
    }
    for t in &file.tensors {
        for f in &t.flags {
            match f.as_str() {
                "input" => ctx.set_input(names[&t.name])?,
                "output" => ctx.set_output(names[&t.name])?,
                o => panic!("{}: unknown flag {o:?}", t.name),
            }
        }
    }
    let mut graph = Graph::new(file.graph_size);
    for e in &file.expand {
        graph.build_forward_expand(ctx, names[e])?;
    }
    Ok(InContext { graph, names })
}

/// A field the op needs.
fn field<'a, T: ?Sized>(
    v: &'a Option<impl std::ops::Deref<Target = T>>,
    t: &TensorSpec,
    what: &str,
) -> &'a T {
    v.as_deref()
        .unwrap_or_else(|| panic!("{}: no {what}", t.name))
}

/// The ops of the generated llama graphs.
fn op(ctx: &mut Context, t: &TensorSpec, s: &[TensorId]) -> Result<TensorId, GraphError> {
    let name = field(&t.op, t, "op");
    match name {
        "GET_ROWS" => ctx.get_rows(s[0], s[1]),
        "RMS_NORM" => ctx.rms_norm(s[0], t.eps.unwrap_or(1e-5)),
        "MUL" => ctx.mul(s[0], s[1]),
        "ADD" => ctx.add(s[0], s[1]),
        "MUL_MAT" => ctx.mul_mat(s[0], s[1]),
        "RESHAPE" => ctx.reshape(s[0], field(&t.ne, t, "ne")),
        "ROPE" => ctx.rope(
            s[0],
            s[1],
            t.n_dims.expect("ROPE n_dims"),
            t.mode.unwrap_or(0),
        ),
        "VIEW" => {
            let nb = t.nb.as_deref().map(|v| [v[0], v[1], v[2], v[3]]);
            ctx.view(s[0], field(&t.ne, t, "ne"), nb, t.offset.unwrap_or(0))
        }
        "CPY" => ctx.cpy(s[0], s[1]),
        "TRANSPOSE" => ctx.transpose(s[0]),
        "PERMUTE" => ctx.permute(s[0], t.axes.expect("PERMUTE axes")),
        "SOFT_MAX" => ctx.soft_max_ext(
            s[0],
            s.get(1).copied(),
            t.scale.unwrap_or(1.0),
            t.max_bias.unwrap_or(0.0),
        ),
        "CONT" => ctx.cont(s[0]),
        "UNARY" => {
            let u = field(&t.unary, t, "unary");
            let u = UnaryOp::from_name(u).unwrap_or_else(|| panic!("unknown unary {u:?}"));
            ctx.unary(s[0], u)
        }
        o => panic!("{}: op {o} is not built here", t.name),
    }
}
