//! The reference's own tokenizer test vectors: every `models/ggml-vocab-*.gguf` of llama.cpp that
//! has `.inp` / `.out` files, tokenized as its `tests/test-tokenizer-0.cpp` does (no BOS / EOS,
//! special-token text spelled out) and compared id for id. All of them must pass.
//!
//! The vocabularies come from the reference's source package (`llama-cpp-python` 0.3.36, the
//! one `scripts/reference.py` builds): reused from `$KILN_CACHE/ref/src` (default
//! `~/.cache/kiln/ref/src`) when it is unpacked there, else `pip download`ed into that folder
//! and its `models/` extracted with the system `tar` into `$KILN_CACHE/vocab-vectors`.
//!
//! The pre-tokenizers the package has no vectors for (`gpt-4o`, `tekken`, `deepseek-v3`) are
//! checked on its vocabularies with `tokenizer.ggml.pre` rewritten, against the ids the
//! reference's `llama-tokenize` gave for the same rewrite (`tests/golden/pre_tokenizers.json`,
//! made by `scripts/pre-tokenizer-golden.py`).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::gguf::{GgufFile, GgufWriter};
use kiln::tokenizer::Tokenizer;
use serde_json::Value;

mod common;

const PACKAGE: &str = "llama-cpp-python";
const VERSION: &str = "0.3.36";
/// The separator line between the `.inp` texts.
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").expect("HOME or KILN_CACHE must be set");
    PathBuf::from(home).join(".cache").join("kiln")
}

/// The folder holding `ggml-vocab-*.gguf` and their vectors, fetched once per process.
fn vectors_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(fetch_vectors).clone()
}

fn fetch_vectors() -> PathBuf {
    let stem = format!("llama_cpp_python-{VERSION}");
    let cache = cache_dir();
    let models_in = |root: &Path| root.join(&stem).join("vendor/llama.cpp/models");
    let src = cache.join("ref").join("src");
    let unpacked = models_in(&src);
    if unpacked.join("ggml-vocab-gpt-2.gguf.inp").exists() {
        return unpacked;
    }
    let mine = cache.join("vocab-vectors");
    if models_in(&mine).join("ggml-vocab-gpt-2.gguf.inp").exists() {
        return models_in(&mine);
    }
    let sdist = src.join(format!("{stem}.tar.gz"));
    if !sdist.exists() {
        std::fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let pip = ["python3", "-m", "pip"];
        let out = Command::new(pip[0])
            .args(&pip[1..])
            .args(["download", "--no-deps", "--no-binary", PACKAGE])
            .args(["--disable-pip-version-check", "--no-input", "-d"])
            .arg(&src)
            .arg(format!("{PACKAGE}=={VERSION}"))
            .output();
        match out {
            Ok(o) if o.status.success() && sdist.exists() => {}
            Ok(o) => panic!(
                "the tokenizer vectors need the reference's source package: `python3 -m pip \
                 download --no-deps --no-binary {PACKAGE} {PACKAGE}=={VERSION} -d {}` failed \
                 ({}):\n{}",
                src.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!(
                "the tokenizer vectors need the reference's source package, fetched with \
                 `python3 -m pip`, which could not run: {e}"
            ),
        }
    }
    std::fs::create_dir_all(&mine).unwrap_or_else(|e| panic!("{}: {e}", mine.display()));
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&mine)
        .arg("--wildcards")
        .arg(format!("{stem}/vendor/llama.cpp/models/ggml-vocab-*"))
        .output()
        .unwrap_or_else(|e| panic!("`tar` could not run to unpack {}: {e}", sdist.display()));
    assert!(
        out.status.success(),
        "tar -xzf {} failed: {}",
        sdist.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    models_in(&mine)
}

/// `(text, ids)` pairs of one vocabulary, read as test-tokenizer-0.cpp reads them (a later
/// duplicate text replaces the earlier one there; the vectors have none that disagree).
fn read_vectors(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap_or_else(|e| panic!("{}: {e}", inp.display()));
    let ids = std::fs::read_to_string(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    // As test-tokenizer-0.cpp splits: a separator at the very end starts no further text.
    let mut texts: Vec<&str> = raw.split(SEPARATOR).collect();
    if raw.is_empty() || raw.ends_with(SEPARATOR) {
        texts.pop();
    }
    let lines: Vec<&str> = ids.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{}: {} texts but {} id lines",
        inp.display(),
        texts.len(),
        lines.len()
    );
    texts
        .into_iter()
        .zip(lines)
        .map(|(t, l)| {
            let ids = l
                .split_whitespace()
                .map(|x| x.parse().expect("token id"))
                .collect();
            (t.to_string(), ids)
        })
        .collect()
}

#[test]
fn every_reference_vocab_vector_matches() {
    let dir = vectors_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .filter(|p| p.with_extension("gguf.inp").exists())
        .collect();
    files.sort();
    assert!(
        files.len() >= 15,
        "only {} vocabularies with vectors in {}",
        files.len(),
        dir.display()
    );

    let (mut total, mut passed) = (0, 0);
    let mut failures = Vec::new();
    let mut report = String::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let vectors = read_vectors(
            &path.with_extension("gguf.inp"),
            &path.with_extension("gguf.out"),
        );
        let tok = GgufFile::open(path)
            .map_err(|e| e.to_string())
            .and_then(|f| Tokenizer::from_gguf(&f).map_err(|e| e.to_string()));
        let tok = match tok {
            Ok(t) => t,
            Err(e) => {
                total += vectors.len();
                report += &format!("  {name}: 0/{} (does not load: {e})\n", vectors.len());
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut ok = 0;
        for (text, want) in &vectors {
            let got = tok.encode(text, false, false);
            if &got == want {
                ok += 1;
            } else if failures.len() < 40 {
                failures.push(format!("{name}: {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
        report += &format!("  {name}: {ok}/{}\n", vectors.len());
        total += vectors.len();
        passed += ok;
    }
    eprintln!(
        "reference tokenizer vectors ({}):\n{report}  all: {passed}/{total}",
        dir.display()
    );
    assert!(
        failures.is_empty(),
        "{passed}/{total} vectors pass; first failures:\n{}",
        failures.join("\n")
    );
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn pre_tokenizers_without_vectors_match_the_reference() {
    let path = common::golden_dir().join("pre_tokenizers.json");
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    let texts: Vec<&str> = doc["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let dir = vectors_dir();
    let mut failures = Vec::new();
    let mut report = String::new();
    for case in doc["cases"].as_array().unwrap() {
        let pre = case["pre"].as_str().unwrap();
        let vocab = case["vocab"].as_str().unwrap();
        let file = GgufFile::open(dir.join(vocab)).unwrap();
        let mut w = GgufWriter::from_file(&file);
        w.set("tokenizer.ggml.pre", pre);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{pre}: {e}"));
        assert_eq!(tok.pre_tokenizer(), Some(pre));
        let mut ok = 0;
        let mut n = 0;
        for (key, add_special) in [("ids", false), ("ids_special", true)] {
            for (text, want) in texts.iter().zip(case[key].as_array().unwrap()) {
                let got = tok.encode(text, add_special, false);
                n += 1;
                if got == ids(want) {
                    ok += 1;
                } else if failures.len() < 40 {
                    failures.push(format!(
                        "{pre} on {vocab} ({key}): {text:?}\n  got  {got:?}\n  want {want}"
                    ));
                }
            }
        }
        report += &format!("  {pre} (on {vocab}): {ok}/{n}\n");
    }
    eprintln!("pre-tokenizers against llama-tokenize:\n{report}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
