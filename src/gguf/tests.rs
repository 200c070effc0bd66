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
