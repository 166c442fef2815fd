//! Which buffer type a model weight should live in: a device's extra buffer types
//! ([`Device::extra_buffer_types`]), tried in order, each accepted only if the device computes
//! the op that uses the weight with the weight placed there.
//!
//! Why a probe instead of a list of types: whether a weight gains from a device's own layout
//! depends on its type, its shape and the op that reads it (the CPU's `CPU_REPACK` takes q4_0
//! matrices with a multiple of 16 rows, read by MUL_MAT, and nothing else), and only the
//! device knows that. llama.cpp asks the same question the same way (`select_weight_buft`: the
//! weight in an empty buffer of the candidate type, then `ggml_backend_dev_supports_op` on the
//! op), so a device that answers its `supports_op` truthfully for tensors in its extra buffer
//! types gets the same placement from both. Engines keep an opt-out (llama.cpp's
//! `--no-repack`, `use_extra_bufts = false`): [`WeightBufferTypes::new`] with `use_extra`
//! false selects nothing.

use graph::{Context, TensorId};

use crate::buffer::{Buffer, BufferType};
use crate::device::Device;
use crate::error::{BackendError, Result};

/// A device's extra buffer types, each with an empty buffer to probe placements with.
///
/// ```
/// use backend_core::WeightBufferTypes;
/// use graph::{Context, ElementType};
///
/// let cpu = backend_cpu::cpu_device();
/// let extra = WeightBufferTypes::new(&cpu, true);
/// let mut ctx = Context::new();
/// let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 32)?; // a q4_0 matrix of 32 rows
/// let x = ctx.new_tensor_2d(ElementType::F32, 64, 1)?;
/// let y = ctx.mul_mat(w, x)?;
/// let buft = extra.select(&mut ctx, w, &[y])?;
/// assert_eq!(buft.map(|b| b.name().to_owned()).as_deref(), Some("CPU_REPACK"));
/// // Read by another op, or with the opt-out, it stays in ordinary memory.
/// let ids = ctx.new_tensor_1d(ElementType::I32, 1)?;
/// let rows = ctx.get_rows(w, ids)?;
/// assert!(extra.select(&mut ctx, w, &[y, rows])?.is_none());
/// assert!(WeightBufferTypes::new(&cpu, false).select(&mut ctx, w, &[y])?.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct WeightBufferTypes {
    device: Device,
    candidates: Vec<(BufferType, Buffer)>,
}

impl WeightBufferTypes {
    /// The extra buffer types of `device` in its order, or none when `use_extra` is false. A
    /// type whose empty buffer cannot be allocated is left out (logged).
    pub fn new(device: &Device, use_extra: bool) -> Self {
        let types = if use_extra {
            device.extra_buffer_types()
        } else {
            Vec::new()
        };
        let candidates = types
            .into_iter()
            .filter_map(|buft| match buft.alloc_buffer(0) {
                Ok(probe) => Some((buft, probe)),
                Err(e) => {
                    tracing::warn!(buffer_type = buft.name(), error = %e,
                        "extra buffer type left out: no empty buffer to probe with");
                    None
                }
            })
            .collect();
        WeightBufferTypes {
            device: device.clone(),
            candidates,
        }
    }

    /// The extra buffer types considered, in order.
    pub fn types(&self) -> impl Iterator<Item = &BufferType> {
        self.candidates.iter().map(|(b, _)| b)
    }

    /// The first extra buffer type in which the device computes every op of `uses` (nodes
    /// that read `weight`, which is not placed yet) with `weight` stored there, or `None`
    /// (also for no uses): the weight then belongs in the device's ordinary memory (for the
    /// CPU, in place in a mapped file). `weight` is left unplaced.
    /// [`BackendError::AlreadyAllocated`] if it has storage or is a view.
    pub fn select(
        &self,
        ctx: &mut Context,
        weight: TensorId,
        uses: &[TensorId],
    ) -> Result<Option<BufferType>> {
        let t = ctx.get(weight)?;
        if t.has_storage() || t.is_view() {
            return Err(BackendError::AlreadyAllocated(weight));
        }
        for &op in uses {
            ctx.get(op)?;
        }
        if uses.is_empty() {
            return Ok(None);
        }
        for (buft, probe) in &self.candidates {
            ctx.get_mut(weight)?.set_storage(Some(probe.storage_at(0)));
            let ok = uses.iter().all(|&op| self.device.supports_op(ctx, op));
            ctx.get_mut(weight)?.set_storage(None);
            if ok {
                return Ok(Some(buft.clone()));
            }
        }
        Ok(None)
    }
}
