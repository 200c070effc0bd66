//! The flags llama.cpp users bring, and the CLI's manners: `-ngl`, `-fa`, `-cnv`/`-no-cnv`,
//! `-sys`, `-cd`, `--ignore-eos`, `--jinja`, `--no-mmap`, `-v`, `-c 0`, `-t 0`, an absurd `-t`; chat
//! templates by default for instruct models; quiet broken pipes; no backtraces; JSON-only
//! `--json`; `plan` exit status; `bench`'s model column; `inspect`/`show` by name.

mod common;

use std::io::Read;
use std::process::{Command, Output, Stdio};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kiln")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `kiln run --json` on `model` with `extra` flags: the statistics object (the last line), after
/// checking every line of stdout is JSON.
fn run_json(model: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["run", "-m", model, "--json", "--temp", "0"];
    if !extra.contains(&"-n") {
        args.extend(["-n", "4"]);
    }
    args.extend_from_slice(extra);
    let out = kiln(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    assert!(lines.len() >= 2, "{text}");
    for l in &lines[..lines.len() - 1] {
        assert!(l["text"].is_string(), "{l}");
    }
    lines.last().unwrap().clone()
}

#[test]
fn llama_cpp_flags_are_accepted_with_their_meaning() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    for extra in [
        &["-ngl", "0"][..],
        &["-fa"],
        &["-fa", "on"],
        &["--flash-attn", "auto"],
        &["-no-cnv"],
        &["--jinja"],
        &["--no-mmap"],
        &["--no-repack"],
        &["-nr"],
        &["-v"],
        &["-t", "0"],
        &["-c", "0"],
    ] {
        let mut args = vec!["-p", "Hello"];
        args.extend_from_slice(extra);
        let stats = run_json(m, &args);
        assert_eq!(stats["gen_tokens"], 4, "{extra:?}");
    }
}

/// `-cd` (llama.cpp's `--ctx-size-draft`): the draft model's context, as the plan counts it
/// (its draft part equals that of a plan whose context is that long), and as `kiln run`
/// decodes with it; refused without a draft model.
#[test]
fn ctx_size_draft_sets_the_draft_context() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    let draft_bytes = |args: &[&str]| {
        let mut all = vec!["plan", "-m", m, "-md", m, "--json"];
        all.extend_from_slice(args);
        let out = kiln(&all);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["draft"]["total_bytes"].as_u64().unwrap()
    };
    let short = draft_bytes(&["-c", "512", "-cd", "64"]);
    assert_eq!(short, draft_bytes(&["-c", "64"]));
    assert!(short < draft_bytes(&["-c", "512"]));
    let spec = ["-md", m, "-cd", "64", "--draft-p-min", "0", "-n", "8"];
    let stats = run_json(m, &[&spec[..], &["-p", "a b c a b c a b c"]].concat());
    assert!(
        stats["speculative"]["passes"].as_u64().unwrap() > 0,
        "{stats}"
    );
    let out = kiln(&["run", "-m", m, "-p", "x", "-n", "1", "-cd", "64"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--ctx-size-draft is for a draft model"));
}

#[test]
fn features_that_do_not_exist_are_refused_in_one_line() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    for (extra, msg) in [
        (&["-ngl", "99"][..], "no CUDA driver"),
        (&["-fa", "off"], "cannot be turned off"),
        (&["-t", "100000"], "makes no sense"),
        (&["-t", "-3"], "-3"),
    ] {
        let mut args = vec!["run", "-m", m, "-p", "x", "-n", "1"];
        args.extend_from_slice(extra);
        let out = kiln(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(err.contains(msg), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }
}

#[test]
fn ctx_zero_is_the_training_context() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    let plan = |c: &str| -> serde_json::Value {
        let out = kiln(&["plan", "-m", m, "-c", c, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let train = kiln(&["inspect", m, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&train.stdout).unwrap();
    let ctx_train = j["context_length"].as_u64().expect("context_length");
    assert_eq!(plan("0")["ctx"].as_u64(), Some(ctx_train));
    assert_eq!(plan("64")["ctx"].as_u64(), Some(64));
}

#[test]
fn instruct_models_get_their_chat_template_unless_raw() {
    let model = common::real_model("smollm2");
    let m = model.to_str().unwrap();
    let chat = run_json(m, &["-p", "Name the capital of France."]);
    let raw = run_json(m, &["-p", "Name the capital of France.", "--raw"]);
    let no_cnv = run_json(m, &["-p", "Name the capital of France.", "-no-cnv"]);
    // The template wraps the message in a system turn and role markers.
    assert!(
        chat["prompt_tokens"].as_u64() > raw["prompt_tokens"].as_u64(),
        "{chat} {raw}"
    );
    assert_eq!(raw["prompt_tokens"], no_cnv["prompt_tokens"]);
    // The short answer ends with the end-of-turn token; --ignore-eos masks it, so generation
    // runs to -n.
    let ended = run_json(m, &["-p", "Name the capital of France.", "-n", "40"]);
    assert!(ended["gen_tokens"].as_u64().unwrap() < 40, "{ended}");
    assert_ne!(ended["stop"], "length", "{ended}");
    let forced = run_json(
        m,
        &[
            "-p",
            "Name the capital of France.",
            "-n",
            "40",
            "--ignore-eos",
        ],
    );
    assert_eq!(forced["gen_tokens"], 40, "{forced}");
    assert_eq!(forced["stop"], "length", "{forced}");
    let sys = run_json(
        m,
        &["-p", "Name the capital of France.", "-sys", "Be brief."],
    );
    assert_ne!(sys["prompt_tokens"], chat["prompt_tokens"]);
    // A piped prompt is read from standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "-m", m, "--raw", "--temp", "0", "-n", "3", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Name the capital of France.")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let last: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["prompt_tokens"], raw["prompt_tokens"]);
}

#[test]
fn broken_pipes_end_quietly() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    for args in [
        &["inspect", m, "--tensors"][..],
        &["run", "-m", m, "-p", "x", "-n", "200", "--ignore-eos"],
        &["tokenize", "-m", m, "-p", &"word ".repeat(5000)],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then close the pipe, as `| head -c 1` does.
        let mut stdout = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        stdout.read_exact(&mut one).unwrap();
        drop(stdout);
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert!(status.success(), "{args:?}: {status} {err}");
    }
}

#[test]
fn user_errors_print_no_backtrace() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "-m", "/nonexistent/model.gguf", "-p", "x"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        !err.contains("backtrace") && !err.contains("Stack"),
        "{err}"
    );
    assert!(err.lines().count() <= 3, "{err}");
}

#[test]
fn plan_perplexity_and_embedding_servers_refuse_the_vulkan_device_by_name() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    let out = kiln(&["plan", "-m", m, "--device", "vulkan"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--device vulkan"), "{}", stderr(&out));
    // Nor are the commands not yet run on the Vulkan executor (refused before any device is
    // opened, the server's before its port is bound).
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = kiln(&["perplexity", "-m", m, "--device", "vulkan", "-f", text]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("kiln perplexity --device vulkan: not supported"),
        "{err}"
    );
    let out = kiln(&[
        "serve",
        "-m",
        m,
        "--device",
        "vulkan",
        "--embeddings",
        "--port",
        "0",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("kiln serve --device vulkan --embeddings: not supported"),
        "{err}"
    );
}

#[test]
fn plan_exits_non_zero_when_it_does_not_fit() {
    let model = common::random_model("random-llama-q4_0");
    let m = model.to_str().unwrap();
    let fits = kiln(&["plan", "-m", m, "-c", "128", "--budget", "1GiB"]);
    assert!(fits.status.success(), "{}", stderr(&fits));
    let tight = kiln(&["plan", "-m", m, "-c", "128", "--budget", "1MiB"]);
    assert_eq!(tight.status.code(), Some(1));
    assert!(
        stderr(&tight).contains("does not fit"),
        "{}",
        stderr(&tight)
    );
    // --json still prints the plan, and the status still says it does not fit.
    let json = kiln(&[
        "plan",
        "-m",
        m,
        "--ctx-size",
        "128",
        "--budget",
        "1MiB",
        "--json",
    ]);
    assert_eq!(json.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(j["fits"], false);
}

#[test]
fn bench_names_the_block_format_as_llama_bench_does() {
    // llama-quantize's "Q4_K" is Q4_K_M (general.file_type 15), as llama-bench names it.
    let model = common::random_model("random-llama-q4_k");
    let m = model.to_str().unwrap();
    let out = kiln(&[
        "bench",
        "-m",
        m,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
        "--bandwidth",
        "10",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ty = rows[0]["model_type"].as_str().unwrap();
    assert!(ty.starts_with("llama ") && ty.ends_with(" Q4_K_M"), "{ty}");
    assert!(rows[0]["kernels"].is_string());
    let text = kiln(&[
        "bench",
        "-m",
        m,
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "--bandwidth",
        "10",
    ]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(ty));
}

#[test]
fn inspect_and_show_take_a_model_name() {
    let a = kiln(&["inspect", "smollm2", "--json"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = kiln(&["show", "smollm2", "--json"]);
    assert_eq!(a.stdout, b.stdout);
    let j: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(j["architecture"], "llama");
    let bad = kiln(&["show", "no-such-model"]);
    assert!(!bad.status.success());
    assert!(!stderr(&bad).contains("panicked"));
}

#[test]
fn help_names_where_the_environment_variables_are() {
    let out = kiln(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("docs/tuning.md"), "{help}");
    let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tuning.md");
    assert!(doc.exists(), "{} is missing", doc.display());
}

#[test]
fn help_groups_flags_as_llama_cpp_does() {
    let out = kiln(&["run", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in ["Sampling:", "Context:", "Memory:", "Model:"] {
        assert!(help.contains(heading), "{heading} missing:\n{help}");
    }
}

/// `KILN_Q6K_GROUPS` (the output matrix's Q6_K layout: 16-row groups on AVX-512 VNNI, or rows)
/// changes no bit: the same perplexity over prompt-sized products and the same greedy text,
/// whichever layout the matrix takes.
#[test]
fn q6k_output_layouts_give_the_same_bits() {
    let model = common::random_model("random-llama-q6_k");
    let model = model.to_str().unwrap();
    let corpus = common::golden_dir().join("corpus_pydoc.txt");
    let run = |groups: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .env("KILN_Q6K_GROUPS", groups)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let ppl = [
        "perplexity",
        "-m",
        model,
        "-f",
        corpus.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--json",
    ];
    let text = [
        "run",
        "-m",
        model,
        "-p",
        "Hello there",
        "-n",
        "24",
        "--temp",
        "0",
        "--ignore-eos",
    ];
    for args in [&ppl[..], &text[..]] {
        assert_eq!(run("0", args), run("1", args), "{args:?}");
    }
    // Where the CPU has the groups (AVX-512 VNNI), the override does change the layout: the
    // plan's repacked bytes differ by the output matrix.
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni") && std::env::var_os("KILN_ISA").is_none() {
        let repacked = |groups: &str| {
            let plan = run(groups, &["plan", "-m", model, "-c", "256", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&plan).unwrap();
            let parts = v["components"].as_array().unwrap().clone();
            let c = parts
                .iter()
                .find(|c| c["name"] == "weights (repacked)")
                .unwrap();
            c["bytes"].as_u64().unwrap()
        };
        assert!(repacked("1") > repacked("0"));
    }
}
