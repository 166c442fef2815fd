//! Typed tensor I/O (`tensor_set_slice` / `tensor_get_vec`): every element type round-trips
//! through CPU memory with the bytes the byte functions see, and every refusal is its own
//! error variant and leaves the tensor as it was.

use backend_core::{
    BackendError, Buffer, HostMemory, TensorElement, TensorIoError, tensor_alloc, tensor_get,
    tensor_get_vec, tensor_set, tensor_set_slice,
};
use graph::{Context, ElementType, TensorId};

fn cpu_buffer(size: usize) -> Buffer {
    backend_cpu::cpu_buffer_type().alloc_buffer(size).unwrap()
}

fn placed(ctx: &mut Context, buf: &Buffer, ty: ElementType, ne: &[i64]) -> TensorId {
    let t = ctx.new_tensor(ty, ne).unwrap();
    tensor_alloc(ctx, buf, t, 0).unwrap();
    t
}

fn round_trip<T: TensorElement + PartialEq + std::fmt::Debug>(vals: &[T]) {
    let buf = cpu_buffer(256);
    let mut ctx = Context::new();
    let t = placed(&mut ctx, &buf, T::ELEMENT_TYPE, &[vals.len() as i64]);
    assert_eq!(T::SIZE, T::ELEMENT_TYPE.type_size());
    tensor_set_slice(&ctx, t, vals).unwrap();
    assert_eq!(tensor_get_vec::<T>(&ctx, t).unwrap(), vals);
    // The bytes are the little-endian encoding the byte functions see.
    let mut raw = vec![0u8; T::SIZE * vals.len()];
    tensor_get(&ctx, t, 0, &mut raw).unwrap();
    let mut want = Vec::new();
    vals.iter().for_each(|&v| v.put_le(&mut want));
    assert_eq!(raw, want);
}

#[test]
fn every_element_type_round_trips() {
    round_trip(&[1.5f32, -0.25, f32::MAX]);
    round_trip(&[1.5f64, -1e300]);
    round_trip(&[half::f16::from_f32(0.5), half::f16::from_f32(-3.0)]);
    round_trip(&[half::bf16::from_f32(0.5), half::bf16::from_f32(-3.0)]);
    round_trip(&[-128i8, 0, 127]);
    round_trip(&[i16::MIN, 7]);
    round_trip(&[i32::MIN, -1, 42]);
    round_trip(&[i64::MAX, -9]);
}

#[test]
fn f32_bytes_match_the_byte_api() {
    let buf = cpu_buffer(64);
    let mut ctx = Context::new();
    let t = placed(&mut ctx, &buf, ElementType::F32, &[2]);
    tensor_set(&ctx, t, 0, &[0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0]).unwrap();
    assert_eq!(tensor_get_vec::<f32>(&ctx, t).unwrap(), [1.0, -2.0]);
}

#[test]
fn a_wrong_type_is_refused_and_writes_nothing() {
    let buf = cpu_buffer(64);
    let mut ctx = Context::new();
    let t = placed(&mut ctx, &buf, ElementType::F16, &[4]);
    tensor_set_slice(&ctx, t, &[half::f16::ONE; 4]).unwrap();
    let err = tensor_set_slice(&ctx, t, &[0.0f32; 4]).unwrap_err();
    assert!(
        matches!(
            err,
            TensorIoError::TypeMismatch {
                tensor_type: ElementType::F16,
                requested: ElementType::F32,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(matches!(
        tensor_get_vec::<i16>(&ctx, t),
        Err(TensorIoError::TypeMismatch { .. })
    ));
    assert_eq!(
        tensor_get_vec::<half::f16>(&ctx, t).unwrap(),
        [half::f16::ONE; 4]
    );
}

#[test]
fn a_wrong_length_is_refused_and_writes_nothing() {
    let buf = cpu_buffer(64);
    let mut ctx = Context::new();
    let t = placed(&mut ctx, &buf, ElementType::I32, &[3]);
    tensor_set_slice(&ctx, t, &[1i32, 2, 3]).unwrap();
    for bad in [&[9i32, 9][..], &[9, 9, 9, 9], &[]] {
        let err = tensor_set_slice(&ctx, t, bad).unwrap_err();
        assert!(
            matches!(err, TensorIoError::LengthMismatch { expected: 3, got, .. } if got == bad.len()),
            "{err:?}"
        );
    }
    assert_eq!(tensor_get_vec::<i32>(&ctx, t).unwrap(), [1, 2, 3]);
}

#[test]
fn a_strided_view_is_refused() {
    let buf = cpu_buffer(256);
    let mut ctx = Context::new();
    let t = placed(&mut ctx, &buf, ElementType::F32, &[4, 3]);
    let tr = ctx.transpose(t).unwrap();
    assert!(matches!(
        tensor_get_vec::<f32>(&ctx, tr),
        Err(TensorIoError::NotContiguous(id)) if id == tr
    ));
    assert!(matches!(
        tensor_set_slice(&ctx, tr, &[0.0f32; 12]),
        Err(TensorIoError::NotContiguous(_))
    ));
}

#[test]
fn backend_errors_pass_through() {
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 2).unwrap();
    assert!(matches!(
        tensor_set_slice(&ctx, t, &[1.0f32, 2.0]),
        Err(TensorIoError::Backend(BackendError::NotAllocated(id))) if id == t
    ));
    assert!(matches!(
        tensor_get_vec::<f32>(&ctx, t),
        Err(TensorIoError::Backend(BackendError::NotAllocated(_)))
    ));
    let cp = ctx.checkpoint();
    let stale = ctx.new_tensor_1d(ElementType::F32, 2).unwrap();
    ctx.rewind(cp);
    assert!(matches!(
        tensor_get_vec::<f32>(&ctx, stale),
        Err(TensorIoError::Backend(BackendError::Graph(_)))
    ));
}

#[test]
fn a_read_only_buffer_refuses_the_write() {
    /// Host memory aligned as mapped buffers require.
    #[repr(align(64))]
    struct Aligned([u8; 8]);
    impl AsRef<[u8]> for Aligned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    let bytes = Aligned([0, 0, 0x80, 0x3F, 0, 0, 0, 0x40]);
    let buf = backend_cpu::cpu_device()
        .buffer_from_host_memory(HostMemory::read_only(bytes), usize::MAX)
        .unwrap();
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 2).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 0).unwrap();
    assert_eq!(tensor_get_vec::<f32>(&ctx, t).unwrap(), [1.0, 2.0]);
    assert!(matches!(
        tensor_set_slice(&ctx, t, &[0.0f32; 2]),
        Err(TensorIoError::Backend(BackendError::ReadOnly { .. }))
    ));
}
