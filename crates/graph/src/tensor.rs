//! Tensors: metadata only. The bytes live in a backend buffer that the tensor refers to
//! through an opaque [`TensorStorage`] slot.
//!
//! Why opaque: `graph` sits at the bottom of the dependency graph and must not know what a
//! buffer is, yet a tensor must say where its bytes live and must not outlive them. The slot
//! holds a reference-counted [`StorageBuffer`] (a trait this crate defines and `backend-core`
//! implements for its buffers) plus a byte offset. Holding the `Arc` keeps the memory alive for
//! as long as any tensor points into it, so a dangling tensor cannot be expressed.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::op::{Op, OpParams, UnaryOp};
use crate::types::ElementType;

/// Maximum number of dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Maximum number of sources of one tensor (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Maximum name length in bytes, including ggml's terminating NUL (`GGML_MAX_NAME`).
pub const MAX_NAME: usize = 64;

/// A typed index of a tensor inside a [`crate::Context`].
///
/// It carries the context's generation at creation, so an id that outlived
/// [`crate::Context::rewind`] is detected instead of silently naming a newer tensor.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl TensorId {
    /// The dense index of this tensor in its context (stable while the tensor lives); use it to
    /// key side tables (`Vec` indexed by tensor, like cranelift's `SecondaryMap`).
    #[inline]
    pub const fn index(self) -> usize {
        self.index as usize
    }

    /// The context generation this id was made in. Side tables keyed by
    /// [`TensorId::index`] store it to tell a live tensor from one that reuses the slot
    /// after a rewind.
    #[inline]
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

impl fmt::Debug for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.index)
    }
}

/// Tensor flags (`enum ggml_tensor_flag`), a bit set.
///
/// ```
/// use graph::TensorFlags;
/// let f = TensorFlags::INPUT | TensorFlags::OUTPUT;
/// assert!(f.contains(TensorFlags::INPUT));
/// assert!(!f.contains(TensorFlags::PARAM));
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags(pub u32);

impl TensorFlags {
    /// No flag.
    pub const NONE: Self = TensorFlags(0);
    /// A graph input: allocated before the node sweep; the scheduler places it on the last backend.
    pub const INPUT: Self = TensorFlags(1);
    /// A graph output: never freed or overwritten in place by the graph allocator.
    pub const OUTPUT: Self = TensorFlags(2);
    /// A trainable parameter: a `NONE` tensor with this flag is a node, not a leaf.
    pub const PARAM: Self = TensorFlags(4);
    /// The loss of a training graph.
    pub const LOSS: Self = TensorFlags(8);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for TensorFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        TensorFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for TensorFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

/// A tensor name stored inline (at most 63 bytes, like ggml's 64-byte NUL-terminated field),
/// so naming tensors on the per-step path never allocates. Longer names are truncated at a
/// character boundary.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorName {
    len: u8,
    bytes: [u8; MAX_NAME - 1],
}

impl TensorName {
    /// The empty name.
    pub const EMPTY: Self = TensorName {
        len: 0,
        bytes: [0; MAX_NAME - 1],
    };

    /// A name from `s`, truncated to 63 bytes at a character boundary.
    pub fn new(s: &str) -> Self {
        let mut n = Self::EMPTY;
        n.push_str(s);
        n
    }

    /// Append as much of `s` as fits.
    pub fn push_str(&mut self, s: &str) {
        let room = self.bytes.len() - self.len as usize;
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        let start = self.len as usize;
        self.bytes[start..start + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take as u8;
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        // Only whole UTF-8 characters are ever copied in (see push_str).
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }

    /// Whether the name is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for TensorName {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl fmt::Debug for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Write for TensorName {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// Memory that tensors can live in. `backend-core` implements this for its buffers; `graph`
/// only needs to keep the memory alive and to know its identity.
///
/// Implementors are downcast back to their concrete type through `Arc<dyn Any>` upcasting.
pub trait StorageBuffer: Any + Send + Sync + fmt::Debug {
    /// Size of the memory in bytes.
    fn storage_size(&self) -> usize;
}

/// Where a tensor's bytes live: a buffer and a byte offset inside it.
///
/// ggml keeps a raw `data` pointer; we keep `(buffer, offset)`, and backends turn that into an
/// address when they need one.
#[derive(Clone)]
pub struct TensorStorage {
    /// The buffer that owns the bytes (for a view, its root's buffer).
    pub buffer: Arc<dyn StorageBuffer>,
    /// Offset of the tensor's first byte from the start of the buffer.
    pub offset: usize,
}

impl TensorStorage {
    /// Whether both refer to the same buffer object.
    pub fn same_buffer(&self, other: &TensorStorage) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.buffer), Arc::as_ptr(&other.buffer))
    }
}

impl fmt::Debug for TensorStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorStorage")
            .field("buffer", &Arc::as_ptr(&self.buffer))
            .field("offset", &self.offset)
            .finish()
    }
}

/// A tensor's metadata (`struct ggml_tensor` without the data pointer).
///
/// Read it through [`crate::Context::get`] or `ctx[id]`; create it with the constructors on
/// [`crate::Context`].
///
/// ```
/// use graph::{Context, ElementType};
/// let mut ctx = Context::new();
/// let a = ctx.new_tensor_2d(ElementType::F32, 3, 5)?;
/// let t = ctx.transpose(a)?;
/// assert_eq!(ctx[t].ne(), [5, 3, 1, 1]);
/// assert_eq!(ctx[t].nb(), [12, 4, 60, 60]);
/// assert_eq!(ctx[t].nbytes(), 60);
/// assert_eq!(ctx[t].view_src(), Some(a));
/// # Ok::<(), graph::GraphError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) ty: ElementType,
    pub(crate) ne: [i64; MAX_DIMS],
    pub(crate) nb: [usize; MAX_DIMS],
    pub(crate) op: Op,
    pub(crate) op_params: OpParams,
    pub(crate) flags: TensorFlags,
    pub(crate) src: [Option<TensorId>; MAX_SRC],
    pub(crate) view_src: Option<TensorId>,
    pub(crate) view_offs: usize,
    pub(crate) name: TensorName,
    pub(crate) storage: Option<TensorStorage>,
    pub(crate) generation: u32,
    /// `nbytes(ty, ne, nb)`, kept up to date by every place in this crate that sets the
    /// layout ([`Tensor::refresh_nbytes`]): allocators ask for it several times per tensor
    /// per step, and recomputing it was a large share of their time.
    pub(crate) nbytes: usize,
    /// One past the last used source slot ([`Tensor::refresh_n_src`] keeps it up to date):
    /// most nodes use 1–3 of the 10 slots, and graph walkers need not visit the rest.
    pub(crate) n_src: u8,
}

impl Tensor {
    /// Element type.
    pub fn ty(&self) -> ElementType {
        self.ty
    }
    /// Extents per dimension (dimension 0 varies fastest); unused dimensions are 1.
    pub fn ne(&self) -> [i64; MAX_DIMS] {
        self.ne
    }
    /// Byte strides per dimension (for block types `nb[0]` is the block size in bytes).
    pub fn nb(&self) -> [usize; MAX_DIMS] {
        self.nb
    }
    /// The producing op.
    #[inline]
    pub fn op(&self) -> Op {
        self.op
    }
    /// The raw parameter block.
    pub fn op_params(&self) -> &OpParams {
        &self.op_params
    }
    /// Flags.
    #[inline]
    pub fn flags(&self) -> TensorFlags {
        self.flags
    }
    /// Source slot `i` (slots may be empty anywhere; never stop at the first empty one).
    /// A slot past [`MAX_SRC`] is empty.
    #[inline]
    pub fn src(&self, i: usize) -> Option<TensorId> {
        self.src.get(i).copied().flatten()
    }
    /// All source slots.
    #[inline]
    pub fn srcs(&self) -> &[Option<TensorId>; MAX_SRC] {
        &self.src
    }

    /// The source slots up to the last used one (a prefix of [`Tensor::srcs`]; empty slots
    /// inside it stay `None`). A fast path for allocators and schedulers that walk every
    /// source of every node.
    #[doc(hidden)]
    #[inline]
    pub fn srcs_used(&self) -> &[Option<TensorId>] {
        debug_assert!(self.src[self.n_src as usize..].iter().all(Option::is_none));
        &self.src[..self.n_src as usize]
    }
    /// The root tensor whose storage this view aliases (never itself a view).
    #[inline]
    pub fn view_src(&self) -> Option<TensorId> {
        self.view_src
    }
    /// Byte offset inside the view source.
    pub fn view_offs(&self) -> usize {
        self.view_offs
    }
    /// The name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }
    /// Where the bytes live, if the tensor is allocated.
    #[inline]
    pub fn storage(&self) -> Option<&TensorStorage> {
        self.storage.as_ref()
    }
    /// Whether the tensor has storage (ggml: `data != NULL`).
    #[inline]
    pub fn has_storage(&self) -> bool {
        self.storage.is_some()
    }
    /// Set or clear where the bytes live. This is the allocators' hook (`backend-core`'s
    /// `tensor_alloc` and `view_init` call it after their checks); prefer those.
    #[inline]
    pub fn set_storage(&mut self, storage: Option<TensorStorage>) {
        self.storage = storage;
    }
    /// Whether this tensor is a storage view (`view_src` is set): view ops, CPY and in-place ops.
    #[inline]
    pub fn is_view(&self) -> bool {
        self.view_src.is_some()
    }
    /// The unary function of a UNARY tensor.
    pub fn unary_op(&self) -> Option<UnaryOp> {
        match self.op {
            Op::Unary(u) => Some(u),
            _ => None,
        }
    }

    /// Number of elements.
    pub fn nelements(&self) -> i64 {
        self.ne.iter().product()
    }
    /// Number of rows (`ne1 * ne2 * ne3`).
    pub fn nrows(&self) -> i64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    /// Number of dimensions, trailing 1s ignored (at least 1).
    pub fn n_dims(&self) -> usize {
        (1..MAX_DIMS)
            .rev()
            .find(|&i| self.ne[i] != 1)
            .map_or(1, |i| i + 1)
    }

    /// Bytes spanned by the tensor (`ggml_nbytes`): address of the last element plus its size,
    /// so it is right for permuted, transposed and padded strides. 0 when any extent is 0.
    #[inline]
    pub fn nbytes(&self) -> usize {
        debug_assert_eq!(
            self.nbytes,
            nbytes(self.ty, self.ne, self.nb),
            "cached nbytes out of date"
        );
        self.nbytes
    }

    /// Recompute the number of used source slots after a source changed.
    pub(crate) fn refresh_n_src(&mut self) {
        self.n_src = self
            .src
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1) as u8;
    }

    /// Recompute the cached byte size after the layout changed.
    pub(crate) fn refresh_nbytes(&mut self) {
        self.nbytes = nbytes(self.ty, self.ne, self.nb);
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_size(&self) -> usize {
        self.ty.row_size(self.ne[0] as usize)
    }

    /// Whether elements are laid out densely in order (`ggml_is_contiguous`).
    pub fn is_contiguous(&self) -> bool {
        self.is_contiguous_n(0)
    }

    /// ggml's `ggml_is_contiguous_n`: contiguous from dimension `n` on (dimensions below `n`
    /// may be strided; extents of 1 are ignored).
    pub fn is_contiguous_n(&self, n: usize) -> bool {
        let mut next_nb = self.ty.type_size();
        if self.ne[0] != self.ty.block_size() as i64 && self.nb[0] != next_nb {
            return false;
        }
        // saturating: a product past `usize::MAX` matches no stride, as it should
        next_nb = next_nb.saturating_mul(self.ne[0] as usize / self.ty.block_size());
        for i in 1..MAX_DIMS {
            if self.ne[i] != 1 {
                if i > n {
                    if self.nb[i] != next_nb {
                        return false;
                    }
                    next_nb = next_nb.saturating_mul(self.ne[i] as usize);
                } else {
                    // this dimension does not need to be contiguous
                    next_nb = (self.ne[i] as usize).saturating_mul(self.nb[i]);
                }
            }
        }
        true
    }

    /// Rows are contiguous (`ggml_is_contiguous_rows`: element stride equals the type size).
    pub fn is_contiguous_rows(&self) -> bool {
        self.ne[0] == self.ty.block_size() as i64 || self.nb[0] == self.ty.type_size()
    }

    /// Whether dimensions 0 and 1 are swapped (`ggml_is_transposed`).
    pub fn is_transposed(&self) -> bool {
        self.nb[0] > self.nb[1]
    }

    /// Whether dimensions are permuted (`ggml_is_permuted`).
    pub fn is_permuted(&self) -> bool {
        self.nb[0] > self.nb[1] || self.nb[1] > self.nb[2] || self.nb[2] > self.nb[3]
    }

    /// Same type, extents and strides (`ggml_are_same_layout`).
    pub fn same_layout(&self, other: &Tensor) -> bool {
        self.ty == other.ty && self.ne == other.ne && self.nb == other.nb
    }

    /// Same extents (`ggml_are_same_shape`).
    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// Whether `self` can be broadcast over `other` (`ggml_can_repeat`): every extent of
    /// `other` is a multiple of the matching extent of `self`.
    pub fn can_repeat(&self, other: &Tensor) -> bool {
        (self.nelements() == 0 && other.nelements() == 0)
            || (0..MAX_DIMS).all(|i| self.ne[i] != 0 && other.ne[i] % self.ne[i] == 0)
    }
}

/// `ggml_nbytes` over explicit type, extents and strides; `usize::MAX` when the extent
/// overflows (see [`checked_nbytes`]).
///
/// ```
/// use graph::{nbytes, ElementType};
/// assert_eq!(nbytes(ElementType::Q4_0, [64, 3, 1, 1], [18, 36, 108, 108]), 108);
/// assert_eq!(nbytes(ElementType::F32, [5, 3, 1, 1], [12, 4, 60, 60]), 60);
/// assert_eq!(nbytes(ElementType::F32, [0, 5, 1, 1], [4, 0, 0, 0]), 0);
/// ```
pub fn nbytes(ty: ElementType, ne: [i64; MAX_DIMS], nb: [usize; MAX_DIMS]) -> usize {
    checked_nbytes(ty, ne, nb).unwrap_or(usize::MAX)
}

/// [`nbytes`], or `None` when the byte extent does not fit in `usize` (every tensor a
/// [`crate::Context`] makes has one that fits: its constructors check this).
///
/// ```
/// use graph::{checked_nbytes, ElementType};
/// assert_eq!(checked_nbytes(ElementType::F32, [2, 3, 1, 1], [4, 8, 24, 24]), Some(24));
/// assert_eq!(checked_nbytes(ElementType::F32, [2, 3, 1, 1], [4, usize::MAX / 2, 0, 0]), None);
/// ```
pub fn checked_nbytes(
    ty: ElementType,
    ne: [i64; MAX_DIMS],
    nb: [usize; MAX_DIMS],
) -> Option<usize> {
    if ne.iter().any(|&n| n <= 0) {
        return Some(0);
    }
    let blck = ty.block_size();
    // all extents are positive here, so `as usize` is exact
    let mut bytes = if blck == 1 {
        ty.type_size()
            .checked_add((ne[0] as usize - 1).checked_mul(nb[0])?)?
    } else if (ne[0] as usize).is_multiple_of(blck) {
        // equal to ggml's `ne0 * nb0 / blck`, without its overflow on huge rows
        (ne[0] as usize / blck).checked_mul(nb[0])?
    } else {
        (ne[0] as usize).checked_mul(nb[0])? / blck
    };
    for i in 1..MAX_DIMS {
        bytes = bytes.checked_add((ne[i] as usize - 1).checked_mul(nb[i])?)?;
    }
    Some(bytes)
}

/// Contiguous strides for `ty` and `ne` (ggml's defaults at creation); a stride that does
/// not fit in `usize` saturates at `usize::MAX` (the constructors refuse such extents).
///
/// ```
/// use graph::{contiguous_strides, ElementType};
/// assert_eq!(contiguous_strides(ElementType::Q4_0, [64, 3, 1, 1]), [18, 36, 108, 108]);
/// ```
pub fn contiguous_strides(ty: ElementType, ne: [i64; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let mut nb = [0usize; MAX_DIMS];
    nb[0] = ty.type_size();
    nb[1] = nb[0].saturating_mul(ne[0].max(0) as usize / ty.block_size());
    for i in 2..MAX_DIMS {
        nb[i] = nb[i - 1].saturating_mul(ne[i - 1].max(0) as usize);
    }
    nb
}
