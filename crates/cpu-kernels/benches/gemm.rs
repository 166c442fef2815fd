//! f32 GEMM against the machine's FMA peak, in interleaved rounds.
//!
//! `cargo bench -p cpu-kernels --bench gemm` (`GEMM_ROUNDS=N`, default 3; `BENCH_THREADS=N`,
//! default 2; `GEMM_SKIP_LARGE=1` leaves out 4096³; `GEMM_CASES=f32_,ffn` keeps the cases
//! whose names contain one of the words). Each round measures, one after the other:
//!
//! * **the clock**: a chain of dependent register-to-register integer adds (one cycle each
//!   on every x86 core), timed; cycles ÷ seconds is the clock the core ran at (adds of an
//!   immediate would not do: Golden Cove and later cores fold chains of them at rename, and
//!   such a chain ran at a "clock" of 19–22 GHz on a Sapphire Rapids host);
//! * **the clock under AVX-512 load**: the same chain with an independent zmm FMA after each
//!   add, on every thread at once (the mean is the `clock GHz` column). Cores may run wide
//!   vector code at a lower clock than scalar code (on a Sapphire Rapids host: 3.4–3.5 GHz
//!   against 3.6–3.9 for the plain chain, which the `fma_peak` row also prints);
//! * **the FMA peak**: every thread runs a loop of 24 independent AVX-512 FMA chains (no
//!   loads), in GFLOP/s (2 FLOP per lane per FMA), and the nominal figure for comparison:
//!   threads × 2 FMA units × 16 lanes × 2 FLOP × the clock under AVX-512 load;
//! * **MUL_MAT f32** through [`cpu_kernels::CpuCompute`] on MiniLM's shapes (weights
//!   384×384, 1536×384 and 384×1536 against 4096 columns) and 4096³, and the `gemm` crate
//!   (the previous path: one call per thread on half the rows each) on the same shapes.
//!
//! Every figure is the fastest of several calls in that round (the machine is shared); the
//! ratio to the peak uses the same round's peak. The FMA loop runs again after each case, and
//! the `FMA loop` column of a case's row is the lesser of the loops just before and just
//! after it. A co-tenant on the other hardware thread of one of our cores halves the FMA loop
//! and, while it lasts, every product (ours and the `gemm` crate's alike): a case whose
//! bracketing loops fell below 0.9 of the nominal peak is marked `DISTURBED`, and the last
//! lines give, per case, ours ÷ the nominal peak over the other rounds. Beside the wall-clock figures, the CPU time
//! per call (the process's, all threads, over batches of calls at least 0.2 s long, the least
//! of three batches) gives GFLOP per busy CPU-second, and the same for the FMA loop: their
//! ratio (`cpu/peak`) leaves out the time the threads waited for a core, so it stays
//! meaningful on a loaded machine (it still feels the caches and memory that other jobs
//! share, and counts a worker's spinning while it waits for the others). Results go to
//! stdout as a table.
#![allow(clippy::print_stdout)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpu_kernels::CpuCompute;
use cpu_kernels::doc_support::host_buffer;
use graph::{Context, ElementType, Graph};

fn threads() -> usize {
    std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// CPU seconds on `clock` (the process's: all threads together; or the calling thread's).
fn cpu_secs(clock: libc::clockid_t) -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; the clock id is a constant the OS knows.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn fastest(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX)
}

/// Batches of calls over which [`fastest_both`] reads the process's CPU clock.
const CPU_BATCHES: usize = 3;
/// Least wall time of a batch: the process clock takes in a running worker's time only at
/// the next scheduler event (up to a tick, a few ms, late), so it is read over batches long
/// enough for that to vanish.
const CPU_BATCH: Duration = Duration::from_millis(200);

/// The fastest call's wall time (over at least `reps` calls) and the least CPU time per call
/// (seconds) of [`CPU_BATCHES`] batches of calls, each at least [`CPU_BATCH`] long.
fn fastest_both(reps: usize, mut f: impl FnMut()) -> (Duration, f64) {
    let mut wall = Duration::MAX;
    let mut cpu = f64::INFINITY;
    let mut calls = 0;
    for batch in 0.. {
        if batch >= CPU_BATCHES && calls >= reps {
            break;
        }
        let (c0, t0) = (cpu_secs(libc::CLOCK_PROCESS_CPUTIME_ID), Instant::now());
        let mut n = 0;
        while n == 0 || t0.elapsed() < CPU_BATCH {
            let t = Instant::now();
            f();
            wall = wall.min(t.elapsed());
            n += 1;
        }
        cpu = cpu.min((cpu_secs(libc::CLOCK_PROCESS_CPUTIME_ID) - c0) / n as f64);
        calls += n;
    }
    (wall, cpu)
}

/// Iterations of the clock loops, eight dependent adds each.
const CLOCK_ITERS: u64 = 2_000_000;

/// Dependent adds per second of `chain` (which runs [`CLOCK_ITERS`] iterations of eight adds
/// of its second argument to a running sum, and returns the sum): the fastest of 20 runs.
fn adds_per_second(mut chain: impl FnMut(u64, u64) -> u64) -> f64 {
    let t = fastest(20, || {
        black_box(chain(CLOCK_ITERS, black_box(1)));
    });
    (8 * CLOCK_ITERS) as f64 / t.as_secs_f64()
}

/// Cycles per second of the calling thread's core: 8 dependent adds of a register per
/// iteration (not of an immediate, which newer cores fold at rename).
#[cfg(target_arch = "x86_64")]
fn clock_hz() -> f64 {
    adds_per_second(|n, one| {
        let mut x = 0u64;
        // SAFETY: register arithmetic only; no memory, no stack.
        unsafe {
            std::arch::asm!(
                "2:",
                "add {x}, {one}", "add {x}, {one}", "add {x}, {one}", "add {x}, {one}",
                "add {x}, {one}", "add {x}, {one}", "add {x}, {one}", "add {x}, {one}",
                "sub {n}, 1",
                "jnz 2b",
                n = inout(reg) n => _,
                x = inout(reg) x,
                one = in(reg) one,
                options(nomem, nostack),
            );
        }
        x
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn clock_hz() -> f64 {
    f64::NAN
}

/// Cycles per second of the calling thread's core while it runs AVX-512 FMAs: the chain of
/// [`clock_hz`] with an independent zmm FMA after each add (eight per iteration: four cycles
/// of the two FMA units' time, well inside the chain's eight). A core may run wide vector
/// code at a lower clock than scalar code; this is the clock the FMA peak is made of.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn clock_hz_under_fma() -> f64 {
    adds_per_second(|n, one| {
        let mut x = 0u64;
        // SAFETY: register arithmetic only; no memory, no stack; the function's caller
        // guarantees AVX-512 F.
        unsafe {
            std::arch::asm!(
                "vxorps zmm0, zmm0, zmm0",
                "2:",
                "add {x}, {one}", "vfmadd231ps zmm1, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm2, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm3, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm4, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm5, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm6, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm7, zmm0, zmm0",
                "add {x}, {one}", "vfmadd231ps zmm8, zmm0, zmm0",
                "sub {n}, 1",
                "jnz 2b",
                n = inout(reg) n => _,
                x = inout(reg) x,
                one = in(reg) one,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _,
                options(nomem, nostack),
            );
        }
        x
    })
}

/// The mean of [`clock_hz_under_fma`] over `nth` threads measuring at once (a core's clock
/// under wide vector load can depend on how many cores are loaded), or `None` without
/// AVX-512.
fn clock_hz_fma(nth: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let sum: f64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..nth)
                // SAFETY: the CPU has AVX-512 F (checked above).
                .map(|_| s.spawn(|| unsafe { clock_hz_under_fma() }))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).sum()
        });
        return Some(sum / nth as f64);
    }
    None
}

/// FLOP per call of [`fma_loop`].
const FMA_ITERS: u64 = 1_000_000;
const FMA_CHAINS: usize = 24;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_loop_avx512(x: f32, y: f32) -> f32 {
    use std::arch::x86_64::*;
    let (xv, yv) = (_mm512_set1_ps(x), _mm512_set1_ps(y));
    let mut acc = [_mm512_set1_ps(1.0); FMA_CHAINS];
    for _ in 0..FMA_ITERS {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, xv, yv);
        }
    }
    let mut s = _mm512_setzero_ps();
    for a in acc {
        s = _mm512_add_ps(s, a);
    }
    _mm512_reduce_add_ps(s)
}

/// GFLOP/s of `nth` threads each running the FMA loop, and GFLOP per CPU-second (each thread
/// times itself: a finished thread's time reaches the process clock too late to count), or
/// `None` without AVX-512.
fn fma_peak(nth: usize) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let mut cpu = f64::INFINITY;
        let t = fastest(20, || {
            let c: f64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..nth)
                    .map(|_| {
                        s.spawn(|| {
                            let c0 = cpu_secs(libc::CLOCK_THREAD_CPUTIME_ID);
                            // SAFETY: the CPU has AVX-512 F (checked above).
                            let r = unsafe { fma_loop_avx512(black_box(0.999), black_box(1e-3)) };
                            black_box(r);
                            cpu_secs(libc::CLOCK_THREAD_CPUTIME_ID) - c0
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).sum()
            });
            cpu = cpu.min(c);
        });
        let flop = nth as f64 * FMA_ITERS as f64 * FMA_CHAINS as f64 * 16.0 * 2.0;
        return Some((flop / t.as_secs_f64() / 1e9, flop / cpu / 1e9));
    }
    None
}

/// A case counts as measured on a quiet machine when the FMA loops just before and just
/// after it both reached this fraction of the nominal peak (they reach 0.95–0.98 of it when
/// the cores are ours; a co-tenant on a core's other hardware thread halves them, and halves
/// every product measured meanwhile, the `gemm` crate's too).
const QUIET: f64 = 0.9;

struct Case {
    name: String,
    k: usize,
    m: usize,
    n: usize,
    reps: usize,
}

struct Ours {
    ctx: Context,
    g: Graph,
    _buf: backend_core::Buffer,
}

fn ours(k: usize, m: usize, n: usize) -> Ours {
    let mut ctx = Context::new();
    let w = ctx
        .new_tensor_2d(ElementType::F32, k as i64, m as i64)
        .unwrap();
    let x = ctx
        .new_tensor_2d(ElementType::F32, k as i64, n as i64)
        .unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let mut g = Graph::new(8);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let sizes = [k * m * 4, k * n * 4, m * n * 4];
    let buf = host_buffer(sizes.iter().map(|s| s.next_multiple_of(64)).sum());
    let mut off = 0;
    for (id, sz) in [w, x, y].into_iter().zip(sizes) {
        backend_core::tensor_alloc(&mut ctx, &buf, id, off).unwrap();
        off += sz.next_multiple_of(64);
    }
    let vals = |len: usize, seed: usize| -> Vec<u8> {
        (0..len)
            .flat_map(|i| ((((i * 7 + seed) % 13) as f32 - 6.0) / 8.0).to_le_bytes())
            .collect()
    };
    backend_core::tensor_set(&ctx, w, 0, &vals(k * m, 1)).unwrap();
    backend_core::tensor_set(&ctx, x, 0, &vals(k * n, 2)).unwrap();
    Ours { ctx, g, _buf: buf }
}

/// The `gemm` crate on the same product, one single-threaded call per thread on its share of
/// the rows (how the executor called it).
fn gemm_crate(nth: usize, a: &[f32], b: &[f32], c: &mut [f32], k: usize, m: usize, n: usize) {
    let rows = m.div_ceil(nth).next_multiple_of(16);
    let cp = c.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..nth {
            let r0 = (t * rows).min(m);
            let r1 = ((t + 1) * rows).min(m);
            if r0 == r1 {
                continue;
            }
            s.spawn(move || {
                // SAFETY: thread t writes rows r0..r1 of every column of c only; a and b are
                // read-only and live for the scope; all indices stay inside the slices.
                unsafe {
                    gemm::gemm(
                        r1 - r0,
                        n,
                        k,
                        (cp as *mut f32).add(r0),
                        m as isize,
                        1,
                        false,
                        a.as_ptr().add(r0 * k),
                        1,
                        k as isize,
                        b.as_ptr(),
                        k as isize,
                        1,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            });
        }
    });
}

fn main() {
    let nth = threads();
    let rounds: usize = std::env::var("GEMM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut cases = vec![
        ("minilm_qkvo_384x384_x4096", 384, 384, 4096, 20),
        ("minilm_ffn_up_384x1536_x4096", 384, 1536, 4096, 10),
        ("minilm_ffn_down_1536x384_x4096", 1536, 384, 4096, 10),
    ]
    .into_iter()
    .map(|(name, k, m, n, reps)| Case {
        name: name.to_owned(),
        k,
        m,
        n,
        reps,
    })
    .collect::<Vec<_>>();
    if std::env::var_os("GEMM_SKIP_LARGE").is_none() {
        cases.push(Case {
            name: "f32_4096x4096x4096".to_owned(),
            k: 4096,
            m: 4096,
            n: 4096,
            reps: 3,
        });
    }
    if let Ok(words) = std::env::var("GEMM_CASES") {
        cases.retain(|c| words.split(',').any(|w| c.name.contains(w)));
    }
    let cpu = CpuCompute::new(nth);
    println!("threads {nth}, rounds {rounds}; GFLOP/s = fastest call of the round");
    println!(
        "{:<34} {:>6} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "case", "round", "clock GHz", "nominal", "FMA loop", "ours", "gemm"
    );
    // Per case: ours ÷ the nominal peak in each round whose bracketing FMA loops ran at full
    // speed.
    let mut quiet: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        let scalar_hz = clock_hz();
        let hz = clock_hz_fma(nth).unwrap_or(scalar_hz);
        let nominal = nth as f64 * 2.0 * 16.0 * 2.0 * hz / 1e9;
        let (peak, peak_cpu) = fma_peak(nth).unwrap_or((f64::NAN, f64::NAN));
        println!(
            "{:<34} {round:>6} {:>9.2} {nominal:>9.1} {peak:>9.1}   FMA loop per CPU-second {peak_cpu:.1}; scalar clock {:.2} GHz",
            "fma_peak",
            hz / 1e9,
            scalar_hz / 1e9
        );
        let mut before = peak;
        for (ci, c) in cases.iter().enumerate() {
            let flop = 2.0 * (c.k * c.m * c.n) as f64;
            let s = ours(c.k, c.m, c.n);
            let (t_ours, cpu_ours) = fastest_both(c.reps, || {
                black_box(cpu.compute(&s.ctx, s.g.as_view(), None).unwrap());
            });
            drop(s);
            let after = fma_peak(nth).map_or(f64::NAN, |p| p.0);
            let a: Vec<f32> = (0..c.k * c.m).map(|i| (i % 13) as f32 / 8.0).collect();
            let b: Vec<f32> = (0..c.k * c.n).map(|i| (i % 11) as f32 / 8.0).collect();
            let mut out = vec![0.0f32; c.m * c.n];
            let t_gemm = fastest(c.reps, || {
                gemm_crate(nth, &a, &b, &mut out, c.k, c.m, c.n);
                black_box(&out);
            });
            let (go, gg) = (
                flop / t_ours.as_secs_f64() / 1e9,
                flop / t_gemm.as_secs_f64() / 1e9,
            );
            let gc = flop / cpu_ours / 1e9;
            let fma_near = before.min(after);
            let disturbed = fma_near.is_nan() || fma_near < QUIET * nominal;
            if !disturbed {
                quiet[ci].push(go / nominal);
            }
            println!(
                "{:<34} {round:>6} {:>9} {:>9} {fma_near:>9.1} {go:>8.1} {gg:>8.1}   ours/peak {:.2}, ours/nominal {:.2}, ours/gemm {:.2}, per CPU-second {gc:.1}: cpu/peak {:.2}{}",
                c.name,
                "",
                "",
                go / peak,
                go / nominal,
                go / gg,
                gc / peak_cpu,
                if disturbed { "  DISTURBED" } else { "" }
            );
            before = after;
        }
    }
    println!(
        "ours ÷ the nominal peak over the rounds whose bracketing FMA loops reached {QUIET} of it"
    );
    for (c, r) in cases.iter().zip(&mut quiet) {
        r.sort_by(f64::total_cmp);
        match (r.first(), r.last()) {
            (Some(lo), Some(hi)) => println!(
                "{:<34} {} of {rounds} rounds: least {lo:.2}, median (the lower of two) {:.2}, most {hi:.2}",
                c.name,
                r.len(),
                r[(r.len() - 1) / 2]
            ),
            _ => println!("{:<34} no quiet round", c.name),
        }
    }
}
