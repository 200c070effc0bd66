//! The Python bindings (python/): built with maturin and checked by their pytest suite
//! (python/tests/test_bindings.py) against the `kiln` binary on random fixture models: greedy
//! generations equal `kiln run`'s, streams equal whole answers, JSON-schema answers parse,
//! tokens equal `kiln tokenize`'s, embeddings equal `kiln embedding`'s, errors raise the
//! right Python exceptions, Ctrl-C stops a generation.
//!
//! The test makes its own Python environment (`target/py-bindings-venv`, with the pinned
//! maturin and pytest, made once and reused; see tests/server/pyenv.rs), builds the wheel
//! into `target/py-bindings` with a cargo target directory of its own there (a nested cargo
//! never waits on this one's lock; the first build compiles the dependencies once), unpacks
//! it, and runs pytest with it on `PYTHONPATH`. Only `python3`, a C compiler and network access
//! to PyPI (the first time) are needed; no Python headers (the extension is abi3).

mod common;
#[path = "server/pyenv.rs"]
mod pyenv;

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::gguf::{GgufFile, GgufWriter};
use kiln::tokenizer::builtin_chat_template;

/// The build and test tools, pinned to the versions the suite was last run with.
const PY_PACKAGES: [&str; 2] = ["maturin==1.16.0", "pytest==8.4.2"];

fn run(c: &mut Command, what: &str) {
    let status = c.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        status.success(),
        "{what} failed ({status}); see its output above"
    );
}

/// `target/py-bindings`: the wheel, its cargo target directory, the chat fixture.
fn bindings_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("py-bindings")
}

/// Build the bindings' wheel and unpack it; the folder to put on `PYTHONPATH`.
fn build_bindings(python: &pyenv::Python) -> PathBuf {
    let repo = common::repo_dir();
    let target = bindings_dir();
    let wheels = target.join("wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    run(
        python
            .command()
            .args([
                "-m",
                "maturin",
                "build",
                "--release",
                "--quiet",
                "--manifest-path",
            ])
            .arg(repo.join("python/Cargo.toml"))
            .arg("--target-dir")
            .arg(target.join("cargo"))
            .arg("--out")
            .arg(&wheels)
            // The workspace's lock file holds every version: build what it pins.
            .arg("--locked"),
        "maturin build of python/",
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("the wheel folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin made a wheel");
    let site = target.join("site");
    let _ = std::fs::remove_dir_all(&site);
    run(
        python
            .command()
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&site),
        "unpacking the wheel",
    );
    site
}

/// The random llama with a ChatML template (the fixtures have none): what the chat tests,
/// `kiln run --chat` and the bindings' chat render with.
fn chat_model(dir: &Path) -> PathBuf {
    let plain = common::random_model("random-llama-q4_0");
    let f = GgufFile::open(&plain).expect("open the fixture");
    let mut w = GgufWriter::from_file(&f);
    let template = builtin_chat_template("chatml").expect("kiln knows ChatML");
    w.set("tokenizer.chat_template", template);
    std::fs::create_dir_all(dir).expect("the bindings' folder");
    let path = dir.join("random-llama-q4_0-chatml.gguf");
    let tmp = dir.join(format!(
        "random-llama-q4_0-chatml.gguf.{}",
        std::process::id()
    ));
    w.write(&tmp).expect("write the chat fixture");
    std::fs::rename(&tmp, &path).expect("put the chat fixture in place");
    path
}

#[test]
fn python_bindings_pytest_suite() {
    let model = common::random_model("random-llama-q4_0");
    let encoder = common::random_model("random-bert-f32");
    let chat = chat_model(&bindings_dir());
    let python = pyenv::python_env("py-bindings-venv", &PY_PACKAGES, "maturin, pytest");
    let site = build_bindings(&python);
    let mut pytest = python.command();
    // The bindings first, then whatever the environment's layout puts on the path.
    let mut path = site.into_os_string();
    if let Some((_, Some(p))) = pytest.get_envs().find(|(k, _)| *k == "PYTHONPATH") {
        path.push(":");
        path.push(p);
    }
    let tests = common::repo_dir().join("python/tests");
    run(
        pytest
            .env("PYTHONPATH", path)
            .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
            .env("KILN_TEST_MODEL", &model)
            .env("KILN_TEST_ENCODER", &encoder)
            .env("KILN_TEST_CHAT_MODEL", &chat)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&tests),
        "the Python bindings' pytest suite",
    );
}
