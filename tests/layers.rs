//! The source tree's import structure (scripts/check-layers.py): no cycle between files and no
//! folder importing one above it in the order docs/architecture.md's module map gives. The
//! checker is also run on small trees that break each rule, so it is known to catch them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run the checker (on `src`, or on the repository's src/), returning (success, its output).
fn check(src: Option<&Path>) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("scripts/check-layers.py"));
    if let Some(s) = src {
        cmd.arg("--src").arg(s);
    }
    let out = cmd.output().expect("run python3 scripts/check-layers.py");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A source tree of `files` (path under src/, text) in a fresh folder.
fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("check-layers")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

#[test]
fn source_tree_has_no_cycle_and_no_upward_import() {
    let (ok, out) = check(None);
    assert!(ok, "scripts/check-layers.py:\n{out}");
}

/// The layers the small trees use: gguf at the bottom, kernels above it, model above that.
const LIB: &str = "pub mod gguf;\npub mod kernels;\npub mod model;\n";

#[test]
fn checker_passes_a_clean_tree() {
    let src = tree(
        "clean",
        &[
            ("lib.rs", LIB),
            ("gguf/mod.rs", "pub struct File;\n"),
            (
                "kernels/mod.rs",
                "pub mod ops;\npub use ops::Rope;\npub fn run() { ops::go() }\n",
            ),
            // a child naming its parent's items is no cycle
            (
                "kernels/ops.rs",
                "use super::run;\npub struct Rope;\npub fn go() {}\n",
            ),
            (
                "model/mod.rs",
                "use crate::gguf::File;\nuse crate::kernels::Rope;\npub fn f(_: File, _: Rope) {}\n",
            ),
        ],
    );
    let (ok, out) = check(Some(&src));
    assert!(ok, "{out}");
}

#[test]
fn checker_finds_an_upward_import() {
    let src = tree(
        "upward",
        &[
            ("lib.rs", LIB),
            // inline path, through a re-export of model/mod.rs
            (
                "gguf/mod.rs",
                "pub fn f() -> crate::model::Config { todo!() }\n",
            ),
            ("kernels/mod.rs", "\n"),
            ("model/mod.rs", "mod config;\npub use config::Config;\n"),
            ("model/config.rs", "pub struct Config;\n"),
        ],
    );
    let (ok, out) = check(Some(&src));
    assert!(!ok, "{out}");
    assert!(
        out.contains("upward import: gguf/mod.rs (gguf) -> model/config.rs (model)"),
        "{out}"
    );
}

#[test]
fn checker_finds_a_cycle_between_siblings() {
    let src = tree(
        "cycle",
        &[
            ("lib.rs", LIB),
            ("gguf/mod.rs", "\n"),
            ("kernels/mod.rs", "pub mod a;\npub mod b;\n"),
            // `use super::b;` then `b::B`: the module bound by a use is followed
            ("kernels/a.rs", "use super::b;\npub struct A;\npub fn f(_: b::B) {}\n"),
            (
                "kernels/b.rs",
                "use crate::kernels::a::{self as other};\npub struct B;\npub fn g(_: other::A) {}\n",
            ),
            ("model/mod.rs", "\n"),
        ],
    );
    let (ok, out) = check(Some(&src));
    assert!(!ok, "{out}");
    assert!(out.contains("cycle: kernels/a.rs, kernels/b.rs"), "{out}");
}

#[test]
fn checker_ignores_test_code() {
    let src = tree(
        "tests",
        &[
            ("lib.rs", LIB),
            (
                "gguf/mod.rs",
                "#[cfg(test)]\nmod tests {\n    use crate::model::M;\n}\n",
            ),
            ("kernels/mod.rs", "\n"),
            ("model/mod.rs", "pub struct M;\n"),
        ],
    );
    let (ok, out) = check(Some(&src));
    assert!(ok, "{out}");
}
