//! `q4_1` and ggml-ordered `q8_0` matrix products: ggml's x86 activation quantizer and its
//! AVX2 block dot products, reproduced bit for bit.
//!
//! Why a module of its own: llama-style models (the `llm` crate) are checked token for token
//! against llama.cpp, where near-ties of 0.1 logit are common, so these products follow
//! ggml's x86 build operation by operation rather than just "a correct dot product":
//!
//! * **Activations** are quantized per 32 floats as ggml's AVX2 `quantize_row_q8_0/q8_1` do:
//!   `amax = max |x|`, `d = amax / 127`, `id = 127 / amax` (0 when `amax` is 0),
//!   `q = round_half_even(x · id)` (saturated to i8), `s = half(d · Σ q)`. (ggml's portable
//!   reference uses `1 / d` and rounds ties away from zero: one quantum apart at times.)
//!   [`quantize_col`] writes them in a packed column: every block's 32 quants, then every
//!   block's `f32(half(d))`, then every block's `f32(half(s))`.
//! * **Dot products** keep ggml's AVX2 summation order: per block, the 32 products are summed
//!   in groups of four adjacent bytes into eight i32 lanes (exact), each lane is converted to
//!   f32 and accumulated by `lane_acc = fma(d_w · d_a, lane, lane_acc)` over the blocks; the
//!   result is `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`. For `q4_1` (value
//!   `q · d + m`, nibbles low = elements 0..16, high = 16..32) the term `Σ m_w · s_a` is an f32
//!   FMA chain in block order (ggml's C compiles `summs += m * s` to an FMA), added last.
//!
//! The portable kernels do exactly these operations (`f32::mul_add` is a fused multiply-add
//! at every level), so every instruction-set level gives the same bits, and a result depends
//! only on its weight row and its column, never on the thread count or on how rows and
//! columns are grouped into kernel calls.
//!
//! Indexing: blocks are `chunks_exact` pieces of the block size (constant offsets inside a
//! block are in bounds), and [`dot_rows`] and [`quantize_col`] assert their slices' block
//! counts once at entry.

use half::f16;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Bytes of a `q4_1` block: `d: f16, m: f16, qs: [u8; 16]`.
pub(crate) const Q4_1_BYTES: usize = 20;
/// Bytes of a `q8_0` block: `d: f16, qs: [i8; 32]`.
pub(crate) const Q8_0_BYTES: usize = 34;

/// Weight block formats this module's products take.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// `q4_1` rows against `q8_1` activations.
    Q4_1,
    /// `q8_0` rows against `q8_0` activations.
    Q8_0,
}

impl WeightKind {
    fn block_bytes(self) -> usize {
        match self {
            WeightKind::Q4_1 => Q4_1_BYTES,
            WeightKind::Q8_0 => Q8_0_BYTES,
        }
    }
}

#[inline]
fn half_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Dequantize `q4_1` blocks into `out`: `q · d + m` with one rounding (ggml's C is compiled
/// with contraction, so its `x0*d + m` is a fused multiply-add).
pub(crate) fn dequantize_q4_1(src: &[u8], out: &mut [f32]) {
    for (blk, o) in src.chunks_exact(Q4_1_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (half_at(blk, 0), half_at(blk, 2));
        let (lo, hi) = o.split_at_mut(QK / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&blk[4..]) {
            *l = f32::from(q & 0x0f).mul_add(d, m);
            *h = f32::from(q >> 4).mul_add(d, m);
        }
    }
}

/// Quantize `x` (a multiple of 32 long) to `q4_1` like ggml's reference: per block
/// `d = (max − min) / 15`, `m = min`, `q = min(15, trunc((x − min) · (1/d) + 0.5))`.
pub(crate) fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
        for j in 0..QK / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            blk[4 + j] = q0 | (q1 << 4);
        }
    }
}

/// Bytes of a column of `k` elements packed by [`quantize_col`].
pub(crate) fn col_bytes(k: usize) -> usize {
    k / QK * (QK + 8)
}

/// `cvtps2dq` on an already integral value: out-of-range and NaN give `i32::MIN`.
#[inline]
fn cvt_i32(v: f32) -> i32 {
    if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// Quantize `x` (a multiple of 32 long) by ggml's x86 rule (module docs) into the packed
/// column layout: `nb · 32` quants, `nb` f32 scales, `nb` f32 sums.
///
/// Written with AVX2 intrinsics where the CPU has them (`x86::quantize_col_simd`: rounding is
/// one instruction instead of a libm `rintf` call per element, several times faster than the
/// portable code), else the portable code; the same bytes either way (tested).
pub(crate) fn quantize_col(x: &[f32], out: &mut [u8]) {
    assert!(
        out.len() >= col_bytes(x.len()),
        "quantize_col: short output (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if crate::quant::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked); `out` holds the packed
        // column (asserted above).
        return unsafe { x86::quantize_col_simd(x, out) };
    }
    quantize_col_body(x, out);
}

/// The portable body of [`quantize_col`] (`out` at least `col_bytes(x.len())` long).
fn quantize_col_body(x: &[f32], out: &mut [u8]) {
    let nb = x.len() / QK;
    let (qs, rest) = out[..nb * (QK + 8)].split_at_mut(nb * QK);
    let (ds, ss) = rest.split_at_mut(nb * 4);
    for (b, (xb, q)) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).enumerate() {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in q.iter_mut().zip(xb) {
            let i = cvt_i32((v * id).round_ties_even());
            sum = sum.wrapping_add(i);
            *q = i.clamp(-128, 127) as i8 as u8;
        }
        let dh = f16::from_f32(d).to_f32();
        let sh = f16::from_f32(d * sum as f32).to_f32();
        ds[4 * b..4 * b + 4].copy_from_slice(&dh.to_le_bytes());
        ss[4 * b..4 * b + 4].copy_from_slice(&sh.to_le_bytes());
    }
}

/// ggml's `hsum_float_8` order.
#[inline]
fn hsum8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// The four-byte lane sums of one block as `maddubs` + `madd` give them for signed bytes
/// (`sign` trick included: `|x|` as unsigned, `y` negated where `x < 0`, pairs saturated to
/// i16), so the portable kernel matches the AVX2 one even on bytes that never come out of
/// the quantizer (−128).
#[inline]
pub(crate) fn lanes_i8(x: &[u8], y: &[u8]) -> [i32; 8] {
    let p = |j: usize| {
        let (a, b) = (x[j] as i8, y[j] as i8);
        let sy = match a.signum() {
            -1 => b.wrapping_neg(),
            0 => 0,
            _ => b,
        };
        i32::from(a.unsigned_abs()) * i32::from(sy)
    };
    let pair = |j: usize| (p(j) + p(j + 1)).clamp(-32768, 32767);
    std::array::from_fn(|l| pair(4 * l) + pair(4 * l + 2))
}

/// One `q4_1` row against a packed column, portable, in the module's order.
fn dot_q4_1_scalar(row: &[u8], col: &[u8], nb: usize) -> f32 {
    let (qs, rest) = col.split_at(nb * QK);
    let (ds, ss) = rest.split_at(nb * 4);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (b, (blk, q)) in row
        .chunks_exact(Q4_1_BYTES)
        .zip(qs.chunks_exact(QK))
        .enumerate()
        .take(nb)
    {
        summs = half_at(blk, 2).mul_add(f32_at(ss, b), summs);
        let d = half_at(blk, 0) * f32_at(ds, b);
        let nib = |j: usize| {
            if j < 16 {
                blk[4 + j] & 0x0f
            } else {
                blk[4 + j - 16] >> 4
            }
        };
        for (l, a) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|j| i32::from(nib(j)) * i32::from(q[j] as i8))
                .sum();
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(acc) + summs
}

/// One `q8_0` row against a packed column, portable, in the module's order.
fn dot_q8_0_scalar(row: &[u8], col: &[u8], nb: usize) -> f32 {
    let (qs, rest) = col.split_at(nb * QK);
    let ds = &rest[..nb * 4];
    let mut acc = [0.0f32; 8];
    for (b, (blk, q)) in row
        .chunks_exact(Q8_0_BYTES)
        .zip(qs.chunks_exact(QK))
        .enumerate()
        .take(nb)
    {
        let d = half_at(blk, 0) * f32_at(ds, b);
        let lanes = lanes_i8(&blk[2..], q);
        for (a, &s) in acc.iter_mut().zip(&lanes) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(acc)
}

/// `out[c][r]` = weight row `rows[r]` (of `kind`) dotted with the packed column `cols[c]`
/// (all columns the same length, every row holding as many blocks).
///
/// Several rows and columns per call let the kernel load each column block once for `R`
/// rows and unpack each weight block once for `NC` columns; results do not depend on `R`,
/// `NC` or the other rows and columns (module docs).
///
/// `prefetch` is a distance in bytes: while reading block `b` of a row the kernel asks the
/// cache for the bytes that far ahead of it (`0`: no prefetching). When rows follow each
/// other in memory, `R` row lengths ahead is the next call's block: the rows of a thin
/// product are short (576 elements: 10 cache lines), too short for the hardware prefetcher
/// to follow eight of them side by side.
/// The AVX-512 decode kernels (`qmv512`) take `prefetch` as where the next call's rows lie,
/// which is what callers give them: `R` (for [`dot_rows16`], sixteen) row lengths. They ask
/// for those rows as one stream of lines, or (on Intel cores) let each row's own stream run
/// on into the next call's same row (`qmv512::prefetch_rows_on`).
pub(crate) fn dot_rows<const R: usize, const NC: usize>(
    isa: crate::quant::Isa,
    kind: WeightKind,
    rows: [&[u8]; R],
    cols: [&[u8]; NC],
    prefetch: usize,
) -> [[f32; R]; NC] {
    // Only the kernels with intrinsics prefetch (compiled out under Miri).
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = prefetch;
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        cols.iter().all(|c| c.len() == nb * (QK + 8))
            && rows.iter().all(|r| r.len() >= nb * kind.block_bytes()),
        "qdot::dot_rows: short row or column (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        crate::quant::Isa::Avx512
            if R == crate::qmv512::ROWS && NC == 1 && crate::qmv512::available() =>
        {
            // Eight rows, one column (a decode step): the AVX-512 kernel, same bits.
            let rs: [&[u8]; crate::qmv512::ROWS] = std::array::from_fn(|i| rows[i]);
            // SAFETY: the CPU has the kernel's features (checked in the guard); every row
            // holds `nb` blocks of `kind` and the column is a packed column of `nb` blocks
            // (asserted above).
            let d = unsafe {
                match kind {
                    WeightKind::Q4_1 => crate::qmv512::q4_1_rows8(rs, cols[0], nb, prefetch),
                    WeightKind::Q8_0 => crate::qmv512::q8_0_rows8(rs, cols[0], nb, prefetch),
                }
            };
            std::array::from_fn(|_| std::array::from_fn(|i| d[i]))
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        crate::quant::Isa::Avx2 | crate::quant::Isa::Avx512
            if crate::quant::has_avx2_fma_f16c() =>
        {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked in the guard); every row holds
            // `nb` blocks of `kind` and every column is a packed column of `nb` blocks
            // (asserted above).
            unsafe {
                match kind {
                    WeightKind::Q4_1 => x86::q4_1_rows(rows, cols, nb, prefetch),
                    WeightKind::Q8_0 => x86::q8_0_rows(rows, cols, nb, prefetch),
                }
            }
        }
        _ => cols.map(|c| {
            rows.map(|r| match kind {
                WeightKind::Q4_1 => dot_q4_1_scalar(r, c, nb),
                WeightKind::Q8_0 => dot_q8_0_scalar(r, c, nb),
            })
        }),
    }
}

/// Rows per [`dot_rows16`] call.
pub(crate) const ROWS16: usize = 16;

/// Whether one-column products over plain `q4_1` rows that follow each other go as blocks
/// of four interleaved [`dot_rows16`] calls (call `t` taking rows `t, t + 4, .., t + 60`,
/// each row's prefetch running on into the next row), as `q4tiles::interleaves` does for
/// `q4_0`: where the sixteen-row calls are `qmv512`'s quads (Intel cores).
pub(crate) fn interleaves_q4_1() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        crate::qmv512::available() && crate::qmv512::prefers_quads()
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    false
}

/// Sixteen weight rows dotted with one packed column (a decode step): [`dot_rows`]'s
/// products, bit for bit.
///
/// With AVX-512 VNNI, `q4_1` rows are transposed in registers so that sixteen rows share
/// each instruction (`qmv512::q4_1_rows16`); `q8_0` rows, and every row elsewhere, go as two
/// eight-row [`dot_rows`] calls (why not sixteen for `q8_0`: `qmv512`'s docs). `prefetch`
/// as for [`dot_rows`] (sixteen row lengths ahead is the next call's block); for `q4_1`
/// on Intel cores, where each row's stream runs on past its end, which for interleaved
/// calls ([`interleaves_q4_1`]) is the next row.
pub(crate) fn dot_rows16(
    isa: crate::quant::Isa,
    kind: WeightKind,
    rows: [&[u8]; ROWS16],
    col: &[u8],
    prefetch: usize,
) -> [f32; ROWS16] {
    let nb = col.len() / (QK + 8);
    assert!(
        col.len() == nb * (QK + 8) && rows.iter().all(|r| r.len() >= nb * kind.block_bytes()),
        "qdot::dot_rows16: short row or column (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if kind == WeightKind::Q4_1 && isa == crate::quant::Isa::Avx512 && crate::qmv512::available() {
        // SAFETY: the CPU has both kernels' features (checked above; the quads' GFNI by
        // `prefers_quads`); every row holds `nb` q4_1 blocks and the column is a packed
        // column of `nb` blocks (asserted above).
        unsafe {
            if crate::qmv512::prefers_quads()
                && let Some(out) = crate::qmv512::q4_1_rows16_quads(rows, col, nb, prefetch)
            {
                return out;
            }
            return crate::qmv512::q4_1_rows16(rows, col, nb, prefetch);
        }
    }
    let mut out = [0.0f32; ROWS16];
    for (h, o) in out.chunks_exact_mut(ROWS16 / 2).enumerate() {
        let rs: [&[u8]; ROWS16 / 2] = std::array::from_fn(|r| rows[h * ROWS16 / 2 + r]);
        let [d] = dot_rows(isa, kind, rs, [col], prefetch);
        o.copy_from_slice(&d);
    }
    out
}

/// Rows and columns of a [`dot_tile`] call.
pub(crate) const TILE: usize = 8;

/// `out[c][r]` = weight row `rows[r]` dotted with the packed column `cols[c]`, for
/// [`TILE`] rows and [`TILE`] columns: the products of [`dot_rows`], bit for bit (each result
/// depends only on its row and column).
///
/// With AVX-512 VNNI and `q4_1` weights one pass over a weight block serves eight columns:
/// `vpdpbusd` gives the eight four-byte lane sums of two columns in one 512-bit register
/// (the nibbles are unsigned and the quants signed, so its sums are exactly those of
/// `maddubs` + `madd`: no pair can saturate), and the `m · s` chains of the eight columns
/// run in the lanes of one vector. Elsewhere it is four [`dot_rows`] calls.
pub(crate) fn dot_tile(
    isa: crate::quant::Isa,
    kind: WeightKind,
    rows: [&[u8]; TILE],
    cols: [&[u8]; TILE],
    prefetch: usize,
) -> [[f32; TILE]; TILE] {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if isa == crate::quant::Isa::Avx512 && kind == WeightKind::Q4_1 && crate::quant::has_avx512() {
        let nb = cols[0].len() / (QK + 8);
        assert!(
            cols.iter().all(|c| c.len() == nb * (QK + 8))
                && rows.iter().all(|r| r.len() >= nb * Q4_1_BYTES),
            "qdot::dot_tile: short row or column (a kernel bug)"
        );
        // SAFETY: the CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (checked in the
        // guard); every row holds `nb` q4_1 blocks and every column is a packed column of
        // `nb` blocks (asserted above).
        return unsafe { x86::q4_1_tile_vnni(rows, cols, nb, prefetch) };
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if isa == crate::quant::Isa::Avx512 && kind == WeightKind::Q8_0 && crate::qmv512::available() {
        let nb = cols[0].len() / (QK + 8);
        assert!(
            cols.iter().all(|c| c.len() == nb * (QK + 8))
                && rows.iter().all(|r| r.len() >= nb * Q8_0_BYTES),
            "qdot::dot_tile: short row or column (a kernel bug)"
        );
        // SAFETY: the CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (checked in the
        // guard); every row holds `nb` q8_0 blocks and every column is a packed column of
        // `nb` blocks (asserted above).
        if let Some(out) = unsafe { x86::q8_0_tile_vnni(rows, cols, nb, prefetch) } {
            return out;
        }
    }
    let mut out = [[0.0f32; TILE]; TILE];
    for h in 0..2 {
        let rs: [&[u8]; 4] = std::array::from_fn(|r| rows[4 * h + r]);
        for v in 0..2 {
            let cs: [&[u8]; 4] = std::array::from_fn(|c| cols[4 * v + c]);
            let part = dot_rows(isa, kind, rs, cs, prefetch);
            for (c, pc) in part.iter().enumerate() {
                out[4 * v + c][4 * h..4 * h + 4].copy_from_slice(pc);
            }
        }
    }
    out
}

/// The AVX2 kernels (intrinsics), chosen at run time: the crate is built for baseline
/// x86-64. They do the portable kernels' operations in the same order.
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Q4_1_BYTES, Q8_0_BYTES, QK};

    /// Pointers to the three parts of a packed column of `nb` blocks.
    #[derive(Copy, Clone)]
    struct Col {
        qs: *const u8,
        ds: *const f32,
        ss: *const f32,
    }

    fn col(c: &[u8], nb: usize) -> Col {
        let (qs, rest) = c.split_at(nb * QK);
        let (ds, ss) = rest.split_at(nb * 4);
        Col {
            qs: qs.as_ptr(),
            ds: ds.as_ptr().cast(),
            ss: ss.as_ptr().cast(),
        }
    }

    /// ggml's `hsum_float_8`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    /// The two halves at `p` and `p + 2` as f32 (one F16C conversion).
    ///
    /// # Safety
    /// `p .. p + 4` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn two_halves(p: *const u8) -> (f32, f32) {
        // SAFETY: four bytes at `p` are readable (caller's contract).
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
            p.cast::<i32>().read_unaligned()
        }));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// The half at `p` as f32.
    ///
    /// # Safety
    /// `p .. p + 2` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn one_half(p: *const u8) -> f32 {
        // SAFETY: two bytes at `p` are readable (caller's contract).
        let h = unsafe { p.cast::<u16>().read_unaligned() };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }

    /// `q4_1` rows against packed columns (see `super::dot_q4_1_scalar` for the order).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row holds `nb` `q4_1` blocks, every column is a packed
    /// column of `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_rows<const R: usize, const NC: usize>(
        rows: [&[u8]; R],
        cols: [&[u8]; NC],
        nb: usize,
        prefetch: usize,
    ) -> [[f32; R]; NC] {
        let rp = rows.map(<[u8]>::as_ptr);
        let cp = cols.map(|c| col(c, nb));
        let ones = _mm256_set1_epi16(1);
        let mask = _mm256_set1_epi8(0x0f);
        let mut acc = [[_mm256_setzero_ps(); R]; NC];
        let mut summs = [[0.0f32; R]; NC];
        for b in 0..nb {
            let off = b * Q4_1_BYTES;
            if prefetch != 0 {
                for p in &rp {
                    // A prefetch never faults; the address may lie past the row.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off + prefetch).cast());
                }
            }
            // SAFETY: block b of every row (20 bytes at `off`) and of every column (32
            // quants, one scale, one sum) is inside them (caller's contract).
            unsafe {
                // Plain loops, not `array::from_fn`: its closures were compiled out of line.
                let mut x = [_mm256_setzero_si256(); R];
                let mut dm = [(0.0f32, 0.0f32); R];
                // The 16 bytes in both halves, the upper half shifted by a nibble (per 64-bit
                // lane: what crosses a byte boundary is masked off), then masked.
                let shift = _mm256_setr_epi64x(0, 0, 4, 4);
                for r in 0..R {
                    let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(rp[r].add(off + 4).cast()));
                    x[r] = _mm256_and_si256(_mm256_srlv_epi64(q, shift), mask);
                    dm[r] = two_halves(rp[r].add(off));
                }
                for (c, cc) in cp.iter().enumerate() {
                    let qy = _mm256_loadu_si256(cc.qs.add(QK * b).cast());
                    let da = cc.ds.add(b).read_unaligned();
                    let sa = cc.ss.add(b).read_unaligned();
                    for r in 0..R {
                        summs[c][r] = dm[r].1.mul_add(sa, summs[c][r]);
                        let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                            ones,
                            _mm256_maddubs_epi16(x[r], qy),
                        ));
                        let d = _mm256_set1_ps(dm[r].0 * da);
                        acc[c][r] = _mm256_fmadd_ps(d, lanes, acc[c][r]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; R]; NC];
        for c in 0..NC {
            for r in 0..R {
                out[c][r] = hsum(acc[c][r]) + summs[c][r];
            }
        }
        out
    }

    /// `super::quantize_col_body` in AVX2 intrinsics, bit for bit: `max |x|` ignoring NaN as
    /// `f32::max` does (`max_ps` returns its second operand when one is NaN), the same
    /// division and reciprocal in f32, `round_ps` to nearest even, `cvtps2dq` (NaN and
    /// out-of-range values give `i32::MIN`, as `cvt_i32`), an i32 sum that wraps, saturating
    /// packs (the clamp to i8) and F16C's rounding of the scale and sum (nearest even, as
    /// `half`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `out` holds `col_bytes(x.len())` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_col_simd(x: &[f32], out: &mut [u8]) {
        let nb = x.len() / QK;
        let (qs, rest) = out[..nb * (QK + 8)].split_at_mut(nb * QK);
        let (ds, ss) = rest.split_at_mut(nb * 4);
        let sign = _mm256_set1_ps(-0.0);
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            // SAFETY: `xb` holds 32 floats: four loads of eight.
            let v: [__m256; 4] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
            let a = v.map(|v| _mm256_andnot_ps(sign, v));
            // Accumulator second: a NaN element is skipped.
            let m = _mm256_max_ps(a[3], _mm256_max_ps(a[2], _mm256_max_ps(a[1], a[0])));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let q = v.map(|v| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v, idv)))
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
            unsafe { _mm256_storeu_si256(qs.as_mut_ptr().add(QK * b).cast(), p) };
            let h =
                _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_setr_ps(d, d * sum as f32, 0.0, 0.0));
            let f = _mm_cvtph_ps(h);
            ds[4 * b..4 * b + 4].copy_from_slice(&_mm_cvtss_f32(f).to_le_bytes());
            let sf = _mm_cvtss_f32(_mm_movehdup_ps(f));
            ss[4 * b..4 * b + 4].copy_from_slice(&sf.to_le_bytes());
        }
    }

    /// Blocks whose column scales [`q4_1_tile_vnni`] lays out at a time: one 512-bit
    /// register of each column's scales (the layout code is written for sixteen).
    const CHUNK: usize = 16;
    const _: () = assert!(CHUNK == 16);

    /// The column scales of blocks `b0 .. b0 + nc` (`nc ≤ CHUNK`) laid out per column pair:
    /// `da[i][p]` holds `d_a` of block `b0 + i` of column `2p` in lanes 0..8 and of column
    /// `2p + 1` in lanes 8..16 (the lanes of accumulator `p`).
    ///
    /// # Safety
    /// AVX-512 F; blocks `b0 .. b0 + nc` of every column are inside it.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair_scales(cp: &[Col; 8], b0: usize, nc: usize, da: &mut [[__m512; 4]; CHUNK]) {
        let m: __mmask16 = if nc >= CHUNK { !0 } else { (1 << nc) - 1 };
        // SAFETY: blocks b0 .. b0 + nc of every column are inside it (caller's contract);
        // the masked-off elements are not read.
        let dc: [__m512; 8] =
            std::array::from_fn(|c| unsafe { _mm512_maskz_loadu_ps(m, cp[c].ds.add(b0)) });
        // Element i of column 2p (lanes 0..8) and of column 2p + 1 (lanes 8..16).
        let pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
        for (i, dai) in da.iter_mut().enumerate().take(nc) {
            let idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(i as i32));
            for (p, d) in dai.iter_mut().enumerate() {
                *d = _mm512_permutex2var_ps(dc[2 * p], idx, dc[2 * p + 1]);
            }
        }
    }

    /// [`super::dot_tile`] for `q8_0` with AVX-512 VNNI, in the order of
    /// `super::dot_q8_0_scalar`; `None` when a column holds the quant −128 (the caller then
    /// takes the AVX2 path). Accumulator `(r, p)` holds row `r` against columns `2p` (lanes
    /// 0..8) and `2p + 1` (lanes 8..16).
    ///
    /// The lane sums: `dpbusd` multiplies unsigned by signed bytes, so the weights go in
    /// offset by 128 (`w ^ 0x80 = w + 128 ≥ 0`) and the accumulator starts at
    /// `−128 · Σ y` of the lane (itself one `dpbusd` of the bytes 0x80 with `y` per column
    /// pair, shared by four rows): `Σ (w + 128) y − 128 Σ y = Σ w y`, exact in i32. The
    /// sign trick of the AVX2 kernel gives `Σ w y` too, except where `y = −128` meets
    /// `w < 0` (negating −128 wraps); the quantizer makes −128 only from NaN or infinite
    /// inputs, and the running minimum of the columns' bytes says when that happened.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; every row holds `nb` `q8_0` blocks, every
    /// column is a packed column of `nb` blocks.
    /// Block `b`'s 32 quants of the eight columns, two columns a register (columns 2p and
    /// 2p + 1 in register p's low and high halves), as both tile kernels read them.
    ///
    /// # Safety
    /// Block `b` of every column is inside it.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn col_quants(cp: &[Col; 8], b: usize) -> [__m512i; 4] {
        // SAFETY: the 32 quants of block b of each column are inside it (caller's contract).
        std::array::from_fn(|p| unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(cp[2 * p].qs.add(QK * b).cast())),
                _mm256_loadu_si256(cp[2 * p + 1].qs.add(QK * b).cast()),
            )
        })
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn q8_0_tile_vnni(
        rows: [&[u8]; 8],
        cols: [&[u8]; 8],
        nb: usize,
        prefetch: usize,
    ) -> Option<[[f32; 8]; 8]> {
        let rp = rows.map(<[u8]>::as_ptr);
        let cp = cols.map(|c| col(c, nb));
        let bias = _mm512_set1_epi8(-128);
        let mut acc = [[_mm512_setzero_ps(); 4]; 8];
        let mut da = [[_mm512_setzero_ps(); 4]; CHUNK];
        let mut ymin = _mm512_setzero_si512();
        for b0 in (0..nb).step_by(CHUNK) {
            let nc = (nb - b0).min(CHUNK);
            // SAFETY: blocks b0 .. b0 + nc of every column are inside it (caller's contract).
            unsafe { pair_scales(&cp, b0, nc, &mut da) };
            for h in 0..2 {
                let mut a: [[__m512; 4]; 4] = std::array::from_fn(|r| acc[4 * h + r]);
                for (i, dai) in da.iter().enumerate().take(nc) {
                    let b = b0 + i;
                    let off = b * Q8_0_BYTES;
                    // SAFETY: block b of every row (34 bytes at `off`) and of every column
                    // (32 quants) is inside them (caller's contract).
                    unsafe {
                        let y = col_quants(&cp, b);
                        if h == 0 {
                            for yp in &y {
                                ymin = _mm512_min_epi8(ymin, *yp);
                            }
                        }
                        // −128 · Σ y per lane: 0 − Σ 128 y.
                        let base: [__m512i; 4] = std::array::from_fn(|p| {
                            _mm512_sub_epi32(
                                _mm512_setzero_si512(),
                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, y[p]),
                            )
                        });
                        for (r, ar) in a.iter_mut().enumerate() {
                            let row = rp[4 * h + r];
                            if prefetch != 0 {
                                // A prefetch never faults; the address may lie past the row.
                                _mm_prefetch::<_MM_HINT_T0>(
                                    row.wrapping_add(off + prefetch).cast(),
                                );
                            }
                            let x = _mm512_xor_si512(
                                _mm512_broadcast_i64x4(_mm256_loadu_si256(row.add(off + 2).cast())),
                                bias,
                            );
                            let dw = _mm512_set1_ps(one_half(row.add(off)));
                            for p in 0..4 {
                                let lanes =
                                    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(base[p], x, y[p]));
                                let d = _mm512_mul_ps(dw, dai[p]);
                                ar[p] = _mm512_fmadd_ps(d, lanes, ar[p]);
                            }
                        }
                    }
                }
                for (r, ar) in a.into_iter().enumerate() {
                    acc[4 * h + r] = ar;
                }
            }
        }
        // Any column byte −128: the offset sums differ from the sign trick's there.
        if _mm512_cmpeq_epi8_mask(ymin, bias) != 0 {
            return None;
        }
        Some(hsum_tile(&acc))
    }

    /// [`super::dot_tile`] for `q4_1` with AVX-512 VNNI, in the order of
    /// `super::dot_q4_1_scalar`. Accumulator `(r, p)` holds row `r` against columns `2p`
    /// (lanes 0..8) and `2p + 1` (lanes 8..16); `summs[r]` lane `c` is row `r`'s `m · s`
    /// chain for column `c`. Per chunk of blocks the columns' scales and sums are laid out
    /// first (`d_a` of columns `2p, 2p + 1` spread over the two halves of a vector, the sums
    /// of the eight columns side by side), then the rows go through it four at a time.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; every row holds `nb` `q4_1` blocks, every
    /// column is a packed column of `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn q4_1_tile_vnni(
        rows: [&[u8]; 8],
        cols: [&[u8]; 8],
        nb: usize,
        prefetch: usize,
    ) -> [[f32; 8]; 8] {
        let rp = rows.map(<[u8]>::as_ptr);
        let cp = cols.map(|c| col(c, nb));
        let mask = _mm512_set1_epi8(0x0f);
        let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
        let mut acc = [[_mm512_setzero_ps(); 4]; 8];
        let mut summs = [_mm256_setzero_ps(); 8];
        let mut da = [[_mm512_setzero_ps(); 4]; CHUNK];
        let mut sa = [_mm256_setzero_ps(); CHUNK];
        // 128-bit lanes 0, 1 of two registers interleaved (and lanes 2, 3).
        let lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let hi_idx =
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        for b0 in (0..nb).step_by(CHUNK) {
            let nc = (nb - b0).min(CHUNK);
            let m: __mmask16 = if nc == CHUNK { !0 } else { (1 << nc) - 1 };
            // SAFETY: blocks b0 .. b0 + nc of every column are inside it (caller's
            // contract); the masked-off elements are not read.
            let sc: [__m512; 8] =
                std::array::from_fn(|c| unsafe { _mm512_maskz_loadu_ps(m, cp[c].ss.add(b0)) });
            // SAFETY: as above.
            unsafe { pair_scales(&cp, b0, nc, &mut da) };
            // The sums transposed (eight columns by sixteen blocks): per 128-bit lane L,
            // u[j] holds columns 0..4 and u[4 + j] columns 4..8 of block 4L + j.
            let t: [__m512; 8] = std::array::from_fn(|q| {
                let (a, b) = (sc[2 * (q / 2)], sc[2 * (q / 2) + 1]);
                if q % 2 == 0 {
                    _mm512_unpacklo_ps(a, b)
                } else {
                    _mm512_unpackhi_ps(a, b)
                }
            });
            let u: [__m512; 8] = std::array::from_fn(|v| {
                let (g, j) = (v / 4, v % 4);
                let (a, b) = (t[4 * g + j / 2], t[4 * g + 2 + j / 2]);
                if j % 2 == 0 {
                    _mm512_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm512_shuffle_ps::<0xEE>(a, b)
                }
            });
            for j in 0..4 {
                let half = |v: __m512, k: usize| {
                    let v = _mm512_castps_pd(v);
                    _mm256_castpd_ps(if k == 0 {
                        _mm512_castpd512_pd256(v)
                    } else {
                        _mm512_extractf64x4_pd::<1>(v)
                    })
                };
                let lo = _mm512_permutex2var_ps(u[j], lo_idx, u[4 + j]);
                let hi = _mm512_permutex2var_ps(u[j], hi_idx, u[4 + j]);
                sa[j] = half(lo, 0);
                sa[4 + j] = half(lo, 1);
                sa[8 + j] = half(hi, 0);
                sa[12 + j] = half(hi, 1);
            }
            for h in 0..2 {
                let mut a: [[__m512; 4]; 4] = std::array::from_fn(|r| acc[4 * h + r]);
                let mut sm: [__m256; 4] = std::array::from_fn(|r| summs[4 * h + r]);
                for i in 0..nc {
                    let b = b0 + i;
                    let off = b * Q4_1_BYTES;
                    // SAFETY: block b of every row (20 bytes at `off`) and of every column
                    // (32 quants) is inside them (caller's contract).
                    unsafe {
                        let y = col_quants(&cp, b);
                        for r in 0..4 {
                            let row = rp[4 * h + r];
                            if prefetch != 0 {
                                // A prefetch never faults; the address may lie past the row.
                                _mm_prefetch::<_MM_HINT_T0>(
                                    row.wrapping_add(off + prefetch).cast(),
                                );
                            }
                            let q =
                                _mm512_broadcast_i32x4(_mm_loadu_si128(row.add(off + 4).cast()));
                            let x = _mm512_and_si512(_mm512_srlv_epi64(q, shift), mask);
                            let (dw, m) = two_halves(row.add(off));
                            sm[r] = _mm256_fmadd_ps(_mm256_set1_ps(m), sa[i], sm[r]);
                            let dw = _mm512_set1_ps(dw);
                            for p in 0..4 {
                                let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(
                                    _mm512_setzero_si512(),
                                    x,
                                    y[p],
                                ));
                                let d = _mm512_mul_ps(dw, da[i][p]);
                                a[r][p] = _mm512_fmadd_ps(d, lanes, a[r][p]);
                            }
                        }
                    }
                }
                for r in 0..4 {
                    acc[4 * h + r] = a[r];
                    summs[4 * h + r] = sm[r];
                }
            }
        }
        let mut s = [[0.0f32; 8]; 8];
        for (sr, v) in s.iter_mut().zip(&summs) {
            // SAFETY: `sr` holds eight floats.
            unsafe { _mm256_storeu_ps(sr.as_mut_ptr(), *v) };
        }
        let mut out = hsum_tile(&acc);
        for (c, oc) in out.iter_mut().enumerate() {
            for (r, o) in oc.iter_mut().enumerate() {
                *o += s[r][c];
            }
        }
        out
    }

    /// `hsum` of the 64 accumulators of a tile (`acc[r][p]`: row `r`, columns `2p` in lanes
    /// 0..8 and `2p + 1` in lanes 8..16) as `out[c][r]`, two rows at a time (16 sums in four
    /// registers).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn hsum_tile(acc: &[[__m512; 4]; 8]) -> [[f32; 8]; 8] {
        let mut out = [[0.0f32; 8]; 8];
        for r in (0..8).step_by(2) {
            // 1: the two 128-bit halves of each accumulator added (`a[i] + a[4 + i]`):
            // t[q] holds columns 4(q % 2) .. 4(q % 2) + 4 of row r + q / 2 in its four
            // 128-bit lanes.
            let halves = |a: __m512, b: __m512| {
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(a, b),
                    _mm512_shuffle_f32x4::<0xDD>(a, b),
                )
            };
            let t = [
                halves(acc[r][0], acc[r][1]),
                halves(acc[r][2], acc[r][3]),
                halves(acc[r + 1][0], acc[r + 1][1]),
                halves(acc[r + 1][2], acc[r + 1][3]),
            ];
            // 2: `(t0 + t2) + (t1 + t3)` in each lane: element 4j + q is register q's lane j.
            let pair = |p: __m512, q: __m512| {
                _mm512_add_ps(_mm512_unpacklo_ps(p, q), _mm512_unpackhi_ps(p, q))
            };
            let (v, w) = (pair(t[0], t[1]), pair(t[2], t[3]));
            let (vd, wd) = (_mm512_castps_pd(v), _mm512_castps_pd(w));
            let sum = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(vd, wd)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(vd, wd)),
            );
            let mut e = [0.0f32; 16];
            // SAFETY: `e` holds sixteen floats.
            unsafe { _mm512_storeu_ps(e.as_mut_ptr(), sum) };
            for j in 0..4 {
                for q in 0..4 {
                    let (rr, c) = (r + q / 2, 4 * (q % 2) + j);
                    out[c][rr] = e[4 * j + q];
                }
            }
        }
        out
    }

    /// `q8_0` rows against packed columns (see `super::dot_q8_0_scalar`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row holds `nb` `q8_0` blocks, every column is a packed
    /// column of `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_rows<const R: usize, const NC: usize>(
        rows: [&[u8]; R],
        cols: [&[u8]; NC],
        nb: usize,
        prefetch: usize,
    ) -> [[f32; R]; NC] {
        let rp = rows.map(<[u8]>::as_ptr);
        let cp = cols.map(|c| col(c, nb));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); R]; NC];
        for b in 0..nb {
            let off = b * Q8_0_BYTES;
            if prefetch != 0 {
                for p in &rp {
                    // A prefetch never faults; the address may lie past the row.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off + prefetch).cast());
                }
            }
            // SAFETY: block b of every row (34 bytes at `off`) and of every column is inside
            // them (caller's contract).
            unsafe {
                // Plain loops, not `array::from_fn`: its closures were compiled out of line.
                let mut x = [_mm256_setzero_si256(); R];
                let mut ax = [_mm256_setzero_si256(); R];
                let mut dw = [0.0f32; R];
                for r in 0..R {
                    x[r] = _mm256_loadu_si256(rp[r].add(off + 2).cast());
                    ax[r] = _mm256_sign_epi8(x[r], x[r]);
                    dw[r] = one_half(rp[r].add(off));
                }
                for (c, cc) in cp.iter().enumerate() {
                    let qy = _mm256_loadu_si256(cc.qs.add(QK * b).cast());
                    let da = cc.ds.add(b).read_unaligned();
                    for r in 0..R {
                        let sy = _mm256_sign_epi8(qy, x[r]);
                        let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                            ones,
                            _mm256_maddubs_epi16(ax[r], sy),
                        ));
                        let d = _mm256_set1_ps(dw[r] * da);
                        acc[c][r] = _mm256_fmadd_ps(d, lanes, acc[c][r]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; R]; NC];
        for c in 0..NC {
            for r in 0..R {
                out[c][r] = hsum(acc[c][r]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Isa;
    use crate::quant::tests::values;

    /// The quantizer, written out from the rule (not from the code above): quants, scale
    /// and sum of a block with exact ties.
    #[test]
    fn quantize_col_follows_the_x86_rule() {
        // amax 127: id = 1, so x.5 values are exact ties (to even).
        let mut x = vec![0.0f32; QK];
        let vals = [127.0, -127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -3.51];
        x[..vals.len()].copy_from_slice(&vals);
        let mut out = vec![0u8; col_bytes(QK)];
        quantize_col(&x, &mut out);
        let q: Vec<i8> = out[..QK].iter().map(|&b| b as i8).collect();
        assert_eq!(&q[..10], &[127, -127, 0, 2, 2, 0, -2, -2, 3, -4]);
        assert_eq!(f32_at(&out[QK..], 0), 1.0);
        let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
        assert_eq!(
            f32_at(&out[QK + 4..], 0),
            f16::from_f32(sum as f32).to_f32()
        );
        // All zero: d = 0, id = 0, quants 0.
        let mut z = vec![1u8; col_bytes(QK)];
        quantize_col(&[0.0; QK], &mut z);
        assert!(z[..QK].iter().all(|&b| b == 0));
        assert_eq!(f32_at(&z[QK..], 0), 0.0);
        // id = 127/amax, not 1/d: amax = 0.3 gives 127/0.3 and 1/(0.3/127) that differ.
        let amax = 0.3f32;
        let xs: Vec<f32> = (0..QK).map(|i| amax * i as f32 / 31.0).collect();
        quantize_col(&xs, &mut out);
        for (i, &v) in xs.iter().enumerate() {
            assert_eq!(out[i] as i8, (v * (127.0 / amax)).round_ties_even() as i8);
        }
    }

    fn naive(kind: WeightKind, row: &[u8], col: &[u8], nb: usize) -> (f64, f64) {
        // Dequantize both sides exactly (f64) and sum.
        let (qs, rest) = col.split_at(nb * QK);
        let (ds, ss) = rest.split_at(nb * 4);
        let mut sum = 0.0f64;
        let mut abs = 0.0f64;
        for b in 0..nb {
            let da = f64::from(f32_at(ds, b));
            let blk = &row[b * kind.block_bytes()..];
            for j in 0..QK {
                let y = f64::from(qs[b * QK + j] as i8) * da;
                let w = match kind {
                    WeightKind::Q4_1 => {
                        let n = if j < 16 {
                            blk[4 + j] & 15
                        } else {
                            blk[4 + j - 16] >> 4
                        };
                        f64::from(n) * f64::from(half_at(blk, 0))
                    }
                    WeightKind::Q8_0 => f64::from(blk[2 + j] as i8) * f64::from(half_at(blk, 0)),
                };
                sum += w * y;
                abs += (w * y).abs();
            }
            if kind == WeightKind::Q4_1 {
                let t = f64::from(half_at(blk, 2)) * f64::from(f32_at(ss, b));
                sum += t;
                abs += t.abs();
            }
        }
        (sum, abs)
    }

    #[test]
    fn dots_match_naive_sums_and_agree_across_levels_and_groupings() {
        let nbs: &[usize] = if cfg!(miri) { &[1, 2] } else { &[1, 3, 18, 48] };
        for kind in [WeightKind::Q4_1, WeightKind::Q8_0] {
            for &nb in nbs {
                let k = nb * QK;
                let rows: Vec<Vec<u8>> = (0..4u64)
                    .map(|r| {
                        let mut v = vec![0u8; nb * kind.block_bytes()];
                        let x = values(r + 3, k);
                        match kind {
                            WeightKind::Q4_1 => quantize_q4_1(&x, &mut v),
                            WeightKind::Q8_0 => {
                                crate::quant::quantize_q8_0(&x, &mut v);
                            }
                        }
                        v
                    })
                    .collect();
                let cols: Vec<Vec<u8>> = (0..3u64)
                    .map(|c| {
                        let mut v = vec![0u8; col_bytes(k)];
                        quantize_col(&values(c + 50, k), &mut v);
                        v
                    })
                    .collect();
                let rr: [&[u8]; 4] = std::array::from_fn(|j| &rows[j][..]);
                let cc: [&[u8]; 3] = std::array::from_fn(|j| &cols[j][..]);
                let base = dot_rows(Isa::Scalar, kind, rr, cc, 0);
                for (c, col) in cols.iter().enumerate() {
                    for (r, row) in rows.iter().enumerate() {
                        let (want, abs) = naive(kind, row, col, nb);
                        let got = f64::from(base[c][r]);
                        assert!((got - want).abs() <= 1e-5 * abs.max(1e-30), "{kind:?} {nb}");
                    }
                }
                for isa in Isa::available() {
                    let got = dot_rows(isa, kind, rr, cc, 256);
                    assert_eq!(got, base, "{isa:?} {kind:?} nb={nb}");
                    // One row, one column at a time: the same bits.
                    for c in 0..3 {
                        for r in 0..4 {
                            let [[one]] = dot_rows(isa, kind, [rr[r]], [cc[c]], 0);
                            assert_eq!(one.to_bits(), base[c][r].to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn vector_quantizer_matches_the_portable_one() {
        let mut x = values(5, 8 * QK);
        // Exact ties at amax 127, a zero block, NaN and infinity, huge values.
        for (i, v) in [127.0, 0.5, 1.5, -2.5, -127.0, 3.5].iter().enumerate() {
            x[i] = *v;
        }
        x[QK..2 * QK].fill(0.0);
        x[2 * QK + 3] = f32::NAN;
        x[3 * QK + 7] = f32::INFINITY;
        x[4 * QK + 1] = -3e38;
        x[5 * QK] = -0.0;
        let mut want = vec![0u8; col_bytes(x.len())];
        quantize_col_body(&x, &mut want);
        let mut got = vec![1u8; col_bytes(x.len())];
        quantize_col(&x, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn tiles_match_one_row_and_column_at_a_time() {
        let nbs: &[usize] = if cfg!(miri) {
            &[1]
        } else {
            &[1, 17, 18, 33, 48]
        };
        // `poison`: one column's input holds a NaN, whose quant is −128 (the AVX-512 q8_0
        // tile cannot use its offset sums then and must give the sign trick's bits).
        for (kind, poison) in [
            (WeightKind::Q4_1, false),
            (WeightKind::Q8_0, false),
            (WeightKind::Q8_0, true),
        ] {
            for &nb in nbs {
                let k = nb * QK;
                let rows: Vec<Vec<u8>> = (0..TILE as u64)
                    .map(|r| {
                        let mut v = vec![0u8; nb * kind.block_bytes()];
                        let x = values(r + 11, k);
                        match kind {
                            WeightKind::Q4_1 => quantize_q4_1(&x, &mut v),
                            WeightKind::Q8_0 => {
                                crate::quant::quantize_q8_0(&x, &mut v);
                                // A weight quant of −128 (a file may hold one).
                                if r == 2 {
                                    v[2 + 5] = 0x80;
                                }
                            }
                        }
                        v
                    })
                    .collect();
                let cols: Vec<Vec<u8>> = (0..TILE as u64)
                    .map(|c| {
                        let mut v = vec![0u8; col_bytes(k)];
                        // Columns of different magnitudes, so scales and sums differ.
                        let mut x: Vec<f32> = values(c + 70, k)
                            .iter()
                            .map(|v| v * (c + 1) as f32)
                            .collect();
                        if poison && c == 5 {
                            x[k - 3] = f32::NAN;
                        }
                        quantize_col(&x, &mut v);
                        assert_eq!(poison && c == 5, v[..k].contains(&0x80));
                        v
                    })
                    .collect();
                let rr: [&[u8]; TILE] = std::array::from_fn(|j| &rows[j][..]);
                let cc: [&[u8]; TILE] = std::array::from_fn(|j| &cols[j][..]);
                for isa in Isa::available() {
                    let got = dot_tile(isa, kind, rr, cc, 64);
                    for c in 0..TILE {
                        for r in 0..TILE {
                            let [[want]] = dot_rows(Isa::Scalar, kind, [rr[r]], [cc[c]], 0);
                            assert_eq!(
                                got[c][r].to_bits(),
                                want.to_bits(),
                                "{isa:?} {kind:?} poison={poison} nb={nb} c={c} r={r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn q4_1_round_trip_is_within_one_step() {
        let x = values(9, 4 * QK);
        let mut q = vec![0u8; 4 * Q4_1_BYTES];
        quantize_q4_1(&x, &mut q);
        let mut y = vec![0.0f32; x.len()];
        dequantize_q4_1(&q, &mut y);
        for (b, blk) in q.chunks_exact(Q4_1_BYTES).enumerate() {
            let d = half_at(blk, 0);
            for j in 0..QK {
                let (a, c) = (x[b * QK + j], y[b * QK + j]);
                assert!((a - c).abs() <= d * 0.5 + 2e-3, "{a} vs {c} (d {d})");
            }
        }
    }
}
