//! What the phases ask of a tensor's buffer: its usage, which devices read its buffer type,
//! and so which backends can use it in place.

use backend_core::{BufferType, BufferUsage, Device, storage_buffer_type, storage_usage};
use graph::{Context, Tensor, TensorId};

use super::Scheduler;
use super::backend_id::{BackendId, PackedBackend};

/// What one buffer tells the phases: its usage and which devices read its buffer type.
///
/// Aligned to a word so that a memo hit reads it with one load.
#[derive(Copy, Clone, Debug, Default)]
#[repr(align(8))]
pub(super) struct BufferFacts {
    /// The buffer is one of ours (it has a buffer type); false for foreign storage.
    pub(super) ours: bool,
    pub(super) usage: Option<BufferUsage>,
    /// Devices (bit = backend index) whose `supports_buft` accepts the buffer type (none for
    /// foreign storage).
    pub(super) devices: u16,
    /// The buffer type is host memory.
    pub(super) host: bool,
}

/// Slots of the buffer memo (direct-mapped by buffer address; a collision only costs a
/// fresh lookup).
pub(super) const MEMO_SLOTS: usize = 64;

/// Per-split memo of [`BufferFacts`] by buffer: a graph's tensors live in a handful of
/// buffers (weights, caches, per-layer buffers), and every pass asks about them, so the
/// downcast to the buffer and the devices' `supports_buft` are paid once per buffer per
/// split instead of once per tensor per question. Cleared at every split: usages can change
/// and a freed buffer's address can be reused between splits; within one split the tensors
/// hold their buffers alive.
///
/// The entries sit inline (no length to check, no pointer to load); key 0 (no buffer's
/// address) marks an empty entry.
#[derive(Debug)]
pub(super) struct BufferMemo {
    pub(super) entries: [(usize, BufferFacts); MEMO_SLOTS],
}

impl Default for BufferMemo {
    fn default() -> Self {
        BufferMemo {
            entries: [(0, BufferFacts::default()); MEMO_SLOTS],
        }
    }
}

impl BufferMemo {
    pub(super) fn clear(&mut self) {
        self.entries = [(0, BufferFacts::default()); MEMO_SLOTS];
    }

    pub(super) fn devices_for(buft: &BufferType, devices: &[Device]) -> u16 {
        let mut mask = 0u16;
        for (i, d) in devices.iter().enumerate() {
            if d.supports_buft(buft) {
                mask |= 1 << i;
            }
        }
        mask
    }

    #[inline(always)]
    pub(super) fn facts(&mut self, st: &graph::TensorStorage, devices: &[Device]) -> BufferFacts {
        let key = std::sync::Arc::as_ptr(&st.buffer).cast::<()>() as usize;
        // (key >> 6 ^ key >> 12), one shift fewer
        let k = ((key ^ key >> 6) >> 6) % MEMO_SLOTS;
        let (ek, ef) = self.entries[k];
        if ek == key {
            return ef;
        }
        self.miss(st, devices, key, k)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn miss(
        &mut self,
        st: &graph::TensorStorage,
        devices: &[Device],
        key: usize,
        k: usize,
    ) -> BufferFacts {
        let facts = match storage_buffer_type(st) {
            Some(buft) => BufferFacts {
                ours: true,
                usage: storage_usage(st),
                devices: Self::devices_for(buft, devices),
                host: buft.is_host(),
            },
            None => BufferFacts::default(),
        };
        self.entries[k] = (key, facts);
        facts
    }
}

/// What the devices make of the buffer types: fixed at creation, plus the per-plan memo of
/// the buffers seen.
#[derive(Debug)]
pub(super) struct Capabilities {
    /// Per split: what each buffer seen says (usage, buffer type's device support).
    pub(super) memo: BufferMemo,
    /// Devices (bit = backend index) whose `supports_buft` accepts backend `i`'s compute
    /// buffer type; asked once at creation.
    pub(super) buft_devices: Vec<u16>,
    /// Per backend: whether a higher-priority backend has the same compute buffer type (only
    /// then can [`Scheduler::assign_best_or_upgrade`] upgrade a node).
    pub(super) upgradable: Vec<bool>,
}

impl Capabilities {
    pub(super) fn new(devices: &[Device], bufts: &[BufferType]) -> Capabilities {
        Capabilities {
            memo: BufferMemo::default(),
            buft_devices: bufts
                .iter()
                .map(|buft| BufferMemo::devices_for(buft, devices))
                .collect(),
            upgradable: (0..bufts.len())
                .map(|b| bufts[..b].contains(&bufts[b]))
                .collect(),
        }
    }
}

impl Scheduler {
    /// The storage whose buffer decides for `t`: its view root's, else its own.
    pub(super) fn root_storage<'a>(
        ctx: &'a Context,
        t: &'a Tensor,
    ) -> Option<&'a graph::TensorStorage> {
        match t.view_src() {
            Some(r) => ctx.get(r).ok().and_then(Tensor::storage),
            None => t.storage(),
        }
    }

    /// ggml's `tensor->buffer` of a source: a view only gets one from `view_init`, which runs
    /// when the graph allocator places it, so a view freshly made in a graph has none.
    #[inline(always)]
    pub(super) fn own_storage(t: &Tensor) -> Option<&graph::TensorStorage> {
        // storage first: most sources without a buffer are no views either
        t.storage().filter(|_| t.view_src().is_none())
    }

    /// What the buffer behind `st` tells the phases, from the per-split memo.
    #[inline]
    pub(super) fn buffer_facts(&mut self, st: &graph::TensorStorage) -> BufferFacts {
        self.caps.memo.facts(st, &self.devices)
    }

    /// `ggml_backend_sched_backend_from_buffer` for a buffer the caller already looked up:
    /// the first backend whose device reads the buffer type and runs `op` (`t` only names
    /// the tensor in the log).
    #[inline(always)]
    pub(super) fn backend_from_facts(
        devices: &[Device],
        ctx: &Context,
        facts: BufferFacts,
        st: &graph::TensorStorage,
        t: &Tensor,
        op: TensorId,
    ) -> PackedBackend {
        // foreign storage has no devices (`BufferFacts::default`)
        let mut m = facts.devices;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            if devices[i].supports_op(ctx, op) {
                return BackendId::new(i).into();
            }
            m &= m - 1;
        }
        if facts.ours {
            Self::log_no_backend(st, t);
        }
        PackedBackend::NONE
    }

    #[cold]
    #[inline(never)]
    pub(super) fn log_no_backend(st: &graph::TensorStorage, t: &Tensor) {
        tracing::debug!(
            tensor = t.name(),
            buffer = storage_buffer_type(st).map_or("?", BufferType::name),
            "no backend supports the op with a weight in this buffer type; it will be copied"
        );
    }

    /// `ggml_backend_sched_buffer_supported`.
    pub(super) fn buffer_supported(&mut self, ctx: &Context, t: TensorId, b: usize) -> bool {
        let Ok(tt) = ctx.get(t) else { return false };
        let devices = match Self::root_storage(ctx, tt) {
            Some(st) => self.buffer_facts(st).devices,
            None => {
                let mut id = self.bid(t);
                if id.is_none() {
                    id = self.bid_opt(tt.view_src());
                }
                let Some(id) = id.get() else {
                    return false;
                };
                self.caps.buft_devices[id.index()]
            }
        };
        devices & (1 << b) != 0
    }
}
