//! Element types, with ggml's numeric ids, block sizes and bytes per block.
//!
//! Why a table and not traits: every layer above (allocators, the scheduler, RPC) only needs
//! the size arithmetic of a type, never its arithmetic on values, and the ids must match ggml's
//! so that serialised graphs and wire messages agree with the reference.

use std::fmt;

/// The element type of a tensor (`ggml_type`), numbered as in ggml.
///
/// Block types (the quantized ones) store `block_size()` elements in `type_size()` bytes.
///
/// ```
/// use graph::ElementType;
/// assert_eq!(ElementType::Q4_0.block_size(), 32);
/// assert_eq!(ElementType::Q4_0.type_size(), 18);
/// assert_eq!(ElementType::Q4_0.row_size(64), 36);
/// assert_eq!(ElementType::from_id(30), Some(ElementType::BF16));
/// assert_eq!("q8_0".parse::<ElementType>().unwrap(), ElementType::Q8_0);
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum ElementType {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half float.
    F16 = 1,
    /// 4-bit quantized, 32 per block, one f16 scale.
    Q4_0 = 2,
    /// 4-bit quantized, 32 per block, f16 scale and min.
    Q4_1 = 3,
    /// 5-bit quantized, 32 per block.
    Q5_0 = 6,
    /// 5-bit quantized with min, 32 per block.
    Q5_1 = 7,
    /// 8-bit quantized, 32 per block, one f16 scale.
    Q8_0 = 8,
    /// 8-bit quantized, 32 per block, f16 scale and sum.
    Q8_1 = 9,
    /// k-quant, 256 per block.
    Q2_K = 10,
    /// k-quant, 256 per block.
    Q3_K = 11,
    /// k-quant, 256 per block.
    Q4_K = 12,
    /// k-quant, 256 per block.
    Q5_K = 13,
    /// k-quant, 256 per block.
    Q6_K = 14,
    /// k-quant, 256 per block.
    Q8_K = 15,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit float.
    F64 = 28,
    /// bfloat16.
    BF16 = 30,
}

/// (type, name, block size, bytes per block, quantized)
const TABLE: &[(ElementType, &str, usize, usize, bool)] = &[
    (ElementType::F32, "f32", 1, 4, false),
    (ElementType::F16, "f16", 1, 2, false),
    (ElementType::Q4_0, "q4_0", 32, 18, true),
    (ElementType::Q4_1, "q4_1", 32, 20, true),
    (ElementType::Q5_0, "q5_0", 32, 22, true),
    (ElementType::Q5_1, "q5_1", 32, 24, true),
    (ElementType::Q8_0, "q8_0", 32, 34, true),
    (ElementType::Q8_1, "q8_1", 32, 36, true),
    (ElementType::Q2_K, "q2_K", 256, 84, true),
    (ElementType::Q3_K, "q3_K", 256, 110, true),
    (ElementType::Q4_K, "q4_K", 256, 144, true),
    (ElementType::Q5_K, "q5_K", 256, 176, true),
    (ElementType::Q6_K, "q6_K", 256, 210, true),
    (ElementType::Q8_K, "q8_K", 256, 292, true),
    (ElementType::I8, "i8", 1, 1, false),
    (ElementType::I16, "i16", 1, 2, false),
    (ElementType::I32, "i32", 1, 4, false),
    (ElementType::I64, "i64", 1, 8, false),
    (ElementType::F64, "f64", 1, 8, false),
    (ElementType::BF16, "bf16", 1, 2, false),
];

impl ElementType {
    /// Every type this crate knows, in id order.
    pub const ALL: [ElementType; 20] = [
        ElementType::F32,
        ElementType::F16,
        ElementType::Q4_0,
        ElementType::Q4_1,
        ElementType::Q5_0,
        ElementType::Q5_1,
        ElementType::Q8_0,
        ElementType::Q8_1,
        ElementType::Q2_K,
        ElementType::Q3_K,
        ElementType::Q4_K,
        ElementType::Q5_K,
        ElementType::Q6_K,
        ElementType::Q8_K,
        ElementType::I8,
        ElementType::I16,
        ElementType::I32,
        ElementType::I64,
        ElementType::F64,
        ElementType::BF16,
    ];

    #[inline]
    fn row(self) -> &'static (ElementType, &'static str, usize, usize, bool) {
        // The table is ordered like ALL (a test checks it): index it directly, since
        // kernels ask for row sizes per row.
        let i = match self {
            ElementType::F32 => 0,
            ElementType::F16 => 1,
            ElementType::Q4_0 => 2,
            ElementType::Q4_1 => 3,
            ElementType::Q5_0 => 4,
            ElementType::Q5_1 => 5,
            ElementType::Q8_0 => 6,
            ElementType::Q8_1 => 7,
            ElementType::Q2_K => 8,
            ElementType::Q3_K => 9,
            ElementType::Q4_K => 10,
            ElementType::Q5_K => 11,
            ElementType::Q6_K => 12,
            ElementType::Q8_K => 13,
            ElementType::I8 => 14,
            ElementType::I16 => 15,
            ElementType::I32 => 16,
            ElementType::I64 => 17,
            ElementType::F64 => 18,
            ElementType::BF16 => 19,
        };
        &TABLE[i]
    }

    /// ggml's numeric id (`enum ggml_type`).
    #[inline]
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The type with ggml id `id`, if this crate knows it.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.0.id() == id).map(|r| r.0)
    }

    /// ggml's name string (`ggml_type_name`), e.g. `"q4_0"`.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Elements per block (1 for plain types).
    #[inline]
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Bytes per block (bytes per element for plain types).
    #[inline]
    pub fn type_size(self) -> usize {
        self.row().3
    }

    /// Whether this is a quantized block type.
    #[inline]
    pub fn is_quantized(self) -> bool {
        self.row().4
    }

    /// Bytes of a row of `n` elements: `type_size * n / block_size` (ggml's `ggml_row_size`).
    /// `n` should be a multiple of the block size; the division truncates like ggml's. Saturates
    /// at `usize::MAX` for an `n` no tensor can have (tensor constructors check their sizes).
    #[inline]
    pub fn row_size(self, n: usize) -> usize {
        self.type_size()
            .checked_mul(n)
            .map_or(usize::MAX, |b| b / self.block_size())
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error returned when parsing an unknown type name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown element type name {0:?}")]
pub struct UnknownType(pub String);

impl std::str::FromStr for ElementType {
    type Err = UnknownType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TABLE
            .iter()
            .find(|r| r.1.eq_ignore_ascii_case(s))
            .map(|r| r.0)
            .ok_or_else(|| UnknownType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_follow_all() {
        for (i, t) in ElementType::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].0, *t);
            assert_eq!(t.row().0, *t);
        }
    }
}
