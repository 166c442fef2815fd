//! The tensor arena.
//!
//! Why one arena for weights and per-step tensors: a compute graph refers to weights created
//! long before it and to scheduler-made copies created after it; a single arena with typed ids
//! lets all of them be named by one small `Copy` id and lets side tables be plain vectors
//! indexed by [`TensorId::index`]. Per-step tensors are dropped in O(1) by rewinding to a
//! [`Checkpoint`] taken after the weights were made; the arena's capacity is kept, so a steady
//! loop of build → compute → rewind does not allocate.

use std::ops::{Index, IndexMut};

use crate::error::GraphError;
use crate::op::{Op, OpParams};
use crate::tensor::{
    MAX_DIMS, MAX_SRC, Tensor, TensorFlags, TensorId, TensorName, TensorStorage, contiguous_strides,
};
use crate::types::ElementType;

/// A point in a context's history to [`Context::rewind`] to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    len: u32,
}

/// An arena of tensors (`ggml_context` with `no_alloc = true`: metadata only).
///
/// Weights are created once, then each step builds its tensors after a checkpoint and rewinds
/// to it when done. A weight's [`TensorId`] stays valid across rewinds and is used directly as a
/// source in every later graph.
///
/// ```
/// use graph::{Context, ElementType, Graph, GraphError};
/// let mut ctx = Context::new();
/// let w = ctx.new_tensor_2d(ElementType::F32, 4, 3)?;      // a weight, made once
/// let step = ctx.checkpoint();
/// for _ in 0..2 {
///     let x = ctx.new_tensor_1d(ElementType::F32, 4)?;     // this step's input
///     let y = ctx.mul_mat(w, x)?;
///     let mut g = Graph::new(16);
///     g.build_forward_expand(&mut ctx, y)?;
///     assert_eq!(g.leafs(), &[w, x]);
///     assert_eq!(g.nodes(), &[y]);
///     ctx.rewind(step);                                    // x and y are gone, w stays
///     assert_eq!(ctx.get(y).err(), Some(GraphError::StaleId(y)));
///     assert!(ctx.get(w).is_ok());
/// }
/// # Ok::<(), graph::GraphError>(())
/// ```
#[derive(Debug, Default, Clone)]
pub struct Context {
    tensors: Vec<Tensor>,
    generation: u32,
}

impl Context {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty arena with room for `n` tensors.
    pub fn with_capacity(n: usize) -> Self {
        Context {
            tensors: Vec::with_capacity(n),
            generation: 0,
        }
    }

    /// Number of live tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor lives here.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Ids of every live tensor in creation order.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = TensorId> + '_ {
        self.tensors.iter().enumerate().map(|(i, t)| TensorId {
            index: i as u32,
            generation: t.generation,
        })
    }

    /// The id of the tensor at `index`, if one lives there.
    pub fn id_at(&self, index: usize) -> Option<TensorId> {
        self.tensors.get(index).map(|t| TensorId {
            index: index as u32,
            generation: t.generation,
        })
    }

    /// The current end of the arena; tensors made after it go on [`Context::rewind`].
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            len: self.tensors.len() as u32,
        }
    }

    /// Drop every tensor created after `cp`. Their ids become stale: looking them up fails
    /// instead of naming a newer tensor. Capacity is kept.
    pub fn rewind(&mut self, cp: Checkpoint) {
        if (cp.len as usize) < self.tensors.len() {
            self.tensors.truncate(cp.len as usize);
            self.generation = self.generation.wrapping_add(1);
        }
    }

    /// The tensor `id`, or an error if the id is stale.
    #[inline]
    pub fn get(&self, id: TensorId) -> Result<&Tensor, GraphError> {
        match self.tensors.get(id.index as usize) {
            Some(t) if t.generation == id.generation => Ok(t),
            _ => Err(GraphError::StaleId(id)),
        }
    }

    /// The tensor `id`, mutably, or an error if the id is stale.
    #[inline]
    pub fn get_mut(&mut self, id: TensorId) -> Result<&mut Tensor, GraphError> {
        match self.tensors.get_mut(id.index as usize) {
            Some(t) if t.generation == id.generation => Ok(t),
            _ => Err(GraphError::StaleId(id)),
        }
    }

    /// Whether `id` names a live tensor of this context.
    pub fn contains(&self, id: TensorId) -> bool {
        self.get(id).is_ok()
    }

    /// Find a tensor by name (the first created with that name).
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.ids().find(|&id| self[id].name() == name)
    }

    /// Set a tensor's name (truncated to 63 bytes).
    pub fn set_name(&mut self, id: TensorId, name: &str) -> Result<(), GraphError> {
        self.get_mut(id)?.name = TensorName::new(name);
        Ok(())
    }

    /// OR `flags` into a tensor's flags (ggml's setters never clear a flag).
    pub fn set_flags(&mut self, id: TensorId, flags: TensorFlags) -> Result<(), GraphError> {
        self.get_mut(id)?.flags |= flags;
        Ok(())
    }

    /// Mark a tensor as a graph input.
    pub fn set_input(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.set_flags(id, TensorFlags::INPUT)
    }

    /// Mark a tensor as a graph output.
    pub fn set_output(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.set_flags(id, TensorFlags::OUTPUT)
    }

    /// Mark a tensor as a trainable parameter.
    pub fn set_param(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.set_flags(id, TensorFlags::PARAM)
    }

    /// Replace source slot `slot` of `id`. This is the scheduler's hook for pointing a node at
    /// an input copy; it checks both ids.
    pub fn set_src(
        &mut self,
        id: TensorId,
        slot: usize,
        src: Option<TensorId>,
    ) -> Result<(), GraphError> {
        if let Some(s) = src {
            self.get(s)?;
        }
        let t = self.get_mut(id)?;
        let Some(dst) = t.src.get_mut(slot) else {
            return Err(GraphError::IndexOutOfRange {
                what: "source slot",
                index: slot,
                limit: MAX_SRC,
            });
        };
        *dst = src;
        t.refresh_n_src();
        Ok(())
    }

    // ---- construction ----

    pub(crate) fn check(&self, id: TensorId) -> Result<&Tensor, GraphError> {
        self.get(id)
    }

    /// ggml's `ggml_new_tensor_impl`: extents, contiguous strides, optional view source
    /// (collapsed to its root) with bounds check.
    pub(crate) fn new_impl(
        &mut self,
        ty: ElementType,
        ne_in: &[i64],
        view: Option<(TensorId, usize)>,
    ) -> Result<TensorId, GraphError> {
        if ne_in.is_empty() || ne_in.len() > MAX_DIMS {
            return Err(GraphError::InvalidShape {
                ne: ne_in.to_vec(),
                why: "1 to 4 dimensions",
            });
        }
        if ne_in.iter().any(|&n| n < 0) {
            return Err(GraphError::InvalidShape {
                ne: ne_in.to_vec(),
                why: "negative extent",
            });
        }
        let mut ne = [1i64; MAX_DIMS];
        ne[..ne_in.len()].copy_from_slice(ne_in);
        let blck = ty.block_size() as i64;
        if ne[0] % blck != 0 {
            return Err(GraphError::BlockMisaligned {
                ty,
                ne0: ne[0],
                block: blck as usize,
            });
        }
        // The contiguous byte size (`row_size * ne1 * ne2 * ne3`). Every prefix of this product
        // is a default stride, so checking it here keeps `contiguous_strides` and the element
        // count from overflowing on absurd extents.
        let data_size = ne[1..]
            .iter()
            .try_fold(
                ty.type_size().checked_mul(ne[0] as usize / ty.block_size()),
                |acc, &n| acc.map(|a| a.checked_mul(n as usize)),
            )
            .flatten();
        let nelements_fit = ne
            .iter()
            .try_fold(1i64, |acc, &n| acc.checked_mul(n))
            .is_some();
        let Some(data_size) = data_size.filter(|_| nelements_fit) else {
            return Err(GraphError::InvalidShape {
                ne: ne_in.to_vec(),
                why: "byte size or element count overflows",
            });
        };
        let mut view_src = None;
        let mut view_offs = 0usize;
        let mut storage = None;
        if let Some((src, offs)) = view {
            let s = self.check(src)?;
            let (root, offs) = match s.view_src {
                Some(r) => (r, offs.checked_add(s.view_offs)),
                None => (src, Some(offs)),
            };
            let r = self.check(root)?;
            let src_size = r.nbytes();
            let out_of_range = GraphError::ViewOutOfRange {
                size: data_size,
                offset: offs.unwrap_or(usize::MAX),
                src_size,
            };
            // ggml skips the check for an empty view; we refuse an empty view that starts past
            // its root's end (or at an offset that does not fit in usize) too: placing it
            // would compute an address outside the root, and whether that sum overflows would
            // depend on where the allocator put the root.
            let Some(offs) = offs else {
                return Err(out_of_range);
            };
            if data_size.saturating_add(offs) > src_size {
                return Err(out_of_range);
            }
            storage = match &r.storage {
                Some(st) => Some(TensorStorage {
                    buffer: st.buffer.clone(),
                    offset: st.offset.checked_add(offs).ok_or(out_of_range)?,
                }),
                None => None,
            };
            view_src = Some(root);
            view_offs = offs;
        }
        let index = u32::try_from(self.tensors.len()).map_err(|_| GraphError::InvalidShape {
            ne: ne_in.to_vec(),
            why: "arena holds 2^32 tensors",
        })?;
        let nb = contiguous_strides(ty, ne);
        self.tensors.push(Tensor {
            ty,
            ne,
            nb,
            nbytes: crate::tensor::nbytes(ty, ne, nb),
            op: Op::None,
            op_params: OpParams::default(),
            flags: TensorFlags::NONE,
            src: [None; MAX_SRC],
            n_src: 0,
            view_src,
            view_offs,
            name: TensorName::EMPTY,
            storage,
            generation: self.generation,
        });
        Ok(TensorId {
            index,
            generation: self.generation,
        })
    }

    /// A new tensor of type `ty` with 1 to 4 extents (`ggml_new_tensor`), contiguous, no
    /// storage yet.
    pub fn new_tensor(&mut self, ty: ElementType, ne: &[i64]) -> Result<TensorId, GraphError> {
        self.new_impl(ty, ne, None)
    }

    /// A new 1-d tensor.
    pub fn new_tensor_1d(&mut self, ty: ElementType, ne0: i64) -> Result<TensorId, GraphError> {
        self.new_impl(ty, &[ne0], None)
    }

    /// A new 2-d tensor.
    pub fn new_tensor_2d(
        &mut self,
        ty: ElementType,
        ne0: i64,
        ne1: i64,
    ) -> Result<TensorId, GraphError> {
        self.new_impl(ty, &[ne0, ne1], None)
    }

    /// A new 3-d tensor.
    pub fn new_tensor_3d(
        &mut self,
        ty: ElementType,
        ne0: i64,
        ne1: i64,
        ne2: i64,
    ) -> Result<TensorId, GraphError> {
        self.new_impl(ty, &[ne0, ne1, ne2], None)
    }

    /// A new 4-d tensor.
    pub fn new_tensor_4d(
        &mut self,
        ty: ElementType,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        ne3: i64,
    ) -> Result<TensorId, GraphError> {
        self.new_impl(ty, &[ne0, ne1, ne2, ne3], None)
    }

    /// A new tensor with `a`'s type, extents **and strides**, not a view, no op
    /// (`ggml_dup_tensor_layout`; the scheduler's input copies).
    pub fn new_tensor_same_layout(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let (ty, ne, nb) = {
            let t = self.check(a)?;
            (t.ty, t.ne, t.nb)
        };
        let id = self.new_impl(ty, &ne, None)?;
        self.tensors[id.index()].nb = nb;
        self.tensors[id.index()].refresh_nbytes();
        Ok(id)
    }
}

impl Index<TensorId> for Context {
    type Output = Tensor;
    /// Panics on a stale id; use [`Context::get`] where the id may be stale.
    #[inline]
    fn index(&self, id: TensorId) -> &Tensor {
        match self.get(id) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }
}

impl IndexMut<TensorId> for Context {
    #[inline]
    fn index_mut(&mut self, id: TensorId) -> &mut Tensor {
        match self.get_mut(id) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }
}
