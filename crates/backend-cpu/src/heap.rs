//! Giving freed buffer memory back to the operating system, for long-running processes.
//!
//! Why: CPU buffers come from the C allocator. glibc raises its mmap threshold each time a
//! large block is freed, so later buffers of that size are carved from the heap arenas instead,
//! and freeing them leaves the pages resident. A server whose clients allocate and free
//! buffers (the RPC server) then keeps the peak of every client it ever had; and each of the
//! up to 8 arenas per core that its threads spread over, except the main one, keeps its free
//! top pages, which `malloc_trim` does not return. These calls let such a process opt out; a library never calls
//! them on its own. Elsewhere than glibc (and under Miri) they do nothing and return `false`.

#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
mod glibc {
    // `mallopt` and `malloc_trim` of glibc's <malloc.h>.
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
        fn malloc_trim(pad: usize) -> i32;
    }
    /// `M_MMAP_THRESHOLD` in <malloc.h>.
    const M_MMAP_THRESHOLD: i32 = -3;
    /// `M_ARENA_MAX` in <malloc.h>.
    const M_ARENA_MAX: i32 = -8;

    pub(crate) fn fixed_mmap_threshold(bytes: i32) -> bool {
        // SAFETY: `mallopt` takes two ints and only changes allocator parameters; any value is
        // accepted or refused with a 0 return.
        unsafe { mallopt(M_MMAP_THRESHOLD, bytes) == 1 }
    }

    pub(crate) fn arena_max(n: i32) -> bool {
        // SAFETY: as above.
        unsafe { mallopt(M_ARENA_MAX, n) == 1 }
    }

    pub(crate) fn trim() -> bool {
        // SAFETY: `malloc_trim` takes a byte count and only returns free pages to the kernel;
        // it is thread-safe (it locks each arena).
        unsafe { malloc_trim(0) == 1 }
    }
}

/// Serve every allocation of at least `bytes` bytes (at most 32 MiB) straight from the
/// kernel, so that freeing a buffer returns its pages at once; this also stops glibc from
/// raising the threshold on its own. Returns whether the setting was taken.
///
/// ```
/// // A process that allocates and frees large buffers for others (a server):
/// let _ = backend_cpu::return_large_frees_to_os(1 << 20);
/// ```
pub fn return_large_frees_to_os(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    {
        i32::try_from(bytes).is_ok_and(|b| b <= 32 << 20 && glibc::fixed_mmap_threshold(b))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    {
        let _ = bytes;
        false
    }
}

/// Let the threads of this process share at most `n` allocator arenas (`n >= 1`), so that
/// free memory collects where [`release_free_memory`] can return it. Call it before threads
/// start. Returns whether the setting was taken.
///
/// ```
/// let _ = backend_cpu::limit_heap_arenas(2);
/// ```
pub fn limit_heap_arenas(n: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    {
        i32::try_from(n).is_ok_and(|n| n >= 1 && glibc::arena_max(n))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    {
        let _ = n;
        false
    }
}

/// Hand the free pages of every allocator arena back to the kernel (`malloc_trim(0)`); worth
/// calling after a large amount of memory was freed, e.g. when a client went away. Returns
/// whether anything was released.
///
/// ```
/// let _released = backend_cpu::release_free_memory();
/// ```
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    {
        glibc::trim()
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn settings_are_total() {
        // Out of range: refused without calling the allocator.
        assert!(!super::return_large_frees_to_os(usize::MAX));
        assert!(!super::return_large_frees_to_os(64 << 20));
        assert!(!super::limit_heap_arenas(0));
        let _ = super::release_free_memory();
    }
}
