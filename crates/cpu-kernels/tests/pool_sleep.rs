//! A worker going to sleep, and being woken, makes no heap allocation.
//!
//! The pool's threads sleep on a condition variable when they have been idle for a few
//! microseconds. A sleep primitive that allocates the first time a thread (or the first thread
//! in the process) blocks turns that moment into a heap allocation inside whatever compute is
//! running then: on a loaded machine a worker may never sleep during a model's warm-up and
//! first do so many steps later, which broke the decode-step no-allocation guarantee
//! (`crates/llm/tests/no_alloc.rs`). This test is its own binary so that nothing else in the
//! process has blocked before it.

use std::time::{Duration, Instant};

use alloc_counter::{CountingAllocator, allocations};
use cpu_kernels::CpuCompute;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::PROCESS;

/// Allocations made by starting a two-thread engine and leaving it idle until its worker has
/// gone to sleep (it polls for about 20 µs first), as the pool's own sleep counter shows; a
/// worker that never sleeps within 10 s fails the test.
fn allocations_of_an_engine_going_idle() -> usize {
    let before = allocations();
    let compute = CpuCompute::new(2);
    assert_eq!(compute.n_threads(), 2);
    let t0 = Instant::now();
    while compute.worker_sleeps() == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the idle worker did not go to sleep within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let n = allocations() - before;
    drop(compute);
    n
}

/// The first engine of the process is the first to put a thread to sleep; the second starts
/// the same threads the same way. Their counts differ only if blocking itself allocates
/// (a lazily built global wait table, say, made on the first block in the process).
#[test]
#[cfg_attr(miri, ignore = "sleeps; nothing unsafe to check")]
fn a_worker_goes_to_sleep_without_allocating() {
    // Pay the process's one-time costs before measuring: the first thread spawn allocates
    // once (std reads and caches the minimum stack size), and the test harness's own thread
    // allocates when it first blocks waiting for this test.
    std::thread::spawn(|| {}).join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let first = allocations_of_an_engine_going_idle();
    let second = allocations_of_an_engine_going_idle();
    assert_eq!(
        first, second,
        "the first engine to go idle made {first} heap allocations, the second {second}"
    );
}
