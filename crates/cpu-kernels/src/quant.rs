//! Block formats `q8_0` and `q4_0`: dequantize, quantize, and the q4_0 block dot products
//! (q8_0 and q4_1 products are in `qdot`).
//!
//! Layouts (ggml's): a `q8_0` block is an f16 scale `d` then 32 signed bytes, value `q · d`;
//! a `q4_0` block is an f16 scale `d` then 16 bytes whose low nibbles are elements 0..16 and
//! high nibbles elements 16..32, value `(q − 8) · d`. Safe code over byte slices; the
//! quantizers follow ggml's reference rounding so files written by either agree.
//!
//! Indexing: blocks are taken with `chunks_exact` of the block size, so the constant offsets
//! inside a block are in bounds by construction; slice lengths come from the executor, which
//! sizes them from shapes `supports_op` validated (rows of whole blocks), and each dot entry
//! point asserts them once, not per element.

use half::f16;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Bytes of a q8_0 block.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Bytes of a q4_0 block.
pub(crate) const Q4_0_BYTES: usize = 18;

#[inline]
fn scale(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Dequantize q8_0 blocks into `out` (`out.len()` a multiple of 32).
pub(crate) fn dequantize_q8_0(src: &[u8], out: &mut [f32]) {
    for (blk, o) in src.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = scale(blk);
        for (v, &q) in o.iter_mut().zip(&blk[2..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

/// Dequantize q4_0 blocks into `out`.
pub(crate) fn dequantize_q4_0(src: &[u8], out: &mut [f32]) {
    for (blk, o) in src.chunks_exact(Q4_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = scale(blk);
        let (lo, hi) = o.split_at_mut(QK / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&blk[2..]) {
            *l = f32::from((q & 0x0f) as i8 - 8) * d;
            *h = f32::from((q >> 4) as i8 - 8) * d;
        }
    }
}

/// Quantize `x` (a multiple of 32 long) to q8_0 like ggml's reference: `d = max|x| / 127`,
/// `q = round(x / d)` with ties away from zero.
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, &v) in blk[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Bytes of a column packed by [`quantize_q8_col`] for `k` elements (`k` a multiple of 32):
/// per block 32 quants, an f32 scale and an i32 correction.
pub(crate) fn q8_col_bytes(k: usize) -> usize {
    k / QK * (QK + 8)
}

/// Quantize `x` (a multiple of 32 long) like [`quantize_q8_0`] (same quants, same f16-rounded
/// scales) into the column layout the q4_0 dot products read: first every block's 32 quants,
/// then every block's scale as a little-endian f32, then every block's `8 · Σ q` as a
/// little-endian i32 (the q4_0 kernels multiply unsigned nibbles and subtract that).
/// Converting the scales and summing the quants once here keeps that work out of the inner
/// loop, which dots every row of the weights against the same column.
pub(crate) fn quantize_q8_col(x: &[f32], out: &mut [u8]) {
    assert!(
        out.len() >= q8_col_bytes(x.len()),
        "quantize_q8_col: short output (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if x86::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); `out` is long enough
        // (asserted above).
        return unsafe { x86::quantize_q8_col_avx2(x, out) };
    }
    quantize_q8_col_scalar(x, out);
}

/// [`quantize_q8_col`] in portable code (the reference the AVX2 version must match).
fn quantize_q8_col_scalar(x: &[f32], out: &mut [u8]) {
    let nb = x.len() / QK;
    let (qs, rest) = out[..nb * (QK + 8)].split_at_mut(nb * QK);
    let (ds, cs) = rest.split_at_mut(nb * 4);
    let mut blk = [0u8; Q8_0_BYTES];
    for (((xb, q), d), c) in x
        .chunks_exact(QK)
        .zip(qs.chunks_exact_mut(QK))
        .zip(ds.chunks_exact_mut(4))
        .zip(cs.chunks_exact_mut(4))
    {
        quantize_q8_0(xb, &mut blk);
        q.copy_from_slice(&blk[2..]);
        d.copy_from_slice(&scale(&blk).to_le_bytes());
        let sum: i32 = blk[2..].iter().map(|&v| i32::from(v as i8)).sum();
        c.copy_from_slice(&(8 * sum).to_le_bytes());
    }
}

/// Quantize `x` to q4_0 like ggml's reference: `d = m / −8` where `m` is the element of
/// largest magnitude (sign kept), `q = min(15, trunc(x / d + 8.5))`.
pub(crate) fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..QK / 2 {
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            blk[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// One q4_0 row against a [`quantize_q8_col`] column (portable), in exactly the operations
/// and order of the SIMD kernels: per block the exact integer `Σ nibble · q − 8 · Σ q`, the
/// scale product `d_x · d_y` rounded to f32, then a fused multiply-add into one of two
/// accumulators (even blocks, odd blocks), added at the end. So every level gives the same
/// bits.
fn dot_q4_0_col_scalar(x: &[u8], col: &[u8]) -> f32 {
    let nb = col.len() / (QK + 8);
    let (qs, rest) = col.split_at(nb * QK);
    let (ds, cs) = rest.split_at(nb * 4);
    let mut acc = [0.0f32; 2];
    for (b, (xb, q)) in x
        .chunks_exact(Q4_0_BYTES)
        .zip(qs.chunks_exact(QK))
        .enumerate()
        .take(nb)
    {
        let mut s = 0i32;
        for j in 0..QK / 2 {
            s += i32::from(xb[2 + j] & 0x0f) * i32::from(q[j] as i8);
            s += i32::from(xb[2 + j] >> 4) * i32::from(q[j + QK / 2] as i8);
        }
        let c = i32::from_le_bytes([cs[4 * b], cs[4 * b + 1], cs[4 * b + 2], cs[4 * b + 3]]);
        let dy = f32::from_le_bytes([ds[4 * b], ds[4 * b + 1], ds[4 * b + 2], ds[4 * b + 3]]);
        let d = scale(xb) * dy;
        acc[b % 2] = d.mul_add((s - c) as f32, acc[b % 2]);
    }
    acc[0] + acc[1]
}

/// An instruction-set level for the hand-written kernels, detected at run time.
///
/// `Avx2` needs AVX2, FMA and F16C; `Avx512` in addition AVX-512 F, BW, VL and VNNI. Under
/// Miri (and off x86-64) only `Scalar` exists.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(any(miri, not(target_arch = "x86_64")), allow(dead_code))]
pub(crate) enum Isa {
    /// Portable Rust (what Miri checks).
    Scalar,
    /// 256-bit vectors.
    Avx2,
    /// 512-bit vectors and VNNI byte dot products.
    Avx512,
}

impl Isa {
    /// The best level this CPU supports (cached by the standard library's detection).
    #[inline]
    pub(crate) fn best() -> Isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            if x86::has_avx512() {
                return Isa::Avx512;
            }
            if x86::has_avx2_fma_f16c() {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every level this CPU supports, `Scalar` first (for tests comparing them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        let best = Isa::best();
        // The gates say on stderr which levels ran; `best` must agree with them.
        if crate::isa::test_gate("avx2") {
            assert_ne!(
                best,
                Isa::Scalar,
                "the AVX2 path runs here, Isa::best says scalar"
            );
            v.push(Isa::Avx2);
        }
        if crate::isa::test_gate("avx512") {
            assert_eq!(best, Isa::Avx512, "the AVX-512 path runs here");
            v.push(Isa::Avx512);
        }
        v
    }
}

/// q4_0 rows dotted together by [`dot_q4_0_q8_0_rows`]: the column block is loaded once per
/// step and used for all of them, the rows are streamed side by side, and the eight rows'
/// block sums end up in the eight lanes of one vector, so one conversion, one scale multiply
/// and one FMA serve all of them (see the `x86` module).
pub(crate) const ROWS: usize = 8;

/// f32 rows dotted together by [`dot_f32_rows`]. Eight rather than four: a thin f32 product
/// is bound by DRAM reads, and on Zen 3 a core pulls more bandwidth from eight streams read
/// side by side than from four (more misses in flight); eight accumulators also hide the FMA
/// latency without a second vector per row.
pub(crate) const F32_ROWS: usize = 8;

/// `out[r] = rows[r] · col` for [`F32_ROWS`] f32 rows of `col.len()` elements each.
///
/// Each row is summed in vector lanes (16 for `Scalar` and `Avx512`, 8 for `Avx2`) reduced
/// at the end, so the rounding differs between levels by reassociation only. A row's result
/// depends only on that row and the column, never on the other rows of the call.
pub(crate) fn dot_f32_rows(isa: Isa, rows: [&[f32]; F32_ROWS], col: &[f32]) -> [f32; F32_ROWS] {
    let k = col.len();
    assert!(
        rows.iter().all(|r| r.len() >= k),
        "dot_f32_rows: short row (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx512 if x86::has_avx512() => {
            // SAFETY: the CPU has the AVX-512 features (checked in the guard); every row
            // holds at least `col.len()` floats (asserted above).
            unsafe { x86::dot_f32_rows_avx512(rows, col) }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if x86::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; rows are long enough (asserted).
            unsafe { x86::dot_f32_rows8_avx2(rows, col) }
        }
        _ => dot_f32_rows_scalar(rows, col),
    }
}

/// Rows of an f32 tile in [`dot_f32_tile`].
pub(crate) const TILE_ROWS: usize = 4;
/// Columns of an f32 tile in [`dot_f32_tile`].
pub(crate) const TILE_COLS: usize = 3;

/// `out[c][r] = rows[r] · cols[c]` over the first `cols[c].len()` elements, for a tile of
/// [`TILE_ROWS`] rows and [`TILE_COLS`] columns (all columns the same length).
///
/// For batched f32 products with the weights read once per tile: each step loads every row
/// and column vector once and does `TILE_ROWS · TILE_COLS` multiply-adds, twelve
/// accumulators plus three column vectors and a row vector fill AVX2's sixteen registers.
/// The thin kernel [`dot_f32_rows`] does one multiply-add per load, which is right for one
/// column read from DRAM but leaves the FMA units half idle once the weights come from cache.
///
/// Each product is summed in 8 lanes reduced at the end (the AVX-512 level runs the AVX2
/// kernel), then the tail in order; a result depends only on its row and its column.
pub(crate) fn dot_f32_tile(
    isa: Isa,
    rows: [&[f32]; TILE_ROWS],
    cols: [&[f32]; TILE_COLS],
) -> [[f32; TILE_ROWS]; TILE_COLS] {
    let k = cols[0].len();
    assert!(
        cols.iter().all(|c| c.len() == k) && rows.iter().all(|r| r.len() >= k),
        "dot_f32_tile: short row or column (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if x86::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; rows and columns hold at least `k`
            // floats (asserted above).
            unsafe { x86::dot_f32_tile_avx2(rows, cols) }
        }
        _ => dot_f32_tile_scalar(rows, cols),
    }
}

/// [`dot_f32_tile`] in portable Rust: the same 8 lanes per product, reduced pairwise as the
/// AVX2 horizontal sum does, then the tail.
fn dot_f32_tile_scalar(
    rows: [&[f32]; TILE_ROWS],
    cols: [&[f32]; TILE_COLS],
) -> [[f32; TILE_ROWS]; TILE_COLS] {
    const L: usize = 8;
    let k = cols[0].len();
    let full = k / L * L;
    let mut out = [[0.0f32; TILE_ROWS]; TILE_COLS];
    for (o, col) in out.iter_mut().zip(cols) {
        for (o, row) in o.iter_mut().zip(rows) {
            let mut a = [0.0f32; L];
            for (x, y) in row[..full].chunks_exact(L).zip(col[..full].chunks_exact(L)) {
                for l in 0..L {
                    a[l] = x[l].mul_add(y[l], a[l]);
                }
            }
            let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
            let mut sum = (h[0] + h[2]) + (h[1] + h[3]);
            for i in full..k {
                sum += row[i] * col[i];
            }
            *o = sum;
        }
    }
    out
}

fn dot_f32_rows_scalar(rows: [&[f32]; F32_ROWS], col: &[f32]) -> [f32; F32_ROWS] {
    const L: usize = 16;
    let k = col.len();
    let mut acc = [[0.0f32; L]; F32_ROWS];
    let full = k / L * L;
    for i in (0..full).step_by(L) {
        let c = &col[i..i + L];
        for (a, row) in acc.iter_mut().zip(rows) {
            let x = &row[i..i + L];
            for l in 0..L {
                a[l] += x[l] * c[l];
            }
        }
    }
    let mut out = [0.0f32; F32_ROWS];
    for (r, (a, row)) in acc.iter().zip(rows).enumerate() {
        let mut s = 0.0f32;
        for i in full..k {
            s += row[i] * col[i];
        }
        out[r] = a.iter().sum::<f32>() + s;
    }
    out
}

/// `out[c][r]` = the q4_0 row `rows[r]` dotted with the column `cols[c]` packed by
/// [`quantize_q8_col`] (all with the same block count).
///
/// Several columns at once share the rows' unpacked nibbles and scales: with `NC` = 4 a
/// block's weights are unpacked once for four columns, which is most of a quantized
/// product's work once the weights sit in cache (prompt-sized batches).
///
/// The integer sum of every block is exact and all levels then do the same f32 operations in
/// the same order (see [`dot_q4_0_col_scalar`]), so they agree bit for bit; a result
/// depends only on its row and its column, not on `NC` or on the other rows and columns.
pub(crate) fn dot_q4_0_q8_0_rows<const NC: usize>(
    isa: Isa,
    rows: [&[u8]; ROWS],
    cols: [&[u8]; NC],
) -> [[f32; ROWS]; NC] {
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        cols.iter().all(|c| c.len() == nb * (QK + 8))
            && rows.iter().all(|r| r.len() >= nb * Q4_0_BYTES),
        "dot_q4_0_q8_0_rows: short row or column (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx512 if x86::has_avx512() => {
            // SAFETY: the CPU has the AVX-512 features (checked in the guard); every row has
            // `nb` q4_0 blocks and every column is a packed column of `nb` blocks (asserted
            // above).
            unsafe { x86::dot_q4_0_cols_rows8_vnni(rows, cols) }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if x86::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; block counts as above.
            unsafe { x86::dot_q4_0_cols_rows8_avx2(rows, cols) }
        }
        _ => cols.map(|c| rows.map(|r| dot_q4_0_col_scalar(r, c))),
    }
}

/// The same bodies compiled for AVX2 (+FMA), chosen at run time: the crate is built for the
/// baseline x86-64 target, where the compiler may only use SSE2.
///
/// The quantized dots are written with intrinsics: nibbles are widened to bytes and
/// multiplied with the column's signed bytes into i32 lanes (`maddubs` + `madd`, or VNNI's
/// `dpbusd`), each block's exact integer sum is scaled by the two block scales (f16, converted
/// with F16C inside these functions; the q4_0 kernels' column scales come as f32) and
/// accumulated in f32. For q4_0 the nibbles stay
/// unsigned (0..16) and `8 · Σ q8` (precomputed per column block) is subtracted in integers;
/// eight rows' block sums share one vector (see `q4_rows8_kernel`).
/// The CPU checks behind [`Isa::best`], for the other kernel modules' dispatch: AVX2 with FMA
/// and F16C, and that plus AVX-512 F/BW/VL/VNNI.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(crate) use x86::{has_avx2_fma_f16c, has_avx512};

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    pub(crate) fn has_avx2_fma_f16c() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    pub(crate) fn has_avx512() -> bool {
        has_avx2_fma_f16c()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }

    /// How far ahead (in floats: 512 bytes, eight cache lines) [`dot_f32_rows_avx512`]
    /// prefetches each row. One thread reading 64 MiB of f32 weights took 0.84–0.86 of the
    /// eight-stream read's time without prefetch (four rows at a time), 0.90–0.97 with
    /// eight rows, 1.0–1.07 with eight rows and this distance; 256 bytes and 1 KiB were
    /// slower, 1–2 KiB no better (`benches/matvec.rs`, `BENCH_THREADS=1`).
    const PREFETCH_FLOATS_512: usize = 128;

    /// Eight rows against one column, 16 floats per step, two steps per iteration (two
    /// accumulators per row, sixteen independent chains; eight rows read side by side keep
    /// as many DRAM streams in flight as the read ceiling's eight); each row is prefetched
    /// [`PREFETCH_FLOATS_512`] ahead, two cache lines per iteration. The tail uses masked
    /// loads. A row's result depends only on its row and the column: each row has its own
    /// two accumulators, whatever the other rows are.
    ///
    /// # Safety
    /// The CPU must have the `has_avx512` features; every row at least `col.len()` long.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_f32_rows_avx512(rows: [&[f32]; 8], col: &[f32]) -> [f32; 8] {
        let k = col.len();
        let c = col.as_ptr();
        let r = rows.map(<[f32]>::as_ptr);
        let mut a = [_mm512_setzero_ps(); 8];
        let mut b = [_mm512_setzero_ps(); 8];
        let mut i = 0;
        const PF: usize = PREFETCH_FLOATS_512;
        // SAFETY: all loads below stay below index `k`, which every row and `col` hold
        // (caller's contract): full loads read [i, i + 32) with i + 32 <= k, masked loads
        // touch only the lanes below `k - i`. Prefetch addresses are computed with
        // `wrapping_add` (they may lie past a row's end) and a prefetch never faults.
        unsafe {
            while i + 32 <= k {
                for &rj in &r {
                    _mm_prefetch::<_MM_HINT_T0>(rj.wrapping_add(i + PF).cast());
                    _mm_prefetch::<_MM_HINT_T0>(rj.wrapping_add(i + PF + 16).cast());
                }
                let c0 = _mm512_loadu_ps(c.add(i));
                let c1 = _mm512_loadu_ps(c.add(i + 16));
                for j in 0..8 {
                    a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(r[j].add(i)), c0, a[j]);
                    b[j] = _mm512_fmadd_ps(_mm512_loadu_ps(r[j].add(i + 16)), c1, b[j]);
                }
                i += 32;
            }
            while i < k {
                let m: __mmask16 = if k - i >= 16 {
                    0xffff
                } else {
                    (1u16 << (k - i)) - 1
                };
                let c0 = _mm512_maskz_loadu_ps(m, c.add(i));
                for j in 0..8 {
                    a[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, r[j].add(i)), c0, a[j]);
                }
                i += 16;
            }
        }
        let mut out = [0.0f32; 8];
        for j in 0..8 {
            out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a[j], b[j]));
        }
        out
    }

    /// How far ahead (in floats: 256 bytes, four cache lines) [`dot_f32_rows8_avx2`]
    /// prefetches each row. The hardware prefetchers alone left this machine kind's DRAM
    /// bandwidth partly unused; a short distance helped, 1 KiB and more hurt (measured).
    const PREFETCH_FLOATS: usize = 64;

    /// Eight rows against one column, 8 floats per row and step with one accumulator per
    /// row (eight independent FMA chains), two steps per iteration so one prefetch per row
    /// covers the cache line it reads; the tail (`k % 8`) is summed in scalar code.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; every row at least `col.len()` long.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32_rows8_avx2(rows: [&[f32]; 8], col: &[f32]) -> [f32; 8] {
        let k = col.len();
        let c = col.as_ptr();
        let r = rows.map(<[f32]>::as_ptr);
        let mut a = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        // SAFETY: every load reads [i, i + 16) with i + 16 <= k (or [i, i + 8) with
        // i + 8 <= k), inside each row and `col`. Prefetch addresses are computed with
        // `wrapping_add` (they may lie past a row's end) and a prefetch never faults.
        unsafe {
            while i + 16 <= k {
                for &rj in &r {
                    _mm_prefetch::<_MM_HINT_T0>(rj.wrapping_add(i + PREFETCH_FLOATS).cast());
                }
                let c0 = _mm256_loadu_ps(c.add(i));
                for (aj, &rj) in a.iter_mut().zip(&r) {
                    *aj = _mm256_fmadd_ps(_mm256_loadu_ps(rj.add(i)), c0, *aj);
                }
                let c1 = _mm256_loadu_ps(c.add(i + 8));
                for (aj, &rj) in a.iter_mut().zip(&r) {
                    *aj = _mm256_fmadd_ps(_mm256_loadu_ps(rj.add(i + 8)), c1, *aj);
                }
                i += 16;
            }
            if i + 8 <= k {
                let c0 = _mm256_loadu_ps(c.add(i));
                for (aj, &rj) in a.iter_mut().zip(&r) {
                    *aj = _mm256_fmadd_ps(_mm256_loadu_ps(rj.add(i)), c0, *aj);
                }
                i += 8;
            }
        }
        let mut out = [0.0f32; 8];
        for j in 0..8 {
            let mut s = hsum(a[j]);
            for t in i..k {
                s += rows[j][t] * col[t];
            }
            out[j] = s;
        }
        out
    }

    /// [`super::dot_f32_tile`] with AVX2: four rows by three columns, one 8-float step at
    /// a time (three column loads, four row loads, twelve FMAs into twelve accumulators).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; every column holds `k = cols[0].len()` floats
    /// and every row at least `k`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32_tile_avx2(
        rows: [&[f32]; super::TILE_ROWS],
        cols: [&[f32]; super::TILE_COLS],
    ) -> [[f32; super::TILE_ROWS]; super::TILE_COLS] {
        let k = cols[0].len();
        let r = rows.map(<[f32]>::as_ptr);
        let c = cols.map(<[f32]>::as_ptr);
        let mut a = [[_mm256_setzero_ps(); super::TILE_ROWS]; super::TILE_COLS];
        let mut i = 0;
        while i + 8 <= k {
            // SAFETY: [i, i + 8) is inside every row and column (i + 8 <= k).
            unsafe {
                let y = c.map(|c| _mm256_loadu_ps(c.add(i)));
                for (j, &rj) in r.iter().enumerate() {
                    let x = _mm256_loadu_ps(rj.add(i));
                    for (aj, &yc) in a.iter_mut().zip(&y) {
                        aj[j] = _mm256_fmadd_ps(x, yc, aj[j]);
                    }
                }
            }
            i += 8;
        }
        let mut out = [[0.0f32; super::TILE_ROWS]; super::TILE_COLS];
        for ((o, a), col) in out.iter_mut().zip(&a).zip(cols) {
            for ((o, &a), row) in o.iter_mut().zip(a).zip(rows) {
                let mut s = hsum(a);
                for t in i..k {
                    s += row[t] * col[t];
                }
                *o = s;
            }
        }
        out
    }

    /// The f16 scales at byte `off` of eight rows, as f32 lanes 0..8.
    ///
    /// # Safety
    /// Bytes `off .. off + 2` of every row must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(rp: &[*const u8; 8], off: usize) -> __m256 {
        // SAFETY: two bytes at `off` are readable in each row (caller's contract); unaligned
        // reads are allowed.
        let h = |j: usize| unsafe { rp[j].add(off).cast::<i16>().read_unaligned() };
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }

    /// The 32 unsigned nibbles (0..16) of the q4_0 block at `p` as bytes: low nibbles in the
    /// lower 16 bytes, high nibbles in the upper 16. The 16 bytes are loaded into both halves
    /// and only the upper half shifted (a per-lane shift, no cross-lane shuffle).
    ///
    /// # Safety
    /// `p .. p + 18` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: bytes 2..18 of the block are readable (caller's contract).
        let q = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p.add(2).cast()) });
        let shifted = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
        _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
    }

    /// Lanes 0..4 of `lo` and of `hi` hold, per 128-bit half, rows 0..4 (of `lo`) and 4..8
    /// (of `hi`) summed over one half of a block: add the halves so lane `j` is row `j`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn join_halves(lo: __m256i, hi: __m256i) -> __m256i {
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        )
    }

    /// Lane `j`: `Σ nibble · q` over one block of row `j` (its nibbles `x[j]`, from
    /// [`nibbles`]) and the column quants `qy`, exact. `maddubs` gives pairs of products; two `hadd`s sum them to eight products per
    /// i16 (at most 8 · 15 · 127 = 15240, so no i16 overflows: the column's quants are in
    /// ±127) while packing four rows into one vector; `madd` with ones widens to i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn block_sums8_avx2(x: &[__m256i; 8], qy: __m256i) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let p = x.map(|x| _mm256_maddubs_epi16(x, qy));
        let four = |p: &[__m256i]| {
            let h = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
            _mm256_madd_epi16(h, ones)
        };
        join_halves(four(&p[..4]), four(&p[4..]))
    }

    /// [`block_sums8_avx2`] with VNNI: `dpbusd` sums four products per i32 lane, two
    /// `hadd`s pack four rows per vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn block_sums8_vnni(x: &[__m256i; 8], qy: __m256i) -> __m256i {
        let zero = _mm256_setzero_si256();
        let p = x.map(|x| _mm256_dpbusd_epi32(zero, x, qy));
        let four = |p: &[__m256i]| {
            _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]))
        };
        join_halves(four(&p[..4]), four(&p[4..]))
    }

    /// [`super::quantize_q8_col`] with AVX2, bit for bit: the same `max |x|`, division,
    /// reciprocal and products in f32; the f16 rounding of the scale by F16C (round to
    /// nearest even, as `half`); rounding half away from zero built from a truncation and
    /// the exact remainder (`_mm256_round_ps` has no such mode); quants packed to bytes in
    /// order. The portable version calls `roundf` per element, which made quantizing the
    /// column a visible serial part of a thin product.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `out` must hold `q8_col_bytes(x.len())` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8_col_avx2(x: &[f32], out: &mut [u8]) {
        let nb = x.len() / super::QK;
        let (qs, rest) = out[..nb * (super::QK + 8)].split_at_mut(nb * super::QK);
        let (ds, cs) = rest.split_at_mut(nb * 4);
        let sign = _mm256_set1_ps(-0.0);
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        for (b, xb) in x.chunks_exact(super::QK).enumerate() {
            // SAFETY: `xb` holds 32 floats: four loads of eight.
            let v: [__m256; 4] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
            let a = v.map(|v| _mm256_andnot_ps(sign, v));
            let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let dh = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
            let idv = _mm256_set1_ps(id);
            let q = v.map(|v| {
                let y = _mm256_mul_ps(v, idv);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                // |y − t| is exact (|y| ≤ 127 here); at least ½ rounds away from zero.
                let up =
                    _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_andnot_ps(sign, _mm256_sub_ps(y, t)), half);
                let step = _mm256_or_ps(_mm256_and_ps(y, sign), one);
                _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, step)))
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b0100_1110>(sum));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32::<0b1011_0001>(sum)));
            // Saturating packs interleave 128-bit lanes; the permute restores element order.
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: block b's 32 quant bytes are inside `qs` (nb blocks).
            unsafe { _mm256_storeu_si256(qs.as_mut_ptr().add(32 * b).cast(), p) };
            let df = _mm_cvtss_f32(_mm_cvtph_ps(dh));
            ds[4 * b..4 * b + 4].copy_from_slice(&df.to_le_bytes());
            cs[4 * b..4 * b + 4].copy_from_slice(&(8 * sum).to_le_bytes());
        }
    }

    /// Raw pointers to the three parts of a column packed by [`super::quantize_q8_col`].
    #[derive(Copy, Clone)]
    struct Col {
        qs: *const u8,
        ds: *const u8,
        cs: *const u8,
    }

    impl Col {
        /// The parts of `col`, which holds `nb` blocks.
        fn new(col: &[u8], nb: usize) -> Col {
            let (qs, rest) = col.split_at(nb * super::QK);
            let (ds, cs) = rest.split_at(nb * 4);
            Col {
                qs: qs.as_ptr(),
                ds: ds.as_ptr(),
                cs: cs.as_ptr(),
            }
        }
    }

    /// Eight q4_0 rows against `NC` packed columns: lane `j` of column `c`'s accumulators is
    /// row `j`. Per block, the rows' nibbles and scales are unpacked once for all columns;
    /// per column, the eight exact integer sums (`$sums`) minus the column's `8 · Σ q` are
    /// converted once and multiplied by the eight row scales (one F16C conversion) times the
    /// column scale, with one FMA; even and odd blocks go to two accumulators (two FMA
    /// chains), added at the end. The portable `dot_q4_0_col_scalar` does the same.
    macro_rules! q4_rows8_kernel {
        ($rows:expr, $cols:expr, $sums:ident) => {{
            let cols: [&[u8]; NC] = $cols;
            let nb = cols.first().map_or(0, |c| c.len() / (super::QK + 8));
            let rp = $rows.map(<[u8]>::as_ptr);
            let c = cols.map(|col| Col::new(col, nb));
            let mut even = [_mm256_setzero_ps(); NC];
            let mut odd = [_mm256_setzero_ps(); NC];
            let mut b = 0;
            while b + 2 <= nb {
                q4_block_step!(rp, c, b, even, $sums);
                q4_block_step!(rp, c, b + 1, odd, $sums);
                b += 2;
            }
            if b < nb {
                q4_block_step!(rp, c, b, even, $sums);
            }
            let mut out = [[0.0f32; 8]; NC];
            for ((o, e), d) in out.iter_mut().zip(even).zip(odd) {
                // SAFETY: `o` holds eight floats.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_add_ps(e, d)) };
            }
            out
        }};
    }

    /// One block `$b` of [`q4_rows8_kernel`] into the accumulators `$acc` (one per column).
    /// A macro rather than a closure: called three times per kernel, a closure with four
    /// columns was compiled out of line, with the accumulators in memory across the call.
    macro_rules! q4_block_step {
        ($rp:expr, $c:expr, $b:expr, $acc:expr, $sums:ident) => {{
            let b: usize = $b;
            let off = b * super::Q4_0_BYTES;
            // SAFETY: block b < nb exists in every row (caller's contract) and in every
            // column: quants at 32·b, scale at 4·b, correction at 4·b of their parts.
            unsafe {
                let x: [__m256i; 8] = std::array::from_fn(|j| nibbles($rp[j].add(off)));
                let dx = scales8(&$rp, off);
                for (acc, c) in $acc.iter_mut().zip(&$c) {
                    let qy = _mm256_loadu_si256(c.qs.add(32 * b).cast());
                    let corr = _mm256_set1_epi32(c.cs.add(4 * b).cast::<i32>().read_unaligned());
                    let s = _mm256_sub_epi32($sums(&x, qy), corr);
                    let dy = _mm256_set1_ps(c.ds.add(4 * b).cast::<f32>().read_unaligned());
                    let d = _mm256_mul_ps(dx, dy);
                    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *acc);
                }
            }
        }};
    }

    /// Eight q4_0 rows against `NC` packed columns with AVX2 (see [`q4_rows8_kernel`]).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; every column must be a packed column of `nb`
    /// blocks (`len() == nb · 40`) and every row must hold `nb` q4_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0_cols_rows8_avx2<const NC: usize>(
        rows: [&[u8]; 8],
        cols: [&[u8]; NC],
    ) -> [[f32; 8]; NC] {
        q4_rows8_kernel!(rows, cols, block_sums8_avx2)
    }

    /// [`dot_q4_0_cols_rows8_avx2`] with VNNI's `dpbusd` for the block sums.
    ///
    /// # Safety
    /// The CPU must have the `has_avx512` features; columns and rows as for the AVX2 version.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_q4_0_cols_rows8_vnni<const NC: usize>(
        rows: [&[u8]; 8],
        cols: [&[u8]; NC],
    ) -> [[f32; 8]; NC] {
        q4_rows8_kernel!(rows, cols, block_sums8_vnni)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (also the `qdot` tests' inputs).
    pub(crate) fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Relative error of `got` against `want`, scaled by `scale` (a magnitude of the sum).
    fn close(got: f32, want: f64, scale: f64, tol: f64) -> bool {
        (f64::from(got) - want).abs() <= tol * scale.max(1e-30)
    }

    #[test]
    fn f32_rows_every_level_matches_a_naive_dot() {
        let lens: &[usize] = if cfg!(miri) {
            &[0, 5, 16, 37]
        } else {
            &[0, 1, 7, 8, 15, 16, 17, 24, 31, 32, 33, 40, 100, 1000, 4096]
        };
        for &k in lens {
            let rows: Vec<Vec<f32>> = (0..F32_ROWS as u64).map(|r| values(r + 1, k + 3)).collect();
            let col = values(99, k);
            let rr: [&[f32]; F32_ROWS] = std::array::from_fn(|j| &rows[j][..]);
            let want: Vec<(f64, f64)> = rows
                .iter()
                .map(|r| {
                    let p = r
                        .iter()
                        .zip(&col)
                        .map(|(&x, &y)| f64::from(x) * f64::from(y));
                    let abs: f64 = p.clone().map(f64::abs).sum();
                    (p.sum(), abs)
                })
                .collect();
            for isa in Isa::available() {
                let got = dot_f32_rows(isa, rr, &col);
                for j in 0..F32_ROWS {
                    assert!(
                        close(got[j], want[j].0, want[j].1, 1e-6),
                        "{isa:?} k={k} row {j}: {} vs {}",
                        got[j],
                        want[j].0
                    );
                }
            }
        }
    }

    /// The thin product repeats the last row of a short group: that must not change any
    /// row's result, or results would depend on how rows fall into groups.
    #[test]
    fn f32_rows_results_do_not_depend_on_the_other_rows() {
        let k = if cfg!(miri) { 37 } else { 1000 };
        let rows: Vec<Vec<f32>> = (0..F32_ROWS as u64).map(|r| values(r + 5, k)).collect();
        let col = values(3, k);
        for isa in Isa::available() {
            let rr: [&[f32]; F32_ROWS] = std::array::from_fn(|j| &rows[j][..]);
            let base = dot_f32_rows(isa, rr, &col);
            for shift in 1..F32_ROWS {
                let rot: [&[f32]; F32_ROWS] =
                    std::array::from_fn(|j| &rows[(j + shift) % F32_ROWS][..]);
                let got = dot_f32_rows(isa, rot, &col);
                for j in 0..F32_ROWS {
                    assert_eq!(got[j].to_bits(), base[(j + shift) % F32_ROWS].to_bits());
                }
            }
        }
    }

    /// The f32 tile at every level: close to an f64 dot, the same bits at every level (the
    /// portable version repeats the AVX2 lanes and reduction), and each result independent
    /// of the other rows and columns of the tile.
    #[test]
    fn f32_tile_levels_agree_and_match_a_naive_dot() {
        let lens: &[usize] = if cfg!(miri) {
            &[0, 5, 19]
        } else {
            &[0, 1, 7, 8, 9, 33, 1000]
        };
        for &k in lens {
            let rows: Vec<Vec<f32>> = (0..TILE_ROWS as u64)
                .map(|r| values(r + 40, k + 2))
                .collect();
            let cols: Vec<Vec<f32>> = (0..TILE_COLS as u64).map(|c| values(c + 60, k)).collect();
            let rr: [&[f32]; TILE_ROWS] = std::array::from_fn(|j| &rows[j][..]);
            let cc: [&[f32]; TILE_COLS] = std::array::from_fn(|j| &cols[j][..]);
            let scalar = dot_f32_tile(Isa::Scalar, rr, cc);
            for isa in Isa::available() {
                let got = dot_f32_tile(isa, rr, cc);
                for (c, col) in cols.iter().enumerate() {
                    for (r, row) in rows.iter().enumerate() {
                        let p = row
                            .iter()
                            .zip(col)
                            .map(|(&x, &y)| f64::from(x) * f64::from(y));
                        let abs: f64 = p.clone().map(f64::abs).sum();
                        let g = got[c][r];
                        assert!(close(g, p.sum(), abs, 1e-6), "{isa:?} k={k} r{r} c{c}");
                        assert_eq!(g.to_bits(), scalar[c][r].to_bits(), "{isa:?} k={k}");
                    }
                }
                let rot_r: [&[f32]; TILE_ROWS] = std::array::from_fn(|j| rr[(j + 1) % TILE_ROWS]);
                let rot_c: [&[f32]; TILE_COLS] = std::array::from_fn(|j| cc[(j + 2) % TILE_COLS]);
                let rot = dot_f32_tile(isa, rot_r, rot_c);
                for c in 0..TILE_COLS {
                    for r in 0..TILE_ROWS {
                        let want = got[(c + 2) % TILE_COLS][(r + 1) % TILE_ROWS];
                        assert_eq!(rot[c][r].to_bits(), want.to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn q4_0_rows_every_level_matches_the_block_sums() {
        let nbs: &[usize] = if cfg!(miri) { &[1, 3] } else { &[1, 2, 7, 128] };
        for &nb in nbs {
            let k = nb * QK;
            // Extreme bytes in the first column block: ±1 alternating quantize to ±127.
            let mut xs = values(7, k);
            xs[..QK].iter_mut().enumerate().for_each(|(i, v)| {
                *v = if i % 2 == 0 { 1.0 } else { -1.0 };
            });
            let mut col = vec![0u8; q8_col_bytes(k)];
            quantize_q8_col(&xs, &mut col);
            let mut col_q8 = vec![0u8; nb * Q8_0_BYTES];
            quantize_q8_0(&xs, &mut col_q8);
            let mut rows = vec![vec![0u8; nb * Q4_0_BYTES]; ROWS];
            for (j, r) in rows.iter_mut().enumerate() {
                quantize_q4_0(&values(j as u64 + 20, k), r);
            }
            // Extreme nibbles in the first block: all 0x0f/0xf0, all zero.
            rows[0][2..18].fill(0xff);
            rows[1][2..18].fill(0x00);
            // The reference: dequantize both sides and sum in f64.
            let mut y = vec![0.0f32; k];
            dequantize_q8_0(&col_q8, &mut y);
            let rr: [&[u8]; ROWS] = std::array::from_fn(|j| &rows[j][..]);
            let [scalar] = dot_q4_0_q8_0_rows(Isa::Scalar, rr, [&col]);
            for isa in Isa::available() {
                let [got] = dot_q4_0_q8_0_rows(isa, rr, [&col]);
                for j in 0..ROWS {
                    let mut x = vec![0.0f32; k];
                    dequantize_q4_0(&rows[j], &mut x);
                    let p = x.iter().zip(&y).map(|(&a, &b)| f64::from(a) * f64::from(b));
                    let abs: f64 = p.clone().map(f64::abs).sum();
                    let want: f64 = p.sum();
                    assert!(
                        close(got[j], want, abs, 1e-5),
                        "{isa:?} nb={nb} row {j}: {} vs {want}",
                        got[j]
                    );
                    // Levels do the same f32 operations on the same exact block sums.
                    assert_eq!(got[j].to_bits(), scalar[j].to_bits(), "{isa:?} row {j}");
                }
                // A row's result does not depend on the other rows of the call.
                let rot: [&[u8]; ROWS] = std::array::from_fn(|j| &rows[(j + 3) % ROWS][..]);
                let [r] = dot_q4_0_q8_0_rows(isa, rot, [&col]);
                for j in 0..ROWS {
                    assert_eq!(r[j].to_bits(), got[(j + 3) % ROWS].to_bits());
                }
                // Nor on the other columns: four at once give each column's bits, in any
                // position.
                let mut other = vec![0u8; q8_col_bytes(k)];
                quantize_q8_col(&values(31, k), &mut other);
                let [o] = dot_q4_0_q8_0_rows(isa, rr, [&other]);
                let four = dot_q4_0_q8_0_rows(isa, rr, [&other, &col, &col, &other]);
                for j in 0..ROWS {
                    let bits = |c: usize| four[c][j].to_bits();
                    assert_eq!(
                        [bits(0), bits(1), bits(2), bits(3)],
                        [
                            o[j].to_bits(),
                            got[j].to_bits(),
                            got[j].to_bits(),
                            o[j].to_bits()
                        ]
                    );
                }
            }
        }
    }

    /// The SIMD column quantizer matches the portable one bit for bit, ties included.
    #[test]
    fn q8_col_levels_agree() {
        let mut xs = values(13, 8 * QK);
        // Block 1: max 127 so d = 1 and the values below are exact ties.
        for (i, v) in xs[QK..2 * QK].iter_mut().enumerate() {
            *v = [127.0, -127.0, 0.5, -0.5, 2.5, -3.5, 126.5, -0.0][i % 8] + 0.0 * i as f32;
        }
        // Block 2: all zero. Block 3: tiny values. Block 4: large values.
        xs[2 * QK..3 * QK].fill(0.0);
        xs[3 * QK..4 * QK].iter_mut().for_each(|v| *v *= 1e-30);
        xs[4 * QK..5 * QK].iter_mut().for_each(|v| *v *= 1e30);
        let mut want = vec![0u8; q8_col_bytes(xs.len())];
        quantize_q8_col_scalar(&xs, &mut want);
        let mut got = vec![0u8; q8_col_bytes(xs.len())];
        quantize_q8_col(&xs, &mut got);
        assert_eq!(got, want);
    }

    /// The packed column holds exactly what q8_0 quantization gives.
    #[test]
    fn q8_col_matches_q8_0() {
        let nb = 5;
        let xs = values(11, nb * QK);
        let mut q8 = vec![0u8; nb * Q8_0_BYTES];
        quantize_q8_0(&xs, &mut q8);
        let mut col = vec![0u8; q8_col_bytes(xs.len())];
        quantize_q8_col(&xs, &mut col);
        for (b, blk) in q8.chunks_exact(Q8_0_BYTES).enumerate() {
            assert_eq!(&col[b * QK..(b + 1) * QK], &blk[2..]);
            let d = &col[nb * QK + 4 * b..nb * QK + 4 * b + 4];
            assert_eq!(f32::from_le_bytes(d.try_into().unwrap()), scale(blk));
            let c = &col[nb * (QK + 4) + 4 * b..nb * (QK + 4) + 4 * b + 4];
            let sum: i32 = blk[2..].iter().map(|&v| i32::from(v as i8)).sum();
            assert_eq!(i32::from_le_bytes(c.try_into().unwrap()), 8 * sum);
        }
    }
}
