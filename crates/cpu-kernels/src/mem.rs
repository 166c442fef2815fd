//! Raw access to tensor memory: the only module that turns a tensor's storage into pointers.
//!
//! Why one module: every kernel needs to read and write bytes that live in backend buffers,
//! which Rust cannot describe with borrowed slices (the buffer is shared through `Arc`s, views
//! alias their roots, and in-place ops write the bytes they read). Keeping the pointer
//! arithmetic here lets the kernels stay safe code over `&[f32]` scratch rows, and keeps every
//! `unsafe` block next to the check that justifies it.
//!
//! The invariant the executor upholds (and every `SAFETY` comment below relies on): while one
//! op runs, each destination element is written by exactly one thread, and bytes that a thread
//! writes are read, if at all, only by that same thread (in-place ops read a row before writing
//! it back). Slices over tensor memory ([`TView::row_bytes`], [`TView::f32_row`]) are only
//! created for sources whose byte span does not overlap the destination's ([`TView::overlaps`]
//! is checked by the executor first).

use std::ptr::NonNull;

use backend_core::{BackendError, Buffer};
use graph::{Context, ElementType, MAX_DIMS, TensorId};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements converted per stack chunk when loading or storing half-precision data.
const CHUNK: usize = 256;

/// `out[i] = f32(bits[i])` for the f16 values `bits` (exact): eight at a time with F16C
/// where the CPU has it (the attention's f16 KV-cache rows go through here on every decode
/// step; `half`'s slice conversion makes one out-of-line call per eight values).
fn f16_to_f32(bits: &[u16], out: &mut [f32]) {
    let n = bits.len().min(out.len());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has F16C and AVX (checked just above).
        unsafe { f16_to_f32_f16c(&bits[..n], &mut out[..n]) };
        return;
    }
    let h: &[f16] = half::slice::HalfBitsSliceExt::reinterpret_cast(&bits[..n]);
    h.convert_to_f32_slice(&mut out[..n]);
}

/// [`f16_to_f32`] with F16C; `bits` and `out` have the same length.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_to_f32_f16c(bits: &[u16], out: &mut [f32]) {
    use std::arch::x86_64::{_mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let mut o = out.chunks_exact_mut(8);
    let mut b = bits.chunks_exact(8);
    for (o, b) in (&mut o).zip(&mut b) {
        // SAFETY: `b` holds eight u16 (16 bytes) and `o` eight f32 (32 bytes); both
        // accesses are unaligned ones.
        unsafe {
            _mm256_storeu_ps(
                o.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())),
            )
        };
    }
    for (o, &b) in o.into_remainder().iter_mut().zip(b.remainder()) {
        *o = f16::from_bits(b).to_f32();
    }
}

/// `bits[i] = f16(data[i])`, rounded to nearest even: eight at a time with F16C where the
/// CPU has it, the rest one by one (a decode step stores its V-cache column one element per
/// row, where `half`'s slice conversion paid for a chunked copy each time).
fn f32_to_f16(data: &[f32], bits: &mut [u16]) {
    let n = bits.len().min(data.len());
    let (data, bits) = (&data[..n], &mut bits[..n]);
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    let done = if n >= 8
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("avx")
    {
        // SAFETY: the CPU has F16C and AVX (checked just above).
        unsafe { f32_to_f16_f16c(data, bits) }
    } else {
        0
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let done = 0;
    for (b, &v) in bits[done..].iter_mut().zip(&data[done..]) {
        *b = f16::from_f32(v).to_bits();
    }
}

/// [`f32_to_f16`] with F16C for the leading multiple of eight; returns how many it did.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx,f16c")]
unsafe fn f32_to_f16_f16c(data: &[f32], bits: &mut [u16]) -> usize {
    use std::arch::x86_64::{
        _MM_FROUND_TO_NEAREST_INT, _mm_storeu_si128, _mm256_cvtps_ph, _mm256_loadu_ps,
    };
    let mut done = 0;
    for (b, d) in bits.chunks_exact_mut(8).zip(data.chunks_exact(8)) {
        // SAFETY: `d` holds eight f32 (32 bytes) and `b` eight u16 (16 bytes); both
        // accesses are unaligned ones.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(d.as_ptr()));
            _mm_storeu_si128(b.as_mut_ptr().cast(), h);
        }
        done += 8;
    }
    done
}

/// A resolved tensor: base pointer, span, type, extents and byte strides.
#[derive(Copy, Clone, Debug)]
pub(crate) struct TView {
    ptr: NonNull<u8>,
    /// Bytes from `ptr` that belong to the tensor (`nbytes`), all inside its buffer.
    len: usize,
    pub ty: ElementType,
    pub ne: [usize; MAX_DIMS],
    pub nb: [usize; MAX_DIMS],
}

// SAFETY: a TView is a pointer into a host buffer that outlives the compute call (the context,
// borrowed for the whole call, holds the buffer's Arc through the tensor's storage). Threads
// share it only under the executor's one-writer-per-element rule described in the module docs.
unsafe impl Send for TView {}
// SAFETY: as above.
unsafe impl Sync for TView {}

/// The pointer and size behind a tensor's storage, checked: the buffer's host pointer, or,
/// when the compute has a [`MemoryResolver`](crate::MemoryResolver), the pointer it gives
/// (then it is asked for every buffer, host or not, and decides alone what is addressable).
///
/// Returns the pointer to the tensor's first byte and the buffer bytes available from there.
pub(crate) fn storage_ptr(
    ctx: &Context,
    id: TensorId,
    resolver: Option<&dyn crate::MemoryResolver>,
) -> Result<(NonNull<u8>, usize), BackendError> {
    let t = ctx.get(id)?;
    let st = t.storage().ok_or(BackendError::NotAllocated(id))?;
    let buf = Buffer::from_storage(st).ok_or_else(|| {
        BackendError::failed(
            "CPU",
            format!("tensor {id:?} lives in a foreign storage type"),
        )
    })?;
    let base = match resolver {
        Some(r) => r.base_ptr(&buf),
        // A repack buffer has no host pointer (generic copies must not move its bytes raw);
        // the kernels read its layout themselves.
        None => buf
            .host_ptr()
            .or_else(|| crate::repack::RepackBuffer::of(&buf).and_then(|r| r.data_ptr())),
    }
    .ok_or_else(|| {
        BackendError::failed(
            "CPU",
            format!(
                "tensor {id:?} is not in memory this compute can address ({})",
                buf.name()
            ),
        )
    })?;
    let nbytes = t.nbytes();
    if st
        .offset
        .checked_add(nbytes)
        .is_none_or(|end| end > buf.size())
    {
        return Err(BackendError::out_of_bounds(
            "cpu compute",
            st.offset,
            nbytes,
            buf.size(),
        ));
    }
    // SAFETY: `st.offset <= buf.size()` (checked above) and the base pointer is valid for the
    // buffer's size (host pointers by `BufferImpl`'s contract, resolved ones by
    // `MemoryResolver`'s), so the offset stays inside (or one past) the same allocation.
    let p = unsafe { base.as_ptr().add(st.offset) };
    // `p` is non-null: it is derived in bounds from a non-null allocation pointer.
    let p = NonNull::new(p).ok_or_else(|| BackendError::failed("CPU", "null tensor pointer"))?;
    Ok((p, buf.size() - st.offset))
}

impl TView {
    /// Resolve tensor `id` of `ctx`: it must be allocated in host memory (or memory
    /// `resolver` addresses), inside its buffer.
    pub fn resolve(
        ctx: &Context,
        id: TensorId,
        resolver: Option<&dyn crate::MemoryResolver>,
    ) -> Result<TView, BackendError> {
        let (ptr, _avail) = storage_ptr(ctx, id, resolver)?;
        let t = &ctx[id];
        let ne = t.ne().map(|n| n as usize);
        Ok(TView {
            ptr,
            len: t.nbytes(),
            ty: t.ty(),
            ne,
            nb: t.nb(),
        })
    }

    /// Number of rows (`ne1 * ne2 * ne3`).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Whether the byte spans of `self` and `other` intersect.
    pub fn overlaps(&self, other: &TView) -> bool {
        let a = self.ptr.as_ptr() as usize;
        let b = other.ptr.as_ptr() as usize;
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }

    /// Whether rows are stored densely (`nb0` is the element or block size).
    #[inline]
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.ty.type_size() || self.ne[0] == self.ty.block_size()
    }

    /// Byte offset of element `i0` (a block index times block size for quantized types) of row
    /// `(i1, i2, i3)`, after checking that `n` elements from there fit inside the tensor.
    #[inline]
    fn offset_checked(&self, i0: usize, i1: usize, i2: usize, i3: usize, n: usize) -> usize {
        assert!(
            i1 < self.ne[1] && i2 < self.ne[2] && i3 < self.ne[3] && i0 + n <= self.ne[0],
            "row access outside tensor extents (a kernel bug)"
        );
        // No overflow below: with every index inside its extent (asserted above), each term
        // `i * nb` is at most `(ne - 1) * nb`, and their sum at most the tensor's byte extent,
        // which the graph's constructors check fits in `usize` (`graph::checked_nbytes`) and
        // `storage_ptr` checked lies in the buffer. The asserts are the kernels' contract
        // (shapes are validated by `supports_op` before a kernel runs): one firing is a bug.
        // Plain types (block size 1) skip the divisions: this runs once per row of every
        // kernel, and a decode step touches some 10^5 rows.
        let bs = self.ty.block_size();
        let blocks = |i: usize| if bs == 1 { i } else { i / bs };
        let off = blocks(i0) * self.nb[0] + i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3];
        if n > 0 {
            let last = off + blocks(n - 1) * self.nb[0] + self.ty.type_size();
            assert!(
                last <= self.len,
                "row access outside tensor bytes (a kernel bug)"
            );
        }
        off
    }

    /// Pointer to byte `off`, which `offset_checked` proved to lie inside the tensor.
    #[inline]
    fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: every caller passes an offset validated by offset_checked, which is inside
        // the tensor's span, which is inside its buffer (checked in storage_ptr).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// Load `out.len()` elements of row `(i1, i2, i3)` from element `i0`, converted to f32.
    /// Types: F32, F16, BF16, I32 (converted by value).
    pub fn load_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
        let n = out.len();
        let off = self.offset_checked(i0, i1, i2, i3, n);
        let p = self.at(off);
        let s = self.nb[0];
        match self.ty {
            ElementType::F32 if s == 4 => {
                // SAFETY: `n * 4` bytes from `p` are inside the tensor (offset_checked); `out`
                // is our own scratch, so the ranges cannot overlap. Other threads do not write
                // these bytes during this op (module invariant).
                unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr().cast::<u8>(), n * 4) }
            }
            ElementType::F32 => {
                for (k, o) in out.iter_mut().enumerate() {
                    // SAFETY: element k is inside the tensor (offset_checked covered `n`
                    // strided elements); unaligned reads are allowed.
                    *o = unsafe { p.add(k * s).cast::<f32>().read_unaligned() };
                }
            }
            ElementType::I32 => {
                for (k, o) in out.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *o = unsafe { p.add(k * s).cast::<i32>().read_unaligned() } as f32;
                }
            }
            ElementType::F16 | ElementType::BF16 if s == 2 && (p as usize).is_multiple_of(2) => {
                // SAFETY: `n * 2` bytes from `p` are inside the tensor (offset_checked), `p` is
                // aligned for u16 (checked just above) and any bits are a valid u16; other
                // threads do not write these bytes during this op (module invariant).
                let bits: &[u16] = unsafe { std::slice::from_raw_parts(p.cast::<u16>(), n) };
                if self.ty == ElementType::F16 {
                    f16_to_f32(bits, out);
                } else {
                    let h: &[bf16] = half::slice::HalfBitsSliceExt::reinterpret_cast(bits);
                    h.convert_to_f32_slice(out);
                }
            }
            ElementType::F16 | ElementType::BF16 => {
                let mut bits = [0u16; CHUNK];
                for (c, chunk) in out.chunks_mut(CHUNK).enumerate() {
                    let m = chunk.len();
                    let base = c * CHUNK;
                    if s == 2 {
                        // SAFETY: `m * 2` bytes from element `base` are inside the tensor;
                        // `bits` is a local array of at least `m` u16s.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                p.add(base * 2),
                                bits.as_mut_ptr().cast::<u8>(),
                                m * 2,
                            )
                        }
                    } else {
                        for (k, b) in bits[..m].iter_mut().enumerate() {
                            // SAFETY: element base + k is inside the tensor.
                            *b = unsafe { p.add((base + k) * s).cast::<u16>().read_unaligned() };
                        }
                    }
                    if self.ty == ElementType::F16 {
                        f16_to_f32(&bits[..m], chunk);
                    } else {
                        let h: &[bf16] =
                            half::slice::HalfBitsSliceExt::reinterpret_cast(&bits[..m]);
                        h.convert_to_f32_slice(chunk);
                    }
                }
            }
            _ => unreachable!(
                "load_f32 on {} (supports_op lets no such node through)",
                self.ty
            ),
        }
    }

    /// Store `data` into row `(i1, i2, i3)` from element `i0`, converting from f32.
    /// Types: F32, F16, BF16 (round to nearest even).
    pub fn store_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize, data: &[f32]) {
        let n = data.len();
        let off = self.offset_checked(i0, i1, i2, i3, n);
        let p = self.at(off);
        let s = self.nb[0];
        match self.ty {
            ElementType::F32 if s == 4 => {
                // SAFETY: `n * 4` bytes from `p` are inside the tensor, written only by this
                // thread during this op (module invariant); `data` is our scratch (no overlap).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), p, n * 4) }
            }
            ElementType::F32 => {
                for (k, &v) in data.iter().enumerate() {
                    // SAFETY: element k is inside the tensor and owned by this thread.
                    unsafe { p.add(k * s).cast::<f32>().write_unaligned(v) }
                }
            }
            ElementType::F16 | ElementType::BF16 => {
                let mut bits = [0u16; CHUNK];
                for (c, chunk) in data.chunks(CHUNK).enumerate() {
                    let m = chunk.len();
                    let base = c * CHUNK;
                    if self.ty == ElementType::F16 {
                        f32_to_f16(chunk, &mut bits[..m]);
                    } else {
                        let h: &mut [bf16] =
                            half::slice::HalfBitsSliceExt::reinterpret_cast_mut(&mut bits[..m]);
                        h.convert_from_f32_slice(chunk);
                    }
                    if s == 2 {
                        // SAFETY: `m * 2` bytes from element `base` are inside the tensor and
                        // owned by this thread; `bits` is a local array.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                bits.as_ptr().cast::<u8>(),
                                p.add(base * 2),
                                m * 2,
                            )
                        }
                    } else {
                        for (k, &b) in bits[..m].iter().enumerate() {
                            // SAFETY: element base + k is inside the tensor, owned by us.
                            unsafe { p.add((base + k) * s).cast::<u16>().write_unaligned(b) }
                        }
                    }
                }
            }
            _ => unreachable!(
                "store_f32 on {} (supports_op lets no such node through)",
                self.ty
            ),
        }
    }

    /// Copy `n` elements bit for bit from `src` (same element size, not quantized) starting at
    /// element `s` = `[i0, i1, i2, i3]` into `self` starting at `d`.
    pub fn copy_raw_from(&self, d: [usize; 4], src: &TView, s: [usize; 4], n: usize) {
        let es = self.ty.type_size();
        debug_assert_eq!(es, src.ty.type_size());
        let doff = self.offset_checked(d[0], d[1], d[2], d[3], n);
        let soff = src.offset_checked(s[0], s[1], s[2], s[3], n);
        let (dp, sp) = (self.at(doff), src.at(soff));
        if self.nb[0] == es && src.nb[0] == es {
            // SAFETY: both ranges of `n * es` bytes are inside their tensors; `copy` allows
            // overlap (an in-place copy); the destination bytes are owned by this thread.
            unsafe { std::ptr::copy(sp, dp, n * es) }
        } else {
            for k in 0..n {
                // SAFETY: element k of each side is inside its tensor (offset_checked covered
                // `n` strided elements); the destination element is owned by this thread.
                unsafe { std::ptr::copy(sp.add(k * src.nb[0]), dp.add(k * self.nb[0]), es) }
            }
        }
    }

    /// Read one i32 element.
    pub fn read_i32(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> i32 {
        debug_assert_eq!(self.ty, ElementType::I32);
        let off = self.offset_checked(i0, i1, i2, i3, 1);
        // SAFETY: the element is inside the tensor; unaligned reads are allowed.
        unsafe { self.at(off).cast::<i32>().read_unaligned() }
    }

    /// The bytes of dense row `(i1, i2, i3)`. Only for sources that do not overlap the
    /// destination of the running op (checked by the executor), so nobody writes them while
    /// the slice lives.
    #[inline]
    pub fn row_bytes(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        assert!(
            self.rows_contiguous(),
            "row_bytes on a strided row (a kernel bug)"
        );
        let n = self.ne[0];
        let off = self.offset_checked(0, i1, i2, i3, n);
        let len = self.ty.row_size(n);
        // SAFETY: the row's `len` bytes are inside the tensor (offset_checked with dense
        // rows); the memory is not written during the op (the executor checked that this
        // source does not overlap the destination), and lives as long as `self`'s buffer.
        unsafe { std::slice::from_raw_parts(self.at(off), len) }
    }

    /// The bytes of the `count` consecutive dense rows `i1 .. i1 + count` of matrix
    /// `(i2, i3)`, from the first row's start to the last row's end (row `i1 + j` starts at
    /// `j · nb[1]` and is `ty.row_size(ne[0])` bytes long); one bounds check for all of
    /// them. Same rule as [`TView::row_bytes`].
    pub fn rows_bytes(&self, i1: usize, count: usize, i2: usize, i3: usize) -> &[u8] {
        assert!(
            self.rows_contiguous() && count > 0 && i1 + count <= self.ne[1],
            "rows_bytes outside the tensor or on strided rows (a kernel bug)"
        );
        let n = self.ne[0];
        let first = self.offset_checked(0, i1, i2, i3, n);
        let last = self.offset_checked(0, i1 + count - 1, i2, i3, n);
        let len = last - first + self.ty.row_size(n);
        // SAFETY: both the first and the last row lie inside the tensor (offset_checked), and
        // rows in between lie between them (`nb[1] >= 0`, offsets grow with `i1`); otherwise
        // as in row_bytes.
        unsafe { std::slice::from_raw_parts(self.at(first), len) }
    }

    /// Row `(i1, i2, i3)` as f32s when the tensor is F32 with dense, aligned rows. Same rule
    /// as [`TView::row_bytes`].
    pub fn f32_row(&self, i1: usize, i2: usize, i3: usize) -> Option<&[f32]> {
        if self.ty != ElementType::F32 || !self.rows_contiguous() {
            return None;
        }
        let n = self.ne[0];
        let off = self.offset_checked(0, i1, i2, i3, n);
        let p = self.at(off);
        if !(p as usize).is_multiple_of(std::mem::align_of::<f32>()) {
            return None;
        }
        // SAFETY: as in row_bytes; in addition `p` is aligned for f32.
        Some(unsafe { std::slice::from_raw_parts(p.cast::<f32>(), n) })
    }

    /// Whether `self` and `other` describe the very same elements: same start, type,
    /// extents and strides (an in-place op's result and its source).
    pub fn same_elements(&self, other: &TView) -> bool {
        self.ptr == other.ptr && self.ty == other.ty && self.ne == other.ne && self.nb == other.nb
    }

    /// Elements `i0 .. i0 + n` of row `(i1, i2, i3)` of a dense, aligned F32 tensor as a
    /// slice; `None` otherwise. Same rule as [`TView::row_bytes`]: only for sources that do
    /// not overlap the destination of the running op.
    pub fn f32_span(&self, i0: usize, i1: usize, i2: usize, i3: usize, n: usize) -> Option<&[f32]> {
        let p = self.f32_span_ptr(i0, i1, i2, i3, n)?;
        // SAFETY: `n` floats from `p` are inside the tensor and aligned (f32_span_ptr); the
        // memory is not written during the op (the caller's rule above).
        Some(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// [`TView::f32_span`] for writing: the elements of the running op's destination that
    /// this unit of work owns.
    ///
    /// # Safety
    /// While the slice lives, no other reference to these elements may exist and no other
    /// thread may access them (the executor hands each destination element to one unit, and
    /// the caller reads an in-place source only through this slice).
    #[allow(clippy::mut_from_ref)] // tensor memory, not `self`: exclusivity is the contract
    pub unsafe fn f32_span_mut(
        &self,
        i0: usize,
        i1: usize,
        i2: usize,
        i3: usize,
        n: usize,
    ) -> Option<&mut [f32]> {
        let p = self.f32_span_ptr(i0, i1, i2, i3, n)?;
        // SAFETY: in bounds and aligned (f32_span_ptr); exclusive by the caller's contract.
        Some(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }

    fn f32_span_ptr(
        &self,
        i0: usize,
        i1: usize,
        i2: usize,
        i3: usize,
        n: usize,
    ) -> Option<*mut f32> {
        if self.ty != ElementType::F32 || self.nb[0] != 4 {
            return None;
        }
        let off = self.offset_checked(i0, i1, i2, i3, n);
        let p = self.at(off);
        (p as usize)
            .is_multiple_of(std::mem::align_of::<f32>())
            .then_some(p.cast::<f32>())
    }

    /// Write `bytes` over dense row `(i1, i2, i3)` (quantized destinations).
    pub fn store_row_bytes(&self, i1: usize, i2: usize, i3: usize, bytes: &[u8]) {
        assert!(
            self.rows_contiguous(),
            "store_row_bytes on a strided row (a kernel bug)"
        );
        let n = self.ne[0];
        let off = self.offset_checked(0, i1, i2, i3, n);
        assert_eq!(bytes.len(), self.ty.row_size(n));
        // SAFETY: the row is inside the tensor and owned by this thread; `bytes` is our
        // scratch, not tensor memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at(off), bytes.len()) }
    }

    /// Matrix `(i2, i3)` of an F32 tensor as a gemm operand, with rows of dimension 1 and
    /// columns of dimension 0 when `transposed` is false. `None` when strides are not whole
    /// f32s or the base is misaligned.
    pub fn f32_matrix(&self, i2: usize, i3: usize) -> Option<MatF32> {
        if self.ty != ElementType::F32
            || !self.nb.iter().all(|b| b.is_multiple_of(4))
            || !(self.ptr.as_ptr() as usize).is_multiple_of(4)
        {
            return None;
        }
        let off = self.offset_checked(0, 0, i2, i3, 0);
        Some(MatF32 {
            ptr: self.at(off),
            s0: self.nb[0] / 4,
            s1: self.nb[1] / 4,
            n0: self.ne[0],
            n1: self.ne[1],
        })
    }
}

/// A strided f32 matrix inside tensor memory or scratch: element `(i0, i1)` (i0 along the
/// fast dimension) at `ptr + i0 * s0 + i1 * s1` floats.
#[derive(Copy, Clone, Debug)]
pub(crate) struct MatF32 {
    ptr: *mut u8,
    s0: usize,
    s1: usize,
    n0: usize,
    n1: usize,
}

impl MatF32 {
    /// A dense matrix over a scratch slice: `n1` rows of `n0` floats.
    pub fn from_slice(s: &[f32], n0: usize, n1: usize) -> MatF32 {
        assert!(s.len() >= n0 * n1);
        MatF32 {
            ptr: s.as_ptr().cast_mut().cast::<u8>(),
            s0: 1,
            s1: n0,
            n0,
            n1,
        }
    }
}

impl MatF32 {
    /// A dense matrix over a mutable scratch slice (a destination in unit tests).
    #[cfg(test)]
    pub fn from_mut_slice(s: &mut [f32], n0: usize, n1: usize) -> MatF32 {
        assert!(s.len() >= n0 * n1);
        MatF32 {
            ptr: s.as_mut_ptr().cast::<u8>(),
            s0: 1,
            s1: n0,
            n0,
            n1,
        }
    }

    /// Extents: `(n0, n1)` (elements along the fast dimension, lines).
    pub fn dims(&self) -> (usize, usize) {
        (self.n0, self.n1)
    }

    /// Elements `r` of line `i1` as a slice, when they are adjacent in memory (`s0 == 1`).
    pub fn line(&self, i1: usize, r: std::ops::Range<usize>) -> Option<&[f32]> {
        assert!(
            i1 < self.n1 && r.start <= r.end && r.end <= self.n0,
            "matrix line out of range (a kernel bug)"
        );
        if self.s0 != 1 {
            return None;
        }
        // SAFETY: the elements lie inside the matrix (asserted), which lies inside live tensor
        // or scratch memory for the whole compute; the pointer is f32-aligned (`f32_matrix`
        // checks the base and strides, scratch slices are f32). Lines handed out here are
        // sources, which the executor has checked do not overlap the destination.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.ptr
                    .cast::<f32>()
                    .add(i1 * self.s1 + r.start)
                    .cast_const(),
                r.len(),
            )
        })
    }

    /// The address of elements `r` of line `i1`, when they are adjacent in memory
    /// (`s0 == 1`): for a kernel that reads and writes its destination in place (which is
    /// `unsafe` there, under the same contract as [`MatF32::store_line`]).
    pub fn line_ptr(&self, i1: usize, r: std::ops::Range<usize>) -> Option<*mut f32> {
        assert!(
            i1 < self.n1 && r.start <= r.end && r.end <= self.n0,
            "matrix line out of range (a kernel bug)"
        );
        (self.s0 == 1).then(|| self.ptr.cast::<f32>().wrapping_add(i1 * self.s1 + r.start))
    }

    /// Element `(i0, i1)`.
    pub fn get(&self, i0: usize, i1: usize) -> f32 {
        assert!(
            i0 < self.n0 && i1 < self.n1,
            "matrix element out of range (a kernel bug)"
        );
        // SAFETY: inside the matrix (asserted), aligned as for `line`.
        unsafe {
            self.ptr
                .cast::<f32>()
                .add(i0 * self.s0 + i1 * self.s1)
                .read()
        }
    }

    /// Copy `v` over elements `i0.. i0 + v.len()` of line `i1` of a destination matrix.
    ///
    /// # Safety
    /// The running op's unit of work owns these destination elements: no other thread reads
    /// or writes them during the op.
    pub unsafe fn store_line(&self, i0: usize, i1: usize, v: &[f32]) {
        assert!(
            i1 < self.n1 && i0 + v.len() <= self.n0,
            "matrix line out of range (a kernel bug)"
        );
        let p = self.ptr.cast::<f32>();
        if self.s0 == 1 {
            // SAFETY: as below, for the adjacent elements `i0..i0 + v.len()` of line `i1`;
            // `v` is the caller's scratch, not tensor memory.
            return unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(i1 * self.s1 + i0), v.len())
            };
        }
        for (d, &x) in v.iter().enumerate() {
            // SAFETY: inside the matrix (asserted), aligned as for `line`; owned by the
            // caller's unit (the function's contract).
            unsafe { p.add((i0 + d) * self.s0 + i1 * self.s1).write(x) }
        }
    }
}

/// `dst[i, j] = Σ_k a[k, i] · b[k, j]` over `i in i_range`, `j in 0..b.n1`, with `gemm`.
///
/// `a`: rows `i` of `k` floats (the weights, `n0 = K`); `b`: columns `j` of `K` floats;
/// `dst`: element `(i, j)` at dimension 0 = `i`, dimension 1 = `j`. `a` may be a slice
/// covering only `i_range` (then `a_row0` is its first row's index).
pub(crate) fn gemm_f32(
    dst: MatF32,
    a: MatF32,
    a_row0: usize,
    b: MatF32,
    i_range: std::ops::Range<usize>,
) {
    let k = a.n0;
    assert_eq!(b.n0, k, "gemm: inner dimensions differ (a kernel bug)");
    assert!(
        i_range.end <= dst.n0 && b.n1 <= dst.n1,
        "gemm: result too small (a kernel bug)"
    );
    assert!(
        i_range.start >= a_row0 && i_range.end - a_row0 <= a.n1,
        "gemm: rows outside a"
    );
    let m = i_range.len();
    let n = b.n1;
    if m == 0 || n == 0 {
        return;
    }
    let fl = |mat: &MatF32, i0: usize, i1: usize| -> *mut f32 {
        // SAFETY: (i0, i1) lies inside the matrix (asserted above for the corners passed
        // here), so the offset stays inside the tensor or scratch slice it describes.
        unsafe { mat.ptr.cast::<f32>().add(i0 * mat.s0 + i1 * mat.s1) }
    };
    let dst_p = fl(&dst, i_range.start, 0);
    let a_p = fl(&a, 0, i_range.start - a_row0);
    // gemm's view: dst is m×n with (row i, col j); lhs is m×k (row i, col kk); rhs k×n.
    // SAFETY: all three matrices lie inside live memory for the index ranges gemm visits
    // (m rows from i_range.start, n columns, k inner) as asserted above; dst's rows in
    // i_range are written only by this thread; a and b are sources that do not overlap dst
    // (checked by the executor) or our own scratch.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst_p,
            dst.s1 as isize,
            dst.s0 as isize,
            false,
            a_p.cast_const(),
            a.s0 as isize,
            a.s1 as isize,
            b.ptr.cast::<f32>().cast_const(),
            b.s1 as isize,
            b.s0 as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice conversions give `half`'s scalar conversions' bits for every length (the
    /// F16C part and the element-by-element rest), ties, subnormals, infinities and NaN.
    #[test]
    fn half_slice_conversions_match_scalar_ones() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            65520.0,
            1e-8,
            -6e-8,
            3e-5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(0x3f80_1000), // a tie at f16 precision
            f32::from_bits(0x3f80_3000),
            f32::MAX,
        ];
        vals.extend((0..40).map(|i| (i as f32 - 17.3) * 0.731));
        for n in 0..vals.len() {
            let mut bits = vec![0u16; n];
            f32_to_f16(&vals[..n], &mut bits);
            for (b, &v) in bits.iter().zip(&vals) {
                assert_eq!(*b, f16::from_f32(v).to_bits(), "{v}");
            }
            let mut back = vec![0.0f32; n];
            f16_to_f32(&bits, &mut back);
            for (x, &b) in back.iter().zip(&bits) {
                assert_eq!(x.to_bits(), f16::from_bits(b).to_f32().to_bits());
            }
        }
        let mut nan = [0u16; 9];
        f32_to_f16(&[f32::NAN; 9], &mut nan);
        assert!(nan.iter().all(|&b| f16::from_bits(b).is_nan()));
        let mut back = [0.0f32; 9];
        f16_to_f32(&nan, &mut back);
        assert!(back.iter().all(|x| x.is_nan()));
    }
}
