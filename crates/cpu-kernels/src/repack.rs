//! The interleaved q4_0, q4_1 and q8_0 layouts of the CPU device's `CPU_REPACK` buffer type,
//! and their matrix-product kernels (q4_1's and q8_0's in the submodules `q4_1`, `q8_0`).
//!
//! Why: a q4_0 row keeps each block's scale next to its 16 quant bytes (18 bytes a block), so
//! a kernel that computes several rows at once gathers 2-byte scales and 16-byte quant runs
//! from as many streams and spends most of its instructions moving them into place. Here the
//! blocks of [`GROUP_ROWS`] consecutive rows are interleaved: per block index `b` of a group,
//! the sixteen rows' f16 scales (32 bytes), then four 64-byte chunks, chunk `c` holding bytes
//! `4c .. 4c + 4` of the sixteen rows' quants, row `r` at bytes `4r .. 4r + 4` of the chunk.
//! One 512-bit load then gives four quant bytes of each of the sixteen rows in its sixteen
//! 32-bit lanes, so VNNI's `dpbusd` against the column's four matching bytes (broadcast)
//! sums row `r` in lane `r`: a block of sixteen rows is four loads, eight nibble masks and
//! eight `dpbusd`, with no shuffles and no horizontal sums; the scales convert with one
//! F16C instruction. A group is one contiguous stream of `16 · row bytes`.
//!
//! q4_1 blocks (20 bytes: scale, minimum, 16 quant bytes) are interleaved the same way, the
//! sixteen minimums (32 bytes) following the sixteen scales: see the submodule `q4_1` for
//! its kernels. q8_0 groups keep all quant chunks first and the scales after them (aligned
//! chunks for 34-byte blocks): see the submodule `q8_0`.
//!
//! The layout is a permutation of the plain bytes within each group (nothing added, nothing
//! dropped, no bits changed), so filling a tensor with one byte value is the same in both
//! layouts and [`segments`] maps any plain byte range to where it lives. Which tensors use it:
//! [`is_repackable`]. The integer block sums are exact and the f32 operations (scale product,
//! FMA into an even-block and an odd-block accumulator, one final add) are those of the plain
//! q4_0 kernels in the same order, so a product over repacked weights has the same bits as
//! over the plain ones at every instruction-set level.

use std::any::Any;
use std::ptr::NonNull;

use backend_core::{BackendError, BufferImpl};
use graph::{ElementType, Tensor};
use half::f16;

use crate::quant::{Isa, QK};

pub(crate) mod q4_1;
pub(crate) mod q8_0;

/// Rows interleaved in one group of the repacked layout.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one block index of a q4_0 group: sixteen f16 scales and sixteen rows' 16 quant
/// bytes.
pub(crate) const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * 18;

/// Bytes of one plain block of a repacked type (`None`: the type has no repacked layout).
fn block_bytes(ty: ElementType) -> Option<usize> {
    match ty {
        ElementType::Q4_0 => Some(18),
        ElementType::Q4_1 => Some(20),
        ElementType::Q8_0 => Some(q8_0::BLOCK_BYTES),
        _ => None,
    }
}

/// Name of the CPU device's buffer type that stores q4_0 matrices in this layout (ggml's
/// `CPU_REPACK`). Tensors in a buffer of this type are repacked when [`is_repackable`].
pub const REPACK_BUFFER_TYPE_NAME: &str = "CPU_REPACK";

/// Whether `t`, placed in a [`REPACK_BUFFER_TYPE_NAME`] buffer, is stored repacked: a q4_0,
/// q4_1 or q8_0 tensor that is not a view, with dense rows and a multiple of [`GROUP_ROWS`] rows per
/// matrix (`ne[1]`), so groups never straddle two matrices. Any other tensor in such a buffer
/// is stored as it is, and the CPU device runs no op that reads it.
///
/// ```
/// use graph::{Context, ElementType};
/// let mut ctx = Context::new();
/// let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 32)?;
/// let odd = ctx.new_tensor_2d(ElementType::Q4_0, 64, 24)?;
/// assert!(cpu_kernels::repack::is_repackable(&ctx[w]));
/// assert!(!cpu_kernels::repack::is_repackable(&ctx[odd]));
/// # Ok::<(), graph::GraphError>(())
/// ```
pub fn is_repackable(t: &Tensor) -> bool {
    let ne = t.ne();
    block_bytes(t.ty()).is_some()
        && t.view_src().is_none()
        && t.is_contiguous()
        && ne[0] > 0
        && ne[1] > 0
        && (ne[1] as usize).is_multiple_of(GROUP_ROWS)
}

/// How the kernels must read a tensor's bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// As its type says, in a buffer of another type.
    Plain,
    /// Interleaved in groups of [`GROUP_ROWS`] rows (a [`is_repackable`] tensor in a
    /// [`REPACK_BUFFER_TYPE_NAME`] buffer).
    Repacked,
    /// A view into a repacked tensor: its bytes are not where its strides say.
    Unreadable,
    /// Stored as its type says, but in a [`REPACK_BUFFER_TYPE_NAME`] buffer (not
    /// [`is_repackable`]). Its bytes are readable, but no op takes it (see
    /// [`layouts_supported`]).
    AsIs,
}

/// The layout of tensor `id`'s bytes.
pub(crate) fn layout(ctx: &graph::Context, id: graph::TensorId) -> Layout {
    let Ok(t) = ctx.get(id) else {
        return Layout::Plain;
    };
    // The buffer type's name first: it needs no handle clone (this runs for every source of
    // every node the scheduler asks about).
    let named_repack = t
        .storage()
        .and_then(backend_core::storage_buffer_type)
        .is_some_and(|b| b.name() == REPACK_BUFFER_TYPE_NAME);
    if !named_repack {
        return Layout::Plain;
    }
    // A buffer of that name is ours if its implementation is; an empty one has none (a
    // weight loader places a weight in one to ask whether an op would take it there).
    let in_repack = t
        .storage()
        .and_then(backend_core::Buffer::from_storage)
        .is_some_and(|b| b.size() == 0 || RepackBuffer::of(&b).is_some());
    if !in_repack {
        return Layout::Plain;
    }
    if is_repackable(t) {
        return Layout::Repacked;
    }
    match t.view_src().and_then(|s| ctx.get(s).ok()) {
        Some(root) if is_repackable(root) => Layout::Unreadable,
        _ => Layout::AsIs,
    }
}

/// Whether node `id` can read its sources and write its result given their layouts: a
/// repacked tensor only as the weights (source 0) of MUL_MAT, never a view into one, and no
/// other tensor of a [`REPACK_BUFFER_TYPE_NAME`] buffer at all.
///
/// Why refuse tensors a repack buffer stores as they are (their bytes are readable): ggml's
/// CPU device answers for an op with a source in one of its extra buffer types by that
/// buffer type's own check, which accepts only the products it repacks for; a weight loader
/// that asks "would this op run on the device with this weight in that buffer type" (as
/// llama.cpp's does, and `backend_core::WeightBufferTypes`) then puts in the repack buffer
/// type only the weights it repacks, and keeps the others where they cost no copy.
pub(crate) fn layouts_supported(ctx: &graph::Context, id: graph::TensorId) -> bool {
    let Ok(t) = ctx.get(id) else {
        return false;
    };
    if t.op().is_view_op() || t.op() == graph::Op::None {
        return true;
    }
    if layout(ctx, id) != Layout::Plain {
        return false;
    }
    (0..graph::MAX_SRC).all(|i| match t.src(i).map(|s| layout(ctx, s)) {
        None | Some(Layout::Plain) => true,
        Some(Layout::Repacked) => i == 0 && t.op() == graph::Op::MulMat,
        Some(Layout::Unreadable | Layout::AsIs) => false,
    })
}

/// A buffer of the [`REPACK_BUFFER_TYPE_NAME`] type: host memory (`inner`, a plain CPU
/// buffer) whose [`is_repackable`] tensors are stored interleaved. Writes and reads of
/// those tensors go through the layout (`set_tensor` repacks, `get_tensor` returns the
/// plain q4_0 bytes), whatever the byte range; other tensors pass through unchanged.
///
/// It has no host pointer: the generic copies of `backend_core` would move its bytes raw,
/// so they take its `get_tensor`/`set_tensor` instead; the CPU kernels find its memory
/// through it (`RepackBuffer::of`) and read the layout themselves. Made by
/// `backend_cpu::cpu_repack_buffer_type`, whose docs show it in use.
pub struct RepackBuffer {
    inner: Box<dyn BufferImpl>,
}

impl RepackBuffer {
    /// Wrap `inner`, a host buffer (its `host_ptr` must be `Some` unless it is empty).
    pub fn new(inner: Box<dyn BufferImpl>) -> RepackBuffer {
        RepackBuffer { inner }
    }

    /// The repack buffer behind `buf`, if it is one.
    pub(crate) fn of(buf: &backend_core::Buffer) -> Option<&RepackBuffer> {
        buf.implementation()?
            .as_any()
            .downcast_ref::<RepackBuffer>()
    }

    /// Where the kernels read the buffer's bytes.
    pub(crate) fn data_ptr(&self) -> Option<NonNull<u8>> {
        self.inner.host_ptr()
    }

    /// Run `f(plain_off, packed_off, len)` over the runs of `range` (plain offsets within
    /// `tensor`) after checking that it lies inside the tensor.
    fn map_range(
        tensor: &Tensor,
        offset: usize,
        len: usize,
        f: impl FnMut(usize, usize, usize),
    ) -> Result<(), BackendError> {
        let end = Self::check(tensor, offset, len)?;
        segments(tensor.ty(), tensor.ne()[0] as usize, offset..end, f);
        Ok(())
    }

    /// The end of `offset .. offset + len` if that lies inside `tensor`.
    fn check(tensor: &Tensor, offset: usize, len: usize) -> Result<usize, BackendError> {
        let n = tensor.nbytes();
        offset
            .checked_add(len)
            .filter(|&e| e <= n)
            .ok_or_else(|| BackendError::out_of_bounds("repacked tensor", offset, len, n))
    }
}

impl BufferImpl for RepackBuffer {
    fn memset_tensor(
        &self,
        tensor: &Tensor,
        value: u8,
        offset: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        if !is_repackable(tensor) {
            return self.inner.memset_tensor(tensor, value, offset, size);
        }
        let mut res = Ok(());
        Self::map_range(tensor, offset, size, |_, q, n| {
            if res.is_ok() {
                res = self.inner.memset_tensor(tensor, value, q, n);
            }
        })?;
        res
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        if !is_repackable(tensor) {
            return self.inner.set_tensor(tensor, offset, data);
        }
        Self::check(tensor, offset, data.len())?;
        let (ty, k) = (tensor.ty(), tensor.ne()[0] as usize);
        let group = k / QK * GROUP_ROWS * block_bytes(ty).unwrap_or(0);
        // Whole groups are repacked in a scratch group and written at once; the partial
        // groups at either end run by run.
        let first = offset.next_multiple_of(group);
        let last = (offset + data.len()) / group * group;
        let mut res = Ok(());
        let mut put = |p: usize, q: usize, n: usize| {
            if res.is_ok() {
                res = self
                    .inner
                    .set_tensor(tensor, q, &data[p - offset..p - offset + n]);
            }
        };
        if first >= last {
            Self::map_range(tensor, offset, data.len(), &mut put)?;
            return res;
        }
        Self::map_range(tensor, offset, first - offset, &mut put)?;
        Self::map_range(tensor, last, offset + data.len() - last, &mut put)?;
        res?;
        let mut scratch = vec![0u8; group];
        for g in (first..last).step_by(group) {
            pack(ty, k, &data[g - offset..g - offset + group], &mut scratch);
            self.inner.set_tensor(tensor, g, &scratch)?;
        }
        Ok(())
    }
    fn get_tensor(
        &self,
        tensor: &Tensor,
        offset: usize,
        data: &mut [u8],
    ) -> Result<(), BackendError> {
        if !is_repackable(tensor) {
            return self.inner.get_tensor(tensor, offset, data);
        }
        Self::check(tensor, offset, data.len())?;
        let (ty, k) = (tensor.ty(), tensor.ne()[0] as usize);
        let group = k / QK * GROUP_ROWS * block_bytes(ty).unwrap_or(0);
        let first = offset.next_multiple_of(group);
        let last = (offset + data.len()) / group * group;
        let mut res = Ok(());
        let mut get = |data: &mut [u8], p: usize, q: usize, n: usize| {
            if res.is_ok() {
                res = self
                    .inner
                    .get_tensor(tensor, q, &mut data[p - offset..p - offset + n]);
            }
        };
        if first >= last {
            let len = data.len();
            Self::map_range(tensor, offset, len, |p, q, n| get(data, p, q, n))?;
            return res;
        }
        let tail = offset + data.len() - last;
        Self::map_range(tensor, offset, first - offset, |p, q, n| get(data, p, q, n))?;
        Self::map_range(tensor, last, tail, |p, q, n| get(data, p, q, n))?;
        res?;
        let mut scratch = vec![0u8; group];
        for g in (first..last).step_by(group) {
            self.inner.get_tensor(tensor, g, &mut scratch)?;
            unpack(ty, k, &scratch, &mut data[g - offset..g - offset + group]);
        }
        Ok(())
    }
    fn clear(&self, value: u8) -> Result<(), BackendError> {
        // One value everywhere is the same bytes in either layout.
        self.inner.clear(value)
    }
    fn is_writable(&self) -> bool {
        self.inner.is_writable()
    }
    fn base_address(&self) -> u64 {
        self.inner.base_address()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Where the plain bytes `range` of a repacked tensor of type `ty` with `k` elements per row
/// live: calls `f(plain_offset, packed_offset, len)` for consecutive runs (a scale's or a
/// minimum's two bytes, or four quant bytes), in order of `plain_offset`, covering `range`
/// exactly. Offsets are from the tensor's first byte; `range` must lie inside the tensor (the
/// caller checks it). Nothing for a type without a repacked layout.
///
/// ```
/// use graph::ElementType;
/// // q4_0, row 1's first block: its scale follows row 0's, its quants sit 4 bytes into
/// // each 64-byte chunk.
/// let row = 2 * 18; // k = 64: two blocks per row
/// let mut runs = Vec::new();
/// cpu_kernels::repack::segments(ElementType::Q4_0, 64, row..row + 18, |p, q, n| {
///     runs.push((p, q, n))
/// });
/// assert_eq!(runs[0], (row, 2, 2));
/// assert_eq!(runs[1], (row + 2, 32 + 4, 4));
/// assert_eq!(runs[4], (row + 14, 32 + 3 * 64 + 4, 4));
/// // q4_1: the sixteen minimums follow the sixteen scales.
/// let row = 2 * 20;
/// runs.clear();
/// cpu_kernels::repack::segments(ElementType::Q4_1, 64, row..row + 20, |p, q, n| {
///     runs.push((p, q, n))
/// });
/// assert_eq!(runs[..3], [(row, 2, 2), (row + 2, 32 + 2, 2), (row + 4, 64 + 4, 4)]);
/// ```
pub fn segments(
    ty: ElementType,
    k: usize,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize),
) {
    if ty == ElementType::Q8_0 {
        return q8_0::segments(k, range, f);
    }
    let Some(block) = block_bytes(ty) else {
        return;
    };
    // Scale (and minimum) bytes at the start of a plain block.
    let head = block - QK / 2;
    let row_size = k / QK * block;
    if row_size == 0 {
        return;
    }
    let mut off = range.start;
    while off < range.end {
        let (row, within) = (off / row_size, off % row_size);
        let (b, j) = (within / block, within % block);
        let (group, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
        let base = group * GROUP_ROWS * row_size + b * GROUP_ROWS * block;
        let (at, run) = if j < head {
            (base + GROUP_ROWS * 2 * (j / 2) + 2 * r + j % 2, 2 - j % 2)
        } else {
            let q = j - head;
            (
                base + GROUP_ROWS * head + 64 * (q / 4) + 4 * r + q % 4,
                4 - q % 4,
            )
        };
        let n = run.min(range.end - off);
        f(off, at, n);
        off += n;
    }
}

/// Repack whole groups: `plain` holds rows of `k` elements of `ty`, a multiple of
/// [`GROUP_ROWS`] of them; `out` (as long) receives them in the interleaved layout.
pub fn pack(ty: ElementType, k: usize, plain: &[u8], out: &mut [u8]) {
    assert_eq!(plain.len(), out.len(), "pack: lengths differ");
    segments(ty, k, 0..plain.len(), |p, q, n| {
        out[q..q + n].copy_from_slice(&plain[p..p + n]);
    });
}

/// Packs one group: `rows` are its [`GROUP_ROWS`] plain rows of `k` elements of `ty` (q4_0,
/// q4_1 or q8_0; each at least a row long) and `out` (as many bytes) receives them as
/// [`pack`] lays them out.
///
/// Why a second packer: [`pack`] maps byte runs one at a time through [`segments`] (a few
/// divisions per run of two or four bytes), which is fine when a buffer is written once but
/// costs more than a batched product over the group; here whole blocks are copied in place,
/// so the executor can repack plain weights on the fly for products of many columns and
/// run the repacked kernels on them.
pub(crate) fn pack_group(ty: ElementType, k: usize, rows: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let nb = k / QK;
    let Some(block) = block_bytes(ty) else {
        return;
    };
    assert!(
        out.len() == GROUP_ROWS * nb * block && rows.iter().all(|r| r.len() >= nb * block),
        "pack_group: wrong lengths"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if crate::qmv512::available() {
        // SAFETY: the CPU has AVX-512 (checked above); every row holds `nb` blocks and `out`
        // a group of them (asserted above).
        return unsafe { x86::pack_group(ty, nb, rows, out) };
    }
    pack_group_portable(ty, nb, rows, out);
}

/// [`pack_group`] in portable code (Miri, CPUs without AVX-512, and the tests' reference).
fn pack_group_portable(ty: ElementType, nb: usize, rows: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let Some(block) = block_bytes(ty) else {
        return;
    };
    if ty == ElementType::Q8_0 {
        let (quants, scales) = out.split_at_mut(nb * GROUP_ROWS * QK);
        for (r, row) in rows.iter().enumerate() {
            let blocks = row[..nb * block].chunks_exact(block);
            let dst = quants.chunks_exact_mut(GROUP_ROWS * QK);
            for (b, (blk, q)) in blocks.zip(dst).enumerate() {
                let s = b * 2 * GROUP_ROWS + 2 * r;
                scales[s..s + 2].copy_from_slice(&blk[..2]);
                for (c, w) in blk[2..].chunks_exact(4).enumerate() {
                    q[64 * c + 4 * r..64 * c + 4 * r + 4].copy_from_slice(w);
                }
            }
        }
        return;
    }
    // q4_0: the scale; q4_1: the scale and the minimum; then 16 quant bytes.
    let head = block - QK / 2;
    for (r, row) in rows.iter().enumerate() {
        let blocks = row[..nb * block].chunks_exact(block);
        for (blk, g) in blocks.zip(out.chunks_exact_mut(GROUP_ROWS * block)) {
            for (h, w) in blk[..head].chunks_exact(2).enumerate() {
                g[2 * GROUP_ROWS * h + 2 * r..2 * GROUP_ROWS * h + 2 * r + 2].copy_from_slice(w);
            }
            let q = &mut g[GROUP_ROWS * head..];
            for (c, w) in blk[head..].chunks_exact(4).enumerate() {
                q[64 * c + 4 * r..64 * c + 4 * r + 4].copy_from_slice(w);
            }
        }
    }
}

/// The inverse of [`pack`].
pub fn unpack(ty: ElementType, k: usize, packed: &[u8], out: &mut [u8]) {
    assert_eq!(packed.len(), out.len(), "unpack: lengths differ");
    segments(ty, k, 0..out.len(), |p, q, n| {
        out[p..p + n].copy_from_slice(&packed[q..q + n]);
    });
}

/// `out[c][r]` = row `r` of the repacked group `group` dotted with column `cols[c]` packed by
/// `quant::quantize_q8_col` (all of the same block count `nb`; `group` holds at least
/// `nb` block indices). The same bits as `quant::dot_q4_0_q8_0_rows` on the plain rows.
pub(crate) fn dot_group<const NC: usize>(
    isa: Isa,
    group: &[u8],
    cols: [&[u8]; NC],
) -> [[f32; GROUP_ROWS]; NC] {
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        cols.iter().all(|c| c.len() == nb * (QK + 8)) && group.len() >= nb * GROUP_BLOCK_BYTES,
        "repack::dot_group: short group or column (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx512 if crate::quant::has_avx512() => {
            // SAFETY: the CPU has the features (checked in the guard); `group` holds `nb`
            // block indices and every column `nb` packed blocks (asserted above).
            unsafe { x86::dot_group_vnni(group, cols, nb) }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if crate::quant::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths as above.
            unsafe { x86::dot_group_avx2(group, cols, nb) }
        }
        _ => cols.map(|c| dot_group_scalar(group, c, nb)),
    }
}

/// [`dot_group`] for one column in portable code: per block the exact integer
/// `Σ nibble · q − 8 · Σ q`, the scale product rounded to f32, an FMA into the even- or
/// odd-block accumulator; the two added at the end (as `quant::dot_q4_0_col_scalar`).
fn dot_group_scalar(group: &[u8], col: &[u8], nb: usize) -> [f32; GROUP_ROWS] {
    let (qs, rest) = col.split_at(nb * QK);
    let (ds, cs) = rest.split_at(nb * 4);
    let word = |s: &[u8], b: usize| [s[4 * b], s[4 * b + 1], s[4 * b + 2], s[4 * b + 3]];
    let mut acc = [[0.0f32; GROUP_ROWS]; 2];
    for b in 0..nb {
        let blk = &group[b * GROUP_BLOCK_BYTES..(b + 1) * GROUP_BLOCK_BYTES];
        let q = &qs[b * QK..(b + 1) * QK];
        let dy = f32::from_le_bytes(word(ds, b));
        let c = i32::from_le_bytes(word(cs, b));
        for (r, a) in acc[b % 2].iter_mut().enumerate() {
            let dx = f16::from_bits(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]])).to_f32();
            let mut s = 0i32;
            for j in 0..QK / 2 {
                let x = blk[32 + 64 * (j / 4) + 4 * r + j % 4];
                s += i32::from(x & 0x0f) * i32::from(q[j] as i8);
                s += i32::from(x >> 4) * i32::from(q[j + QK / 2] as i8);
            }
            *a = (dx * dy).mul_add((s - c) as f32, *a);
        }
    }
    std::array::from_fn(|r| acc[0][r] + acc[1][r])
}

/// The f16 at index `i` of little-endian bytes `b`, as f32 (the portable kernels' scales).
fn half(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
}

/// The f32 at index `i` of little-endian bytes `b` (the packed columns' scales).
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// The kernels with intrinsics (see the module docs for the data flow).
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::{GROUP_BLOCK_BYTES, GROUP_ROWS, QK};
    use graph::ElementType;

    /// Sixteen rows' 16 bytes at `off` as four registers, register `c` holding dword `c` of
    /// row `r` in lane `r`: four rows to a register (row `4L + j` in 128-bit lane `L` of
    /// register `j`), then a 4 × 4 dword transpose within the lanes.
    ///
    /// # Safety
    /// 16 bytes at `off` must be readable in every row.
    #[inline]
    #[target_feature(enable = "avx2,avx512f")]
    unsafe fn transpose16x4(rows: &[&[u8]; GROUP_ROWS], off: usize) -> [__m512i; 4] {
        // SAFETY: 16 readable bytes at `off` in every row (caller's contract).
        let at = |r: usize| unsafe { _mm_loadu_si128(rows[r].as_ptr().add(off).cast()) };
        let mut z = [_mm512_setzero_si512(); 4];
        for (j, z) in z.iter_mut().enumerate() {
            let v = _mm512_castsi128_si512(at(j));
            let v = _mm512_inserti32x4::<1>(v, at(4 + j));
            let v = _mm512_inserti32x4::<2>(v, at(8 + j));
            *z = _mm512_inserti32x4::<3>(v, at(12 + j));
        }
        let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
        let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
        let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    }

    /// `super::pack_group` with the quant chunks transposed in registers ([`transpose16x4`]:
    /// sixteen 16-byte reads and one 64-byte write per four chunks) and the scales copied
    /// as words. A group of 4096-element rows took 1.33 µs against 2.59 (q4_0), 1.73 against
    /// 3.10 (q4_1) and 1.43 against 6.95 (q8_0) copying block by block in portable code (one
    /// thread, in cache, 2000 calls).
    ///
    /// # Safety
    /// The CPU has AVX-512F; every row holds `nb` blocks of `ty` (q4_0, q4_1 or q8_0) and
    /// `out` exactly a group of them.
    #[target_feature(enable = "avx2,avx512f")]
    pub(super) unsafe fn pack_group(
        ty: ElementType,
        nb: usize,
        rows: &[&[u8]; GROUP_ROWS],
        out: &mut [u8],
    ) {
        let rp = rows.map(<[u8]>::as_ptr);
        let dst = out.as_mut_ptr();
        let chunk = |at: usize, v: __m512i| {
            // SAFETY: `at + 64` stays inside `out` for every offset below (one group of `nb`
            // blocks, the caller's contract).
            unsafe { _mm512_storeu_si512(dst.add(at).cast(), v) }
        };
        let words = |at: usize, src: usize| {
            for (r, p) in rp.iter().enumerate() {
                // SAFETY: `at + 2 · GROUP_ROWS` stays inside `out` and `src + 2` inside block b
                // of every row for every offset below (the caller's contract).
                unsafe {
                    let w = p.add(src).cast::<u16>().read_unaligned();
                    dst.add(at + 2 * r).cast::<u16>().write_unaligned(w);
                }
            }
        };
        if ty == ElementType::Q8_0 {
            let block = super::q8_0::BLOCK_BYTES;
            let scales = nb * GROUP_ROWS * QK;
            for b in 0..nb {
                let off = b * block;
                for h in 0..2 {
                    // SAFETY: bytes `off + 2 + 16h .. + 16` lie inside block b of every row.
                    let q = unsafe { transpose16x4(rows, off + 2 + 16 * h) };
                    for (c, v) in q.into_iter().enumerate() {
                        chunk(b * GROUP_ROWS * QK + 64 * (4 * h + c), v);
                    }
                }
                words(scales + 2 * GROUP_ROWS * b, off);
            }
            return;
        }
        let Some(block) = super::block_bytes(ty) else {
            return;
        };
        // q4_0: the scale; q4_1: the scale and the minimum; then 16 quant bytes.
        let head = block - QK / 2;
        for b in 0..nb {
            let (off, base) = (b * block, b * GROUP_ROWS * block);
            // SAFETY: bytes `off + head .. off + block` (16) lie inside block b of every row.
            let q = unsafe { transpose16x4(rows, off + head) };
            for (c, v) in q.into_iter().enumerate() {
                chunk(base + GROUP_ROWS * head + 64 * c, v);
            }
            for h in 0..head / 2 {
                words(base + 2 * GROUP_ROWS * h, off + 2 * h);
            }
        }
    }

    /// How far ahead of the block being computed the group is prefetched, in bytes.
    /// Far enough for weights streamed from memory: with 4 block indices, a group larger than
    /// L3 (8192 × 16384, one thread, `benches/matvec.rs`) ran its fastest calls at 0.59–0.69 of
    /// the read ceiling, with 24 at 0.68–0.89 (noisy machine); in cache it cost at most 2 %.
    const PREFETCH: usize = 24 * GROUP_BLOCK_BYTES;

    /// Pointers to the parts of a packed column (`quant::quantize_q8_col`): `nb` blocks of
    /// quants, `nb` f32 scales, `nb` i32 corrections `8 · Σ q` (also read by `q4tiles`).
    #[derive(Copy, Clone)]
    pub(crate) struct Col {
        pub(crate) qs: *const u8,
        pub(crate) ds: *const f32,
        pub(crate) cs: *const i32,
    }

    pub(crate) fn col_parts(col: &[u8], nb: usize) -> Col {
        let base = col.as_ptr();
        Col {
            qs: base,
            ds: base.wrapping_add(nb * QK).cast(),
            cs: base.wrapping_add(nb * (QK + 4)).cast(),
        }
    }

    /// One block index `$b` of sixteen rows into the accumulators `$acc` (one per column).
    macro_rules! vnni_step {
        ($g:expr, $cols:expr, $b:expr, $acc:expr) => {{
            let b: usize = $b;
            // SAFETY: block index b < nb exists in the group and every column (caller's
            // contract); the prefetch address may lie past the end (prefetches never fault).
            unsafe {
                let p = $g.add(b * GROUP_BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 64).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 128).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 192).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 256).cast());
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
                let m4 = _mm512_set1_epi8(0x0f);
                let raw: [__m512i; 4] =
                    std::array::from_fn(|c| _mm512_loadu_si512(p.add(32 + 64 * c).cast()));
                let x: [__m512i; 8] = std::array::from_fn(|j| {
                    if j < 4 {
                        _mm512_and_si512(raw[j], m4)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(raw[j - 4]), m4)
                    }
                });
                for (acc, c) in $acc.iter_mut().zip(&$cols) {
                    let q = c.qs.add(QK * b);
                    let y =
                        |j: usize| _mm512_set1_epi32(q.add(4 * j).cast::<i32>().read_unaligned());
                    // Four chains of two (a low- and a high-nibble group each): with two
                    // chains of four the batched shapes ran measurably slower (latency).
                    let z = _mm512_setzero_si512();
                    let s: [__m512i; 4] = std::array::from_fn(|j| {
                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, x[j], y(j)), x[j + 4], y(j + 4))
                    });
                    let s = _mm512_sub_epi32(
                        _mm512_add_epi32(
                            _mm512_add_epi32(s[0], s[1]),
                            _mm512_add_epi32(s[2], s[3]),
                        ),
                        _mm512_set1_epi32(c.cs.add(b).read_unaligned()),
                    );
                    let d = _mm512_mul_ps(dx, _mm512_set1_ps(c.ds.add(b).read_unaligned()));
                    *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *acc);
                }
            }
        }};
    }

    /// [`super::dot_group`] with AVX-512 VNNI: sixteen rows in the sixteen lanes.
    ///
    /// # Safety
    /// The CPU must have the `has_avx512` features; `group` must hold `nb` block indices and
    /// every column `nb` packed blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_group_vnni<const NC: usize>(
        group: &[u8],
        cols: [&[u8]; NC],
        nb: usize,
    ) -> [[f32; GROUP_ROWS]; NC] {
        let g = group.as_ptr();
        let c = cols.map(|col| col_parts(col, nb));
        let mut even = [_mm512_setzero_ps(); NC];
        let mut odd = [_mm512_setzero_ps(); NC];
        let mut b = 0;
        while b + 2 <= nb {
            vnni_step!(g, c, b, even);
            vnni_step!(g, c, b + 1, odd);
            b += 2;
        }
        if b < nb {
            vnni_step!(g, c, b, even);
        }
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for ((o, e), d) in out.iter_mut().zip(even).zip(odd) {
            // SAFETY: `o` holds sixteen floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(e, d)) };
        }
        out
    }

    /// One block index `$b` of sixteen rows (two halves of eight) with AVX2 into `$acc`.
    /// `maddubs` sums pairs of products into i16; the eight `maddubs` of a block add up in
    /// i16 without overflow (each i16 lane then sums 16 products of at most 15 · 128 in
    /// magnitude: 30720 < 32767), then `madd` with ones gives the row's i32 in its lane.
    macro_rules! avx2_step {
        ($g:expr, $cols:expr, $b:expr, $acc:expr) => {{
            let b: usize = $b;
            // SAFETY: as in `vnni_step`.
            unsafe {
                let p = $g.add(b * GROUP_BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 64).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 128).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 192).cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 256).cast());
                let m4 = _mm256_set1_epi8(0x0f);
                let ones = _mm256_set1_epi16(1);
                for h in 0..2 {
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast()));
                    let raw: [__m256i; 4] = std::array::from_fn(|c| {
                        _mm256_loadu_si256(p.add(32 + 64 * c + 32 * h).cast())
                    });
                    let x: [__m256i; 8] = std::array::from_fn(|j| {
                        if j < 4 {
                            _mm256_and_si256(raw[j], m4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(raw[j - 4]), m4)
                        }
                    });
                    for (acc, c) in $acc.iter_mut().zip(&$cols) {
                        let q = c.qs.add(QK * b);
                        let y = |j: usize| {
                            _mm256_set1_epi32(q.add(4 * j).cast::<i32>().read_unaligned())
                        };
                        let mut s16 = _mm256_maddubs_epi16(x[0], y(0));
                        for j in 1..8 {
                            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(x[j], y(j)));
                        }
                        let s = _mm256_sub_epi32(
                            _mm256_madd_epi16(s16, ones),
                            _mm256_set1_epi32(c.cs.add(b).read_unaligned()),
                        );
                        let d = _mm256_mul_ps(dx, _mm256_set1_ps(c.ds.add(b).read_unaligned()));
                        acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[h]);
                    }
                }
            }
        }};
    }

    /// [`super::dot_group`] with AVX2: the sixteen rows as two vectors of eight lanes.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; lengths as for [`dot_group_vnni`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_group_avx2<const NC: usize>(
        group: &[u8],
        cols: [&[u8]; NC],
        nb: usize,
    ) -> [[f32; GROUP_ROWS]; NC] {
        let g = group.as_ptr();
        let c = cols.map(|col| col_parts(col, nb));
        let mut even = [[_mm256_setzero_ps(); 2]; NC];
        let mut odd = [[_mm256_setzero_ps(); 2]; NC];
        let mut b = 0;
        while b + 2 <= nb {
            avx2_step!(g, c, b, even);
            avx2_step!(g, c, b + 1, odd);
            b += 2;
        }
        if b < nb {
            avx2_step!(g, c, b, even);
        }
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for ((o, e), d) in out.iter_mut().zip(even).zip(odd) {
            for h in 0..2 {
                // SAFETY: `o` holds sixteen floats, eight from `8 · h`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), _mm256_add_ps(e[h], d[h])) };
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The block-copying packers (the dispatched one, with AVX-512 where the CPU has it, and
    /// the portable one) write what the run-mapping one does, for every type, with rows of
    /// one to seven blocks (two under Miri).
    #[test]
    fn pack_group_matches_pack() {
        for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
            // Under Miri (slow) one and two blocks.
            for nb in 1..=if cfg!(miri) { 2 } else { 7 } {
                let k = nb * QK;
                let row = block_bytes(ty).unwrap() * nb;
                let plain: Vec<u8> = (0..GROUP_ROWS * row)
                    .map(|i| (i * 37 % 251) as u8)
                    .collect();
                let mut want = vec![0u8; plain.len()];
                pack(ty, k, &plain, &mut want);
                let rows: [&[u8]; GROUP_ROWS] =
                    std::array::from_fn(|r| &plain[r * row..(r + 1) * row]);
                let mut got = vec![0u8; plain.len()];
                pack_group(ty, k, &rows, &mut got);
                assert_eq!(got, want, "{ty:?} nb={nb}");
                got.fill(0);
                pack_group_portable(ty, nb, &rows, &mut got);
                assert_eq!(got, want, "{ty:?} nb={nb}, portable");
            }
        }
    }

    /// Bytes of one plain q4_0 block.
    const BLOCK: usize = 18;
    use crate::quant::{self, ROWS};

    /// Deterministic bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// Plain q4_0 rows with finite scales in [2^-8, 2), random quants; extremes in block 0.
    pub(crate) fn plain_rows(seed: u64, k: usize, rows: usize) -> Vec<u8> {
        let mut v = bytes(seed, rows * k / QK * BLOCK);
        for (i, blk) in v.chunks_exact_mut(BLOCK).enumerate() {
            let e = 0x2000 | u16::from(blk[1] & 0x0f) << 10 | u16::from(blk[0]);
            let sign = if i % 3 == 0 { 0x8000 } else { 0 };
            blk[..2].copy_from_slice(&(e | sign).to_le_bytes());
        }
        let row = k / QK * BLOCK;
        v[2..BLOCK].fill(0xff);
        if rows > 1 {
            v[row + 2..row + BLOCK].fill(0);
        }
        v
    }

    pub(crate) fn column(seed: u64, k: usize) -> Vec<u8> {
        let xs: Vec<f32> = bytes(seed, k)
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if i < QK {
                    [1.0, -1.0][i % 2]
                } else {
                    f32::from(b as i8) / 37.0
                }
            })
            .collect();
        let mut col = vec![0u8; quant::q8_col_bytes(k)];
        quant::quantize_q8_col(&xs, &mut col);
        col
    }

    #[test]
    fn pack_is_a_permutation_and_unpack_inverts_it() {
        let shapes: &[(usize, usize)] = if cfg!(miri) {
            &[(64, 16)]
        } else {
            &[(32, 16), (64, 32), (96, 16)]
        };
        for &(k, rows) in shapes {
            let plain = plain_rows(3, k, rows);
            let mut packed = vec![0u8; plain.len()];
            pack(ElementType::Q4_0, k, &plain, &mut packed);
            let mut a = plain.clone();
            let mut b = packed.clone();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "k={k}");
            let mut back = vec![0u8; plain.len()];
            unpack(ElementType::Q4_0, k, &packed, &mut back);
            assert_eq!(back, plain, "k={k}");
            // Every packed byte is written exactly once.
            let mut hit = vec![0u8; plain.len()];
            segments(ElementType::Q4_0, k, 0..plain.len(), |_, q, n| {
                hit[q..q + n].iter_mut().for_each(|h| *h += 1)
            });
            assert!(hit.iter().all(|&h| h == 1));
        }
    }

    /// A sub-range maps to the same places as the whole.
    #[test]
    fn segments_of_a_range_agree_with_the_whole() {
        let k = 64;
        let n = 16 * 2 * BLOCK;
        let mut whole = vec![usize::MAX; n];
        segments(ElementType::Q4_0, k, 0..n, |p, q, len| {
            for i in 0..len {
                whole[p + i] = q + i;
            }
        });
        for (s, e) in [(0, 1), (1, 3), (5, 40), (37, 37), (100, n)] {
            let mut next = s;
            segments(ElementType::Q4_0, k, s..e, |p, q, len| {
                assert_eq!(p, next);
                for i in 0..len {
                    assert_eq!(q + i, whole[p + i]);
                }
                next = p + len;
            });
            assert_eq!(next, e.max(s));
        }
    }

    /// Every level gives the bits of the plain q4_0 kernel on the same rows, for any
    /// column count, and one column's result does not depend on the others.
    #[test]
    fn repacked_products_equal_the_plain_ones_bit_for_bit() {
        let nbs: &[usize] = if cfg!(miri) {
            &[1, 2]
        } else {
            &[1, 2, 3, 8, 128]
        };
        for &nb in nbs {
            let k = nb * QK;
            let plain = plain_rows(nb as u64, k, GROUP_ROWS);
            let mut packed = vec![0u8; plain.len()];
            pack(ElementType::Q4_0, k, &plain, &mut packed);
            let cols: Vec<Vec<u8>> = (0..4).map(|c| column(c + 10, k)).collect();
            let row = |r: usize| &plain[r * nb * BLOCK..(r + 1) * nb * BLOCK];
            let mut want = [[0u32; GROUP_ROWS]; 4];
            for (c, col) in cols.iter().enumerate() {
                for h in 0..GROUP_ROWS / ROWS {
                    let rws: [&[u8]; ROWS] = std::array::from_fn(|j| row(h * ROWS + j));
                    let [d] = quant::dot_q4_0_q8_0_rows(Isa::Scalar, rws, [&col[..]]);
                    for j in 0..ROWS {
                        want[c][h * ROWS + j] = d[j].to_bits();
                    }
                }
            }
            for isa in Isa::available() {
                let four = dot_group(isa, &packed, [&cols[0][..], &cols[1], &cols[2], &cols[3]]);
                for c in 0..4 {
                    assert_eq!(
                        four[c].map(f32::to_bits),
                        want[c],
                        "{isa:?} nb={nb} col {c}"
                    );
                    let [one] = dot_group(isa, &packed, [&cols[c][..]]);
                    assert_eq!(one.map(f32::to_bits), want[c], "{isa:?} nb={nb} col {c}");
                }
            }
        }
    }
}
