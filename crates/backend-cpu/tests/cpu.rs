//! The CPU backend's buffers, host memory, device, registry and backend object. Expected
//! bytes are worked out by hand in each test.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::*;
use backend_cpu::*;
use graph::{Context, ElementType, GraphView, TensorId};

fn read(ctx: &Context, t: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).unwrap();
    v
}

#[test]
fn every_allocation_is_64_aligned_and_zeroed() {
    let buft = cpu_buffer_type();
    assert_eq!(buft.alignment(), 64);
    assert_eq!(ALIGNMENT, 64);
    assert!(buft.is_host());
    assert_eq!(buft.device(), Some(cpu_device()));
    let sizes: &[usize] = if cfg!(miri) {
        &[1, 65]
    } else {
        &[1, 3, 64, 65, 4096, 1 << 20]
    };
    for &size in sizes {
        let b = buft.alloc_buffer(size).unwrap();
        assert_eq!(b.size(), size);
        let p = b.host_ptr().unwrap().as_ptr() as usize;
        assert_eq!(p % 64, 0, "size {size}");
        assert_eq!(b.base_address(), p as u64);
        let mut ctx = Context::new();
        let t = ctx.new_tensor_1d(ElementType::I8, size as i64).unwrap();
        tensor_alloc(&mut ctx, &b, t, 0).unwrap();
        assert!(read(&ctx, t).iter().all(|&x| x == 0));
    }
    let empty = buft.alloc_buffer(0).unwrap();
    assert_eq!(empty.size(), 0);
    empty.clear(3).unwrap();
}

#[test]
fn impossible_sizes_are_typed_errors() {
    let buft = cpu_buffer_type();
    assert!(matches!(
        buft.alloc_buffer(usize::MAX),
        Err(BackendError::TooLarge { .. })
    ));
}

#[test]
fn clear_memset_set_get_round_trip() {
    let mut ctx = Context::new();
    let buf = cpu_buffer_type().alloc_buffer(256).unwrap();
    let t = ctx.new_tensor_2d(ElementType::F32, 4, 4).unwrap(); // 64 bytes
    tensor_alloc(&mut ctx, &buf, t, 128).unwrap();
    buf.clear(0xAA).unwrap();
    assert_eq!(read(&ctx, t), vec![0xAA; 64]);
    let data: Vec<u8> = (0..16).collect();
    tensor_set(&ctx, t, 8, &data).unwrap();
    tensor_memset(&ctx, t, 0x01, 60, 4).unwrap();
    let mut want = vec![0xAA; 64];
    want[8..24].copy_from_slice(&data);
    want[60..].fill(1);
    assert_eq!(read(&ctx, t), want);
    // the bytes around the tensor are untouched
    let mut whole = Context::new();
    let all = whole.new_tensor_1d(ElementType::I8, 256).unwrap();
    tensor_alloc(&mut whole, &buf, all, 0).unwrap();
    let bytes = read(&whole, all);
    assert!(bytes[..128].iter().chain(&bytes[192..]).all(|&b| b == 0xAA));
    assert_eq!(&bytes[128..192], &want[..]);
}

#[test]
fn misuse_is_refused_and_changes_nothing() {
    let mut ctx = Context::new();
    let buf = cpu_buffer_type().alloc_buffer(128).unwrap();
    let t = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    assert_eq!(
        tensor_alloc(&mut ctx, &buf, t, 32).unwrap_err(),
        BackendError::Misaligned {
            offset: 32,
            alignment: 64
        }
    );
    assert!(matches!(
        tensor_alloc(&mut ctx, &buf, t, 128),
        Err(BackendError::OutOfBounds { .. })
    ));
    tensor_alloc(&mut ctx, &buf, t, 64).unwrap();
    tensor_set(&ctx, t, 0, &[9; 16]).unwrap();
    assert!(matches!(
        tensor_set(&ctx, t, 1, &[0; 16]),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(matches!(
        tensor_memset(&ctx, t, 0, 16, 1),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(matches!(
        tensor_get(&ctx, t, 8, &mut [0; 9]),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert_eq!(read(&ctx, t), vec![9; 16]);
    let other = ctx.new_tensor_1d(ElementType::F32, 5).unwrap();
    tensor_alloc(&mut ctx, &buf, other, 0).unwrap();
    assert_eq!(
        tensor_copy(&ctx, t, other).unwrap_err(),
        BackendError::LayoutMismatch { src: t, dst: other }
    );
    let v = ctx.view_1d(other, 2, 4).unwrap();
    assert!(
        ctx[v].has_storage(),
        "a view of an allocated tensor has storage at once"
    );
    let lone = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let lv = ctx.view_1d(lone, 2, 0).unwrap();
    assert_eq!(
        view_init(&mut ctx, lv).unwrap_err(),
        BackendError::ViewSourceNotAllocated(lv)
    );
}

#[test]
fn copies_between_and_within_cpu_buffers() {
    let mut ctx = Context::new();
    let buft = cpu_buffer_type();
    let b1 = buft.alloc_buffer(256).unwrap();
    let b2 = buft.alloc_buffer(256).unwrap();
    let a = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    let b = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    let c = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    tensor_alloc(&mut ctx, &b1, a, 0).unwrap();
    tensor_alloc(&mut ctx, &b2, b, 64).unwrap();
    tensor_alloc(&mut ctx, &b1, c, 128).unwrap();
    let data: Vec<u8> = (0..64).collect();
    tensor_set(&ctx, a, 0, &data).unwrap();
    tensor_copy(&ctx, a, b).unwrap();
    assert_eq!(read(&ctx, b), data);
    tensor_copy(&ctx, a, c).unwrap(); // same buffer
    assert_eq!(read(&ctx, c), data);
    // overlapping views in one buffer: a memmove, like copying bytes one by one backwards
    let lo = ctx.view_1d(a, 32, 0).unwrap();
    let hi = ctx.view_1d(a, 32, 16).unwrap();
    tensor_copy(&ctx, lo, hi).unwrap();
    let mut want = data.clone();
    let head: Vec<u8> = data[0..32].to_vec();
    want[16..48].copy_from_slice(&head);
    assert_eq!(read(&ctx, a), want);
    // the buffer's own fast path (what backend-core falls back to when src is not host)
    let bi = b2.implementation().unwrap();
    tensor_memset(&ctx, b, 0, 0, 64).unwrap();
    assert!(bi.cpy_tensor(&ctx[c], &ctx[b]).unwrap());
    assert_eq!(read(&ctx, b), data);
}

struct DropFlag {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
    drops: Arc<AtomicUsize>,
}
impl DropFlag {
    /// `len` bytes starting at a 64-aligned address inside an over-allocated vector.
    fn new(len: usize, fill: u8, drops: Arc<AtomicUsize>) -> Self {
        let bytes = vec![fill; len + 64];
        let start = bytes.as_ptr().align_offset(64);
        DropFlag {
            bytes,
            start,
            len,
            drops,
        }
    }
}
impl AsRef<[u8]> for DropFlag {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}
impl AsMut<[u8]> for DropFlag {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn host_memory_is_kept_alive_and_never_freed_by_us() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = HostMemory::read_write(DropFlag::new(128, 5, drops.clone()));
    let buf = cpu_device().buffer_from_host_memory(mem, 128).unwrap();
    assert_eq!(buf.name(), CPU_MAPPED_BUFFER_TYPE_NAME);
    assert!(buf.is_host() && buf.is_writable());
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 64).unwrap();
    assert_eq!(read(&ctx, t), vec![5; 64]);
    tensor_set(&ctx, t, 0, &[1, 2]).unwrap();
    drop(buf);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "the tensor still uses the memory"
    );
    assert_eq!(&read(&ctx, t)[..3], &[1, 2, 5]);
    drop(ctx);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "the owner's Drop ran exactly once"
    );
}

#[test]
fn read_only_host_memory_reads_but_refuses_writes() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = HostMemory::read_only(DropFlag::new(64, 7, drops.clone()));
    let buf = cpu_device().buffer_from_host_memory(mem, 64).unwrap();
    assert!(!buf.is_writable());
    let mut ctx = Context::new();
    let t = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    tensor_alloc(&mut ctx, &buf, t, 0).unwrap();
    assert_eq!(read(&ctx, t), vec![7; 64]);
    let ro = BackendError::ReadOnly {
        buffer: CPU_MAPPED_BUFFER_TYPE_NAME.into(),
    };
    assert_eq!(tensor_set(&ctx, t, 0, &[1]).unwrap_err(), ro);
    assert_eq!(tensor_memset(&ctx, t, 1, 0, 1).unwrap_err(), ro);
    assert_eq!(buf.clear(0).unwrap_err(), ro);
    let w = cpu_buffer_type().alloc_buffer(64).unwrap();
    let u = ctx.new_tensor_1d(ElementType::I8, 64).unwrap();
    tensor_alloc(&mut ctx, &w, u, 0).unwrap();
    assert_eq!(tensor_copy(&ctx, u, t).unwrap_err(), ro);
    tensor_copy(&ctx, t, u).unwrap();
    assert_eq!(read(&ctx, u), vec![7; 64]);
    assert_eq!(read(&ctx, t), vec![7; 64]);
    drop((buf, ctx));
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn computing_into_read_only_memory_is_refused_before_anything_runs() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = HostMemory::read_only(DropFlag::new(64, 7, drops));
    let ro_buf = cpu_device().buffer_from_host_memory(mem, 64).unwrap();
    let w = cpu_buffer_type().alloc_buffer(128).unwrap();
    let mut ctx = Context::new();
    let weights = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    tensor_alloc(&mut ctx, &ro_buf, weights, 0).unwrap();
    let x = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    tensor_alloc(&mut ctx, &w, x, 0).unwrap();
    tensor_set(&ctx, x, 0, &[0u8; 64]).unwrap();
    // a CPY into (a view of) the read-only weights, and an in-place add over them
    let cpy = ctx.cpy(x, weights).unwrap();
    let add = ctx.add_inplace(weights, x).unwrap();
    let backend = backend_cpu::init().unwrap();
    for node in [cpy, add] {
        let mut g = graph::Graph::new(8);
        g.build_forward_expand(&mut ctx, node).unwrap();
        let err = backend.graph_compute(&ctx, g.as_view()).unwrap_err();
        assert!(matches!(err, BackendError::ReadOnly { .. }), "{err:?}");
        assert_eq!(read(&ctx, weights), vec![7; 64], "nothing was written");
    }
    // computing *from* read-only memory is fine
    let y = ctx.scale(weights, 1.0).unwrap();
    tensor_alloc(&mut ctx, &w, y, 64).unwrap();
    let mut g = graph::Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    backend.graph_compute(&ctx, g.as_view()).unwrap();
    assert_eq!(read(&ctx, y), read(&ctx, weights));
}

#[test]
fn misaligned_host_memory_is_refused() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut owner = DropFlag::new(64, 0, drops);
    owner.start += 1;
    owner.len -= 1;
    let err = cpu_device()
        .buffer_from_host_memory(HostMemory::read_only(owner), 0)
        .unwrap_err();
    assert!(matches!(
        err,
        BackendError::Misaligned {
            alignment: backend_cpu::MAPPED_ALIGNMENT,
            ..
        }
    ));
    let empty = cpu_device()
        .buffer_from_host_memory(HostMemory::read_only(Vec::new()), 0)
        .unwrap();
    assert_eq!(empty.size(), 0);
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot mmap files")]
fn memory_mapped_weights_file() {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!("backend-cpu-mmap-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: the file is private to this test and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    let buf = cpu_device()
        .buffer_from_host_memory(HostMemory::read_only(map), 4096)
        .unwrap();
    buf.set_usage(BufferUsage::Weights);
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::I8, 64, 64).unwrap();
    tensor_alloc(&mut ctx, &buf, w, 0).unwrap();
    assert_eq!(read(&ctx, w), data);
    assert!(matches!(
        tensor_set(&ctx, w, 0, &[0]),
        Err(BackendError::ReadOnly { .. })
    ));
    assert_eq!(
        storage_usage(ctx[w].storage().unwrap()),
        Some(BufferUsage::Weights)
    );
    drop((ctx, buf));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn device_and_registry() {
    let dev = cpu_device();
    assert_eq!(dev.name(), "CPU");
    assert_eq!(dev.device_type(), DeviceType::Cpu);
    assert!(!dev.description().is_empty());
    let props = dev.props();
    assert!(props.memory_free <= props.memory_total);
    if !cfg!(miri) && std::path::Path::new("/proc/meminfo").exists() {
        assert!(props.memory_total > 0);
    }
    assert!(props.caps.buffer_from_host_memory);
    assert!(!props.caps.events);
    assert!(dev.host_buffer_type().is_none());
    assert!(dev.supports_buft(&cpu_buffer_type()));
    assert!(dev.supports_buft(&cpu_mapped_buffer_type()));
    assert_eq!(dev.buffer_type(), cpu_buffer_type());
    assert!(matches!(
        dev.event_new(),
        Err(BackendError::Unsupported { .. })
    ));
    assert!(register() || !register());
    assert!(!register(), "registration is idempotent");
    let g = GlobalRegistry::get();
    assert_eq!(g.device_by_name("cpu").unwrap(), dev);
    assert_eq!(g.device_by_type(DeviceType::Cpu), Some(dev.clone()));
    assert_eq!(g.find_registry("CPU").unwrap(), cpu_registry());
    assert_eq!(
        g.find_registry("Vulkan").err(),
        Some(BackendError::not_found("registry", "Vulkan"))
    );
    assert_eq!(
        g.registries().iter().filter(|r| r.name() == "CPU").count(),
        1
    );
    let best = g.init_best().unwrap();
    assert_eq!(best.device(), dev);
    let set: Arc<SetNThreads> = cpu_registry()
        .extension_as::<SetNThreads>(EXT_SET_N_THREADS)
        .unwrap();
    set(&best, 3).unwrap();
    assert_eq!(CpuBackend::from_backend(&best).unwrap().n_threads(), 3);
}

#[test]
fn backend_params_threads_and_identity() {
    let dev = cpu_device();
    let b = dev.init_backend("n_threads=3").unwrap();
    assert_eq!(b.name(), "CPU");
    assert_eq!(b.guid(), CPU_GUID);
    assert_eq!(b.alignment(), 64);
    let cpu = CpuBackend::from_backend(&b).unwrap();
    assert_eq!(cpu.n_threads(), 3);
    cpu.set_n_threads(0);
    assert_eq!(cpu.n_threads(), 1);
    assert_eq!(CpuBackend::new().n_threads(), default_n_threads());
    for bad in ["n_threads=0", "n_threads=x", "threads=2"] {
        assert!(matches!(
            dev.init_backend(bad),
            Err(BackendError::InvalidParams { .. })
        ));
    }
}

#[test]
fn graph_compute_runs_view_ops_and_names_an_unsupported_op() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ElementType::F32, 4, 4).unwrap();
    let t = ctx.transpose(a).unwrap();
    let r = ctx.reshape(a, &[16]).unwrap();
    // the kernels add f32 only: an f16 ADD is not supported
    let h = ctx.new_tensor_2d(ElementType::F16, 4, 4).unwrap();
    let s = ctx.add(h, h).unwrap();
    let buf = cpu_buffer_type().alloc_buffer(256).unwrap();
    tensor_alloc(&mut ctx, &buf, a, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, h, 64).unwrap();
    tensor_alloc(&mut ctx, &buf, s, 128).unwrap();
    let b = init().unwrap();
    assert!(b.supports_op(&ctx, a));
    assert!(b.supports_op(&ctx, t));
    assert!(!b.supports_op(&ctx, s));
    let views = [t, r];
    assert_eq!(
        b.graph_compute(&ctx, GraphView::new(&views, &[])).unwrap(),
        ComputeStatus::Success
    );
    let nodes = [t, s, r];
    let err = b
        .graph_compute(&ctx, GraphView::new(&nodes, &[]))
        .unwrap_err();
    assert!(
        matches!(err, BackendError::UnsupportedOp { op: "ADD", tensor, .. } if tensor == s),
        "{err:?}"
    );
    // plans: same behaviour, settings captured at creation
    let mut plan = b
        .graph_plan_create(&ctx, GraphView::new(&views, &[]))
        .unwrap();
    b.graph_plan_update(&mut *plan, &ctx, GraphView::new(&views, &[]))
        .unwrap();
    assert_eq!(
        b.graph_plan_compute(&mut *plan, &ctx, GraphView::new(&views, &[]))
            .unwrap(),
        ComputeStatus::Success
    );
    b.graph_plan_free(plan);
}

#[test]
fn abort_callback_stops_between_nodes_and_the_next_compute_works() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let s = ctx.add(a, a).unwrap();
    let u = ctx.scale(s, 3.0).unwrap();
    let buf = cpu_buffer_type().alloc_buffer(192).unwrap();
    for (i, t) in [a, s, u].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 64 * i).unwrap();
    }
    let ones: Vec<u8> = [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor_set(&ctx, a, 0, &ones).unwrap();
    let b = init().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    CpuBackend::from_backend(&b)
        .unwrap()
        .set_abort_callback(Some(Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst) >= 1
        })));
    // the callback lets the first node run and stops before the second
    let nodes = [s, u];
    assert_eq!(
        b.graph_compute(&ctx, GraphView::new(&nodes, &[])).unwrap(),
        ComputeStatus::Aborted
    );
    let f32s = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    assert_eq!(f32s(read(&ctx, s)), vec![2.0; 4], "the first node ran");
    assert_eq!(f32s(read(&ctx, u)), vec![0.0; 4], "the second did not");
    CpuBackend::from_backend(&b)
        .unwrap()
        .set_abort_callback(None);
    assert_eq!(
        b.graph_compute(&ctx, GraphView::new(&nodes, &[])).unwrap(),
        ComputeStatus::Success
    );
    assert_eq!(f32s(read(&ctx, u)), vec![6.0; 4]);
}
