//! Single-column (`n = 1`, a decode step's) `q4_1` and `q8_0` products of eight weight rows
//! with AVX-512 and VNNI, in `qdot`'s order bit for bit.
//!
//! Why a second kernel: the AVX2 kernel holds eight rows' accumulators, their unpacked
//! quants and their scales in sixteen vector registers and spills; a decode step spends most
//! of its arithmetic there. Here two rows share one 512-bit register (each 256-bit half does
//! exactly what the AVX2 kernel does for its row), VNNI's `dpbusd` forms the four-byte lane
//! sums in one instruction, and the eight rows' block scales are converted and multiplied
//! together in one vector. Nothing changes a result:
//!
//! * `dpbusd` gives the exact sum of four `u8 × i8` products per lane; `maddubs` + `madd`
//!   give the same sum whenever `maddubs`'s pair sums do not saturate, which they never do
//!   here (`q4_1`: nibbles `0..=15` against `i8`, pairs within ±3,840; `q8_0` with the sign
//!   trick: `|x| ≤ 128` against the sign-adjusted `i8`, pairs within `[-32768, 32512]`);
//! * the block scale `d_w · d_a`, the lane conversion, the FMA into the lane accumulators,
//!   the `m_w · s_a` FMA chain and the final `hsum + summs` are the same f32 operations in
//!   the same order, just several rows per instruction.
//!
//! `qdot::dot_rows` sends eight-row, one-column calls here when the CPU has the features;
//! its tests compare every level against the portable kernels.

use std::arch::x86_64::*;

use crate::qdot::{Q4_1_BYTES, Q8_0_BYTES, QK};

/// Rows per call.
pub(crate) const ROWS: usize = 8;

/// Whether the CPU has what these kernels use (asked once: `qdot::dot_rows` checks it on
/// every call, one call per eight rows).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(crate::quant::has_avx512)
}

/// ggml's `hsum_float_8` order over the eight lanes of one row.
#[inline(always)]
fn hsum8(a: &[f32]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Per-row pointers into a packed column (`qdot::quantize_col`'s layout) of `nb` blocks.
#[inline(always)]
fn column(col: &[u8], nb: usize) -> (*const u8, *const f32, *const f32) {
    let (qs, rest) = col.split_at(nb * QK);
    let (ds, ss) = rest.split_at(nb * 4);
    (qs.as_ptr(), ds.as_ptr().cast(), ss.as_ptr().cast())
}

/// Permutation indices for row pair `p` (rows `2p`, `2p + 1`) of a scales vector that holds
/// row `r`'s scale in lane `r · stride`: that of row `2p` in the lower eight lanes, that of
/// row `2p + 1` in the upper eight.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_index(p: i32, stride: i32) -> __m512i {
    _mm512_mask_blend_epi32(
        0xff00,
        _mm512_set1_epi32(2 * p * stride),
        _mm512_set1_epi32((2 * p + 1) * stride),
    )
}

/// The two rows `r0` and `r1`'s 32 bytes at `off` in the two halves of one register.
///
/// # Safety
/// 32 bytes at `off` must be readable in both rows.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn two_rows_32(r0: *const u8, r1: *const u8, off: usize) -> __m512i {
    // SAFETY: 32 readable bytes at `off` in both rows (caller's contract).
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(r0.add(off).cast())),
            _mm256_loadu_si256(r1.add(off).cast()),
        )
    }
}

/// `q4_1` rows against one packed column: `[row · col; 8]`.
///
/// # Safety
/// The CPU has the [`available`] features; every row holds `nb` `q4_1` blocks and `col` is a
/// packed column of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4_1_rows8(
    rows: [&[u8]; ROWS],
    col: &[u8],
    nb: usize,
    prefetch: usize,
) -> [f32; ROWS] {
    let rp = rows.map(<[u8]>::as_ptr);
    let (qs, ds, ss) = column(col, nb);
    let mask = _mm512_set1_epi8(0x0f);
    // Per row: the 16 quant bytes twice, the second copy shifted down a nibble.
    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    // The scales vector interleaves `d_r` (lane 2r) and `m_r` (lane 2r + 1).
    let idx: [__m512i; 4] = std::array::from_fn(|p| pair_index(p as i32, 2));
    let mut acc = [_mm512_setzero_ps(); ROWS / 2];
    let mut summs = _mm512_setzero_ps();
    for b in 0..nb {
        let off = b * Q4_1_BYTES;
        // Every other block: 40 bytes apart, so every cache line of the rows is asked for.
        if prefetch != 0 && b % 2 == 0 {
            for p in &rp {
                // A prefetch never faults; the address may lie past the row.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off + prefetch).cast());
            }
        }
        // SAFETY: block b of every row (20 bytes at `off`) and of the column (32 quants, one
        // scale, one sum) is inside them (caller's contract).
        unsafe {
            let hdr = |r: usize| rp[r].add(off).cast::<i32>().read_unaligned();
            let h = _mm512_cvtph_ps(_mm256_setr_epi32(
                hdr(0),
                hdr(1),
                hdr(2),
                hdr(3),
                hdr(4),
                hdr(5),
                hdr(6),
                hdr(7),
            ));
            let da = _mm512_set1_ps(ds.add(b).read_unaligned());
            let sa = _mm512_set1_ps(ss.add(b).read_unaligned());
            // Lanes 2r + 1: `m_r · s_a + summs_r`, fused (lanes 2r are not used).
            summs = _mm512_fmadd_ps(h, sa, summs);
            // Lanes 2r: `d_r · d_a`.
            let dd = _mm512_mul_ps(h, da);
            let qy = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(QK * b).cast()));
            for (p, a) in acc.iter_mut().enumerate() {
                let q = |r: usize| {
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(rp[r].add(off + 4).cast()))
                };
                let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q(2 * p)), q(2 * p + 1));
                let x = _mm512_and_si512(_mm512_srlv_epi64(z, shift), mask);
                let lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x, qy);
                let d = _mm512_permutexvar_ps(idx[p], dd);
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), *a);
            }
        }
    }
    let mut s = [0.0f32; 16];
    // SAFETY: `s` holds 16 floats.
    unsafe { _mm512_storeu_ps(s.as_mut_ptr(), summs) };
    let mut out = [0.0f32; ROWS];
    for (p, a) in acc.iter().enumerate() {
        let mut l = [0.0f32; 16];
        // SAFETY: `l` holds 16 floats.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *a) };
        out[2 * p] = hsum8(&l[..8]) + s[4 * p + 1];
        out[2 * p + 1] = hsum8(&l[8..]) + s[4 * p + 3];
    }
    out
}

/// `q8_0` rows against one packed column: `[row · col; 8]`.
///
/// # Safety
/// The CPU has the [`available`] features; every row holds `nb` `q8_0` blocks and `col` is a
/// packed column of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q8_0_rows8(
    rows: [&[u8]; ROWS],
    col: &[u8],
    nb: usize,
    prefetch: usize,
) -> [f32; ROWS] {
    let rp = rows.map(<[u8]>::as_ptr);
    let (qs, ds, _) = column(col, nb);
    let zero = _mm512_setzero_si512();
    let idx: [__m512i; 4] = std::array::from_fn(|p| pair_index(p as i32, 1));
    let mut acc = [_mm512_setzero_ps(); ROWS / 2];
    for b in 0..nb {
        let off = b * Q8_0_BYTES;
        // Every block: blocks are 34 bytes, so every other one could skip a cache line.
        if prefetch != 0 {
            for p in &rp {
                // A prefetch never faults; the address may lie past the row.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off + prefetch).cast());
            }
        }
        // SAFETY: block b of every row (34 bytes at `off`) and of the column is inside them
        // (caller's contract).
        unsafe {
            let hdr = |r: usize| rp[r].add(off).cast::<i16>().read_unaligned();
            let dw = _mm256_cvtph_ps(_mm_setr_epi16(
                hdr(0),
                hdr(1),
                hdr(2),
                hdr(3),
                hdr(4),
                hdr(5),
                hdr(6),
                hdr(7),
            ));
            // Lane r: `d_r · d_a`.
            let dd = _mm512_zextps256_ps512(_mm256_mul_ps(
                dw,
                _mm256_set1_ps(ds.add(b).read_unaligned()),
            ));
            let qy = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(QK * b).cast()));
            for (p, a) in acc.iter_mut().enumerate() {
                let x = two_rows_32(rp[2 * p], rp[2 * p + 1], off + 2);
                // `sign` trick: |x| as unsigned, y negated where x < 0 (where x = 0 the
                // product is 0 either way).
                let ax = _mm512_abs_epi8(x);
                let sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(x), zero, qy);
                let lanes = _mm512_dpbusd_epi32(zero, ax, sy);
                let d = _mm512_permutexvar_ps(idx[p], dd);
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), *a);
            }
        }
    }
    let mut out = [0.0f32; ROWS];
    for (p, a) in acc.iter().enumerate() {
        let mut l = [0.0f32; 16];
        // SAFETY: `l` holds 16 floats.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *a) };
        out[2 * p] = hsum8(&l[..8]);
        out[2 * p + 1] = hsum8(&l[8..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::qdot::{WeightKind, col_bytes, dot_rows, quantize_col, quantize_q4_1};
    use crate::quant::Isa;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                // A few large values so that blocks have different scales.
                if i % 37 == 0 { u * 40.0 } else { u }
            })
            .collect()
    }

    /// Eight rows against one column: the AVX-512 kernel gives the portable kernel's bits
    /// (and the AVX2 kernel's), with extreme bytes (−128, 127) in the weights and the column.
    #[test]
    fn eight_rows_one_column_match_every_level() {
        if !super::available() {
            return;
        }
        for kind in [WeightKind::Q4_1, WeightKind::Q8_0] {
            for nb in [1usize, 2, 3, 18, 48] {
                let k = nb * crate::qdot::QK;
                let bb = match kind {
                    WeightKind::Q4_1 => crate::qdot::Q4_1_BYTES,
                    WeightKind::Q8_0 => crate::qdot::Q8_0_BYTES,
                };
                let rows: Vec<Vec<u8>> = (0..8u64)
                    .map(|r| {
                        let mut v = vec![0u8; nb * bb];
                        let x = values(r + 7, k);
                        match kind {
                            WeightKind::Q4_1 => quantize_q4_1(&x, &mut v),
                            WeightKind::Q8_0 => {
                                crate::quant::quantize_q8_0(&x, &mut v);
                                // Extreme quants the quantizer never writes.
                                for b in 0..nb {
                                    v[b * bb + 2 + (r as usize + b) % 32] = 0x80;
                                    v[b * bb + 2 + (r as usize + 5 * b + 3) % 32] = 0x7f;
                                }
                            }
                        }
                        v
                    })
                    .collect();
                let mut col = vec![0u8; col_bytes(k)];
                quantize_col(&values(99, k), &mut col);
                for b in 0..nb {
                    col[b * 32 + b % 32] = 0x80;
                    col[b * 32 + (b + 9) % 32] = 0x7f;
                }
                let rr: [&[u8]; 8] = std::array::from_fn(|j| &rows[j][..]);
                let base = dot_rows(Isa::Scalar, kind, rr, [&col[..]], 0);
                for isa in [Isa::Avx2, Isa::Avx512] {
                    for prefetch in [0, 8 * bb * nb] {
                        let got = dot_rows(isa, kind, rr, [&col[..]], prefetch);
                        assert_eq!(
                            got[0].map(f32::to_bits),
                            base[0].map(f32::to_bits),
                            "{isa:?} {kind:?} nb={nb}"
                        );
                    }
                }
            }
        }
    }
}
