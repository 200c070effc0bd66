//! `resolve_model` argument handling, and the real cached models as a fast no-op.
//! (The real models are already in the models directory; these tests never download them
//! unless they are missing, which is what `kiln pull` in CI guarantees against.)

mod common;

use kiln::fetch::{find_spec, resolve_model, FetchError, DEFAULT_MODEL, MODELS};
use std::time::Instant;

#[test]
fn existing_path_is_returned_as_is() {
    let p = common::random_model("random-llama-q4_0");
    let got = resolve_model(Some(p.to_str().unwrap()), false).unwrap();
    assert_eq!(got, p);
}

#[test]
fn unknown_name_lists_known_models() {
    let err = resolve_model(Some("llama-70b"), false).unwrap_err();
    assert!(matches!(err, FetchError::UnknownModel { .. }), "{err:?}");
    let msg = err.to_string();
    for spec in MODELS {
        assert!(msg.contains(spec.name), "{msg}");
    }
    assert!(msg.contains("llama-70b"));
}

#[test]
fn missing_path_is_not_reported_as_unknown_name() {
    let err = resolve_model(Some("/no/such/dir/model.gguf"), false).unwrap_err();
    assert!(matches!(err, FetchError::NoSuchFile { .. }), "{err:?}");
    let err = resolve_model(Some("nothere.gguf"), false).unwrap_err();
    assert!(matches!(err, FetchError::NoSuchFile { .. }), "{err:?}");
}

#[test]
fn cached_real_models_resolve_instantly() {
    // The first call may hash the file once (then records the marker); later calls are a stat.
    for spec in MODELS {
        let p = common::real_model(spec.name);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), spec.size);
        let t = Instant::now();
        for _ in 0..10 {
            assert_eq!(resolve_model(Some(spec.name), false).unwrap(), p);
            for alias in spec.aliases {
                assert_eq!(resolve_model(Some(alias), false).unwrap(), p);
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(ms < 500.0, "{}: cached resolves took {ms:.0} ms", spec.name);
    }
    let default = resolve_model(None, false).unwrap();
    assert_eq!(default, common::real_model(DEFAULT_MODEL));
    assert_eq!(
        find_spec(DEFAULT_MODEL).unwrap().file_name,
        default.file_name().unwrap()
    );
}
