//! Buffer semantics and misuse of the checked helpers, on in-test device memory. Expected
//! bytes are worked out by hand in each test.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use backend_core::*;
use common::*;
use graph::{Context, ElementType, TensorId};

fn setup(size: usize) -> (Context, Buffer, TensorId) {
    let mut ctx = Context::new();
    let buf = mem_buft(32).alloc_buffer(size).unwrap();
    let t = ctx.new_tensor_1d(ElementType::F32, 8).unwrap(); // 32 bytes
    tensor_alloc(&mut ctx, &buf, t, 32).unwrap();
    (ctx, buf, t)
}

fn bytes(buf: &Buffer) -> Vec<u8> {
    let m: &MemBuffer = buf
        .implementation()
        .unwrap()
        .as_any()
        .downcast_ref()
        .unwrap();
    m.bytes.lock().unwrap().clone()
}

#[test]
fn zero_size_buffer_is_valid_and_empty() {
    let buf = mem_buft(32).alloc_buffer(0).unwrap();
    assert_eq!(buf.size(), 0);
    assert!(buf.implementation().is_none());
    assert!(buf.host_ptr().is_none());
    assert_eq!(buf.base_address(), 0);
    buf.clear(1).unwrap();
    buf.reset();
    let mut ctx = Context::new();
    let e = ctx.new_tensor_1d(ElementType::F32, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, e, 0).unwrap();
    tensor_set(&ctx, e, 0, &[]).unwrap();
}

#[test]
fn too_large_is_refused() {
    let buft = BufferType::new(MemBuft {
        name: "SMALL",
        align: 32,
        max: 100,
        device: Default::default(),
    });
    assert_eq!(
        buft.alloc_buffer(101).unwrap_err(),
        BackendError::TooLarge {
            buffer_type: "SMALL".into(),
            size: 101,
            max: 100
        }
    );
    assert_eq!(buft.alloc_buffer(100).unwrap().size(), 100);
}

#[test]
fn set_get_memset_clear_round_trip() {
    let (ctx, buf, t) = setup(96);
    buf.clear(0x11).unwrap();
    assert!(bytes(&buf).iter().all(|&b| b == 0x11));
    tensor_set(&ctx, t, 4, &[1, 2, 3]).unwrap();
    tensor_memset(&ctx, t, 9, 30, 2).unwrap();
    let mut out = [0u8; 32];
    tensor_get(&ctx, t, 0, &mut out).unwrap();
    let mut want = [0x11u8; 32];
    want[4..7].copy_from_slice(&[1, 2, 3]);
    want[30..32].copy_from_slice(&[9, 9]);
    assert_eq!(out, want);
    // and in the buffer at the tensor's offset 32, nothing else touched
    let all = bytes(&buf);
    assert_eq!(&all[32..64], &want);
    assert!(all[..32].iter().chain(&all[64..]).all(|&b| b == 0x11));
}

#[test]
fn out_of_bounds_access_is_refused_and_changes_nothing() {
    let (ctx, buf, t) = setup(96);
    buf.clear(0x22).unwrap();
    let before = bytes(&buf);
    assert_eq!(
        tensor_set(&ctx, t, 30, &[0; 3]).unwrap_err(),
        BackendError::OutOfBounds {
            what: "tensor_set",
            offset: 30,
            size: 3,
            limit: 32
        }
    );
    assert!(matches!(
        tensor_set(&ctx, t, usize::MAX, &[0; 2]),
        Err(BackendError::OutOfBounds { .. })
    ));
    let mut out = [0u8; 33];
    assert!(matches!(
        tensor_get(&ctx, t, 0, &mut out),
        Err(BackendError::OutOfBounds {
            what: "tensor_get",
            ..
        })
    ));
    assert!(matches!(
        tensor_memset(&ctx, t, 0, 1, 32),
        Err(BackendError::OutOfBounds {
            what: "tensor_memset",
            ..
        })
    ));
    assert_eq!(bytes(&buf), before);
    assert_eq!(out, [0u8; 33], "a refused read writes nothing");
}

#[test]
fn unallocated_tensor_is_refused() {
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    assert_eq!(
        tensor_set(&ctx, t, 0, &[1]).unwrap_err(),
        BackendError::NotAllocated(t)
    );
    assert_eq!(
        tensor_get(&ctx, t, 0, &mut [0]).unwrap_err(),
        BackendError::NotAllocated(t)
    );
}

#[test]
fn storage_outside_its_buffer_is_refused() {
    // `Tensor::set_storage` is public: a tensor placed by hand past the end must not reach
    // the backend.
    let mut ctx = Context::new();
    let buf = mem_buft(32).alloc_buffer(64).unwrap();
    let t = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    ctx[t].set_storage(Some(buf.storage_at(48)));
    assert!(matches!(
        tensor_set(&ctx, t, 0, &[1]),
        Err(BackendError::OutOfBounds {
            what: "tensor storage",
            ..
        })
    ));
}

#[test]
fn tensor_alloc_checks_place_alignment_and_state() {
    let mut ctx = Context::new();
    let buf = mem_buft(32).alloc_buffer(96).unwrap();
    let t = ctx.new_tensor_1d(ElementType::F32, 8).unwrap(); // 32 bytes
    assert_eq!(
        tensor_alloc(&mut ctx, &buf, t, 16).unwrap_err(),
        BackendError::Misaligned {
            offset: 16,
            alignment: 32
        }
    );
    assert_eq!(
        tensor_alloc(&mut ctx, &buf, t, 96).unwrap_err(),
        BackendError::out_of_bounds("tensor_alloc", 96, 32, 96)
    );
    assert!(matches!(
        tensor_alloc(&mut ctx, &buf, t, usize::MAX - 31),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(!ctx[t].has_storage(), "refusals leave the tensor unplaced");
    tensor_alloc(&mut ctx, &buf, t, 64).unwrap();
    assert_eq!(ctx[t].storage().unwrap().offset, 64);
    assert_eq!(
        tensor_alloc(&mut ctx, &buf, t, 0).unwrap_err(),
        BackendError::AlreadyAllocated(t)
    );
    assert_eq!(ctx[t].storage().unwrap().offset, 64);
    // a view cannot be placed
    let u = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    let v = ctx.view_tensor(u).unwrap();
    assert_eq!(
        tensor_alloc(&mut ctx, &buf, v, 0).unwrap_err(),
        BackendError::AlreadyAllocated(v)
    );
    // nor can anything go into a multi-buffer wrapper
    let multi = Buffer::multi(vec![buf.clone()]).unwrap();
    assert!(matches!(
        tensor_alloc(&mut ctx, &multi, u, 0),
        Err(BackendError::Unsupported { .. })
    ));
}

#[test]
fn view_init_needs_an_allocated_source() {
    let mut ctx = Context::new();
    let buf = mem_buft(32).alloc_buffer(64).unwrap();
    let a = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    let v = ctx.view_1d(a, 4, 8).unwrap();
    assert_eq!(
        view_init(&mut ctx, v).unwrap_err(),
        BackendError::ViewSourceNotAllocated(v)
    );
    assert!(!ctx[v].has_storage());
    assert_eq!(
        view_init(&mut ctx, a).unwrap_err(),
        BackendError::NotAView(a)
    );
    tensor_alloc(&mut ctx, &buf, a, 0).unwrap();
    view_init(&mut ctx, v).unwrap();
    assert_eq!(ctx[v].storage().unwrap().offset, 8);
    assert!(buf.holds(ctx[v].storage().unwrap()));
    assert_eq!(
        view_init(&mut ctx, v).unwrap_err(),
        BackendError::AlreadyAllocated(v)
    );
    // writes through the view land at the root's offset 8
    tensor_set(&ctx, v, 0, &[5, 6]).unwrap();
    let mut out = [0u8; 2];
    tensor_get(&ctx, a, 8, &mut out).unwrap();
    assert_eq!(out, [5, 6]);
}

#[test]
fn copy_between_layouts_is_refused() {
    let mut ctx = Context::new();
    let buf = mem_buft(32).alloc_buffer(256).unwrap();
    let a = ctx.new_tensor_2d(ElementType::F32, 4, 2).unwrap();
    let b = ctx.new_tensor_2d(ElementType::F32, 2, 4).unwrap();
    let c = ctx.new_tensor_2d(ElementType::I32, 4, 2).unwrap();
    for (t, o) in [(a, 0), (b, 64), (c, 128)] {
        tensor_alloc(&mut ctx, &buf, t, o).unwrap();
    }
    tensor_set(&ctx, b, 0, &[7; 32]).unwrap();
    assert_eq!(
        tensor_copy(&ctx, a, b).unwrap_err(),
        BackendError::LayoutMismatch { src: a, dst: b }
    );
    assert_eq!(
        tensor_copy(&ctx, a, c).unwrap_err(),
        BackendError::LayoutMismatch { src: a, dst: c }
    );
    let mut out = [0u8; 32];
    tensor_get(&ctx, b, 0, &mut out).unwrap();
    assert_eq!(out, [7; 32]);
}

#[test]
fn staged_copy_between_device_buffers() {
    let mut ctx = Context::new();
    let b1 = mem_buft(32).alloc_buffer(64).unwrap();
    let b2 = mem_buft(32).alloc_buffer(64).unwrap();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    tensor_alloc(&mut ctx, &b1, a, 32).unwrap();
    tensor_alloc(&mut ctx, &b2, b, 0).unwrap();
    let src: Vec<u8> = (0..16).collect();
    tensor_set(&ctx, a, 0, &src).unwrap();
    tensor_copy(&ctx, a, b).unwrap();
    let mut out = [0u8; 16];
    tensor_get(&ctx, b, 0, &mut out).unwrap();
    assert_eq!(out.to_vec(), src);
    // same buffer, not host memory: staged as well
    let c = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    tensor_alloc(&mut ctx, &b1, c, 0).unwrap();
    tensor_copy(&ctx, a, c).unwrap();
    tensor_get(&ctx, c, 0, &mut out).unwrap();
    assert_eq!(out.to_vec(), src);
}

#[test]
fn read_only_buffers_refuse_writes_and_keep_their_bytes() {
    let buft = mem_buft(32);
    let imp = MemBuffer {
        bytes: std::sync::Mutex::new(vec![3; 64]),
        writable: false,
    };
    let ro = Buffer::from_parts(buft.clone(), Some(Box::new(imp)), 64);
    assert!(!ro.is_writable());
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    tensor_alloc(&mut ctx, &ro, t, 0).unwrap();
    let err = BackendError::ReadOnly {
        buffer: "MEM".into(),
    };
    assert_eq!(tensor_set(&ctx, t, 0, &[1]).unwrap_err(), err);
    assert_eq!(tensor_memset(&ctx, t, 1, 0, 4).unwrap_err(), err);
    assert_eq!(ro.clear(0).unwrap_err(), err);
    let rw = buft.alloc_buffer(64).unwrap();
    let multi = Buffer::multi(vec![rw.clone(), ro.clone()]).unwrap();
    rw.clear(5).unwrap();
    assert_eq!(multi.clear(0).unwrap_err(), err);
    assert!(bytes(&rw).iter().all(|&b| b == 5), "no part cleared");
    let u = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    tensor_alloc(&mut ctx, &rw, u, 0).unwrap();
    assert_eq!(tensor_copy(&ctx, u, t).unwrap_err(), err);
    let mut out = [0u8; 16];
    tensor_get(&ctx, t, 0, &mut out).unwrap();
    assert_eq!(out, [3; 16]);
}

#[test]
fn multi_buffer_usage_and_clear_reach_every_part() {
    let buft = mem_buft(32);
    let p1 = buft.alloc_buffer(32).unwrap();
    let p2 = buft.alloc_buffer(64).unwrap();
    let multi = Buffer::multi(vec![p1.clone(), p2.clone()]).unwrap();
    assert!(multi.is_multi());
    assert_eq!(multi.size(), 96);
    assert_eq!(multi.buffer_type(), &buft);
    assert_eq!(multi.parts().len(), 2);
    assert_eq!(multi.usage(), BufferUsage::Any);
    multi.set_usage(BufferUsage::Weights);
    assert_eq!(multi.usage(), BufferUsage::Weights);
    assert_eq!(p1.usage(), BufferUsage::Weights);
    assert_eq!(p2.usage(), BufferUsage::Weights);
    // storage_usage sees it through a tensor's storage
    assert_eq!(storage_usage(&p2.storage_at(0)), Some(BufferUsage::Weights));
    assert_eq!(storage_buffer_type(&p2.storage_at(0)), Some(&buft));
    p1.set_usage(BufferUsage::Compute);
    assert_eq!(multi.usage(), BufferUsage::Weights, "parts do not push up");
    multi.clear(0x5A).unwrap();
    assert!(bytes(&p1).iter().chain(&bytes(&p2)).all(|&b| b == 0x5A));
    assert!(Buffer::multi(Vec::new()).is_none());
}

#[test]
fn buffers_are_freed_once_when_the_last_user_goes() {
    struct Flagged(Arc<AtomicBool>);
    impl BufferImpl for Flagged {
        fn memset_tensor(&self, _: &graph::Tensor, _: u8, _: usize, _: usize) -> Result<()> {
            Ok(())
        }
        fn set_tensor(&self, _: &graph::Tensor, _: usize, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn get_tensor(&self, _: &graph::Tensor, _: usize, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
        fn clear(&self, _: u8) -> Result<()> {
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    impl Drop for Flagged {
        fn drop(&mut self) {
            assert!(!self.0.swap(true, Ordering::SeqCst), "freed twice");
        }
    }
    let freed = Arc::new(AtomicBool::new(false));
    let buf = Buffer::from_parts(mem_buft(32), Some(Box::new(Flagged(freed.clone()))), 64);
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 0).unwrap();
    let clone = buf.clone();
    drop(buf);
    drop(clone);
    assert!(
        !freed.load(Ordering::SeqCst),
        "a tensor still points into it"
    );
    assert!(Buffer::from_storage(ctx[t].storage().unwrap()).is_some());
    drop(ctx);
    assert!(freed.load(Ordering::SeqCst));
}

#[test]
fn concurrent_checked_access_is_ordered() {
    // Many threads writing and reading the same range through the safe API: the per-buffer
    // lock makes every read see one whole write (all bytes equal), never a mix.
    let (ctx, _buf, t) = setup(96);
    let n = if cfg!(miri) { 2 } else { 4 };
    let rounds = if cfg!(miri) { 3 } else { 200 };
    std::thread::scope(|s| {
        for k in 0..n {
            let ctx = &ctx;
            s.spawn(move || {
                for _ in 0..rounds {
                    tensor_set(ctx, t, 0, &[k as u8; 32]).unwrap();
                    let mut out = [0u8; 32];
                    tensor_get(ctx, t, 0, &mut out).unwrap();
                    assert!(out.iter().all(|&b| b == out[0]));
                }
            });
        }
    });
}

/// Regression: `view_init` summed the root's storage offset and the view offset unchecked. A
/// root placed through the public `Tensor::set_storage` near `usize::MAX` made the sum wrap to
/// a small offset, and a write through the view landed on another tensor of the buffer.
#[test]
fn view_init_refuses_a_wrapping_offset_and_corrupts_nothing() {
    let (mut ctx, buf, other) = setup(128);
    tensor_set(&ctx, other, 0, &[0x11; 32]).unwrap();
    let root = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    // a view at byte 48 of the root: with the root at usize::MAX - 15 the sum wraps to 32,
    // which is where `other` lives
    let v = ctx.view_1d(root, 4, 48).unwrap();
    ctx[root].set_storage(Some(buf.storage_at(usize::MAX - 15)));
    let before = bytes(&buf);
    assert!(matches!(
        view_init(&mut ctx, v).unwrap_err(),
        BackendError::OutOfBounds { .. }
    ));
    assert!(!ctx[v].has_storage());
    assert!(matches!(
        tensor_set(&ctx, v, 0, &[0xEE; 16]).unwrap_err(),
        BackendError::NotAllocated(_)
    ));
    // the root itself is refused at use, as it lies outside its buffer
    assert!(matches!(
        tensor_set(&ctx, root, 0, &[0xEE; 4]).unwrap_err(),
        BackendError::OutOfBounds { .. }
    ));
    assert_eq!(bytes(&buf), before);
    // still usable: a root placed properly gets a working view
    ctx[root].set_storage(None);
    let root2 = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    let v2 = ctx.view_1d(root2, 4, 48).unwrap();
    tensor_alloc(&mut ctx, &buf, root2, 64).unwrap();
    view_init(&mut ctx, v2).unwrap();
    tensor_set(&ctx, v2, 0, &[0x22; 16]).unwrap();
    let after = bytes(&buf);
    assert_eq!(&after[32..64], &[0x11; 32]);
    assert_eq!(&after[112..128], &[0x22; 16]);
}

/// Every data call and placement at and around its bounds: 0, the exact end, one past it and
/// values near `usize::MAX` (where an unchecked `offset + size` would wrap).
#[test]
fn data_calls_and_placement_at_their_bounds() {
    let (mut ctx, buf, t) = setup(128); // t: 32 bytes at offset 32
    let n = 32usize;
    let before = bytes(&buf);
    let huge = [
        usize::MAX,
        usize::MAX - 1,
        usize::MAX - n + 1,
        usize::MAX / 2 + 1,
    ];
    // (offset, size, in range)
    let mut cases = vec![
        (0, n, true),
        (n - 1, 1, true),
        (n, 0, true),
        (0, 0, true),
        (n, 1, false),
        (n - 1, 2, false),
        (0, n + 1, false),
    ];
    for h in huge {
        cases.push((h, 1, false));
        cases.push((h, 0, true)); // empty: nothing to do, accepted
        cases.push((1, h, false));
    }
    for (offset, size, ok) in cases {
        let r = tensor_memset(&ctx, t, 0, offset, size);
        assert_eq!(r.is_ok(), ok, "memset {offset} {size}: {r:?}");
        if size <= n + 1 {
            let r = tensor_set(&ctx, t, offset, &vec![0; size]);
            assert_eq!(r.is_ok(), ok, "set {offset} {size}: {r:?}");
            let r = tensor_get(&ctx, t, offset, &mut vec![0; size]);
            assert_eq!(r.is_ok(), ok, "get {offset} {size}: {r:?}");
        }
    }
    // nothing written by a refused call (the accepted ones wrote zeros into t's 32 bytes)
    let after = bytes(&buf);
    assert_eq!(&after[..32], &before[..32]);
    assert_eq!(&after[64..], &before[64..]);

    // placement: aligned offsets up to the exact end fit, past it (or wrapping) do not
    let size = buf.size();
    for (offset, ok) in [
        (size - 32, true),
        (size, false),
        (size - 16, false),
        (usize::MAX - 31, false),
        (usize::MAX & !31, false),
    ] {
        let u = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
        let r = tensor_alloc(&mut ctx, &buf, u, offset);
        assert_eq!(r.is_ok(), ok, "alloc at {offset}: {r:?}");
        assert_eq!(ctx[u].has_storage(), ok);
    }
    // a tensor placed by hand past its buffer is refused at every use
    let w = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    ctx[w].set_storage(Some(buf.storage_at(usize::MAX - 7)));
    for r in [
        tensor_set(&ctx, w, 0, &[1; 4]),
        tensor_get(&ctx, w, 0, &mut [0; 4]),
        tensor_memset(&ctx, w, 1, 0, 4),
        tensor_copy(&ctx, w, t),
        tensor_copy(&ctx, t, w),
    ] {
        assert!(
            matches!(
                r,
                Err(BackendError::OutOfBounds {
                    what: "tensor storage",
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert_eq!(&bytes(&buf)[64..], &before[64..]);
}
