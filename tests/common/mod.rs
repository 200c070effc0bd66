//! Helpers shared by the integration tests: where the reference data and models live.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared` beside the repository (CI clones the repo with `shared/` beside it),
/// or `$KILN_SHARED`.
pub fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var("KILN_SHARED") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
}

/// A small random-weight model from `shared/models`, e.g. `random-llama-q4_0`.
pub fn random_model(stem: &str) -> PathBuf {
    let p = shared_dir().join("models").join(format!("{stem}.gguf"));
    assert!(
        p.exists(),
        "missing reference model {} (is ../shared beside the repo?)",
        p.display()
    );
    p
}

/// The golden data copied into the repository (`tests/golden`).
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

/// Read a JSON-lines golden file.
pub fn read_jsonl(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect()
}

/// The real models, by their kiln short name: `smollm2` or `gemma3`.
/// They live in `$KILN_MODELS` or `~/.cache/kiln/models` (fetched by `kiln pull`).
pub fn real_model(name: &str) -> PathBuf {
    let file = match name {
        "smollm2" => "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma3" => "gemma-3-270m-q4_k_m.gguf",
        other => panic!("unknown real model {other}"),
    };
    let dir = match std::env::var("KILN_MODELS") {
        Ok(d) => PathBuf::from(d),
        Err(_) => PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/kiln/models"),
    };
    let p = dir.join(file);
    assert!(
        p.exists(),
        "missing real model {} (run `kiln pull {name}`)",
        p.display()
    );
    p
}
