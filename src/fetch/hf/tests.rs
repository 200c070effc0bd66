//! The choice of files and the parsing of references, without a network.

use super::*;

fn files(paths: &[&str]) -> Vec<RepoFile> {
    paths
        .iter()
        .map(|p| RepoFile {
            path: p.to_string(),
            size: None,
            sha256: None,
        })
        .collect()
}

fn r(s: &str) -> HfRef {
    HfRef::parse(s).unwrap()
}

#[test]
fn references_in_every_form() {
    let want = |q: Option<&str>| HfRef {
        repo: "bartowski/SmolLM2-135M-Instruct-GGUF".into(),
        quant: q.map(String::from),
        file: None,
    };
    for s in [
        "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
        "hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
        "HF.CO/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
        "huggingface.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
        "hf://bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
        "https://huggingface.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
    ] {
        assert_eq!(r(s), want(Some("Q4_K_M")), "{s}");
    }
    assert_eq!(r("bartowski/SmolLM2-135M-Instruct-GGUF"), want(None));
    assert_eq!(
        r("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:latest"),
        want(None)
    );
    assert_eq!(
        r("https://huggingface.co/bartowski/SmolLM2-135M-Instruct-GGUF/"),
        want(None)
    );
    let mut f = want(None);
    f.file = Some("sub/x-Q8_0.gguf".into());
    assert_eq!(
        r("hf://bartowski/SmolLM2-135M-Instruct-GGUF/sub/x-Q8_0.gguf"),
        f
    );
    // A file URL is a plain URL, and other text is not a reference at all.
    assert!(HfRef::explicit("https://huggingface.co/u/r/resolve/main/x.gguf").is_none());
    assert!(HfRef::explicit("smollm2").is_none());
    assert!(
        HfRef::explicit("u/r:Q4_0").is_none(),
        "bare only via -hf and pull"
    );
    for bad in [
        "hf.co/user",
        "hf.co/a/b/c",
        "u/..",
        "../r",
        "u/r:Q4 K",
        "u/r:",
        "/r",
        "u/-r",
    ] {
        let e = HfRef::parse(bad).unwrap_err();
        assert!(matches!(e, FetchError::BadRepo { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
    assert!(r("u/r").with_file(Some("../x.gguf")).is_err());
    assert!(r("u/r").with_file(Some("/x.gguf")).is_err());
    assert_eq!(
        r("u/r")
            .with_file(Some("d/x.gguf"))
            .unwrap()
            .file
            .as_deref(),
        Some("d/x.gguf")
    );
}

#[test]
fn endpoints() {
    let env = crate::fetch::fake_env::<String>;
    assert_eq!(endpoint_from(env(&[])), DEFAULT_ENDPOINT);
    assert_eq!(
        endpoint_from(env(&[("HF_ENDPOINT", "http://mirror:8/")])),
        "http://mirror:8"
    );
    assert_eq!(
        endpoint_from(env(&[
            ("HF_ENDPOINT", "http://b"),
            ("MODEL_ENDPOINT", "http://a")
        ])),
        "http://a"
    );
    assert_eq!(
        endpoint_from(env(&[("HF_ENDPOINT", " ")])),
        DEFAULT_ENDPOINT
    );
}

#[test]
fn split_names_as_llama_cpp_reads_them() {
    let s = split_info("d/Model-Q4_K_M-00002-of-00003.gguf").unwrap();
    assert_eq!(
        (s.prefix.as_str(), s.quant.as_str(), s.index, s.count),
        ("d/Model-Q4_K_M", "Q4_K_M", 2, 3)
    );
    let s = split_info("model.q8_0.gguf").unwrap();
    assert_eq!((s.quant.as_str(), s.index, s.count), ("Q8_0", 1, 1));
    assert_eq!(split_info("README.md"), None);
    assert_eq!(quant_bits("Q4_K_M"), 4);
    assert_eq!(quant_bits("F16"), 16);
    assert_eq!(quant_bits(""), 0);
    assert!(is_model_file("a/x-Q4_0.gguf"));
    assert!(!is_model_file("mmproj-x-f16.gguf"));
    assert!(!is_model_file("x.imatrix.gguf"));
    assert!(!is_model_file("x.safetensors"));
}

#[test]
fn the_file_is_chosen_as_llama_cpp_chooses_it() {
    let fs = files(&[
        "README.md",
        "Model-IQ4_XS.gguf",
        "Model-Q4_K_M.gguf",
        "Model-Q4_K_S.gguf",
        "Model-Q8_0.gguf",
        "mmproj-Model-f16.gguf",
    ]);
    let pick = |q: Option<&str>| find_best_model(&fs, q).map(|f| f.path.as_str());
    assert_eq!(pick(None), Some("Model-Q4_K_M.gguf"), "the default");
    assert_eq!(pick(Some("q8_0")), Some("Model-Q8_0.gguf"), "any case");
    assert_eq!(
        pick(Some("Q4_K")),
        None,
        "a prefix of a quantization is not one"
    );
    assert_eq!(pick(Some("iq4_xs")), Some("Model-IQ4_XS.gguf"));
    assert_eq!(pick(Some("F16")), None, "the projector is not a model");
    // No default quantization: Q8_0, then the first model file.
    let fs = files(&["a-Q8_0.gguf", "a-Q2_K.gguf"]);
    assert_eq!(find_best_model(&fs, None).unwrap().path, "a-Q8_0.gguf");
    let fs = files(&["a-F16.gguf", "a-Q2_K.gguf"]);
    assert_eq!(find_best_model(&fs, None).unwrap().path, "a-F16.gguf");
}

#[test]
fn split_models_are_planned_whole_and_named_by_repo_and_quant() {
    let fs = files(&[
        "Q4_K_M/M-Q4_K_M-00002-of-00003.gguf",
        "Q4_K_M/M-Q4_K_M-00001-of-00003.gguf",
        "Q4_K_M/M-Q4_K_M-00003-of-00003.gguf",
        "M-Q8_0.gguf",
        "mmproj-F16.gguf",
        "mmproj-Q8_0.gguf",
    ]);
    let p = plan(&r("u/r:q4_k_m"), &fs, false).unwrap();
    assert_eq!(p.name, "u_r_Q4_K_M");
    let parts: Vec<&str> = p.parts.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        parts,
        [
            "Q4_K_M/M-Q4_K_M-00001-of-00003.gguf",
            "Q4_K_M/M-Q4_K_M-00002-of-00003.gguf",
            "Q4_K_M/M-Q4_K_M-00003-of-00003.gguf"
        ]
    );
    assert_eq!(
        part_names(&p),
        [
            "u_r_Q4_K_M-00001-of-00003",
            "u_r_Q4_K_M-00002-of-00003",
            "u_r_Q4_K_M-00003-of-00003"
        ]
    );
    assert_eq!(p.mmproj, None, "only when asked");
    let p = plan(&r("u/r:Q8_0"), &fs, true).unwrap();
    assert_eq!(p.name, "u_r_Q8_0");
    assert_eq!(
        p.mmproj.unwrap().path,
        "mmproj-Q8_0.gguf",
        "the nearest width"
    );
    // A missing part is named.
    let e = plan(&r("u/r:Q4_K_M"), &fs[..2], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1, 2") && e.contains("3"), "{e}");
    // Named by file: by its file name.
    let p = plan(
        &r("u/r").with_file(Some("M-Q8_0.gguf")).unwrap(),
        &fs,
        false,
    )
    .unwrap();
    assert_eq!(p.name, "u_r_M-Q8_0");
    let p = plan(&r("u/r"), &files(&["weights.gguf"]), false).unwrap();
    assert_eq!(p.name, "u_r_weights", "no quantization in the name");
}

#[test]
fn what_is_missing_is_named_with_what_there_is() {
    let fs = files(&["M-Q4_K_M.gguf", "M-Q8_0.gguf", "mmproj-f16.gguf", "x.md"]);
    let e = plan(&r("u/r:Q5_K_M"), &fs, false).unwrap_err();
    assert!(matches!(e, FetchError::NoSuchQuant { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("Q5_K_M") && e.contains("u/r") && e.contains("Q4_K_M, Q8_0"),
        "{e}"
    );
    let e = plan(&r("u/r"), &files(&["x.md"]), false).unwrap_err();
    assert!(matches!(e, FetchError::NoGgufInRepo { .. }), "{e:?}");
    let e = plan(&r("u/r").with_file(Some("nope.gguf")).unwrap(), &fs, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.gguf") && e.contains("M-Q8_0.gguf"), "{e}");
    let e = plan(&r("u/r"), &files(&["M-Q4_K_M.gguf"]), true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("mmproj"), "{e}");
}

#[test]
fn paths_are_encoded_for_urls() {
    assert_eq!(encode_path("d/a b+c.gguf"), "d/a%20b%2Bc.gguf");
    assert_eq!(encode_path("M-Q4_K_M.gguf"), "M-Q4_K_M.gguf");
}
