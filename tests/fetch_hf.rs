//! `kiln pull USER/REPO:QUANT` and `-hf USER/REPO:QUANT` end to end, against a local HTTP server
//! (tests/http_server) that answers as the Hugging Face hub does: the model API's listing
//! (`/api/models/USER/REPO`, with LFS sha256s) and the files under `/USER/REPO/resolve/COMMIT/`.
//! `HF_ENDPOINT` points kiln at it; every test uses its own models directory (`KILN_MODELS`).

mod common;

use common::cli::{kiln_command, stderr, stdout, Scratch};
mod http_server;

use http_server::{Route, Server};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::Path;
use std::process::Output;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// `kiln ARGS` with the hub at `endpoint` and `token` in `HF_TOKEN`.
fn kiln(args: &[&str], models: &Path, endpoint: &str, token: Option<&str>) -> Output {
    let mut cmd = kiln_command(args, models);
    cmd.env("HF_ENDPOINT", endpoint)
        .env_remove("MODEL_ENDPOINT")
        .env_remove("HF_TOKEN");
    if let Some(t) = token {
        cmd.env("HF_TOKEN", t);
    }
    cmd.output().expect("run kiln")
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fixture(stem: &str) -> Vec<u8> {
    fs::read(common::random_model(stem)).unwrap()
}

/// A hub holding repository `u/r` with `files` (path, content): the listing carries each
/// file's size and LFS sha256 (`sha_override` replaces the sha256 of the file it names).
struct Hub {
    server: Server,
}

impl Hub {
    fn start() -> Hub {
        Hub {
            server: Server::start(),
        }
    }

    fn endpoint(&self) -> String {
        self.server.url("")
    }

    fn repo(&self, repo: &str, files: &[(&str, &[u8])], sha_override: Option<(&str, &str)>) {
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|(path, bytes)| {
                let sha = match sha_override {
                    Some((p, s)) if p == *path => s.to_string(),
                    _ => sha_hex(bytes),
                };
                serde_json::json!({
                    "rfilename": path,
                    "size": bytes.len(),
                    "blobId": "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
                    "lfs": {"sha256": sha, "size": bytes.len(), "pointerSize": 134},
                })
            })
            .chain(std::iter::once(serde_json::json!({
                "rfilename": "README.md", "size": 10, "blobId": "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
            })))
            .collect();
        let listing = serde_json::json!({
            "_id": "66", "id": repo, "modelId": repo, "sha": COMMIT, "private": false,
            "gated": false, "tags": ["gguf"], "siblings": siblings,
        });
        self.server.route(
            &format!("/api/models/{repo}"),
            Route::file(listing.to_string().as_bytes()),
        );
        for (path, bytes) in files {
            self.server.route(
                &format!("/{repo}/resolve/{COMMIT}/{path}"),
                Route::file(bytes),
            );
        }
    }

    /// The paths requested, in order.
    fn paths(&self) -> Vec<String> {
        self.server.seen().into_iter().map(|s| s.path).collect()
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn pull_by_repository_chooses_the_quantization_and_installs_it() {
    let hub = Hub::start();
    let (q4, q8, proj) = (
        fixture("random-llama-q4_k"),
        fixture("random-llama-q8_0"),
        fixture("random-llama-f16"),
    );
    hub.repo(
        "u/r",
        &[
            ("Model-Q4_K_M.gguf", &q4),
            ("Model-Q8_0.gguf", &q8),
            ("mmproj-Model-F16.gguf", &proj),
        ],
        None,
    );
    let models = Scratch::new("hf-choose");
    let ep = hub.endpoint();

    // No quantization: Q4_K_M, as llama.cpp; no projector unless asked.
    let out = kiln(&["pull", "u/r"], &models.0, &ep, None);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = models.0.join("u_r_Q4_K_M.gguf");
    assert_eq!(stdout(&out).trim(), path.display().to_string());
    assert_eq!(fs::read(&path).unwrap(), q4, "byte-identical");
    assert!(
        stderr(&out).contains("Model-Q4_K_M.gguf"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        hub.paths(),
        [
            "/api/models/u/r",
            &format!("/u/r/resolve/{COMMIT}/Model-Q4_K_M.gguf")
        ]
    );

    // A quantization in any case, in Ollama's spelling, with the projector.
    let out = kiln(
        &["pull", "hf.co/u/r:q8_0", "--mmproj"],
        &models.0,
        &ep,
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (m, p) = (
        models.0.join("u_r_Q8_0.gguf"),
        models.0.join("u_r_Q8_0-mmproj.gguf"),
    );
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        [m.display().to_string(), p.display().to_string()]
    );
    assert_eq!(fs::read(&m).unwrap(), q8);
    assert_eq!(fs::read(&p).unwrap(), proj);
    assert_eq!(
        listing(&models.0),
        ["u_r_Q4_K_M.gguf", "u_r_Q8_0-mmproj.gguf", "u_r_Q8_0.gguf"]
    );

    // Pulled again: the listing is asked for, no file downloaded.
    let before = hub.paths().len();
    let out = kiln(&["pull", "hf://u/r:Q4_K_M"], &models.0, &ep, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    assert_eq!(hub.paths()[before..], ["/api/models/u/r"]);

    // `kiln list` shows where it came from.
    let out = kiln(&["list", "--json"], &models.0, &ep, None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "u_r_Q4_K_M")
        .unwrap();
    assert_eq!(
        row["source"],
        format!("{ep}/u/r/resolve/{COMMIT}/Model-Q4_K_M.gguf")
    );
}

#[test]
fn hf_token_is_sent_to_the_api_and_with_the_download() {
    let hub = Hub::start();
    let q4 = fixture("random-llama-q4_0");
    hub.repo("org/gated", &[("g-Q4_K_M.gguf", &q4)], None);
    let models = Scratch::new("hf-token");
    let out = kiln(
        &["pull", "org/gated"],
        &models.0,
        &hub.endpoint(),
        Some("hf_secret"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = hub.server.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.header("authorization"), Some("Bearer hf_secret"), "{s:?}");
    }
    // No token: no header.
    let models = Scratch::new("hf-token2");
    let out = kiln(&["pull", "org/gated"], &models.0, &hub.endpoint(), None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(hub.server.seen()[2..]
        .iter()
        .all(|s| s.header("authorization").is_none()));
}

#[test]
fn split_models_are_fetched_whole() {
    let hub = Hub::start();
    let parts: Vec<Vec<u8>> = (0..3u16).map(|i| split_part(i, 3)).collect();
    // Listed out of order, beside another quantization.
    let q8 = fixture("random-llama-q8_0");
    hub.repo(
        "u/big",
        &[
            ("Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf", &parts[1]),
            ("Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf", &parts[0]),
            ("Q4_K_M/Big-Q4_K_M-00003-of-00003.gguf", &parts[2]),
            ("Big-Q8_0.gguf", &q8),
        ],
        None,
    );
    let models = Scratch::new("hf-split");
    let out = kiln(&["pull", "u/big:Q4_K_M"], &models.0, &hub.endpoint(), None);
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = (1..=3)
        .map(|i| format!("u_big_Q4_K_M-{i:05}-of-00003.gguf"))
        .collect();
    assert_eq!(listing(&models.0), names);
    for (n, bytes) in names.iter().zip(&parts) {
        assert_eq!(&fs::read(models.0.join(n)).unwrap(), bytes, "{n}");
    }
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        names
            .iter()
            .map(|n| models.0.join(n).display().to_string())
            .collect::<Vec<_>>()
    );
    assert_eq!(hub.paths().len(), 4, "the listing and three parts");
    // Run by the first part's name: every part is mapped, the model whole.
    let out = kiln(
        &[
            "run",
            "-m",
            "u_big_Q4_K_M-00001-of-00003",
            "-n",
            "1",
            "-p",
            "x",
        ],
        &models.0,
        &hub.endpoint(),
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Part `no` (from 0) of `count` of a random model split as llama-gguf-split writes it: the
/// model's metadata in the first part only, the split keys in every part, every `count`-th
/// tensor from the `no`-th.
fn split_part(no: u16, count: u16) -> Vec<u8> {
    let f = kiln::gguf::GgufFile::open(common::random_model("random-llama-q4_0")).unwrap();
    let mut w = kiln::gguf::GgufWriter::from_file(&f);
    if no > 0 {
        for (k, _) in f.metadata() {
            w.remove(k);
        }
    }
    w.set("split.no", no)
        .set("split.count", count)
        .set("split.tensors.count", f.tensors().len() as i32);
    for (i, t) in f.tensors().iter().enumerate() {
        if i % count as usize != no as usize {
            w.remove_tensor(&t.name);
        }
    }
    w.to_bytes()
}

#[test]
fn unknown_repositories_and_quantizations_are_named() {
    let hub = Hub::start();
    let q4 = fixture("random-llama-q4_0");
    let q8 = fixture("random-llama-q8_0");
    hub.repo("u/r", &[("M-Q4_K_M.gguf", &q4), ("M-Q8_0.gguf", &q8)], None);
    let models = Scratch::new("hf-unknown");
    let ep = hub.endpoint();

    let out = kiln(&["pull", "u/nope:Q4_K_M"], &models.0, &ep, None);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("u/nope") && err.contains("not found") && err.contains("404"),
        "{err}"
    );

    let out = kiln(&["pull", "u/r:Q5_K_S"], &models.0, &ep, None);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("Q5_K_S") && err.contains("u/r") && err.contains("Q4_K_M, Q8_0"),
        "the quantizations held are listed: {err}"
    );

    let out = kiln(
        &["pull", "u/r", "--hf-file", "other.gguf"],
        &models.0,
        &ep,
        None,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("other.gguf") && err.contains("M-Q8_0.gguf"),
        "{err}"
    );

    // The hub's answer for a private repository (or one that does not exist) without a token.
    hub.server.route(
        "/api/models/org/private",
        Route {
            status: Some(401),
            ..Route::default()
        },
    );
    let out = kiln(&["pull", "org/private"], &models.0, &ep, None);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("org/private") && err.contains("HF_TOKEN"),
        "{err}"
    );

    for bad in ["u/r/x:Q4", "u/..", "hf.co/onlyuser"] {
        let out = kiln(&["pull", bad], &models.0, &ep, None);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains("USER/REPO") || err.contains("not a user"),
            "{bad}: {err}"
        );
    }
    assert!(listing(&models.0).is_empty(), "nothing installed");
}

#[test]
fn no_network_is_the_fetch_layers_error() {
    // A port nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = format!("http://127.0.0.1:{}", free.local_addr().unwrap().port());
    drop(free);
    let models = Scratch::new("hf-offline");
    let out = kiln(&["pull", "u/r"], &models.0, &ep, None);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{ep}/api/models/u/r")) && err.contains("downloading"),
        "{err}"
    );
}

#[test]
fn a_wrong_sha256_from_the_hub_deletes_the_download() {
    let hub = Hub::start();
    let q4 = fixture("random-llama-q4_0");
    let wrong = "ab".repeat(32);
    hub.repo(
        "u/r",
        &[("M-Q4_K_M.gguf", &q4)],
        Some(("M-Q4_K_M.gguf", &wrong)),
    );
    let models = Scratch::new("hf-sha");
    let out = kiln(&["pull", "u/r"], &models.0, &hub.endpoint(), None);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(&wrong) && err.contains(&sha_hex(&q4)), "{err}");
    assert!(
        fs::read_dir(&models.0).unwrap().next().is_none(),
        "nothing left"
    );
}

#[test]
fn an_interrupted_pull_resumes_and_an_updated_file_is_fetched_again() {
    let hub = Hub::start();
    let q4 = fixture("random-llama-q4_0");
    hub.repo("u/r", &[("M-Q4_K_M.gguf", &q4)], None);
    let file = format!("/u/r/resolve/{COMMIT}/M-Q4_K_M.gguf");
    let cut = q4.len() / 3;
    hub.server.edit(&file, |r| r.drops.push_back(cut));
    let models = Scratch::new("hf-resume");
    let ep = hub.endpoint();
    let out = kiln(&["pull", "u/r:Q4_K_M"], &models.0, &ep, None);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("interrupted"), "{}", stderr(&out));
    let out = kiln(&["pull", "u/r:Q4_K_M"], &models.0, &ep, None);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = hub.server.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.path, file);
    assert_eq!(last.header("range"), Some(format!("bytes={cut}-").as_str()));
    let path = models.0.join("u_r_Q4_K_M.gguf");
    assert_eq!(fs::read(&path).unwrap(), q4);

    // The repository replaces the file: the next pull downloads it again.
    let q4b = fixture("random-llama-q4_1");
    hub.repo("u/r", &[("M-Q4_K_M.gguf", &q4b)], None);
    let out = kiln(&["pull", "u/r:Q4_K_M"], &models.0, &ep, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&path).unwrap(), q4b);
}

#[test]
fn hf_flag_runs_the_repository_model_then_finds_it_without_the_network() {
    let hub = Hub::start();
    let q4 = fixture("random-llama-q4_0");
    let q8 = fixture("random-llama-q8_0");
    hub.repo(
        "u/r",
        &[("M-Q4_0.gguf", &q4), ("sub/M-Q8_0.gguf", &q8)],
        None,
    );
    let models = Scratch::new("hf-run");
    let ep = hub.endpoint();
    let out = kiln(
        &["run", "-hf", "u/r:Q4_0", "-n", "1", "-p", "x"],
        &models.0,
        &ep,
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(models.0.join("u_r_Q4_0.gguf")).unwrap(), q4);
    let requests = hub.paths().len();
    assert_eq!(requests, 2);
    // Installed: no request, by -hf, --hf-repo, -m hf.co/... and by its name.
    for args in [
        &["run", "-hf", "u/r:q4_0"][..],
        &["run", "--hf-repo", "hf.co/u/r:Q4_0"],
        &["run", "-m", "hf.co/u/r:Q4_0"],
        &["run", "-m", "u_r_Q4_0"],
    ] {
        let out = kiln(
            &[args, &["-n", "1", "-p", "x"]].concat(),
            &models.0,
            &ep,
            None,
        );
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(hub.paths().len(), requests, "nothing asked of the hub");
    // A file named outright (llama.cpp's -hff).
    let out = kiln(
        &[
            "run",
            "-hf",
            "u/r",
            "-hff",
            "sub/M-Q8_0.gguf",
            "-n",
            "1",
            "-p",
            "x",
        ],
        &models.0,
        &ep,
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(models.0.join("u_r_M-Q8_0.gguf")).unwrap(), q8);
    // -m and -hf together are refused.
    let out = kiln(&["run", "-m", "x", "-hf", "u/r"], &models.0, &ep, None);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--hf-repo"), "{}", stderr(&out));
}
