//! `kiln pull URL` and `-m URL` of a model split across files, against a local HTTP server
//! (tests/http_server): the first part's URL brings every part, an interrupted part resumes,
//! a missing part is named, a later part's URL is refused, `--name` names every part.

mod common;

use common::cli::{kiln_command, listing, stderr, stdout, Scratch};
mod http_server;

use http_server::{Route, Server};
use kiln::fetch::{self, FetchError, FetchOptions};
use std::fs;
use std::path::Path;
use std::process::Output;

fn kiln(args: &[&str], models: &Path) -> Output {
    kiln_command(args, models).output().expect("run kiln")
}

/// Part `no` (from 0) of `count` of a random model split as llama-gguf-split writes it: the
/// model's metadata in the first part only, the split keys in every part (`split.count` =
/// `declared`), every `count`-th tensor from the `no`-th.
fn split_part(no: u16, count: u16, declared: u16) -> Vec<u8> {
    let f = kiln::gguf::GgufFile::open(common::random_model("random-llama-q8_0")).unwrap();
    let mut w = kiln::gguf::GgufWriter::from_file(&f);
    if no > 0 {
        for (k, _) in f.metadata() {
            w.remove(k);
        }
    }
    w.set("split.no", no)
        .set("split.count", declared)
        .set("split.tensors.count", f.tensors().len() as i32);
    for (i, t) in f.tensors().iter().enumerate() {
        if i % count as usize != no as usize {
            w.remove_tensor(&t.name);
        }
    }
    w.to_bytes()
}

const PREFIX: &str = "Big-Q8_0";

fn file(i: usize, n: usize) -> String {
    format!("{PREFIX}-{i:05}-of-{n:05}.gguf")
}

/// A server holding parts `have` (from 1) of a model split in `n`, under `/m/`.
fn serve_parts(n: u16, have: &[u16]) -> (Server, Vec<Vec<u8>>) {
    let server = Server::start();
    let parts: Vec<Vec<u8>> = (0..n).map(|i| split_part(i, n, n)).collect();
    for &i in have {
        server.route(
            &format!("/m/{}", file(i as usize, n as usize)),
            Route::file(&parts[i as usize - 1]),
        );
    }
    (server, parts)
}

#[test]
fn the_first_parts_url_pulls_every_part_and_resumes_an_interrupted_one() {
    let (server, parts) = serve_parts(3, &[1, 2, 3]);
    let second = format!("/m/{}", file(2, 3));
    let cut = parts[1].len() / 2;
    server.edit(&second, |r| r.drops.push_back(cut));
    let models = Scratch::new("split-whole");
    let url = server.url(&format!("/m/{}?download=true", file(1, 3)));

    // The second part's connection drops: the first is installed, the second's bytes kept.
    let out = kiln(&["pull", &url], &models.0);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("interrupted") && err.contains(&file(2, 3)),
        "{err}"
    );
    let part2 = models.0.join(format!("{}.part", file(2, 3)));
    assert_eq!(fs::metadata(&part2).unwrap().len(), cut as u64);
    assert_eq!(fs::read(models.0.join(file(1, 3))).unwrap(), parts[0]);

    // Again: the first is there, the second resumes with a range, the third comes whole.
    let before = server.seen().len();
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = &server.seen()[before..];
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [second.clone(), format!("/m/{}", file(3, 3))],
        "the first part is not fetched again"
    );
    assert_eq!(
        seen[0].header("range"),
        Some(format!("bytes={cut}-").as_str())
    );
    assert_eq!(seen[0].status, 206);
    let names: Vec<String> = (1..=3).map(|i| file(i, 3)).collect();
    for (n, bytes) in names.iter().zip(&parts) {
        assert_eq!(&fs::read(models.0.join(n)).unwrap(), bytes, "{n}");
    }
    let mut expected: Vec<String> = names.iter().map(|n| format!(".{n}.origin.json")).collect();
    expected.extend(names.iter().cloned());
    expected.sort();
    assert_eq!(listing(&models.0), expected, "no partial file left");
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        names
            .iter()
            .map(|n| models.0.join(n).display().to_string())
            .collect::<Vec<_>>(),
        "every part's path"
    );
    assert!(stderr(&out).contains("3 parts"), "{}", stderr(&out));

    // A third pull downloads nothing; the model runs by its first part's name.
    let before = server.seen().len();
    let out = kiln(&["pull", &url], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    assert_eq!(server.seen().len(), before);
    let first = file(1, 3);
    let out = kiln(
        &[
            "run",
            "-m",
            first.trim_end_matches(".gguf"),
            "-n",
            "1",
            "-p",
            "x",
        ],
        &models.0,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_missing_part_is_one_line_naming_its_file() {
    let (server, _) = serve_parts(3, &[1, 2]);
    let models = Scratch::new("split-missing");
    let out = kiln(
        &["pull", &server.url(&format!("/m/{}", file(1, 3)))],
        &models.0,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    let last = lines.last().unwrap();
    assert!(
        last.contains(&file(3, 3)) && last.contains("part 3 of 3") && last.contains("404"),
        "{err}"
    );
    assert!(
        !models.0.join(format!("{}.part", file(3, 3))).exists(),
        "nothing kept of a part the server does not have"
    );
}

#[test]
fn a_later_parts_url_is_refused_with_the_first_ones() {
    let (server, _) = serve_parts(2, &[1, 2]);
    let models = Scratch::new("split-later");
    let out = kiln(
        &["pull", &server.url(&format!("/m/{}", file(2, 2)))],
        &models.0,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("part 2 of a model split in 2")
            && err.contains(&server.url(&format!("/m/{}", file(1, 2)))),
        "{err}"
    );
    assert!(server.seen().is_empty(), "nothing downloaded");
    assert!(listing(&models.0).is_empty());
}

#[test]
fn name_names_every_part() {
    let (server, parts) = serve_parts(2, &[1, 2]);
    let models = Scratch::new("split-name");
    let url = server.url(&format!("/m/{}", file(1, 2)));
    let out = kiln(&["pull", &url, "--name", "mine"], &models.0);
    assert!(out.status.success(), "{}", stderr(&out));
    for (i, bytes) in parts.iter().enumerate() {
        let n = format!("mine-{:05}-of-00002.gguf", i + 1);
        assert_eq!(&fs::read(models.0.join(&n)).unwrap(), bytes, "{n}");
    }
}

#[test]
fn a_first_part_whose_split_count_disagrees_with_its_name_is_refused() {
    let server = Server::start();
    // Named the first of 2, but its split.count says 3.
    server.route(
        &format!("/m/{}", file(1, 2)),
        Route::file(&split_part(0, 3, 3)),
    );
    let models = Scratch::new("split-count");
    let out = kiln(
        &["pull", &server.url(&format!("/m/{}", file(1, 2)))],
        &models.0,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("first of 2 parts") && err.contains("split.count is 3"),
        "{err}"
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
fn m_url_of_a_first_part_brings_the_parts_it_lacks() {
    let (server, parts) = serve_parts(3, &[1, 2, 3]);
    let models = Scratch::new("split-resolve");
    let url = server.url(&format!("/m/{}", file(1, 3)));
    let o = opts(&models.0);
    let path = fetch::resolve_model_with(Some(&url), &o).unwrap();
    assert_eq!(path, models.0.join(file(1, 3)));
    assert_eq!(server.seen().len(), 3);
    kiln::gguf::GgufFile::open_model(&path, false).expect("opens whole");
    // Found again without a request.
    assert_eq!(fetch::resolve_model_with(Some(&url), &o).unwrap(), path);
    assert_eq!(server.seen().len(), 3);
    // A part removed by hand is pulled again, alone.
    fs::remove_file(models.0.join(file(3, 3))).unwrap();
    fs::remove_file(models.0.join(format!(".{}.origin.json", file(3, 3)))).unwrap();
    assert_eq!(fetch::resolve_model_with(Some(&url), &o).unwrap(), path);
    let seen = server.seen();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[3].path, format!("/m/{}", file(3, 3)));
    assert_eq!(fs::read(models.0.join(file(3, 3))).unwrap(), parts[2]);
    // The missing-part error is typed.
    let (server, _) = serve_parts(2, &[1]);
    let models = Scratch::new("split-resolve-missing");
    let err = fetch::resolve_model_with(
        Some(&server.url(&format!("/m/{}", file(1, 2)))),
        &opts(&models.0),
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            FetchError::MissingPart {
                part: 2,
                count: 2,
                ..
            }
        ),
        "{err:?}"
    );
}
