//! Products of q4_1 weights in the repacked layout against `qdot`-packed columns, in `qdot`'s
//! (ggml's AVX2) order bit for bit.
//!
//! A block index of a group is 320 bytes: the sixteen rows' f16 scales (32 bytes), their f16
//! minimums (32 bytes), then four 64-byte chunks, chunk `c` holding quant bytes `4c .. 4c + 4`
//! of the sixteen rows (row `r` at `4r`). The plain order (`qdot`) keeps eight f32 lane
//! accumulators per row, lane `l` summing the products of elements `4l .. 4l + 4` (low
//! nibbles: elements 0..16, high nibbles: 16..32) with `acc = fma(d_w · d_a, lane, acc)` block
//! by block, a `m_w · s_a` FMA chain, and `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) +
//! summs` at the end. Here the low (or high) nibbles of chunk `c` are exactly lane `c` (or
//! `4 + c`) of all sixteen rows, so one VNNI `dpbusd` against the column's four matching bytes
//! (broadcast) gives lane `l` of the sixteen rows in the sixteen 32-bit lanes of a register:
//! a block is four loads, eight nibble masks, eight `dpbusd`, eight conversions and eight
//! FMAs into eight registers (lane `l` of every row), one FMA for the minimums, and no
//! shuffles; the final horizontal sum of each row is the same additions done across the
//! eight registers. `dpbusd` sums are exact (nibbles `0..=15` against `i8`).

use crate::qdot::QK;
use crate::quant::Isa;

use super::{GROUP_ROWS, f32_at, half};

/// Bytes of one block index of a q4_1 group.
pub(crate) const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * 20;

/// `out[c][r]` = row `r` of the repacked q4_1 group `group` dotted with column `cols[c]`
/// packed by `qdot::quantize_col` (all of the same block count `nb`; `group` holds at least
/// `nb` block indices). The same bits as `qdot::dot_rows` on the plain rows.
pub(crate) fn dot_group<const NC: usize>(
    isa: Isa,
    group: &[u8],
    cols: [&[u8]; NC],
) -> [[f32; GROUP_ROWS]; NC] {
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        cols.iter().all(|c| c.len() == nb * (QK + 8)) && group.len() >= nb * GROUP_BLOCK_BYTES,
        "repack::q4_1::dot_group: short group or column (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx512 if crate::quant::has_avx512() => {
            // SAFETY: the CPU has the features (checked in the guard); `group` holds `nb`
            // block indices and every column `nb` packed blocks (asserted above).
            unsafe { x86::dot_group_vnni(group, cols, nb) }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if crate::quant::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths as above.
            unsafe { x86::dot_group_avx2(group, cols, nb) }
        }
        _ => cols.map(|c| dot_group_scalar(group, c, nb)),
    }
}

/// [`dot_group`] for one column in portable code, in the module's order.
fn dot_group_scalar(group: &[u8], col: &[u8], nb: usize) -> [f32; GROUP_ROWS] {
    let (qs, rest) = col.split_at(nb * QK);
    let (ds, ss) = rest.split_at(nb * 4);
    let mut acc = [[0.0f32; 8]; GROUP_ROWS];
    let mut summs = [0.0f32; GROUP_ROWS];
    for b in 0..nb {
        let blk = &group[b * GROUP_BLOCK_BYTES..(b + 1) * GROUP_BLOCK_BYTES];
        let q = &qs[b * QK..(b + 1) * QK];
        let (dy, sy) = (f32_at(ds, b), f32_at(ss, b));
        for (r, (a, sm)) in acc.iter_mut().zip(&mut summs).enumerate() {
            *sm = half(&blk[32..], r).mul_add(sy, *sm);
            let d = half(blk, r) * dy;
            for (l, a) in a.iter_mut().enumerate() {
                let (c, shift) = (l % 4, 4 * (l / 4));
                let s: i32 = (0..4)
                    .map(|i| {
                        let x = (blk[64 + 64 * c + 4 * r + i] >> shift) & 0x0f;
                        i32::from(x) * i32::from(q[4 * l + i] as i8)
                    })
                    .sum();
                *a = d.mul_add(s as f32, *a);
            }
        }
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])) + summs[r]
    })
}

/// The kernels with intrinsics (see the module docs for the data flow).
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{GROUP_BLOCK_BYTES, GROUP_ROWS, QK};

    /// How far ahead of the block being computed the group is prefetched, in bytes.
    /// Far enough for weights streamed from memory: with 4 block indices, a group larger than
    /// L3 (8192 × 16384, one thread, `benches/matvec.rs`) ran its fastest calls at 0.60–0.67 of
    /// the read ceiling, with 24 at 0.90–1.05 (noisy machine); in cache it cost at most 2 %.
    const PREFETCH: usize = 24 * GROUP_BLOCK_BYTES;

    /// Pointers to the parts of a packed column (`qdot::quantize_col`): quants, scales, sums.
    #[derive(Copy, Clone)]
    struct Col {
        qs: *const u8,
        ds: *const f32,
        ss: *const f32,
    }

    fn col_parts(col: &[u8], nb: usize) -> Col {
        let base = col.as_ptr();
        Col {
            qs: base,
            ds: base.wrapping_add(nb * QK).cast(),
            ss: base.wrapping_add(nb * (QK + 4)).cast(),
        }
    }

    /// [`super::dot_group`] with AVX-512 VNNI: sixteen rows in the sixteen lanes, eight
    /// accumulators (one per lane of the plain order) and one of minimums per column.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; `group` must hold `nb`
    /// block indices and every column `nb` packed blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_group_vnni<const NC: usize>(
        group: &[u8],
        cols: [&[u8]; NC],
        nb: usize,
    ) -> [[f32; GROUP_ROWS]; NC] {
        let g = group.as_ptr();
        let c = cols.map(|col| col_parts(col, nb));
        let mut acc = [[_mm512_setzero_ps(); 8]; NC];
        let mut summs = [_mm512_setzero_ps(); NC];
        let m4 = _mm512_set1_epi8(0x0f);
        for b in 0..nb {
            // SAFETY: block index b < nb exists in the group and every column (caller's
            // contract); the prefetch addresses may lie past the end (prefetches never fault).
            unsafe {
                let p = g.add(b * GROUP_BLOCK_BYTES);
                for off in (0..GROUP_BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off).cast());
                }
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
                let mx = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast()));
                let raw: [__m512i; 4] =
                    std::array::from_fn(|k| _mm512_loadu_si512(p.add(64 + 64 * k).cast()));
                let x: [__m512i; 8] = std::array::from_fn(|l| {
                    if l < 4 {
                        _mm512_and_si512(raw[l], m4)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(raw[l - 4]), m4)
                    }
                });
                for ((acc, sm), c) in acc.iter_mut().zip(&mut summs).zip(&c) {
                    *sm = _mm512_fmadd_ps(mx, _mm512_set1_ps(c.ss.add(b).read_unaligned()), *sm);
                    let d = _mm512_mul_ps(dx, _mm512_set1_ps(c.ds.add(b).read_unaligned()));
                    let q = c.qs.add(QK * b);
                    for (l, a) in acc.iter_mut().enumerate() {
                        let y = _mm512_set1_epi32(q.add(4 * l).cast::<i32>().read_unaligned());
                        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x[l], y);
                        *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *a);
                    }
                }
            }
        }
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for ((o, a), sm) in out.iter_mut().zip(&acc).zip(&summs) {
            let h = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
            );
            // SAFETY: `o` holds sixteen floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(h, *sm)) };
        }
        out
    }

    /// [`super::dot_group`] with AVX2: each half of eight rows in a pass over the group of
    /// its own (nine accumulators per column). `maddubs` then `madd` with ones give the lane
    /// sums exactly (nibble × i8 pairs stay within ±3,840).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; lengths as for [`dot_group_vnni`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_group_avx2<const NC: usize>(
        group: &[u8],
        cols: [&[u8]; NC],
        nb: usize,
    ) -> [[f32; GROUP_ROWS]; NC] {
        let g = group.as_ptr();
        let c = cols.map(|col| col_parts(col, nb));
        let m4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for h in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; NC];
            let mut summs = [_mm256_setzero_ps(); NC];
            for b in 0..nb {
                // SAFETY: as in `dot_group_vnni`.
                unsafe {
                    let p = g.add(b * GROUP_BLOCK_BYTES);
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast()));
                    let mx = _mm256_cvtph_ps(_mm_loadu_si128(p.add(32 + 16 * h).cast()));
                    let raw: [__m256i; 4] = std::array::from_fn(|k| {
                        _mm256_loadu_si256(p.add(64 + 64 * k + 32 * h).cast())
                    });
                    let x: [__m256i; 8] = std::array::from_fn(|l| {
                        if l < 4 {
                            _mm256_and_si256(raw[l], m4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(raw[l - 4]), m4)
                        }
                    });
                    for ((acc, sm), c) in acc.iter_mut().zip(&mut summs).zip(&c) {
                        *sm =
                            _mm256_fmadd_ps(mx, _mm256_set1_ps(c.ss.add(b).read_unaligned()), *sm);
                        let d = _mm256_mul_ps(dx, _mm256_set1_ps(c.ds.add(b).read_unaligned()));
                        let q = c.qs.add(QK * b);
                        for (l, a) in acc.iter_mut().enumerate() {
                            let y = _mm256_set1_epi32(q.add(4 * l).cast::<i32>().read_unaligned());
                            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(x[l], y), ones);
                            *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
                        }
                    }
                }
            }
            for ((o, a), sm) in out.iter_mut().zip(&acc).zip(&summs) {
                let s = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                    _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
                );
                // SAFETY: `o` holds sixteen floats, eight from `8 · h`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), _mm256_add_ps(s, *sm)) };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qdot::{self, Q4_1_BYTES, WeightKind};
    use crate::quant::tests::values;
    use graph::ElementType;

    /// Plain q4_1 rows quantized from test values, with extremes: row 0's first block all 15
    /// nibbles, row 1's all 0.
    fn plain_rows(seed: u64, k: usize, rows: usize) -> Vec<u8> {
        let mut v = vec![0u8; rows * k / QK * Q4_1_BYTES];
        qdot::quantize_q4_1(&values(seed, rows * k), &mut v);
        v[4..Q4_1_BYTES].fill(0xff);
        if rows > 1 {
            let row = k / QK * Q4_1_BYTES;
            v[row + 4..row + Q4_1_BYTES].fill(0);
        }
        v
    }

    fn column(seed: u64, k: usize) -> Vec<u8> {
        let mut x = values(seed, k);
        // Extreme quants in block 0: ±127.
        for (i, v) in x[..QK].iter_mut().enumerate() {
            *v = [1.0, -1.0][i % 2];
        }
        let mut col = vec![0u8; qdot::col_bytes(k)];
        qdot::quantize_col(&x, &mut col);
        col
    }

    /// Every level gives the bits of the plain q4_1 kernels (`qdot::dot_rows`, portable) on
    /// the same rows, for one and two columns at a time.
    #[test]
    fn repacked_q4_1_products_equal_the_plain_ones_bit_for_bit() {
        let nbs: &[usize] = if cfg!(miri) {
            &[1, 2]
        } else {
            &[1, 2, 3, 18, 48]
        };
        for &nb in nbs {
            let k = nb * QK;
            let plain = plain_rows(nb as u64, k, GROUP_ROWS);
            let mut packed = vec![0u8; plain.len()];
            super::super::pack(ElementType::Q4_1, k, &plain, &mut packed);
            let cols: Vec<Vec<u8>> = (0..2).map(|c| column(c + 20, k)).collect();
            let row = |r: usize| &plain[r * nb * Q4_1_BYTES..(r + 1) * nb * Q4_1_BYTES];
            let mut want = [[0u32; GROUP_ROWS]; 2];
            for (c, col) in cols.iter().enumerate() {
                for h in 0..GROUP_ROWS / 8 {
                    let rws: [&[u8]; 8] = std::array::from_fn(|j| row(8 * h + j));
                    let [d] = qdot::dot_rows(Isa::Scalar, WeightKind::Q4_1, rws, [&col[..]], 0);
                    for j in 0..8 {
                        want[c][8 * h + j] = d[j].to_bits();
                    }
                }
            }
            for isa in Isa::available() {
                let two = dot_group(isa, &packed, [&cols[0][..], &cols[1]]);
                for c in 0..2 {
                    assert_eq!(two[c].map(f32::to_bits), want[c], "{isa:?} nb={nb} col {c}");
                    let [one] = dot_group(isa, &packed, [&cols[c][..]]);
                    assert_eq!(one.map(f32::to_bits), want[c], "{isa:?} nb={nb} col {c}");
                }
            }
        }
    }
}
