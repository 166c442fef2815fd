//! Why one-column f16 products stay below the read ceiling: loops of the f16 and f32
//! mat-vec kernels' shape on one thread, over 64 MiB (DRAM) and over 384 KiB (L2), against
//! the one-thread read of `matvec` (`support::read_baseline`), in interleaved rounds:
//! `cargo bench -p cpu-kernels --bench stream_shape` (`SHAPE_ROUNDS`, default 20).
//!
//! Every loop reads rows of 16 KiB side by side, each row prefetched ahead as the kernels
//! do, and differs only in the vector operations per 64-byte line:
//!
//! * `f32_1op`: one 512-bit load and one FMA a line, eight rows (the f32 kernel's loop);
//! * `f16_2op_noconv`: two 256-bit loads and two FMAs a line, six rows of four
//!   accumulators (the f16 kernel's loop without its conversions: the least an f16 product
//!   needs, as a line holds 32 elements and an FMA takes 16);
//! * `f16_6rows`: the f16 kernel's loop (`vcvtph2ps` then FMA, six rows) as it was run
//!   over groups of six consecutive rows, 1 KiB ahead: each group's six streams start cold;
//! * `f16_strided`: the same loop as the product now runs it (the six rows of a call one
//!   stride of eight rows apart in units of 48, 2 KiB ahead), its streams running on from
//!   row to row.
//!
//! And `f16_product`: the crate's own one-column f16 product (MUL_MAT through
//! `CpuCompute` on one thread, 8192 × 4096, as `matvec`'s `f16_8192x4096_x1`), whose inner
//! loop `f16_strided` copies: the gap between the two is what the product's path around that
//! loop costs. And the crate's repacked q4_1 and q4_0 products (`CPU_REPACK`, one column, one
//! thread) with their weights in L2 (`q4_1_repack_l2`, 8192 × 96, 480 KiB; `q4_0_repack_l2`,
//! 8192 × 112, 504 KiB; 128 calls a timing, per-call costs included): how fast those
//! kernels compute when memory does not wait.
//!
//! Printed per loop: GB/s of its fastest call over all rounds and the median over rounds of
//! its fraction of the same round's read. The L2 rows say how fast each loop computes when
//! memory does not wait (all of them several times the DRAM rate), so the gap between the
//! DRAM rows is not arithmetic throughput but how many operations wait on each line in
//! flight. The loops' sums are not checked (the weights are one constant).
#![allow(clippy::print_stdout)]

#[path = "support/product.rs"]
mod product;
#[allow(dead_code, reason = "only the one-thread read is used here")]
#[path = "support/read_baseline.rs"]
mod read_baseline;

use std::hint::black_box;
use std::time::Instant;

/// Bytes of one row (8192 f16 or 4096 f32).
const ROW_BYTES: usize = 16 * 1024;
/// Rows of the L2-resident runs (a multiple of six and of eight: 384 KiB).
const L2_ROWS: usize = 24;

#[cfg(target_arch = "x86_64")]
mod loops {
    use std::arch::x86_64::*;

    use super::ROW_BYTES;

    /// Eight f32 rows (`rows` of them, a multiple of 8), one FMA a line, 512 bytes ahead.
    ///
    /// # Safety
    /// AVX-512F; `w` holds `rows · ROW_BYTES` bytes, `col` `ROW_BYTES` bytes.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn f32_1op(w: &[u8], rows: usize, col: &[f32]) -> f32 {
        let k = ROW_BYTES / 4;
        let mut total = _mm512_setzero_ps();
        for g in (0..rows).step_by(8) {
            let r: [*const f32; 8] =
                std::array::from_fn(|j| w[(g + j) * ROW_BYTES..].as_ptr().cast());
            let mut a = [[_mm512_setzero_ps(); 2]; 8];
            for i in (0..k).step_by(32) {
                // SAFETY: row j holds `k` floats and `i + 32 <= k`; the column `k` floats.
                // Prefetches never fault.
                unsafe {
                    for &p in &r {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 128).cast());
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 144).cast());
                    }
                    let c0 = _mm512_loadu_ps(col.as_ptr().add(i));
                    let c1 = _mm512_loadu_ps(col.as_ptr().add(i + 16));
                    for (aj, &p) in a.iter_mut().zip(&r) {
                        aj[0] = _mm512_fmadd_ps(_mm512_loadu_ps(p.add(i)), c0, aj[0]);
                        aj[1] = _mm512_fmadd_ps(_mm512_loadu_ps(p.add(i + 16)), c1, aj[1]);
                    }
                }
            }
            for aj in &a {
                total = _mm512_add_ps(total, _mm512_add_ps(aj[0], aj[1]));
            }
        }
        _mm512_reduce_add_ps(total)
    }

    /// Six f16 rows at a time, four accumulators a row, `AHEAD` elements ahead; `CONV`:
    /// convert with `vcvtph2ps` (the kernel), else use the 256 bits zero-extended as they
    /// are. `B`: the rows go in blocks of `6 · B` (or of all `rows` where fewer), group `t`
    /// of a block taking its rows `t + B·j`, so that a group's six rows are six contiguous
    /// stretches of the block, each row's prefetch running on into the row after it; with
    /// `B = 1` the groups are six consecutive rows.
    ///
    /// # Safety
    /// AVX-512F and F16C; `w` holds `rows · ROW_BYTES` bytes (`rows` a multiple of `6 · B`
    /// or of 6 and at most `6 · B`), `col` `ROW_BYTES / 2` floats.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub unsafe fn f16_rows<const CONV: bool, const B: usize, const AHEAD: usize>(
        w: &[u8],
        rows: usize,
        col: &[f32],
    ) -> f32 {
        let k = ROW_BYTES / 2;
        let b = B.min(rows / 6);
        let mut total = _mm512_setzero_ps();
        for g in 0..rows / 6 {
            let (block, t) = (g / b * 6 * b, g % b);
            let r: [*const u16; 6] =
                std::array::from_fn(|j| w[(block + t + b * j) * ROW_BYTES..].as_ptr().cast());
            let mut a = [[_mm512_setzero_ps(); 4]; 6];
            for i in (0..k).step_by(64) {
                // SAFETY: row j holds `k` f16 and `i + 64 <= k`; the column `k` floats.
                // Prefetches never fault.
                unsafe {
                    for &p in &r {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + AHEAD).cast());
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + AHEAD + 32).cast());
                    }
                    let y: [__m512; 4] =
                        std::array::from_fn(|j| _mm512_loadu_ps(col.as_ptr().add(i + 16 * j)));
                    for (aj, &p) in a.iter_mut().zip(&r) {
                        for (q, (acc, yq)) in aj.iter_mut().zip(&y).enumerate() {
                            let h = _mm256_loadu_si256(p.add(i + 16 * q).cast());
                            let x = if CONV {
                                _mm512_cvt_roundph_ps::<_MM_FROUND_CUR_DIRECTION>(h)
                            } else {
                                _mm512_castps256_ps512(_mm256_castsi256_ps(h))
                            };
                            *acc = _mm512_fmadd_ps(x, *yq, *acc);
                        }
                    }
                }
            }
            for aj in &a {
                let s = _mm512_add_ps(_mm512_add_ps(aj[0], aj[2]), _mm512_add_ps(aj[1], aj[3]));
                total = _mm512_add_ps(total, s);
            }
        }
        _mm512_reduce_add_ps(total)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The fastest of five calls of `f`, in seconds.
fn fastest(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[cfg(target_arch = "x86_64")]
fn main() {
    type Loop = unsafe fn(&[u8], usize, &[f32]) -> f32;
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("fma"))
    {
        println!("needs AVX-512F, F16C and FMA");
        return;
    }
    let rounds: usize = std::env::var("SHAPE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let bytes = 64usize << 20;
    // A multiple of 48 rows (for the six- and eight-row loops and the strided one's blocks):
    // 63.75 MiB.
    let rows = bytes / ROW_BYTES / 48 * 48;
    let dram_bytes = rows * ROW_BYTES;
    // 64-byte aligned rows, as the CPU buffer type places weights; 0x3c3c is 1.06 as f16.
    let words = vec![0x3c3c_3c3c_3c3c_3c3cu64; bytes / 8 + 8];
    let off = words.as_ptr().align_offset(64) * 8;
    let w: &[u8] = &bytemuck_bytes(&words)[off..off + bytes];
    let col = vec![0.5f32; ROW_BYTES / 2];
    let read = read_baseline::ReadBaseline::new(bytes);
    let l2_reps = rows / L2_ROWS;
    let loops: [(&str, Loop); 4] = [
        ("f32_1op", loops::f32_1op),
        ("f16_2op_noconv", loops::f16_rows::<false, 1, 512>),
        ("f16_6rows", loops::f16_rows::<true, 1, 512>),
        ("f16_strided", loops::f16_rows::<true, 8, 1024>),
    ];
    use graph::ElementType as T;
    let product = Product::new(T::F16, 8192, 4096, false);
    let repacked = [
        ("q4_1_repack_l2", Product::new(T::Q4_1, 8192, 96, true)),
        ("q4_0_repack_l2", Product::new(T::Q4_0, 8192, 112, true)),
    ];
    let mut rep_t = vec![Vec::new(); repacked.len()];
    let mut read_t = Vec::new();
    let mut prod_t = Vec::new();
    // [loop][dram, l2] -> times per round
    let mut t = vec![[Vec::new(), Vec::new()]; loops.len()];
    for _ in 0..rounds {
        read_t.push(fastest(|| read.run_one_thread()));
        prod_t.push(fastest(|| product.run()));
        for ((_, p), t) in repacked.iter().zip(&mut rep_t) {
            t.push(fastest(|| (0..128).for_each(|_| p.run())));
        }
        for ((_, f), tl) in loops.iter().zip(&mut t) {
            tl[0].push(fastest(|| {
                // SAFETY: the CPU has the loops' features (checked above); `w` holds `rows`
                // rows of ROW_BYTES (a multiple of 48 rows), `col` ROW_BYTES / 2 floats.
                black_box(unsafe { f(w, rows, &col) });
            }));
            tl[1].push(fastest(|| {
                for _ in 0..l2_reps {
                    // SAFETY: as above, over the first L2_ROWS rows.
                    black_box(unsafe { f(w, L2_ROWS, &col) });
                }
            }));
        }
    }
    let gbs = |b: usize, s: f64| b as f64 / s / 1e9;
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let read_bw = gbs(read.bytes(), best(&read_t));
    println!(
        "{rounds} rounds, one thread; GB/s of the fastest call, median over rounds of the \
         fraction of the same round's read"
    );
    println!("{:<16} {:>6.1}", "read_64MiB", read_bw);
    println!(
        "{:<16} DRAM {:>6.1} {:>5.3}",
        "f16_product",
        gbs(64 << 20, best(&prod_t)),
        median(prod_t.iter().zip(&read_t).map(|(&x, &r)| r / x).collect())
    );
    for ((name, p), t) in repacked.iter().zip(&rep_t) {
        let b = 128 * p.bytes;
        println!(
            "{:<16} L2 {:>6.1} {:>5.3}",
            name,
            gbs(b, best(t)),
            median(
                t.iter()
                    .zip(&read_t)
                    .map(|(&x, &r)| gbs(b, x) / gbs(read.bytes(), r))
                    .collect()
            )
        );
    }
    for ((name, _), tl) in loops.iter().zip(&t) {
        let l2_bytes = l2_reps * L2_ROWS * ROW_BYTES;
        let frac = |ts: &[f64], b: usize| {
            median(
                ts.iter()
                    .zip(&read_t)
                    .map(|(&x, &r)| gbs(b, x) / gbs(read.bytes(), r))
                    .collect(),
            )
        };
        println!(
            "{:<16} DRAM {:>6.1} {:>5.3}   L2 {:>6.1} {:>5.3}",
            name,
            gbs(dram_bytes, best(&tl[0])),
            frac(&tl[0], dram_bytes),
            gbs(l2_bytes, best(&tl[1])),
            frac(&tl[1], l2_bytes)
        );
    }
}

/// One of the crate's one-column products (MUL_MAT) on one thread, its weights in the CPU
/// buffer type (or `CPU_REPACK`), as `matvec` builds its rows.
struct Product {
    bytes: usize,
    cpu: cpu_kernels::CpuCompute,
    p: product::Product,
}

impl Product {
    /// `ty` weights of `k` × `m`; `repack`: in the `CPU_REPACK` buffer type.
    fn new(ty: graph::ElementType, k: i64, m: i64, repack: bool) -> Product {
        let p = product::product(ty, k, m, 1, product::cpu_weights(repack));
        Product {
            bytes: p.weight_bytes,
            cpu: cpu_kernels::CpuCompute::new(1),
            p,
        }
    }

    fn run(&self) {
        black_box(
            self.cpu
                .compute(&self.p.ctx, self.p.g.as_view(), None)
                .unwrap(),
        );
    }
}

/// The bytes of `v`.
fn bytemuck_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: any u64 is eight initialised bytes; the slice covers exactly `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 8) }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
