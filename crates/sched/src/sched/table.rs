//! The per-tensor table: each tensor's backend, the rule that chose it, and where its input
//! copies are, in a direct-address table indexed by [`TensorId::index`] and stamped with an
//! epoch, so that `reset` is O(1), the table grows with the context instead of aborting, and
//! nothing on the per-step path allocates once it has grown.

use graph::{Context, TensorId};

use super::backend_id::{BackendId, PackedBackend};
use super::{Cause, Result, Scheduler};
use crate::error::SchedError;

pub(super) const NO_COPIES: u32 = u32::MAX;

/// Per-tensor state, valid when `key` is `(epoch << 32) | generation` of the tensor asked
/// about (an index reused after a context rewind carries another generation; epochs start at
/// 1, so the empty key 0 never matches).
#[derive(Copy, Clone, Debug, Default)]
pub(super) struct Slot {
    pub(super) key: u64,
    /// None or an index of the scheduler's backends: every writer gives one (the phases take
    /// them from the device list, `set_tensor_backend` checks the caller's), which is what
    /// indexing `backends`, `devices`, `bufts` and `caps.buft_devices` by a backend relies
    /// on.
    pub(super) backend: PackedBackend,
    pub(super) cause: Cause,
    /// Index of this tensor's block in the copy table, or `NO_COPIES`.
    pub(super) copies: u32,
    /// The split the copies belong to: copies live only until the next split, which makes
    /// them again in the caller's context.
    pub(super) copies_epoch: u32,
}

impl Slot {
    /// The key of `t`'s slot in the epoch whose key bits are `key_hi` (`epoch << 32`).
    #[inline(always)]
    pub(super) fn key_of(key_hi: u64, t: TensorId) -> u64 {
        key_hi | u64::from(t.generation())
    }

    /// A slot for the tensor with `key`, with no backend and no copies.
    #[inline(always)]
    pub(super) fn fresh(key: u64) -> Slot {
        Slot {
            key,
            backend: PackedBackend::NONE,
            cause: Cause::None,
            copies: NO_COPIES,
            copies_epoch: 0,
        }
    }

    /// Make `slots` hold index `i` (doubling, so growth is amortised).
    #[inline(always)]
    pub(super) fn reserve_index(slots: &mut Vec<Slot>, i: usize) {
        if i >= slots.len() {
            let want = (i + 1).max(slots.len() * 2);
            slots.resize(want, Slot::default());
        }
    }

    /// The slot of `t` in `slots`, made fresh when it is not current; `slots` must hold
    /// `t`'s index ([`Slot::reserve_index`]).
    #[inline(always)]
    pub(super) fn current_in(slots: &mut [Slot], key_hi: u64, t: TensorId) -> &mut Slot {
        let key = Self::key_of(key_hi, t);
        let s = &mut slots[t.index()];
        if s.key != key {
            *s = Self::fresh(key);
        }
        s
    }

    /// Give `t` backend `b` by `cause` in `slots`, which must hold `t`'s index.
    #[inline(always)]
    pub(super) fn set_in(
        slots: &mut [Slot],
        key_hi: u64,
        t: TensorId,
        b: PackedBackend,
        cause: Cause,
    ) {
        let s = Self::current_in(slots, key_hi, t);
        s.backend = b;
        s.cause = cause;
    }

    /// The backend of `t` in `slots` (none when its slot is not current).
    #[inline(always)]
    pub(super) fn backend_in(slots: &[Slot], key_hi: u64, t: TensorId) -> PackedBackend {
        let key = Self::key_of(key_hi, t);
        slots
            .get(t.index())
            .filter(|s| s.key == key)
            .map_or(PackedBackend::NONE, |s| s.backend)
    }
}

/// The per-tensor table: one [`Slot`] per tensor index, current when stamped with `epoch`.
#[derive(Debug, Default)]
pub(super) struct TensorTable {
    /// The current epoch; `reset` moves it on (0 is never current).
    pub(super) epoch: u32,
    pub(super) slots: Vec<Slot>,
}

impl TensorTable {
    pub(super) fn with_capacity(n: usize) -> TensorTable {
        TensorTable {
            epoch: 0,
            slots: Vec::with_capacity(n),
        }
    }
}

impl Scheduler {
    /// The key bits of the current epoch (see [`Slot`]).
    #[inline]
    pub(super) fn key_hi(&self) -> u64 {
        u64::from(self.table.epoch) << 32
    }

    #[inline]
    pub(super) fn key(&self, t: TensorId) -> u64 {
        Slot::key_of(self.key_hi(), t)
    }

    #[inline]
    pub(super) fn slot(&self, t: TensorId) -> Option<&Slot> {
        let key = self.key(t);
        self.table.slots.get(t.index()).filter(|s| s.key == key)
    }

    pub(super) fn slot_mut(&mut self, t: TensorId) -> &mut Slot {
        Slot::reserve_index(&mut self.table.slots, t.index());
        let key_hi = self.key_hi();
        Slot::current_in(&mut self.table.slots, key_hi, t)
    }

    pub(super) fn bid(&self, t: TensorId) -> PackedBackend {
        self.slot(t).map_or(PackedBackend::NONE, |s| s.backend)
    }

    pub(super) fn bid_opt(&self, t: Option<TensorId>) -> PackedBackend {
        t.map_or(PackedBackend::NONE, |t| self.bid(t))
    }

    pub(super) fn set_bid(&mut self, t: TensorId, b: PackedBackend, cause: Cause) {
        let s = self.slot_mut(t);
        s.backend = b;
        s.cause = cause;
    }

    /// The backend assigned to `t`, if any (`ggml_backend_sched_get_tensor_backend`).
    pub fn tensor_backend(&self, t: TensorId) -> Option<usize> {
        self.bid(t).get().map(BackendId::index)
    }

    /// Which rule assigned `t` its backend.
    pub fn tensor_cause(&self, t: TensorId) -> Cause {
        self.slot(t).map_or(Cause::None, |s| s.cause)
    }

    /// Pin `t` to backend `b` (`ggml_backend_sched_set_tensor_backend`). The assignment is
    /// never overwritten by the phases and lasts until the next [`Scheduler::reset`].
    pub fn set_tensor_backend(&mut self, ctx: &Context, t: TensorId, b: usize) -> Result<()> {
        ctx.get(t)?;
        if b >= self.backends.len() {
            return Err(SchedError::BackendIndex {
                index: b,
                n: self.backends.len(),
            });
        }
        self.set_bid(t, BackendId::new(b).into(), Cause::User);
        self.state.is_reset = false;
        Ok(())
    }

    /// Forget assignments and copies (`ggml_backend_sched_reset`); O(1).
    pub fn reset(&mut self) {
        if !self.state.is_reset {
            self.table.epoch = self.table.epoch.wrapping_add(1);
            if self.table.epoch == 0 {
                self.table
                    .slots
                    .iter_mut()
                    .for_each(|s| *s = Slot::default());
                self.table.epoch = 1;
            }
            self.copies.blocks.clear();
            self.state.is_reset = true;
        }
        self.state.is_alloc = false;
    }
}
