//! Unit tests of the reader and writer: round trips, accessors, and one test per kind of bad
//! input (every error must name the problem and its byte offset, never panic).

use super::writer::{write_str_bytes, write_string, write_value};
use super::*;
use crate::quant::GgmlType;

/// A small valid file: llama metadata, a vocab, two tensors.
fn minimal() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .add("llama.block_count", 2u32)
        .add("llama.context_length", 128u64)
        .add("llama.rope.freq_base", 10000.0f32)
        .add("llama.attention.layer_norm_rms_epsilon", 1e-5f64)
        .add("llama.use_parallel_residual", true)
        .add("llama.neg", -4i32)
        .add("tokenizer.ggml.tokens", vec!["a", "b", "<s>"])
        .add("tokenizer.ggml.scores", vec![0.0f32, -1.0, -2.0])
        .add("tokenizer.ggml.token_type", vec![1i32, 1, 3]);
    w.add_f32_tensor("token_embd.weight", &[4, 3], &[1.0; 12]);
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[32, 2],
        GgmlType::Q8_0,
        vec![7u8; 68],
    );
    w
}

#[test]
fn round_trip_minimal() {
    let bytes = minimal().to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.file_size(), bytes.len());
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.metadata().len(), 10);
    assert_eq!(f.metadata()[0].0, "general.architecture");
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.arch_key("block_count"), "llama.block_count");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_u32("llama.context_length").unwrap(), 128);
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert!(f.get_bool("llama.use_parallel_residual").unwrap());
    let toks = f.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.as_strings().unwrap(), ["a", "b", "<s>"]);
    assert_eq!(
        f.get_array("tokenizer.ggml.scores")
            .unwrap()
            .as_f32s()
            .unwrap(),
        [0.0, -1.0, -2.0]
    );
    assert_eq!(
        f.get_array("tokenizer.ggml.token_type")
            .unwrap()
            .as_i32s()
            .unwrap(),
        [1, 1, 3]
    );

    let t = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (t.shape.as_slice(), t.ty, t.offset),
        (&[4, 3][..], GgmlType::F32, 0)
    );
    assert_eq!(
        (t.n_elements, t.n_bytes, t.n_rows(), t.row_len()),
        (12, 48, 3, 4)
    );
    let data = f.tensor_bytes(t);
    assert_eq!(data.len(), 48);
    assert_eq!(&data[..4], &1.0f32.to_le_bytes());
    assert_eq!(data.file_offset(), f.data_offset());

    let q = f.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.offset, q.n_bytes, q.n_elements), (64, 68, 64));
    assert!(f.tensor_bytes(q).iter().all(|&b| b == 7));
    assert_eq!(f.tensor_file_offset(q), f.data_offset() + 64);
    assert_eq!(f.tensors().len(), 2);
    assert!(f.tensor_info("nope").is_none());

    // Writing back what was read gives the same bytes.
    assert_eq!(GgufWriter::from_file(&f).to_bytes(), bytes);
}

#[test]
fn version_2_reads_the_same() {
    let mut w = minimal();
    w.version = 2;
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn typed_accessor_errors() {
    let f = GgufFile::from_bytes(minimal().to_bytes()).unwrap();
    assert!(matches!(f.get_u32("missing"), Err(GgufError::MissingKey { key }) if key == "missing"));
    let e = f.get_str("llama.block_count").unwrap_err();
    assert_eq!(
        e.to_string(),
        "metadata key 'llama.block_count' has type u32, expected string"
    );
    assert!(matches!(
        f.get_u32("general.architecture"),
        Err(GgufError::WrongType {
            expected: "u32",
            found: "string",
            ..
        })
    ));
    assert!(matches!(
        f.get_u32("llama.neg"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        f.get_f32("llama.block_count"),
        Err(GgufError::WrongType {
            expected: "f32",
            found: "u32",
            ..
        })
    ));
    assert!(matches!(
        f.get_array("llama.block_count"),
        Err(GgufError::WrongType {
            expected: "array",
            ..
        })
    ));
    assert!(matches!(
        f.get_bool("llama.neg"),
        Err(GgufError::WrongType { .. })
    ));

    assert_eq!(f.opt_u32("missing").unwrap(), None);
    assert_eq!(f.opt_u32("llama.block_count").unwrap(), Some(2));
    assert!(f.opt_u32("general.architecture").is_err());
    assert_eq!(f.opt_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.opt_f32("missing").unwrap(), None);
    assert_eq!(f.opt_bool("missing").unwrap(), None);
    assert_eq!(f.opt_u64("missing").unwrap(), None);
    assert!(f.opt_array("tokenizer.ggml.tokens").unwrap().is_some());
}

#[test]
fn custom_alignment() {
    let mut w = minimal();
    w.set_alignment(64);
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor_info("blk.0.attn_q.weight").unwrap().offset, 64);
}

#[test]
fn no_tensors_no_metadata() {
    let f = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(f.metadata().is_empty() && f.tensors().is_empty());
    assert!(matches!(
        f.architecture(),
        Err(GgufError::MissingKey { .. })
    ));
    assert_eq!(f.arch_key("x"), ".x");
    // Without the trailing padding too.
    let f = GgufFile::from_bytes(GgufWriter::new().to_bytes()[..24].to_vec()).unwrap();
    assert_eq!(f.data_offset(), 32);
}

#[test]
fn open_maps_a_file() {
    let dir = std::env::temp_dir().join(format!("kiln-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("minimal.gguf");
    minimal().write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor_info("token_embd.weight").unwrap().clone();
    let view = f.tensor_bytes(&t);
    drop(f); // the view keeps the mapping alive
    assert_eq!(view.len(), 48);
    assert_eq!(&view[..4], &1.0f32.to_le_bytes());
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("missing.gguf"), "{e}");
    std::fs::write(dir.join("empty.gguf"), b"").unwrap();
    assert!(matches!(
        GgufFile::open(dir.join("empty.gguf")),
        Err(GgufError::BadMagic { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn foreign_tensor_info_is_clamped() {
    let f = GgufFile::from_bytes(minimal().to_bytes()).unwrap();
    let mut t = f.tensors()[0].clone();
    t.offset = usize::MAX - 3;
    assert!(f.tensor_bytes(&t).is_empty());
    t.offset = 0;
    t.n_bytes = usize::MAX;
    assert_eq!(f.tensor_bytes(&t).len(), f.file_size() - f.data_offset());
}

// Make sure the hand-encoding helpers used by the hostile tests agree with the writer.
#[test]
fn encoding_helpers() {
    let mut a = Vec::new();
    write_string(&mut a, "hi");
    let mut b = Vec::new();
    write_str_bytes(&mut b, b"hi");
    assert_eq!(a, b);
    let mut v = Vec::new();
    write_value(&mut v, &Value::U16(0x0102));
    assert_eq!(v, [2, 0, 0, 0, 2, 1]);
}

// ---------------------------------------------------------------------------------------------
// Hostile input. Each case builds a file that is wrong in exactly one way.
// ---------------------------------------------------------------------------------------------

/// Header with raw counts followed by `body`.
fn raw(version: u32, n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&n_tensors.to_le_bytes());
    out.extend_from_slice(&n_kv.to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn kv(key: &str, v: impl Into<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    write_string(&mut out, key);
    write_value(&mut out, &v.into());
    out
}

/// A raw body that starts a key-value pair: `key`, then its value type `ty` (the value to
/// follow).
fn key_of(key: &str, ty: u32) -> Vec<u8> {
    let mut body = Vec::new();
    write_string(&mut body, key);
    body.extend_from_slice(&ty.to_le_bytes());
    body
}

fn parse_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("parsed a bad file: {f:?}"),
        Err(e) => e,
    }
}

/// A one-tensor file whose tensor is described raw.
fn with_tensor(t: RawTensor) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").add_raw_tensor(t);
    w.to_bytes()
}

fn f32_tensor(name: &str, dims: &[u64]) -> RawTensor {
    let n: u64 = dims.iter().product();
    RawTensor {
        name: name.into(),
        dims: dims.to_vec(),
        type_id: GgmlType::F32.id(),
        offset: None,
        data: vec![0; (n * 4) as usize],
    }
}

#[test]
fn truncated_at_every_byte() {
    let bytes = minimal().to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        if len < data_end {
            let e = r.expect_err("truncated file parsed");
            match &e {
                GgufError::Truncated {
                    offset, need, have, ..
                } => {
                    assert!(offset + have == len && need > have, "len {len}: {e}");
                }
                GgufError::BadMagic { .. } => assert!(len < 4),
                GgufError::CountTooLarge { offset, .. } => assert!(*offset < len, "{e}"),
                GgufError::TensorOutOfBounds { file_size, .. } => {
                    assert_eq!(*file_size, len);
                    assert!(len >= f.data_offset() - 32, "len {len}: {e}");
                }
                other => panic!("len {len}: unexpected error {other}"),
            }
            assert!(e.to_string().contains("byte") || len < 4, "{e}");
        } else {
            // Only the trailing padding is missing: still a complete file.
            r.unwrap();
        }
    }
}

#[test]
fn wrong_magic() {
    let mut bytes = minimal().to_bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse_err(bytes);
    assert!(matches!(&e, GgufError::BadMagic { found } if found == b"GGML"));
    assert!(e.to_string().contains("47 47 55 46"), "{e}");
    assert!(matches!(
        parse_err(b"GG".to_vec()),
        GgufError::BadMagic { .. }
    ));
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 5, u32::MAX] {
        let e = parse_err(raw(v, 0, 0, &[]));
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{v}: {e}"
        );
    }
    let e = parse_err(raw(3u32.swap_bytes(), 0, 0, &[]));
    assert!(matches!(e, GgufError::BigEndian(3)), "{e}");
    assert!(e.to_string().contains("big-endian"));
}

#[test]
fn absurd_counts_fail_before_allocating() {
    // 2^60 tensors / key-value pairs in a 24-byte file.
    let e = parse_err(raw(3, 1 << 60, 0, &[]));
    assert!(
        matches!(e, GgufError::CountTooLarge { offset: 8, count, .. } if count == 1 << 60),
        "{e}"
    );
    assert!(e.to_string().contains("tensor count at byte 8"), "{e}");
    let e = parse_err(raw(3, 0, 1 << 60, &[]));
    assert!(
        matches!(e, GgufError::CountTooLarge { offset: 16, .. }),
        "{e}"
    );
    let e = parse_err(raw(3, u64::MAX, u64::MAX, &[0; 100]));
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    // Counts that fit one at a time but not together.
    let body = vec![0u8; 13 * 2];
    let e = parse_err(raw(3, 1, 2, &body));
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                offset: 8,
                max: 0,
                ..
            }
        ),
        "{e}"
    );

    // A key whose length is 2^60.
    let mut body = (1u64 << 60).to_le_bytes().to_vec();
    body.extend_from_slice(b"general.architecture");
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(e, GgufError::CountTooLarge { offset: 24, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("length of metadata key #0"), "{e}");

    // A string value whose length runs past the end.
    let mut body = key_of("general.name", 8);
    body.extend_from_slice(&1000u64.to_le_bytes());
    body.extend_from_slice(b"short");
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: 1000,
                max: 5,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("general.name"), "{e}");

    // Arrays of every element size with 2^60 (or just too many) elements.
    for (elem, count) in [
        (0u32, 1u64 << 60),
        (6, 5),
        (8, 1 << 60),
        (9, 1 << 60),
        (10, 3),
    ] {
        let mut body = key_of("tokenizer.ggml.tokens", 9);
        body.extend_from_slice(&elem.to_le_bytes());
        let count_at = 24 + body.len();
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&[0; 16]);
        let e = parse_err(raw(3, 0, 1, &body));
        assert!(
            matches!(&e, GgufError::CountTooLarge { offset, .. } if *offset == count_at),
            "elem {elem}: {e}"
        );
        assert!(
            e.to_string()
                .contains("array length of key 'tokenizer.ggml.tokens'"),
            "{e}"
        );
    }

    // An array of strings whose count fits but whose strings do not.
    let mut body = key_of("tokenizer.ggml.tokens", 9);
    body.extend_from_slice(&8u32.to_le_bytes());
    body.extend_from_slice(&2u64.to_le_bytes());
    write_string(&mut body, "ok");
    body.extend_from_slice(&3u64.to_le_bytes());
    body.extend_from_slice(b"ab");
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("string #1 of key 'tokenizer.ggml.tokens'"),
        "{e}"
    );
}

/// `depth` arrays nested inside each other, the innermost holding one u8.
fn nested(depth: usize) -> Array {
    let mut a = Array::U8(vec![1]);
    for _ in 1..depth {
        a = Array::Array(vec![a]);
    }
    a
}

#[test]
fn nested_arrays_have_bounded_depth() {
    let mut w = GgufWriter::new();
    w.add("x", nested(MAX_ARRAY_DEPTH));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.get_array("x").unwrap(), &nested(MAX_ARRAY_DEPTH));

    let mut w = GgufWriter::new();
    w.add("deep", nested(MAX_ARRAY_DEPTH + 1));
    let e = parse_err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::NestingTooDeep { key, .. } if key == "deep"),
        "{e}"
    );

    // A hand-made chain 100,000 deep must not overflow the stack.
    let mut body = key_of("deep", 9);
    for _ in 0..100_000 {
        body.extend_from_slice(&9u32.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
    }
    assert!(matches!(
        parse_err(raw(3, 0, 1, &body)),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn invalid_utf8_names_key_and_offset() {
    // In a key.
    let mut body = Vec::new();
    write_str_bytes(&mut body, b"bad\xffkey");
    write_value(&mut body, &Value::U8(0));
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset: 24, .. }),
        "{e}"
    );

    // In a string value.
    let mut body = kv("general.architecture", "llama");
    let at = 24 + body.len();
    write_string(&mut body, "general.name");
    let value_at = 24 + body.len() + 4;
    body.extend_from_slice(&8u32.to_le_bytes());
    write_str_bytes(&mut body, b"\xc3\x28");
    let e = parse_err(raw(3, 0, 2, &body));
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { offset, .. } if *offset == value_at),
        "{e}"
    );
    assert!(e.to_string().contains("'general.name'"), "{e}");
    assert!(value_at > at);

    // In one token of a vocabulary.
    let mut body = key_of("tokenizer.ggml.tokens", 9);
    body.extend_from_slice(&8u32.to_le_bytes());
    body.extend_from_slice(&2u64.to_le_bytes());
    write_string(&mut body, "fine");
    let tok_at = 24 + body.len();
    write_str_bytes(&mut body, b"\xed\xa0\x80"); // an encoded surrogate
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { offset, .. } if *offset == tok_at),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("string #1 of key 'tokenizer.ggml.tokens'"),
        "{e}"
    );

    // In a tensor name.
    let mut body = Vec::new();
    write_str_bytes(&mut body, b"blk.\x80");
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    let e = parse_err(raw(3, 1, 0, &body));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset: 24, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("name of tensor #0"), "{e}");
}

#[test]
fn unknown_value_type_and_bad_bool() {
    let mut body = key_of("k", 13);
    body.extend_from_slice(&[0; 8]);
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(
            e,
            GgufError::UnknownValueType {
                type_id: 13,
                offset: 33,
                ..
            }
        ),
        "{e}"
    );

    let mut body = key_of("k", 9);
    body.extend_from_slice(&99u32.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        "{e}"
    );

    let mut body = key_of("flag", 7);
    body.push(2);
    let e = parse_err(raw(3, 0, 1, &body));
    assert!(
        matches!(
            e,
            GgufError::BadBool {
                byte: 2,
                offset: 40,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn duplicates() {
    let mut w = minimal();
    w.add("llama.block_count", 3u32);
    let e = parse_err(w.to_bytes());
    assert!(matches!(&e, GgufError::DuplicateKey { key, .. } if key == "llama.block_count"));
    assert!(e.to_string().contains("at byte"), "{e}");

    let mut w = minimal();
    w.add_f32_tensor("token_embd.weight", &[1], &[0.0]);
    let e = parse_err(w.to_bytes());
    assert!(matches!(&e, GgufError::DuplicateTensor { name, .. } if name == "token_embd.weight"));
}

#[test]
fn bad_dimension_counts() {
    for dims in [vec![], vec![1, 1, 1, 1, 1]] {
        let e = parse_err(with_tensor(f32_tensor("t", &dims)));
        assert!(
            matches!(&e, GgufError::BadDimCount { n_dims, .. } if *n_dims as usize == dims.len()),
            "{e}"
        );
    }
    // n_dims = 2^32 - 1 must not allocate or loop.
    let mut body = Vec::new();
    write_string(&mut body, "t");
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(&[0; 32]);
    assert!(matches!(
        parse_err(raw(3, 1, 0, &body)),
        GgufError::BadDimCount { .. }
    ));
    // Four dims is the maximum and fine.
    GgufFile::from_bytes(with_tensor(f32_tensor("t", &[2, 1, 3, 1]))).unwrap();
}

#[test]
fn zero_dims() {
    let e = parse_err(with_tensor(f32_tensor("t", &[4, 0])));
    assert!(
        matches!(&e, GgufError::ZeroDim { shape, .. } if shape == &[4, 0]),
        "{e}"
    );
    assert!(e.to_string().contains("tensor 't'"), "{e}");
}

#[test]
fn element_count_overflow() {
    for dims in [
        vec![1u64 << 32, 1 << 32],
        vec![u64::MAX],
        vec![1 << 63],
        vec![1 << 31, 1 << 31, 4],
        vec![1 << 62, 2], // elements fit in usize but not in i64 (or bytes in usize)
    ] {
        let mut t = f32_tensor("t", &[1]);
        t.dims = dims.clone();
        let e = parse_err(with_tensor(t));
        assert!(
            matches!(e, GgufError::ShapeOverflow { .. }),
            "{dims:?}: {e}"
        );
    }
    // Elements fit but the byte size does not.
    let mut t = f32_tensor("t", &[1]);
    t.dims = vec![1 << 61, 2];
    assert!(matches!(
        parse_err(with_tensor(t)),
        GgufError::ShapeOverflow { .. }
    ));
}

#[test]
fn unknown_and_unsupported_ggml_types() {
    let mut t = f32_tensor("blk.0.ffn_down.weight", &[256]);
    t.type_id = 34;
    let e = parse_err(with_tensor(t.clone()));
    assert!(
        matches!(e, GgufError::UnsupportedType { type_id: 34, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("TQ1_0") && msg.contains("is not supported"),
        "{msg}"
    );
    assert!(msg.contains("blk.0.ffn_down.weight"), "{msg}");
    t.type_id = 1000;
    let msg = parse_err(with_tensor(t)).to_string();
    assert!(msg.contains("ggml type 1000 (unknown)"), "{msg}");
}

#[test]
fn rows_must_be_whole_blocks() {
    // 96 elements is three Q4_0 blocks, but rows of 48 split a block.
    let t = RawTensor {
        name: "w".into(),
        dims: vec![48, 2],
        type_id: GgmlType::Q4_0.id(),
        offset: None,
        data: vec![0; 54],
    };
    let e = parse_err(with_tensor(t));
    assert!(
        matches!(
            e,
            GgufError::PartialBlock {
                row: 48,
                block: 32,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("Q4_0"), "{e}");
}

#[test]
fn tensor_data_past_the_end() {
    let mut t = f32_tensor("t", &[16]);
    t.data.truncate(16); // 16 bytes + 16 of padding: half the declared 64
    let e = parse_err(with_tensor(t));
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { name, .. } if name == "t"),
        "{e}"
    );

    let mut t = f32_tensor("t", &[8]);
    t.offset = Some(1 << 40);
    assert!(matches!(
        parse_err(with_tensor(t)),
        GgufError::TensorOutOfBounds { .. }
    ));
    let mut t = f32_tensor("t", &[8]);
    t.offset = Some(u64::MAX - 31); // aligned, and start + size overflows u64
    assert!(matches!(
        parse_err(with_tensor(t)),
        GgufError::TensorOutOfBounds { .. }
    ));
}

#[test]
fn unaligned_offsets() {
    let mut w = GgufWriter::new();
    w.add_raw_tensor(f32_tensor("a", &[8]));
    let mut b = f32_tensor("b", &[4]);
    b.offset = Some(48);
    w.add_raw_tensor(b);
    let e = parse_err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::UnalignedTensor { name, data_offset: 48, alignment: 32, .. } if name == "b"),
        "{e}"
    );
}

#[test]
fn overlapping_tensors() {
    let mut w = GgufWriter::new();
    w.add_raw_tensor(f32_tensor("a", &[16]));
    let mut b = f32_tensor("b", &[8]);
    b.offset = Some(32); // inside a's 64 bytes
    w.add_raw_tensor(b);
    let e = parse_err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second, .. } if first == "a" && second == "b"),
        "{e}"
    );
    // Two tensors at the same offset, declared in reverse order.
    let mut w = GgufWriter::new();
    let mut a = f32_tensor("a", &[8]);
    a.offset = Some(0);
    let mut b = f32_tensor("b", &[8]);
    b.offset = Some(0);
    w.add_raw_tensor(a).add_raw_tensor(b);
    assert!(matches!(
        parse_err(w.to_bytes()),
        GgufError::OverlappingTensors { .. }
    ));
    // Touching is fine.
    let mut w = GgufWriter::new();
    w.add_raw_tensor(f32_tensor("a", &[8]))
        .add_raw_tensor(f32_tensor("b", &[8]));
    GgufFile::from_bytes(w.to_bytes()).unwrap();
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for bad in [
        Value::U32(0),
        Value::U32(3),
        Value::U32(48),
        Value::I32(-32),
        Value::String("32".into()),
        Value::U64(1 << 40),
    ] {
        let mut w = minimal();
        w.add("general.alignment", bad.clone());
        let e = parse_err(w.to_bytes());
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{bad:?}: {e}");
        assert!(e.to_string().contains("general.alignment"), "{e}");
    }
    // Any integer type holding a power of two is accepted (llama.cpp writes u32).
    let mut w = minimal();
    w.add("general.alignment", 32u64);
    assert_eq!(GgufFile::from_bytes(w.to_bytes()).unwrap().alignment(), 32);
}
