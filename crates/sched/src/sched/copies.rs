//! Input copies (a tensor a split reads from memory its backend cannot use), pipeline copies
//! of graph inputs, and the rewrites that point the graph's sources at them while the
//! allocator and the backends look.

use std::fmt::Write as _;

use graph::{Context, TensorFlags, TensorId, TensorName};

use super::backend_id::{BackendId, PackedBackend};
use super::table::NO_COPIES;
use super::{Cause, MAX_SPLIT_INPUTS, Result, Scheduler};
use crate::error::SchedError;

/// A source slot pointed at an input copy while the allocator and backends run.
#[derive(Copy, Clone, Debug)]
pub(super) struct Rewrite {
    pub(super) node: TensorId,
    pub(super) slot: u8,
    pub(super) original: TensorId,
    /// The backend the copy lives on (the split's), where the other pipeline copies of
    /// `original` are found.
    pub(super) backend: BackendId,
    /// The copy of pipeline copy [`Rewrites::made_for`].
    pub(super) copy: TensorId,
}

/// The copies of the last plan: per tensor with copies, one block of `n_backends · n_copies`
/// entries (the tensor's slot names its block), and the graph inputs given per-pipeline-copy
/// storage.
#[derive(Debug)]
pub(super) struct Copies {
    /// The plan the blocks belong to: copies live only until the next plan, which makes them
    /// again in the caller's context (0 is never current).
    pub(super) epoch: u32,
    pub(super) blocks: Vec<Option<TensorId>>,
    pub(super) graph_inputs: Vec<TensorId>,
}

impl Default for Copies {
    fn default() -> Copies {
        Copies {
            epoch: 1,
            blocks: Vec::new(),
            graph_inputs: Vec::new(),
        }
    }
}

/// The rewrites of the caller's graph the last plan made, and whether they are applied now.
///
/// A plan records each rewrite with the copy of the pipeline copy current when it was made;
/// a later compute of the same plan applies them with its own pipeline copy's copies (every
/// pipeline copy of an input has its own allocated tensor), so that alternating copies needs
/// no new plan.
#[derive(Debug, Default)]
pub(super) struct Rewrites {
    pub(super) list: Vec<Rewrite>,
    pub(super) applied: bool,
    /// The pipeline copy whose copies the recorded `copy` fields are.
    pub(super) made_for: usize,
    /// The pipeline copy the applied sources point at (meaningful while `applied`).
    pub(super) applied_copy: usize,
}

impl Scheduler {
    /// Position of backend `b`'s pipeline copy `c` in a tensor's block of the copy table.
    pub(super) fn copy_index(&self, b: usize, c: usize) -> usize {
        b * self.pipeline.n_copies + c
    }

    /// The copy table holds one block of `n_backends · n_copies` entries per tensor with
    /// copies; `b < n_backends` and `c < n_copies` at every call (backends of slots, split
    /// backends, checked in `tensor_copy`), and `s.copies` names a block of this copy epoch
    /// (the table is cleared whenever the epoch moves on).
    pub(super) fn get_copy(&self, t: TensorId, b: usize, c: usize) -> Option<TensorId> {
        let s = self.slot(t)?;
        if s.copies == NO_COPIES || s.copies_epoch != self.copies.epoch {
            return None;
        }
        let per = self.backends.len() * self.pipeline.n_copies;
        self.copies.blocks[s.copies as usize * per + self.copy_index(b, c)]
    }

    pub(super) fn set_copy(&mut self, t: TensorId, b: usize, c: usize, copy: TensorId) {
        let per = self.backends.len() * self.pipeline.n_copies;
        let k = self.copy_index(b, c);
        let copy_epoch = self.copies.epoch;
        let block = {
            let s = self.slot_mut(t);
            if s.copies_epoch != copy_epoch {
                s.copies = NO_COPIES;
            }
            s.copies
        };
        let block = if block == NO_COPIES {
            let nb = (self.copies.blocks.len() / per) as u32;
            self.copies
                .blocks
                .resize(self.copies.blocks.len() + per, None);
            let s = self.slot_mut(t);
            s.copies = nb;
            s.copies_epoch = copy_epoch;
            nb
        } else {
            block
        };
        self.copies.blocks[block as usize * per + k] = Some(copy);
    }

    /// The copy of `t` for backend `b` and pipeline copy `c`, if the last split made one.
    pub fn tensor_copy(&self, t: TensorId, b: usize, c: usize) -> Option<TensorId> {
        if b >= self.backends.len() || c >= self.pipeline.n_copies {
            return None;
        }
        self.get_copy(t, b, c)
    }

    // ---- rewrites of the caller's graph ----

    /// The copy rewrite `r` points its slot at for pipeline copy `c`.
    fn rewrite_target(&self, r: &Rewrite, c: usize) -> TensorId {
        if c == self.rewrites.made_for {
            return r.copy;
        }
        // invariant: a rewrite is recorded only after copies of its source for every pipeline
        // copy were made, and the rewrites and the copy table are replaced together (by the
        // next plan); `reset` clears the table but also the allocation, so nothing applies
        // these rewrites again before a new plan replaces them
        self.get_copy(r.original, r.backend.index(), c)
            .expect("a rewritten source has copies for every pipeline copy")
    }

    /// Point the rewritten source slots at the input copies of the current pipeline copy.
    pub(super) fn apply_rewrites(&mut self, ctx: &mut Context) {
        let c = self.pipeline.cur_copy;
        if self.rewrites.applied {
            if self.rewrites.applied_copy == c {
                return;
            }
            self.restore_rewrites(ctx);
        }
        for r in &self.rewrites.list {
            let copy = self.rewrite_target(r, c);
            let _ = ctx.set_src(r.node, r.slot as usize, Some(copy));
        }
        self.rewrites.applied = true;
        self.rewrites.applied_copy = c;
    }

    pub(super) fn restore_rewrites(&mut self, ctx: &mut Context) {
        if !self.rewrites.applied {
            return;
        }
        let c = self.rewrites.applied_copy;
        for r in self.rewrites.list.iter().rev() {
            let copy = self.rewrite_target(r, c);
            // A node the caller has rewound away is skipped (set_src checks liveness).
            if ctx
                .get(r.node)
                .is_ok_and(|t| t.src(r.slot as usize) == Some(copy))
            {
                let _ = ctx.set_src(r.node, r.slot as usize, Some(r.original));
            }
        }
        self.rewrites.applied = false;
    }

    /// The source the allocator and backends see in slot `j` of `node` (the input copy where
    /// the last split made one).
    pub fn effective_src(&self, ctx: &Context, node: TensorId, j: usize) -> Option<TensorId> {
        let s = ctx.get(node).ok()?.src(j)?;
        if self.rewrites.applied {
            return Some(s);
        }
        self.rewrites
            .list
            .iter()
            .find(|r| r.node == node && r.slot as usize == j && r.original == s)
            .map_or(Some(s), |r| Some(r.copy))
    }

    pub(super) fn make_copy(
        &mut self,
        ctx: &mut Context,
        src: TensorId,
        backend: usize,
        c: usize,
    ) -> Result<TensorId> {
        let copy = ctx.new_tensor_same_layout(src)?;
        let mut name = TensorName::EMPTY;
        let _ = write!(
            name,
            "{}#{}#{}",
            self.backends[backend].name(),
            ctx[src].name(),
            c
        );
        ctx.set_name(copy, name.as_str())?;
        self.set_bid(copy, PackedBackend::NONE, Cause::Copy);
        Ok(copy)
    }

    /// Make the copies node `node`, in split `i_split` on backend `cur`, needs of its sources
    /// `srcs` (the seed's pass 5 inner loop): with pipeline copies, per-copy storage for each
    /// graph input not seen before; for each source in memory `cur` cannot use, one copy per
    /// pipeline copy (registered as an input of the split) and a rewrite of the node's source
    /// slot to the current pipeline copy's.
    pub(super) fn copy_inputs(
        &mut self,
        ctx: &mut Context,
        node: TensorId,
        srcs: &[Option<TensorId>],
        i_split: usize,
        cur: BackendId,
    ) -> Result<()> {
        for (j, s) in srcs.iter().enumerate() {
            let Some(src) = *s else { continue };
            let sb = self.bid(src);
            if self.pipeline.n_copies > 1
                && ctx.get(src)?.flags().contains(TensorFlags::INPUT)
                && let Some(sbi) = sb.get().map(BackendId::index)
                && self.get_copy(src, sbi, 0).is_none()
            {
                for c in 0..self.pipeline.n_copies {
                    let copy = if c == self.pipeline.cur_copy {
                        src
                    } else {
                        self.make_copy(ctx, src, sbi, c)?
                    };
                    ctx.set_input(copy)?;
                    ctx.set_output(copy)?;
                    self.set_copy(src, sbi, c, copy);
                }
                if self.options.strict && self.copies.graph_inputs.len() >= MAX_SPLIT_INPUTS {
                    return Err(SchedError::TooManyGraphInputs {
                        limit: MAX_SPLIT_INPUTS,
                    });
                }
                self.copies.graph_inputs.push(src);
            }

            if sb != cur && !self.buffer_supported(ctx, src, cur.index()) {
                let cu = cur.index();
                if self.get_copy(src, cu, 0).is_none() {
                    for c in 0..self.pipeline.n_copies {
                        let copy = self.make_copy(ctx, src, cu, c)?;
                        if self.pipeline.n_copies > 1 {
                            ctx.set_input(copy)?;
                            ctx.set_output(copy)?;
                        }
                        self.set_copy(src, cu, c, copy);
                    }
                    if self.options.strict
                        && self.splits.list[i_split].inputs.len() >= MAX_SPLIT_INPUTS
                    {
                        return Err(SchedError::TooManySplitInputs {
                            split: i_split,
                            limit: MAX_SPLIT_INPUTS,
                        });
                    }
                    self.splits.list[i_split].inputs.push(src);
                }
                let copy = self
                    .get_copy(src, cu, self.pipeline.cur_copy)
                    // invariant: the loop above made copies for every pipeline copy
                    .expect("copies for every pipeline copy were just made");
                ctx.set_src(node, j, Some(copy))?;
                self.rewrites.applied = true;
                self.rewrites.applied_copy = self.pipeline.cur_copy;
                self.rewrites.list.push(Rewrite {
                    node,
                    slot: j as u8,
                    original: src,
                    backend: cur,
                    copy,
                });
            }
        }
        Ok(())
    }
}
