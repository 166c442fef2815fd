//! Test helpers: allocate every tensor of a context in one host buffer, fill tensors with
//! random values by their logical index, read them back as f64, and naive references.
#![allow(dead_code)]

use backend_core::{Buffer, tensor_alloc, tensor_get, tensor_set, view_init};
use graph::{Context, ElementType, Graph, TensorId};
use half::{bf16, f16};

pub use cpu_kernels::doc_support::host_buffer;

/// Small deterministic generator (xorshift64*).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Place every non-view tensor of `ctx` (32-byte aligned offsets) in one new host buffer and
/// initialise the views.
pub fn alloc_all(ctx: &mut Context) -> Buffer {
    let ids: Vec<TensorId> = ctx.ids().collect();
    let mut offs = Vec::new();
    let mut total = 0usize;
    for &id in &ids {
        let t = &ctx[id];
        if !t.is_view() && !t.has_storage() {
            let off = total.next_multiple_of(32);
            offs.push((id, off));
            total = off + t.nbytes().max(1);
        }
    }
    let buf = host_buffer(total.max(32));
    for (id, off) in offs {
        tensor_alloc(ctx, &buf, id, off).unwrap();
    }
    for &id in &ids {
        if ctx[id].is_view() && !ctx[id].has_storage() {
            view_init(ctx, id).unwrap();
        }
    }
    buf
}

fn raw(ctx: &Context, id: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[id].nbytes()];
    tensor_get(ctx, id, 0, &mut v).unwrap();
    v
}

fn index_iter(ne: [i64; 4]) -> impl Iterator<Item = [usize; 4]> {
    let ne = ne.map(|n| n as usize);
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
        })
    })
}

/// Logical elements of `id` (dimension 0 fastest), decoded by the test's own rules.
pub fn read(ctx: &Context, id: TensorId) -> Vec<f64> {
    let t = &ctx[id];
    let bytes = raw(ctx, id);
    let nb = t.nb();
    let ty = t.ty();
    let mut out = Vec::with_capacity(t.nelements() as usize);
    for [i0, i1, i2, i3] in index_iter(t.ne()) {
        let row = i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
        let v = match ty {
            ElementType::F32 => {
                let o = row + i0 * nb[0];
                f64::from(f32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()))
            }
            ElementType::I32 => {
                let o = row + i0 * nb[0];
                f64::from(i32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()))
            }
            ElementType::F16 => {
                let o = row + i0 * nb[0];
                f64::from(f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32())
            }
            ElementType::BF16 => {
                let o = row + i0 * nb[0];
                f64::from(bf16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32())
            }
            ElementType::Q8_0 => {
                let b = row + (i0 / 32) * 34;
                let d = f16::from_le_bytes([bytes[b], bytes[b + 1]]).to_f32() as f64;
                d * f64::from(bytes[b + 2 + i0 % 32] as i8)
            }
            ElementType::Q4_0 => {
                let b = row + (i0 / 32) * 18;
                let d = f16::from_le_bytes([bytes[b], bytes[b + 1]]).to_f32() as f64;
                let j = i0 % 32;
                let byte = bytes[b + 2 + j % 16];
                let q = if j < 16 { byte & 15 } else { byte >> 4 };
                d * (f64::from(q) - 8.0)
            }
            ElementType::Q4_1 => {
                let b = row + (i0 / 32) * 20;
                let d = f16::from_le_bytes([bytes[b], bytes[b + 1]]).to_f32();
                let m = f16::from_le_bytes([bytes[b + 2], bytes[b + 3]]).to_f32();
                let j = i0 % 32;
                let byte = bytes[b + 4 + j % 16];
                let q = if j < 16 { byte & 15 } else { byte >> 4 };
                f64::from(q) * f64::from(d) + f64::from(m)
            }
            other => panic!("read: {other}"),
        };
        out.push(v);
    }
    out
}

/// Fill contiguous tensor `id` with values `f(k)` by logical index `k` (random blocks for
/// quantized types, ignoring `f`).
pub fn fill(ctx: &Context, id: TensorId, rng: &mut Rng) {
    let t = &ctx[id];
    assert!(t.is_contiguous());
    let n = t.nelements() as usize;
    let bytes: Vec<u8> = match t.ty() {
        ElementType::F32 => (0..n).flat_map(|_| rng.f().to_le_bytes()).collect(),
        ElementType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.f()).to_le_bytes())
            .collect(),
        ElementType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.f()).to_le_bytes())
            .collect(),
        ElementType::Q8_0 | ElementType::Q4_0 | ElementType::Q4_1 => {
            let bs = t.ty().type_size();
            let q4_1 = t.ty() == ElementType::Q4_1;
            let mut v = Vec::new();
            for _ in 0..n / 32 {
                let d = f16::from_f32(0.01 + 0.02 * rng.f().abs());
                v.extend_from_slice(&d.to_le_bytes());
                if q4_1 {
                    // The minimum: a block's values span [m, m + 15 d].
                    v.extend_from_slice(&f16::from_f32(-0.15 * rng.f().abs()).to_le_bytes());
                }
                for _ in 0..bs - if q4_1 { 4 } else { 2 } {
                    v.push((rng.next_u64() >> 32) as u8);
                }
            }
            v
        }
        other => panic!("fill: {other}"),
    };
    tensor_set(ctx, id, 0, &bytes).unwrap();
}

/// Write i32 values into a contiguous i32 tensor.
pub fn set_i32(ctx: &Context, id: TensorId, vals: &[i32]) {
    let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor_set(ctx, id, 0, &b).unwrap();
}

/// Write f32 values into a contiguous f32 tensor.
pub fn set_f32(ctx: &Context, id: TensorId, vals: &[f32]) {
    let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor_set(ctx, id, 0, &b).unwrap();
}

/// Normalised mean squared error of `out` against `reference`.
pub fn nmse(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "length");
    let mut err = 0.0;
    let mut norm = 0.0;
    for (&o, &r) in out.iter().zip(reference) {
        assert!(
            o.is_finite() == r.is_finite(),
            "finite mismatch: {o} vs {r}"
        );
        if r.is_finite() {
            err += (o - r) * (o - r);
            norm += r * r;
        }
    }
    if norm == 0.0 { err } else { err / norm }
}

/// Assert NMSE ≤ `tol`, with a message.
#[track_caller]
pub fn check(what: &str, out: &[f64], reference: &[f64], tol: f64) {
    let e = nmse(out, reference);
    assert!(e <= tol, "{what}: NMSE {e:e} > {tol:e}");
}

/// Build a graph for `out`, compute it with `n_threads`, return the raw result bytes.
pub fn compute(ctx: &Context, g: &Graph, n_threads: usize) {
    let cpu = cpu_kernels::CpuCompute::new(n_threads);
    let st = cpu.compute(ctx, g.as_view(), None).unwrap();
    assert_eq!(st, backend_core::ComputeStatus::Success);
}

/// Raw bytes of a tensor (for bit-exact comparisons).
pub fn bytes(ctx: &Context, id: TensorId) -> Vec<u8> {
    raw(ctx, id)
}

/// Logical linear index of `[i0, i1, i2, i3]` in extents `ne`.
pub fn lin(ne: [i64; 4], i: [usize; 4]) -> usize {
    let ne = ne.map(|n| n as usize);
    ((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0]
}

/// Every index of extents `ne`, dimension 0 fastest.
pub fn indices(ne: [i64; 4]) -> Vec<[usize; 4]> {
    index_iter(ne).collect()
}
