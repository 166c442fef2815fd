//! The backend trait layer and the safe handles engines use.
//!
//! A backend crate implements [`BufferTypeImpl`], [`BufferImpl`], [`BackendImpl`],
//! [`DeviceImpl`], optionally [`EventImpl`], and a [`RegistryImpl`] it registers in the
//! [`GlobalRegistry`]. Users hold the cheap, clonable handles [`BufferType`], [`Buffer`],
//! [`Backend`], [`Device`], [`Event`], [`Registry`], whose methods check what the seed asserts
//! and return [`BackendError`] instead of aborting.
//!
//! Optional capabilities are default trait methods that report "unsupported" or fall back the
//! way the seed does (async → sync, copy → staged copy), never feature-gated methods.

mod backend;
mod buffer;
mod device;
mod error;
mod event;
mod host;
pub mod plugin;
pub mod proc;
mod raw;
mod registry;
mod tensor;
mod typed;
mod weights;

pub use backend::{Backend, BackendImpl, ComputeStatus, GraphPlan, Guid};
pub use buffer::{
    AccessGuard, Buffer, BufferImpl, BufferShared, BufferType, BufferTypeImpl, BufferUsage,
    storage_buffer_type, storage_is_writable, storage_usage,
};
pub use device::{Device, DeviceCaps, DeviceImpl, DeviceProps, DeviceType};
pub use error::{BackendError, Result};
pub use event::{Event, EventImpl};
pub use host::HostMemory;
pub use proc::{AbortCallback, BackendFeature, ProcName};
pub use registry::{GlobalRegistry, Registry, RegistryImpl};
pub use tensor::{
    tensor_alloc, tensor_buffer, tensor_copy, tensor_copy_async, tensor_get, tensor_memset,
    tensor_set, view_init,
};
pub use typed::{TensorElement, TensorIoError, tensor_get_vec, tensor_set_slice};
pub use weights::WeightBufferTypes;
