//! Backend indices without sentinels.
//!
//! The seed keeps backend ids as `int` with `-1` for "none" and writes them into every
//! per-tensor table. Here an index is a [`BackendId`], "maybe an index" is a
//! [`PackedBackend`] (an `Option<BackendId>` that takes no more room than the index, because
//! the per-tensor table and the dense per-node lists hold one per entry and are read in the
//! hottest loops), and the one other note the phases pass on, whether a compute node is
//! settled on one backend with all its sources, has its own type, [`Settled`], so that it
//! cannot be mistaken for "no backend".
//!
//! The index is a `u32`, as wide as the seed's `int`: the per-tensor slot has the same size
//! with a narrower one, and 32-bit values need no widening where the sweeps compare and
//! index with them.

use std::fmt;

use super::MAX_BACKENDS;

/// Index of one of a scheduler's backends, in priority order (below [`MAX_BACKENDS`]); the
/// default is the first backend.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BackendId(u32);

// an index and its packed options must be able to name every backend and keep one value free
const _: () = assert!(MAX_BACKENDS < u32::MAX as usize - 1);

impl BackendId {
    /// The backend at position `i`; `i` is below the scheduler's number of backends at every
    /// call (checked at creation and by `set_tensor_backend`).
    #[inline(always)]
    pub(crate) fn new(i: usize) -> BackendId {
        debug_assert!(i < MAX_BACKENDS);
        BackendId(i as u32)
    }

    /// The position of this backend in the scheduler's lists.
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// `Option<BackendId>` in the room of one [`BackendId`] (cranelift-entity's `PackedOption`
/// idea): the all-ones value is "none", which no backend index reaches.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PackedBackend(u32);

impl PackedBackend {
    /// No backend.
    pub(crate) const NONE: PackedBackend = PackedBackend(u32::MAX);

    /// Backend `b`.
    #[inline(always)]
    pub(crate) fn some(b: BackendId) -> PackedBackend {
        PackedBackend(b.0)
    }

    /// The backend, if any.
    #[inline(always)]
    pub(crate) fn get(self) -> Option<BackendId> {
        (self != Self::NONE).then_some(BackendId(self.0))
    }

    #[inline(always)]
    pub(crate) fn is_none(self) -> bool {
        self == Self::NONE
    }

    #[inline(always)]
    pub(crate) fn is_some(self) -> bool {
        self != Self::NONE
    }

    /// Whether this is a backend below position `n` (one compare: "none" is above every
    /// position).
    #[inline(always)]
    pub(crate) fn is_below(self, n: usize) -> bool {
        (self.0 as usize) < n
    }
}

/// No backend.
impl Default for PackedBackend {
    fn default() -> PackedBackend {
        PackedBackend::NONE
    }
}

impl From<BackendId> for PackedBackend {
    #[inline(always)]
    fn from(b: BackendId) -> PackedBackend {
        PackedBackend::some(b)
    }
}

impl From<Option<BackendId>> for PackedBackend {
    #[inline(always)]
    fn from(b: Option<BackendId>) -> PackedBackend {
        b.map_or(PackedBackend::NONE, PackedBackend::some)
    }
}

impl PartialEq<BackendId> for PackedBackend {
    #[inline(always)]
    fn eq(&self, b: &BackendId) -> bool {
        self.0 == b.0
    }
}

impl fmt::Debug for PackedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// The note the assignment phase leaves the splitting phase on one compute node: the backend
/// it and every one of its sources are settled on, or [`Settled::UNSETTLED`]. A settled node
/// needs no source check and no copy when there is one pipeline copy.
///
/// Its own type, not a [`PackedBackend`]: "unsettled" says nothing about whether the node has
/// a backend (it usually has one; a source does not, or is elsewhere).
#[derive(Copy, Clone, PartialEq, Eq)]
pub(crate) struct Settled(u32);

const _: () = assert!(Settled::UNSETTLED.0 == PackedBackend::NONE.0);

impl Settled {
    /// The node or one of its sources is on another backend, or without one.
    pub(crate) const UNSETTLED: Settled = Settled(u32::MAX);

    /// Settled on the backend of `cur` when `settled`, else unsettled; a `cur` without a
    /// backend is unsettled either way.
    #[inline(always)]
    pub(crate) fn when(settled: bool, cur: PackedBackend) -> Settled {
        // "none" and "unsettled" share the all-ones value, so `cur` needs no unpacking
        if settled {
            Settled(cur.0)
        } else {
            Self::UNSETTLED
        }
    }

    /// The backend the node and its sources are settled on, if they are.
    #[inline(always)]
    pub(crate) fn backend(self) -> Option<BackendId> {
        (self != Self::UNSETTLED).then_some(BackendId(self.0))
    }
}

impl fmt::Debug for Settled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backend() {
            Some(b) => write!(f, "Settled({})", b.index()),
            None => f.write_str("Unsettled"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_backend_round_trips_and_stays_small() {
        assert_eq!(size_of::<PackedBackend>(), size_of::<BackendId>());
        for i in 0..MAX_BACKENDS {
            let b = BackendId::new(i);
            assert_eq!(PackedBackend::some(b).get(), Some(b));
            assert!(PackedBackend::some(b).is_below(i + 1));
            assert!(!PackedBackend::some(b).is_below(i));
        }
        assert_eq!(PackedBackend::NONE.get(), None);
        assert!(!PackedBackend::NONE.is_below(MAX_BACKENDS));
        assert_eq!(PackedBackend::from(None), PackedBackend::NONE);
    }

    #[test]
    fn settled_is_not_none() {
        let b = BackendId::new(3);
        assert_eq!(Settled::when(true, b.into()).backend(), Some(b));
        assert_eq!(Settled::UNSETTLED.backend(), None);
        assert_eq!(format!("{:?}", Settled::UNSETTLED), "Unsettled");
        assert_eq!(Settled::when(false, b.into()), Settled::UNSETTLED);
        assert_eq!(Settled::when(true, PackedBackend::NONE), Settled::UNSETTLED);
    }
}
