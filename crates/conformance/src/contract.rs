//! Buffer, tensor, backend and event contract checks.
//!
//! Each check builds its own tensors, runs one part of the contract documented in
//! `backend_core` (and in ggml's `ggml-backend.cpp`), and compares with values written in the
//! check itself. Nothing here knows how the backend works inside.

use std::sync::OnceLock;

use backend_core::{
    Backend, BackendError, Buffer, BufferType, BufferUsage, Device, tensor_alloc, tensor_copy,
    tensor_copy_async, tensor_get, tensor_get_vec, tensor_memset, tensor_set, tensor_set_slice,
};
use graph::{Context, ElementType, Graph, TensorId};
use test_device::{TestDevice, TestDeviceConfig};

use crate::report::Report;

type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A device whose memory is neither the host's nor the backend's: copies to and from it must
/// take the staged fallback path.
fn foreign_device() -> Result<Device, String> {
    static FOREIGN: OnceLock<Device> = OnceLock::new();
    if let Some(d) = FOREIGN.get() {
        return Ok(d.clone());
    }
    let d = TestDevice::create(TestDeviceConfig::named("CONFORMANCE-FOREIGN")).map_err(s)?;
    Ok(FOREIGN.get_or_init(|| d).clone())
}

/// `n` raw bytes as a 1-d I8 tensor placed at `offset` of `buf`.
fn bytes_tensor(
    ctx: &mut Context,
    buf: &Buffer,
    n: usize,
    offset: usize,
) -> Result<TensorId, String> {
    let t = ctx.new_tensor_1d(ElementType::I8, n as i64).map_err(s)?;
    tensor_alloc(ctx, buf, t, offset).map_err(s)?;
    Ok(t)
}

fn read(ctx: &Context, t: TensorId) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).map_err(s)?;
    Ok(v)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn up(x: usize, a: usize) -> usize {
    x.next_multiple_of(a.max(1))
}

/// Run every contract check on `backend`. `host` is a backend whose default buffer type is
/// host memory (the CPU backend): it is the other side of host↔device copies and is only
/// read from, never checked.
///
/// ```
/// use test_device::{TestDevice, TestDeviceConfig};
/// let dev = TestDevice::create(TestDeviceConfig::named("D").max_buffer_size(1 << 20))?;
/// let backend = dev.init_backend("")?;
/// // Without a host backend at hand, the host copy checks are skipped.
/// let report = conformance::check_contract(&backend, None);
/// report.assert_passed();
/// # Ok::<(), backend_core::BackendError>(())
/// ```
pub fn check_contract(backend: &Backend, host: Option<&Backend>) -> Report {
    let mut r = Report::default();
    let buft = backend.default_buffer_type();
    r.push("device/props", device_props(backend));
    r.push("buffer/alignment", alignment(&buft));
    if buft.is_host() {
        r.push("buffer/host-pointer", host_pointer(&buft));
    } else {
        r.skip("buffer/host-pointer", "the buffer type is not host memory");
    }
    r.push("buffer/size-0", size_zero(&buft));
    if buft.max_size() == usize::MAX {
        r.skip("buffer/max-size", "unbounded");
    } else {
        r.push("buffer/max-size", max_size(&buft));
    }
    r.push("buffer/alloc-size", alloc_size(&buft));
    r.push("buffer/clear", clear(&buft));
    r.push("buffer/usage", usage(&buft));
    r.push("buffer/multi", multi(&buft));
    r.push("tensor/set-get-memset", set_get(&buft));
    r.push("tensor/bounds", bounds(&buft));
    r.push("tensor/copy-same-type", copy_same_type(&buft));
    r.push("tensor/copy-layout-mismatch", copy_layout_mismatch(&buft));
    match foreign_device() {
        Ok(f) => r.push(
            "tensor/copy-fallback",
            copy_between(&buft, &f.buffer_type()),
        ),
        Err(e) => r.push("tensor/copy-fallback", Err(e)),
    }
    match host {
        Some(h) if h.default_buffer_type().is_host() => {
            r.push(
                "tensor/copy-host",
                copy_between(&buft, &h.default_buffer_type()),
            );
            r.push("backend/copy-async-from-host", copy_async_from(backend, h));
        }
        _ => {
            r.skip("tensor/copy-host", "no host backend given");
            r.skip("backend/copy-async-from-host", "no host backend given");
        }
    }
    r.push("backend/async-set-get", async_set_get(backend));
    let name = "backend/compute-completes-before-synchronize";
    match compute_async(backend) {
        Ok(true) => r.push(name, Ok(())),
        Ok(false) => r.skip(
            name,
            "none of SCALE, ADD, MUL, CPY, DUP is supported on a contiguous F32 vector",
        ),
        Err(e) => r.push(name, Err(e)),
    }
    if backend.device().caps().events {
        r.push("events/record-synchronize", event_record_sync(backend));
        r.push("events/wait-orders-streams", event_wait(backend));
        r.push("events/device-mismatch", event_mismatch(backend));
    } else {
        for n in [
            "events/record-synchronize",
            "events/wait-orders-streams",
            "events/device-mismatch",
        ] {
            r.skip(n, "device has no events");
        }
    }
    r
}

fn device_props(backend: &Backend) -> Check {
    let dev = backend.device();
    let props = dev.props();
    ensure!(!props.name.is_empty(), "device name is empty");
    ensure!(
        props.memory_free <= props.memory_total,
        "free memory {} > total {}",
        props.memory_free,
        props.memory_total
    );
    let buft = dev.buffer_type();
    ensure!(
        dev.supports_buft(&buft),
        "device does not support its own buffer type"
    );
    if let Some(d) = buft.device() {
        ensure!(
            d == dev,
            "buffer type's device is {} not {}",
            d.name(),
            dev.name()
        );
    }
    ensure!(
        backend.device() == dev,
        "backend device changed between calls"
    );
    Ok(())
}

fn alignment(buft: &BufferType) -> Check {
    let a = buft.alignment();
    ensure!(a.is_power_of_two(), "alignment {a} is not a power of two");
    for size in [1usize, 13, 4096, 3 * a + 5] {
        if size > buft.max_size() {
            continue;
        }
        let buf = buft.alloc_buffer(size).map_err(s)?;
        ensure!(
            buf.size() == size,
            "asked {size} bytes, buffer has {}",
            buf.size()
        );
        if let Some(p) = buf.host_ptr() {
            ensure!(
                (p.as_ptr() as usize).is_multiple_of(a),
                "host base {:p} not aligned to {a}",
                p.as_ptr()
            );
        } else if buf.base_address() != 0 {
            ensure!(
                buf.base_address().is_multiple_of(a as u64),
                "base address {:#x} not aligned to {a}",
                buf.base_address()
            );
        }
    }
    // Tensors at every aligned offset fit; a misaligned one is refused.
    let buf = buft.alloc_buffer(4 * a).map_err(s)?;
    let mut ctx = Context::new();
    for k in 0..4 {
        bytes_tensor(&mut ctx, &buf, 1, k * a)?;
    }
    if a > 1 {
        let t = ctx.new_tensor_1d(ElementType::I8, 1).map_err(s)?;
        match tensor_alloc(&mut ctx, &buf, t, 1) {
            Err(BackendError::Misaligned { .. }) => {}
            other => {
                return Err(format!(
                    "offset 1 with alignment {a}: expected Misaligned, got {other:?}"
                ));
            }
        }
    }
    Ok(())
}

fn size_zero(buft: &BufferType) -> Check {
    let b = buft.alloc_buffer(0).map_err(s)?;
    ensure!(b.size() == 0, "size-0 buffer has size {}", b.size());
    b.clear(7).map_err(s)?;
    ensure!(b.host_ptr().is_none(), "size-0 buffer has a host pointer");
    ensure!(
        b.buffer_type() == buft,
        "size-0 buffer has another buffer type"
    );
    Ok(())
}

fn max_size(buft: &BufferType) -> Check {
    let max = buft.max_size();
    match buft.alloc_buffer(max.saturating_add(1)) {
        Err(BackendError::TooLarge { .. }) => Ok(()),
        other => Err(format!(
            "alloc of max+1 = {}: expected TooLarge, got {other:?}",
            max.saturating_add(1)
        )),
    }
}

fn alloc_size(buft: &BufferType) -> Check {
    let mut ctx = Context::new();
    let ts = [
        ctx.new_tensor_2d(ElementType::F32, 7, 3).map_err(s)?,
        ctx.new_tensor_1d(ElementType::F16, 64).map_err(s)?,
        ctx.new_tensor_2d(ElementType::Q4_0, 64, 2).map_err(s)?,
        ctx.new_tensor_1d(ElementType::F32, 0).map_err(s)?,
    ];
    for t in ts {
        let (need, n) = (buft.alloc_size(&ctx[t]), ctx[t].nbytes());
        ensure!(need >= n, "alloc size {need} < nbytes {n}");
    }
    Ok(())
}

fn clear(buft: &BufferType) -> Check {
    let buf = buft.alloc_buffer(4096).map_err(s)?;
    let mut ctx = Context::new();
    let all = bytes_tensor(&mut ctx, &buf, 4096, 0)?;
    for v in [0x5Au8, 0] {
        buf.clear(v).map_err(s)?;
        ensure!(
            read(&ctx, all)?.iter().all(|&b| b == v),
            "clear({v:#x}) left other bytes"
        );
    }
    Ok(())
}

fn usage(buft: &BufferType) -> Check {
    let buf = buft.alloc_buffer(64).map_err(s)?;
    ensure!(
        buf.usage() == BufferUsage::Any,
        "new buffer usage is {:?}",
        buf.usage()
    );
    for u in [BufferUsage::Weights, BufferUsage::Compute, BufferUsage::Any] {
        buf.set_usage(u);
        ensure!(buf.usage() == u, "usage {:?} did not stick", u);
    }
    Ok(())
}

fn multi(buft: &BufferType) -> Check {
    let a = buft.alignment();
    let (p0, p1) = (
        buft.alloc_buffer(2 * a).map_err(s)?,
        buft.alloc_buffer(3 * a).map_err(s)?,
    );
    let mut ctx = Context::new();
    let t0 = bytes_tensor(&mut ctx, &p0, 2 * a, 0)?;
    let t1 = bytes_tensor(&mut ctx, &p1, 3 * a, 0)?;
    let m = Buffer::multi(vec![p0.clone(), p1.clone()]).ok_or("multi of two buffers is None")?;
    ensure!(
        m.is_multi() && m.parts().len() == 2,
        "not a two-part multi-buffer"
    );
    ensure!(m.size() == 5 * a, "multi size {} != {}", m.size(), 5 * a);
    m.set_usage(BufferUsage::Weights);
    ensure!(
        p0.usage() == BufferUsage::Weights && p1.usage() == BufferUsage::Weights,
        "usage did not reach the parts"
    );
    m.clear(0x3C).map_err(s)?;
    for t in [t0, t1] {
        ensure!(
            read(&ctx, t)?.iter().all(|&b| b == 0x3C),
            "clear did not reach every part"
        );
    }
    let t = ctx.new_tensor_1d(ElementType::I8, 1).map_err(s)?;
    let r = tensor_alloc(&mut ctx, &m, t, 0);
    ensure!(
        matches!(r, Err(BackendError::Unsupported { .. })),
        "placing a tensor in a multi-buffer: {r:?}, expected Unsupported"
    );
    ensure!(
        Buffer::multi(Vec::new()).is_none(),
        "multi of nothing is Some"
    );
    Ok(())
}

fn set_get(buft: &BufferType) -> Check {
    let buf = buft
        .alloc_buffer(up(300, buft.alignment()) + 300)
        .map_err(s)?;
    let mut ctx = Context::new();
    let t = bytes_tensor(&mut ctx, &buf, 300, up(300, buft.alignment()))?;
    let mut want = pattern(300, 1);
    tensor_set(&ctx, t, 0, &want).map_err(s)?;
    ensure!(read(&ctx, t)? == want, "full set/get round trip differs");
    let part = pattern(50, 99);
    tensor_set(&ctx, t, 100, &part).map_err(s)?;
    want[100..150].copy_from_slice(&part);
    tensor_memset(&ctx, t, 0xEE, 290, 10).map_err(s)?;
    want[290..].fill(0xEE);
    ensure!(read(&ctx, t)? == want, "partial set + memset differ");
    let mut mid = [0u8; 7];
    tensor_get(&ctx, t, 147, &mut mid).map_err(s)?;
    ensure!(mid[..] == want[147..154], "partial get differs");
    Ok(())
}

fn bounds(buft: &BufferType) -> Check {
    let buf = buft.alloc_buffer(64).map_err(s)?;
    let mut ctx = Context::new();
    let t = bytes_tensor(&mut ctx, &buf, 16, 0)?;
    let before = pattern(16, 5);
    tensor_set(&ctx, t, 0, &before).map_err(s)?;
    let oob = |r: Result<(), BackendError>, what: &str| match r {
        Err(BackendError::OutOfBounds { .. }) => Ok(()),
        other => Err(format!("{what}: expected OutOfBounds, got {other:?}")),
    };
    oob(tensor_set(&ctx, t, 15, &[0, 0]), "set past the end")?;
    oob(tensor_set(&ctx, t, usize::MAX, &[0]), "set at usize::MAX")?;
    oob(tensor_get(&ctx, t, 10, &mut [0u8; 7]), "get past the end")?;
    oob(tensor_memset(&ctx, t, 1, 16, 1), "memset past the end")?;
    ensure!(
        read(&ctx, t)? == before,
        "a refused call changed the tensor"
    );
    let unplaced = ctx.new_tensor_1d(ElementType::I8, 4).map_err(s)?;
    match tensor_set(&ctx, unplaced, 0, &[1]) {
        Err(BackendError::NotAllocated(_)) => Ok(()),
        other => Err(format!(
            "set on an unallocated tensor: expected NotAllocated, got {other:?}"
        )),
    }
}

fn copy_same_type(buft: &BufferType) -> Check {
    let a = buft.alignment();
    let b1 = buft.alloc_buffer(2 * up(64, a)).map_err(s)?;
    let b2 = buft.alloc_buffer(up(64, a)).map_err(s)?;
    let mut ctx = Context::new();
    let x = bytes_tensor(&mut ctx, &b1, 64, 0)?;
    let y = bytes_tensor(&mut ctx, &b1, 64, up(64, a))?;
    let z = bytes_tensor(&mut ctx, &b2, 64, 0)?;
    let p = pattern(64, 3);
    tensor_set(&ctx, x, 0, &p).map_err(s)?;
    tensor_copy(&ctx, x, y).map_err(s)?;
    ensure!(read(&ctx, y)? == p, "copy within one buffer differs");
    tensor_copy(&ctx, y, z).map_err(s)?;
    ensure!(
        read(&ctx, z)? == p,
        "copy between two buffers of the type differs"
    );
    Ok(())
}

fn copy_layout_mismatch(buft: &BufferType) -> Check {
    let buf = buft.alloc_buffer(up(64, buft.alignment()) * 2).map_err(s)?;
    let mut ctx = Context::new();
    let x = bytes_tensor(&mut ctx, &buf, 64, 0)?;
    let y = bytes_tensor(&mut ctx, &buf, 32, up(64, buft.alignment()))?;
    match tensor_copy(&ctx, x, y) {
        Err(BackendError::LayoutMismatch { .. }) => Ok(()),
        other => Err(format!("expected LayoutMismatch, got {other:?}")),
    }
}

/// Copies both ways between `buft` and `other` (host memory or a foreign device).
fn copy_between(buft: &BufferType, other: &BufferType) -> Check {
    let mine = buft.alloc_buffer(up(96, buft.alignment())).map_err(s)?;
    let theirs = other.alloc_buffer(up(96, other.alignment())).map_err(s)?;
    let mut ctx = Context::new();
    let x = bytes_tensor(&mut ctx, &mine, 96, 0)?;
    let y = bytes_tensor(&mut ctx, &theirs, 96, 0)?;
    let p = pattern(96, 11);
    tensor_set(&ctx, x, 0, &p).map_err(s)?;
    tensor_copy(&ctx, x, y).map_err(s)?;
    ensure!(read(&ctx, y)? == p, "copy to {} differs", other.name());
    let q = pattern(96, 77);
    tensor_set(&ctx, y, 0, &q).map_err(s)?;
    tensor_copy(&ctx, y, x).map_err(s)?;
    ensure!(read(&ctx, x)? == q, "copy from {} differs", other.name());
    Ok(())
}

fn copy_async_from(backend: &Backend, host: &Backend) -> Check {
    let mine = backend.alloc_buffer(256).map_err(s)?;
    let theirs = host.alloc_buffer(256).map_err(s)?;
    let mut ctx = Context::new();
    let h = bytes_tensor(&mut ctx, &theirs, 200, 0)?;
    let d = bytes_tensor(&mut ctx, &mine, 200, 0)?;
    let p = pattern(200, 21);
    tensor_set(&ctx, h, 0, &p).map_err(s)?;
    tensor_copy_async(&ctx, host, backend, h, d).map_err(s)?;
    backend.synchronize().map_err(s)?;
    ensure!(
        read(&ctx, d)? == p,
        "async host→device copy differs after synchronize"
    );
    Ok(())
}

fn async_set_get(backend: &Backend) -> Check {
    let a = backend.alignment();
    let n = 32usize;
    let buf = backend.alloc_buffer(n * up(48, a)).map_err(s)?;
    let mut ctx = Context::new();
    let ts: Vec<TensorId> = (0..n)
        .map(|i| bytes_tensor(&mut ctx, &buf, 48, i * up(48, a)))
        .collect::<Result<_, _>>()?;
    for round in 0..3u8 {
        for (i, &t) in ts.iter().enumerate() {
            backend
                .tensor_set_async(&ctx, t, 0, &pattern(48, i as u8 ^ round))
                .map_err(s)?;
        }
        backend.synchronize().map_err(s)?;
        for (i, &t) in ts.iter().enumerate() {
            ensure!(
                read(&ctx, t)? == pattern(48, i as u8 ^ round),
                "async set {i} of round {round} not complete after synchronize"
            );
        }
    }
    // An async get sees the async sets queued before it.
    backend
        .tensor_set_async(&ctx, ts[0], 0, &[0xC3; 48])
        .map_err(s)?;
    let mut out = [0u8; 48];
    backend
        .tensor_get_async(&ctx, ts[0], 0, &mut out)
        .map_err(s)?;
    backend.synchronize().map_err(s)?;
    ensure!(
        out == [0xC3; 48],
        "async get did not see the async set queued before it"
    );
    Ok(())
}

/// The ops the asynchronous-compute check can chain, each giving `factor · x`: the first
/// one the backend supports is used, so a backend without SCALE is still checked.
#[derive(Clone, Copy, Debug)]
enum Chain {
    /// `scale(y, 2)`.
    Scale,
    /// `y + y`.
    Add,
    /// `y * two`, `two` an input of 2s.
    Mul,
    /// `cpy(y, fresh)`.
    Cpy,
    /// `dup(y)`.
    Dup,
}

impl Chain {
    const ALL: [Chain; 5] = [Chain::Scale, Chain::Add, Chain::Mul, Chain::Cpy, Chain::Dup];

    /// What one link multiplies by.
    fn factor(self) -> f32 {
        match self {
            Chain::Scale | Chain::Add | Chain::Mul => 2.0,
            Chain::Cpy | Chain::Dup => 1.0,
        }
    }

    fn link(self, ctx: &mut Context, y: TensorId, two: TensorId) -> Result<TensorId, String> {
        match self {
            Chain::Scale => ctx.scale(y, 2.0),
            Chain::Add => ctx.add(y, y),
            Chain::Mul => ctx.mul(y, two),
            Chain::Cpy => {
                let fresh = ctx.new_tensor_1d(ElementType::F32, 64).map_err(s)?;
                ctx.cpy(y, fresh)
            }
            Chain::Dup => ctx.dup(y),
        }
        .map_err(s)
    }
}

/// y = eight links of the first supported [`Chain`] op over x, computed asynchronously, with
/// new input values every round: `factor⁸ · x` once synchronize returns. `Ok(false)` when the
/// backend supports none of them.
fn compute_async(backend: &Backend) -> Result<bool, String> {
    for kind in Chain::ALL {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_1d(ElementType::F32, 64).map_err(s)?;
        let two = ctx.new_tensor_1d(ElementType::F32, 64).map_err(s)?;
        let mut y = x;
        let mut chain = Vec::new();
        for _ in 0..8 {
            y = kind.link(&mut ctx, y, two)?;
            chain.push(y);
        }
        if chain.iter().all(|&t| backend.supports_op(&ctx, t)) {
            compute_chain(backend, ctx, x, two, y, kind)?;
            return Ok(true);
        }
    }
    Ok(false)
}

fn compute_chain(
    backend: &Backend,
    mut ctx: Context,
    x: TensorId,
    two: TensorId,
    y: TensorId,
    kind: Chain,
) -> Check {
    let mut g = Graph::new(32);
    g.build_forward_expand(&mut ctx, y).map_err(s)?;
    let _buf = crate::ops::place_graph(&mut ctx, &g, backend)?;
    let f = kind.factor().powi(8);
    if matches!(kind, Chain::Mul) {
        tensor_set_slice(&ctx, two, &[2.0f32; 64]).map_err(s)?;
    }
    for round in 0..4 {
        let xs: Vec<f32> = (0..64).map(|i| (i - 20 + 100 * round) as f32).collect();
        tensor_set_slice(&ctx, x, &xs).map_err(s)?;
        backend.graph_compute_async(&ctx, g.as_view()).map_err(s)?;
        backend.synchronize().map_err(s)?;
        let out = tensor_get_vec::<f32>(&ctx, y).map_err(s)?;
        for (i, &v) in out.iter().enumerate() {
            ensure!(
                v == xs[i] * f,
                "{kind:?} chain, round {round}: y[{i}] = {v}, want {}",
                xs[i] * f
            );
        }
    }
    Ok(())
}

/// A host buffer type's buffers have a host pointer: `is_host()` is the promise that others
/// may read and write the bytes directly, which they do through `host_ptr()`.
fn host_pointer(buft: &BufferType) -> Check {
    let buf = buft.alloc_buffer(64).map_err(s)?;
    ensure!(
        buf.host_ptr().is_some(),
        "buffer type {} says is_host() but its 64-byte buffer has no host_ptr(): host memory \
         must be reachable through a host pointer",
        buft.name()
    );
    Ok(())
}

fn event_record_sync(backend: &Backend) -> Check {
    let ev = backend.device().event_new().map_err(s)?;
    ev.synchronize()
        .map_err(|e| format!("never-recorded event: {e}"))?;
    let buf = backend.alloc_buffer(1024).map_err(s)?;
    let mut ctx = Context::new();
    let t = bytes_tensor(&mut ctx, &buf, 1000, 0)?;
    for round in 0..8u8 {
        backend
            .tensor_set_async(&ctx, t, 0, &pattern(1000, round))
            .map_err(s)?;
        backend.event_record(&ev).map_err(s)?;
        ev.synchronize().map_err(s)?;
        ensure!(
            read(&ctx, t)? == pattern(1000, round),
            "work recorded before the event was not done after Event::synchronize"
        );
    }
    backend.synchronize().map_err(s)?;
    Ok(())
}

fn event_wait(backend: &Backend) -> Check {
    let dev = backend.device();
    let other = dev
        .init_backend("")
        .map_err(|e| format!("second backend for the wait check: {e}"))?;
    let ev = dev.event_new().map_err(s)?;
    let a = backend.alignment();
    let buf = backend.alloc_buffer(2 * up(4096, a)).map_err(s)?;
    let mut ctx = Context::new();
    let x = bytes_tensor(&mut ctx, &buf, 4096, 0)?;
    let y = bytes_tensor(&mut ctx, &buf, 4096, up(4096, a))?;
    for round in 0..16u8 {
        backend
            .tensor_set_async(&ctx, x, 0, &pattern(4096, round))
            .map_err(s)?;
        backend.event_record(&ev).map_err(s)?;
        other.event_wait(&ev).map_err(s)?;
        // Queued on `other` only: ordered after `x` was written by the event alone.
        tensor_copy_async(&ctx, &other, &other, x, y).map_err(s)?;
        other.synchronize().map_err(s)?;
        ensure!(
            read(&ctx, y)? == pattern(4096, round),
            "round {round}: work after event_wait ran before the recorded work"
        );
    }
    backend.synchronize().map_err(s)?;
    Ok(())
}

fn event_mismatch(backend: &Backend) -> Check {
    let foreign = foreign_device()?;
    if foreign == backend.device() {
        return Ok(());
    }
    let ev = foreign.event_new().map_err(s)?;
    match backend.event_record(&ev) {
        Err(BackendError::EventDeviceMismatch { .. }) => Ok(()),
        other => Err(format!(
            "recording another device's event: expected EventDeviceMismatch, got {other:?}"
        )),
    }
}
