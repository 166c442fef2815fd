//! Caller-owned host memory that a buffer can be placed over.

use std::fmt;
use std::sync::Arc;

/// Host memory owned by someone else (a memory-mapped file, a `Vec`), shared with a buffer.
/// The buffer keeps it alive and never frees it; the owner's `Drop` does, after the last
/// buffer and tensor using it are gone.
#[derive(Clone)]
pub enum HostMemory {
    /// Memory the backend may only read (e.g. a read-only `memmap2::Mmap`); writes through the
    /// buffer are refused with an error.
    ReadOnly(Arc<dyn AsRef<[u8]> + Send + Sync>),
    /// Memory the backend may read and write. The mutex-free access is sound because the
    /// buffer becomes the only user of the bytes while it lives.
    ReadWrite(Arc<parking_lot::Mutex<Box<dyn AsMut<[u8]> + Send>>>),
}

impl HostMemory {
    /// Read-only memory from anything that derefs to bytes.
    pub fn read_only(mem: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        HostMemory::ReadOnly(Arc::new(mem))
    }

    /// Writable memory from anything that derefs mutably to bytes.
    pub fn read_write(mem: impl AsMut<[u8]> + Send + 'static) -> Self {
        HostMemory::ReadWrite(Arc::new(parking_lot::Mutex::new(Box::new(mem))))
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMemory::ReadOnly(m) => {
                write!(f, "HostMemory::ReadOnly({} bytes)", (**m).as_ref().len())
            }
            HostMemory::ReadWrite(_) => write!(f, "HostMemory::ReadWrite"),
        }
    }
}
