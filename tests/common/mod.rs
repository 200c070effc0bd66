//! Helpers shared by the integration tests: where the reference data and models live.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use kiln::fixtures::Manifest;

/// `tests/golden/models.json`: how every fixture model is made (see `kiln::fixtures`).
pub fn manifest() -> &'static Manifest {
    static M: OnceLock<Manifest> = OnceLock::new();
    M.get_or_init(|| {
        let path = golden_dir().join("models.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Manifest::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// Where the fixture models are made: the cargo target directory, so a fresh clone makes them
/// once and `cargo clean` forgets them.
pub fn fixtures_dir() -> PathBuf {
    tmp_dir().join("fixtures")
}

/// The tests' scratch folder: `CARGO_TARGET_TMPDIR`, or `$KILN_TEST_TMP` where the test
/// binaries run away from their build tree (the GPU machine: `scripts/gpu-check.sh`).
pub fn tmp_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_TMP") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    }
}

/// The repository: `CARGO_MANIFEST_DIR`, or `$KILN_TEST_ROOT` (as [`tmp_dir`]).
pub fn repo_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_ROOT") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// A small random-weight model, e.g. `random-llama-q4_0`: made by the test suite (generator and
/// quantizers of `kiln::fixtures`) and checked byte for byte against the file the reference
/// engine's quantizer wrote, whose outputs are the goldens. Every name in the manifest.
pub fn random_model(stem: &str) -> PathBuf {
    // One maker at a time in this process; other processes are safe too (atomic rename).
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    kiln::fixtures::build(manifest(), stem, &fixtures_dir())
        .unwrap_or_else(|e| panic!("fixture {stem}: {e}"))
}

/// Every fixture model's name.
pub fn random_model_names() -> Vec<String> {
    manifest().models.keys().cloned().collect()
}

/// The golden data copied into the repository (`tests/golden`).
pub fn golden_dir() -> PathBuf {
    repo_dir().join("tests").join("golden")
}

/// The bytes of a hex string (the block goldens written by `scripts/make-fixtures.py`).
pub fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The little-endian f32 values of a hex string.
pub fn f32s_le(hex_le: &str) -> Vec<f32> {
    hex(hex_le)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `got` equals `want` bit for bit, element by element; a failure names `what` and the element.
pub fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
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
/// `$KILN_REAL_<NAME>` stands in for it where it cannot be downloaded (the GPU machine, which
/// has twins: the real header and tokenizer with random blocks).
pub fn real_model(name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(format!("KILN_REAL_{}", name.to_uppercase())) {
        return PathBuf::from(p);
    }
    kiln::fetch::resolve_model(Some(name), false)
        .unwrap_or_else(|e| panic!("real model {name}: {e}"))
}
pub mod batch;
pub mod cli;
pub mod golden;
pub mod ops;

/// The software GPU's library (`kiln::backend::cuda::nvrtc::emulator_source` built by the host's
/// C++ compiler, `$CXX` or `c++`), built once per source into the target directory.
///
/// Err only where the software GPU cannot run at all (not x86-64: its fibers are x86-64 code);
/// the GPU tests are `#[ignore]`d there (they need a GPU), and fail if run anyway without one.
/// On x86-64 every failure panics with its cause
/// (no C++ compiler, a build error, an unwritable target directory): the GPU tests must run on
/// every x86-64 machine, CI included, and never pass without having run.
pub fn emulator_lib() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !cfg!(target_arch = "x86_64") {
                return Err(format!(
                    "the software GPU's fibers are x86-64 code and this is {}",
                    std::env::consts::ARCH
                ));
            }
            fn fail(what: &str, e: &dyn std::fmt::Display) -> ! {
                panic!("the software GPU cannot be built on this x86-64 machine: {what}: {e}")
            }
            let src = kiln::backend::cuda::nvrtc::emulator_source();
            let hash: u64 = src.bytes().fold(0xcbf29ce484222325, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100000001b3)
            });
            let dir = tmp_dir().join("cuda-emulator");
            let lib = dir.join(format!("libkiln_emu_{hash:016x}.so"));
            if lib.exists() {
                return Ok(lib);
            }
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| fail(&format!("creating {}", dir.display()), &e));
            let cpp = dir.join(format!("emulator_{hash:016x}.cpp"));
            std::fs::write(&cpp, &src)
                .unwrap_or_else(|e| fail(&format!("writing {}", cpp.display()), &e));
            let tmp = dir.join(format!("lib.{}.tmp", std::process::id()));
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
            let out = std::process::Command::new(&cxx)
                .args([
                    "-std=c++20",
                    "-O2",
                    "-fno-ipa-reference",
                    "-shared",
                    "-fPIC",
                    "-o",
                ])
                .arg(&tmp)
                .arg(&cpp)
                .output()
                .unwrap_or_else(|e| {
                    fail(
                        &format!("running the C++ compiler `{cxx}` (install one, or set $CXX)"),
                        &e,
                    )
                });
            assert!(
                out.status.success(),
                "the software GPU does not build:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&tmp, &lib)
                .unwrap_or_else(|e| fail(&format!("installing {}", lib.display()), &e));
            Ok(lib)
        })
        .clone()
}

/// The GPU for a test, held for its duration (one test at a time: they count its allocations
/// and measure its memory): the machine's, or else the software GPU (the same kernel sources
/// built for the host by its C++ compiler). Prints which. Where neither can run (no GPU and not
/// x86-64, see [`emulator_lib`]) it panics: the GPU tests are `#[ignore]`d there, and one run
/// anyway (`--ignored`) fails rather than passing without having run.
pub fn gpu(test: &str) -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    match kiln::backend::cuda::open() {
        Ok(g) => println!("{test}: on {} ({})", g.name, g.arch),
        Err(no_gpu) => match emulator() {
            Ok(()) => println!("{test}: {no_gpu}; running on the software GPU"),
            Err(why) => panic!("{test}: {no_gpu}, and no software GPU here: {why}"),
        },
    }
    guard
}

/// `kiln ARGS -m MODEL` on the software GPU `lib` (`$KILN_CUDA_EMULATOR`): its stdout and
/// stderr, once it has exited successfully.
pub fn kiln_on_emulator(
    lib: &std::path::Path,
    model: &std::path::Path,
    args: &[&str],
) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .arg("-m")
        .arg(model)
        .env("KILN_CUDA_EMULATOR", lib)
        .output()
        .expect("run kiln");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{args:?}: {e}");
    (o, e)
}

/// Make the software GPU this process's GPU. Err: it cannot run on this machine (see
/// [`emulator_lib`]); a library that builds but does not load panics.
pub fn emulator() -> Result<(), String> {
    let lib = emulator_lib()?;
    kiln::backend::cuda::use_emulator(&lib)
        .map(|_| ())
        .unwrap_or_else(|e| panic!("the software GPU {} does not load: {e}", lib.display()));
    Ok(())
}
