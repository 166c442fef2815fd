//! Typed names for a registry's proc-address lookup (`ggml_backend_reg_get_proc_address`).
//!
//! ggml's registries answer a function name with an untyped pointer the caller casts to the
//! type `ggml-backend.h` declares for that name. Here a registry answers a name with an
//! `Arc<dyn Any>` ([`crate::RegistryImpl::extension`]), and a [`ProcName`] pairs a name with the
//! type its answer has, so [`crate::Registry::proc_address`] hands back a value of that type or
//! nothing: a wrong cast cannot happen. The names below are the ones `ggml-backend.h` declares
//! a function type for, with ggml's spelling, so code that asks ggml's questions asks them here
//! in the same words; backend crates add their own [`ProcName`]s for backend-specific entry
//! points.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::Backend;
use crate::buffer::BufferType;
use crate::device::Device;
use crate::error::Result;
use crate::registry::Registry;

/// A proc-address name and the type of what a registry answers for it.
///
/// ```
/// use backend_core::ProcName;
/// let name: ProcName<fn() -> u32> = ProcName::new("my_backend_answer");
/// assert_eq!(name.name(), "my_backend_answer");
/// ```
pub struct ProcName<T> {
    name: &'static str,
    // `fn() -> T`: the name neither owns nor shares a `T`, so it is `Send`, `Sync` and `Copy`
    // whatever `T` is.
    _type: PhantomData<fn() -> T>,
}

impl<T> ProcName<T> {
    /// The name `name`, whose answer has type `T`.
    pub const fn new(name: &'static str) -> Self {
        ProcName {
            name,
            _type: PhantomData,
        }
    }
    /// The name as a registry's [`crate::RegistryImpl::extension`] receives it.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> Clone for ProcName<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ProcName<T> {}

impl<T> fmt::Debug for ProcName<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProcName({})", self.name)
    }
}

impl<T> PartialEq<str> for ProcName<T> {
    fn eq(&self, other: &str) -> bool {
        self.name == other
    }
}

impl<T: Any + Send + Sync> ProcName<T> {
    /// `value` as the answer to this name, in the form [`crate::RegistryImpl::extension`]
    /// returns. Wrapping through the name makes the answer's type the one callers ask for.
    pub fn answer(&self, value: T) -> Option<Arc<dyn Any + Send + Sync>> {
        Some(Arc::new(value))
    }
}

/// One entry of a backend's feature list (`ggml_backend_feature`): a name such as `"AVX2"` and
/// its value (`"1"` for a flag that is present; a number for a size such as `"SVE_CNT"`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BackendFeature {
    /// Feature name, ggml's spelling.
    pub name: String,
    /// Its value.
    pub value: String,
}

impl BackendFeature {
    /// A feature `name` with value `value`.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        BackendFeature {
            name: name.into(),
            value: value.into(),
        }
    }
}

impl fmt::Display for BackendFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.name, self.value)
    }
}

/// The abort callback a backend polls between graph nodes: `true` stops the computation.
pub type AbortCallback = Arc<dyn Fn() -> bool + Send + Sync>;

/// Set the thread count of a backend of the registry (`ggml_backend_set_n_threads_t`);
/// [`crate::BackendError::Unsupported`] for a backend of another kind.
pub type SetNThreadsFn = fn(&Backend, usize) -> Result<()>;
/// The extra buffer types of a device of the registry (`ggml_backend_dev_get_extra_bufts_t`):
/// the same list as [`Device::extra_buffer_types`].
pub type DevGetExtraBuftsFn = fn(&Device) -> Vec<BufferType>;
/// Set or remove the abort callback of a backend of the registry
/// (`ggml_backend_set_abort_callback_t`); [`crate::BackendError::Unsupported`] for a backend of
/// another kind.
pub type SetAbortCallbackFn = fn(&Backend, Option<AbortCallback>) -> Result<()>;
/// The registry's feature list (`ggml_backend_get_features_t`).
pub type GetFeaturesFn = fn(&Registry) -> Vec<BackendFeature>;

/// `"ggml_backend_set_n_threads"`.
pub const SET_N_THREADS: ProcName<SetNThreadsFn> = ProcName::new("ggml_backend_set_n_threads");
/// `"ggml_backend_dev_get_extra_bufts"`.
pub const DEV_GET_EXTRA_BUFTS: ProcName<DevGetExtraBuftsFn> =
    ProcName::new("ggml_backend_dev_get_extra_bufts");
/// `"ggml_backend_set_abort_callback"`.
pub const SET_ABORT_CALLBACK: ProcName<SetAbortCallbackFn> =
    ProcName::new("ggml_backend_set_abort_callback");
/// `"ggml_backend_get_features"`.
pub const GET_FEATURES: ProcName<GetFeaturesFn> = ProcName::new("ggml_backend_get_features");
