//! The executor: runs one node at a time, splitting its work over the pool.
//!
//! Work is cut into units (row chunks for elementwise ops, rows for row-wise ops, row blocks
//! for matrix products); a node whose total work is below [`MIN_WORK`] runs on the calling
//! thread alone, so tiny ops pay no synchronisation. Thin matrix products, which stream
//! their weights from DRAM, give each thread a contiguous range of row blocks (with
//! stealing, see [`Exec::par_for_contiguous`]) so each core reads one sequential stream. Every unit reads its sources into
//! per-thread f32 scratch, computes there, and stores the result, which makes in-place ops and
//! any strides correct by construction.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use backend_core::BackendError;
use graph::{Context, ElementType, Op, TensorId, UnaryOp};
use parking_lot::Mutex;

use crate::mem::{MatF32, TView, gemm_f32};
use crate::pool::Pool;
use crate::quant::{self, F32_ROWS, ROWS};
use crate::{hdot, qdot, sgemm};

/// Work (roughly: elements touched, or multiply-adds) below which a node runs on one thread.
pub(crate) const MIN_WORK: usize = if cfg!(miri) { 64 } else { 32 * 1024 };
/// Chunks of units per thread that [`Exec::par_for`] aims for.
const CHUNKS_PER_THREAD: usize = 8;
/// Chunks per thread in [`Exec::par_for_contiguous`]: small, so that the last stolen chunk
/// is short; claims stay cheap (one compare-and-swap each) and in order.
const STREAM_CHUNKS_PER_THREAD: usize = 32;
/// Elements per unit of elementwise work.
const ROW_CHUNK: usize = 4096;
/// Rows of the weight matrix per unit in the dot-product matrix path.
const MM_ROWS: usize = 16;
// A unit of the dot path is one group of the repacked q4_0 layout.
const _: () = assert!(MM_ROWS == crate::repack::GROUP_ROWS);
/// Columns of `src1` from which the blocked gemm path is used (not for q4_0 weights; for
/// f32 weights from [`F32_GEMM_MIN_N`]).
const GEMM_MIN_N: usize = 16;
/// Columns of `src1` from which f32 weights take the tiled dot path (`mul_mat_tiles_f32`).
const F32_TILE_MIN_N: usize = 4;
/// Columns of `src1` from which f32 weights take the gemm path instead of the tiles: on the
/// development machine (one thread, 4096×4096 weights) the tiles took 0.6× the gemm's time
/// at 32 columns and 0.74× at 64, the gemm 0.85× the tiles' at 96 and 0.66× at 128.
const F32_GEMM_MIN_N: usize = 80;
/// Floats of all columns' slices that one pass of `mul_mat_tiles_f32` keeps in L2 (the
/// pass length is this divided by the column count, within 256..=1024 floats).
const TILE_COL_FLOATS: usize = 32 * 1024;
/// Columns of `src1` a q4_0 dot call takes at once (see `quant::dot_q4_0_q8_0_rows`).
const Q4_COLS: usize = 4;
/// Floats of dequantized weights a thread keeps for one gemm call.
const GEMM_PANEL_FLOATS: usize = 2 * 1024 * 1024;

/// Per-thread scratch vectors.
#[derive(Default, Debug)]
pub(crate) struct ThreadScratch {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    bytes: Vec<u8>,
}

/// Scratch memory reused across computes: one set per thread plus a shared area.
#[derive(Debug)]
pub(crate) struct Scratch {
    thread: Vec<Mutex<ThreadScratch>>,
    shared_f32: Vec<f32>,
    shared_u8: Vec<u8>,
    /// The work-stealing ranges of a streamed run, one per thread (kept so a run does not
    /// allocate).
    ranges: Vec<AtomicU64>,
}

impl Scratch {
    pub fn new(n_threads: usize) -> Scratch {
        Scratch {
            thread: (0..n_threads.max(1)).map(|_| Mutex::default()).collect(),
            shared_f32: Vec::new(),
            shared_u8: Vec::new(),
            ranges: (0..n_threads.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Give every thread's scratch the largest length any thread's has reached. Which thread
    /// takes which work unit varies from run to run, so without this a thread could meet a
    /// size for the first time (and allocate) long after the others settled; evened out at
    /// the start of each compute, a size seen once by any thread is held by all from the next
    /// compute on. Cost: one uncontended lock per thread per compute.
    pub fn even_out(&mut self) {
        let mut most = [0usize; 4];
        for t in &mut self.thread {
            let t = t.get_mut();
            for (m, len) in most
                .iter_mut()
                .zip([t.a.len(), t.b.len(), t.c.len(), t.bytes.len()])
            {
                *m = (*m).max(len);
            }
        }
        for t in &mut self.thread {
            let t = t.get_mut();
            grow(&mut t.a, most[0]);
            grow(&mut t.b, most[1]);
            grow(&mut t.c, most[2]);
            grow(&mut t.bytes, most[3]);
        }
    }

    /// Bytes currently held (for diagnostics and tests of reuse).
    pub fn capacity_bytes(&self) -> usize {
        let t: usize = self
            .thread
            .iter()
            .map(|m| {
                let s = m.lock();
                (s.a.capacity() + s.b.capacity() + s.c.capacity()) * 4 + s.bytes.capacity()
            })
            .sum();
        t + self.shared_f32.capacity() * 4 + self.shared_u8.capacity()
    }
}

fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

#[inline]
fn unravel(r: usize, ne: [usize; 4]) -> (usize, usize, usize) {
    (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]))
}

fn unsupported(ctx: &Context, id: TensorId) -> BackendError {
    BackendError::UnsupportedOp {
        backend: "CPU".to_owned(),
        op: ctx[id].op().name(),
        tensor: id,
    }
}

/// One compute: the pool, the thread count to use, and the scratch.
pub(crate) struct Exec<'a> {
    pub pool: &'a Pool,
    pub n_threads: usize,
    pub scratch: &'a mut Scratch,
    /// Where buffers' bytes are, when not at their host pointers.
    pub resolver: Option<&'a dyn crate::MemoryResolver>,
}

impl Exec<'_> {
    /// Run `f(units, scratch)` over `0..n_units` on as many threads as the work justifies.
    ///
    /// Units are handed out in chunks from a shared counter rather than split in fixed halves:
    /// on a loaded machine one thread may be descheduled for a while, and a static split then
    /// left the other spinning at the end of every op. A unit's result does not depend on
    /// which thread computes it, so results stay bit-identical for any thread count.
    fn par_for<F>(&self, n_units: usize, unit_cost: usize, f: F) -> Result<(), BackendError>
    where
        F: Fn(Range<usize>, &mut ThreadScratch) -> Result<(), BackendError> + Sync,
    {
        if n_units == 0 {
            return Ok(());
        }
        let total = n_units.saturating_mul(unit_cost.max(1));
        let nth = (total / MIN_WORK)
            .clamp(1, self.n_threads.min(self.pool.n_threads()))
            .min(n_units)
            .min(self.scratch.thread.len());
        // Indexing: `Scratch::new` makes at least one thread slot, `nth <= thread.len()`
        // (clamped above) and the pool hands out `ith < nth`.
        let thread = &self.scratch.thread;
        if nth <= 1 {
            return f(0..n_units, &mut thread[0].lock());
        }
        // Chunks: several per thread (so a late thread finds work left), none smaller than
        // MIN_WORK / 4 of work (so claiming stays cheap next to computing).
        let min_units = (MIN_WORK / 4).div_ceil(unit_cost.max(1)).max(1);
        let chunk = n_units.div_ceil(nth * CHUNKS_PER_THREAD).max(min_units);
        let next = AtomicUsize::new(0);
        let err: Mutex<Option<BackendError>> = Mutex::new(None);
        self.pool.run(nth, &|ith| {
            let mut ts = thread[ith].lock();
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n_units {
                    return;
                }
                if let Err(e) = f(start..(start + chunk).min(n_units), &mut ts) {
                    err.lock().get_or_insert(e);
                    // Stop handing out work: the op failed.
                    next.store(n_units, Ordering::Relaxed);
                    return;
                }
            }
        });
        match err.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Exec::par_for`] for work that streams through memory (the thin matrix products):
    /// thread `t` owns the contiguous units `t·n/nth .. (t+1)·n/nth` and claims them in small
    /// chunks from the front, in order, so each core reads its part of the weights as one
    /// sequential stream and the cores never interleave over the same region; a thread whose
    /// range is used up steals chunks from the back of the others' ranges, so a thread
    /// descheduled on a loaded machine does not hold up the op. Claiming is one
    /// compare-and-swap per chunk on the owner's range. As for `par_for`, a unit's result
    /// does not depend on which thread computes it.
    fn par_for_contiguous<F>(
        &self,
        n_units: usize,
        unit_cost: usize,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: Fn(Range<usize>, &mut ThreadScratch) -> Result<(), BackendError> + Sync,
    {
        let total = n_units.saturating_mul(unit_cost.max(1));
        let nth = (total / MIN_WORK)
            .clamp(1, self.n_threads.min(self.pool.n_threads()))
            .min(n_units)
            .min(self.scratch.thread.len());
        if nth <= 1 || u32::try_from(n_units).is_err() {
            return self.par_for(n_units, unit_cost, f);
        }
        let thread = &self.scratch.thread;
        let min_units = (MIN_WORK / 4).div_ceil(unit_cost.max(1)).max(1);
        let chunk = n_units
            .div_ceil(nth * STREAM_CHUNKS_PER_THREAD)
            .max(min_units);
        let pack = |lo: usize, hi: usize| lo as u64 | (hi as u64) << 32;
        // `ranges` has one slot per scratch thread and `nth <= thread.len()` (as in par_for);
        // `victim < nth` by the modulo below.
        let ranges = &self.scratch.ranges[..nth];
        for (t, r) in ranges.iter().enumerate() {
            r.store(
                pack(t * n_units / nth, (t + 1) * n_units / nth),
                Ordering::Relaxed,
            );
        }
        // Take `chunk` units from the front (owner) or the back (thief) of a range.
        let claim = |r: &AtomicU64, front: bool| -> Option<Range<usize>> {
            let mut v = r.load(Ordering::Relaxed);
            loop {
                let (lo, hi) = ((v & 0xffff_ffff) as usize, (v >> 32) as usize);
                if lo >= hi {
                    return None;
                }
                let (got, new) = if front {
                    let e = (lo + chunk).min(hi);
                    (lo..e, pack(e, hi))
                } else {
                    let s = hi.saturating_sub(chunk).max(lo);
                    (s..hi, pack(lo, s))
                };
                match r.compare_exchange_weak(v, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(got),
                    Err(x) => v = x,
                }
            }
        };
        let err: Mutex<Option<BackendError>> = Mutex::new(None);
        self.pool.run(nth, &|ith| {
            let mut ts = thread[ith].lock();
            let order = (0..nth).map(|o| (ith + o) % nth);
            for (o, victim) in order.enumerate() {
                while let Some(units) = claim(&ranges[victim], o == 0) {
                    if let Err(e) = f(units, &mut ts) {
                        err.lock().get_or_insert(e);
                        // Stop handing out work: the op failed.
                        ranges.iter().for_each(|r| r.store(0, Ordering::Relaxed));
                        return;
                    }
                }
            }
        });
        match err.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Compute one node (nothing for views, NONE and empty tensors).
    pub fn node(&mut self, ctx: &Context, id: TensorId) -> Result<(), BackendError> {
        let t = ctx.get(id)?;
        let op = t.op();
        if op == Op::None || op.is_view_op() || t.nelements() == 0 {
            return Ok(());
        }
        if !crate::supports_op(ctx, id) {
            return Err(unsupported(ctx, id));
        }
        let resolver = self.resolver;
        let dst = TView::resolve(ctx, id, resolver)?;
        let src = |i: usize| -> Result<TView, BackendError> {
            let s = t.src(i).ok_or_else(|| unsupported(ctx, id))?;
            TView::resolve(ctx, s, resolver)
        };
        let p = *t.op_params();
        match op {
            Op::Add | Op::Sub | Op::Mul | Op::Div => self.binary(op, &dst, &src(0)?, &src(1)?),
            Op::Sqr => self.map(&dst, &src(0)?, |x| x * x),
            Op::Sqrt => self.map(&dst, &src(0)?, f32::sqrt),
            Op::Scale => {
                let s = p.f32(0);
                self.map(&dst, &src(0)?, move |x| x * s)
            }
            Op::Unary(u) => {
                let a = src(0)?;
                match u {
                    UnaryOp::Abs => self.map(&dst, &a, f32::abs),
                    UnaryOp::Neg => self.map(&dst, &a, |x| -x),
                    UnaryOp::Tanh => self.map(&dst, &a, f32::tanh),
                    UnaryOp::Relu => self.map(&dst, &a, |x| if x > 0.0 { x } else { 0.0 }),
                    UnaryOp::Sigmoid => self.map(&dst, &a, |x| 1.0 / (1.0 + (-x).exp())),
                    UnaryOp::Gelu => self.map(&dst, &a, gelu_tanh),
                    UnaryOp::Silu => self.map_slice(&dst, &a, crate::gexp::silu_slice),
                    UnaryOp::Exp => self.map(&dst, &a, f32::exp),
                    UnaryOp::GeluErf => self.map_slice(&dst, &a, crate::math::gelu_erf_slice),
                    _ => Err(unsupported(ctx, id)),
                }
            }
            Op::Norm => self.norm(&dst, &src(0)?, p.f32(0), false),
            Op::RmsNorm => self.norm(&dst, &src(0)?, p.f32(0), true),
            Op::SoftMax => {
                let mask = match t.src(1) {
                    Some(m) => Some(TView::resolve(ctx, m, resolver)?),
                    None => None,
                };
                self.soft_max(&dst, &src(0)?, mask.as_ref(), p.f32(0), p.f32(1))
            }
            Op::Rope => self.rope(&dst, &src(0)?, &src(1)?, &p),
            Op::GetRows => self.get_rows(&dst, &src(0)?, &src(1)?),
            Op::MulMat => {
                let packed = t.src(0).map(|s| crate::repack::layout(ctx, s))
                    == Some(crate::repack::Layout::Repacked);
                self.mul_mat(&dst, &src(0)?, &src(1)?, packed)
            }
            Op::Cpy | Op::Dup | Op::Cont => self.copy(&dst, &src(0)?),
            _ => Err(unsupported(ctx, id)),
        }
    }

    fn binary(&self, op: Op, dst: &TView, a: &TView, b: &TView) -> Result<(), BackendError> {
        let ne0 = dst.ne[0];
        let nch = ne0.div_ceil(ROW_CHUNK);
        let f: fn(f32, f32) -> f32 = match op {
            Op::Add => |x, y| x + y,
            Op::Sub => |x, y| x - y,
            Op::Mul => |x, y| x * y,
            _ => |x, y| x / y,
        };
        // Direct path: dense f32 rows, no broadcast along dim 0, and the result either apart
        // from both sources or exactly one of them (in place). Anything else (partial
        // overlap, strides) goes through scratch. Both compute the same f32 operations.
        // Indexing: `supports_op` checked `b.can_repeat(a)` with `a` the shape of `dst`, which is
        // not empty here, so every `b.ne[d]` is non-zero (the modulos below) and divides
        // `a.ne[d]`; `xb` holds `nb0` elements.
        let dense = |t: &TView| t.nb[0] == 4;
        let a_in = dst.same_elements(a);
        let b_in = dst.same_elements(b);
        let direct = dense(dst)
            && dense(a)
            && dense(b)
            && b.ne[0] == ne0
            && (a_in || !a.overlaps(dst))
            && (b_in || !b.overlaps(dst));
        self.par_for(dst.nrows() * nch, ne0.min(ROW_CHUNK), |units, ts| {
            for u in units {
                let (row, c) = (u / nch, u % nch);
                let i0 = c * ROW_CHUNK;
                let len = ROW_CHUNK.min(ne0 - i0);
                let (i1, i2, i3) = unravel(row, dst.ne);
                let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
                if direct && binary_direct(op, dst, a, b, [i0, i1, i2, i3], [j1, j2, j3], len) {
                    continue;
                }
                let xa = grow(&mut ts.a, len);
                a.load_f32(i0, i1, i2, i3, xa);
                if b.ne[0] == ne0 {
                    let xb = grow(&mut ts.b, len);
                    b.load_f32(i0, j1, j2, j3, xb);
                    for (x, &y) in xa.iter_mut().zip(xb.iter()) {
                        *x = f(*x, y);
                    }
                } else {
                    let nb0 = b.ne[0];
                    let xb = grow(&mut ts.b, nb0);
                    b.load_f32(0, j1, j2, j3, xb);
                    for (k, x) in xa.iter_mut().enumerate() {
                        *x = f(*x, xb[(i0 + k) % nb0]);
                    }
                }
                dst.store_f32(i0, i1, i2, i3, xa);
            }
            Ok(())
        })
    }

    fn map<F: Fn(f32) -> f32 + Sync>(
        &self,
        dst: &TView,
        a: &TView,
        f: F,
    ) -> Result<(), BackendError> {
        self.map_slice(dst, a, |x: &mut [f32]| {
            for v in x.iter_mut() {
                *v = f(*v);
            }
        })
    }

    /// Apply `f` to chunks of rows in place (f sees up to ROW_CHUNK elements at a time).
    fn map_slice<F: Fn(&mut [f32]) + Sync>(
        &self,
        dst: &TView,
        a: &TView,
        f: F,
    ) -> Result<(), BackendError> {
        let ne0 = dst.ne[0];
        let nch = ne0.div_ceil(ROW_CHUNK);
        self.par_for(dst.nrows() * nch, ne0.min(ROW_CHUNK), |units, ts| {
            for u in units {
                let (row, c) = (u / nch, u % nch);
                let i0 = c * ROW_CHUNK;
                let len = ROW_CHUNK.min(ne0 - i0);
                let (i1, i2, i3) = unravel(row, dst.ne);
                let x = grow(&mut ts.a, len);
                a.load_f32(i0, i1, i2, i3, x);
                f(x);
                dst.store_f32(i0, i1, i2, i3, x);
            }
            Ok(())
        })
    }

    fn norm(&self, dst: &TView, a: &TView, eps: f32, rms: bool) -> Result<(), BackendError> {
        let ne0 = dst.ne[0];
        self.par_for(dst.nrows(), ne0, |rows, ts| {
            for r in rows {
                let (i1, i2, i3) = unravel(r, dst.ne);
                let x = grow(&mut ts.a, ne0);
                a.load_f32(0, i1, i2, i3, x);
                if rms {
                    // ggml squares in f32 and sums the rounded squares in f64.
                    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
                    let mean = (sum / ne0 as f64) as f32;
                    let s = 1.0 / (mean + eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= s);
                } else {
                    let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
                    let mean = (sum / ne0 as f64) as f32;
                    let mut sum2 = 0.0f64;
                    for v in x.iter_mut() {
                        *v -= mean;
                        sum2 += f64::from(*v) * f64::from(*v);
                    }
                    let var = (sum2 / ne0 as f64) as f32;
                    let s = 1.0 / (var + eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= s);
                }
                dst.store_f32(0, i1, i2, i3, x);
            }
            Ok(())
        })
    }

    fn soft_max(
        &self,
        dst: &TView,
        a: &TView,
        mask: Option<&TView>,
        scale: f32,
        max_bias: f32,
    ) -> Result<(), BackendError> {
        let ne0 = dst.ne[0];
        let n_head = a.ne[2] as u32;
        let n_head_log2 = if n_head == 0 {
            1
        } else {
            1u32 << n_head.ilog2()
        };
        let m0 = 2.0f32.powf(-max_bias / n_head_log2 as f32);
        let m1 = 2.0f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
        self.par_for(dst.nrows(), ne0 * 4, |rows, ts| {
            for r in rows {
                let (i1, i2, i3) = unravel(r, dst.ne);
                let slope = if max_bias > 0.0 {
                    let h = i2 as u32;
                    if h < n_head_log2 {
                        m0.powi(h as i32 + 1)
                    } else {
                        m1.powi(2 * (h - n_head_log2) as i32 + 1)
                    }
                } else {
                    1.0
                };
                let x = grow(&mut ts.a, ne0);
                a.load_f32(0, i1, i2, i3, x);
                let mv = match mask {
                    Some(m) => {
                        // `supports_op`: the mask's ne0 is ne0, its ne1 at least a's, and its
                        // ne2 and ne3 are non-zero divisors of a's (the modulos).
                        let mv = grow(&mut ts.b, ne0);
                        m.load_f32(0, i1, i2 % m.ne[2], i3 % m.ne[3], mv);
                        Some(&*mv)
                    }
                    None => None,
                };
                crate::gexp::soft_max_row(x, mv, scale, slope);
                dst.store_f32(0, i1, i2, i3, x);
            }
            Ok(())
        })
    }

    fn rope(
        &self,
        dst: &TView,
        a: &TView,
        pos: &TView,
        p: &graph::OpParams,
    ) -> Result<(), BackendError> {
        let n_dims = p.i32(1) as usize;
        let mode = p.i32(2);
        let n_ctx_orig = p.i32(4);
        let (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow) =
            (p.f32(5), p.f32(6), p.f32(7), p.f32(8), p.f32(9), p.f32(10));
        let ne0 = dst.ne[0];
        if n_dims > ne0 || !n_dims.is_multiple_of(2) {
            return Err(BackendError::failed(
                "CPU",
                "rope: n_dims must be even and <= ne0",
            ));
        }
        let neox = mode & graph::rope_mode::NEOX != 0;
        let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
        let corr = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow);
        let ne1 = dst.ne[1];
        // Indexing: `cache` holds `n_dims` values and `x`, `y` hold `ne0 >= n_dims` (checked
        // above), so `i0 + 1 < n_dims` and `j1 < n_dims`; `supports_op` checked that `pos` has
        // at least `a.ne2` elements along dimension 0 and no empty dimension.
        // One unit per (i2, i3): all rows of one position share the sin/cos cache.
        self.par_for(dst.ne[2] * dst.ne[3], ne0 * ne1 * 2, |units, ts| {
            for u in units {
                let (i2, i3) = (u % dst.ne[2], u / dst.ne[2]);
                let position = pos.read_i32(i2, 0, 0, 0) as f32;
                let cache = grow(&mut ts.b, n_dims);
                let mut theta = position;
                for i0 in (0..n_dims).step_by(2) {
                    let (c, s) = rope_yarn(theta, freq_scale, corr, i0, ext_factor, attn_factor);
                    cache[i0] = c;
                    cache[i0 + 1] = s;
                    theta *= theta_scale;
                }
                for i1 in 0..ne1 {
                    let x = grow(&mut ts.a, ne0);
                    a.load_f32(0, i1, i2, i3, x);
                    let y = grow(&mut ts.c, ne0);
                    y.copy_from_slice(x);
                    for i0 in (0..n_dims).step_by(2) {
                        let (c, s) = (cache[i0], cache[i0 + 1]);
                        let (j0, j1) = if neox {
                            (i0 / 2, i0 / 2 + n_dims / 2)
                        } else {
                            (i0, i0 + 1)
                        };
                        let (x0, x1) = (x[j0], x[j1]);
                        if neox {
                            y[j0] = x0 * c - x1 * s;
                            y[j1] = x0 * s + x1 * c;
                        } else {
                            // ggml's build contracts `x0*cos - x1*sin` and `x0*sin + x1*cos`
                            // (vectorised, for adjacent pairs) into these fused forms: the
                            // first product is fused, the second rounded and added.
                            y[j0] = x0.mul_add(c, -(x1 * s));
                            y[j1] = x0.mul_add(s, x1 * c);
                        }
                    }
                    dst.store_f32(0, i1, i2, i3, y);
                }
            }
            Ok(())
        })
    }

    fn get_rows(&self, dst: &TView, a: &TView, rows: &TView) -> Result<(), BackendError> {
        if a.overlaps(dst) {
            return Err(BackendError::failed(
                "CPU",
                "get_rows: result overlaps its source",
            ));
        }
        let ne0 = dst.ne[0];
        // Indexing: `supports_op` checked `dst.ne == [a.ne0, rows.ne0, rows.ne1, rows.ne2]`,
        // `a.ne2 == rows.ne1` and `a.ne3 == rows.ne2`; the row index read is checked below.
        let n_src_rows = a.ne[1];
        self.par_for(dst.nrows(), ne0, |units, ts| {
            for u in units {
                let (i10, i11, i12) = unravel(u, dst.ne);
                let raw_r = rows.read_i32(i10, i11, i12, 0);
                let r = usize::try_from(raw_r)
                    .ok()
                    .filter(|&r| r < n_src_rows)
                    .ok_or_else(|| {
                        BackendError::out_of_bounds("get_rows index", raw_r as usize, 1, n_src_rows)
                    })?;
                match a.ty {
                    ElementType::I32 => {
                        dst.copy_raw_from([0, i10, i11, i12], a, [0, r, i11, i12], ne0)
                    }
                    ElementType::Q8_0 | ElementType::Q4_0 | ElementType::Q4_1 => {
                        let x = grow(&mut ts.a, ne0);
                        dequantize_row(a, r, i11, i12, x);
                        dst.store_f32(0, i10, i11, i12, x);
                    }
                    _ => {
                        let x = grow(&mut ts.a, ne0);
                        a.load_f32(0, r, i11, i12, x);
                        dst.store_f32(0, i10, i11, i12, x);
                    }
                }
            }
            Ok(())
        })
    }

    fn copy(&self, dst: &TView, a: &TView) -> Result<(), BackendError> {
        let ne0 = dst.ne[0];
        if dst.ty.is_quantized() {
            // Same extents (checked by supports_op): quantize row by row.
            let row_size = dst.ty.row_size(ne0);
            return self.par_for(dst.nrows(), ne0 * 4, |rows, ts| {
                for r in rows {
                    let (i1, i2, i3) = unravel(r, dst.ne);
                    let x = grow(&mut ts.a, ne0);
                    a.load_f32(0, i1, i2, i3, x);
                    let q = grow(&mut ts.bytes, row_size);
                    match dst.ty {
                        ElementType::Q8_0 => quant::quantize_q8_0(x, q),
                        ElementType::Q4_1 => qdot::quantize_q4_1(x, q),
                        _ => quant::quantize_q4_0(x, q),
                    }
                    dst.store_row_bytes(i1, i2, i3, q);
                }
                Ok(())
            });
        }
        let raw = a.ty == dst.ty;
        if a.ne == dst.ne {
            let nch = ne0.div_ceil(ROW_CHUNK);
            return self.par_for(dst.nrows() * nch, ne0.min(ROW_CHUNK), |units, ts| {
                for u in units {
                    let (row, c) = (u / nch, u % nch);
                    let i0 = c * ROW_CHUNK;
                    let len = ROW_CHUNK.min(ne0 - i0);
                    let (i1, i2, i3) = unravel(row, dst.ne);
                    if raw {
                        dst.copy_raw_from([i0, i1, i2, i3], a, [i0, i1, i2, i3], len);
                    } else {
                        let x = grow(&mut ts.a, len);
                        a.load_f32(i0, i1, i2, i3, x);
                        dst.store_f32(i0, i1, i2, i3, x);
                    }
                }
                Ok(())
            });
        }
        // Different extents, same element count: walk source rows, writing each at its linear
        // position in the destination (ggml's dup order).
        let ne00 = a.ne[0];
        self.par_for(a.nrows(), ne00, |rows, ts| {
            for r in rows {
                let (i1, i2, i3) = unravel(r, a.ne);
                let mut k = r * ne00; // linear index of the row's first element
                let mut done = 0;
                if !raw {
                    let x = grow(&mut ts.a, ne00);
                    a.load_f32(0, i1, i2, i3, x);
                }
                while done < ne00 {
                    let d0 = k % ne0;
                    let drow = k / ne0;
                    let (d1, d2, d3) = unravel(drow, dst.ne);
                    let n = (ne0 - d0).min(ne00 - done);
                    if raw {
                        dst.copy_raw_from([d0, d1, d2, d3], a, [done, i1, i2, i3], n);
                    } else {
                        dst.store_f32(d0, d1, d2, d3, &ts.a[done..done + n]);
                    }
                    done += n;
                    k += n;
                }
            }
            Ok(())
        })
    }

    /// `packed`: `a` is q4_0 in the interleaved layout of `repack` (groups of 16 rows).
    fn mul_mat(
        &mut self,
        dst: &TView,
        a: &TView,
        b: &TView,
        packed: bool,
    ) -> Result<(), BackendError> {
        if a.overlaps(dst) || b.overlaps(dst) {
            return Err(BackendError::failed(
                "CPU",
                "mul_mat: result overlaps a source",
            ));
        }
        let k = a.ne[0];
        let m = a.ne[1];
        let n = b.ne[1];
        if k == 0 {
            // every dot product is over no terms (the paths below split rows by `k`)
            let zeros = vec![0.0f32; dst.ne[0]];
            for i3 in 0..dst.ne[3] {
                for i2 in 0..dst.ne[2] {
                    for i1 in 0..dst.ne[1] {
                        dst.store_f32(0, i1, i2, i3, &zeros);
                    }
                }
            }
            return Ok(());
        }
        // Indexing: `supports_op` checked `a.ne2, a.ne3 > 0` dividing `b`'s and
        // `dst.ne == [m, n, b.ne2, b.ne3]`, so `i2 / r2 < a.ne2` and `i3 / r3 < a.ne3`. The
        // packed columns are `ncols` slices of `k` floats (or `col_bytes` bytes), sliced by
        // column indices `< ncols`; the products fit `usize` as they count elements (or
        // packed bytes, at most the f32 size) of `b`, whose byte size the graph checked.
        let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
        let n_batch = dst.ne[2] * dst.ne[3];
        // q4_0 weights always take the dot path: its kernel unpacks each block once for four
        // columns, and measured faster than dequantizing into the f32 gemm at every batch
        // up to 512 columns (2.5-3x at 32, 2x at 512).
        let gemm_min_n = if a.ty == ElementType::F32 {
            F32_GEMM_MIN_N
        } else {
            GEMM_MIN_N
        };
        // q4_1 likewise (and it has no dequantizing gemm path): its products follow ggml's
        // integer dots bit for bit (`qdot`).
        // f16 weights likewise: their products follow ggml's summation orders (`hdot`).
        let use_gemm = !cfg!(miri)
            && !matches!(
                a.ty,
                ElementType::Q4_0 | ElementType::Q4_1 | ElementType::F16
            )
            && n >= gemm_min_n
            && m >= 16
            && k >= 16;
        if use_gemm {
            if a.ty == ElementType::F32
                && let Some(kernel) = sgemm::Kernel::best()
                && dst.f32_matrix(0, 0).is_some()
                && a.f32_matrix(0, 0).is_some()
                && b.f32_matrix(0, 0).is_some()
            {
                return self.mul_mat_sgemm(kernel, dst, a, b, r2, r3);
            }
            return self.mul_mat_gemm(dst, a, b, r2, r3);
        }
        // Dot-product path: pack src1 columns once (f32, or q8_0 for quantized weights).
        let quantized = a.ty.is_quantized();
        let ncols = n * n_batch;
        // q4_0 rows read the column in `quant`'s own layout (f32 scales, precomputed
        // corrections), q8_0 rows as q8_0 blocks.
        let q4 = a.ty == ElementType::Q4_0;
        // q4_1 and (thin) q8_0 rows read the column as `qdot` packs it (ggml's x86 rule).
        let ggml_order = qdot_kind(a.ty);
        let col_bytes = if q4 {
            quant::q8_col_bytes(k)
        } else {
            qdot::col_bytes(k)
        };
        if quantized {
            // Disjoint fields of the scratch: the column buffer and the packed columns (no
            // copy of the column buffer, so a decode step does not allocate).
            let scratch = &mut *self.scratch;
            let tmp = grow(&mut scratch.thread[0].get_mut().a, k);
            let packed = grow(&mut scratch.shared_u8, ncols * col_bytes);
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                b.load_f32(0, j, i2, i3, tmp);
                let out = &mut packed[c * col_bytes..(c + 1) * col_bytes];
                if q4 {
                    quant::quantize_q8_col(tmp, out);
                } else if ncols > 1 {
                    qdot::quantize_col_wide(tmp, out);
                } else {
                    qdot::quantize_col(tmp, out);
                }
            }
        } else {
            let packed = grow(&mut self.scratch.shared_f32, ncols * k);
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                let col = &mut packed[c * k..(c + 1) * k];
                b.load_f32(0, j, i2, i3, col);
                round_to_weight_type(a.ty, col);
            }
        }
        let packed_f32 = &self.scratch.shared_f32[..if quantized { 0 } else { ncols * k }];
        let packed_q = &self.scratch.shared_u8[..if quantized { ncols * col_bytes } else { 0 }];
        let mblocks = m.div_ceil(MM_ROWS);
        let row_len = a.ty.row_size(k);
        let isa = quant::Isa::best();
        let tiled = a.ty == ElementType::F32 && n >= F32_TILE_MIN_N;
        let half_order = hdot::Order::for_shape(k, m, n);
        // Rows that follow each other in memory: the `qdot` kernels prefetch the next group.
        let qdot_prefetch = if a.nb[1] == a.ty.row_size(k) {
            ROWS * a.nb[1]
        } else {
            0
        };
        // The `bh` query heads that share one matrix of `a` (GQA: `r2` of them) go in one
        // unit, so that its rows are read (and for f16, converted) once for all of them: the
        // heads' columns are the consecutive packed columns `batch0 · n ..`, `nn` in all.
        let bh = if a.ne[2] * r2 == dst.ne[2] { r2 } else { 1 };
        let nn = bh * n;
        let this = &*self;
        if packed {
            let cols = PackedCols {
                bytes: packed_q,
                col_bytes,
                n,
                nn,
                bh,
            };
            return this.mul_mat_repacked(dst, a, &cols, r2, r3, isa);
        }
        this.par_for_contiguous(n_batch / bh * mblocks, MM_ROWS * k * nn, |units, ts| {
            for u in units {
                let (batch0, mb) = (u / mblocks * bh, u % mblocks);
                let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
                let (a2, a3) = (i2_0 / r2, i3 / r3);
                let rows = mb * MM_ROWS..((mb + 1) * MM_ROWS).min(m);
                let nr = rows.len();
                let out = grow(&mut ts.c, nr * nn);
                if tiled {
                    let rws: [&[f32]; MM_ROWS] =
                        f32_rows(a, |i| rows.start + i.min(nr - 1), a2, a3, &mut ts.a);
                    // One call per head: the tiles' slicing depends on the column count.
                    for h in 0..bh {
                        let batch = batch0 + h;
                        let cols = &packed_f32[batch * n * k..(batch + 1) * n * k];
                        mul_mat_tiles_f32(isa, &rws[..nr], cols, k, &mut out[h * n * nr..]);
                    }
                } else {
                    // Groups of weight rows share each column load (a short last group repeats
                    // its last row and drops the extra results; a row's result does not depend
                    // on the other rows of its group).
                    let group = match a.ty {
                        ElementType::Q4_0 | ElementType::Q4_1 | ElementType::Q8_0 => ROWS,
                        _ => F32_ROWS,
                    };
                    // The unit's quantized rows, bounds-checked once (row `rows.start + i`
                    // is `row_len` bytes at `i · nb[1]`).
                    let span = if group == ROWS {
                        a.rows_bytes(rows.start, nr, a2, a3)
                    } else {
                        &[]
                    };
                    let qrow = |i: usize| {
                        let o = (i - rows.start) * a.nb[1];
                        &span[o..o + row_len]
                    };
                    for g0 in (0..nr).step_by(group) {
                        let g = (nr - g0).min(group);
                        let row_of = |j: usize| rows.start + g0 + j.min(g - 1);
                        let mut put = |j: usize, d: &[f32]| {
                            out[j * nr + g0..j * nr + g0 + g].copy_from_slice(&d[..g]);
                        };
                        if let Some(kind) = ggml_order {
                            let rws: [&[u8]; ROWS] = std::array::from_fn(|j| qrow(row_of(j)));
                            let col = |j: usize| {
                                let c = batch0 * n + j;
                                &packed_q[c * col_bytes..(c + 1) * col_bytes]
                            };
                            qdot_group(isa, kind, rws, nn, col, qdot_prefetch, &mut put);
                            continue;
                        }
                        match a.ty {
                            ElementType::Q4_0 => {
                                let rws: [&[u8]; ROWS] = std::array::from_fn(|j| qrow(row_of(j)));
                                let col = |j: usize| {
                                    let c = batch0 * n + j;
                                    &packed_q[c * col_bytes..(c + 1) * col_bytes]
                                };
                                // Four columns per call share the rows' unpacking (in
                                // fours from each head's first column, as without GQA).
                                for h in (0..nn).step_by(n) {
                                    let mut j = h;
                                    while j + Q4_COLS <= h + n {
                                        let cols = std::array::from_fn(|c| col(j + c));
                                        let d =
                                            quant::dot_q4_0_q8_0_rows::<Q4_COLS>(isa, rws, cols);
                                        for (c, d) in d.iter().enumerate() {
                                            put(j + c, d);
                                        }
                                        j += Q4_COLS;
                                    }
                                    for j in j..h + n {
                                        let [d] = quant::dot_q4_0_q8_0_rows(isa, rws, [col(j)]);
                                        put(j, &d);
                                    }
                                }
                            }
                            ElementType::F16 => {
                                let rws: [&[f32]; F32_ROWS] =
                                    f32_rows(a, row_of, a2, a3, &mut ts.a);
                                let col = |j: usize| {
                                    let c = batch0 * n + j.min(nn - 1);
                                    &packed_f32[c * k..(c + 1) * k]
                                };
                                if half_order == hdot::Order::Tiny {
                                    // Tiles of four rows and four columns (a short last
                                    // tile repeats its last column).
                                    for j0 in (0..nn).step_by(hdot::TILE_COLS) {
                                        let cls = std::array::from_fn(|c| col(j0 + c));
                                        let mut d = [[0.0f32; F32_ROWS]; hdot::TILE_COLS];
                                        for h in (0..F32_ROWS).step_by(hdot::TILE_ROWS) {
                                            let rs = std::array::from_fn(|r| rws[h + r]);
                                            let t = hdot::dot_tile(isa, rs, cls);
                                            for (dc, tc) in d.iter_mut().zip(&t) {
                                                dc[h..h + hdot::TILE_ROWS].copy_from_slice(tc);
                                            }
                                        }
                                        for (c, dc) in d.iter().enumerate().take(nn - j0) {
                                            put(j0 + c, dc);
                                        }
                                    }
                                    continue;
                                }
                                for j in 0..nn {
                                    put(j, &hdot::dot_rows(half_order, rws, col(j)));
                                }
                            }
                            _ => {
                                let rws: [&[f32]; F32_ROWS] =
                                    f32_rows(a, row_of, a2, a3, &mut ts.a);
                                for j in 0..nn {
                                    let c = batch0 * n + j;
                                    let col = &packed_f32[c * k..(c + 1) * k];
                                    put(j, &quant::dot_f32_rows(isa, rws, col));
                                }
                            }
                        }
                    }
                }
                for jj in 0..nn {
                    let (h, j) = (jj / n, jj % n);
                    dst.store_f32(rows.start, j, i2_0 + h, i3, &out[jj * nr..(jj + 1) * nr]);
                }
            }
            Ok(())
        })
    }

    /// f32 weights on an AVX-512 CPU: our blocked product (`sgemm`). First every matrix
    /// of the weights is packed once (panels in parallel), then units of rows × columns of
    /// each result matrix run. Every result is one FMA chain over `k`, so the split does not
    /// change a bit.
    fn mul_mat_sgemm(
        &mut self,
        kernel: sgemm::Kernel,
        dst: &TView,
        a: &TView,
        b: &TView,
        r2: usize,
        r3: usize,
    ) -> Result<(), BackendError> {
        let (k, m, n) = (a.ne[0], a.ne[1], b.ne[1]);
        let n_batch = dst.ne[2] * dst.ne[3];
        let nth = self.n_threads.min(self.pool.n_threads()).max(1);
        let grid = sgemm::Grid::new(m, n, n_batch, nth);
        let per = grid.units_per_matrix();
        let (na, alen) = (a.ne[2] * a.ne[3], sgemm::packed_a_len(m, k));
        let misaligned = || BackendError::failed("CPU", "mul_mat: misaligned f32 matrix");
        let mut buf = std::mem::take(&mut self.scratch.shared_f32);
        let packed = sgemm::aligned(&mut buf, na * alen);
        let mut panels = Vec::new();
        let mut rest = &mut *packed;
        for mat in 0..na {
            for (lines, ks) in sgemm::a_panels(m, k) {
                let (p, r) = rest.split_at_mut(sgemm::MR * ks.len());
                panels.push((mat, lines, ks, Mutex::new(p)));
                rest = r;
            }
        }
        let packing = self.par_for(panels.len(), sgemm::MR * k.min(512), |units, _| {
            for (mat, lines, ks, out) in &panels[units] {
                let am = a
                    .f32_matrix(mat % a.ne[2], mat / a.ne[2])
                    .ok_or_else(misaligned)?;
                sgemm::pack_a_panel(&am, lines.clone(), ks.clone(), &mut out.lock());
            }
            Ok(())
        });
        drop(panels);
        let packed = &*packed;
        let res = packing.and_then(|()| {
            self.par_for(n_batch * per, grid.unit_cost(k), |units, ts| {
                for u in units {
                    let (batch, (rows, cols)) = (u / per, grid.unit(u % per));
                    let (i2, i3) = (batch % dst.ne[2], batch / dst.ne[2]);
                    let mat = i2 / r2 + i3 / r3 * a.ne[2];
                    let dm = dst.f32_matrix(i2, i3).ok_or_else(misaligned)?;
                    let bm = b.f32_matrix(i2, i3).ok_or_else(misaligned)?;
                    let ap = &packed[mat * alen..(mat + 1) * alen];
                    // SAFETY: this unit alone computes these rows × columns of matrix
                    // (i2, i3) of the destination, which does not overlap src1 (checked by
                    // `mul_mat`).
                    unsafe { sgemm::gemm_unit(kernel, &dm, ap, m, &bm, rows, cols, &mut ts.b) };
                }
                Ok(())
            })
        });
        self.scratch.shared_f32 = buf;
        res
    }

    /// The dot path over q4_0 weights in the repacked layout (`repack`): a unit is one group
    /// of `GROUP_ROWS` rows (= `MM_ROWS`) against all columns. (Units of a group against a
    /// chunk of columns that stays in L2, chunks outermost, measured no faster at 512
    /// columns.)
    fn mul_mat_repacked(
        &self,
        dst: &TView,
        a: &TView,
        cols: &PackedCols<'_>,
        r2: usize,
        r3: usize,
        isa: quant::Isa,
    ) -> Result<(), BackendError> {
        let (m, k) = (a.ne[1], a.ne[0]);
        let mblocks = m.div_ceil(MM_ROWS);
        let (chunk, n_chunks) = (cols.nn, 1);
        let n_mats = dst.ne[2] * dst.ne[3] / cols.bh;
        self.par_for_contiguous(
            n_mats * n_chunks * mblocks,
            MM_ROWS * k * chunk,
            |units, ts| {
                for u in units {
                    let (mat, rest) = (u / (n_chunks * mblocks), u % (n_chunks * mblocks));
                    let (cc, mb) = (rest / mblocks, rest % mblocks);
                    let batch0 = mat * cols.bh;
                    let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
                    let rows = mb * MM_ROWS..((mb + 1) * MM_ROWS).min(m);
                    let nr = rows.len();
                    let js = cc * chunk..((cc + 1) * chunk).min(cols.nn);
                    let out = grow(&mut ts.c, nr * js.len());
                    // One group of the repacked layout (the row count is a multiple of it).
                    let group = a.rows_bytes(rows.start, nr, i2_0 / r2, i3 / r3);
                    mul_mat_group_q4_0(isa, group, js.len(), nr, out, |j| {
                        let c = batch0 * cols.n + js.start + j;
                        &cols.bytes[c * cols.col_bytes..(c + 1) * cols.col_bytes]
                    });
                    for (o, jj) in out.chunks_exact(nr).zip(js) {
                        let (h, j) = (jj / cols.n, jj % cols.n);
                        dst.store_f32(rows.start, j, i2_0 + h, i3, o);
                    }
                }
                Ok(())
            },
        )
    }

    fn mul_mat_gemm(
        &mut self,
        dst: &TView,
        a: &TView,
        b: &TView,
        r2: usize,
        r3: usize,
    ) -> Result<(), BackendError> {
        let k = a.ne[0];
        let m = a.ne[1];
        let n = b.ne[1];
        let n_batch = dst.ne[2] * dst.ne[3];
        let direct_a = a.f32_matrix(0, 0).is_some() && a.rows_contiguous();
        let nth = self.n_threads.min(self.pool.n_threads()).max(1);
        // Rows of `a` per unit: enough units to keep every thread busy, and for converted
        // weights no more than a panel of GEMM_PANEL_FLOATS.
        let per_batch = if n_batch >= nth {
            1
        } else {
            nth.div_ceil(n_batch)
        };
        let mut mc = m.div_ceil(per_batch).next_multiple_of(16);
        if !direct_a {
            mc = mc.min((GEMM_PANEL_FLOATS / k).max(16));
        }
        let mblocks = m.div_ceil(mc);
        // src1 as a gemm operand: directly, or packed dense per batch.
        let direct_b =
            b.f32_matrix(0, 0).is_some() && !matches!(a.ty, ElementType::F16 | ElementType::BF16);
        if !direct_b {
            let packed = grow(&mut self.scratch.shared_f32, n_batch * n * k);
            for c in 0..n_batch * n {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                let col = &mut packed[c * k..(c + 1) * k];
                b.load_f32(0, j, i2, i3, col);
                round_to_weight_type(a.ty, col);
            }
        }
        let packed = &self.scratch.shared_f32[..if direct_b { 0 } else { n_batch * n * k }];
        let this = &*self;
        this.par_for(n_batch * mblocks, mc * n * k, |units, ts| {
            for u in units {
                let (batch, mb) = (u / mblocks, u % mblocks);
                let (i2, i3) = (batch % dst.ne[2], batch / dst.ne[2]);
                let (a2, a3) = (i2 / r2, i3 / r3);
                let rows = mb * mc..((mb + 1) * mc).min(m);
                let dm = dst
                    .f32_matrix(i2, i3)
                    .ok_or_else(|| BackendError::failed("CPU", "mul_mat: misaligned result"))?;
                let bm = match b.f32_matrix(i2, i3).filter(|_| direct_b) {
                    Some(x) => x,
                    None => MatF32::from_slice(&packed[batch * n * k..(batch + 1) * n * k], k, n),
                };
                if direct_a {
                    let am = a.f32_matrix(a2, a3).ok_or_else(|| {
                        BackendError::failed("CPU", "mul_mat: misaligned weights")
                    })?;
                    gemm_f32(dm, am, 0, bm, rows);
                } else {
                    let panel = grow(&mut ts.a, rows.len() * k);
                    for (ri, i) in rows.clone().enumerate() {
                        let x = &mut panel[ri * k..(ri + 1) * k];
                        if a.ty.is_quantized() {
                            dequantize_row(a, i, a2, a3, x);
                        } else {
                            a.load_f32(0, i, a2, a3, x);
                        }
                    }
                    let am = MatF32::from_slice(panel, k, rows.len());
                    gemm_f32(dm, am, rows.start, bm, rows);
                }
            }
            Ok(())
        })
    }
}

/// Rows `row(0)`, …, `row(N − 1)` of the matrix `(i2, i3)` of `a` as f32 slices: the
/// tensor's own rows when they are f32 and aligned, else converted (or copied) into
/// `scratch`, one row after the other.
fn f32_rows<'a, const N: usize>(
    a: &'a TView,
    row: impl Fn(usize) -> usize,
    i2: usize,
    i3: usize,
    scratch: &'a mut Vec<f32>,
) -> [&'a [f32]; N] {
    let direct: [Option<&[f32]>; N] = std::array::from_fn(|j| a.f32_row(row(j), i2, i3));
    if direct.iter().all(Option::is_some) {
        return direct.map(Option::unwrap_or_default);
    }
    let k = a.ne[0];
    let x = grow(scratch, N * k);
    for (j, xr) in x.chunks_exact_mut(k).enumerate() {
        a.load_f32(0, row(j), i2, i3, xr);
    }
    let x = &*x;
    std::array::from_fn(|j| &x[j * k..(j + 1) * k])
}

/// Packed src1 columns of a matrix product (`quant::quantize_q8_col` layout, `col_bytes`
/// each): `n` per matrix of `dst`, and the `bh` matrices that share one weight matrix
/// (`nn = bh · n` columns) handled together.
struct PackedCols<'a> {
    bytes: &'a [u8],
    col_bytes: usize,
    n: usize,
    nn: usize,
    bh: usize,
}

/// One group of `GROUP_ROWS` repacked q4_0 rows against the `n` columns `col(0..n)`,
/// `Q4_COLS` at a time, into `out[j · nr ..]` per column `j`.
fn mul_mat_group_q4_0<'c>(
    isa: quant::Isa,
    group: &[u8],
    n: usize,
    nr: usize,
    out: &mut [f32],
    col: impl Fn(usize) -> &'c [u8],
) {
    use crate::repack::{GROUP_ROWS, dot_group};
    let mut put = |j: usize, d: &[f32; GROUP_ROWS]| {
        out[j * nr..(j + 1) * nr].copy_from_slice(&d[..nr]);
    };
    let mut j = 0;
    while j + Q4_COLS <= n {
        let d = dot_group::<Q4_COLS>(isa, group, std::array::from_fn(|c| col(j + c)));
        for (c, d) in d.iter().enumerate() {
            put(j + c, d);
        }
        j += Q4_COLS;
    }
    for j in j..n {
        let [d] = dot_group(isa, group, [col(j)]);
        put(j, &d);
    }
}

/// `out[j · nr + i] = rows[i] · cols[j]` for the `nr = rows.len()` weight rows (each at
/// least `k` long) and `n = cols.len() / k` columns of a batched f32 product, in
/// [`quant::dot_f32_tile`] tiles.
///
/// The length is cut into slices (of [`TILE_COL_FLOATS`] / `n` floats, 256 to 1024) so
/// that one tile's rows and columns stay in L1 and a unit's rows and all its columns in L2
/// while every tile of the unit uses them; each slice's results are added to `out` in slice
/// order. A short last tile repeats its last row or column and drops those results, so a
/// result depends only on its row, its column and `k`.
fn mul_mat_tiles_f32(isa: quant::Isa, rows: &[&[f32]], cols: &[f32], k: usize, out: &mut [f32]) {
    use quant::{TILE_COLS, TILE_ROWS};
    // Indexing: the caller passes `k > 0`, at least `F32_TILE_MIN_N` columns and one row, and
    // `out` of at least `nr * n` floats; `(i0 + t).min(nr - 1)` and `cj(t)` clamp to them.
    let (nr, n) = (rows.len(), cols.len() / k);
    out[..nr * n].fill(0.0);
    let kc = (TILE_COL_FLOATS / n).clamp(256, 1024) / 8 * 8;
    for kb in (0..k).step_by(kc) {
        let ke = (kb + kc).min(k);
        for i0 in (0..nr).step_by(TILE_ROWS) {
            let rws: [&[f32]; TILE_ROWS] =
                std::array::from_fn(|t| &rows[(i0 + t).min(nr - 1)][kb..ke]);
            for j0 in (0..n).step_by(TILE_COLS) {
                let cj = |t: usize| (j0 + t).min(n - 1);
                let cls: [&[f32]; TILE_COLS] =
                    std::array::from_fn(|t| &cols[cj(t) * k + kb..cj(t) * k + ke]);
                let d = quant::dot_f32_tile(isa, rws, cls);
                for (t, d) in d.iter().enumerate().take(n - j0) {
                    let o = &mut out[(j0 + t) * nr + i0..];
                    for (o, v) in o.iter_mut().zip(d).take(nr - i0) {
                        *o += v;
                    }
                }
            }
        }
    }
}

/// One chunk of a binary op without scratch (see `Exec::binary`); `false` when a span is
/// misaligned, then the caller takes the scratch path. Monomorphised per op so the loops
/// vectorise.
fn binary_direct(
    op: Op,
    dst: &TView,
    a: &TView,
    b: &TView,
    i: [usize; 4],
    j: [usize; 3],
    len: usize,
) -> bool {
    match op {
        Op::Add => binary_direct_with(|x, y| x + y, dst, a, b, i, j, len),
        Op::Sub => binary_direct_with(|x, y| x - y, dst, a, b, i, j, len),
        Op::Mul => binary_direct_with(|x, y| x * y, dst, a, b, i, j, len),
        _ => binary_direct_with(|x, y| x / y, dst, a, b, i, j, len),
    }
}

#[inline(always)]
fn binary_direct_with(
    f: impl Fn(f32, f32) -> f32,
    dst: &TView,
    a: &TView,
    b: &TView,
    [i0, i1, i2, i3]: [usize; 4],
    [j1, j2, j3]: [usize; 3],
    len: usize,
) -> bool {
    let (a_in, b_in) = (dst.same_elements(a), dst.same_elements(b));
    // SAFETY: this unit owns destination elements i0..i0+len of row (i1, i2, i3) (the
    // executor hands each to one unit); sources equal to the destination are read only
    // through this slice, and the others do not overlap it (checked by the caller).
    let Some(out) = (unsafe { dst.f32_span_mut(i0, i1, i2, i3, len) }) else {
        return false;
    };
    match (a_in, b_in) {
        (true, true) => out.iter_mut().for_each(|x| *x = f(*x, *x)),
        (true, false) => {
            let Some(xb) = b.f32_span(i0, j1, j2, j3, len) else {
                return false;
            };
            out.iter_mut().zip(xb).for_each(|(x, &y)| *x = f(*x, y));
        }
        (false, true) => {
            let Some(xa) = a.f32_span(i0, i1, i2, i3, len) else {
                return false;
            };
            out.iter_mut().zip(xa).for_each(|(y, &x)| *y = f(x, *y));
        }
        (false, false) => {
            let (Some(xa), Some(xb)) = (
                a.f32_span(i0, i1, i2, i3, len),
                b.f32_span(i0, j1, j2, j3, len),
            ) else {
                return false;
            };
            for ((o, &x), &y) in out.iter_mut().zip(xa).zip(xb) {
                *o = f(x, y);
            }
        }
    }
    true
}

fn dequantize_row(a: &TView, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
    let bytes = a.row_bytes(i1, i2, i3);
    match a.ty {
        ElementType::Q8_0 => quant::dequantize_q8_0(bytes, out),
        ElementType::Q4_1 => qdot::dequantize_q4_1(bytes, out),
        _ => quant::dequantize_q4_0(bytes, out),
    }
}

/// Round a column of `src1` to f16 or bf16 when the weights are of that type: ggml converts
/// `src1` to the weights' `vec_dot_type` (f16 for f16, bf16 for bf16) before its dot
/// products, so a product with f16 weights (the attention's `K·Q` and `V·P` over an f16 KV
/// cache) sees the column rounded to nearest even. Products of those values are exact in
/// f32, so only the summation order is left to differ from ggml.
fn round_to_weight_type(ty: ElementType, col: &mut [f32]) {
    match ty {
        ElementType::F16 => hdot::round_to_f16(col),
        ElementType::BF16 => col
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// The `qdot` weight kind of a type whose products follow ggml's integer order.
fn qdot_kind(ty: ElementType) -> Option<qdot::WeightKind> {
    match ty {
        ElementType::Q4_1 => Some(qdot::WeightKind::Q4_1),
        ElementType::Q8_0 => Some(qdot::WeightKind::Q8_0),
        _ => None,
    }
}

/// Rows per call of the many-column `qdot` kernel (with [`QDOT_COLS`] columns: sixteen
/// eight-lane accumulators, AVX2's register count).
const QDOT_ROWS: usize = 4;
/// Columns per call of the many-column `qdot` kernel.
const QDOT_COLS: usize = 4;

/// One group of [`ROWS`] weight rows against the `n` columns `col(0..n)`, handing each
/// column's results to `put`: one column at a time with all rows when `n` is small (decode),
/// else [`QDOT_ROWS`] × [`QDOT_COLS`] tiles so a weight block is unpacked once for several
/// columns. Each result is one row dotted with one column, whatever the tiling.
fn qdot_group<'c>(
    isa: quant::Isa,
    kind: qdot::WeightKind,
    rows: [&[u8]; ROWS],
    n: usize,
    col: impl Fn(usize) -> &'c [u8],
    prefetch: usize,
    put: &mut impl FnMut(usize, &[f32]),
) {
    let mut j = 0;
    // Eight rows by eight columns per call where the kernel has such tiles (`q4_1` with
    // AVX-512 VNNI): one pass over a weight block for eight columns.
    if ROWS == qdot::TILE && kind == qdot::WeightKind::Q4_1 && isa == quant::Isa::Avx512 {
        while j + qdot::TILE <= n {
            let cols: [&[u8]; qdot::TILE] = std::array::from_fn(|c| col(j + c));
            let rows: [&[u8]; qdot::TILE] = std::array::from_fn(|r| rows[r]);
            let d = qdot::dot_tile(isa, kind, rows, cols, prefetch);
            for (c, dc) in d.iter().enumerate() {
                put(j + c, dc);
            }
            j += qdot::TILE;
        }
    }
    while j + QDOT_COLS <= n {
        let cols: [&[u8]; QDOT_COLS] = std::array::from_fn(|c| col(j + c));
        let mut d = [[0.0f32; ROWS]; QDOT_COLS];
        for h in 0..ROWS / QDOT_ROWS {
            let rs: [&[u8]; QDOT_ROWS] = std::array::from_fn(|r| rows[h * QDOT_ROWS + r]);
            let part = qdot::dot_rows(isa, kind, rs, cols, prefetch);
            for (dc, pc) in d.iter_mut().zip(&part) {
                dc[h * QDOT_ROWS..(h + 1) * QDOT_ROWS].copy_from_slice(pc);
            }
        }
        for (c, dc) in d.iter().enumerate() {
            put(j + c, dc);
        }
        j += QDOT_COLS;
    }
    for j in j..n {
        let [d] = qdot::dot_rows(isa, kind, rows, [col(j)], prefetch);
        put(j, &d);
    }
}

/// GELU, tanh approximation, in f32 (ggml's default build reads a table indexed by the f16
/// rounding of x instead; results differ by at most that rounding).
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

fn rope_yarn_corr_dim(n_dims: usize, n_ctx_orig: i32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

fn rope_yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: i32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let start = rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base).floor();
    let end = rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

fn rope_yarn(
    theta_extrap: f32,
    freq_scale: f32,
    corr: [f32; 2],
    i0: usize,
    ext_factor: f32,
    mscale: f32,
) -> (f32, f32) {
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = mscale;
    if ext_factor != 0.0 {
        let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp = 1.0 - y.clamp(0.0, 1.0);
        let mix = ramp * ext_factor;
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}
