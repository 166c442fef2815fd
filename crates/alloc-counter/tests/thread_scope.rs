//! The per-thread scope counts `alloc`, `alloc_zeroed` and `realloc` made by the measuring
//! thread inside the measured closure, and nothing else.

use std::sync::{Arc, Barrier};

use alloc_counter::{CountingAllocator, allocations, count_on_this_thread};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::THREAD;

#[test]
fn counts_each_kind_of_allocation_inside_the_closure() {
    let mut v: Vec<u64> = Vec::with_capacity(1);
    let ((), n) = count_on_this_thread(|| v.reserve_exact(1000));
    assert_eq!(n, 1, "one realloc");
    let (b, n) = count_on_this_thread(|| (Box::new(7u64), vec![0u8; 100]));
    assert_eq!(n, 2, "one alloc, one alloc_zeroed");
    drop(b);
    let ((), n) = count_on_this_thread(|| drop(v));
    assert_eq!(n, 0, "dealloc is not counted");
    assert_eq!(
        allocations(),
        0,
        "the process-wide counter belongs to the other scope"
    );
}

#[test]
fn another_threads_allocations_are_not_counted() {
    let start = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    let (s, d) = (Arc::clone(&start), Arc::clone(&done));
    let other = std::thread::spawn(move || {
        s.wait();
        let v: Vec<Box<u32>> = (0..100).map(Box::new).collect();
        d.wait();
        v.len()
    });
    let ((), n) = count_on_this_thread(|| {
        start.wait();
        done.wait();
    });
    assert_eq!(other.join().unwrap(), 100);
    assert_eq!(n, 0, "{n} allocations of the other thread counted");
}
