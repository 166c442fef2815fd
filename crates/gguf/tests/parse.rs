//! Parsing synthetic files: every value type and accessor, the layout arithmetic, and one
//! test per kind of broken file, each checking that the error names what is wrong.

mod common;

use common::{Builder, Kv, Ti, data_byte, synthetic};
use gguf::{Array, GgufError, GgufFile, Header, Value, ValueType};
use graph::ElementType;

fn parse(b: &Builder) -> Result<Header, GgufError> {
    let bytes = b.build();
    let h = Header::parse(&bytes)?;
    h.check_bounds(bytes.len() as u64)?;
    Ok(h)
}

fn root(b: &Builder) -> GgufError {
    let e = parse(b).expect_err("file should be refused");
    // Every error renders to a message (no panic in Display).
    assert!(!e.to_string().is_empty());
    match e {
        GgufError::InKv { source, .. } | GgufError::InTensor { source, .. } => *source,
        other => other,
    }
}

#[test]
fn synthetic_file_every_value_type() {
    for version in [2, 3] {
        let mut b = synthetic();
        b.version = version;
        let file = GgufFile::from_bytes(b.build()).unwrap();
        let h = file.header();
        assert_eq!(h.version(), version);
        let m = file.metadata();
        assert_eq!(m.len(), 20);
        assert_eq!(m.str("general.architecture").unwrap(), "llama");
        assert_eq!(m.u8("t.u8").unwrap(), 200);
        assert_eq!(m.i8("t.i8").unwrap(), -2);
        assert_eq!(m.u16("t.u16").unwrap(), 60000);
        assert_eq!(m.i16("t.i16").unwrap(), -300);
        assert_eq!(m.u32("t.u32").unwrap(), 4_000_000_000);
        assert_eq!(m.i32("t.i32").unwrap(), -5);
        assert_eq!(m.f32("t.f32").unwrap(), 1e-5);
        assert!(m.bool("t.bool").unwrap());
        assert_eq!(m.str("t.string").unwrap(), "héllo");
        assert_eq!(m.u64("t.u64").unwrap(), u64::MAX);
        assert_eq!(m.i64("t.i64").unwrap(), i64::MIN);
        assert_eq!(m.f64("t.f64").unwrap(), 0.1);
        assert_eq!(
            m.strings("t.strings").unwrap(),
            ["a", "", "ĠðŁ", "<|im_start|>"]
        );
        assert_eq!(m.f32s("t.f32s").unwrap(), [1.5, -2.0, 0.25]);
        assert_eq!(m.i32s("t.i32s").unwrap(), [3, -4]);
        assert_eq!(m.bools("t.bools").unwrap(), [false, true, true]);
        assert_eq!(m.u8s("t.u8s").unwrap(), [1, 2, 3, 4]);
        assert_eq!(m.array("t.empty").unwrap(), &Array::F64(vec![]));
        assert_eq!(m.array("t.empty").unwrap().element_type(), ValueType::F64);
        assert_eq!(m.get("t.u8"), Some(&Value::U8(200)));
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys[..3],
            ["general.architecture", "general.alignment", "t.u8"]
        );
        // Optional look-ups.
        assert_eq!(m.opt_u32("t.u32").unwrap(), Some(4_000_000_000));
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        assert_eq!(m.opt_str("nope").unwrap(), None);
        assert!(matches!(
            m.opt_u32("t.i32"),
            Err(GgufError::WrongType { .. })
        ));
    }
}

#[test]
fn typed_lookup_errors_name_the_key_and_types() {
    let file = GgufFile::from_bytes(synthetic().build()).unwrap();
    let m = file.metadata();
    match m.u32("missing.key") {
        Err(GgufError::MissingKey(k)) => assert_eq!(k, "missing.key"),
        other => panic!("{other:?}"),
    }
    match m.u32("t.i32") {
        Err(e @ GgufError::WrongType { .. }) => {
            assert_eq!(e.to_string(), "metadata key `t.i32` holds i32, not u32")
        }
        other => panic!("{other:?}"),
    }
    match m.strings("t.f32s") {
        Err(e) => assert_eq!(
            e.to_string(),
            "metadata key `t.f32s` holds array of f32, not array of String"
        ),
        Ok(_) => panic!(),
    }
    assert!(matches!(
        m.str("t.strings"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(m.array("t.u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(
        file.tensor("nope"),
        Err(GgufError::MissingTensor(n)) if n == "nope"
    ));
}

#[test]
fn layout_offsets_and_tensor_bytes() {
    let b = synthetic();
    let bytes = b.build();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let h = file.header();
    assert_eq!(h.alignment(), 64);
    assert_eq!(h.data_offset() % 64, 0);
    let t: Vec<_> = file
        .tensors()
        .iter()
        .map(|t| (t.name(), t.ty(), t.ne(), t.offset(), t.nbytes()))
        .collect();
    assert_eq!(
        t,
        [
            ("embd", ElementType::Q8_0, [64, 3, 1, 1], 0, 2 * 34 * 3),
            ("norm", ElementType::F32, [5, 1, 1, 1], 256, 20),
            ("w", ElementType::Q4_1, [32, 2, 1, 1], 320, 40),
            ("h", ElementType::F16, [2, 2, 2, 2], 384, 32),
            ("scalar", ElementType::I32, [1, 1, 1, 1], 448, 4),
            ("empty", ElementType::F32, [0, 7, 1, 1], 512, 0),
        ]
    );
    let w = file.tensor("w").unwrap();
    assert_eq!(w.dims(), [32, 2, 1]);
    assert_eq!(w.n_dims(), 3);
    assert_eq!(w.n_elements(), 64);
    assert_eq!(file.tensor("scalar").unwrap().dims(), [] as [u64; 0]);
    assert_eq!(h.data_size(), 512);
    let data = file.tensor_data(w).unwrap();
    assert_eq!(data.len(), 40);
    assert!(
        data.iter()
            .enumerate()
            .all(|(i, &v)| v == data_byte(320 + i))
    );
    // The data section starts where the header says, in the file's own bytes.
    assert_eq!(file.data(), &bytes[h.data_offset() as usize..]);
}

#[test]
fn default_alignment_is_32() {
    let mut b = synthetic();
    b.kvs.retain(|kv| kv.key != b"general.alignment");
    b.alignment = 32;
    let h = parse(&b).unwrap();
    assert_eq!(h.alignment(), 32);
    assert_eq!(h.tensor("norm").unwrap().offset(), 224);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a CPU buffer over a Vec whose alignment Miri does not promise"
)]
fn weights_buffer_places_tensors_in_place_read_only() {
    let file = GgufFile::from_bytes(synthetic().build()).unwrap();
    let cpu = backend_cpu::cpu_device();
    let buffer = file.weights_buffer(&cpu).unwrap();
    assert_eq!(buffer.usage(), backend_core::BufferUsage::Weights);
    assert_eq!(buffer.size(), file.data().len());
    // In place: the buffer's memory is the file's data section, not a copy.
    assert_eq!(
        buffer.host_ptr().unwrap().as_ptr().cast_const(),
        file.data().as_ptr()
    );
    let mut ctx = graph::Context::new();
    for info in file.tensors() {
        let id = file.place_tensor(&mut ctx, &buffer, info.name()).unwrap();
        assert_eq!(ctx[id].name(), info.name());
        assert_eq!(ctx[id].ty(), info.ty());
        assert_eq!(ctx[id].ne(), info.ne_i64());
        let mut got = vec![0u8; info.nbytes() as usize];
        backend_core::tensor_get(&ctx, id, 0, &mut got).unwrap();
        assert_eq!(got, file.tensor_data(info).unwrap());
    }
    let w = ctx.find("w").unwrap();
    assert!(matches!(
        backend_core::tensor_set(&ctx, w, 0, &[0u8; 4]),
        Err(backend_core::BackendError::ReadOnly { .. })
    ));
    assert!(matches!(
        file.place_tensor(&mut ctx, &buffer, "nope"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn bad_magic_and_versions() {
    assert!(
        matches!(Header::parse(b"GG"), Err(GgufError::BadMagic { found }) if found == *b"GG\0\0")
    );
    assert!(matches!(
        Header::parse(b"GGML\x03\0\0\0"),
        Err(GgufError::BadMagic { .. })
    ));
    for (v, want) in [
        (1u32, "UnsupportedVersion(1)"),
        (4, "UnsupportedVersion(4)"),
        (0x0300_0000, "BigEndian(50331648)"),
    ] {
        let mut b = synthetic();
        b.version = v;
        assert_eq!(format!("{:?}", root(&b)), want);
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = synthetic().build();
    // Under Miri every 23rd length (about 40 files), natively every one.
    let step = if cfg!(miri) { 23 } else { 1 };
    for len in (0..bytes.len()).step_by(step) {
        let cut = &bytes[..len];
        let r = Header::parse(cut).and_then(|h| h.check_bounds(len as u64));
        let e = r.expect_err("a truncated file must be refused");
        assert!(
            matches!(
                e.root(),
                GgufError::Truncated { .. }
                    | GgufError::CountTooLarge { .. }
                    | GgufError::OutOfFile { .. }
                    | GgufError::BadMagic { .. }
            ),
            "len {len}: {e}"
        );
    }
}

#[test]
fn hostile_counts_and_lengths_are_refused_before_allocating() {
    // A tensor count far beyond the file.
    let mut bytes = synthetic().build();
    bytes[8..16].copy_from_slice(&(1i64 << 60).to_le_bytes());
    let e = Header::parse(&bytes).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "tensor count",
                ..
            }
        ),
        "{e}"
    );
    bytes[8..16].copy_from_slice(&(-1i64).to_le_bytes());
    assert!(matches!(
        Header::parse(&bytes),
        Err(GgufError::Negative { value: -1, .. })
    ));
    // A string length of u64::MAX.
    let mut b = synthetic();
    b.kvs
        .push(Kv::raw("t.huge", 8, u64::MAX.to_le_bytes().to_vec()));
    assert!(matches!(
        root(&b),
        GgufError::Truncated {
            what: "string value",
            ..
        }
    ));
    // An array count of 2^62 u64s.
    let mut b = synthetic();
    b.kvs.push(Kv::array("t.huge", 10, 1 << 62, vec![]));
    assert!(matches!(
        root(&b),
        GgufError::CountTooLarge {
            what: "array length",
            ..
        }
    ));
    // An array of strings whose count fits the bytes only at 1 byte each.
    let mut b = synthetic();
    b.kvs.push(Kv::array("t.strs", 8, 1_000_000, vec![0; 200]));
    assert!(matches!(root(&b), GgufError::CountTooLarge { .. }));
}

#[test]
fn metadata_errors() {
    let cases: Vec<(Kv, &str)> = vec![
        (Kv::u32("", 1), "EmptyKey"),
        (Kv::u32("t.u8", 1), "DuplicateKey(\"t.u8\")"),
        (Kv::raw("t.bad", 13, vec![0; 8]), "BadValueType(13)"),
        (
            Kv::raw("t.bad", u32::MAX, vec![0; 8]),
            "BadValueType(4294967295)",
        ),
        (
            Kv::array(
                "t.nested",
                9,
                1,
                vec![4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0],
            ),
            "NestedArray",
        ),
        (
            Kv::array("t.badelem", 77, 1, vec![0; 8]),
            "BadValueType(77)",
        ),
        (Kv::raw("t.bool", 7, vec![2]), "BadBool"),
        (
            Kv::raw(
                "t.utf8",
                8,
                [2u64.to_le_bytes().to_vec(), vec![0xC3, 0x28]].concat(),
            ),
            "BadUtf8",
        ),
        (
            Kv::u32("general.alignment", 48),
            "BadAlignment(\"48 is not a power of two\")",
        ),
    ];
    for (kv, want) in cases {
        let mut b = synthetic();
        if kv.key == b"general.alignment" {
            b.kvs.retain(|k| k.key != b"general.alignment");
        }
        b.kvs.push(kv);
        let e = root(&b);
        assert!(format!("{e:?}").starts_with(want), "{e:?} vs {want}");
    }
    // The context names the pair.
    let mut b = synthetic();
    b.kvs.push(Kv::raw("t.bool2", 7, vec![9]));
    let e = parse(&b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "metadata pair 20 `t.bool2`: bool at offset 646 is 9, not 0 or 1"
    );
    // Alignment of the wrong type.
    let mut b = synthetic();
    b.kvs[1] = Kv::raw("general.alignment", 10, 64u64.to_le_bytes().to_vec());
    assert!(matches!(root(&b), GgufError::BadAlignment(m) if m == "holds u64, not u32"));
    // Zero is not a power of two.
    b.kvs[1] = Kv::u32("general.alignment", 0);
    assert!(matches!(root(&b), GgufError::BadAlignment(_)));
}

#[test]
fn tensor_info_errors() {
    let name63 = "n".repeat(63);
    let mut b = synthetic();
    b.tensors.push(Ti::new(&name63, ElementType::F32, &[1]));
    parse(&b).expect("63-byte names are allowed");

    let edit = |f: &dyn Fn(&mut Builder)| {
        let mut b = synthetic();
        f(&mut b);
        root(&b)
    };
    let e = edit(&|b| {
        b.tensors
            .push(Ti::new(&"n".repeat(64), ElementType::F32, &[1]))
    });
    assert!(matches!(e, GgufError::NameTooLong(64)));
    let e = edit(&|b| b.tensors.push(Ti::new("norm", ElementType::F32, &[1])));
    assert!(matches!(e, GgufError::DuplicateTensor));
    let e = edit(&|b| {
        b.tensors
            .push(Ti::new("five", ElementType::F32, &[1, 1, 1, 1, 1]))
    });
    assert!(matches!(e, GgufError::TooManyDims(5)));
    let e = edit(&|b| b.tensors.push(Ti::new("neg", ElementType::F32, &[4, -1])));
    assert!(matches!(e, GgufError::Negative { value: -1, .. }));
    let e = edit(&|b| b.tensors[1].ty = 4); // Q4_2: removed from ggml
    assert!(matches!(e, GgufError::UnknownType(4)));
    let e = edit(&|b| b.tensors[1].ty = 39);
    assert!(matches!(e, GgufError::UnknownType(39)));
    let e = edit(&|b| b.tensors.push(Ti::new("part", ElementType::Q4_1, &[48])));
    assert!(matches!(
        e,
        GgufError::PartialBlock {
            ne0: 48,
            block: 32,
            ..
        }
    ));
    let e = edit(&|b| {
        b.tensors
            .push(Ti::new("big", ElementType::F32, &[1 << 40, 1 << 40]))
    });
    assert!(matches!(e, GgufError::SizeOverflow(_)));
    let e = edit(&|b| b.tensors.push(Ti::new("big", ElementType::F64, &[1 << 61])));
    assert!(matches!(e, GgufError::SizeOverflow(_)));
    let e = edit(&|b| b.tensors[1].offset = Some(257));
    assert!(matches!(
        e,
        GgufError::BadOffset {
            found: 257,
            expected: 256
        }
    ));
    let e = edit(&|b| b.tensors[0].offset = Some(64));
    assert!(matches!(
        e,
        GgufError::BadOffset {
            found: 64,
            expected: 0
        }
    ));
    // Reordered (the loader requires file order = offset order).
    let e = edit(&|b| {
        b.tensors.swap(0, 1);
        b.tensors[0].offset = Some(256);
    });
    assert!(matches!(e, GgufError::BadOffset { .. }));
    // Data cut off: the last tensor pokes past the end.
    let mut bytes = synthetic().build();
    bytes.truncate(bytes.len() - 70);
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(
        e.to_string().split(':').next().unwrap(),
        "tensor info 4 `scalar`"
    );
    assert!(matches!(e.root(), GgufError::OutOfFile { .. }));
}

#[test]
fn no_tensors_no_padding_needed() {
    let b = Builder {
        version: 3,
        kvs: vec![Kv::string("general.name", "x")],
        tensors: vec![],
        alignment: 32,
    };
    let mut bytes = b.build();
    let header_len = 24 + 8 + 12 + 4 + 8 + 1;
    bytes.truncate(header_len);
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.header().data_offset(), 64);
    assert!(file.data().is_empty());
    assert_eq!(file.header().data_size(), 0);
}
