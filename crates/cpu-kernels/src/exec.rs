//! The executor: runs one node at a time (or a run of matrix products of one input, see
//! `mul_mat::shared_column_run`), splitting its work over the pool.
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

mod mul_mat;

use mul_mat::dequantize_row;
pub(crate) use mul_mat::shared_column_run;

/// Work (roughly: elements touched, or multiply-adds) below which a node runs on one thread.
pub(crate) const MIN_WORK: usize = if cfg!(miri) { 64 } else { 32 * 1024 };
/// Chunks of units per thread that [`Exec::par_for`] aims for.
const CHUNKS_PER_THREAD: usize = 8;
/// Chunks per thread in [`Exec::par_for_contiguous`]: small, so that the last stolen chunk
/// is short; claims stay cheap (one compare-and-swap each) and in order. With 128 a 64 MiB
/// f32 mat-vec (256 units of 16 rows) claims one unit (256 KiB) at a time: the two threads
/// then finished 5–7 µs apart against 19–49 µs with 32 (four units a claim), of a call of
/// about 850 µs (instrumented runs of `benches/matvec.rs`, the fastest quarter of calls).
const STREAM_CHUNKS_PER_THREAD: usize = 128;
/// Work (multiply-adds) a thread claims at once from its own range in
/// [`Exec::par_for_contiguous`], where its units are smaller: at most half of what is left of
/// the range, so the end of an op stays fine-grained for the thieves. A decode step's products
/// have units of 16 rows of 576 (SmolLM2-135M: 6 KB of q4_1), and one claim each cost about
/// as much as the unit's kernel; claimed seven at a time and computed as one run (the
/// repacked path), the step's 420 products over cached weights took 1.40–1.50 times the
/// 64 MiB read against 1.78–1.83 in two quiet alternations (`step_q4_1_repack_60_layers_cached`
/// in `benches/matvec.rs`; 32 K: 1.51–1.56, 128 K: 1.38–1.48).
const OWN_CLAIM_WORK: usize = 64 * 1024;
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

/// Per-thread scratch vectors, each thread's on lines of its own (with its lock: the
/// `Mutex` around it takes the alignment).
#[derive(Default, Debug)]
#[repr(align(128))]
pub(crate) struct ThreadScratch {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    bytes: Vec<u8>,
}

/// One thread's range of units in [`Exec::par_for_contiguous`] (`lo | hi << 32`), on lines
/// of its own: the owner claims from it several times an op, and with the ranges side by
/// side every claim took the line from the other core.
#[derive(Debug, Default)]
#[repr(align(128))]
struct OwnRange(AtomicU64);

/// Scratch memory reused across computes: one set per thread plus a shared area.
#[derive(Debug)]
pub(crate) struct Scratch {
    thread: Vec<Mutex<ThreadScratch>>,
    shared_f32: Vec<f32>,
    shared_u8: Vec<u8>,
    /// The work-stealing ranges of a streamed run, one per thread (kept so a run does not
    /// allocate).
    ranges: Vec<OwnRange>,
}

impl Scratch {
    pub fn new(n_threads: usize) -> Scratch {
        Scratch {
            thread: (0..n_threads.max(1)).map(|_| Mutex::default()).collect(),
            shared_f32: Vec::new(),
            shared_u8: Vec::new(),
            ranges: (0..n_threads.max(1)).map(|_| OwnRange::default()).collect(),
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
    /// compare-and-swap per chunk on the owner's range; an owner claims at least
    /// [`OWN_CLAIM_WORK`] at once (or half its range's rest), a thief one chunk, and `f` may
    /// compute the units of a claim as one run. As for `par_for`, a unit's result
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
        let own_chunk = OWN_CLAIM_WORK.div_ceil(unit_cost.max(1)).max(chunk);
        let pack = |lo: usize, hi: usize| lo as u64 | (hi as u64) << 32;
        // `ranges` has one slot per scratch thread and `nth <= thread.len()` (as in par_for);
        // `victim < nth` by the modulo below.
        let ranges = &self.scratch.ranges[..nth];
        for (t, OwnRange(r)) in ranges.iter().enumerate() {
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
                    // At most half of what is left, so that the end stays fine-grained.
                    let e = (lo + own_chunk.min((hi - lo).div_ceil(2)).max(chunk)).min(hi);
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
                while let Some(units) = claim(&ranges[victim].0, o == 0) {
                    if let Err(e) = f(units, &mut ts) {
                        err.lock().get_or_insert(e);
                        // Stop handing out work: the op failed.
                        ranges.iter().for_each(|r| r.0.store(0, Ordering::Relaxed));
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
