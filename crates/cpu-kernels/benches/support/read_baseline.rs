//! The read ceiling of the memory-bound mat-vec benches: two threads summing the two halves
//! of a buffer with AVX2 loads, [`READ_STREAMS`] streams per thread. Shared by `kernels`
//! (`mul_mat/read_64MiB_baseline`) and `matvec` (its `read` row).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Read streams per thread. On this machine kind one sequential stream per core reaches
/// only about 60 % of what several streams read side by side get (the hardware prefetchers
/// keep more misses in flight), so a single-stream loop would understate the ceiling; more
/// than eight streams gained nothing.
pub const READ_STREAMS: usize = 8;

/// Sum of `v`, read as [`READ_STREAMS`] contiguous parts side by side, with 256-bit loads
/// into two accumulators per part (or plain Rust where AVX2 is missing).
pub fn read_sum(v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { read_sum_avx2(v) };
    }
    v.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn read_sum_avx2(v: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let part = v.len() / READ_STREAMS / 16 * 16;
    let p: [*const f32; READ_STREAMS] = std::array::from_fn(|j| v[j * part..].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; READ_STREAMS];
    for i in (0..part).step_by(16) {
        for (a, &p) in acc.iter_mut().zip(&p) {
            // SAFETY: part j is v[j * part .. (j + 1) * part] and i + 16 <= part.
            let (x, y) = unsafe { (_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(p.add(i + 8))) };
            a[0] = _mm256_add_ps(a[0], x);
            a[1] = _mm256_add_ps(a[1], y);
        }
    }
    let s = acc.iter().fold(_mm256_setzero_ps(), |s, a| {
        _mm256_add_ps(s, _mm256_add_ps(a[0], a[1]))
    });
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
    lanes.iter().sum::<f32>() + v[READ_STREAMS * part..].iter().sum::<f32>()
}

struct Shared {
    buf: Vec<f32>,
    epoch: AtomicU64,
    done: AtomicU64,
    stop: AtomicBool,
}

/// A buffer of ones and a helper thread: [`ReadBaseline::run`] reads the first half on the
/// calling thread while the helper reads the second. Between calls the helper polls for a
/// few microseconds and then parks, as the kernels' pool does: a helper that spun all the
/// time was the thread the scheduler preempted on a loaded machine.
pub struct ReadBaseline {
    sh: Arc<Shared>,
    helper: Option<JoinHandle<()>>,
}

impl ReadBaseline {
    /// `bytes` of f32 ones (a multiple of 4), read half by each thread.
    pub fn new(bytes: usize) -> ReadBaseline {
        let sh = Arc::new(Shared {
            buf: vec![1.0f32; bytes / 4],
            epoch: AtomicU64::new(0),
            done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = sh.clone();
        let helper = std::thread::spawn(move || {
            let hi = &s.buf[s.buf.len() / 2..];
            let mut seen = 0;
            loop {
                let t = Instant::now();
                while s.epoch.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Acquire) {
                    if t.elapsed() < Duration::from_micros(20) {
                        std::hint::spin_loop();
                    } else {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                }
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                seen = s.epoch.load(Ordering::Acquire);
                black_box(read_sum(hi));
                s.done.store(seen, Ordering::Release);
            }
        });
        ReadBaseline {
            sh,
            helper: Some(helper),
        }
    }

    /// Bytes read per call.
    pub fn bytes(&self) -> usize {
        self.sh.buf.len() * 4
    }

    /// One read of the whole buffer by the calling thread alone.
    #[allow(dead_code, reason = "used by `matvec`, not by `kernels`")]
    pub fn run_one_thread(&self) {
        black_box(read_sum(&self.sh.buf));
    }

    /// One read of the whole buffer by both threads.
    pub fn run(&self) {
        let s = &*self.sh;
        let e = s.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(h) = &self.helper {
            h.thread().unpark();
        }
        black_box(read_sum(&s.buf[..s.buf.len() / 2]));
        while s.done.load(Ordering::Acquire) != e {
            std::hint::spin_loop();
        }
    }
}

impl Drop for ReadBaseline {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        if let Some(h) = self.helper.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}
