//! The web chat page (`/` of `kiln serve`) in a real browser: headless Chromium, driven through
//! chromedriver by Selenium (tests/webui/webui_suite.py, in a Python environment the test makes
//! under the target directory), against `kiln serve` processes on the random-weight fixture:
//! an answer streams, the stop button cancels it on the server, conversations survive a reload
//! and are renamed and deleted, the settings go into the request, Markdown with highlighted
//! code and folded reasoning, a phone's width, the server gone, an API key asked for once and a
//! bad one's error, and `--no-webui`. Screenshots of every step go to
//! `target/webui-screenshots/`.
//!
//! Chromium and chromedriver are Debian's `chromium` and `chromium-driver`; where they are not
//! on PATH the test installs them with apt-get when it runs as root, and otherwise fails
//! saying what to install.

mod common;
#[path = "server/harness.rs"]
mod harness;
#[path = "server/pyenv.rs"]
mod pyenv;

use std::path::{Path, PathBuf};

use harness::Server;

/// The WebDriver client, pinned to the version the suite was last run with.
const PY_PACKAGES: [&str; 1] = ["selenium==4.50.0"];

/// ChatML; it names `<think>`, so that the server separates the reasoning of an answer that
/// starts with it (the reasoning style is read from the template's text).
const TEMPLATE: &str = "{#- An answer may start with <think>...</think>. -#}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, installed with apt-get if missing and possible.
fn chromium() -> (PathBuf, PathBuf) {
    let find = || Some((on_path("chromium")?, on_path("chromedriver")?));
    if let Some(found) = find() {
        return found;
    }
    let missing = "the web page test needs Chromium and its WebDriver: install Debian's \
                   `chromium` and `chromium-driver` (apt-get install chromium chromium-driver), \
                   or put `chromium` and `chromedriver` on PATH";
    common::cli::apt_install(&["chromium", "chromium-driver"], missing);
    find().unwrap_or_else(|| panic!("{missing} (installed, but not found on PATH)"))
}

#[test]
fn the_web_page_works_in_a_real_browser() {
    let (chromium, chromedriver) = chromium();
    let python = pyenv::python_env("webui-venv", &PY_PACKAGES, "selenium");
    let model = common::random_model("random-llama-q4_0");
    let dir = common::tmp_dir().join("webui");
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("template.jinja");
    std::fs::write(&template, TEMPLATE).unwrap();
    let template = template.to_str().unwrap();
    let key = "kiln-webui-key";
    let plain = Server::start_ctx(&model, 4096, &["-P", "2", "--chat-template-file", template]);
    let keyed = Server::start(
        &model,
        &["--chat-template-file", template, "--api-key", key],
    );
    let bare = Server::start(&model, &["--no-webui"]);

    // --no-webui: `/` is a 404 in the API's shape, the API is served as before.
    let a = bare.request("GET", "/", &[], "");
    let e = a.expect_error(404, "GET / with --no-webui");
    assert!(e["message"].as_str().unwrap().contains("no route for /"));
    assert_eq!(bare.request("GET", "/v1/models", &[], "").status, 200);
    // The page itself is public; the API behind it is not.
    let a = keyed.request("GET", "/", &[], "");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("content-type"), Some("text/html; charset=utf-8"));
    keyed
        .request("GET", "/v1/models", &[], "")
        .expect_error(401, "/v1/models without the key");
    // The server's Host rule applies to the page too.
    let a = plain.raw(b"GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
    assert_eq!(a.status, 403, "{}", a.text());

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("webui-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webui/webui_suite.py");
    let status = python
        .command()
        .arg(&script)
        .args(["--url", &plain.url, "--pid", &plain.child.id().to_string()])
        .args(["--keyed-url", &keyed.url, "--key", key])
        .args(["--no-webui-url", &bare.url])
        .arg("--shots")
        .arg(&shots)
        .arg("--chromium")
        .arg(&chromium)
        .arg("--chromedriver")
        .arg(&chromedriver)
        .status()
        .expect("run the browser suite");
    assert!(
        status.success(),
        "the browser suite failed (see its output above; screenshots in {})",
        shots.display()
    );
    let pngs = std::fs::read_dir(&shots)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.path().extension().is_some_and(|x| x == "png")
                && e.metadata().is_ok_and(|m| m.len() > 1000)
        })
        .count();
    assert!(pngs >= 20, "{pngs} screenshots in {}", shots.display());
}
