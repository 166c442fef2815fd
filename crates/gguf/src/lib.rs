//! GGUF model files (the format of llama.cpp and ggml): the header, the metadata, the tensor
//! infos, and the tensors used in place from a read-only memory map.
//!
//! Why its own crate: a model file is untrusted input, and its parser is the one place where a
//! length or an offset read from disk decides how much to allocate and where to read. This
//! crate keeps that in one small, fuzzed piece: every read is bounds-checked, every count is
//! checked against the bytes left before anything is allocated for it, and all size and
//! offset arithmetic is checked. A truncated, corrupt or hostile file is a [`GgufError`]
//! naming what is wrong and where, never a panic.
//!
//! What is checked, following llama.cpp's reader (`gguf.cpp`) and loader:
//! * magic `GGUF`, version 2 or 3 (1 and big-endian files are refused);
//! * metadata: the 13 value types, arrays of them (not of arrays), non-empty unique keys,
//!   UTF-8 strings, bools 0 or 1; `general.alignment` a power-of-two `u32` (default 32);
//! * tensor infos: unique names under 64 bytes, at most 4 dimensions, extents ≥ 0, a type
//!   this workspace knows ([`graph::ElementType`]; anything else is
//!   [`GgufError::UnknownType`]), rows a whole number of blocks, element count and byte size
//!   without overflow, each offset equal to the running sum of the padded sizes before it,
//!   and every tensor inside the file.
//!
//! Why a memory map (the [`memmap2`] crate, the maintained successor of `memmap` that the
//! Rust ecosystem uses for this): a model's weights are only ever read, so mapping the file
//! lets the CPU backend compute straight from the page cache — no copy, no second resident
//! copy, pages a run never touches are never read, and several processes share one copy.
//! [`GgufFile::weights_buffer`] puts a buffer over the mapped data section
//! ([`backend_core::HostMemory`] + `buffer_from_host_memory`, usage weights), and
//! [`GgufFile::place_tensor`] creates a graph tensor at a weight's offset in it.
//!
//! The only `unsafe` is the `mmap` call in [`GgufFile::open`]; every test that does not need
//! a real file runs on bytes in memory ([`GgufFile::from_bytes`]) so it can run under Miri.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("model.gguf")?;
//! for t in file.tensors() {
//!     println!("{} {:?} {} @ {}", t.name(), t.dims(), t.ty().name(), t.offset());
//! }
//! let vocab = file.metadata().strings("tokenizer.ggml.tokens")?;
//! # let _ = vocab;
//! # Ok::<(), gguf::GgufError>(())
//! ```

mod error;
mod file;
mod header;
mod reader;
mod tensor;
mod value;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use header::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, Header, MAGIC};
pub use tensor::{MAX_DIMS, MAX_NAME, TensorInfo};
pub use value::{Array, Metadata, Value, ValueType};
