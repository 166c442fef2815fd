//! `HostMemory`: the owner stays alive while the memory is shared, is dropped exactly once
//! afterwards, and the address taken at wrap time stays valid (also for inline owners).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::HostMemory;

/// An owner whose `Drop` counts, so a premature or double free is seen.
struct Owner {
    bytes: Vec<u8>,
    drops: Arc<AtomicUsize>,
}
impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}
impl AsMut<[u8]> for Owner {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}
impl Drop for Owner {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn read_only_owner_lives_until_the_last_clone() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = HostMemory::read_only(Owner {
        bytes: vec![1, 2, 3, 4],
        drops: drops.clone(),
    });
    assert_eq!(mem.len(), 4);
    assert!(!mem.is_writable());
    let clone = mem.clone();
    drop(mem);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    // SAFETY: the memory is alive (a clone is held) and 4 bytes long; nothing writes it.
    let seen = unsafe { std::slice::from_raw_parts(clone.as_ptr().as_ptr(), clone.len()) };
    assert_eq!(seen, &[1, 2, 3, 4]);
    drop(clone);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn writable_owner_is_dropped_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = HostMemory::read_write(Owner {
        bytes: vec![0; 8],
        drops: drops.clone(),
    });
    assert!(mem.is_writable());
    assert!(!mem.is_empty());
    let moved = vec![mem.clone(), mem];
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(moved);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn inline_owner_address_survives_moves() {
    // The bytes live inside the owner itself; moving the handle around must not move them.
    let mem = HostMemory::read_write([7u8; 64]);
    let p = mem.as_ptr();
    let boxed = Box::new(mem);
    let again = *boxed;
    assert_eq!(again.as_ptr(), p);
    // SAFETY: 64 writable bytes, alive, accessed by this thread only.
    unsafe { again.as_ptr().as_ptr().add(63).write(9) };
    // SAFETY: as above.
    let last = unsafe { again.as_ptr().as_ptr().add(63).read() };
    assert_eq!(last, 9);
    let empty = HostMemory::read_only(Vec::<u8>::new());
    assert!(empty.is_empty());
}
