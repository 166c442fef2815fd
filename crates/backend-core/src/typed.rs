//! Typed tensor I/O: [`tensor_set_slice`] and [`tensor_get_vec`], the element-typed forms of
//! [`crate::tensor_set`] and [`crate::tensor_get`].
//!
//! Why beside the byte functions and not instead of them: the byte forms are what backends and
//! the scheduler move (block-quantized data has no per-element Rust type, partial ranges are
//! byte ranges), while callers that fill an input or read a result hold a `&[f32]` or want a
//! `Vec<f32>`. Converting by hand repeats `to_le_bytes` loops and, worse, silently accepts an
//! `f32` slice written into an F16 tensor. These functions check the Rust type against the
//! tensor's [`ElementType`] and the slice length against the element count before any byte
//! moves, and report a mismatch as a [`TensorIoError`]; a failed call changes nothing.
//!
//! Tensor bytes are little-endian, as in GGUF files and in every kernel of this workspace, so
//! the conversion is `to_le_bytes` / `from_le_bytes` per element: no `unsafe`, no alignment
//! requirement on the caller's slice.

use graph::{Context, ElementType, TensorId};

use crate::error::BackendError;
use crate::tensor::{tensor_get, tensor_set};

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element type of some [`ElementType`]: `f32` ↔ F32, `f64` ↔ F64,
/// [`half::f16`] ↔ F16, [`half::bf16`] ↔ BF16, `i8` ↔ I8, `i16` ↔ I16, `i32` ↔ I32,
/// `i64` ↔ I64. Block-quantized types have no per-element Rust type and use the byte
/// functions.
///
/// Sealed: the mapping is fixed by the tensor formats, not open to extension.
pub trait TensorElement: Copy + sealed::Sealed {
    /// The tensor element type this Rust type reads and writes.
    const ELEMENT_TYPE: ElementType;
    /// Bytes per element (equal to `ELEMENT_TYPE.type_size()`).
    const SIZE: usize;
    /// Append the element's little-endian bytes to `out`.
    fn put_le(self, out: &mut Vec<u8>);
    /// The element from exactly [`Self::SIZE`] little-endian bytes.
    fn get_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $et:ident, $n:literal) => {
        impl sealed::Sealed for $t {}
        impl TensorElement for $t {
            const ELEMENT_TYPE: ElementType = ElementType::$et;
            const SIZE: usize = $n;
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
        }
    };
}

element!(f32, F32, 4);
element!(f64, F64, 8);
element!(half::f16, F16, 2);
element!(half::bf16, BF16, 2);
element!(i8, I8, 1);
element!(i16, I16, 2);
element!(i32, I32, 4);
element!(i64, I64, 8);

/// Why a typed read or write was refused. Nothing was written when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorIoError {
    /// The Rust element type does not match the tensor's element type.
    #[error("tensor {tensor:?} holds {tensor_type:?}, not {requested:?}")]
    TypeMismatch {
        /// The tensor.
        tensor: TensorId,
        /// Its element type.
        tensor_type: ElementType,
        /// The element type of the Rust type asked for.
        requested: ElementType,
    },
    /// The slice length is not the tensor's element count.
    #[error("tensor {tensor:?} has {expected} elements, the slice has {got}")]
    LengthMismatch {
        /// The tensor.
        tensor: TensorId,
        /// The tensor's element count.
        expected: usize,
        /// The slice's length.
        got: usize,
    },
    /// The tensor's elements are not densely laid out in order (a permuted or strided view),
    /// so its bytes are not its elements in order; copy it with `cont` first.
    #[error("tensor {0:?} is not contiguous")]
    NotContiguous(TensorId),
    /// The byte-level operation failed (stale id, not allocated, read-only buffer, …).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Check type and layout; the element count on success.
fn check<T: TensorElement>(ctx: &Context, tensor: TensorId) -> Result<usize, TensorIoError> {
    let t = ctx.get(tensor).map_err(BackendError::from)?;
    if t.ty() != T::ELEMENT_TYPE {
        return Err(TensorIoError::TypeMismatch {
            tensor,
            tensor_type: t.ty(),
            requested: T::ELEMENT_TYPE,
        });
    }
    if !t.is_contiguous() {
        return Err(TensorIoError::NotContiguous(tensor));
    }
    // A contiguous tensor of a non-block type has nelements * SIZE == nbytes, which fits in
    // memory once the tensor is allocated; `usize::try_from` guards the metadata alone.
    usize::try_from(t.nelements()).map_err(|_| TensorIoError::NotContiguous(tensor))
}

/// Write all of `tensor` from `data`, one element per tensor element in memory order
/// (`ggml_backend_tensor_set` over the whole tensor, typed).
///
/// Errors: [`TensorIoError::TypeMismatch`] when `T` is not the tensor's element type,
/// [`TensorIoError::LengthMismatch`] when `data.len()` is not its element count,
/// [`TensorIoError::NotContiguous`] for a strided view, and [`TensorIoError::Backend`] for
/// what [`crate::tensor_set`] refuses. A refused call writes nothing.
///
/// ```
/// use backend_core::{tensor_alloc, tensor_get_vec, tensor_set_slice, TensorIoError};
/// use graph::{Context, ElementType};
///
/// let buf = backend_cpu::cpu_buffer_type().alloc_buffer(64)?;
/// let mut ctx = Context::new();
/// let t = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// tensor_alloc(&mut ctx, &buf, t, 0)?;
/// tensor_set_slice(&ctx, t, &[1.0f32, 2.0, 3.0, 4.0])?;
/// assert_eq!(tensor_get_vec::<f32>(&ctx, t)?, [1.0, 2.0, 3.0, 4.0]);
///
/// // An i32 slice for an F32 tensor is refused before any byte moves.
/// let err = tensor_set_slice(&ctx, t, &[1i32, 2, 3, 4]).unwrap_err();
/// assert!(matches!(err, TensorIoError::TypeMismatch { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tensor_set_slice<T: TensorElement>(
    ctx: &Context,
    tensor: TensorId,
    data: &[T],
) -> Result<(), TensorIoError> {
    let n = check::<T>(ctx, tensor)?;
    if data.len() != n {
        return Err(TensorIoError::LengthMismatch {
            tensor,
            expected: n,
            got: data.len(),
        });
    }
    let len = n
        .checked_mul(T::SIZE)
        .ok_or(TensorIoError::LengthMismatch {
            tensor,
            expected: n,
            got: data.len(),
        })?;
    let mut bytes = Vec::with_capacity(len);
    for &v in data {
        v.put_le(&mut bytes);
    }
    tensor_set(ctx, tensor, 0, &bytes)?;
    Ok(())
}

/// Read all of `tensor` as a `Vec<T>` in memory order (`ggml_backend_tensor_get` over the
/// whole tensor, typed).
///
/// Errors as for [`tensor_set_slice`], without the length check.
///
/// ```
/// use backend_core::{tensor_alloc, tensor_get_vec, tensor_set, TensorIoError};
/// use graph::{Context, ElementType};
/// use half::f16;
///
/// let buf = backend_cpu::cpu_buffer_type().alloc_buffer(64)?;
/// let mut ctx = Context::new();
/// let t = ctx.new_tensor_1d(ElementType::F16, 2)?;
/// tensor_alloc(&mut ctx, &buf, t, 0)?;
/// tensor_set(&ctx, t, 0, &[0x00, 0x3C, 0x00, 0xC0])?; // 1.0 and -2.0 as f16
/// assert_eq!(tensor_get_vec::<f16>(&ctx, t)?, [f16::from_f32(1.0), f16::from_f32(-2.0)]);
/// assert!(matches!(
///     tensor_get_vec::<f32>(&ctx, t),
///     Err(TensorIoError::TypeMismatch { .. })
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tensor_get_vec<T: TensorElement>(
    ctx: &Context,
    tensor: TensorId,
) -> Result<Vec<T>, TensorIoError> {
    let n = check::<T>(ctx, tensor)?;
    let len = n
        .checked_mul(T::SIZE)
        .ok_or(TensorIoError::NotContiguous(tensor))?;
    let mut bytes = vec![0u8; len];
    tensor_get(ctx, tensor, 0, &mut bytes)?;
    Ok(bytes.chunks_exact(T::SIZE).map(T::get_le).collect())
}
