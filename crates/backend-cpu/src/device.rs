//! The CPU device and the CPU registry entry.

use std::any::Any;
use std::sync::Arc;

use backend_core::proc::{self, AbortCallback};
use backend_core::{
    Backend, BackendError, Buffer, BufferType, Device, DeviceCaps, DeviceImpl, DeviceType,
    HostMemory, Registry, RegistryImpl, Result,
};
use graph::{Context, TensorId};

use crate::backend::{CpuBackend, parse_params};

/// Name of the CPU device and of its registry.
pub const CPU_NAME: &str = "CPU";

pub(crate) struct CpuDevice {
    pub(crate) description: String,
}

impl DeviceImpl for CpuDevice {
    fn name(&self) -> &str {
        CPU_NAME
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        system_memory().unwrap_or((0, 0))
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: false,
            host_buffer: false,
            buffer_from_host_memory: true,
            events: false,
        }
    }
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend> {
        let n_threads = parse_params(params)?;
        let b = CpuBackend::with_device(device.clone());
        if let Some(n) = n_threads {
            b.set_n_threads(n);
        }
        Ok(Backend::new(b))
    }
    fn buffer_type(&self) -> BufferType {
        crate::cpu_buffer_type()
    }
    fn extra_buffer_types(&self) -> Vec<BufferType> {
        extra_buffer_types()
    }
    fn buffer_from_host_memory(
        &self,
        memory: HostMemory,
        _max_tensor_size: usize,
    ) -> Result<Buffer> {
        crate::buffer::buffer_from_host_memory(crate::cpu_mapped_buffer_type(), memory)
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        crate::backend::can_compute(ctx, op)
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        buft.is_host() || *buft == crate::cpu_repack_buffer_type()
    }
    fn registry(&self) -> Option<Registry> {
        Some(crate::cpu_registry())
    }
}

/// (available, total) bytes of system memory from `/proc/meminfo`; `None` where that file
/// does not exist or cannot be read (non-Linux systems), in which case the device reports 0.
pub(crate) fn system_memory() -> Option<(usize, usize)> {
    if cfg!(miri) {
        return None; // Miri's isolation forbids reading files; report "unknown".
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

/// Parse `MemAvailable` (falling back to `MemFree`) and `MemTotal`, given in kB.
pub(crate) fn parse_meminfo(text: &str) -> Option<(usize, usize)> {
    let field = |name: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: usize = line[name.len()..]
            .trim_start_matches(':')
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        kb.checked_mul(1024)
    };
    let total = field("MemTotal")?;
    let free = field("MemAvailable").or_else(|| field("MemFree"))?;
    Some((free, total))
}

/// The CPU's model name from `/proc/cpuinfo`, or `"CPU"`.
pub(crate) fn cpu_description() -> String {
    let text = if cfg!(miri) {
        None // Miri's isolation forbids reading files.
    } else {
        std::fs::read_to_string("/proc/cpuinfo").ok()
    };
    text.and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    })
    .filter(|s| !s.is_empty())
    .unwrap_or_else(|| "CPU".to_owned())
}

/// Name of the registry extension that sets a CPU backend's thread count. Its type is
/// [`SetNThreads`].
pub const EXT_SET_N_THREADS: &str = "set_n_threads";

/// The type of the [`EXT_SET_N_THREADS`] extension: set the thread count of a CPU backend;
/// [`BackendError::Unsupported`] for another kind of backend. The same type answers ggml's
/// name [`proc::SET_N_THREADS`].
pub type SetNThreads = proc::SetNThreadsFn;

fn set_n_threads_ext(backend: &Backend, n: usize) -> Result<()> {
    CpuBackend::from_backend(backend)
        .ok_or_else(|| BackendError::unsupported(backend.name(), "CPU thread count"))?
        .set_n_threads(n);
    Ok(())
}

/// Name of the registry extension that lists the CPU device's extra buffer types (ggml's
/// `ggml_backend_dev_get_extra_bufts`): today [`crate::cpu_repack_buffer_type`], the same
/// list as [`backend_core::Device::extra_buffer_types`] of the CPU device. Its type is
/// [`ExtraBufferTypes`].
pub const EXT_EXTRA_BUFFER_TYPES: &str = "dev_get_extra_bufts";

/// The type of the [`EXT_EXTRA_BUFFER_TYPES`] extension.
pub type ExtraBufferTypes = fn() -> Vec<BufferType>;

fn extra_buffer_types() -> Vec<BufferType> {
    vec![crate::cpu_repack_buffer_type()]
}

/// [`proc::DEV_GET_EXTRA_BUFTS`]: the CPU device's extra buffer types; none for another
/// device, which is not the CPU registry's to describe.
fn dev_extra_buffer_types(device: &Device) -> Vec<BufferType> {
    if *device == crate::cpu_device() {
        extra_buffer_types()
    } else {
        Vec::new()
    }
}

/// [`proc::GET_FEATURES`]: the processor's features (the registry argument is the CPU's).
fn get_features_ext(_registry: &Registry) -> Vec<backend_core::BackendFeature> {
    crate::features()
}

/// [`proc::SET_ABORT_CALLBACK`]: [`CpuBackend::set_abort_callback`] of a CPU backend.
fn set_abort_callback_ext(backend: &Backend, callback: Option<AbortCallback>) -> Result<()> {
    CpuBackend::from_backend(backend)
        .ok_or_else(|| BackendError::unsupported(backend.name(), "CPU abort callback"))?
        .set_abort_callback(callback);
    Ok(())
}

pub(crate) struct CpuRegistry;

impl RegistryImpl for CpuRegistry {
    fn name(&self) -> &str {
        CPU_NAME
    }
    fn devices(&self) -> Vec<Device> {
        vec![crate::cpu_device()]
    }
    /// The crate's own names ([`EXT_SET_N_THREADS`], [`EXT_EXTRA_BUFFER_TYPES`]) and ggml's
    /// (the CPU registry's `get_proc_address`): [`proc::SET_N_THREADS`],
    /// [`proc::DEV_GET_EXTRA_BUFTS`], [`proc::SET_ABORT_CALLBACK`], [`proc::GET_FEATURES`]
    /// ([`crate::features`]).
    fn extension(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        match name {
            n if proc::SET_N_THREADS == *n => proc::SET_N_THREADS.answer(set_n_threads_ext),
            n if proc::DEV_GET_EXTRA_BUFTS == *n => {
                proc::DEV_GET_EXTRA_BUFTS.answer(dev_extra_buffer_types)
            }
            n if proc::SET_ABORT_CALLBACK == *n => {
                proc::SET_ABORT_CALLBACK.answer(set_abort_callback_ext)
            }
            n if proc::GET_FEATURES == *n => proc::GET_FEATURES.answer(get_features_ext),
            EXT_SET_N_THREADS => {
                let f: SetNThreads = set_n_threads_ext;
                Some(Arc::new(f))
            }
            EXT_EXTRA_BUFFER_TYPES => {
                let f: ExtraBufferTypes = extra_buffer_types;
                Some(Arc::new(f))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        let text = "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(parse_meminfo(text), Some((8192 * 1024, 16384 * 1024)));
        let old = "MemTotal: 4 kB\nMemFree: 2 kB\n";
        assert_eq!(parse_meminfo(old), Some((2048, 4096)));
        assert_eq!(parse_meminfo("nothing here"), None);
    }
}
