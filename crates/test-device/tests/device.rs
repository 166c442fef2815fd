//! The test device's own contract: memory, streams, events. Expected values are written by
//! hand; asynchrony and ordering are shown with stream pauses, never with timing.

use backend_core::{
    Backend, BackendError, BufferUsage, Device, tensor_alloc, tensor_copy, tensor_get,
    tensor_memset, tensor_set,
};
use graph::{Context, ElementType, TensorId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;
use test_device::{TestBackend, TestDevice, TestDeviceConfig};

fn device(cfg: TestDeviceConfig) -> Device {
    TestDevice::create(cfg).expect("device")
}

fn tb(b: &Backend) -> &TestBackend {
    b.implementation()
        .as_any()
        .downcast_ref::<TestBackend>()
        .expect("test backend")
}

fn bytes_of(ctx: &Context, t: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).expect("get");
    v
}

/// Two 64-byte tensors x, y in one device buffer.
fn two_tensors(dev: &Device) -> (Context, TensorId, TensorId, backend_core::Buffer) {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    let y = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    let buf = dev.buffer_type().alloc_buffer(4096).unwrap();
    let a = dev.buffer_type().alignment();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, y, a.max(64)).unwrap();
    (ctx, x, y, buf)
}

#[test]
fn buffers_are_device_memory_with_configured_alignment_and_limits() {
    let dev = device(
        TestDeviceConfig::named("D")
            .alignment(512)
            .max_buffer_size(8192)
            .memory(16384),
    );
    let buft = dev.buffer_type();
    assert_eq!(buft.alignment(), 512);
    assert_eq!(buft.max_size(), 8192);
    assert!(!buft.is_host());
    let b = buft.alloc_buffer(8192).unwrap();
    assert!(b.host_ptr().is_none());
    assert_eq!(b.base_address() % 512, 0);
    assert!(matches!(
        buft.alloc_buffer(8193),
        Err(BackendError::TooLarge { .. })
    ));
    // memory accounting: 8192 used of 16384; a second 8192 fits, a third does not
    assert_eq!(dev.memory(), (8192, 16384));
    let b2 = buft.alloc_buffer(8192).unwrap();
    assert!(matches!(
        buft.alloc_buffer(1),
        Err(BackendError::AllocationFailed { .. })
    ));
    drop(b2);
    drop(b);
    assert_eq!(dev.memory(), (16384, 16384));
    // size 0 is a valid empty buffer that does not count
    let e = buft.alloc_buffer(0).unwrap();
    assert_eq!(e.size(), 0);
    e.clear(1).unwrap();
    // misaligned placement is refused
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = buft.alloc_buffer(4096).unwrap();
    assert!(matches!(
        tensor_alloc(&mut ctx, &b, t, 256),
        Err(BackendError::Misaligned { .. })
    ));
    tensor_alloc(&mut ctx, &b, t, 512).unwrap();
}

#[test]
fn sync_buffer_commands_round_trip() {
    let dev = device(TestDeviceConfig::default());
    let (ctx, x, y, buf) = two_tensors(&dev);
    buf.clear(0xAA).unwrap();
    assert_eq!(bytes_of(&ctx, x), vec![0xAA; 64]);
    let pattern: Vec<u8> = (0..64).collect();
    tensor_set(&ctx, x, 0, &pattern).unwrap();
    tensor_memset(&ctx, x, 0x11, 8, 4).unwrap();
    let mut want = pattern.clone();
    want[8..12].fill(0x11);
    assert_eq!(bytes_of(&ctx, x), want);
    // partial get
    let mut part = [0u8; 3];
    tensor_get(&ctx, x, 61, &mut part).unwrap();
    assert_eq!(part, [61, 62, 63]);
    // bounds
    assert!(matches!(
        tensor_set(&ctx, x, 60, &[0; 5]),
        Err(BackendError::OutOfBounds { .. })
    ));
    // device-to-device copy stays on the device (fast path)
    tensor_copy(&ctx, x, y).unwrap();
    assert_eq!(bytes_of(&ctx, y), want);
    buf.set_usage(BufferUsage::Weights);
    assert_eq!(buf.usage(), BufferUsage::Weights);
}

#[test]
fn copy_between_two_devices_falls_back_through_the_host() {
    let a = device(TestDeviceConfig::named("A"));
    let b = device(TestDeviceConfig::named("B"));
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::I8, 32).unwrap();
    let y = ctx.new_tensor_1d(ElementType::I8, 32).unwrap();
    let ba = a.buffer_type().alloc_buffer(256).unwrap();
    let bb = b.buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &ba, x, 0).unwrap();
    tensor_alloc(&mut ctx, &bb, y, 0).unwrap();
    let pattern: Vec<u8> = (100..132).collect();
    tensor_set(&ctx, x, 0, &pattern).unwrap();
    tensor_copy(&ctx, x, y).unwrap();
    assert_eq!(bytes_of(&ctx, y), pattern);
}

#[test]
fn async_set_is_queued_until_the_stream_gets_there() {
    let dev = device(TestDeviceConfig::default());
    let backend = dev.init_backend("").unwrap();
    let (ctx, x, _y, buf) = two_tensors(&dev);
    buf.clear(0).unwrap();
    let pause = tb(&backend).pause().unwrap();
    backend.tensor_set_async(&ctx, x, 0, &[5u8; 64]).unwrap();
    // the stream is held: the synchronous (copy-engine) read still sees the old bytes
    assert_eq!(bytes_of(&ctx, x), vec![0u8; 64]);
    pause.release();
    backend.synchronize().unwrap();
    assert_eq!(bytes_of(&ctx, x), vec![5u8; 64]);
}

#[test]
fn async_get_waits_for_queued_work() {
    let dev =
        device(TestDeviceConfig::default().transfer_latency(std::time::Duration::from_millis(5)));
    let backend = dev.init_backend("").unwrap();
    let (ctx, x, _y, _buf) = two_tensors(&dev);
    for v in 1..=3u8 {
        backend.tensor_set_async(&ctx, x, 0, &[v; 64]).unwrap();
    }
    let mut out = [0u8; 64];
    backend.tensor_get_async(&ctx, x, 0, &mut out).unwrap();
    assert_eq!(out, [3u8; 64]);
}

#[test]
fn events_order_work_between_streams() {
    let dev = device(TestDeviceConfig::default());
    let s1 = dev.init_backend("").unwrap();
    let s2 = dev.init_backend("").unwrap();
    let (ctx, x, y, buf) = two_tensors(&dev);
    buf.clear(0).unwrap();
    let ev = dev.event_new().unwrap();

    let pause = tb(&s1).pause().unwrap();
    s1.tensor_set_async(&ctx, x, 0, &[9u8; 64]).unwrap();
    s1.event_record(&ev).unwrap();
    s2.event_wait(&ev).unwrap();
    // s2 copies x to y only after s1 reached the event
    backend_core::tensor_copy_async(&ctx, &s2, &s2, x, y).unwrap();
    // s2's queue is blocked behind the event, which is blocked behind the pause: a waiter on
    // s2 is still blocked after a while (without the wait, s2 would copy the zeros and be
    // done at once; a correct wait can never fail this). Reading y alone would not show it:
    // s2's copy may simply not have started yet.
    let returned = Arc::new(AtomicBool::new(false));
    let (s2b, r2) = (s2.clone(), returned.clone());
    let waiter = std::thread::spawn(move || {
        let r = s2b.synchronize();
        r2.store(true, Ordering::SeqCst);
        r
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !returned.load(Ordering::SeqCst),
        "s2 finished its queue while s1 was paused before the event s2 waits for"
    );
    assert_eq!(bytes_of(&ctx, y), vec![0u8; 64]);
    pause.release();
    waiter.join().unwrap().unwrap();
    ev.synchronize().unwrap();
    s2.synchronize().unwrap();
    assert_eq!(bytes_of(&ctx, y), vec![9u8; 64]);
}

#[test]
fn cross_stream_async_copy_orders_after_the_source_stream() {
    let dev = device(TestDeviceConfig::default());
    let s1 = dev.init_backend("").unwrap();
    let s2 = dev.init_backend("").unwrap();
    let (ctx, x, y, buf) = two_tensors(&dev);
    buf.clear(0).unwrap();
    let pause = tb(&s1).pause().unwrap();
    s1.tensor_set_async(&ctx, x, 0, &[4u8; 64]).unwrap();
    backend_core::tensor_copy_async(&ctx, &s1, &s2, x, y).unwrap();
    pause.release();
    s2.synchronize().unwrap();
    assert_eq!(bytes_of(&ctx, y), vec![4u8; 64]);
}

#[test]
fn event_synchronize_blocks_until_the_marker_fires_and_unrecorded_events_are_complete() {
    let dev = device(TestDeviceConfig::default());
    let s = dev.init_backend("").unwrap();
    let ev = dev.event_new().unwrap();
    ev.synchronize().unwrap(); // never recorded: already complete
    let (ctx, x, _y, _buf) = two_tensors(&dev);
    let pause = tb(&s).pause().unwrap();
    s.tensor_set_async(&ctx, x, 0, &[1u8; 64]).unwrap();
    s.event_record(&ev).unwrap();
    let returned = Arc::new(AtomicBool::new(false));
    let r2 = returned.clone();
    let waiter = std::thread::spawn(move || {
        let r = ev.synchronize();
        r2.store(true, Ordering::SeqCst);
        r
    });
    // the event cannot fire while the stream is paused: the waiter is still blocked after a
    // while (a broken wait returns at once; a correct one can never fail this)
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !returned.load(Ordering::SeqCst),
        "Event::synchronize returned while the stream was paused before the marker"
    );
    // release it and the waiter returns, with the work before the marker done
    pause.release();
    waiter.join().unwrap().unwrap();
    assert!(returned.load(Ordering::SeqCst));
    assert_eq!(bytes_of(&ctx, x), vec![1u8; 64]);
}

/// Run `f` on another thread and fail (instead of hanging) if it does not return in time.
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(20))
        .expect("blocked: waited for more than the recorded point")
}

#[test]
fn event_synchronize_waits_for_the_recorded_point_only_and_a_new_record_moves_it() {
    let dev = device(TestDeviceConfig::default());
    let s = dev.init_backend("").unwrap();
    let (ctx, x, _y, buf) = two_tensors(&dev);
    buf.clear(0).unwrap();
    let ev = dev.event_new().unwrap();
    s.tensor_set_async(&ctx, x, 0, &[1u8; 64]).unwrap();
    s.event_record(&ev).unwrap();
    // work queued after the record, held behind a pause
    let pause = tb(&s).pause().unwrap();
    s.tensor_set_async(&ctx, x, 0, &[2u8; 64]).unwrap();
    let e2 = ev.clone();
    within(move || e2.synchronize()).unwrap();
    assert_eq!(
        bytes_of(&ctx, x),
        vec![1u8; 64],
        "the recorded point, not later"
    );
    // recording again moves the point behind the paused work: now synchronize must wait
    s.event_record(&ev).unwrap();
    let returned = Arc::new(AtomicBool::new(false));
    let (e3, r3) = (ev.clone(), returned.clone());
    let waiter = std::thread::spawn(move || {
        let r = e3.synchronize();
        r3.store(true, Ordering::SeqCst);
        r
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(!returned.load(Ordering::SeqCst), "waited for the old point");
    pause.release();
    waiter.join().unwrap().unwrap();
    assert_eq!(bytes_of(&ctx, x), vec![2u8; 64]);
}

#[test]
fn event_wait_does_not_block_the_caller() {
    let dev = device(TestDeviceConfig::default());
    let s1 = dev.init_backend("").unwrap();
    let s2 = dev.init_backend("").unwrap();
    let ev = dev.event_new().unwrap();
    let pause = tb(&s1).pause().unwrap();
    s1.event_record(&ev).unwrap();
    // s1 cannot reach the marker until the pause is released, which happens only after
    // event_wait returned: a blocking wait would hang here (and fail `within`)
    let (s2b, evb) = (s2.clone(), ev.clone());
    within(move || s2b.event_wait(&evb)).unwrap();
    pause.release();
    s2.synchronize().unwrap();
}

#[test]
fn events_of_another_device_are_refused_for_record() {
    let a = device(TestDeviceConfig::named("A"));
    let b = device(TestDeviceConfig::named("B"));
    let sa = a.init_backend("").unwrap();
    let ev_b = b.event_new().unwrap();
    assert!(matches!(
        sa.event_record(&ev_b),
        Err(BackendError::EventDeviceMismatch { .. })
    ));
    // waiting for another test device's event is fine
    sa.event_wait(&ev_b).unwrap();
    sa.synchronize().unwrap();
}

#[test]
fn queued_errors_surface_at_synchronize_and_then_clear() {
    // A node reading memory of another device cannot be computed; graph_compute only queues
    // it, so the failure comes back from synchronize, once.
    let a = device(TestDeviceConfig::named("A"));
    let b = device(TestDeviceConfig::named("B"));
    let s = a.init_backend("").unwrap();
    let mut ctx = Context::new();
    let x = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let y = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let z = ctx.add(x, y).unwrap();
    let ba = a.buffer_type().alloc_buffer(1024).unwrap();
    let bb = b.buffer_type().alloc_buffer(1024).unwrap();
    tensor_alloc(&mut ctx, &ba, x, 0).unwrap();
    tensor_alloc(&mut ctx, &bb, y, 0).unwrap();
    tensor_alloc(&mut ctx, &ba, z, 128).unwrap();
    let mut g = graph::Graph::new(8);
    g.build_forward_expand(&mut ctx, z).unwrap();
    assert_eq!(
        s.graph_compute_async(&ctx, g.as_view()).unwrap(),
        backend_core::ComputeStatus::Success
    );
    let r = s.synchronize();
    assert!(
        matches!(&r, Err(BackendError::Failed { message, .. })
            if message.contains("not in memory this compute can address")),
        "{r:?}"
    );
    s.synchronize().unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "the globally registered device lives for the whole process"
)]
fn registry_and_params() {
    let dev = test_device::register().unwrap();
    assert_eq!(
        backend_core::GlobalRegistry::get()
            .device_by_name("test0")
            .unwrap(),
        dev
    );
    let r = dev.init_backend("threads=4");
    assert!(
        matches!(&r, Err(BackendError::Failed { message, .. })
            if message.contains("unknown backend parameters")),
        "{r:?}"
    );
    let r = TestDevice::create(TestDeviceConfig::default().alignment(24));
    assert!(
        matches!(&r, Err(BackendError::Failed { message, .. })
            if message.contains("not a power of two")),
        "{r:?}"
    );
    let b = dev.init_backend("").unwrap();
    assert_eq!(b.name(), "TEST0");
    assert_eq!(b.device(), dev);
    assert!(dev.caps().events && dev.caps().async_ops);
}
