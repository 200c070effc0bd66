//! Chunked prefill bounds activation memory: the peak RSS of a `kiln run` grows with the
//! prompt only by the KV cache positions it fills (the plan's per-position KV bytes), not by
//! activations. Measured in a child process (VmHWM reported by `kiln run --json`), so the test
//! harness's own memory does not enter.

mod common;

use std::process::Command;

use kiln::engine::plan::plan;
use kiln::engine::SessionOptions;

const CTX: usize = 4096;

/// (prompt tokens, peak RSS bytes) of a greedy one-token run over the first `chars` of the corpus.
fn peak(model: &str, chars: usize, chunk: usize) -> (u64, u64) {
    let text = std::fs::read_to_string(common::golden_dir().join("corpus_pydoc.txt")).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-actmem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("prompt-{chars}.txt"));
    std::fs::write(&file, &text[..chars]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "-m", model, "-f"])
        .arg(&file)
        .args(["-c", &CTX.to_string(), "-b", &chunk.to_string()])
        .args(["-n", "1", "--temp", "0", "-t", "2", "--json"])
        .output()
        .expect("run kiln");
    let _ = std::fs::remove_file(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // `run --json` prints JSON lines on stdout, the statistics last.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout.lines().last().expect("--json line");
    let j: serde_json::Value = serde_json::from_str(json).unwrap();
    (
        j["prompt_tokens"].as_u64().unwrap(),
        j["peak_rss_bytes"].as_u64().unwrap(),
    )
}

#[test]
fn chunked_prefill_peak_grows_only_by_kv() {
    let path = common::random_model("random-llama-q4_0");
    let model = path.to_str().unwrap();
    let file = kiln::gguf::GgufFile::open(&path).unwrap();
    let p = plan(&file, &SessionOptions::new(CTX, 2), 1, Default::default()).unwrap();
    let kv_per_pos = p.get("KV cache").unwrap().bytes / CTX as u64;

    let growth = |chunk: usize| {
        let (n_short, short) = peak(model, 600, chunk);
        let (n_long, long) = peak(model, 4000, chunk);
        assert!(n_long > 5 * n_short, "{n_short} vs {n_long} tokens");
        let kv = (n_long - n_short) * kv_per_pos;
        eprintln!(
            "chunk {chunk}: {n_short} tokens peak {} KiB, {n_long} tokens peak {} KiB; KV difference {} KiB",
            short >> 10,
            long >> 10,
            kv >> 10
        );
        long as i64 - short as i64 - kv as i64
    };
    // Prefill in chunks of 64: beyond the KV positions, the peak moves by less than 1 MiB
    // (token lists and the prompt text).
    let excess = growth(64);
    assert!(
        excess.abs() < 1 << 20,
        "chunked prefill: peak grew {excess} bytes beyond the KV cache"
    );
    // Control: the same prompts in one pass (chunk = context) do grow the activations
    // (~10 KiB per token here), so the measurement above would have seen it.
    let unchunked = growth(CTX);
    assert!(
        unchunked > 10 << 20,
        "unchunked prefill grew only {unchunked} bytes beyond the KV cache"
    );
}
