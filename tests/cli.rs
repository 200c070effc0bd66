//! The `kiln` binary end to end: run, tokenize, perplexity, and clear errors.

mod common;

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn run_greedy_streams_text_and_reports_speed() {
    let model = common::random_model("random-llama-q8_0");
    let out = kiln(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hello world",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("prompt eval") && stderr.contains("tokens per second"),
        "{stderr}"
    );
    // Greedy is deterministic: the same command prints the same text.
    let again = kiln(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hello world",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "1",
    ]);
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let model = common::random_model("random-llama-q4_k");
    let m = model.to_str().unwrap();
    let a = kiln(&[
        "run", "-m", m, "-p", "abc", "-n", "12", "--temp", "1.0", "--seed", "7",
    ]);
    let b = kiln(&[
        "run", "-m", m, "-p", "abc", "-n", "12", "--temp", "1.0", "--seed", "7",
    ]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn prompt_longer_than_context_is_refused_with_both_lengths() {
    let model = common::random_model("random-llama-q4_0");
    let prompt = "word ".repeat(100);
    let out = kiln(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        &prompt,
        "-c",
        "16",
        "-n",
        "4",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("context holds 16"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn tokenize_ids_match_golden() {
    let texts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("texts.json")).unwrap(),
    )
    .unwrap();
    let golden =
        common::read_jsonl(&common::golden_dir().join("smollm2-135m-instruct-q4_1/tokenize.jsonl"));
    let model = common::real_model("smollm2");
    for (i, line) in golden.iter().enumerate().take(8) {
        let text = texts["tokenize"][i].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        let out = kiln(&[
            "tokenize",
            "-m",
            model.to_str().unwrap(),
            "-p",
            text,
            "--ids",
            "--no-parse-special",
        ]);
        assert!(out.status.success());
        let ids: Vec<u64> = serde_json::from_slice(&out.stdout).expect("a JSON-style list");
        let want: Vec<u64> = line["ids_special"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(ids, want, "text {i}: {text:?}");
    }
}

#[test]
fn bad_model_file_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = kiln(&["run", "-m", bad.to_str().unwrap(), "-p", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.gguf") && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kv_memory_flags_work_end_to_end_and_bad_values_are_clear_errors() {
    let model = common::random_model("random-llama-q8_0");
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            m,
            "-p",
            "Hello world, once more",
            "-n",
            "24",
            "--temp",
            "0",
            "-c",
            "256",
            "-b",
            "4",
        ];
        args.extend_from_slice(extra);
        kiln(&args)
    };
    let base = run(&[]);
    assert!(
        base.status.success(),
        "{}",
        String::from_utf8_lossy(&base.stderr)
    );
    // Offloaded (4 layers × 64 KiB in f16; a 160 KiB budget holds a ring of 2): same text.
    let off = run(&["--kv-budget", "160KiB"]);
    assert!(
        off.status.success(),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    assert_eq!(off.stdout, base.stdout);
    for extra in [
        &["--kv-type", "q8_0"][..],
        &["--kv-type", "q8_0", "--kv-budget", "80KiB"],
    ] {
        let out = run(extra);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty());
    }
    for (extra, msg) in [
        (&["--kv-budget", "1"][..], "too small"),
        (&["--kv-type", "q9"][..], "unknown KV cache type"),
        (&["--kv-budget", "12 parsecs"][..], "unknown unit"),
    ] {
        let out = run(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(stderr.contains(msg), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
    let out = kiln(&["run", "-m", m, "-p", "hi", "-c", "5000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("exceeds what this model supports"),
        "{stderr}"
    );
    // The plan refuses the same way and accepts the same flags.
    let plan = kiln(&[
        "plan",
        "-m",
        m,
        "--ctx",
        "256",
        "--kv-type",
        "q8_0",
        "--kv-budget",
        "80KiB",
        "--json",
    ]);
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(j["kv_type"], "q8_0");
    assert!(j["total_bytes"].as_u64().unwrap() > 0);
}

/// A model answering in harmony's channels (gpt-oss's template; here a random model whose
/// answer a grammar spells): `kiln run` prints the final channel only, `--json` every token.
#[test]
fn run_shows_a_harmony_answers_final_channel() {
    let model = common::random_model("random-llama-q8_0");
    let tpl = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/server/harmony_template.jinja");
    let answer = "<|channel|>analysis<|message|>Greet them.<|end|><|start|>assistant<|channel|>final<|message|>Bonjour le monde";
    let grammar = format!("root ::= {}", serde_json::Value::from(answer));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Hello",
            "-n",
            "200",
            "--temp",
            "0",
            "--chat-template-file",
            tpl.to_str().unwrap(),
            "--grammar",
            &grammar,
        ];
        args.extend_from_slice(extra);
        let out = kiln(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run(&[]), "Bonjour le monde\n");
    let tokens: String = run(&["--json"])
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(tokens, answer);
}
