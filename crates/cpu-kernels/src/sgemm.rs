//! Our f32 matrix product for CPUs with AVX-512: packed operands and a 64 × 6 register tile.
//!
//! Why our own: the `gemm` crate, built without its nightly feature, runs AVX2 kernels
//! (eight lanes), so on an AVX-512 machine it can reach at most half the FMA peak; the MiniLM
//! projections spent about two thirds of their time there.
//!
//! The method (the usual blocked product, sized for a core with 48 KiB of L1 data cache and
//! 1 MiB of L2):
//!
//! * The result is cut into units of whole row ranges × column ranges ([`Grid`]); the
//!   executor hands units to threads. Every unit reads all the weights of its rows, so where
//!   the weights do not fit in L2 units are four times as wide (1024 columns) and read them
//!   from L3 a quarter as often: on the Sapphire Rapids host 4096³ went from 0.72–0.77 of
//!   the nominal peak to 0.80–0.83 (four alternations; figures in `docs/benchmarks.md`).
//! * The weights are packed once per op (see `exec`): for each block of the inner dimension
//!   ([`kc_for`]: the fewest blocks of at most [`KC_MAX`]), panels of [`MR`] rows (`kc × MR`
//!   floats, row index fastest, short panels padded with zeros); with AVX-512, 16 rows × 16
//!   steps at a time, transposed in registers.
//! * Inside a unit, for each inner block and each [`mc_for`] rows of weights (an L2 block of
//!   576 KiB), the unit's columns of `src1` are taken [`NR`] at a time, read in place when a
//!   column's elements are adjacent (else copied into a panel), and multiplied by each weight
//!   panel of the L2 block.
//! * The micro-kernel multiplies one weight panel by one column panel into `MR × NR`
//!   accumulators (24 vectors of 16 lanes): per step of the inner dimension four vector
//!   loads, six broadcasts and 24 FMAs. It loads the partial sums of a whole tile straight
//!   from the destination and stores them back there (a short or strided tile goes through
//!   a scratch tile): with `k = 4096` every tile is loaded and stored once per inner block,
//!   and the copies through a scratch tile cost about 5 % there.
//!
//! Not kept, measured (figures in `docs/benchmarks.md`): prefetching the next column panel
//! into L2 from the micro-kernel (no faster beyond the spread, slower on 4096³, where
//! columns 16 KiB apart crowd into a few cache sets), also with the unit's columns copied
//! into a contiguous buffer per inner block when several weights blocks read them (BLIS's
//! packed B: no faster on 4096³, slower on k = 1536, where the copy competes with the weights
//! block for L2); prefetching the next result tile, or the next weights block (which evicts
//! the current one from L2).
//!
//! On an Intel core of the Sapphire Rapids class the same code reaches less: with the former
//! 48 × 8 tile, 0.82–0.85 of the FMA loop with a unit's data in L2 and 0.66–0.77 over a whole
//! product on two threads, against Intel MKL's 0.74–0.81 in the same runs. The bound is the
//! micro-kernel's loads: on that core 24 FMAs a step beside three vector loads and eight
//! broadcasts run about a tenth below the FMAs alone, and no register tile that fits the 32
//! registers needs fewer than ten loads per 24 FMAs. The 64 × 6 tile is one of those with
//! ten (four vector loads, six broadcasts; 24 accumulators, four weight vectors and a
//! broadcast fill 29 registers), and it is faster there: of the nominal peak on two threads
//! (`benches/gemm.rs`, nine alternations) 384² 0.77–0.88 against 0.72–0.86, FFN up
//! 0.74–0.86 against 0.68–0.84, FFN down 0.77–0.86 against 0.75–0.84, 4096³ 0.67–0.77 against
//! 0.66–0.75: ahead in 29 of 36 pairs, level in 5, behind in 2; on one thread ahead in all 8.
//! 96 × 4 (six vector loads, four broadcasts) lost on the MiniLM shapes (0.70–0.81 against
//! 0.77–0.87). The tile was chosen on that host; the AMD host has not run it (figures in
//! `docs/benchmarks.md`).
//!
//! **Every result element is one chain of fused multiply-adds over the inner dimension in
//! order**, `c = fma(a[0], b[0], 0)`, `c = fma(a[1], b[1], c)`, …: a block after the first
//! starts from the partial sums the previous block stored. So a result depends only on its
//! row of `src0`, its column of `src1` and `k`, never on the unit, the blocking or the
//! thread count, and the portable kernel (`f32::mul_add`, used by the tests and Miri) gives
//! the same bits as the AVX-512 one.

use std::ops::Range;

use crate::mem::MatF32;

/// Rows of a weight panel (four vectors of 16 lanes).
pub(crate) const MR: usize = 64;
/// Columns of a `src1` panel.
pub(crate) const NR: usize = 6;
/// Longest inner-dimension block. Longer blocks mean fewer passes over the result (each
/// block after the first reloads and stores every result tile once); 768 measured faster than
/// 384 on 4096³ (0.81 against 0.79 of the FMA peak per busy CPU-second, 2 threads).
const KC_MAX: usize = 768;
/// Floats of the weights' block that the micro-kernel streams from L2 (`mc × kc`, 576 KiB).
const A_BLOCK: usize = 384 * 384;
/// Columns per unit aimed for when there are enough: the weights are packed once per unit,
/// which costs about one FMA step per 256 columns of work.
const MIN_UNIT_COLS: usize = 256;
/// Packed weights of more bytes than this do not stay in a core's L2 (2 MiB on the Sapphire
/// Rapids host, 1 MiB on the AMD one) from one unit to the next.
const L2_BYTES: usize = 2 << 20;
/// Columns per unit aimed for when the weights do not fit in L2 ([`L2_BYTES`]). Each unit then
/// reads its rows of the weights from L3 again, one L2 block at a time, and the first column
/// panel of every block waits on that read: on the Sapphire Rapids host it took about five
/// times as long as the block's other panels, a tenth of a 4096³ product with 256-column
/// units. Units four times as wide read the weights a quarter as often.
const MIN_UNIT_COLS_STREAMED: usize = 1024;
/// Units per thread aimed for, so a descheduled thread's share can be taken over.
const UNITS_PER_THREAD: usize = 8;

/// Which micro-kernel runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Scalar `f32::mul_add` (tests, Miri).
    #[cfg_attr(not(test), allow(dead_code))]
    Portable,
    /// AVX-512 F intrinsics.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    Avx512,
}

impl Kernel {
    /// The AVX-512 kernel when the CPU has AVX-512 F, else `None` (the executor then keeps
    /// the `gemm` crate, whose AVX2 kernels beat a scalar one).
    pub fn best() -> Option<Kernel> {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Some(Kernel::Avx512);
        }
        None
    }
}

/// How a product of `n_batch` matrices of `m × n` results is cut into units.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Grid {
    m: usize,
    n: usize,
    /// Rows per unit (a multiple of [`MR`]).
    mu: usize,
    /// Columns per unit (a multiple of [`NR`]).
    nu: usize,
    nbi: usize,
    nbj: usize,
}

impl Grid {
    /// A grid for weights of `m` rows `k` long, with about [`UNITS_PER_THREAD`] units per
    /// thread: columns are split first (down to [`MIN_UNIT_COLS`] per unit, or
    /// [`MIN_UNIT_COLS_STREAMED`] when the packed weights exceed [`L2_BYTES`]), then rows (down
    /// to two panels per unit).
    pub fn new(m: usize, k: usize, n: usize, n_batch: usize, n_threads: usize) -> Grid {
        let want = (UNITS_PER_THREAD * n_threads.max(1)).div_ceil(n_batch.max(1));
        let weights_bytes = m.next_multiple_of(MR).saturating_mul(k).saturating_mul(4);
        let min_cols = if weights_bytes > L2_BYTES {
            MIN_UNIT_COLS_STREAMED
        } else {
            MIN_UNIT_COLS
        };
        let nbj = want.min(n.div_ceil(min_cols)).max(1);
        let nu = n.div_ceil(nbj).next_multiple_of(NR).max(NR);
        let nbj = n.div_ceil(nu).max(1);
        let nbi = want.div_ceil(nbj).min(m.div_ceil(2 * MR)).max(1);
        let mu = m.div_ceil(nbi).next_multiple_of(MR).max(MR);
        let nbi = m.div_ceil(mu).max(1);
        Grid {
            m,
            n,
            mu,
            nu,
            nbi,
            nbj,
        }
    }

    /// Units per matrix of the batch.
    pub fn units_per_matrix(&self) -> usize {
        self.nbi * self.nbj
    }

    /// Multiply-adds of a full unit with inner dimension `k`.
    pub fn unit_cost(&self, k: usize) -> usize {
        self.mu.saturating_mul(self.nu).saturating_mul(k)
    }

    /// Rows and columns of unit `u` (`0..units_per_matrix()`) of a matrix.
    pub fn unit(&self, u: usize) -> (Range<usize>, Range<usize>) {
        let (bi, bj) = (u % self.nbi, u / self.nbi);
        let rows = bi * self.mu..((bi + 1) * self.mu).min(self.m);
        let cols = bj * self.nu..((bj + 1) * self.nu).min(self.n);
        (rows, cols)
    }
}

/// The inner-dimension block for inner dimension `k`: `k` cut into the fewest blocks of at
/// most [`KC_MAX`], of even length (rounded up to 16).
fn kc_for(k: usize) -> usize {
    let blocks = k.div_ceil(KC_MAX).max(1);
    k.div_ceil(blocks).next_multiple_of(16).clamp(16, KC_MAX)
}

/// Rows of the weights in one L2 block for inner block `kc`: [`A_BLOCK`] floats, whole
/// panels.
fn mc_for(kc: usize) -> usize {
    (A_BLOCK / kc.max(1) / MR).max(1) * MR
}

/// Floats of the packed weights of one `m`-row matrix with inner dimension `k` (see
/// [`pack_a`]).
pub(crate) fn packed_a_len(m: usize, k: usize) -> usize {
    m.div_ceil(MR) * MR * k
}

/// The panels of [`pack_a`]'s layout in order: rows and inner range of each. A matrix's
/// packed weights are these regions of `MR · kc` floats one after the other.
pub(crate) fn a_panels(m: usize, k: usize) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    let kc = kc_for(k);
    (0..k).step_by(kc).flat_map(move |pc| {
        let ks = pc..(pc + kc).min(k);
        (0..m)
            .step_by(MR)
            .map(move |i0| (i0..(i0 + MR).min(m), ks.clone()))
    })
}

/// Pack the weights `a` (line `i` = row `i`, `k` long) into `out` ([`packed_a_len`]
/// floats): for each inner block of [`kc_for`], for each panel of [`MR`] rows, `kc · MR` floats,
/// row index fastest. The regions of [`a_panels`] can be packed separately with
/// [`pack_a_panel`].
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn pack_a(kernel: Kernel, a: &MatF32, out: &mut [f32]) {
    let (k, m) = a.dims();
    let mut rest = out;
    for (lines, ks) in a_panels(m, k) {
        let (panel, r) = rest.split_at_mut(MR * ks.len());
        pack_a_panel(kernel, a, lines, ks, panel);
        rest = r;
    }
}

/// One region of [`pack_a`]: rows `lines` (at most [`MR`]), inner range `ks`. With the
/// AVX-512 kernel, a whole panel of rows with adjacent elements is gathered one step of the
/// inner dimension at a time, so the panel is written in order, each cache line once (the
/// row-at-a-time packing writes every line of the panel [`MR`] times, 4 bytes each, and
/// took about 5 % of a 4096³ product); the floats are the same.
pub(crate) fn pack_a_panel(
    kernel: Kernel,
    a: &MatF32,
    lines: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if kernel == Kernel::Avx512 && lines.len() == MR && out.len() == MR * ks.len() {
        let rows: [Option<&[f32]>; MR] =
            std::array::from_fn(|w| a.line(lines.start + w, ks.clone()));
        if rows.iter().all(Option::is_some) {
            let rows = rows.map(Option::unwrap_or_default);
            // SAFETY: `Kernel::Avx512` is only made when the CPU has AVX-512 F.
            unsafe { x86::pack_transpose(rows, out) };
            return;
        }
    }
    let _ = kernel;
    pack::<MR>(a, lines, ks, out);
}

/// `dst[i, j] = Σ_kk a[kk, i] · b[kk, j]` for `i in rows`, `j in cols`: one unit of work.
///
/// `apacked`: the weights (`m` rows, `k` long) packed by [`pack_a`]; `b`: line `j` holding
/// column `j` (`b.dims().0 == k`); `dst`: element `(i, j)` at line `j`, position `i`.
/// `bcopy` is the calling thread's scratch for columns that are not adjacent in memory.
///
/// # Safety
/// The caller's unit owns the destination elements `rows × cols` (no other thread reads or
/// writes them during the op), and `dst` does not overlap `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_unit(
    kernel: Kernel,
    dst: &MatF32,
    apacked: &[f32],
    m: usize,
    b: &MatF32,
    rows: Range<usize>,
    cols: Range<usize>,
    bcopy: &mut Vec<f32>,
) {
    let k = b.dims().0;
    assert!(
        apacked.len() >= packed_a_len(m, k) && rows.end <= m && rows.start.is_multiple_of(MR),
        "sgemm: weights not packed for these rows (a kernel bug)"
    );
    if rows.is_empty() || cols.is_empty() {
        return;
    }
    let mp = m.div_ceil(MR);
    let direct = b.line(cols.start, 0..k).is_some();
    let step = kc_for(k);
    let mc = mc_for(step);
    let mut tile = [[0.0f32; MR]; NR];
    for pc in (0..k).step_by(step) {
        let kc = step.min(k - pc);
        let block = &apacked[pc * mp * MR..(pc + kc) * mp * MR];
        for ic in rows.clone().step_by(mc) {
            let ie = (ic + mc).min(rows.end);
            for j0 in cols.clone().step_by(NR) {
                let nr = NR.min(cols.end - j0);
                // A short last panel repeats its last column and drops those results.
                let col = |t: usize| j0 + t.min(nr - 1);
                let bq: [&[f32]; NR] = if direct {
                    std::array::from_fn(|t| b.line(col(t), pc..pc + kc).unwrap_or_default())
                } else {
                    let x = grow(bcopy, NR * kc);
                    for (t, xt) in x.chunks_exact_mut(kc).enumerate() {
                        load_line(b, pc, col(t), xt);
                    }
                    let x = &*x;
                    std::array::from_fn(|t| &x[t * kc..(t + 1) * kc])
                };
                for i0 in (ic..ie).step_by(MR) {
                    let mr = MR.min(ie - i0);
                    let p = i0 / MR;
                    let aq = &block[p * MR * kc..(p + 1) * MR * kc];
                    // A whole tile of a destination with adjacent rows is read and written
                    // in place; others go through `tile`.
                    let cp: [Option<*mut f32>; NR] = if mr == MR && nr == NR {
                        std::array::from_fn(|j| dst.line_ptr(j0 + j, i0..i0 + MR))
                    } else {
                        [None; NR]
                    };
                    if cp.iter().all(Option::is_some) {
                        let cp = cp.map(Option::unwrap_or_default);
                        // SAFETY: rows i0..i0 + MR of columns j0..j0 + NR lie in rows × cols,
                        // which the caller's unit owns (the function's contract); each pointer
                        // addresses MR adjacent floats of its own column (`line_ptr`), and
                        // `dst` does not overlap `b` (contract) or the packed weights.
                        unsafe { micro(kernel, kc, aq, bq, Out::Dst(cp), pc > 0) };
                        continue;
                    }
                    if pc > 0 {
                        for (j, t) in tile.iter_mut().enumerate().take(nr) {
                            load_line(dst, i0, j0 + j, &mut t[..mr]);
                        }
                    }
                    // SAFETY: `Out::Tile` is our scratch (no pointer contract).
                    unsafe { micro(kernel, kc, aq, bq, Out::Tile(&mut tile), pc > 0) };
                    for (j, t) in tile.iter().enumerate().take(nr) {
                        // SAFETY: (i0.., j0 + j) lies in rows × cols, which the caller's unit
                        // owns (the function's contract).
                        unsafe { dst.store_line(i0, j0 + j, &t[..mr]) };
                    }
                }
            }
        }
    }
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// `v` grown to at least `n + 16` floats, and the `n` of them that start at a 64-byte
/// boundary (whole-vector loads of a panel then never straddle cache lines).
pub(crate) fn aligned(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n + 16 {
        v.resize(n + 16, 0.0);
    }
    let off = v.as_ptr().align_offset(64).min(16);
    &mut v[off..off + n]
}

/// Line `i1`'s elements `i0..i0 + out.len()` of `m` into `out`.
fn load_line(m: &MatF32, i0: usize, i1: usize, out: &mut [f32]) {
    match m.line(i1, i0..i0 + out.len()) {
        Some(s) => out.copy_from_slice(s),
        None => {
            for (d, o) in out.iter_mut().enumerate() {
                *o = m.get(i0 + d, i1);
            }
        }
    }
}

/// Pack lines `lines` of `m`, elements `ks`, into panels of `W` lines: panel `p` holds, for
/// each `kk` of `ks` in order, the `W` elements `(ks.start + kk, lines.start + p·W + w)`;
/// lines past `lines.end` are zeros.
fn pack<const W: usize>(m: &MatF32, lines: Range<usize>, ks: Range<usize>, out: &mut [f32]) {
    let kc = ks.len();
    let mut line = [0.0f32; KC_MAX];
    for (p, panel) in out.chunks_exact_mut(W * kc).enumerate() {
        for w in 0..W {
            let l = lines.start + p * W + w;
            let src: &[f32] = if l < lines.end {
                match m.line(l, ks.clone()) {
                    Some(s) => s,
                    None => {
                        for (kk, x) in line[..kc].iter_mut().enumerate() {
                            *x = m.get(ks.start + kk, l);
                        }
                        &line[..kc]
                    }
                }
            } else {
                line[..kc].fill(0.0);
                &line[..kc]
            };
            for (kk, &x) in src.iter().enumerate() {
                panel[kk * W + w] = x;
            }
        }
    }
}

/// Where a tile's accumulators start from (when accumulating) and end up.
enum Out<'t> {
    /// A scratch tile (short tiles, strided destinations).
    Tile(&'t mut [[f32; MR]; NR]),
    /// [`NR`] destination columns of [`MR`] adjacent floats each, read and written in place.
    Dst([*mut f32; NR]),
}

/// One `MR × NR` tile: `out[j][i] = fma chain over kk of a[kk·MR + i] · b[j][kk]`, starting
/// from `out` when `accumulate`, else from zero.
///
/// # Safety
/// With [`Out::Dst`], each pointer addresses [`MR`] floats that the caller may read and write
/// and that no one else touches during the call; the columns do not overlap each other, `a`
/// or `b`.
unsafe fn micro(
    kernel: Kernel,
    kc: usize,
    a: &[f32],
    b: [&[f32]; NR],
    out: Out<'_>,
    accumulate: bool,
) {
    assert!(
        a.len() >= kc * MR && b.iter().all(|c| c.len() >= kc),
        "sgemm: short panel (a kernel bug)"
    );
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Kernel::Avx512 => {
            let c = match out {
                Out::Tile(t) => t.each_mut().map(|r| r.as_mut_ptr()),
                Out::Dst(c) => c,
            };
            // SAFETY: `Kernel::Avx512` is only made when the CPU has AVX-512 F; the panels
            // hold `kc` steps (asserted above); each `c[j]` addresses MR floats of a tile row
            // or, by this function's contract, of the destination.
            unsafe { x86::micro_avx512(kc, a, b, c, accumulate) }
        }
        Kernel::Portable => match out {
            Out::Tile(t) => micro_portable(kc, a, b, t, accumulate),
            Out::Dst(c) => {
                let mut t = [[0.0f32; MR]; NR];
                if accumulate {
                    for (r, &p) in t.iter_mut().zip(&c) {
                        // SAFETY: `p` addresses MR floats we may read (the contract).
                        unsafe { std::ptr::copy_nonoverlapping(p, r.as_mut_ptr(), MR) };
                    }
                }
                micro_portable(kc, a, b, &mut t, accumulate);
                for (r, &p) in t.iter().zip(&c) {
                    // SAFETY: `p` addresses MR floats we may write (the contract).
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), p, MR) };
                }
            }
        },
    }
}

fn micro_portable(
    kc: usize,
    a: &[f32],
    b: [&[f32]; NR],
    tile: &mut [[f32; MR]; NR],
    accumulate: bool,
) {
    if !accumulate {
        *tile = [[0.0; MR]; NR];
    }
    for kk in 0..kc {
        let av = &a[kk * MR..(kk + 1) * MR];
        for (t, bj) in tile.iter_mut().zip(b.iter().map(|c| c[kk])) {
            for (c, &ai) in t.iter_mut().zip(av) {
                *c = ai.mul_add(bj, *c);
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// A weights panel: `out[kk·MR + w] = rows[w][kk]` for every step `kk` of the rows (all
    /// of one length `kc`), 16 steps of 16 rows at a time transposed in registers (each
    /// source cache line read once, each line of `out` written once).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_transpose(rows: [&[f32]; MR], out: &mut [f32]) {
        let kc = rows[0].len();
        assert!(
            rows.iter().all(|r| r.len() == kc) && out.len() >= kc * MR,
            "sgemm: short panel (a kernel bug)"
        );
        let full = kc - kc % 16;
        for kk0 in (0..full).step_by(16) {
            for h in 0..MR / 16 {
                // SAFETY: kk0 + 16 <= kc = each row's length (asserted).
                let r: [__m512; 16] = std::array::from_fn(|i| unsafe {
                    _mm512_loadu_ps(rows[16 * h + i].as_ptr().add(kk0))
                });
                let c = transpose16(r);
                for (j, cj) in c.iter().enumerate() {
                    let o = &mut out[(kk0 + j) * MR + 16 * h..][..16];
                    // SAFETY: `o` holds 16 floats.
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *cj) };
                }
            }
        }
        for kk in full..kc {
            for (w, r) in rows.iter().enumerate() {
                out[kk * MR + w] = r[kk];
            }
        }
    }

    /// `c[j]` lane `i` = `r[i]` lane `j`.
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // Pairs of rows interleaved by 32 bits, then by 64 bits, within each 128-bit lane:
        // u[4g + e] lane L holds rows 4g..4g + 4 at column 4L + e.
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (g, e) = (i / 4, i % 4);
            let a = _mm512_castps_pd(t[4 * g + e / 2]);
            let b = _mm512_castps_pd(t[4 * g + 2 + e / 2]);
            _mm512_castpd_ps(if e % 2 == 0 {
                _mm512_unpacklo_pd(a, b)
            } else {
                _mm512_unpackhi_pd(a, b)
            })
        });
        // Then 128-bit lanes: column 4L + e gathers lane L of u[e], u[4 + e], u[8 + e],
        // u[12 + e].
        let mut c = [_mm512_setzero_ps(); 16];
        for e in 0..4 {
            let v = _mm512_shuffle_f32x4::<0x88>(u[e], u[4 + e]);
            let w = _mm512_shuffle_f32x4::<0xdd>(u[e], u[4 + e]);
            let x = _mm512_shuffle_f32x4::<0x88>(u[8 + e], u[12 + e]);
            let y = _mm512_shuffle_f32x4::<0xdd>(u[8 + e], u[12 + e]);
            c[e] = _mm512_shuffle_f32x4::<0x88>(v, x);
            c[8 + e] = _mm512_shuffle_f32x4::<0xdd>(v, x);
            c[4 + e] = _mm512_shuffle_f32x4::<0x88>(w, y);
            c[12 + e] = _mm512_shuffle_f32x4::<0xdd>(w, y);
        }
        c
    }

    /// [`super::micro_portable`] with 24 zmm accumulators, read from and written to the
    /// [`NR`] columns `c`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F; `a` holds at least `kc · MR` floats and each column of
    /// `b` at least `kc`; each `c[j]` addresses [`MR`] floats the caller may read and write.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn micro_avx512(
        kc: usize,
        a: &[f32],
        b: [&[f32]; NR],
        c: [*mut f32; NR],
        accumulate: bool,
    ) {
        const V: usize = MR / 16;
        let mut acc = [[_mm512_setzero_ps(); V]; NR];
        if accumulate {
            for (v, &p) in acc.iter_mut().zip(&c) {
                for (h, x) in v.iter_mut().enumerate() {
                    // SAFETY: lanes h·16 .. h·16 + 16 of the MR floats at `p` (the contract).
                    *x = unsafe { _mm512_loadu_ps(p.add(16 * h)) };
                }
            }
        }
        let ap = a.as_ptr();
        let bp: [*const f32; NR] = b.map(<[f32]>::as_ptr);
        for kk in 0..kc {
            // SAFETY: kk < kc, so the reads stay inside a[..kc·MR] and each b[j][..kc] (the
            // caller's contract).
            unsafe {
                let pa = ap.add(kk * MR);
                let av: [__m512; V] = std::array::from_fn(|h| _mm512_loadu_ps(pa.add(16 * h)));
                for (v, pb) in acc.iter_mut().zip(bp) {
                    let bj = _mm512_set1_ps(pb.add(kk).read());
                    for (x, &a) in v.iter_mut().zip(&av) {
                        *x = _mm512_fmadd_ps(a, bj, *x);
                    }
                }
            }
        }
        for (v, &p) in acc.iter().zip(&c) {
            for (h, x) in v.iter().enumerate() {
                // SAFETY: lanes h·16 .. h·16 + 16 of the MR floats at `p` (the contract).
                unsafe { _mm512_storeu_ps(p.add(16 * h), *x) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// Runs the whole product as the units of `nth` threads' grid, each with the given kernel;
    /// `nth == 0`: as one unit (which then spans several weights blocks when `m` is large).
    fn product(
        kernel: Kernel,
        a: &[f32],
        b: &[f32],
        k: usize,
        m: usize,
        n: usize,
        nth: usize,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; m * n];
        let am = MatF32::from_slice(a, k, m);
        let bm = MatF32::from_slice(b, k, n);
        let dm = MatF32::from_mut_slice(&mut out, m, n);
        let g = Grid::new(m, k, n, 1, nth);
        let mut ap = vec![f32::NAN; packed_a_len(m, k)];
        pack_a(kernel, &am, &mut ap);
        let mut bcopy = Vec::new();
        let units: Vec<_> = match nth {
            0 => vec![(0..m, 0..n)],
            _ => (0..g.units_per_matrix()).map(|u| g.unit(u)).collect(),
        };
        for (rows, cols) in units {
            // SAFETY: one unit at a time; `out` is not read while the units write it, and
            // does not overlap `b`.
            unsafe { gemm_unit(kernel, &dm, &ap, m, &bm, rows, cols, &mut bcopy) };
        }
        out
    }

    #[test]
    fn every_element_is_one_fma_chain_whatever_the_grid() {
        let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(5, 50, 9)]
        } else {
            &[
                (5, 50, 9),
                (384, 96, 16),
                (800, 130, 77),
                (1600, 96, 9),
                (1600, 400, 20),
                (37, 1, 1),
            ]
        };
        for &(k, m, n) in shapes {
            let mut s = (k * 1000 + m * 10 + n) as u64;
            let a: Vec<f32> = (0..k * m).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut s)).collect();
            let want: Vec<f32> = (0..n)
                .flat_map(|j| {
                    let (a, b) = (&a, &b);
                    (0..m).map(move |i| {
                        (0..k).fold(0.0f32, |c, kk| a[i * k + kk].mul_add(b[j * k + kk], c))
                    })
                })
                .collect();
            let mut kernels = vec![Kernel::Portable];
            if crate::isa::test_gate("avx512f-gemm") {
                kernels.extend(Kernel::best());
            }
            for kernel in kernels {
                let nths: &[usize] = if cfg!(miri) { &[2] } else { &[0, 1, 2, 7] };
                for &nth in nths {
                    let got = product(kernel, &a, &b, k, m, n, nth);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{kernel:?} k{k} m{m} n{n} nth{nth}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_kernel_packs_the_same_floats() {
        if !crate::isa::test_gate("avx512f-gemm") {
            return;
        }
        let best = Kernel::best().expect("the gate says the AVX-512 kernel runs here");
        // Whole and short panels, one and several inner blocks.
        for (k, m) in [(5, 50), (384, 96), (800, 130), (1000, 96), (1600, 97)] {
            let mut s = (k * 31 + m) as u64;
            let a: Vec<f32> = (0..k * m).map(|_| lcg(&mut s)).collect();
            let am = MatF32::from_slice(&a, k, m);
            let mut want = vec![f32::NAN; packed_a_len(m, k)];
            pack_a(Kernel::Portable, &am, &mut want);
            let mut got = vec![f32::NAN; packed_a_len(m, k)];
            pack_a(best, &am, &mut got);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "k{k} m{m}"
            );
        }
    }

    #[test]
    fn inner_blocks_are_even_and_bounded() {
        for k in [1, 15, 16, 384, 768, 769, 1536, 4096, 5000] {
            let kc = kc_for(k);
            let blocks = k.div_ceil(kc);
            assert!(kc <= KC_MAX && kc.is_multiple_of(16), "k{k}: kc {kc}");
            assert_eq!(blocks, k.div_ceil(KC_MAX), "k{k}: the fewest blocks");
            // The last block is not much shorter than the others.
            assert!(k - (blocks - 1) * kc + 16 * blocks >= kc, "k{k}: kc {kc}");
            let mc = mc_for(kc);
            assert!(
                mc.is_multiple_of(MR) && mc * kc <= A_BLOCK.max(MR * kc),
                "kc{kc}: mc {mc}"
            );
        }
        assert_eq!((kc_for(384), mc_for(384)), (384, 384));
        assert_eq!((kc_for(4096), mc_for(kc_for(4096))), (688, 192));
    }

    #[test]
    fn grid_covers_every_element_once() {
        let shapes: &[(usize, usize, usize, usize, usize)] = if cfg!(miri) {
            &[(33, 8, 81, 4, 2), (1, 1, 1, 1, 1)]
        } else {
            &[
                (384, 384, 4096, 1, 2),
                (4096, 4096, 4096, 1, 2),
                (4096, 4096, 1000, 1, 3),
                (128, 64, 128, 384, 2),
                (33, 8, 81, 4, 2),
                (4096, 16, 96, 1, 2),
                (1, 1, 1, 1, 1),
            ]
        };
        for &(m, k, n, nb, nth) in shapes {
            let g = Grid::new(m, k, n, nb, nth);
            let mut seen = vec![0u8; m * n];
            for u in 0..g.units_per_matrix() {
                let (r, c) = g.unit(u);
                for j in c {
                    for i in r.clone() {
                        seen[j * m + i] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&x| x == 1), "{m}x{n}");
        }
    }

    #[test]
    fn weights_beyond_l2_get_wider_units() {
        // 384 × 384 weights (576 KiB) stay in L2: 256-column units.
        let (_, cols) = Grid::new(384, 384, 4096, 1, 2).unit(0);
        assert_eq!(cols.len(), MIN_UNIT_COLS.next_multiple_of(NR));
        // 4096 × 4096 weights (64 MiB) stream from L3: units of 1024 columns, rows split
        // instead, still about UNITS_PER_THREAD units per thread.
        let g = Grid::new(4096, 4096, 4096, 1, 2);
        let (rows, cols) = g.unit(0);
        assert_eq!(cols.len(), MIN_UNIT_COLS_STREAMED.next_multiple_of(NR));
        assert_eq!(rows.len(), 1024);
        assert_eq!(g.units_per_matrix(), 2 * UNITS_PER_THREAD);
    }
}
