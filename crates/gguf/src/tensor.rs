//! Tensor-info records: name, shape, ggml type and data offset, with the checks llama.cpp's
//! loader makes (and a few it leaves to luck), all in checked arithmetic.

use std::collections::HashMap;

use graph::ElementType;

use crate::error::{GgufError, Result};
use crate::reader::Reader;

/// Longest tensor name plus one (ggml's `GGML_MAX_NAME`, which counts the NUL).
pub const MAX_NAME: usize = 64;
/// Most dimensions a tensor can have.
pub const MAX_DIMS: usize = 4;

/// One tensor of the file: where its bytes are and how to read them.
///
/// ```
/// # fn demo(file: &gguf::GgufFile) -> gguf::Result<()> {
/// let t = file.tensor("token_embd.weight")?;
/// assert_eq!(t.ne(), [576, 49152, 1, 1]);          // ggml order: row length first
/// assert_eq!(t.ty(), graph::ElementType::Q8_0);
/// assert_eq!(t.offset(), 0);                        // from the start of the data section
/// assert_eq!(t.nbytes(), 30_081_024);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    n_dims: u32,
    ne: [u64; MAX_DIMS],
    ty: ElementType,
    offset: u64,
    nbytes: u64,
}

impl TensorInfo {
    /// The name (unique in the file, under 64 bytes).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Number of dimensions stored in the file (0 to 4).
    pub fn n_dims(&self) -> u32 {
        self.n_dims
    }
    /// Extents in ggml order (`ne[0]` = row length), missing ones 1.
    pub fn ne(&self) -> [u64; MAX_DIMS] {
        self.ne
    }
    /// Extents as `i64`, as `graph::Context::new_tensor` takes them (each fits, checked at
    /// parse time).
    pub fn ne_i64(&self) -> [i64; MAX_DIMS] {
        self.ne.map(|n| n as i64)
    }
    /// The stored extents only (`n_dims` of them).
    pub fn dims(&self) -> &[u64] {
        &self.ne[..self.n_dims as usize]
    }
    /// Element type.
    pub fn ty(&self) -> ElementType {
        self.ty
    }
    /// Byte offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Size of the data in bytes (unpadded).
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        // Checked at parse time to fit in i64.
        self.ne.iter().product()
    }
}

/// Tensor infos in file order and an index from name to position.
pub(crate) type Infos = (Vec<TensorInfo>, HashMap<String, usize>);

/// Reads `count` records and checks each one against the running data size.
pub(crate) fn read_infos(r: &mut Reader<'_>, count: usize, alignment: u64) -> Result<Infos> {
    let mut infos = Vec::with_capacity(count);
    let mut names = HashMap::with_capacity(count);
    let mut expected = 0u64;
    for index in 0..count {
        let mut name = String::new();
        let info = read_one(r, &mut name, expected).and_then(|info| {
            if names.insert(info.name.clone(), index).is_some() {
                return Err(GgufError::DuplicateTensor);
            }
            Ok(info)
        });
        let info = info.map_err(|e| GgufError::InTensor {
            index: index as u64,
            name,
            source: Box::new(e),
        })?;
        expected = info
            .nbytes
            .checked_next_multiple_of(alignment)
            .and_then(|padded| expected.checked_add(padded))
            .ok_or_else(|| GgufError::InTensor {
                index: index as u64,
                name: info.name.clone(),
                source: Box::new(GgufError::SizeOverflow(info.ne)),
            })?;
        infos.push(info);
    }
    Ok((infos, names))
}

fn read_one(r: &mut Reader<'_>, name_out: &mut String, expected: u64) -> Result<TensorInfo> {
    let name = r.string("tensor name")?;
    name_out.clone_from(&name);
    if name.len() >= MAX_NAME {
        return Err(GgufError::NameTooLong(name.len()));
    }
    let n_dims = r.u32("tensor n_dims")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims(n_dims));
    }
    let mut ne = [1u64; MAX_DIMS];
    for slot in ne.iter_mut().take(n_dims as usize) {
        let value = r.i64("tensor extent")?;
        *slot = u64::try_from(value).map_err(|_| GgufError::Negative {
            what: "tensor extent",
            value,
        })?;
    }
    let type_id = r.u32("tensor type")?;
    let ty = ElementType::from_id(type_id).ok_or(GgufError::UnknownType(type_id))?;
    let offset = r.u64("tensor offset")?;
    let nbytes = byte_size(ty, ne)?;
    if offset != expected {
        return Err(GgufError::BadOffset {
            found: offset,
            expected,
        });
    }
    Ok(TensorInfo {
        name,
        n_dims,
        ne,
        ty,
        offset,
        nbytes,
    })
}

/// Bytes of a contiguous tensor, refusing partial blocks and any count that overflows `i64`
/// (elements, as ggml counts them) or `usize` (bytes, as they are addressed).
fn byte_size(ty: ElementType, ne: [u64; MAX_DIMS]) -> Result<u64> {
    let block = ty.block_size() as u64;
    if !ne[0].is_multiple_of(block) {
        return Err(GgufError::PartialBlock {
            ne0: ne[0],
            ty: ty.name(),
            block,
        });
    }
    let overflow = || GgufError::SizeOverflow(ne);
    let elements = ne.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
    if elements.is_none_or(|n| n > i64::MAX as u64) || ne.iter().any(|&n| n > i64::MAX as u64) {
        return Err(overflow());
    }
    let row = (ne[0] / block).checked_mul(ty.type_size() as u64);
    let bytes = [ne[1], ne[2], ne[3]]
        .iter()
        .try_fold(row.ok_or_else(overflow)?, |acc, &n| acc.checked_mul(n))
        .ok_or_else(overflow)?;
    usize::try_from(bytes).map_err(|_| overflow())?;
    Ok(bytes)
}
