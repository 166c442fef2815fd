//! The device computes: results worked out by hand, op restrictions, host memory refused,
//! compute queued behind a paused stream, several kernel threads.

use std::time::Duration;

use backend_core::{BackendError, ComputeStatus, Device, tensor_alloc, tensor_get, tensor_set};
use graph::{Context, ElementType, Graph, Op, TensorId};
use test_device::{TestBackend, TestDevice, TestDeviceConfig};

fn device(cfg: TestDeviceConfig) -> Device {
    TestDevice::create(cfg).expect("device")
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read(ctx: &Context, t: TensorId) -> Vec<f32> {
    let mut b = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut b).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `(a + b) * a` and `mul_mat(w, a)` over 4-element vectors, all in one device buffer.
struct Small {
    ctx: Context,
    graph: Graph,
    a: TensorId,
    b: TensorId,
    w: TensorId,
    sum_times_a: TensorId,
    prod: TensorId,
    _buf: backend_core::Buffer,
}

fn small(dev: &Device) -> Small {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let w = ctx.new_tensor_2d(ElementType::F32, 4, 2).unwrap();
    let s = ctx.add(a, b).unwrap();
    let sum_times_a = ctx.mul(s, a).unwrap();
    let prod = ctx.mul_mat(w, a).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, sum_times_a).unwrap();
    graph.build_forward_expand(&mut ctx, prod).unwrap();
    let buf = dev.buffer_type().alloc_buffer(8 * 256).unwrap();
    for (i, t) in [a, b, w, s, sum_times_a, prod].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, i * 256).unwrap();
    }
    tensor_set(&ctx, a, 0, &f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    tensor_set(&ctx, b, 0, &f32s(&[10.0, 20.0, 30.0, 40.0])).unwrap();
    tensor_set(&ctx, w, 0, &f32s(&[1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])).unwrap();
    Small {
        ctx,
        graph,
        a,
        b,
        w,
        sum_times_a,
        prod,
        _buf: buf,
    }
}

#[test]
fn a_graph_computes_in_device_memory() {
    let dev = device(TestDeviceConfig::named("D"));
    let s = small(&dev);
    assert!(dev.supports_op(&s.ctx, s.prod));
    let backend = dev.init_backend("").unwrap();
    assert_eq!(
        backend.graph_compute(&s.ctx, s.graph.as_view()).unwrap(),
        ComputeStatus::Success
    );
    // (a + b) * a = [11, 44, 99, 176]; w·a = [1, (1+2+3+4)/2]
    assert_eq!(read(&s.ctx, s.sum_times_a), [11.0, 44.0, 99.0, 176.0]);
    assert_eq!(read(&s.ctx, s.prod), [1.0, 5.0]);
    // the inputs are untouched
    assert_eq!(read(&s.ctx, s.a), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(read(&s.ctx, s.b), [10.0, 20.0, 30.0, 40.0]);
    assert_eq!(read(&s.ctx, s.w)[4], 0.5);
}

#[test]
fn compute_is_queued_behind_earlier_work() {
    let dev = device(TestDeviceConfig::named("D"));
    let s = small(&dev);
    let backend = dev.init_backend("").unwrap();
    let stream = backend
        .implementation()
        .as_any()
        .downcast_ref::<TestBackend>()
        .unwrap();
    let pause = stream.pause().unwrap();
    backend
        .tensor_set_async(&s.ctx, s.a, 0, &f32s(&[2.0, 2.0, 2.0, 2.0]))
        .unwrap();
    assert_eq!(
        backend
            .graph_compute_async(&s.ctx, s.graph.as_view())
            .unwrap(),
        ComputeStatus::Success
    );
    // nothing has run: the result is still the zeroed allocation
    assert_eq!(read(&s.ctx, s.sum_times_a), [0.0; 4]);
    pause.release();
    backend.synchronize().unwrap();
    // computed with the new a: (2 + b) * 2
    assert_eq!(read(&s.ctx, s.sum_times_a), [24.0, 44.0, 64.0, 84.0]);
    assert_eq!(read(&s.ctx, s.prod), [2.0, 4.0]);
}

#[test]
fn ops_outside_the_configured_list_are_unsupported_and_refused() {
    let dev = device(TestDeviceConfig::named("D").supported_ops([Op::Add]));
    let s = small(&dev);
    let sum = s.ctx[s.sum_times_a].src(0).unwrap();
    assert!(dev.supports_op(&s.ctx, sum));
    assert!(!dev.supports_op(&s.ctx, s.sum_times_a));
    assert!(!dev.supports_op(&s.ctx, s.prod));
    let backend = dev.init_backend("").unwrap();
    assert!(matches!(
        backend.graph_compute(&s.ctx, s.graph.as_view()),
        Err(BackendError::UnsupportedOp { op: "MUL", .. })
    ));
}

#[test]
fn ops_the_kernels_lack_are_unsupported_even_when_listed() {
    let dev = device(TestDeviceConfig::named("D").supported_ops([Op::MulMat]));
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::Q5_0, 64, 2).unwrap();
    let x = ctx.new_tensor_1d(ElementType::F32, 64).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    assert!(!dev.supports_op(&ctx, y));
    let w = ctx.new_tensor_2d(ElementType::F16, 64, 2).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    assert!(dev.supports_op(&ctx, y));
}

#[test]
fn host_memory_is_not_addressable_by_device_kernels() {
    let dev = device(TestDeviceConfig::named("D"));
    let backend = dev.init_backend("").unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let y = ctx.sqr(x).unwrap();
    let host = backend_cpu::cpu_buffer_type().alloc_buffer(256).unwrap();
    let dbuf = dev.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &host, x, 0).unwrap();
    tensor_alloc(&mut ctx, &dbuf, y, 0).unwrap();
    tensor_set(&ctx, x, 0, &f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    backend.graph_compute_async(&ctx, g.as_view()).unwrap();
    let err = backend.synchronize().unwrap_err();
    assert!(err.to_string().contains("address"), "{err}");
    assert_eq!(read(&ctx, y), [0.0; 4]);
}

#[test]
fn latency_and_threads_do_not_change_results() {
    let plain = device(TestDeviceConfig::named("P"));
    let slow = device(
        TestDeviceConfig::named("S")
            .compute_threads(3)
            .default_latency(Duration::from_millis(2))
            .op_latency(Op::MulMat, Duration::from_millis(5)),
    );
    let (p, s) = (small(&plain), small(&slow));
    plain
        .init_backend("")
        .unwrap()
        .graph_compute(&p.ctx, p.graph.as_view())
        .unwrap();
    let t = std::time::Instant::now();
    slow.init_backend("")
        .unwrap()
        .graph_compute(&s.ctx, s.graph.as_view())
        .unwrap();
    // two computed nodes of 2 ms (ADD, MUL) and one of 5 ms (MUL_MAT)
    assert!(t.elapsed() >= Duration::from_millis(9));
    assert_eq!(read(&p.ctx, p.sum_times_a), read(&s.ctx, s.sum_times_a));
    assert_eq!(read(&p.ctx, p.prod), read(&s.ctx, s.prod));
}
