//! The measuring allocator behind each buffer type of the graph allocator (ggml's
//! `dyn_tallocr`).
//!
//! It hands out offsets in a virtual range `[0, usize::MAX / 2)` and remembers the highest
//! end it ever gave out; that high-water mark is the size the real buffer must have. Free
//! space is a list of blocks sorted by offset. The rules are ggml's exactly (best fit among
//! every block but the unbounded tail, ties to the later block, merge with both neighbours on
//! free) because the offsets it produces are observable and must match the reference; the one
//! difference is that the block list grows instead of aborting at 256 entries.

use crate::error::AllocError;
use crate::pad;

/// Size of the virtual range: half the address space, so that offset + size never overflows.
pub(crate) const VIRTUAL_SIZE: usize = usize::MAX / 2;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct FreeBlock {
    pub(crate) offset: usize,
    pub(crate) size: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct DynAllocator {
    alignment: usize,
    blocks: Vec<FreeBlock>,
    max_size: usize,
}

impl DynAllocator {
    pub(crate) fn new(alignment: usize) -> Self {
        let mut a = DynAllocator {
            alignment: alignment.max(1),
            blocks: Vec::with_capacity(16),
            max_size: 0,
        };
        a.reset();
        a
    }

    /// One free block covering the whole virtual range; high-water mark 0. Keeps capacity.
    pub(crate) fn reset(&mut self) {
        self.blocks.clear();
        self.blocks.push(FreeBlock {
            offset: 0,
            size: VIRTUAL_SIZE,
        });
        self.max_size = 0;
    }

    /// The high-water mark: the size a buffer must have to hold every offset given out.
    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    #[cfg(test)]
    pub(crate) fn blocks(&self) -> &[FreeBlock] {
        &self.blocks
    }

    /// Take `size` bytes (padded to the alignment); returns their offset.
    #[inline]
    pub(crate) fn alloc(&mut self, size: usize) -> Result<usize, AllocError> {
        let size = pad(size, self.alignment).ok_or(AllocError::AddressSpaceExhausted { size })?;
        let n = self.blocks.len();
        if n == 0 {
            return Err(AllocError::AddressSpaceExhausted { size });
        }
        // Best fit among every block but the last; "<=" sends ties to the later block.
        let mut best = None;
        let mut best_size = usize::MAX;
        for (i, b) in self.blocks[..n - 1].iter().enumerate() {
            if b.size >= size && b.size <= best_size {
                best = Some(i);
                best_size = b.size;
            }
        }
        let i = match best {
            Some(i) => i,
            None if self.blocks[n - 1].size >= size => n - 1,
            None => return Err(AllocError::AddressSpaceExhausted { size }),
        };
        let block = &mut self.blocks[i];
        let offset = block.offset;
        block.offset += size;
        block.size -= size;
        if block.size == 0 {
            self.blocks.remove(i);
        }
        self.max_size = self.max_size.max(offset + size);
        Ok(offset)
    }

    /// Give back `size` bytes (padded to the alignment) at `offset`, merging with neighbours.
    #[inline]
    pub(crate) fn free(&mut self, offset: usize, size: usize) {
        // A size that could not have been allocated cannot be freed either; ignore it.
        let Some(size) = pad(size, self.alignment) else {
            return;
        };
        for i in 0..self.blocks.len() {
            let b = self.blocks[i];
            if b.offset + b.size == offset {
                self.blocks[i].size += size;
                if i + 1 < self.blocks.len() {
                    let next = self.blocks[i + 1];
                    if self.blocks[i].offset + self.blocks[i].size == next.offset {
                        self.blocks[i].size += next.size;
                        self.blocks.remove(i + 1);
                    }
                }
                return;
            }
            if offset + size == b.offset {
                self.blocks[i].offset = offset;
                self.blocks[i].size += size;
                if i > 0 {
                    let prev = self.blocks[i - 1];
                    if prev.offset + prev.size == offset {
                        self.blocks[i - 1].size += self.blocks[i].size;
                        self.blocks.remove(i);
                    }
                }
                return;
            }
        }
        let pos = self
            .blocks
            .iter()
            .position(|b| b.offset >= offset)
            .unwrap_or(self.blocks.len());
        self.blocks.insert(pos, FreeBlock { offset, size });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb(offset: usize, size: usize) -> FreeBlock {
        FreeBlock { offset, size }
    }

    #[test]
    fn pads_and_tracks_high_water_mark() {
        let mut a = DynAllocator::new(32);
        assert_eq!(a.alloc(400).unwrap(), 0);
        assert_eq!(a.alloc(1).unwrap(), 416);
        assert_eq!(a.max_size(), 448);
        a.free(0, 400);
        assert_eq!(a.max_size(), 448, "frees never lower the mark");
        assert_eq!(a.blocks(), &[fb(0, 416), fb(448, VIRTUAL_SIZE - 448)]);
    }

    #[test]
    fn best_fit_ties_go_to_the_later_block_and_tail_is_last_resort() {
        let mut a = DynAllocator::new(32);
        let o: Vec<usize> = (0..5).map(|_| a.alloc(64).unwrap()).collect();
        assert_eq!(o, [0, 64, 128, 192, 256]);
        a.free(0, 64); // hole [0,64)
        a.free(128, 64); // hole [128,192)
        // two equal holes: the later one wins
        assert_eq!(a.alloc(64).unwrap(), 128);
        // a request bigger than any hole goes to the tail
        assert_eq!(a.alloc(96).unwrap(), 320);
        // the remaining hole is used before the tail
        assert_eq!(a.alloc(32).unwrap(), 0);
        assert_eq!(a.blocks(), &[fb(32, 32), fb(416, VIRTUAL_SIZE - 416)]);
    }

    #[test]
    fn smallest_sufficient_hole_wins() {
        let mut a = DynAllocator::new(32);
        for _ in 0..6 {
            a.alloc(32).unwrap();
        }
        a.free(0, 32); // [0,32)
        a.free(64, 64); // [64,128)
        assert_eq!(a.blocks()[..2], [fb(0, 32), fb(64, 64)]);
        assert_eq!(a.alloc(32).unwrap(), 0);
    }

    #[test]
    fn free_merges_with_both_neighbours() {
        let mut a = DynAllocator::new(32);
        for _ in 0..4 {
            a.alloc(32).unwrap();
        }
        a.free(0, 32);
        a.free(64, 32);
        assert_eq!(a.blocks().len(), 3);
        a.free(32, 32); // joins [0,32) and [64,96)
        assert_eq!(a.blocks()[0], fb(0, 96));
        a.free(96, 32); // joins the tail
        assert_eq!(a.blocks(), &[fb(0, VIRTUAL_SIZE)]);
    }

    #[test]
    fn no_cap_on_free_blocks() {
        let mut a = DynAllocator::new(1);
        let n = 1000;
        for _ in 0..2 * n {
            a.alloc(1).unwrap();
        }
        for i in 0..n {
            a.free(2 * i, 1);
        }
        assert_eq!(a.blocks().len(), n + 1);
    }

    #[test]
    fn oversized_requests_are_errors() {
        let mut a = DynAllocator::new(32);
        assert!(matches!(
            a.alloc(usize::MAX),
            Err(AllocError::AddressSpaceExhausted { .. })
        ));
        assert!(matches!(
            a.alloc(VIRTUAL_SIZE),
            Err(AllocError::AddressSpaceExhausted { .. })
        ));
        assert_eq!(a.alloc(32).unwrap(), 0, "still usable");
    }

    #[test]
    fn zero_size_requests_take_no_space() {
        let mut a = DynAllocator::new(32);
        assert_eq!(a.alloc(0).unwrap(), 0);
        assert_eq!(a.alloc(0).unwrap(), 0);
        assert_eq!(a.max_size(), 0);
        assert_eq!(a.alloc(5).unwrap(), 0);
    }
}
