//! `kiln pull` as a user runs it (never downloads: only listing and argument errors).

use std::process::Command;

fn kiln(args: &[&str], models: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("KILN_MODELS", models)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run kiln")
}

#[test]
fn pull_list_shows_names_sizes_and_state() {
    let dir = std::env::temp_dir().join(format!("kiln-test-cli-{}", std::process::id()));
    let out = kiln(&["pull", "--list"], &dir);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("smollm2") && text.contains("98.4 MB"),
        "{text}"
    );
    assert!(
        text.contains("gemma3") && text.contains("253.1 MB"),
        "{text}"
    );
    assert_eq!(text.matches("not downloaded").count(), 2, "{text}");
    assert!(!dir.exists(), "--list creates nothing");
}

#[test]
fn pull_unknown_name_fails_listing_known_names() {
    let dir = std::env::temp_dir().join(format!("kiln-test-cli2-{}", std::process::id()));
    let out = kiln(&["pull", "mistral"], &dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mistral") && err.contains("smollm2, gemma3"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing fetched");
}
