//! Metadata values: the thirteen GGUF value types, arrays of them, and typed look-ups.
//!
//! Values are decoded into owned Rust values once, when the header is parsed; a model loader
//! then asks for `u32`, `f32`, `&str`, `&[String]` … by key and gets
//! [`GgufError::MissingKey`] or [`GgufError::WrongType`] instead of a default when the file
//! does not hold what it needs. Look-ups are strict about the type (a `u32` key stored as
//! `i32` is a wrong type), as llama.cpp's are.

use std::collections::HashMap;
use std::fmt;

use crate::error::{GgufError, Result};
use crate::reader::Reader;

/// A metadata value type id (`enum gguf_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with id `id`.
    ///
    /// ```
    /// assert_eq!(gguf::ValueType::from_id(8), Some(gguf::ValueType::String));
    /// assert_eq!(gguf::ValueType::from_id(13), None);
    /// ```
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name, as in error messages.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The smallest encoding of one value (a string's length field; an array's type and count).
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: elements of one non-array type (GGUF allows nested arrays in principle,
/// llama.cpp and this crate refuse them).
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// `"u32"`, `"string"`, `"array of string"`, … for messages.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.element_type()),
            v => v.value_type().name().to_owned(),
        }
    }

    pub(crate) fn read(r: &mut Reader<'_>, ty: ValueType) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(r.u8("u8")?),
            ValueType::I8 => Value::I8(r.u8("i8")? as i8),
            ValueType::U16 => Value::U16(r.u16("u16")?),
            ValueType::I16 => Value::I16(r.u16("i16")? as i16),
            ValueType::U32 => Value::U32(r.u32("u32")?),
            ValueType::I32 => Value::I32(r.u32("i32")? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(r.u32("f32")?)),
            ValueType::Bool => Value::Bool(r.bool()?),
            ValueType::String => Value::String(r.string("string value")?),
            ValueType::U64 => Value::U64(r.u64("u64")?),
            ValueType::I64 => Value::I64(r.i64("i64")?),
            ValueType::F64 => Value::F64(f64::from_bits(r.u64("f64")?)),
            ValueType::Array => Value::Array(Array::read(r)?),
        })
    }
}

/// Reads `n` elements with `f` into a vector sized only after the count was checked.
fn elements<T>(n: usize, mut f: impl FnMut() -> Result<T>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f()?);
    }
    Ok(out)
}

impl Array {
    fn read(r: &mut Reader<'_>) -> Result<Array> {
        let id = r.u32("array element type")?;
        let ty = ValueType::from_id(id).ok_or(GgufError::BadValueType(id))?;
        if ty == ValueType::Array {
            return Err(GgufError::NestedArray);
        }
        let n = r.count("array length", ty.min_size())?;
        Ok(match ty {
            ValueType::U8 => Array::U8(r.take(n as u64, "u8 array")?.to_vec()),
            ValueType::I8 => Array::I8(elements(n, || Ok(r.u8("i8")? as i8))?),
            ValueType::U16 => Array::U16(elements(n, || r.u16("u16"))?),
            ValueType::I16 => Array::I16(elements(n, || Ok(r.u16("i16")? as i16))?),
            ValueType::U32 => Array::U32(elements(n, || r.u32("u32"))?),
            ValueType::I32 => Array::I32(elements(n, || Ok(r.u32("i32")? as i32))?),
            ValueType::F32 => Array::F32(elements(n, || Ok(f32::from_bits(r.u32("f32")?)))?),
            ValueType::Bool => Array::Bool(elements(n, || r.bool())?),
            ValueType::String => Array::String(elements(n, || r.string("string element"))?),
            ValueType::U64 => Array::U64(elements(n, || r.u64("u64"))?),
            ValueType::I64 => Array::I64(elements(n, || r.i64("i64"))?),
            ValueType::F64 => Array::F64(elements(n, || Ok(f64::from_bits(r.u64("f64")?)))?),
            ValueType::Array => unreachable!("refused above"),
        })
    }

    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The key/value pairs of a file, in file order, with typed look-ups.
///
/// ```
/// # fn demo(meta: &gguf::Metadata) -> gguf::Result<()> {
/// let arch = meta.str("general.architecture")?;
/// let layers = meta.u32(&format!("{arch}.block_count"))?;
/// let eps = meta.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"))?;
/// let tokens: &[String] = meta.strings("tokenizer.ggml.tokens")?;
/// let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
/// # let _ = (layers, eps, tokens, add_bos); Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    pairs: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! scalar_getters {
    ($($get:ident $opt:ident $variant:ident $t:ty;)*) => {$(
        #[doc = concat!("The `", stringify!($t), "` at `key`.")]
        pub fn $get(&self, key: &str) -> Result<$t> {
            match self.value(key)? {
                Value::$variant(v) => Ok(v.clone()),
                other => Err(wrong(key, stringify!($t), other)),
            }
        }
        #[doc = concat!("The `", stringify!($t), "` at `key`, or `None` if the key is absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
            if self.contains(key) { self.$get(key).map(Some) } else { Ok(None) }
        }
    )*};
}

macro_rules! array_getters {
    ($($get:ident $variant:ident $t:ty;)*) => {$(
        #[doc = concat!("The array of `", stringify!($t), "` at `key`.")]
        pub fn $get(&self, key: &str) -> Result<&[$t]> {
            match self.value(key)? {
                Value::Array(Array::$variant(v)) => Ok(v),
                other => Err(wrong(key, concat!("array of ", stringify!($t)), other)),
            }
        }
    )*};
}

fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found: found.type_name(),
    }
}

impl Metadata {
    /// Adds a pair; empty and duplicate keys are refused.
    pub(crate) fn push(&mut self, key: String, value: Value) -> Result<()> {
        if key.is_empty() {
            return Err(GgufError::EmptyKey);
        }
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.pairs.len());
        self.pairs.push((key, value));
        Ok(())
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Every pair in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.pairs[i].1)
    }

    /// The value at `key`, or [`GgufError::MissingKey`].
    pub fn value(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    scalar_getters! {
        u8 opt_u8 U8 u8;
        i8 opt_i8 I8 i8;
        u16 opt_u16 U16 u16;
        i16 opt_i16 I16 i16;
        u32 opt_u32 U32 u32;
        i32 opt_i32 I32 i32;
        f32 opt_f32 F32 f32;
        bool opt_bool Bool bool;
        u64 opt_u64 U64 u64;
        i64 opt_i64 I64 i64;
        f64 opt_f64 F64 f64;
    }

    /// The string at `key`.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            other => Err(wrong(key, "string", other)),
        }
    }

    /// The string at `key`, or `None` if the key is absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        if self.contains(key) {
            self.str(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The array at `key`, of any element type.
    pub fn array(&self, key: &str) -> Result<&Array> {
        match self.value(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong(key, "array", other)),
        }
    }

    array_getters! {
        u8s U8 u8;
        i8s I8 i8;
        u16s U16 u16;
        i16s I16 i16;
        u32s U32 u32;
        i32s I32 i32;
        f32s F32 f32;
        bools Bool bool;
        strings String String;
        u64s U64 u64;
        i64s I64 i64;
        f64s F64 f64;
    }
}
