//! Every reference model parses, and tensor layouts match what llama.cpp reported
//! (`tests/golden/dequant.json`: type, `ne`, absolute `data_offset`, `n_bytes`).

mod common;

use kiln::gguf::GgufFile;
use kiln::quant::GgmlType;

#[test]
fn every_fixture_model_parses() {
    let mut n = 0;
    for name in common::random_model_names() {
        let path = common::random_model(&name);
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(matches!(f.version(), 2 | 3));
        let arch = f.architecture().unwrap();
        assert!(kiln::model::Arch::from_name(arch).is_some(), "{arch}");
        assert_eq!(
            f.get_u32(&f.arch_key("block_count")).unwrap(),
            4,
            "{}",
            path.display()
        );
        assert_eq!(f.get_u32(&f.arch_key("embedding_length")).unwrap(), 256);
        let vocab = f.get_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(vocab.as_strings().unwrap().len(), 277);
        assert!(f.tensor_info("token_embd.weight").is_some());
        // Tensors tile the data section: each one's view has the declared size and lies
        // inside the file.
        for t in f.tensors() {
            let b = f.tensor_bytes(t);
            assert_eq!(b.len(), t.n_bytes, "{}", t.name);
            assert_eq!(b.file_offset(), f.data_offset() + t.offset);
            assert!(b.file_offset() + b.len() <= f.file_size());
        }
        n += 1;
    }
    assert!(n >= 19, "only {n} fixture models");
}

#[test]
fn tensor_layout_matches_reference() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("dequant.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for (file, tensors) in golden.as_object().unwrap() {
        let f = GgufFile::open(common::random_model(file.trim_end_matches(".gguf"))).unwrap();
        for (name, want) in tensors.as_object().unwrap() {
            let t = f
                .tensor_info(name)
                .unwrap_or_else(|| panic!("{file}: no tensor {name}"));
            let ty = GgmlType::from_name(want["type"].as_str().unwrap()).unwrap();
            let ne: Vec<usize> = want["ne"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(t.ty, ty, "{file} {name}");
            assert_eq!(t.shape, ne, "{file} {name}");
            assert_eq!(
                t.n_elements as u64,
                want["n"].as_u64().unwrap(),
                "{file} {name}"
            );
            assert_eq!(
                t.n_bytes as u64,
                want["n_bytes"].as_u64().unwrap(),
                "{file} {name}"
            );
            // The reference's data_offset is absolute: data section start + tensor offset.
            let abs = f.tensor_file_offset(t) as u64;
            assert_eq!(abs, want["data_offset"].as_u64().unwrap(), "{file} {name}");
            assert_eq!(f.tensor_bytes(t).file_offset() as u64, abs);
            assert_ne!(t.offset as u64, abs, "offsets are relative, not absolute");
            checked += 1;
        }
    }
    // Three tensors of each of the 15 random-llama files (every block format), and two MXFP4
    // expert tensors of random-gpt-oss-mxfp4.
    assert_eq!(checked, 47);
}

#[test]
fn real_models_parse() {
    let f = GgufFile::open(common::real_model("smollm2")).unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.file_size(), 98_362_432);
    let n: usize = f.tensors().iter().map(|t| t.n_elements).sum();
    assert_eq!(n, 134_515_008);

    let g = GgufFile::open(common::real_model("gemma3")).unwrap();
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(g.get_u32("gemma3.block_count").unwrap(), 18);
    let toks = g
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .as_strings()
        .unwrap();
    let scores = g
        .get_array("tokenizer.ggml.scores")
        .unwrap()
        .as_f32s()
        .unwrap();
    assert_eq!(toks.len(), 262_144);
    assert_eq!(scores.len(), 262_144);
    let types: std::collections::BTreeSet<_> = g.tensors().iter().map(|t| t.ty).collect();
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::F32] {
        assert!(types.contains(&ty), "{types:?}");
    }
}
