//! q8_0 weights in the repacked layout and their products against `qdot`-packed columns, in
//! `qdot`'s (ggml's AVX2) order bit for bit.
//!
//! A group of sixteen rows is all its blocks' quants first, then all its blocks' scales: per
//! block index `b`, 512 bytes at `512 · b`, eight 64-byte chunks, chunk `c` holding quant
//! bytes `4c .. 4c + 4` of the sixteen rows (row `r` at `4r`); then per block index 32 bytes
//! at `512 · nb + 32 · b`, the sixteen rows' f16 scales. (Scales after the quants, not
//! before each block as for q4_0 and q4_1: a 34-byte block would leave the chunks 32 bytes
//! off the cache lines; this way every chunk is one aligned line when the group is.)
//!
//! The plain order (`qdot`) keeps eight f32 lane accumulators per row, lane `l` the exact sum
//! of the products of elements `4l .. 4l + 4`, `acc = fma(d_w · d_a, lane, acc)` block by
//! block, and `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))` at the end. Chunk `c` is
//! exactly lane `c` of all sixteen rows, so one `dpbusd` against the column's four matching
//! bytes (broadcast) gives lane `c` of the sixteen rows in one register: a block is eight
//! loads, eight `dpbusd`, eight conversions and eight FMAs into eight registers (lane `c`
//! of every row), and the final sums are the same additions across the registers.
//!
//! `dpbusd` multiplies unsigned by signed bytes: the weights go in offset by 128
//! (`w ^ 0x80`) and each lane's accumulator starts at `−128 · Σ y` of its four column bytes,
//! which gives `Σ w · y` exactly. The plain kernels' sign trick gives the same sum except
//! where a column byte is −128 and the weight negative; the column quantizer writes −128 only
//! for NaN or infinite inputs, and then the AVX2 kernel (the sign trick) runs instead.
//!
//! The layout is a permutation of the plain bytes within each group, like q4_0's: see
//! `super::segments`.

use crate::qdot::{self, QK};
use crate::quant::Isa;

use super::{GROUP_ROWS, f32_at, half};

/// Bytes of a plain q8_0 block: an f16 scale and 32 quants.
pub(crate) const BLOCK_BYTES: usize = 34;
/// Bytes of one block index's quants in a group.
const QUANT_BYTES: usize = GROUP_ROWS * QK;
/// Bytes of one block index's scales in a group.
const SCALE_BYTES: usize = GROUP_ROWS * 2;
/// Bytes of one block index of a group.
pub(crate) const GROUP_BLOCK_BYTES: usize = QUANT_BYTES + SCALE_BYTES;
const _: () = assert!(GROUP_BLOCK_BYTES == GROUP_ROWS * BLOCK_BYTES);

/// `super::segments` for q8_0 (rows of `k` elements): runs of a scale's two bytes or of
/// four quant bytes.
pub(super) fn segments(
    k: usize,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize),
) {
    let nb = k / QK;
    let row_size = nb * BLOCK_BYTES;
    if row_size == 0 {
        return;
    }
    let mut off = range.start;
    while off < range.end {
        let (row, within) = (off / row_size, off % row_size);
        let (b, j) = (within / BLOCK_BYTES, within % BLOCK_BYTES);
        let (group, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
        let base = group * GROUP_ROWS * row_size;
        let (at, run) = if j < 2 {
            (base + nb * QUANT_BYTES + b * SCALE_BYTES + 2 * r + j, 2 - j)
        } else {
            let q = j - 2;
            (
                base + b * QUANT_BYTES + 64 * (q / 4) + 4 * r + q % 4,
                4 - q % 4,
            )
        };
        let n = run.min(range.end - off);
        f(off, at, n);
        off += n;
    }
}

/// `out[c][r]` = row `r` of the repacked q8_0 group `group` dotted with column `cols[c]`
/// packed by `qdot::quantize_col` (all of the same block count `nb`; `group` holds exactly
/// `nb` block indices). The same bits as `qdot::dot_rows` on the plain rows.
pub(crate) fn dot_group<const NC: usize>(
    isa: Isa,
    group: &[u8],
    cols: [&[u8]; NC],
) -> [[f32; GROUP_ROWS]; NC] {
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        cols.iter().all(|c| c.len() == nb * (QK + 8)) && group.len() == nb * GROUP_BLOCK_BYTES,
        "repack::q8_0::dot_group: group and columns of different lengths (a kernel bug)"
    );
    match isa {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx512 if crate::qmv512::available() => {
            // SAFETY: the CPU has the features (checked in the guard); `group` holds `nb`
            // block indices and every column `nb` packed blocks (asserted above).
            if let Some(out) = unsafe { x86::dot_group_vnni(group, cols, nb) } {
                return out;
            }
            // SAFETY: AVX-512 includes AVX2, FMA and F16C here (`has_avx512`); lengths as
            // above.
            unsafe { x86::dot_group_avx2(group, cols, nb) }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Isa::Avx2 | Isa::Avx512 if crate::quant::has_avx2_fma_f16c() => {
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths as above.
            unsafe { x86::dot_group_avx2(group, cols, nb) }
        }
        _ => cols.map(|c| dot_group_scalar(group, c, nb)),
    }
}

/// [`dot_group`] for one column in portable code, in the module's order (the lane sums as
/// the plain portable kernel forms them).
fn dot_group_scalar(group: &[u8], col: &[u8], nb: usize) -> [f32; GROUP_ROWS] {
    let (qs, rest) = col.split_at(nb * QK);
    let ds = &rest[..nb * 4];
    let (quants, scales) = group.split_at(nb * QUANT_BYTES);
    let mut acc = [[0.0f32; 8]; GROUP_ROWS];
    for b in 0..nb {
        let qx = &quants[b * QUANT_BYTES..(b + 1) * QUANT_BYTES];
        let sc = &scales[b * SCALE_BYTES..(b + 1) * SCALE_BYTES];
        let q = &qs[b * QK..(b + 1) * QK];
        let dy = f32_at(ds, b);
        for (r, a) in acc.iter_mut().enumerate() {
            let d = half(sc, r) * dy;
            let x: [u8; QK] = std::array::from_fn(|j| qx[64 * (j / 4) + 4 * r + j % 4]);
            for (a, s) in a.iter_mut().zip(qdot::lanes_i8(&x, q)) {
                *a = d.mul_add(s as f32, *a);
            }
        }
    }
    acc.map(|a| ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))
}

/// The kernels with intrinsics (see the module docs for the data flow).
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{GROUP_BLOCK_BYTES, GROUP_ROWS, QK, QUANT_BYTES, SCALE_BYTES};

    /// How many block indices ahead of the one being computed the quants and scales are
    /// prefetched (as q4_0's and q4_1's).
    const AHEAD: usize = 24;

    /// Where the prefetches go: block index `AHEAD` on from the one being computed, counted
    /// on through the groups that follow in memory (rows that follow each other).
    ///
    /// A group's quants and its scales are two streams that both restart at the next group.
    /// Asking for the next group's first lines before its quants are reached (running on
    /// past the quants had asked for this group's scales again) took the 8192 × 8192
    /// one-column product of `benches/matvec.rs`, on two threads of a loaded host, from
    /// 1.08–1.16 to 0.97–1.06 times the read, and from 1.10–1.16 to 0.98–1.04 (six
    /// alternations each); as written here, from 1.31–1.42 to 1.16–1.29 (six) and from
    /// 1.08–1.47 (median 1.25) to 0.98–1.34 (median 1.15, eight). Counting through groups
    /// keeps the distance for groups shorter than `AHEAD` block indices too (rows of 576
    /// elements, SmolLM2's width, have 18). The addresses may lie past the end of the
    /// weights: they are only prefetched.
    struct Ahead {
        group: *const u8,
        b: usize,
        nb: usize,
    }

    impl Ahead {
        fn new(group: *const u8, nb: usize) -> Ahead {
            let nb = nb.max(1);
            Ahead {
                group: group.wrapping_add(AHEAD / nb * nb * GROUP_BLOCK_BYTES),
                b: AHEAD % nb,
                nb,
            }
        }

        /// The current block index's quants and scales.
        fn lines(&self) -> (*const u8, *const u8) {
            let quants = self.group.wrapping_add(self.b * QUANT_BYTES);
            let scales = self
                .group
                .wrapping_add(self.nb * QUANT_BYTES + self.b * SCALE_BYTES);
            (quants, scales)
        }

        fn advance(&mut self) {
            self.b += 1;
            if self.b == self.nb {
                self.b = 0;
                self.group = self.group.wrapping_add(self.nb * GROUP_BLOCK_BYTES);
            }
        }
    }

    /// [`super::dot_group`] with AVX-512 VNNI: sixteen rows in the sixteen lanes, eight
    /// accumulators (one per lane of the plain order) per column. `None` when a column
    /// holds the quant −128 (module docs).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; `group` must hold `nb`
    /// block indices and every column `nb` packed blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_group_vnni<const NC: usize>(
        group: &[u8],
        cols: [&[u8]; NC],
        nb: usize,
    ) -> Option<[[f32; GROUP_ROWS]; NC]> {
        let g = group.as_ptr();
        let sc = g.wrapping_add(nb * QUANT_BYTES);
        let cq = cols.map(<[u8]>::as_ptr);
        let cd = cols.map(|c| c.as_ptr().wrapping_add(nb * QK).cast::<f32>());
        let mut acc = [[_mm512_setzero_ps(); 8]; NC];
        let bias = _mm512_set1_epi8(-128);
        let bias8 = _mm256_set1_epi8(-128);
        let mut ymin = _mm256_setzero_si256();
        let mut ahead = Ahead::new(g, nb);
        for b in 0..nb {
            // SAFETY: block index b < nb exists in the group and every column (caller's
            // contract); the prefetch addresses may lie past the end (prefetches never fault).
            unsafe {
                let p = g.add(b * QUANT_BYTES);
                let (pq, ps) = ahead.lines();
                ahead.advance();
                for off in (0..QUANT_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(pq.wrapping_add(off).cast());
                }
                _mm_prefetch::<_MM_HINT_T0>(ps.cast());
                let s = sc.add(b * SCALE_BYTES);
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(s.cast()));
                let x: [__m512i; 8] = std::array::from_fn(|l| {
                    _mm512_xor_si512(_mm512_loadu_si512(p.add(64 * l).cast()), bias)
                });
                for c in 0..NC {
                    let q = cq[c].add(QK * b);
                    let yb = _mm256_loadu_si256(q.cast());
                    ymin = _mm256_min_epi8(ymin, yb);
                    // −128 · (the sum of each lane's four column bytes).
                    let base = _mm256_sub_epi32(
                        _mm256_setzero_si256(),
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias8, yb),
                    );
                    let mut bl = [0i32; 8];
                    _mm256_storeu_si256(bl.as_mut_ptr().cast(), base);
                    let d = _mm512_mul_ps(dx, _mm512_set1_ps(cd[c].add(b).read_unaligned()));
                    for (l, a) in acc[c].iter_mut().enumerate() {
                        let y = _mm512_set1_epi32(q.add(4 * l).cast::<i32>().read_unaligned());
                        let s = _mm512_dpbusd_epi32(_mm512_set1_epi32(bl[l]), x[l], y);
                        *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *a);
                    }
                }
            }
        }
        if _mm256_movemask_epi8(_mm256_cmpeq_epi8(ymin, bias8)) != 0 {
            return None;
        }
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for (o, a) in out.iter_mut().zip(&acc) {
            let h = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
            );
            // SAFETY: `o` holds sixteen floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), h) };
        }
        Some(out)
    }

    /// [`super::dot_group`] with AVX2: each half of eight rows in a pass over the group of
    /// its own, with the plain AVX2 kernel's sign trick (`|x|` against `y` signed by `x`,
    /// `maddubs` then `madd` with ones).
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
        let sc = g.wrapping_add(nb * QUANT_BYTES);
        let cq = cols.map(<[u8]>::as_ptr);
        let cd = cols.map(|c| c.as_ptr().wrapping_add(nb * QK).cast::<f32>());
        let ones = _mm256_set1_epi16(1);
        let mut out = [[0.0f32; GROUP_ROWS]; NC];
        for h in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; NC];
            for b in 0..nb {
                // SAFETY: as in `dot_group_vnni`.
                unsafe {
                    let p = g.add(b * QUANT_BYTES + 32 * h);
                    let dx =
                        _mm256_cvtph_ps(_mm_loadu_si128(sc.add(b * SCALE_BYTES + 16 * h).cast()));
                    let x: [__m256i; 8] =
                        std::array::from_fn(|l| _mm256_loadu_si256(p.add(64 * l).cast()));
                    for c in 0..NC {
                        let q = cq[c].add(QK * b);
                        let d = _mm256_mul_ps(dx, _mm256_set1_ps(cd[c].add(b).read_unaligned()));
                        for (l, a) in acc[c].iter_mut().enumerate() {
                            let y = _mm256_set1_epi32(q.add(4 * l).cast::<i32>().read_unaligned());
                            let ax = _mm256_sign_epi8(x[l], x[l]);
                            let sy = _mm256_sign_epi8(y, x[l]);
                            let s = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy));
                            *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
                        }
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                let s = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                    _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
                );
                // SAFETY: `o` holds sixteen floats, eight from `8 · h`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), s) };
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::{AHEAD, Ahead, GROUP_BLOCK_BYTES, QUANT_BYTES, SCALE_BYTES};

        /// The cursor visits, block index by block index, the quants and scales `AHEAD` block
        /// indices on in the sequence of groups that follow each other (computed here by
        /// division), for groups shorter and longer than `AHEAD`.
        #[test]
        fn ahead_counts_on_through_the_following_groups() {
            // Only addresses are computed (nothing is read), so one byte stands for the weights.
            let weights = [0u8; 1];
            let base = weights.as_ptr();
            for nb in 1..=3 * AHEAD {
                let group_bytes = nb * GROUP_BLOCK_BYTES;
                let mut ahead = Ahead::new(base, nb);
                for b in 0..2 * nb {
                    let (g, i) = ((b + AHEAD) / nb, (b + AHEAD) % nb);
                    let group = g * group_bytes;
                    let want = (
                        group + i * QUANT_BYTES,
                        group + nb * QUANT_BYTES + i * SCALE_BYTES,
                    );
                    let (q, s) = ahead.lines();
                    let got = (q as usize - base as usize, s as usize - base as usize);
                    assert_eq!(got, want, "nb {nb}, block index {b}");
                    ahead.advance();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qdot::{Q8_0_BYTES, WeightKind};
    use crate::quant::tests::values;
    use graph::ElementType;

    /// Plain q8_0 rows quantized from test values, with quants the quantizer never writes
    /// (−128) and ±127 in a few places.
    fn plain_rows(seed: u64, k: usize, rows: usize) -> Vec<u8> {
        let mut v = vec![0u8; rows * k / QK * Q8_0_BYTES];
        crate::quant::quantize_q8_0(&values(seed, rows * k), &mut v);
        for (i, blk) in v.chunks_exact_mut(Q8_0_BYTES).enumerate() {
            blk[2 + i % 32] = 0x80;
            blk[2 + (5 * i + 3) % 32] = 0x7f;
            blk[2 + (7 * i + 1) % 32] = 0x81;
        }
        v
    }

    /// A packed column; with `poison` a NaN in the last block (its quant is −128).
    fn column(seed: u64, k: usize, poison: bool) -> Vec<u8> {
        let mut x = values(seed, k);
        for (i, v) in x[..QK].iter_mut().enumerate() {
            *v = [1.0, -1.0][i % 2];
        }
        if poison {
            x[k - 2] = f32::NAN;
        }
        let mut col = vec![0u8; qdot::col_bytes(k)];
        qdot::quantize_col(&x, &mut col);
        assert_eq!(col[..k].contains(&0x80), poison);
        col
    }

    /// Every level gives the bits of the plain q8_0 kernels (`qdot::dot_rows`, portable) on
    /// the same rows, for one and two columns at a time, with and without a −128 quant in a
    /// column.
    #[test]
    fn repacked_q8_0_products_equal_the_plain_ones_bit_for_bit() {
        let nbs: &[usize] = if cfg!(miri) { &[1] } else { &[1, 2, 3, 18, 48] };
        for &nb in nbs {
            let k = nb * QK;
            let plain = plain_rows(nb as u64, k, GROUP_ROWS);
            let mut packed = vec![0u8; plain.len()];
            super::super::pack(ElementType::Q8_0, k, &plain, &mut packed);
            let mut back = vec![0u8; plain.len()];
            super::super::unpack(ElementType::Q8_0, k, &packed, &mut back);
            assert_eq!(back, plain);
            for poison in [false, true] {
                let cols: Vec<Vec<u8>> = (0..2).map(|c| column(c + 20, k, poison)).collect();
                let row = |r: usize| &plain[r * nb * Q8_0_BYTES..(r + 1) * nb * Q8_0_BYTES];
                let mut want = [[0u32; GROUP_ROWS]; 2];
                for (c, col) in cols.iter().enumerate() {
                    for h in 0..GROUP_ROWS / 8 {
                        let rws: [&[u8]; 8] = std::array::from_fn(|j| row(8 * h + j));
                        let [d] = qdot::dot_rows(Isa::Scalar, WeightKind::Q8_0, rws, [&col[..]], 0);
                        for j in 0..8 {
                            want[c][8 * h + j] = d[j].to_bits();
                        }
                    }
                }
                for isa in Isa::available() {
                    let two = dot_group(isa, &packed, [&cols[0][..], &cols[1]]);
                    for c in 0..2 {
                        let msg = format!("{isa:?} nb={nb} poison={poison} col {c}");
                        assert_eq!(two[c].map(f32::to_bits), want[c], "{msg}");
                        let [one] = dot_group(isa, &packed, [&cols[c][..]]);
                        assert_eq!(one.map(f32::to_bits), want[c], "{msg}");
                    }
                }
            }
        }
    }

    /// The layout written out: row 3's block 1 scale and quant bytes 4..8.
    #[test]
    fn segments_place_scales_after_the_quants() {
        let k = 2 * QK;
        let row = 3 * 2 * BLOCK_BYTES;
        let mut runs = Vec::new();
        segments(k, row + BLOCK_BYTES..row + BLOCK_BYTES + 10, |p, q, n| {
            runs.push((p, q, n))
        });
        let b1 = row + BLOCK_BYTES;
        assert_eq!(
            runs,
            [
                (b1, 2 * QUANT_BYTES + SCALE_BYTES + 6, 2),
                (b1 + 2, QUANT_BYTES + 12, 4),
                (b1 + 6, QUANT_BYTES + 64 + 12, 4),
            ]
        );
    }
}
