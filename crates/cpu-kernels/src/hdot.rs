//! Products with f16 weights in ggml's summation orders (the attention's `K·Q` and `V·P`
//! over an f16 KV cache).
//!
//! ggml converts `src1` to f16 first (its `vec_dot_type` for f16 weights; the executor
//! rounds the column), so every product of two f16 values is exact in f32 and only the
//! order of the additions is left. Its AVX-512 build (the build llama.cpp's reference
//! outputs were made with) uses two orders:
//!
//! * **one column** (`ggml_vec_dot_f16`): four accumulators of 16 lanes over steps of 64
//!   elements (FMA), reduced as `(a0 + a2) + (a1 + a3)` lane by lane and then across the
//!   lanes in `_mm512_reduce_add_ps`'s order; elements past the last step of 64 are added
//!   one by one in f64.
//! * **two or more columns** (llamafile's `tinyBLAS`, taken when the length is a multiple
//!   of 16 and the row count of 4): one accumulator of 16 lanes over steps of 16, reduced the
//!   same way. Other shapes fall back to the one-column order.
//!
//! The functions here are portable code (`f32::mul_add` fuses at every level), compiled for
//! AVX2/FMA at run time where available so they vectorise; every level gives the same bits.
//! One-column products whose weights stream from DRAM read the f16 rows in place with
//! AVX-512 ([`dot_rows_f16`]), converting in registers, in the same order; so do the
//! one-column-order products of several columns per matrix (a decode step's attention with
//! grouped-query heads, [`dot_pairs_f16`]), each row converted once for its columns and
//! sixteen products reduced together. With SmolLM2's shapes (`mul_mat/f16_attention_30_layers_
//! kv512_x1` in `benches/kernels.rs`, old and new builds alternated three times on a loaded
//! machine) the step's attention products took 0.63–0.73 ms against 1.12–1.17 on two threads
//! (1.21–1.35 against 2.13–2.59 on one), where the rows were converted into f32 scratch
//! first and each product reduced on its own; in a `tg64` step (`llm_bench --profile`) they
//! took 0.83–0.91 ms against 1.10–1.66.
//!
//! Indexing: [`dot_rows`] asserts the row and column lengths once; the loops below index
//! `chunks_exact` pieces and the fixed-size accumulators with constant bounds.

use crate::gexp::reduce16;

/// Which of ggml's orders a product takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// `ggml_vec_dot_f16` (one column).
    VecDot,
    /// llamafile's tinyBLAS (several columns).
    Tiny,
}

impl Order {
    /// The order ggml uses for a product of `m` weight rows of length `k` with `n` columns.
    pub(crate) fn for_shape(k: usize, m: usize, n: usize) -> Order {
        if n >= 2 && k.is_multiple_of(16) && m.is_multiple_of(4) {
            Order::Tiny
        } else {
            Order::VecDot
        }
    }
}

#[inline(always)]
fn vec_dot(row: &[f32], col: &[f32]) -> f32 {
    let k = col.len();
    let np = k / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for (r, c) in row[..np].chunks_exact(64).zip(col[..np].chunks_exact(64)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                a[l] = r[16 * j + l].mul_add(c[16 * j + l], a[l]);
            }
        }
    }
    let mut x = [0.0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut sum = f64::from(reduce16(&x));
    for (&a, &b) in row[np..k].iter().zip(&col[np..]) {
        sum += f64::from(a * b);
    }
    sum as f32
}

#[inline(always)]
fn tiny(row: &[f32], col: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for (r, c) in row.chunks_exact(16).zip(col.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = r[l].mul_add(c[l], acc[l]);
        }
    }
    reduce16(&acc)
}

#[inline(always)]
fn rows_portable<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    let k = col.len();
    // Plain loops rather than `rows.map(..)`: a closure is a function of its own that need
    // not be inlined, and outside `rows_fma`'s target features `mul_add` becomes a call to
    // the library's `fmaf` per element (same bits, some fifty times slower).
    let mut out = [0.0f32; R];
    for i in 0..R {
        let r = &rows[i][..k];
        out[i] = match order {
            Order::VecDot => vec_dot(r, col),
            Order::Tiny => tiny(r, col),
        };
    }
    out
}

/// `out[r] = rows[r] · col` in `order` (each row at least `col.len()` long; for
/// [`Order::Tiny`] the length a multiple of 16).
pub(crate) fn dot_rows<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    assert!(
        rows.iter().all(|r| r.len() >= col.len())
            && (order == Order::VecDot || col.len().is_multiple_of(16)),
        "hdot::dot_rows: short row or bad length (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { rows_fma(order, rows, col) };
    }
    rows_portable(order, rows, col)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2,fma")]
fn rows_fma<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    if order == Order::Tiny {
        return rows_portable(order, rows, col);
    }
    // The one-column order with explicit 256-bit vectors (left to itself the compiler used
    // 128-bit ones and spilled the accumulators): the same lane-wise fused operations.
    use std::arch::x86_64::*;
    let k = col.len();
    let np = k / 64 * 64;
    let mut out = [0.0f32; R];
    for (o, row) in out.iter_mut().zip(rows) {
        let row = &row[..k];
        let mut acc = [_mm256_setzero_ps(); 8];
        for (r, c) in row[..np].chunks_exact(64).zip(col[..np].chunks_exact(64)) {
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` and `c` hold 64 floats and `8 · h + 8 <= 64`.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(r.as_ptr().add(8 * h)),
                        _mm256_loadu_ps(c.as_ptr().add(8 * h)),
                    )
                };
                *a = _mm256_fmadd_ps(x, y, *a);
            }
        }
        // Accumulator j of the portable code is acc[2j] (lanes 0..8) and acc[2j + 1].
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let mut x = [0.0f32; 16];
        // SAFETY: `x` holds sixteen floats.
        unsafe {
            _mm256_storeu_ps(x.as_mut_ptr(), lo);
            _mm256_storeu_ps(x.as_mut_ptr().add(8), hi);
        }
        let mut sum = f64::from(reduce16(&x));
        for (&a, &b) in row[np..].iter().zip(&col[np..]) {
            sum += f64::from(a * b);
        }
        *o = sum as f32;
    }
    out
}

/// Rounds every value of `v` to f16 and back (round to nearest even), as ggml's conversion
/// of `src1` to f16 does: with F16C eight at a time, else (and for the tail) by `half`,
/// which rounds the same way.
pub(crate) fn round_to_f16(v: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C (checked just above).
        return unsafe { round_to_f16_f16c(v) };
    }
    round_to_f16_portable(v);
}

fn round_to_f16_portable(v: &mut [f32]) {
    v.iter_mut()
        .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2,f16c")]
fn round_to_f16_f16c(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds eight floats.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    round_to_f16_portable(chunks.into_remainder());
}

/// Rows of a [`dot_rows_f16`] call. Six rows keep their 24 accumulators and the column's
/// four vectors in registers (with eight, 32 accumulators, the compiler kept some on the
/// stack). What limits a one-thread stream from DRAM here is not arithmetic (the kernel runs
/// at about three times that rate with its weights in L2) but how many vector operations
/// wait on each cache line in flight: a loop of the same shape with one operation per line
/// read at the read ceiling, with two (the least for f16: sixteen f32 lanes per FMA, 32
/// elements per line) at 0.85. Six rows without spills came closest: 0.93–0.95 of the
/// one-thread read against 0.87–0.88 with eight (median of 30 interleaved rounds, three
/// runs; a stand-alone loop over 64 MiB, not kept in the repository).
pub(crate) const F16_ROWS: usize = 6;

/// Whether [`dot_rows_f16`] runs its AVX-512 body on this CPU. The executor then reads
/// one-column f16 products' rows in place (16 bits an element from DRAM, converted in
/// registers) instead of converting them into f32 scratch first, which made a product
/// with weights larger than the L3 cache convert-bound (0.13–0.3 of the read ceiling).
pub(crate) fn has_direct_f16() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("fma")
    {
        return true;
    }
    false
}

/// `out[r] = rows[r] · col` in [`Order::VecDot`], the rows as f16 bits (two little-endian
/// bytes an element, at least `2 · col.len()` bytes each): the same bits as [`dot_rows`]
/// on the rows converted to f32 (the conversion is exact, and every lane sees the same
/// fused multiply-adds in the same order).
pub(crate) fn dot_rows_f16(rows: [&[u8]; F16_ROWS], col: &[f32]) -> [f32; F16_ROWS] {
    let k = col.len();
    assert!(
        rows.iter().all(|r| r.len() / 2 >= k),
        "hdot::dot_rows_f16: short row (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if has_direct_f16() {
        // SAFETY: the CPU has AVX-512F, F16C and FMA (checked just above); every row holds
        // at least `2 · k` bytes (asserted above).
        return unsafe { rows_f16_avx512(rows, col) };
    }
    rows.map(|r| vec_dot_f16(r, col))
}

/// The f16 value of element `i` of a row of f16 bits, as f32.
#[inline(always)]
fn f16_at(row: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
}

/// [`vec_dot`] on a row of f16 bits, converting each step of 64 as it goes.
fn vec_dot_f16(row: &[u8], col: &[f32]) -> f32 {
    let k = col.len();
    let np = k / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for (s, c) in col[..np].chunks_exact(64).enumerate() {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let i = 16 * j + l;
                *al = f16_at(row, 64 * s + i).mul_add(c[i], *al);
            }
        }
    }
    let x: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut sum = f64::from(reduce16(&x));
    for (i, &b) in col.iter().enumerate().skip(np) {
        sum += f64::from(f16_at(row, i) * b);
    }
    sum as f32
}

/// How far ahead (in elements: 2 KiB of f16) [`rows_f16_avx512`] prefetches each row; past
/// a row's end that is the start of the next row, which the executor's units read next in
/// the same stream. One thread over 64 MiB of f16 weights (`benches/matvec.rs`,
/// `BENCH_THREADS=1`, three alternated runs of 20 rounds on a loaded machine): 0.90 of the
/// read (median of rounds) against 0.81 at 1 KiB; 1.5 KiB 0.89, 3 KiB 0.86, 4 KiB and 512
/// bytes worse, `prefetcht1` (2, 4 or 8 KiB ahead) worse, `prefetchnta` no better, none at
/// all slower. (Before the units ran their rows as continuous streams, 2 KiB was no better
/// than 1 KiB.)
#[cfg(all(target_arch = "x86_64", not(miri)))]
const F16_PREFETCH: usize = 1024;

/// [`dot_rows_f16`] with 512-bit vectors: accumulator `(r, j)` is one vector, its lane
/// `l` the portable accumulator `j`'s lane `l` of row `r`; each step converts 16 f16
/// elements of a row with `vcvtph2ps`, and each step of 64 prefetches two cache lines of
/// each row [`F16_PREFETCH`] elements ahead.
///
/// The conversion is `_mm512_cvt_roundph_ps` with the current rounding mode, not
/// `_mm512_cvtph_ps`: the latter is encoded with exceptions suppressed (`{sae}`), a form that
/// cannot take its operand from memory and that ran slower on the development machine
/// (Zen 5); the values are the same (f16 to f32 is exact).
///
/// # Safety
/// AVX-512F, F16C and FMA; every row at least `2 · col.len()` bytes.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,f16c,fma")]
unsafe fn rows_f16_avx512(rows: [&[u8]; F16_ROWS], col: &[f32]) -> [f32; F16_ROWS] {
    use std::arch::x86_64::*;
    let k = col.len();
    let np = k / 64 * 64;
    let rp = rows.map(<[u8]>::as_ptr);
    let c = col.as_ptr();
    // acc[4r + j]
    let mut acc = [_mm512_setzero_ps(); 4 * F16_ROWS];
    let mut i = 0;
    while i < np {
        // SAFETY: `i + 64 <= np <= k`: the column's floats [i, i + 64) and each row's bytes
        // [2i, 2i + 128) are inside them (caller's contract). Prefetch addresses are computed
        // with `wrapping_add` (they may lie past a row's end) and a prefetch never faults.
        unsafe {
            for &p in &rp {
                let ahead = p.wrapping_add(2 * (i + F16_PREFETCH));
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
            }
            let y: [__m512; 4] = std::array::from_fn(|j| _mm512_loadu_ps(c.add(i + 16 * j)));
            for r in 0..F16_ROWS {
                for j in 0..4 {
                    let h = _mm256_loadu_si256(rp[r].add(2 * (i + 16 * j)).cast());
                    let x = _mm512_cvt_roundph_ps::<_MM_FROUND_CUR_DIRECTION>(h);
                    acc[4 * r + j] = _mm512_fmadd_ps(x, y[j], acc[4 * r + j]);
                }
            }
        }
        i += 64;
    }
    let mut out = [0.0f32; F16_ROWS];
    // Indexed by constants (a slice of `acc` kept it in memory through the loop).
    let sums: [__m512; F16_ROWS] = std::array::from_fn(|r| {
        _mm512_add_ps(
            _mm512_add_ps(acc[4 * r], acc[4 * r + 2]),
            _mm512_add_ps(acc[4 * r + 1], acc[4 * r + 3]),
        )
    });
    for ((o, &v), row) in out.iter_mut().zip(&sums).zip(rows) {
        let mut x = [0.0f32; 16];
        // SAFETY: `x` holds sixteen floats.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) };
        let mut sum = f64::from(reduce16(&x));
        for (t, &b) in col.iter().enumerate().skip(np) {
            sum += f64::from(f16_at(row, t) * b);
        }
        *o = sum as f32;
    }
    out
}

/// Rows of a [`dot_tile`] call.
pub(crate) const TILE_ROWS: usize = 4;
/// Columns of a [`dot_tile`] call.
pub(crate) const TILE_COLS: usize = 4;

/// `out[c][r] = rows[r] · cols[c]` in [`Order::Tiny`] for a tile of [`TILE_ROWS`] rows and
/// [`TILE_COLS`] columns (every column of one length, a multiple of 16; every row at least
/// that long).
///
/// Each result is the one [`dot_rows`] gives for its row and column: the tile only lets
/// one load of a row or column serve four products, and (with AVX-512) the sixteen 16-lane
/// accumulators be reduced together, in `_mm512_reduce_add_ps`'s order lane for lane.
pub(crate) fn dot_tile(
    isa: crate::quant::Isa,
    rows: [&[f32]; TILE_ROWS],
    cols: [&[f32]; TILE_COLS],
) -> [[f32; TILE_ROWS]; TILE_COLS] {
    let k = cols[0].len();
    assert!(
        k.is_multiple_of(16)
            && cols.iter().all(|c| c.len() == k)
            && rows.iter().all(|r| r.len() >= k),
        "hdot::dot_tile: short row or bad length (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if isa == crate::quant::Isa::Avx512
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has AVX-512F and FMA (checked just above); lengths asserted.
        return unsafe { tile_avx512(rows, cols) };
    }
    let _ = isa;
    cols.map(|c| dot_rows(Order::Tiny, rows, c))
}

/// [`dot_tile`] with 512-bit vectors: accumulator `(c, r)` is one register, its lane `l`
/// the portable accumulator's lane `l`.
///
/// # Safety
/// AVX-512F and FMA; every column `k` long (a multiple of 16), every row at least `k`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile_avx512(
    rows: [&[f32]; TILE_ROWS],
    cols: [&[f32]; TILE_COLS],
) -> [[f32; TILE_ROWS]; TILE_COLS] {
    use std::arch::x86_64::*;
    let k = cols[0].len();
    let rp = rows.map(<[f32]>::as_ptr);
    let cp = cols.map(<[f32]>::as_ptr);
    // acc[4c + r]
    let mut acc = [_mm512_setzero_ps(); 16];
    for i in (0..k).step_by(16) {
        // SAFETY: `i + 16 <= k` and every row and column holds `k` floats.
        let (x, y) = unsafe {
            (
                rp.map(|p| _mm512_loadu_ps(p.add(i))),
                cp.map(|p| _mm512_loadu_ps(p.add(i))),
            )
        };
        for c in 0..TILE_COLS {
            for r in 0..TILE_ROWS {
                acc[4 * c + r] = _mm512_fmadd_ps(x[r], y[c], acc[4 * c + r]);
            }
        }
    }
    let e = reduce16x16(acc);
    // Accumulator 4c + r.
    std::array::from_fn(|c| std::array::from_fn(|r| e[4 * c + r]))
}

/// `out[i] = reduce16(v[i])` for sixteen vectors at once: each level of
/// `_mm512_reduce_add_ps`'s tree adds the same pairs of lanes as [`reduce16`], several
/// vectors' lanes per instruction (21 shuffles and 15 additions for the sixteen).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16x16(v: [std::arch::x86_64::__m512; 16]) -> [f32; 16] {
    use std::arch::x86_64::*;
    // 1: `v[8 + i] + v[i]`, two vectors a register.
    let t: [__m512; 8] = std::array::from_fn(|j| {
        let (a, b) = (v[2 * j], v[2 * j + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0xEE>(a, b),
            _mm512_shuffle_f32x4::<0x44>(a, b),
        )
    });
    // 2: `t3[4 + i] + t3[i]`, four vectors a register (128-bit lane j of u[q] is vector
    // 4q + j).
    let u: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (t[2 * q], t[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0xDD>(a, b),
            _mm512_shuffle_f32x4::<0x88>(a, b),
        )
    });
    // 3: `(t6[0] + t6[2]) + (t6[1] + t6[3])`: element 4j + q of the result is vector 4q + j.
    let pair =
        |p: __m512, q: __m512| _mm512_add_ps(_mm512_unpacklo_ps(p, q), _mm512_unpackhi_ps(p, q));
    let (x, w) = (pair(u[0], u[1]), pair(u[2], u[3]));
    let (xd, wd) = (_mm512_castps_pd(x), _mm512_castps_pd(w));
    let sum = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(xd, wd)),
        _mm512_castpd_ps(_mm512_unpackhi_pd(xd, wd)),
    );
    let mut e = [0.0f32; 16];
    // SAFETY: `e` holds sixteen floats.
    unsafe { _mm512_storeu_ps(e.as_mut_ptr(), sum) };
    std::array::from_fn(|i| e[4 * (i % 4) + i / 4])
}

/// (row, column) pairs of a [`dot_pairs_f16`] call: one [`reduce16x16`] serves sixteen.
pub(crate) const F16_PAIRS: usize = 16;

/// `out[c · rows.len() + r] = rows[r] · cols[c]` in [`Order::VecDot`], the rows as f16 bits
/// read in place (at least `2 · k` bytes each, `k` the columns' common length), for at most
/// [`F16_PAIRS`] pairs: the bits of [`dot_rows`] on the rows converted to f32.
///
/// Why: with grouped-query attention a decode step's `K·Q` and `V·P` have several query
/// heads' columns per f16 matrix of the cache, and a short `K` row (a head of 64 elements)
/// makes the one-column kernels spend most of their time converting rows into scratch and
/// reducing each product's sixteen lanes on its own. Here each row is converted in registers
/// once for all its columns and sixteen products are reduced together.
pub(crate) fn dot_pairs_f16(rows: &[&[u8]], cols: &[&[f32]], out: &mut [f32]) {
    let k = cols.first().map_or(0, |c| c.len());
    assert!(
        rows.len() * cols.len() <= F16_PAIRS
            && out.len() == rows.len() * cols.len()
            && cols.iter().all(|c| c.len() == k)
            && rows.iter().all(|r| r.len() / 2 >= k),
        "hdot::dot_pairs_f16: too many pairs, short row or column (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if has_direct_f16() {
        // SAFETY: the CPU has AVX-512F, F16C and FMA (checked just above); lengths asserted.
        return unsafe { pairs_f16_avx512(rows, cols, out) };
    }
    for (c, col) in cols.iter().enumerate() {
        for (r, row) in rows.iter().enumerate() {
            out[c * rows.len() + r] = vec_dot_f16(row, col);
        }
    }
}

/// [`dot_pairs_f16`] with 512-bit vectors: two to four columns in one of the fixed shapes of
/// [`pairs_fixed`] (sixteen pairs; the rows of a short group repeated, their products
/// dropped), other column counts one pair at a time; then each pair's tail in f64.
///
/// # Safety
/// AVX-512F, F16C and FMA; lengths as [`dot_pairs_f16`] asserts.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,f16c,fma")]
unsafe fn pairs_f16_avx512(rows: &[&[u8]], cols: &[&[f32]], out: &mut [f32]) {
    let k = cols.first().map_or(0, |c| c.len());
    let np = k / 64 * 64;
    let nr = rows.len();
    if nr == 0 || cols.is_empty() {
        return;
    }
    let rp = |i: usize| rows[i.min(nr - 1)].as_ptr();
    let cp = |j: usize| cols[j.min(cols.len() - 1)].as_ptr();
    // sums[c · nr + r] for the fixed shapes (their `NR` is at least `nr`).
    macro_rules! fixed {
        ($nr:literal, $nc:literal) => {{
            // SAFETY: every row holds `2 · k` bytes and every column `k` floats (caller's
            // contract).
            let s = unsafe {
                pairs_fixed::<$nr, $nc>(std::array::from_fn(rp), std::array::from_fn(cp), np)
            };
            let mut sums = [0.0f32; F16_PAIRS];
            for c in 0..$nc {
                sums[c * nr..(c + 1) * nr].copy_from_slice(&s[c * $nr..c * $nr + nr]);
            }
            sums
        }};
    }
    let sums = match cols.len() {
        2 => fixed!(8, 2),
        3 => fixed!(5, 3),
        4 => fixed!(4, 4),
        nc => {
            let mut sums = [0.0f32; F16_PAIRS];
            for c in 0..nc {
                for r in 0..nr {
                    // SAFETY: as above.
                    sums[c * nr + r] = unsafe { pairs_fixed::<1, 1>([rp(r)], [cp(c)], np) }[0];
                }
            }
            sums
        }
    };
    for ((o, s), col) in out
        .chunks_exact_mut(nr)
        .zip(sums.chunks_exact(nr))
        .zip(cols)
    {
        for ((o, &s), row) in o.iter_mut().zip(s).zip(rows) {
            let mut sum = f64::from(s);
            for (t, &b) in col.iter().enumerate().skip(np) {
                sum += f64::from(f16_at(row, t) * b);
            }
            *o = sum as f32;
        }
    }
}

/// `NR` f16 rows against `NC` columns over the first `np` elements (a multiple of 64), `NR ·
/// NC ≤ 16`: `out[c · NR + r]` is [`vec_dot`]'s sum before the tail (its four accumulators
/// over steps of 64, combined as `(a0 + a2) + (a1 + a3)`, then [`reduce16`]). Each row's
/// step of 64 is converted once for its `NC` columns, and the products are reduced together
/// ([`reduce16x16`]).
///
/// # Safety
/// AVX-512F, F16C and FMA; every row holds `2 · np` bytes and every column `np` floats.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
#[target_feature(enable = "avx512f,f16c,fma")]
unsafe fn pairs_fixed<const NR: usize, const NC: usize>(
    rows: [*const u8; NR],
    cols: [*const f32; NC],
    np: usize,
) -> [f32; 16] {
    use std::arch::x86_64::*;
    let mut x = [_mm512_setzero_ps(); 16];
    for (r, &row) in rows.iter().enumerate() {
        // acc[j][c]
        let mut acc = [[_mm512_setzero_ps(); NC]; 4];
        let mut i = 0;
        while i < np {
            for (j, aj) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 64 <= np`: the row's bytes [2i, 2i + 128) and each column's
                // floats [i, i + 64) are inside them (caller's contract).
                unsafe {
                    let h = _mm256_loadu_si256(row.add(2 * (i + 16 * j)).cast());
                    let v = _mm512_cvt_roundph_ps::<_MM_FROUND_CUR_DIRECTION>(h);
                    for (a, &col) in aj.iter_mut().zip(&cols) {
                        *a = _mm512_fmadd_ps(v, _mm512_loadu_ps(col.add(i + 16 * j)), *a);
                    }
                }
            }
            i += 64;
        }
        for c in 0..NC {
            x[c * NR + r] = _mm512_add_ps(
                _mm512_add_ps(acc[0][c], acc[2][c]),
                _mm512_add_ps(acc[1][c], acc[3][c]),
            );
        }
    }
    if NR * NC == 1 {
        let mut l = [0.0f32; 16];
        // SAFETY: `l` holds sixteen floats.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), x[0]) };
        let mut out = [0.0f32; 16];
        out[0] = reduce16(&l);
        return out;
    }
    reduce16x16(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test values spread over magnitudes (f16-representable) so that the order of the
    /// additions shows: a pseudo-random value in −1000..1000 times `big` at every `every`-th
    /// index, else times 10⁻³.
    fn spread_f16(i: usize, every: usize, big: f32) -> half::f16 {
        let x = (i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0;
        half::f16::from_f32(x * if i.is_multiple_of(every) { big } else { 1e-3 })
    }

    /// `n` rows of `len` f16 values (row `r`, element `i`: `spread_f16(4i + r, 5, 3.0)`), and
    /// the same rows as little-endian bytes.
    fn f16_rows(n: usize, len: usize) -> (Vec<Vec<half::f16>>, Vec<Vec<u8>>) {
        let halves: Vec<Vec<half::f16>> = (0..n)
            .map(|r| (0..len).map(|i| spread_f16(i * 4 + r, 5, 3.0)).collect())
            .collect();
        let bytes = halves
            .iter()
            .map(|h| h.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect();
        (halves, bytes)
    }

    #[test]
    fn orders_are_as_described_and_levels_agree() {
        // Values whose sums round differently in different orders.
        let k = 80;
        let row: Vec<f32> = (0..k).map(|i| 1.0 + (i as f32) * 1e-3).collect();
        let col: Vec<f32> = (0..k)
            .map(|i| if i % 7 == 0 { 1e4 } else { 1e-3 * i as f32 })
            .collect();
        // One column: lane sums over the one full step of 64, then the tail in f64.
        let mut lanes = [[0.0f32; 16]; 4];
        for i in 0..64 {
            lanes[i / 16][i % 16] = row[i] * col[i];
        }
        let x: [f32; 16] =
            std::array::from_fn(|l| (lanes[0][l] + lanes[2][l]) + (lanes[1][l] + lanes[3][l]));
        let mut want = f64::from(reduce16(&x));
        for i in 64..k {
            want += f64::from(row[i] * col[i]);
        }
        let [got] = dot_rows(Order::VecDot, [&row[..]], &col);
        assert_eq!(got, want as f32);
        assert_eq!(rows_portable(Order::VecDot, [&row[..]], &col), [got]);
        // Several columns: one 16-lane accumulator over steps of 16.
        let mut acc = [0.0f32; 16];
        for i in 0..k {
            acc[i % 16] = row[i].mul_add(col[i], acc[i % 16]);
        }
        let [got] = dot_rows(Order::Tiny, [&row[..]], &col);
        assert_eq!(got, reduce16(&acc));
        assert_eq!(rows_portable(Order::Tiny, [&row[..]], &col), [got]);
        assert_eq!(Order::for_shape(64, 256, 1), Order::VecDot);
        assert_eq!(Order::for_shape(64, 256, 2), Order::Tiny);
        assert_eq!(Order::for_shape(40, 256, 2), Order::VecDot);
        assert_eq!(Order::for_shape(64, 6, 2), Order::VecDot);
    }

    #[test]
    fn f16_rounding_matches_half() {
        let mut v: Vec<f32> = (0..1000)
            .map(|i| {
                let x = (i as f32 - 500.0) * 1.000_37e-3 * 2f32.powi(i % 40 - 20);
                if i % 97 == 0 { f32::INFINITY } else { x }
            })
            .collect();
        v.extend([
            65520.0,
            65519.0,
            6e-8,
            3e-8,
            1e-40,
            -0.0,
            2049.0,
            2051.0,
            f32::NAN,
        ]);
        let mut want = v.clone();
        round_to_f16_portable(&mut want);
        round_to_f16(&mut v);
        assert_eq!(
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn tiles_give_each_pair_its_own_product() {
        let val = |i: usize| spread_f16(i, 3, 7.0).to_f32();
        for k in [16, 64, 256] {
            let rows: Vec<Vec<f32>> = (0..TILE_ROWS)
                .map(|r| (0..k).map(|i| val(i * 5 + r)).collect())
                .collect();
            let cols: Vec<Vec<f32>> = (0..TILE_COLS)
                .map(|c| (0..k).map(|i| val(i * 3 + 999 * c + 1)).collect())
                .collect();
            let rws: [&[f32]; TILE_ROWS] = std::array::from_fn(|r| &rows[r][..]);
            let cls: [&[f32]; TILE_COLS] = std::array::from_fn(|c| &cols[c][..]);
            for isa in crate::quant::Isa::available() {
                let got = dot_tile(isa, rws, cls);
                for c in 0..TILE_COLS {
                    let want = rows_portable(Order::Tiny, rws, cls[c]);
                    assert_eq!(
                        got[c].map(f32::to_bits),
                        want.map(f32::to_bits),
                        "k {k}, {isa:?}, column {c}"
                    );
                }
            }
        }
    }

    /// The in-place f16 rows give the bits of the converted rows' one-column order, at every
    /// level (the AVX-512 body where the CPU has it, the portable one under Miri).
    #[test]
    fn f16_rows_in_place_match_the_converted_rows() {
        let val = |i: usize| spread_f16(i, 5, 3.0);
        let lens: &[usize] = if cfg!(miri) {
            &[0, 5, 64, 70]
        } else {
            &[0, 1, 63, 64, 65, 100, 512, 1000, 4133]
        };
        for &k in lens {
            let (halves, bytes) = f16_rows(F16_ROWS, k + 3);
            let rows: Vec<Vec<f32>> = halves
                .iter()
                .map(|h| h.iter().map(|v| v.to_f32()).collect())
                .collect();
            let col: Vec<f32> = (0..k).map(|i| val(i + 7777).to_f32()).collect();
            let want = rows_portable(
                Order::VecDot,
                std::array::from_fn::<_, F16_ROWS, _>(|r| &rows[r][..]),
                &col,
            );
            let rb: [&[u8]; F16_ROWS] = std::array::from_fn(|r| &bytes[r][..]);
            assert_eq!(
                dot_rows_f16(rb, &col).map(f32::to_bits),
                want.map(f32::to_bits),
                "k {k}"
            );
            assert_eq!(
                rb.map(|r| vec_dot_f16(r, &col).to_bits()),
                want.map(f32::to_bits),
                "k {k}, portable"
            );
        }
    }

    /// Several f16 rows in place against several columns (grouped-query attention): every
    /// pair has the bits of the converted row's one-column order, for every split of the
    /// sixteen pairs between rows and columns, with and without a tail past the last step.
    #[test]
    fn f16_pairs_match_the_one_column_order() {
        let val = |i: usize| spread_f16(i, 5, 3.0);
        let lens: &[usize] = if cfg!(miri) {
            &[0, 64, 70]
        } else {
            &[0, 5, 64, 70, 256, 300]
        };
        let shapes: &[(usize, usize)] = if cfg!(miri) {
            &[(5, 3), (1, 16), (16, 1)]
        } else {
            &[
                (1, 2),
                (8, 2),
                (5, 3),
                (4, 4),
                (3, 5),
                (2, 8),
                (1, 16),
                (2, 7),
                (16, 1),
                (7, 1),
            ]
        };
        for &k in lens {
            for &(nr, nc) in shapes {
                let (halves, bytes) = f16_rows(nr, k + 3);
                let cols: Vec<Vec<f32>> = (0..nc)
                    .map(|c| (0..k).map(|i| val(i + 7777 + 131 * c).to_f32()).collect())
                    .collect();
                let rws: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
                let cls: Vec<&[f32]> = cols.iter().map(|c| &c[..]).collect();
                let mut got = vec![0.0f32; nr * nc];
                dot_pairs_f16(&rws, &cls, &mut got);
                for c in 0..nc {
                    for r in 0..nr {
                        let row: Vec<f32> = halves[r].iter().map(|v| v.to_f32()).collect();
                        let [want] = rows_portable(Order::VecDot, [&row[..]], &cols[c]);
                        assert_eq!(
                            got[c * nr + r].to_bits(),
                            want.to_bits(),
                            "k {k}, {nr} x {nc}, row {r}, column {c}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn vector_kernel_matches_portable_on_the_attention_shapes() {
        // Values spread over magnitudes (f16-representable) so the order of additions shows.
        let val = |i: usize| spread_f16(i, 5, 3.0).to_f32();
        for k in [64, 100, 256, 512] {
            let rows: Vec<Vec<f32>> = (0..8)
                .map(|r| (0..k).map(|i| val(i * 8 + r)).collect())
                .collect();
            let col: Vec<f32> = (0..k).map(|i| val(i + 7777)).collect();
            let rws: [&[f32]; 8] = std::array::from_fn(|r| &rows[r][..]);
            for order in [Order::VecDot, Order::Tiny] {
                if order == Order::Tiny && !k.is_multiple_of(16) {
                    continue;
                }
                let got = dot_rows(order, rws, &col);
                let want = rows_portable(order, rws, &col);
                assert_eq!(
                    got.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "k {k}, {order:?}"
                );
            }
        }
    }
}
