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
    // Lossy: golden lines may carry generated text of a random model that is not valid UTF-8;
    // only the ids and logits are compared.
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect()
}

/// The real models, by their kiln short name: `smollm2` or `gemma3`.
/// They live in `$KILN_MODELS` or `~/.cache/kiln/models`; a missing one is downloaded
/// (as `kiln pull` would), a present one is verified once and then used as is.
pub fn real_model(name: &str) -> PathBuf {
    kiln::fetch::resolve_model(Some(name), false)
        .unwrap_or_else(|e| panic!("real model {name}: {e}"))
}
pub mod golden;
