//! A global allocator that counts heap allocations, for tests and benchmarks that check a
//! steady state makes none; never a dependency of a library crate.
//!
//! Why a crate of its own, with no dependencies: the allocator is wanted by the tests of crates
//! low in the workspace (`cpu-kernels`, `graph-alloc`) as well as high (`llm`, `sched`), and
//! `test-fixtures` depends on `graph-alloc` and `sched`, which depend on `cpu-kernels`' users:
//! a dev-dependency on it from below would make a cycle. Each test binary still declares its
//! own `#[global_allocator]` static (only a binary can); this crate provides the type and its
//! counters.
//!
//! Two scopes ([`CountingAllocator::PROCESS`] and [`CountingAllocator::THREAD`]): every
//! allocation of the process, read with [`allocations`], or only those a thread makes inside
//! [`count_on_this_thread`]. An allocation is a call of `alloc`, `alloc_zeroed` or `realloc`;
//! `dealloc` is not counted. Every call is forwarded unchanged to [`System`].
//!
//! ```
//! use alloc_counter::{CountingAllocator, allocations};
//!
//! #[global_allocator]
//! static GLOBAL: CountingAllocator = CountingAllocator::PROCESS;
//!
//! fn main() {
//!     let before = allocations();
//!     let v = vec![1u8; 64];
//!     assert!(allocations() > before);
//!     let before = allocations();
//!     let sum: u32 = v.iter().map(|&x| u32::from(x)).sum();
//!     assert_eq!((sum, allocations() - before), (64, 0));
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Allocations counted in [`CountingAllocator::PROCESS`] scope.
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is inside [`count_on_this_thread`].
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Allocations this thread made while [`ON`] (in [`CountingAllocator::THREAD`] scope).
    static MINE: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting allocations; install it in a test binary with
/// `#[global_allocator]` (see the crate example).
#[derive(Debug)]
pub struct CountingAllocator {
    per_thread: bool,
}

impl CountingAllocator {
    /// Count every allocation of every thread; read the count with [`allocations`].
    pub const PROCESS: CountingAllocator = CountingAllocator { per_thread: false };
    /// Count only what a thread allocates inside [`count_on_this_thread`], so that other
    /// threads (the test harness, tests running beside) cannot disturb the figure.
    ///
    /// ```
    /// use alloc_counter::{CountingAllocator, count_on_this_thread};
    ///
    /// #[global_allocator]
    /// static GLOBAL: CountingAllocator = CountingAllocator::THREAD;
    ///
    /// fn main() {
    ///     let (v, n) = count_on_this_thread(|| vec![0u32; 16]);
    ///     assert_eq!((v.len(), n), (16, 1));
    /// }
    /// ```
    pub const THREAD: CountingAllocator = CountingAllocator { per_thread: true };

    fn note(&self) {
        if !self.per_thread {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        } else if ON.with(Cell::get) {
            MINE.with(|m| m.set(m.get() + 1));
        }
    }
}

/// Allocations counted so far by a [`CountingAllocator::PROCESS`] allocator (0 under any other
/// global allocator): take the difference of two readings.
pub fn allocations() -> usize {
    ALLOCS.load(Ordering::Relaxed)
}

/// Run `f` and return its result with the number of allocations this thread made meanwhile,
/// as counted by a [`CountingAllocator::THREAD`] allocator (0 under any other).
pub fn count_on_this_thread<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = MINE.with(Cell::get);
    let was_on = ON.with(|on| on.replace(true));
    let r = f();
    ON.with(|on| on.set(was_on));
    (r, MINE.with(Cell::get) - before)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// caller's obligations are exactly `System`'s; counting touches no memory being managed (the
// thread-locals are const-initialised `Cell`s without destructors, so reading them never
// allocates nor fails during thread teardown).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: forwarded as is (see the impl's comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: forwarded as is; `ptr` came from this allocator, that is from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}
