//! `kiln inspect` end to end: run the built binary and check its JSON (and text) output.

mod common;

use std::path::Path;
use std::process::Command;

fn inspect(path: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("inspect")
        .arg(path)
        .args(extra)
        .output()
        .expect("run kiln");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn inspect_json(path: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = inspect(path, &args);
    assert!(ok, "kiln inspect failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

fn format<'a>(j: &'a serde_json::Value, ty: &str) -> &'a serde_json::Value {
    j["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["type"] == ty)
        .unwrap_or_else(|| panic!("no {ty} in {}", j["formats"]))
}

#[test]
fn random_llama_json_and_tensors() {
    let path = common::random_model("random-llama-q4_0");
    let j = inspect_json(&path, &["--tensors"]);
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["name"], "random-llama");
    assert_eq!(j["gguf_version"], 3);
    assert_eq!(j["layers"], 4);
    assert_eq!(j["heads"], 8);
    assert_eq!(j["kv_heads"], 2);
    assert_eq!(j["embedding_dim"], 256);
    assert_eq!(j["ffn_dim"], 768);
    assert_eq!(j["context_length"], 4096);
    assert_eq!(j["rope_freq_base"], 500000.0);
    assert!(j["head_dim"].is_null());
    assert_eq!(j["tokenizer_model"], "gpt2");
    assert_eq!(j["tokenizer_pre"], "gpt-2");
    assert_eq!(j["vocab_size"], 277);
    assert_eq!(j["chat_template"], false);
    assert_eq!(j["tensor_count"], 39);
    assert_eq!(j["file_size"], std::fs::metadata(&path).unwrap().len());

    // The tensor list agrees with the summary and with the reference layout.
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 39);
    let params: u64 = tensors
        .iter()
        .map(|t| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>()
        })
        .sum();
    assert_eq!(j["parameters"].as_u64().unwrap(), params);
    let bytes: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(j["tensor_bytes"].as_u64().unwrap(), bytes);
    let per_format: u64 = j["formats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(per_format, bytes);
    let q = tensors
        .iter()
        .find(|t| t["name"] == "blk.0.attn_q.weight")
        .unwrap();
    assert_eq!(q["type"], "Q4_0");
    assert_eq!(q["shape"], serde_json::json!([256, 256]));
    assert_eq!(q["file_offset"], 135136); // tests/golden/dequant.json
    assert_eq!(q["bytes"], 36864);
    assert_eq!(
        format(&j, "Q4_0")["tensors"].as_u64().unwrap()
            + format(&j, "F32")["tensors"].as_u64().unwrap(),
        39
    );

    // Without --tensors the list is absent.
    assert!(inspect_json(&path, &[]).get("tensors").is_none());
}

#[test]
fn text_output_and_errors() {
    let path = common::random_model("random-qwen3-q4_k_m");
    let (ok, out, _) = inspect(&path, &["--tensors"]);
    assert!(ok);
    for want in [
        "architecture     qwen3",
        "head dim         64",
        "parameters       3.8 M",
        "Q4_K",
        "blk.3.ffn_up.weight",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }

    // A file that is not GGUF fails with the reason, not a panic.
    let bogus = std::env::temp_dir().join(format!("kiln-inspect-{}.gguf", std::process::id()));
    std::fs::write(&bogus, b"not a model at all").unwrap();
    let (ok, _, err) = inspect(&bogus, &[]);
    std::fs::remove_file(&bogus).unwrap();
    assert!(!ok);
    assert!(err.contains("not a GGUF file"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (ok, _, err) = inspect(Path::new("/nonexistent/x.gguf"), &[]);
    assert!(!ok && err.contains("/nonexistent/x.gguf"), "{err}");
}

#[test]
fn smollm2() {
    let j = inspect_json(&common::real_model("smollm2"), &[]);
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["layers"], 30);
    assert_eq!(j["embedding_dim"], 576);
    assert_eq!(j["heads"], 9);
    assert_eq!(j["kv_heads"], 3);
    assert_eq!(j["ffn_dim"], 1536);
    assert_eq!(j["context_length"], 8192);
    assert_eq!(j["rope_freq_base"], 100000.0);
    // llama.cpp: "model params = 134.52 M".
    assert_eq!(j["parameters"], 134_515_008);
    assert_eq!(j["tokenizer_model"], "gpt2");
    assert_eq!(j["tokenizer_pre"], "smollm");
    assert_eq!(j["vocab_size"], 49152);
    assert_eq!(j["chat_template"], true);
    assert_eq!(j["tensor_count"], 272);
    assert_eq!(j["file_size"], 98_362_432);
    for ty in ["Q4_1", "Q8_0", "F32"] {
        assert!(format(&j, ty)["bytes"].as_u64().unwrap() > 0);
    }
    assert!(j["warnings"].as_array().unwrap().is_empty());

    let (ok, out, _) = inspect(&common::real_model("smollm2"), &[]);
    assert!(ok && out.contains("134.5 M"), "{out}");
}

#[test]
fn gemma3() {
    let j = inspect_json(&common::real_model("gemma3"), &[]);
    assert_eq!(j["architecture"], "gemma3");
    assert_eq!(j["layers"], 18);
    assert_eq!(j["embedding_dim"], 640);
    assert_eq!(j["heads"], 4);
    assert_eq!(j["kv_heads"], 1);
    assert_eq!(j["head_dim"], 256);
    assert_eq!(j["ffn_dim"], 2048);
    assert_eq!(j["tokenizer_model"], "llama");
    assert_eq!(j["vocab_size"], 262_144);
    assert_eq!(j["file_size"], 253_113_024);
    for ty in ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"] {
        assert!(format(&j, ty)["tensors"].as_u64().unwrap() > 0, "{ty}");
    }
}
