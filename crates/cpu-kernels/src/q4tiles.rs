//! Plain q4_0 rows (the layout of a file, of a mapped or any other buffer) against packed
//! columns with AVX-512 VNNI, VBMI and GFNI, sixteen rows a call in four tiles of four: the
//! same bits as `quant`'s eight-row kernel and the repacked kernels.
//!
//! Why: the eight-row kernel spends most of its instructions collecting each row's scale
//! and summing each row's products across lanes (`hadd`); from DRAM it ran at about a third
//! of the read ceiling. Here the unit of work is four consecutive blocks of a row (72
//! contiguous bytes, whose 64 quant bytes fill one register after one byte permute), and the
//! lanes of the arithmetic are (block, row) pairs of a tile of four rows:
//!
//! * two rows share a pair of registers: `A` holds quant bytes `0..8` of each block of both
//!   rows, `B` bytes `8..16` (one byte permute each, from the rows' step bytes `0..64` and
//!   `8..72`), so that 128-bit lane `j` is block `j`: dwords `[row 0, row 1, row 0, row 1]`.
//!   Their low nibbles (a mask) and high nibbles (one GFNI affine transform,
//!   `qmv512::high_nibbles`) against the column's matching bytes (four `dpbusd` chained
//!   into one register) give two exact partial sums per row and block;
//! * the two pairs of a tile are finished together (two 64-bit `unpack` and an add) so that
//!   lane `4j + r` is the exact sum of block `j` of row `r`; minus the column's `8 · Σ q`,
//!   converted, times `d_w · d_a` (the rows' scales are picked into the same lanes by two
//!   word permutes and a blend);
//! * the tile's accumulator is 256 bits: its lower 128-bit lane holds the four rows' even-
//!   block sums and its upper lane the odd ones, so one FMA with the lower half of a step's
//!   products (blocks 0 and 1) and one with its upper half (blocks 2 and 3) continue each
//!   row's even and odd chains block by block, exactly as the plain kernels do.
//!
//! One register per row with a four-level reduction across the tile (the first version)
//! does the same work in more instructions. In L2 (`benches/thin_cpu.rs`, 4096 × 256, one
//! thread, five alternated runs) the two were as fast for one column (10.6–11.4 µs against
//! 10.7–11.4) and the pairs 3 % faster for four (28.9–29.3 against 29.9–30.4). What made
//! both faster (from 11.3–12.0 and 35.3–38.1) was building each step's column views in a
//! loop: in `array::from_fn` the compiler had left the closure out of line, a call and a
//! 256-byte copy per column and step.
//!
//! Every f32 operation is the plain kernels' (`d_w · d_a` rounded, one FMA per block into
//! the even or odd accumulator, even + odd at the end) on the same exact integer sums.
//!
//! On a Sapphire Rapids core, where 512-bit shuffles issue on one port only and the
//! two-source byte and word permutes take two cycles there, that port bounds the kernel:
//! the high-nibble transform in place of a shift and a mask, the chained `dpbusd` (two adds
//! fewer a tile) and, for one column, the column's registers built once per product
//! ([`expand_col`]) instead of at every step of every call took one thread from 23.4–24.6
//! to 25.9–26.2 GB/s of weights in L2 (`THIN_N=1 cargo bench -p cpu-kernels --bench
//! thin_cpu`, six alternated runs; more in `docs/benchmarks.md`).
//!
//! The four tiles advance side by side, step by step, with their accumulators in registers.
//! Where the executor's rows follow each other, a call also asks for the next call's
//! sixteen rows (one stream of addresses, in step with its own progress, as `qmv512` does),
//! so that from DRAM the memory sees one sequential stream; otherwise each row is
//! prefetched a fixed distance ahead of its own stream (`x86::PREFETCH`). On Intel cores
//! products against one column go as blocks of four interleaved calls instead
//! ([`interleaves`]): each call's rows four apart, each row's stream running on into the
//! next row, which the next call reads.

use crate::quant::{Q4_0_BYTES, QK};

/// Rows of a call.
pub(crate) const ROWS: usize = 16;

/// Blocks of a row per step of a call.
const STEP: usize = 4;

/// Whether [`dot_rows16`] can run here: AVX-512 with VNNI and VBMI, and GFNI (asked once).
pub(crate) fn available() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            crate::quant::has_avx512()
                && std::arch::is_x86_feature_detected!("avx512vbmi")
                && crate::qmv512::has_gfni()
        })
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    false
}

/// `out[c][r]` = plain q4_0 row `r` (`nb` blocks at `rows[r * stride ..]`) dotted with
/// column `cols[c]` packed by `quant::quantize_q8_col` (`nb` blocks): the same bits as
/// `quant::dot_q4_0_q8_0_rows` on the same rows. `next` (for rows that follow each other,
/// `stride` their length): the next call's sixteen rows start at `rows + next` and are
/// prefetched as this call goes; 0: none (each row is prefetched ahead of itself instead).
/// Only where [`available`].
pub(crate) fn dot_rows16<const NC: usize>(
    rows: &[u8],
    stride: usize,
    cols: [&[u8]; NC],
    next: usize,
) -> [[f32; ROWS]; NC] {
    let nb = cols.first().map_or(0, |c| c.len() / (QK + 8));
    assert!(
        available() && cols.iter().all(|c| c.len() == nb * (QK + 8)) && rows_fit(rows, stride, nb),
        "q4tiles::dot_rows16: short rows or column, or no AVX-512 VBMI or GFNI (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let cols = cols.map(|c| crate::repack::x86::col_parts(c, nb));
        let prefetch = Prefetch::next_call(next);
        // SAFETY: the CPU has the features (`available`); row `r` holds `nb` blocks from
        // `r * stride` inside `rows` and every column `nb` packed blocks (asserted above).
        unsafe { x86::dot_rows16(rows.as_ptr(), stride, cols, nb, prefetch) }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = next;
        unreachable!("`available` is false without x86-64")
    }
}

/// Whether a call's sixteen rows of `nb` blocks, `stride` bytes apart, lie inside `rows`.
fn rows_fit(rows: &[u8], stride: usize, nb: usize) -> bool {
    (ROWS - 1)
        .checked_mul(stride)
        .and_then(|o| o.checked_add(nb.checked_mul(Q4_0_BYTES)?))
        .is_some_and(|end| end <= rows.len())
}

/// How a call prefetches the rows it reads.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Prefetch {
    /// The next call's sixteen rows, this many bytes on, as one stream of addresses in step
    /// with the call's own progress.
    NextCall(usize),
    /// Each row `x86::PREFETCH` bytes ahead of itself, and past its end on into the row this
    /// many bytes on (0: each row's start is asked for when the call begins, and nothing
    /// past its end).
    EachRow(usize),
}

impl Prefetch {
    /// [`Prefetch::NextCall`] for the next call's rows `next` bytes on, or where there are
    /// none (`next` = 0) [`Prefetch::EachRow`] with nothing past the rows' ends.
    pub(crate) fn next_call(next: usize) -> Prefetch {
        match next {
            0 => Prefetch::EachRow(0),
            n => Prefetch::NextCall(n),
        }
    }

    /// For a call over consecutive rows whose next call's rows lie `next` bytes on (0:
    /// none): on the cores where calls interleave ([`interleaves`]) each row runs on into
    /// the next call's same row ([`Prefetch::EachRow`]), elsewhere
    /// [`Prefetch::next_call`]. On a Sapphire Rapids host, rows whose interleaved calls
    /// would not spread over the L1 sets ([`interleaved_rows_spread`]) go this way: plain
    /// q4_0 16384 × 8192 from memory (`benches/matvec.rs`, two threads, three alternations)
    /// read at 0.95–0.97 of the read's rate against 0.81–0.87 interleaved.
    pub(crate) fn consecutive(next: usize) -> Prefetch {
        match next {
            n if n != 0 && interleaves() => Prefetch::EachRow(n),
            n => Prefetch::next_call(n),
        }
    }
}

/// Whether one-column products over plain rows that follow each other go as
/// [`INTERLEAVED_ROWS`]-row blocks of four interleaved calls (call `t` takes rows `t, t +
/// 4, .., t + 60`, each row prefetched on into the next row: [`Prefetch::EachRow`]), so that
/// each of a call's sixteen streams runs on through four consecutive rows, rather than as
/// calls of sixteen consecutive rows, each asking for the next call's rows
/// ([`Prefetch::NextCall`]): on Intel cores.
///
/// Why: on the AMD host the kernels were tuned on, one stream for the next call's rows was
/// the faster from DRAM (`exec/mul_mat/dot.rs`, `Q4_UNIT_ROWS`). On a Sapphire Rapids host
/// (48 KiB of L1 data a core), from memory on two threads (`benches/matvec.rs`, three
/// alternated sets), the fraction of the read's rate (fastest) was:
///
/// | weights | next call's rows | each row, on into the next call's | interleaved |
/// |---|---|---|---|
/// | 8192 × 16384 | 0.76–0.81 | 0.90–0.91 | 0.90–0.93 |
/// | 16384 × 8192 | 0.79–0.82 | 0.90–0.92 | 0.88–0.92 |
/// | 32768 × 4096 | 0.79–0.81 | 0.77–0.82 | **0.91–0.94** |
///
/// (The bench's rows were mislabeled then: its “16384 × 8192” computed the 8192 × 16384
/// weights again, and its “32768 × 4096” is 32768 rows of 4096 elements, now named
/// `q4_0_4096x32768_x1`.)
///
/// (each row stopping at its end: 0.83–0.88, 0.83–0.89 and 0.78–0.79 in other sets); in a
/// later set, on a faster phase of the host's memory, the code before (each row on into the
/// next call's for the two longer rows, the next call's rows for the shortest) against
/// interleaved: 0.92–0.95 against 0.97, 0.96–0.97 against 0.96–0.99, 0.79–0.86 against
/// 0.93–0.98; and 4096 × 4096 from L3 (`benches/kernels.rs`) took 165–169 µs against
/// 191–195. A call whose rows run a whole call ahead of it only keeps them in L1 while two
/// calls fit; a stream that jumps every row to a row sixteen on restarts cold in memory.
pub(crate) fn interleaves() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        crate::qmv512::intel()
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    false
}

/// Rows of a block of four interleaved calls ([`interleaves`]).
pub(crate) const INTERLEAVED_ROWS: usize = 4 * ROWS;

/// Whether the sixteen rows of an interleaved call, four rows of `row_bytes` apart, spread
/// over the L1 cache's sets: no more than half of them start in any one quarter of a 4 KiB
/// page (whose offset picks a line's set). Where the four-row stride is a multiple of 4 KiB
/// every row's lines fall into the same sets, more than their twelve ways hold, and the
/// interleaved order lost to calls over consecutive rows: plain q4_1 16384 × 8192 from
/// memory (`benches/matvec.rs`, two threads, two alternations) 0.81–0.83 of the read against
/// 0.95–0.96, and 8192 × 16384 0.83–0.85 against 0.94–0.97 (three), while rows whose stride
/// spreads gained: 4096 × 32768 0.96–0.98 against 0.86–0.92, 14336 × 8192 0.97 against
/// 0.93–0.97.
pub(crate) fn interleaved_rows_spread(row_bytes: usize) -> bool {
    let mut starts = [0usize; 4];
    for r in 0..ROWS {
        let offset = r.wrapping_mul(4).wrapping_mul(row_bytes) % 4096;
        starts[offset / 1024] += 1;
    }
    starts.iter().all(|&n| n <= ROWS / 2)
}

/// Bytes of one step ([`STEP`] blocks) of a column expanded by [`expand_col`]: four registers
/// of column quants, the corrections and the scales, 64 bytes each.
const EXPANDED_STEP_BYTES: usize = 6 * 64;

/// Bytes of a column of `nb` blocks expanded by [`expand_col`].
pub(crate) fn expanded_col_bytes(nb: usize) -> usize {
    nb.div_ceil(STEP) * EXPANDED_STEP_BYTES
}

/// Writes the column `col` (packed by `quant::quantize_q8_col`, `nb` blocks) as
/// [`dot_rows16_expanded`] reads it: every step's registers as [`dot_rows16`] builds them
/// from the packed bytes (column quants permuted to meet the rows' nibbles, each block's
/// correction and scale spread over its 128-bit lane), stored.
///
/// Why: [`dot_rows16`] builds them at every step of every call, six shuffles on the port
/// that the rows' own permutes keep busy. A decode step's column is read by every call of
/// the product, so building it once saves those shuffles in all but one (see
/// `docs/benchmarks.md`). At 384 bytes a step (against 160 packed) an expanded column of
/// 16384 elements is 48 KiB: worth it for one column, not for a prompt's hundreds.
pub(crate) fn expand_col(col: &[u8], out: &mut [u8]) {
    let nb = col.len() / (QK + 8);
    assert!(
        available() && col.len() == nb * (QK + 8) && out.len() == expanded_col_bytes(nb),
        "q4tiles::expand_col: wrong sizes, or no AVX-512 VBMI or GFNI (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the CPU has the features; `col` holds `nb` packed blocks and `out` the
    // expanded size (asserted above).
    unsafe {
        x86::expand_col(col, nb, out.as_mut_ptr());
    }
}

/// [`dot_rows16`] against columns expanded by [`expand_col`] (of `nb` blocks), the rows
/// prefetched as `prefetch` says: the same bits.
pub(crate) fn dot_rows16_expanded<const NC: usize>(
    rows: &[u8],
    stride: usize,
    cols: [&[u8]; NC],
    nb: usize,
    prefetch: Prefetch,
) -> [[f32; ROWS]; NC] {
    assert!(
        available()
            && cols.iter().all(|c| c.len() == expanded_col_bytes(nb))
            && rows_fit(rows, stride, nb),
        "q4tiles::dot_rows16_expanded: short rows or column, or no AVX-512 VBMI or GFNI (a \
         kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let cols = cols.map(|c| x86::Expanded(c.as_ptr()));
        // SAFETY: the CPU has the features (`available`); row `r` holds `nb` blocks from
        // `r * stride` inside `rows` and every column all steps of `nb` blocks (asserted
        // above).
        unsafe { x86::dot_rows16(rows.as_ptr(), stride, cols, nb, prefetch) }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = prefetch;
        unreachable!("`available` is false without x86-64")
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{QK, ROWS, STEP};
    use crate::qmv512::{high_nibbles, prefetch_region};
    use crate::quant::Q4_0_BYTES;
    use crate::repack::x86::{Col, col_parts};

    /// Rows of a tile (see the module docs).
    const TILE: usize = 4;

    /// Where a call has no `next` rows: how far ahead of the step being computed each row is
    /// prefetched, in bytes (and how much of each row is prefetched before the loop). Measured from DRAM, 8192 × 16384
    /// weights, one thread (`benches/matvec.rs`, `BENCH_THREADS=1`, alternated runs on a
    /// loaded machine) with an earlier kernel of one block per step and sixteen-row units:
    /// 3.6–3.8 ms with no prefetch before the loop and 512 bytes in it; 3.0–3.5 ms with 512
    /// before and in it; with 256, 320, 384, 448 and 1024: 2.8–3.3, 2.7–3.2, 2.6–2.7,
    /// 2.7–2.7 and 4.7–5.4 ms (the read of the same bytes 1.6–1.9 ms); prefetching into L2
    /// instead was no better at 384 bytes and worse farther. With this kernel and the strided
    /// units, 768 and 1536 bytes were no different from 384. Each line of a row is asked for
    /// once (a step reads 72 bytes, so two prefetches a step asked for most lines twice):
    /// from DRAM (8192 × 16384, alternated on a loaded machine) time ÷ read 1.29–1.47 against
    /// 1.31–1.53 on two threads, 1.24–1.31 against 1.27–1.44 on one.
    const PREFETCH: usize = 384;

    /// The permutes' index vectors, made once per call.
    ///
    /// Two rows share a register: of a row pair, register `A` holds quant bytes `0..8` of
    /// every block and register `B` bytes `8..16`, so that the four `dpbusd` of a pair leave
    /// in 128-bit lane `j` the dwords `[row 0 half 0, row 1 half 0, row 0 half 1, row 1
    /// half 1]` of block `j`, and two 64-bit unpacks and one add finish a tile's sums.
    pub(super) struct Indices {
        /// Byte `16j + 4d + t` of a pair's `A`: quant byte `4(d / 2) + t` of block `j` of
        /// row `d % 2`, which is byte `18j + 2 + q` of that row's first 64 step bytes (the
        /// second row's from index 64).
        quants_a: __m512i,
        /// The same for `B` (quant bytes `8 + 4(d / 2) + t`), from the step bytes `8..72`.
        quants_b: __m512i,
        /// The column's partners of `A`'s low nibbles, `A`'s high nibbles, `B`'s low and
        /// `B`'s high nibbles: byte `16j + 4d + t` is column quant `32j + o + 4(d / 2) + t`
        /// of the step's 128 bytes, `o` = 0, 16, 8, 24.
        col: [__m512i; 4],
        /// Word `4j + r` (`j < 4`): word `9j` (block `j`'s scale) of the first of two rows'
        /// registers for even `r`, of the second (index `32 + 9j`) for odd `r`.
        scales: __m512i,
        /// 32-bit lane `4j + r` takes lane `j` (a block's value to its 128-bit lane).
        spread: __m512i,
    }

    impl Indices {
        #[target_feature(
            enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni"
        )]
        fn new() -> Indices {
            // (block, row of the pair, quarter of the half, byte) of output byte `o`.
            let parts = |o: usize| (o / 16, o / 4 % 2, o / 8 % 2, o % 4);
            let pair = |half: usize, from: usize| -> [u8; 64] {
                std::array::from_fn(|o| {
                    let (j, row, c, t) = parts(o);
                    (64 * row + 18 * j + 2 + 8 * half + 4 * c + t - from) as u8
                })
            };
            let col = |at: usize| -> [u8; 64] {
                std::array::from_fn(|o| {
                    let (j, _, c, t) = parts(o);
                    (32 * j + at + 4 * c + t) as u8
                })
            };
            let scales: [u16; 32] = std::array::from_fn(|w| {
                let (j, r) = (w / 4 % 4, w % 4);
                (9 * j + if r % 2 == 1 { 32 } else { 0 }) as u16
            });
            let load = |v: &[u8]| {
                // SAFETY: every caller passes 64 bytes.
                unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
            };
            // SAFETY: 64 bytes.
            let scales = unsafe { _mm512_loadu_si512(scales.as_ptr().cast()) };
            Indices {
                quants_a: load(&pair(0, 0)),
                quants_b: load(&pair(1, 8)),
                col: [0, 16, 8, 24].map(|at| load(&col(at))),
                scales,
                spread: _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            }
        }
    }

    /// A step's view of one packed column: the partners of the row pairs' `A` low and high
    /// nibbles and `B` low and high nibbles, and each block's correction and scale in its
    /// 128-bit lane.
    #[derive(Clone, Copy)]
    pub(super) struct ColStep {
        q: [__m512i; 4],
        corr: __m512i,
        dy: __m512,
    }

    /// Column `c` at blocks `b .. b + v` (`v` = 1..=4; lanes of missing blocks are zero).
    ///
    /// # Safety
    /// The features of [`super::available`]; blocks `b .. b + v` of the column exist.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
    unsafe fn col_step(ix: &Indices, c: &Col, b: usize, v: usize) -> ColStep {
        // SAFETY: the loads touch only blocks b .. b + v (caller's contract): whole when
        // v = 4, masked to them otherwise.
        let (l0, l1, corr, dy) = unsafe {
            let q = c.qs.add(QK * b);
            if v == STEP {
                (
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                    _mm512_castsi128_si512(_mm_loadu_si128(c.cs.add(b).cast())),
                    _mm512_castps128_ps512(_mm_loadu_ps(c.ds.add(b))),
                )
            } else {
                let bytes = |from: usize| match (32 * v).saturating_sub(from) {
                    0 => 0,
                    n => u64::MAX >> (64 - n.min(64)),
                };
                let nv = (1u16 << v) - 1;
                (
                    _mm512_maskz_loadu_epi8(bytes(0), q.cast()),
                    _mm512_maskz_loadu_epi8(bytes(64), q.wrapping_add(64).cast()),
                    _mm512_maskz_loadu_epi32(nv, c.cs.add(b).cast()),
                    _mm512_maskz_loadu_ps(nv, c.ds.add(b)),
                )
            }
        };
        ColStep {
            q: ix.col.map(|i| _mm512_permutex2var_epi8(l0, i, l1)),
            corr: _mm512_permutexvar_epi32(ix.spread, corr),
            dy: _mm512_permutexvar_ps(ix.spread, dy),
        }
    }

    /// One step of a tile: blocks `b .. b + v` (`v` = 1..=4) of the four rows at `p`,
    /// `p + stride`, .. (`p` at block `b`) into the tile's accumulators, one per column.
    ///
    /// # Safety
    /// The features of [`super::available`]; blocks `b .. b + v` of the four rows and of every
    /// column exist.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
    unsafe fn step<const NC: usize>(
        ix: &Indices,
        p: *const u8,
        stride: usize,
        cols: &[ColStep; NC],
        v: usize,
        acc: &mut [__m256; NC],
    ) {
        // SAFETY: the caller's contract; the row loads are masked to the step's 18·v bytes
        // unless v = 4 (then all 72 exist). Each row: its step bytes 0..64 and 8..72.
        let raw: [[__m512i; 2]; TILE] = std::array::from_fn(|r| unsafe {
            let q = p.add(r * stride);
            if v == STEP {
                [
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(8).cast()),
                ]
            } else {
                [
                    _mm512_maskz_loadu_epi8(u64::MAX >> (64 - 18 * v), q.cast()),
                    _mm512_maskz_loadu_epi8(u64::MAX >> (64 - (18 * v - 8)), q.add(8).cast()),
                ]
            }
        });
        // Lane 4j + r: the scale of block j of row r, picked from rows 0 and 1 and from
        // rows 2 and 3, merged.
        let pair = |r: usize| _mm512_permutex2var_epi16(raw[r][0], ix.scales, raw[r + 1][0]);
        let scales = _mm512_mask_blend_epi16(0xcccc_cccc, pair(0), pair(2));
        let dx = _mm512_cvtph_ps(_mm512_castsi512_si256(scales));
        let m4 = _mm512_set1_epi8(0x0f);
        // Per row pair: A's low and high nibbles, B's low and high nibbles.
        let x: [[__m512i; 4]; TILE / 2] = std::array::from_fn(|h| {
            let (r0, r1) = (raw[2 * h], raw[2 * h + 1]);
            let a = _mm512_permutex2var_epi8(r0[0], ix.quants_a, r1[0]);
            let b = _mm512_permutex2var_epi8(r0[1], ix.quants_b, r1[1]);
            let lo = |w: __m512i| _mm512_and_si512(w, m4);
            let hi = |w: __m512i| high_nibbles(w);
            [lo(a), hi(a), lo(b), hi(b)]
        });
        // Blocks past the last (v < 4) are left out of the FMAs.
        let lanes = u16::MAX >> (16 - 4 * v);
        let (fma_lo, fma_hi) = (lanes as __mmask8, (lanes >> 8) as __mmask8);
        for (acc, col) in acc.iter_mut().zip(cols) {
            let s: [__m512i; TILE / 2] = std::array::from_fn(|h| {
                let [a_lo, a_hi, b_lo, b_hi] = x[h];
                let mut s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a_lo, col.q[0]);
                s = _mm512_dpbusd_epi32(s, a_hi, col.q[1]);
                s = _mm512_dpbusd_epi32(s, b_lo, col.q[2]);
                _mm512_dpbusd_epi32(s, b_hi, col.q[3])
            });
            // Lane 4j + r: the sum of block j of row r (exact).
            let sums = _mm512_add_epi32(
                _mm512_unpacklo_epi64(s[0], s[1]),
                _mm512_unpackhi_epi64(s[0], s[1]),
            );
            let sf = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, col.corr));
            let d = _mm512_mul_ps(dx, col.dy);
            let high = |v: __m512| {
                _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(v)))
            };
            // Blocks 0 and 1 (even, odd), then 2 and 3.
            *acc = _mm256_mask3_fmadd_ps(
                _mm512_castps512_ps256(d),
                _mm512_castps512_ps256(sf),
                *acc,
                fma_lo,
            );
            *acc = _mm256_mask3_fmadd_ps(high(d), high(sf), *acc, fma_hi);
        }
    }

    /// Where a call's columns come from, a step at a time: a packed column (its registers
    /// permuted from the packed bytes at every step) or an expanded one (the same registers
    /// stored by [`expand_col`], read back).
    pub(super) trait ColSource: Copy {
        /// The column's [`ColStep`] at blocks `b .. b + v`.
        ///
        /// # Safety
        /// The features of [`super::available`]; blocks `b .. b + v` of the column exist.
        unsafe fn step(&self, ix: &Indices, b: usize, v: usize) -> ColStep;
    }

    impl ColSource for Col {
        #[inline(always)]
        unsafe fn step(&self, ix: &Indices, b: usize, v: usize) -> ColStep {
            // SAFETY: the caller's contract is `col_step`'s.
            unsafe { col_step(ix, self, b, v) }
        }
    }

    /// A column expanded by [`expand_col`]: [`super::EXPANDED_STEP_BYTES`] a step.
    #[derive(Clone, Copy)]
    pub(super) struct Expanded(pub(super) *const u8);

    impl ColSource for Expanded {
        #[inline(always)]
        unsafe fn step(&self, _: &Indices, b: usize, _: usize) -> ColStep {
            // SAFETY: step `b / STEP` exists (the caller's contract): six registers.
            unsafe {
                let at = self.0.add(b / STEP * super::EXPANDED_STEP_BYTES);
                let reg = |i: usize| _mm512_loadu_si512(at.add(64 * i).cast());
                ColStep {
                    q: [reg(0), reg(1), reg(2), reg(3)],
                    corr: reg(4),
                    dy: _mm512_castsi512_ps(reg(5)),
                }
            }
        }
    }

    /// [`super::expand_col`]: every step of `col` (`nb` blocks) as [`col_step`] makes it,
    /// stored at `out` (six registers a step).
    ///
    /// # Safety
    /// The features of [`super::available`]; `col` is a packed column of `nb` blocks and `out`
    /// has room for [`super::expanded_col_bytes`]`(nb)` bytes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
    pub(super) unsafe fn expand_col(col: &[u8], nb: usize, out: *mut u8) {
        let (ix, c) = (Indices::new(), col_parts(col, nb));
        for (i, b) in (0..nb).step_by(STEP).enumerate() {
            // SAFETY: blocks b .. min(b + STEP, nb) of the column exist; step i's six
            // registers lie inside `out` (the caller's contract).
            unsafe {
                let s = col_step(&ix, &c, b, (nb - b).min(STEP));
                let at = out.add(i * super::EXPANDED_STEP_BYTES);
                let regs = [
                    s.q[0],
                    s.q[1],
                    s.q[2],
                    s.q[3],
                    s.corr,
                    _mm512_castps_si512(s.dy),
                ];
                for (j, r) in regs.into_iter().enumerate() {
                    _mm512_storeu_si512(at.add(64 * j).cast(), r);
                }
            }
        }
    }

    /// [`super::dot_rows16`] and [`super::dot_rows16_expanded`].
    ///
    /// # Safety
    /// The CPU must have the features of [`super::available`]; row `r` must hold `nb` q4_0
    /// blocks readable from `rows + r * stride`, and every column `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
    pub(super) unsafe fn dot_rows16<S: ColSource, const NC: usize>(
        rows: *const u8,
        stride: usize,
        c: [S; NC],
        nb: usize,
        prefetch: super::Prefetch,
    ) -> [[f32; ROWS]; NC] {
        let ix = Indices::new();
        let len = nb * Q4_0_BYTES;
        // `NextCall(next)`: the next call's rows as one stream; `EachRow(on)`: each row
        // ahead of itself, past its end on into the row `on` bytes further (0: none).
        let (next, each_row, on) = match prefetch {
            super::Prefetch::NextCall(next) => (next, false, 0),
            super::Prefetch::EachRow(on) => (0, true, on),
        };
        // Each row's start is asked for here unless the call before asked for it (as one
        // stream of this call's rows, or running on from its own rows).
        if each_row && on == 0 {
            for r in 0..ROWS {
                for line in (0..PREFETCH.min(len)).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(rows.wrapping_add(r * stride + line).cast());
                }
            }
        }
        let full = nb / STEP * STEP;
        let tile = |t: usize| rows.wrapping_add(TILE * t * stride);
        // Offset in every row of the next line to prefetch (without `next`): each line once,
        // `PREFETCH` bytes ahead of the step that reads it.
        let mut pf_at = PREFETCH;
        // Bytes of the next call's rows asked for so far (with `next`).
        let mut next_at = 0;
        let mut acc = [[_mm256_setzero_ps(); NC]; ROWS / TILE];
        let zero_step = ColStep {
            q: [_mm512_setzero_si512(); 4],
            corr: _mm512_setzero_si512(),
            dy: _mm512_setzero_ps(),
        };
        // Step by step, the four tiles side by side (sixteen streams).
        macro_rules! tiles {
            ($b:expr, $v:expr) => {{
                let (b, v): (usize, usize) = ($b, $v);
                // SAFETY: blocks b .. b + v of the rows and the columns exist (the caller's
                // contract, b + v <= nb).
                unsafe {
                    // A loop, not `array::from_fn`: its closure was left out of line, one call
                    // and one copy of the result per column and step.
                    let mut cs = [zero_step; NC];
                    for (s, c) in cs.iter_mut().zip(&c) {
                        *s = c.step(&ix, b, v);
                    }
                    if !each_row {
                        prefetch_region(rows, next, ROWS, &mut next_at, (b + v) * Q4_0_BYTES);
                    }
                    while each_row && pf_at < (b + v) * Q4_0_BYTES + PREFETCH {
                        // Past the rows' end, on into the next call's (where there are;
                        // a prefetch never faults, wherever it points).
                        let (first, at) = match pf_at.checked_sub(len) {
                            Some(at) if on != 0 => (rows.wrapping_add(on), at),
                            _ => (rows, pf_at),
                        };
                        for r in 0..ROWS {
                            _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(r * stride + at).cast());
                        }
                        pf_at += 64;
                    }
                    for (t, acc) in acc.iter_mut().enumerate() {
                        step(&ix, tile(t).add(b * Q4_0_BYTES), stride, &cs, v, acc);
                    }
                }
            }};
        }
        for b in (0..full).step_by(STEP) {
            tiles!(b, STEP);
        }
        if full < nb {
            tiles!(full, nb - full);
        }
        let mut out = [[0.0f32; ROWS]; NC];
        for (t, acc) in acc.iter().enumerate() {
            for (o, a) in out.iter_mut().zip(acc) {
                let sum = _mm_add_ps(_mm256_castps256_ps128(*a), _mm256_extractf128_ps::<1>(*a));
                // SAFETY: `o` holds sixteen floats, four from 4t.
                unsafe { _mm_storeu_ps(o.as_mut_ptr().add(TILE * t), sum) };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, Isa};
    use crate::repack::tests::{column, plain_rows};

    /// Sixteen rows `stride` bytes apart (the gaps filled with junk), from `rows` of
    /// `row_len` bytes each.
    fn spaced(rows: &[u8], row_len: usize, stride: usize) -> Vec<u8> {
        let mut v = vec![0xa5u8; 15 * stride + row_len];
        for (r, row) in rows.chunks_exact(row_len).enumerate() {
            v[r * stride..r * stride + row_len].copy_from_slice(row);
        }
        v
    }

    #[test]
    fn interleaved_calls_spread_unless_the_stride_aliases() {
        // Rows of q4_0 (18 bytes a block) and q4_1 (20) of k elements: the four-row stride.
        let row = |block: usize, k: usize| k / 32 * block;
        assert!(interleaved_rows_spread(row(20, 4096)));
        assert!(interleaved_rows_spread(row(20, 14336)));
        assert!(interleaved_rows_spread(row(18, 8192)));
        assert!(interleaved_rows_spread(row(18, 2048)));
        // Four rows 20 KiB or 36 KiB apart: every row in the same sets.
        assert!(!interleaved_rows_spread(row(20, 8192)));
        assert!(!interleaved_rows_spread(row(18, 16384)));
        // Half the rows starting in one quarter of the page still spread; all of them do not.
        assert!(interleaved_rows_spread(512));
        assert!(!interleaved_rows_spread(1024));
    }

    #[test]
    fn sixteen_plain_rows_have_the_bits_of_the_eight_row_kernel() {
        if !crate::isa::test_gate("avx512-vbmi-gfni") {
            // No AVX-512 VNNI and VBMI or no GFNI: the dispatch never calls this kernel.
            return;
        }
        for nb in [1, 2, 7, 33] {
            let k = nb * QK;
            let row_len = nb * Q4_0_BYTES;
            let rows = plain_rows(nb as u64, k, ROWS);
            let cols: Vec<Vec<u8>> = (0..4).map(|c| column(40 + c, k)).collect();
            let col = |c: usize| &cols[c][..];
            // What the eight-row kernel gives, portable code: `want[c][r]`.
            let want: Vec<[f32; ROWS]> = (0..4)
                .map(|c| {
                    let mut w = [0.0f32; ROWS];
                    for h in 0..2 {
                        let rr: [&[u8]; quant::ROWS] = std::array::from_fn(|j| {
                            let r = 8 * h + j;
                            &rows[r * row_len..(r + 1) * row_len]
                        });
                        let [d] = quant::dot_q4_0_q8_0_rows(Isa::Scalar, rr, [col(c)]);
                        w[8 * h..8 * h + 8].copy_from_slice(&d);
                    }
                    w
                })
                .collect();
            for gap in [0, 6, 64] {
                let stride = row_len + gap;
                let v = spaced(&rows, row_len, stride);
                let bits = |d: &[f32; ROWS]| d.map(f32::to_bits);
                let [one] = dot_rows16(&v, stride, [col(2)], 0);
                assert_eq!(bits(&one), bits(&want[2]), "nb {nb} gap {gap}, one column");
                // The same column expanded, prefetched each way the executor asks for.
                let mut e = vec![0u8; expanded_col_bytes(nb)];
                expand_col(col(2), &mut e);
                let ways = [
                    Prefetch::EachRow(0),
                    Prefetch::EachRow(stride),
                    Prefetch::NextCall(16 * stride),
                ];
                for prefetch in ways {
                    let [d] = dot_rows16_expanded(&v, stride, [&e[..]], nb, prefetch);
                    assert_eq!(bits(&d), bits(&want[2]), "nb {nb} gap {gap}, {prefetch:?}");
                }
                let four = dot_rows16(&v, stride, [col(0), col(1), col(2), col(3)], 16 * stride);
                for (c, d) in four.iter().enumerate() {
                    assert_eq!(
                        bits(d),
                        bits(&want[c]),
                        "nb {nb} gap {gap}, column {c} of 4"
                    );
                }
            }
        }
    }
}
