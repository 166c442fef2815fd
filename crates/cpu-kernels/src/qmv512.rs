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
//!
//! On Intel cores the plain `q4_1` quads and the `q8_0` rows prefetch each row
//! [`ROW_AHEAD`] bytes ahead of itself and, past its end, on into the next call's same row
//! ([`prefetch_rows_on`]), where the other kernels ask for the next call's rows as one
//! stream ([`prefetch_region`]). With weights larger than L3 a call's rows (sixteen
//! `q4_1` rows of 8192 elements: 80 KiB) outgrow L1, so the one stream's early lines were
//! evicted again before their call came, and each row restarted cold. On a Sapphire Rapids
//! host, from memory (`benches/matvec.rs`, alternated): `q4_1` 8192 × 16384 0.82–0.87 of the
//! read against 0.73–0.79 in a slow hour and 0.87–1.00 against 0.74–0.94 in faster ones on
//! two threads, 0.90–0.97 against 0.48–0.72 on one; `q8_0` 8192 × 8192 0.94–0.95 against
//! 0.90–0.91 on two threads, 1.02–1.03 against 0.86–0.89 on one. With the weights in L3 (4096 × 4096)
//! `q4_1` is unchanged (186–190 µs) and `q8_0` faster (292–297 µs against 314–321); with
//! them in L2 the loop costs the `q4_1` quads 4–8 % (`benches/thin_cpu.rs`). Prefetching into
//! L2 only (`T1`) read at 0.86 against 1.00; bursts of five lines a row every sixteen blocks
//! at 0.73–0.75 against 0.92–0.96; sixteen blocks unrolled, each asking for five lines at
//! fixed rows (no loop, no branch), 0.91–0.96 against 0.87–0.98 (six alternations) and no
//! different in L2: not worth sixteen copies of the block. The quads' sixteen row
//! addresses from the first row and the stride (rows evenly spaced, so no pointers reloaded
//! from the stack): 26.3–28.8 GB/s in L2 against 25.9–28.4 for the quants alone, 25.7–28.0
//! with the prefetches too (three alternations): within the spread.
//!
//! On Intel cores decode steps of `q4_1` go sixteen rows at a time to
//! [`q4_1_rows16_quads`] (four rows to a register, no transposes; see
//! [`prefers_quads`]). Elsewhere they go sixteen rows at a time to [`q4_1_rows16`] instead
//! (`qdot::dot_rows16`): the plain blocks are transposed in registers into the repacked
//! kernel's register contents (`repack::q4_1`) and computed as it does; with the weights in
//! L3 that is a little faster than two eight-row calls (4096 × 4096: 137–143 µs against
//! 151–153; SmolLM2's decode-step q4_1 products 2.0–2.9 ms against 2.1–3.3, alternated
//! `benches/kernels.rs` runs on a loaded machine). Decode steps of `q8_0` are two
//! [`q8_0_rows8`] calls: a sixteen-row `q8_0` kernel built the same way kept more data in
//! flight, but spent more on its transpose and its sixteen row pointers (which do not fit
//! the general registers) than it saved. Sixteen rows of 128 blocks in L1/L2 took 9.4–9.7 ns
//! a block index with it against 7.5–8.1 with two eight-row calls; once the eight-row kernel
//! prefetched as [`prefetch_region`] does, the SmolLM2 output head (q8_0 576 × 49152,
//! `benches/kernels.rs`) took 0.52 ms against 0.79–0.91 in one build, 362–380 µs against
//! 424–442 in the final one (three alternated runs), and 8192 × 8192 from DRAM
//! (`benches/matvec.rs`, two threads, alternated sets on a loaded machine) 0.97–1.29 times
//! the read's time against 1.22–1.39, then 1.17–1.28 against 1.20–1.46.
//!
//! Tried and not kept (L1/L2 figures: ns a block index of sixteen rows of 128 blocks, one
//! alternated run, next to the kernel they would have replaced):
//! * q8_0, sixteen rows two to a register with the weights offset by 128 (no sign trick):
//!   9.8 against 9.5, the row pointers spilled as before; the same without its scales 7.0,
//!   so the sixteen scalar scale loads cost a quarter; its scales by `vpinsrw` 9.2, by
//!   `vpgatherdd` 10.5; two blocks a step with the scales by word permutes and blends from
//!   64-byte reads 8.5; row addresses from one pointer and odd multiples of the stride (the
//!   compiler kept sixteen pointers on the stack anyway) 9.8.
//! * q8_0, eight rows with the weights offset by 128 instead of the sign trick: 8.0–9.1
//!   against 7.7–8.1 (kept on Intel cores, where it is the faster: [`q8_0_rows8`]).
//! * q4_1, four blocks a step transposed as 128-bit lanes first (one 64-byte and one
//!   16-byte read per row and step, half the reads): 6.0–7.0 against 6.8–7.4 in L1/L2, but
//!   no faster from L2 in `benches/thin_cpu.rs`, 135–158 µs against 130–134 for 4096 × 4096
//!   in L3 and 1.40–1.56 times the read against 1.29–1.61 from DRAM; the column's eight
//!   dword broadcasts as in-lane shuffles of two 16-byte broadcasts: 1–7 % in L1 only.
//! * Prefetch hints for [`prefetch_region`]: T1 was slower from DRAM, T2 and NTA no
//!   different from T0 in a second alternated set; one more prefetch per row 256–1024 bytes
//!   ahead: no faster.
//!
//! Tried for [`q4_1_rows16_quads`] on a Sapphire Rapids host and not kept (one thread in L2,
//! `THIN_N=1 THIN_CASES=q4_1_x1_plain cargo bench -p cpu-kernels --bench thin_cpu`, GB/s of
//! weights, three alternations against the kept kernel's 24.8–26.2 in the same sets):
//! * the headers four blocks at a time from each row's first 64 bytes of the step (two dword
//!   permutes and a blend a quad, a 128-bit transpose of the four quads) instead of one
//!   gather a block: 22.3–23.0, and 23.7–23.9 with the four blocks unrolled;
//! * the gather, or the whole header path with its four picks, one block ahead of the
//!   products: no faster (24.2–26.2), and 23.4–23.9;
//! * the quants of four blocks from two 64-byte reads a row (bytes `0..64` and `16..80`
//!   hold blocks 0–2 and 1–3 whole, on dword boundaries), a dword permute a row pair and
//!   four lane shuffles: 21.9–22.9;
//! * the quads' rows merged by masked 128-bit broadcast loads or by plain broadcasts and
//!   three blends (written in `asm!`, since LLVM turns both into the 128-bit inserts it
//!   emits for the kept code): 24.2–25.5 and 22.1–23.0;
//! * two rows a register, each row's low and high nibbles made by one GFNI transform with a
//!   matrix per 64-bit lane and the scales applied by two masked FMAs from a stack copy:
//!   18.4–19.0 (the same bits; 14.9–15.5 in intrinsics, where LLVM turned the stack reads
//!   into shuffles);
//! * the next call's rows asked for as five straight prefetches a block (sixteen rows of 20
//!   bytes are five lines) in a kernel built twice, with and without them, in place of
//!   [`prefetch_region`]'s loop: LLVM then also stops copying eight accumulators at every
//!   block, and one thread in L2 ran 30.8–31.5 against 30.0–30.8 (four alternations, a
//!   faster phase of the host), but 4096 × 4096 from L3 (`benches/kernels.rs`) took
//!   183–192 µs against 185–188 and from memory (`benches/matvec.rs`, six alternations)
//!   0.80–0.90 of the read against 0.78–0.90: no gain where decode steps run;
//! * the headers converted as gathered (`d` and `m` of eight rows interleaved in each of two
//!   registers, each pick taking even lanes) instead of split by a word permute first: one
//!   shuffle fewer, a multiply and an FMA more; 30.0–30.5 against 30.0–30.8.
//!
//! What the quads spend, from probes that give wrong sums (same sets): without the gather
//! (one broadcast header) 27.9–29.2, without the gather and the row merges 36.1–36.2,
//! without the four scale picks 27.3–27.5; the 256-bit insert of each merge costs nothing
//! measurable. Every replacement above costs more than what it removes: these two cores'
//! plain q4_1 rate stays at the quads'.

use std::arch::x86_64::*;

use crate::qdot::{Q4_1_BYTES, Q8_0_BYTES, QK, ROWS16};

/// Rows per call.
pub(crate) const ROWS: usize = 8;

/// One prefetch per 64 bytes of each row: once the current block (ending at byte `end` of
/// the rows) passes `*pf_at`, line `*pf_at + prefetch` of every row is asked for and `*pf_at`
/// moves on a line, so that every line is asked for once whatever the block size (not
/// once per block, which asks for most lines twice). `prefetch == 0`: nothing.
#[inline(always)]
fn prefetch_lines(rows: &[*const u8], pf_at: &mut usize, end: usize, prefetch: usize) {
    if prefetch != 0 && end > *pf_at {
        for p in rows {
            // SAFETY: SSE is in the x86-64 baseline; a prefetch never faults (the address
            // may lie past the row).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(*pf_at + prefetch).cast()) };
        }
        *pf_at += 64;
    }
}

/// Prefetches the `rows` rows that follow each other from `first + prefetch` (the next
/// call's; `prefetch == 0`: nothing), in step with the current call: once the current block
/// ends at byte `end` of each row, the first `rows · end` bytes of them have been asked for,
/// one line at a time, so that
/// every line is asked for once and the whole next call is in cache when it starts. One
/// stream of addresses from one pointer, where one prefetch per row and line
/// ([`prefetch_lines`]) reloads every row's pointer. With the former sixteen-row q8_0
/// kernel, 8192 × 8192 from DRAM (`benches/matvec.rs`, two threads, three alternated sets
/// on a loaded machine) took 1.13–1.32 times the read's time this way against 1.17–1.47,
/// then 1.17–1.32 against 1.31–1.36, then 1.14–1.53 against 1.08–1.25 (no better); with
/// the eight-row kernel the sets were 0.97–1.14 against 1.28–1.39, 1.00–1.21 against
/// 1.22–1.38 and 1.15–1.29 against 1.26–1.36 (the eight-row kernel with one prefetch per
/// row and block: 1.20–1.39, 1.24–1.35).
#[inline(always)]
pub(crate) fn prefetch_region(
    first: *const u8,
    prefetch: usize,
    rows: usize,
    pf_at: &mut usize,
    end: usize,
) {
    if prefetch == 0 {
        return;
    }
    let next = first.wrapping_add(prefetch);
    let want = rows * end;
    while *pf_at < want {
        // SAFETY: SSE is in the x86-64 baseline; a prefetch never faults (the address may
        // lie past the rows).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(*pf_at).cast()) };
        *pf_at += 64;
    }
}

/// How far ahead of the block being read [`prefetch_rows_on`] asks for each row's lines.
/// From memory (8192 × 16384 `q4_1`, `benches/matvec.rs`, two threads, six alternated sets)
/// 768 bytes read at 0.93–0.95 of the read's rate in five sets (0.87 in one), where 384 read
/// at 0.91–0.93, 256 at 0.90–0.92 and 1024 at 0.88–0.92; on one thread 384 did better
/// (0.98 against 0.93–0.97, two sets), but two threads are how products run.
const ROW_AHEAD: usize = 768;

/// Prefetches each of `rows` (all `len` bytes long) [`ROW_AHEAD`] bytes ahead of `end`, the
/// end of the block just reached, one line of every row at a time, each line once
/// (`*pf_at`: the next offset to ask for). Past a row's end the stream runs on into the row
/// `next` bytes further (the next call's same row, where rows follow each other), so the
/// next call starts with its rows' first lines in cache; with `next == 0` it stops at the
/// rows' ends, and [`start_rows_on`] asks for their first lines instead.
///
/// Why (plain `q4_1` decode rows on a Sapphire Rapids host): sixteen rows that each run
/// ahead of themselves keep more lines in flight than the next call's rows asked for as
/// one stream ([`prefetch_region`]), whose early lines a call larger than L1 evicts again
/// before it uses them.
#[inline(always)]
fn prefetch_rows_on(rows: &[*const u8], len: usize, next: usize, pf_at: &mut usize, end: usize) {
    while *pf_at < end + ROW_AHEAD && (next != 0 || *pf_at < len) {
        let at = match pf_at.checked_sub(len) {
            Some(past) => next + past,
            None => *pf_at,
        };
        for p in rows {
            // SAFETY: SSE is in the x86-64 baseline; a prefetch never faults (the address
            // may lie past the rows).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at).cast()) };
        }
        *pf_at += 64;
    }
}

/// Starts [`prefetch_rows_on`]'s streams for a call over `rows` (all `len` bytes long) whose
/// streams run on `next` bytes past their ends: the first [`ROW_AHEAD`] bytes of each row
/// came with the call before when `next != 0`, and are asked for here when `next == 0` (no
/// call before ran on into them). Returns the first offset left to ask for (`*pf_at`).
#[inline(always)]
fn start_rows_on(rows: &[*const u8], len: usize, next: usize) -> usize {
    if next == 0 {
        for line in (0..ROW_AHEAD.min(len)).step_by(64) {
            for p in rows {
                // SAFETY: SSE is in the x86-64 baseline; a prefetch never faults.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast()) };
            }
        }
    }
    ROW_AHEAD
}

/// Whether the CPU has what these kernels use (asked once: `qdot::dot_rows` checks it on
/// every call, one call per eight rows).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(crate::quant::has_avx512)
}

/// The word permute that takes sixteen `q4_1` block headers (dwords `d | m << 16`) to their
/// sixteen `d` in the lower 256 bits and their sixteen `m` in the upper, in order: one
/// shuffle where two `vpmovdw` (two each) and a shift did it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn header_split() -> __m512i {
    _mm512_set_epi16(
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26, 24, 22, 20, 18, 16,
        14, 12, 10, 8, 6, 4, 2, 0,
    )
}

/// Whether the CPU has GFNI (asked once), which [`high_nibbles`] needs.
pub(crate) fn has_gfni() -> bool {
    static GFNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GFNI.get_or_init(|| std::arch::is_x86_feature_detected!("gfni"))
}

/// The high nibble of every byte of `x` as a value `0..16`: one GFNI affine transform
/// where a 16-bit shift and a mask take two instructions.
///
/// `vgf2p8affineqb` computes each result bit `i` of a byte as the parity of the byte ANDed
/// with byte `7 − i` of the matrix; the matrix below lets result bit `i < 4` take source bit
/// `i + 4` and clears the upper four. On a Sapphire Rapids core the transform issues on one
/// port as the shift does, so each high-nibble split saves the mask's instruction: plain
/// q4_0 rows (`q4tiles`) computed 5–7 % more weight bytes a second in L2 with it, the q4_1
/// quads 1–8 % (see `docs/benchmarks.md`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(crate) fn high_nibbles(x: __m512i) -> __m512i {
    /// Rows of the bit matrix, result bit 0's in the top byte: bits 4, 5, 6, 7, then none.
    const SHIFT_DOWN_4: i64 = 0x1020_4080_0000_0000;
    _mm512_gf2p8affine_epi64_epi8::<0>(x, _mm512_set1_epi64(SHIFT_DOWN_4))
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
    let mut pf_at = 0usize;
    for b in 0..nb {
        let off = b * Q4_1_BYTES;
        // One prefetch per 64 bytes of each row, every cache line asked for once (one per
        // other block, 40 bytes apart, asked for most lines twice): 8192 × 16384 one
        // thread 0.79–0.86 of the read (median of rounds) against 0.80–0.82, two threads
        // 0.80–1.05 against 0.61–0.79 (`benches/matvec.rs`, a loaded machine).
        prefetch_lines(&rp, &mut pf_at, off + Q4_1_BYTES, prefetch);
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
/// Two ways to the same exact four-byte lane sums: ggml's sign trick (`|x|` as unsigned
/// against `y` negated where `x < 0`), and on Intel cores offset weights (`x + 128` as
/// unsigned, the accumulator starting from `−128 · Σ y` of each lane), which take two
/// instructions a row pair where the sign trick takes four. They agree unless a column
/// quant is −128, whose negation the sign trick wraps to −128 (the quantizer writes one only
/// for a NaN); such a column takes the sign trick (one pass over the column's quants a call
/// decides). On a Sapphire Rapids host the offset weights computed 32.4–33.1 GB/s of
/// weights a core in L2 against 29.8–31.3, and 4096 × 4096 from L3 took 323–359 µs against
/// 361–384 (three alternations each; from memory the host's swings, 0.72–0.94 of the read,
/// hid any difference); on the AMD host the offset form was the slower (8.0–9.1 ns a block
/// index of sixteen rows against 7.7–8.1, the module docs). The pass over the column costs
/// nothing measurable: without it (a probe that skips the check) one thread in L2 computed
/// 36.2–36.9 GB/s against 36.3–36.6 (`THIN_CASES=q8_0_x1_plain`, three alternations), so the
/// flag is not kept per product.
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
    let (qs, _, _) = column(col, nb);
    // SAFETY: the caller's contract.
    unsafe {
        if !intel() {
            q8_0_rows8_by::<false, false>(rows, col, nb, prefetch)
        } else if has_min_quant(qs, nb) {
            q8_0_rows8_by::<false, true>(rows, col, nb, prefetch)
        } else {
            q8_0_rows8_by::<true, true>(rows, col, nb, prefetch)
        }
    }
}

/// Whether any of the `nb` blocks of column quants at `qs` holds −128.
///
/// # Safety
/// The [`available`] features; `32 · nb` bytes readable at `qs`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn has_min_quant(qs: *const u8, nb: usize) -> bool {
    let (min, bytes) = (_mm512_set1_epi8(i8::MIN), QK * nb);
    let whole = bytes / 64 * 64;
    let mut found = 0u64;
    for at in (0..whole).step_by(64) {
        // SAFETY: the 64 bytes at `at < whole` lie inside the quants.
        found |= _mm512_cmpeq_epi8_mask(unsafe { _mm512_loadu_si512(qs.add(at).cast()) }, min);
    }
    if whole < bytes {
        let live = u64::MAX >> (64 - (bytes - whole));
        // SAFETY: the load is masked to the last `bytes - whole` bytes of the quants.
        let v = unsafe { _mm512_maskz_loadu_epi8(live, qs.add(whole).cast()) };
        found |= _mm512_mask_cmpeq_epi8_mask(live, v, min);
    }
    found != 0
}

/// [`q8_0_rows8`] by offset weights (`OFFSET`) or by the sign trick, each row prefetched
/// ahead of itself and on into the next call's ([`prefetch_rows_on`], `ROWS_ON`: on Intel
/// cores) or the next call's rows as one stream ([`prefetch_region`]: the AMD host's choice).
///
/// # Safety
/// As for [`q8_0_rows8`]; with `OFFSET`, no column quant is −128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8_0_rows8_by<const OFFSET: bool, const ROWS_ON: bool>(
    rows: [&[u8]; ROWS],
    col: &[u8],
    nb: usize,
    prefetch: usize,
) -> [f32; ROWS] {
    let rp = rows.map(<[u8]>::as_ptr);
    let (qs, ds, _) = column(col, nb);
    let zero = _mm512_setzero_si512();
    let idx: [__m512i; 4] = std::array::from_fn(|p| pair_index(p as i32, 1));
    let min = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); ROWS / 2];
    let len = nb * Q8_0_BYTES;
    let mut pf_at = if ROWS_ON {
        start_rows_on(&rp, len, prefetch)
    } else {
        0
    };
    for b in 0..nb {
        let off = b * Q8_0_BYTES;
        // The next call's eight rows are `prefetch` bytes on (they follow each other).
        if ROWS_ON {
            prefetch_rows_on(&rp, len, prefetch, &mut pf_at, off + Q8_0_BYTES);
        } else {
            prefetch_region(rp[0], prefetch, ROWS, &mut pf_at, off + Q8_0_BYTES);
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
            // −128 times each lane's column sum: the offset weights' correction.
            let corr = if OFFSET {
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, min, qy))
            } else {
                zero
            };
            for (p, a) in acc.iter_mut().enumerate() {
                let x = two_rows_32(rp[2 * p], rp[2 * p + 1], off + 2);
                let lanes = if OFFSET {
                    // x + 128 as unsigned: Σ (x + 128) · y − 128 · Σ y = Σ x · y.
                    _mm512_dpbusd_epi32(corr, _mm512_xor_si512(x, min), qy)
                } else {
                    // `sign` trick: |x| as unsigned, y negated where x < 0 (where x = 0
                    // the product is 0 either way).
                    let ax = _mm512_abs_epi8(x);
                    let sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(x), zero, qy);
                    _mm512_dpbusd_epi32(zero, ax, sy)
                };
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

/// The row in lane `l` of [`transpose16x8`]'s registers (rows 4..8 and 8..12 swap places;
/// the permutation is its own inverse).
#[inline(always)]
const fn lane_row(l: usize) -> usize {
    match l / 4 {
        1 => l + 4,
        2 => l - 4,
        _ => l,
    }
}

/// Sixteen rows' 32 bytes at `off` transposed to dwords: register `c` holds dword `c` of row
/// [`lane_row`]`(l)` in lane `l`. Rows `i` and `i + 8` share a register (one per 256-bit
/// half), an 8 × 8 dword transpose within each half (`unpack` of dwords, then of qwords,
/// then a 128-bit shuffle) leaves lane `l` with row `lane_row(l)`.
///
/// # Safety
/// 32 bytes at `off` must be readable in every row.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn transpose16x8(rp: &[*const u8; ROWS16], off: usize) -> [__m512i; 8] {
    // SAFETY: 32 readable bytes at `off` in every row (caller's contract).
    let z: [__m512i; 8] = std::array::from_fn(|i| unsafe { two_rows_32(rp[i], rp[i + 8], off) });
    let t: [__m512i; 8] = std::array::from_fn(|j| {
        if j % 2 == 0 {
            _mm512_unpacklo_epi32(z[j], z[j + 1])
        } else {
            _mm512_unpackhi_epi32(z[j - 1], z[j])
        }
    });
    // u[4h + c]: dword c (128-bit lanes 0, 2) and c + 4 (lanes 1, 3) of rows 4h..4h + 4
    // (lanes 0, 1) and 8 + 4h.. (lanes 2, 3).
    let u: [__m512i; 8] = std::array::from_fn(|i| {
        let (h, c) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + c / 2], t[4 * h + 2 + c / 2]);
        if c % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|c| {
        if c < 4 {
            _mm512_shuffle_i32x4::<0b10_00_10_00>(u[c], u[c + 4])
        } else {
            _mm512_shuffle_i32x4::<0b11_01_11_01>(u[c - 4], u[c])
        }
    })
}

/// ggml's `hsum_float_8` order across eight registers of sixteen rows' lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum8x16(a: &[__m512; 8]) -> __m512 {
    _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
        _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
    )
}

/// `q4_1` rows against one packed column, sixteen rows at a time: `[row · col; 16]`.
///
/// Each row's 32 bytes from its block's start (the `d`, `m` header
/// dword, then the four quant dwords) are transposed in registers ([`transpose16x8`]), so
/// that register `1 + c` holds the repacked kernel's (`repack::q4_1`) chunk `c` (its low
/// nibbles lane `c` of the plain order, its high nibbles lane `4 + c`) and register 0 the
/// sixteen rows' scales and minimums, and then computed as that kernel does. The last
/// block, whose 32 bytes would run 12 bytes past the row, is read from copies.
///
/// # Safety
/// The CPU has the [`available`] features; every row holds `nb` `q4_1` blocks and `col` is a
/// packed column of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4_1_rows16(
    rows: [&[u8]; ROWS16],
    col: &[u8],
    nb: usize,
    prefetch: usize,
) -> [f32; ROWS16] {
    let rp = rows.map(<[u8]>::as_ptr);
    let (qs, ds, ss) = column(col, nb);
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut summs = _mm512_setzero_ps();
    // Each row's last block with room for a 32-byte read.
    let mut last = [[0u8; 32]; ROWS16];
    if let Some(start) = nb.checked_sub(1).map(|b| b * Q4_1_BYTES) {
        for (l, r) in last.iter_mut().zip(&rows) {
            l[..Q4_1_BYTES].copy_from_slice(&r[start..start + Q4_1_BYTES]);
        }
    }
    let lp: [*const u8; ROWS16] = std::array::from_fn(|r| last[r].as_ptr());
    let split = header_split();
    let mut pf_at = 0usize;
    for b in 0..nb {
        let off = b * Q4_1_BYTES;
        // The next call's sixteen rows, `prefetch` bytes on (they follow each other).
        prefetch_region(rp[0], prefetch, ROWS16, &mut pf_at, off + Q4_1_BYTES);
        // SAFETY: before the last block, 32 bytes at `off` lie inside every row (`20 · b +
        // 32 ≤ 20 · nb` for `b ≤ nb − 2`, the caller's contract); the copies hold 32 bytes;
        // block b of the column is inside it.
        unsafe {
            let x = if b + 1 < nb {
                transpose16x8(&rp, off)
            } else {
                transpose16x8(&lp, 0)
            };
            let h = _mm512_permutexvar_epi16(split, x[0]);
            let dx = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
            let mx = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h));
            summs = _mm512_fmadd_ps(mx, _mm512_set1_ps(ss.add(b).read_unaligned()), summs);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(ds.add(b).read_unaligned()));
            let q = qs.add(QK * b);
            for (l, a) in acc.iter_mut().enumerate() {
                let xl = if l < 4 {
                    _mm512_and_si512(x[1 + l], m4)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(x[l - 3]), m4)
                };
                let y = _mm512_set1_epi32(q.add(4 * l).cast::<i32>().read_unaligned());
                let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), xl, y);
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *a);
            }
        }
    }
    let mut lanes = [0.0f32; ROWS16];
    // SAFETY: `lanes` holds sixteen floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_add_ps(hsum8x16(&acc), summs)) };
    std::array::from_fn(|r| lanes[lane_row(r)])
}

/// Whether `q4_1` decode steps go to [`q4_1_rows16_quads`] rather than [`q4_1_rows16`]: on
/// Intel cores (asked once). Both give the same bits; which is faster depends on the core.
/// On a Sapphire Rapids host, whose 512-bit shuffles all run on one port, the transposing
/// kernel computed 19.9–20.0 GB/s of weights a core in L2 and this one 23.8–25.2
/// (`THIN_N=1 THIN_CASES=q4_1_x1_plain cargo bench -p cpu-kernels --bench thin_cpu`, three
/// alternations), and 4096 × 4096 in L3 on two threads took 212–215 µs against 243–264
/// (`benches/kernels.rs`); the transposing kernel was measured the faster on the AMD EPYC
/// (Zen 5) host it was written on, where this one has not run. The quads also need GFNI
/// ([`high_nibbles`]), which Intel cores with AVX-512 VNNI have from Ice Lake on (Cascade and Cooper Lake do not).
pub(crate) fn prefers_quads() -> bool {
    intel() && has_gfni()
}

/// Whether the CPU is Intel's (asked once): the kernels whose best form was measured to
/// differ between an Intel and an AMD host choose by it.
pub(crate) fn intel() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        let id = __cpuid(0);
        let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes);
        vendor.concat() == b"GenuineIntel"
    })
}

/// `q4_1` rows against one packed column, sixteen rows at a time as four quads: `[row ·
/// col; 16]`, the bits of [`q4_1_rows16`], or `None` when the rows lie too far apart for
/// 32-bit offsets from the first. `prefetch`: how far on each row's prefetch stream runs
/// on past the row's end (0: nowhere), for [`prefetch_rows_on`]: to the next call's same
/// row for calls over consecutive rows, to the next row for interleaved calls.
///
/// A quad's register holds one row's sixteen quant bytes of a block in each 128-bit lane
/// (one load and three merging broadcasts, no shuffles); its low nibbles against the
/// column's bytes `0..16` (broadcast to every lane) give lanes `0..4` of the four rows
/// (`dpbusd`), its high nibbles against bytes `16..32` lanes `4..8`, each lane's exact sum
/// in the same 32-bit lane as before. So a quad keeps two accumulators, lanes `0..4` and
/// `4..8` of its rows, and every lane continues its own FMA chain block by block, with the
/// row's `d_w · d_a` picked into its four lanes by one permute. The sixteen rows' block
/// headers come in with one gather (offsets from the first row), are split into `d` and
/// `m` and converted together; at the end row `r`'s lanes `a0..a8` are summed in
/// `qdot`'s order.
///
/// # Safety
/// The CPU has the [`available`] features and GFNI; every row holds `nb` `q4_1` blocks and `col` is a
/// packed column of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
pub(crate) unsafe fn q4_1_rows16_quads(
    rows: [&[u8]; ROWS16],
    col: &[u8],
    nb: usize,
    prefetch: usize,
) -> Option<[f32; ROWS16]> {
    let rp = rows.map(<[u8]>::as_ptr);
    let mut offsets = [0i32; ROWS16];
    for (o, &p) in offsets.iter_mut().zip(&rp) {
        *o = i32::try_from((p as isize).wrapping_sub(rp[0] as isize)).ok()?;
    }
    // SAFETY: `offsets` holds sixteen i32.
    let vidx = unsafe { _mm512_loadu_si512(offsets.as_ptr().cast()) };
    let (qs, ds, ss) = column(col, nb);
    let m4 = _mm512_set1_epi8(0x0f);
    // Quad g's scales: lanes 4i..4i + 4 take row 4g + i's.
    let first_quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let pick: [__m512i; 4] =
        std::array::from_fn(|g| _mm512_add_epi32(first_quad, _mm512_set1_epi32(4 * g as i32)));
    let split = header_split();
    let mut lo_acc = [_mm512_setzero_ps(); 4];
    let mut hi_acc = [_mm512_setzero_ps(); 4];
    let mut summs = _mm512_setzero_ps();
    let len = nb * Q4_1_BYTES;
    let mut pf_at = start_rows_on(&rp, len, prefetch);
    for b in 0..nb {
        let off = b * Q4_1_BYTES;
        // Each row ahead of itself, on into the next call's (`prefetch` bytes on).
        prefetch_rows_on(&rp, len, prefetch, &mut pf_at, off + Q4_1_BYTES);
        // SAFETY: block b of every row (20 bytes at `off`: the 4-byte header the gather
        // reads at `rp[0] + off + offsets[r]` = `rp[r] + off`, and the 16 quant bytes at
        // `off + 4`) and of the column (32 quants, one scale, one sum) is inside them
        // (caller's contract).
        unsafe {
            let h = _mm512_i32gather_epi32::<1>(vidx, rp[0].add(off).cast());
            let h = _mm512_permutexvar_epi16(split, h);
            let dx = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
            let mx = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h));
            summs = _mm512_fmadd_ps(mx, _mm512_set1_ps(ss.add(b).read_unaligned()), summs);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(ds.add(b).read_unaligned()));
            let q = qs.add(QK * b);
            let y_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(q.cast()));
            let y_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(q.add(16).cast()));
            for (g, (lo, hi)) in lo_acc.iter_mut().zip(&mut hi_acc).enumerate() {
                let quants = |i: usize| _mm_loadu_si128(rp[4 * g + i].add(off + 4).cast());
                let mut x = _mm512_castsi128_si512(quants(0));
                x = _mm512_mask_broadcast_i32x4(x, 0x00f0, quants(1));
                x = _mm512_mask_broadcast_i32x4(x, 0x0f00, quants(2));
                x = _mm512_mask_broadcast_i32x4(x, 0xf000, quants(3));
                let x_lo = _mm512_and_si512(x, m4);
                let x_hi = high_nibbles(x);
                let dq = _mm512_permutexvar_ps(pick[g], d);
                let s_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x_lo, y_lo);
                let s_hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x_hi, y_hi);
                *lo = _mm512_fmadd_ps(dq, _mm512_cvtepi32_ps(s_lo), *lo);
                *hi = _mm512_fmadd_ps(dq, _mm512_cvtepi32_ps(s_hi), *hi);
            }
        }
    }
    let mut sm = [0.0f32; ROWS16];
    // SAFETY: `sm` holds sixteen floats.
    unsafe { _mm512_storeu_ps(sm.as_mut_ptr(), summs) };
    let mut out = [0.0f32; ROWS16];
    for (g, (lo, hi)) in lo_acc.iter().zip(&hi_acc).enumerate() {
        let (mut l, mut h) = ([0.0f32; 16], [0.0f32; 16]);
        // SAFETY: `l` and `h` hold sixteen floats each.
        unsafe {
            _mm512_storeu_ps(l.as_mut_ptr(), *lo);
            _mm512_storeu_ps(h.as_mut_ptr(), *hi);
        }
        for i in 0..4 {
            let (a, c) = (&l[4 * i..4 * i + 4], &h[4 * i..4 * i + 4]);
            let lanes = [a[0], a[1], a[2], a[3], c[0], c[1], c[2], c[3]];
            out[4 * g + i] = hsum8(&lanes) + sm[4 * g + i];
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use crate::qdot::{WeightKind, col_bytes, dot_rows, quantize_col, quantize_q4_1};
    use crate::quant::Isa;

    /// Every byte value's high nibble, in every byte position, against a shift.
    #[test]
    fn high_nibbles_match_a_shift() {
        if !crate::isa::test_gate("avx512-gfni") {
            return;
        }
        use std::arch::x86_64::{_mm512_loadu_si512, _mm512_storeu_si512};
        for base in (0..256).step_by(64) {
            let bytes: [u8; 64] = std::array::from_fn(|i| (base + i) as u8);
            let mut got = [0u8; 64];
            // SAFETY: the CPU has AVX-512 BW and GFNI (checked above); both arrays hold 64
            // bytes.
            unsafe {
                let x = _mm512_loadu_si512(bytes.as_ptr().cast());
                _mm512_storeu_si512(got.as_mut_ptr().cast(), super::high_nibbles(x));
            }
            assert_eq!(got, bytes.map(|b| b >> 4));
        }
    }

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
        if !crate::isa::test_gate("avx512") {
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
                // Column quants of -128 (which the quantizer writes only for a NaN, and
                // whose negation the sign trick wraps) in every block, in every other block,
                // or in none: the q8_0 kernel's offset weights run only on a column without
                // any (one scan a call decides).
                for every in [Some(1), Some(2), None] {
                    let mut col = vec![0u8; col_bytes(k)];
                    quantize_col(&values(99, k), &mut col);
                    for b in 0..nb {
                        if every.is_some_and(|e| b % e == 0) {
                            col[b * 32 + b % 32] = 0x80;
                        }
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
                                "{isa:?} {kind:?} nb={nb}, -128 every {every:?} blocks"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Sixteen rows against one column (`qdot::dot_rows16`): every level gives the portable
    /// eight-row kernel's bits, for q4_1 (all-15 and all-0 blocks, the last block read
    /// from copies) and q8_0 (two eight-row calls: extreme weight bytes, and a column holding
    /// the quant −128 in the first or the last block, where the sign trick's overflow must
    /// be kept), with and without prefetching.
    #[test]
    fn sixteen_rows_one_column_match_every_level() {
        use crate::qdot::{Q4_1_BYTES, Q8_0_BYTES, ROWS16, dot_rows16};
        for kind in [WeightKind::Q4_1, WeightKind::Q8_0] {
            let bb = match kind {
                WeightKind::Q4_1 => Q4_1_BYTES,
                WeightKind::Q8_0 => Q8_0_BYTES,
            };
            for nb in [1usize, 2, 3, 18, 64, 130] {
                let k = nb * crate::qdot::QK;
                let rows: Vec<Vec<u8>> = (0..ROWS16)
                    .map(|r| {
                        let mut v = vec![0u8; nb * bb];
                        let x = values(r as u64 + 11, k);
                        match kind {
                            WeightKind::Q4_1 => {
                                quantize_q4_1(&x, &mut v);
                                let b = (r * 7) % nb;
                                v[b * bb + 4..(b + 1) * bb].fill(if r % 2 == 0 { 0xff } else { 0 });
                            }
                            WeightKind::Q8_0 => {
                                crate::quant::quantize_q8_0(&x, &mut v);
                                for b in 0..nb {
                                    let q = &mut v[b * bb + 2..(b + 1) * bb];
                                    q[(r + b) % 32] = 0x80;
                                    q[(r + 5 * b + 3) % 32] = 0x7f;
                                    // Row 0 negative where a poisoned column byte goes.
                                    if r == 0 {
                                        q[b % 32] = 0xff;
                                    }
                                }
                            }
                        }
                        v
                    })
                    .collect();
                for poison in [None, Some(0), Some(nb - 1)] {
                    let mut col = vec![0u8; col_bytes(k)];
                    quantize_col(&values(nb as u64 + 99, k), &mut col);
                    for b in 0..nb {
                        col[b * 32 + (b + 9) % 32] = 0x7f;
                        col[b * 32 + (b + 3) % 32] = 0x81;
                        if col[b * 32 + b % 32] == 0x80 {
                            col[b * 32 + b % 32] = 0x81;
                        }
                    }
                    if let Some(b) = poison {
                        col[b * 32 + b % 32] = 0x80;
                    }
                    let rr: [&[u8]; ROWS16] = std::array::from_fn(|j| &rows[j][..]);
                    let mut want = [0u32; ROWS16];
                    for h in 0..2 {
                        let half: [&[u8]; 8] = std::array::from_fn(|j| rr[8 * h + j]);
                        let [d] = dot_rows(Isa::Scalar, kind, half, [&col[..]], 0);
                        for j in 0..8 {
                            want[8 * h + j] = d[j].to_bits();
                        }
                    }
                    if kind == WeightKind::Q4_1 && super::available() {
                        // Whichever kernel `dot_rows16` picks on this CPU, the other one too,
                        // on the rows laid out one after the other as in a matrix.
                        let flat = rows.concat();
                        let fr: [&[u8]; ROWS16] =
                            std::array::from_fn(|j| &flat[j * nb * bb..(j + 1) * nb * bb]);
                        for prefetch in [0, 16 * bb * nb] {
                            // SAFETY: `available()`; every row holds `nb` q4_1 blocks and the
                            // column `nb` packed blocks.
                            let quads = unsafe { super::q4_1_rows16_quads(fr, &col, nb, prefetch) };
                            // SAFETY: as above.
                            let transposed = unsafe { super::q4_1_rows16(fr, &col, nb, prefetch) };
                            assert_eq!(transposed.map(f32::to_bits), want, "transposed nb={nb}");
                            let quads = quads.expect("rows a row length apart");
                            assert_eq!(quads.map(f32::to_bits), want, "quads nb={nb} {poison:?}");
                        }
                    }
                    for isa in Isa::available() {
                        for prefetch in [0, 16 * bb * nb] {
                            let got = dot_rows16(isa, kind, rr, &col, prefetch);
                            assert_eq!(
                                got.map(f32::to_bits),
                                want,
                                "{isa:?} {kind:?} nb={nb} poison={poison:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
