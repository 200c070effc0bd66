//! Token ids against llama.cpp's, on the real vocabularies (SmolLM2: byte-level BPE with the
//! `smollm` pre-tokenizer; Gemma 3: SentencePiece-style with 262,144 tokens) and on the random
//! models' 277-token byte-level vocabulary.

mod common;

use std::path::Path;
use std::time::Instant;

use kiln::gguf::GgufFile;
use kiln::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

fn load(path: &Path) -> Tokenizer {
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn texts() -> Value {
    let p = common::golden_dir().join("texts.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Golden dirs and the model each belongs to.
const REAL: [(&str, &str); 2] = [
    ("smollm2", "smollm2-135m-instruct-q4_1"),
    ("gemma3", "gemma3-270m-q4_k_m"),
];

fn check_tokenize(model: &str, dir: &str) {
    let tok = load(&common::real_model(model));
    let texts = texts();
    let strings = texts["tokenize"].as_array().unwrap();
    let golden = common::read_jsonl(&common::golden_dir().join(dir).join("tokenize.jsonl"));
    assert_eq!(golden.len(), strings.len());
    let mut failures = Vec::new();
    for line in &golden {
        let i = line["text_index"].as_u64().unwrap() as usize;
        let text = strings[i].as_str().unwrap();
        let got = tok.encode(text, false, false);
        if got != ids(&line["ids"]) {
            failures.push(format!(
                "[{i}] {text:?}\n  ids  got {got:?}\n  want {:?}",
                line["ids"]
            ));
        }
        let got = tok.encode(text, true, false);
        if got != ids(&line["ids_special"]) {
            failures.push(format!(
                "[{i}] {text:?}\n  ids_special got {got:?}\n  want {:?}",
                line["ids_special"]
            ));
        }
        let back = tok.decode(&ids(&line["ids"]));
        if back != text {
            failures.push(format!("[{i}] decode(encode) = {back:?}, want {text:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} mismatches\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_tokenize_matches_llama_cpp() {
    check_tokenize(REAL[0].0, REAL[0].1);
}

#[test]
fn gemma3_tokenize_matches_llama_cpp() {
    check_tokenize(REAL[1].0, REAL[1].1);
}

/// The prompt ids (BOS policy applied) of logits.jsonl and long.jsonl, and the greedy
/// continuations' text.
fn check_prompts(model: &str, dir: &str) {
    let tok = load(&common::real_model(model));
    let texts = texts();
    let prompts = texts["prompts"].as_array().unwrap();
    let golden = common::read_jsonl(&common::golden_dir().join(dir).join("logits.jsonl"));
    assert_eq!(golden.len(), prompts.len());
    for (line, prompt) in golden.iter().zip(prompts) {
        let prompt = prompt.as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, true, false),
            ids(&line["prompt_ids"]),
            "{model}: {prompt:?}"
        );
        let gen = ids(&line["gen_ids"]);
        assert_eq!(
            tok.decode(&gen),
            line["gen_text"].as_str().unwrap(),
            "{model}: gen_text"
        );
    }
    let long = common::read_jsonl(&common::golden_dir().join(dir).join("long.jsonl"));
    let long_prompt = texts["long_prompt"].as_str().unwrap();
    let got = tok.encode(long_prompt, true, false);
    let want = ids(&long[0]["prompt_ids"]);
    assert_eq!(got.len(), want.len(), "{model}: long prompt length");
    assert_eq!(got, want, "{model}: long prompt");
    assert_eq!(tok.decode(&got[usize::from(tok.adds_bos())..]), long_prompt);
}

#[test]
fn smollm2_prompt_ids_match_llama_cpp() {
    check_prompts(REAL[0].0, REAL[0].1);
}

#[test]
fn gemma3_prompt_ids_match_llama_cpp() {
    check_prompts(REAL[1].0, REAL[1].1);
}

/// Every random model: same 277-token byte-level vocabulary (`gpt-2` pre-tokenizer).
#[test]
fn random_models_prompt_ids_match_llama_cpp() {
    let texts = texts();
    let prompts = texts["prompts"].as_array().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(common::golden_dir()).unwrap() {
        let entry = entry.unwrap();
        let stem = entry.file_name().to_string_lossy().into_owned();
        if !stem.starts_with("random-") {
            continue;
        }
        if !entry.path().join("logits.jsonl").exists() {
            // An encoder's goldens are its embeddings (`tests/embeddings.rs`), a reranker's its
            // scores and prompt ids (`tests/rerank.rs`).
            assert!(
                entry.path().join("embeddings.json").exists()
                    || entry.path().join("rerank.json").exists(),
                "{stem}: neither logits, embeddings nor rerank scores"
            );
            continue;
        }
        let tok = load(&common::random_model(&stem));
        assert_eq!(tok.vocab_size(), 277, "{stem}");
        assert_eq!(tok.pre_tokenizer(), Some("gpt-2"), "{stem}");
        // gen_text holds raw bytes of random output (not always UTF-8): read lossily, the ids
        // are all that is compared here.
        let raw = std::fs::read(entry.path().join("logits.jsonl")).unwrap();
        let lines: Vec<Value> = String::from_utf8_lossy(&raw)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), prompts.len(), "{stem}");
        for (line, prompt) in lines.iter().zip(prompts) {
            let prompt = prompt.as_str().unwrap();
            assert_eq!(
                tok.encode(prompt, true, false),
                ids(&line["prompt_ids"]),
                "{stem}: {prompt:?}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 19, "only {checked} random models found");
}

/// Streaming the golden continuations piece by piece gives decode()'s text, and never a
/// partial character.
#[test]
fn stream_decoder_on_real_vocabularies() {
    // 𓀀 and ꙮ are in neither vocabulary: Gemma spells them with <0xNN> byte tokens.
    let sample = "Emoji: 😀🎉👍🏽🪿 and CJK 日本語のテキストです。中文也可以。 naïve → ∞ 𓀀ꙮ";
    for (model, _) in REAL {
        let tok = load(&common::real_model(model));
        let ids = tok.encode(sample, false, false);
        // Some token must stop inside a character for the test to mean anything.
        let splits = ids
            .iter()
            .filter(|&&id| std::str::from_utf8(tok.token_bytes(id)).is_err())
            .count();
        assert!(splits > 0, "{model}: no token splits a character");
        let mut dec = StreamDecoder::new(&tok);
        let mut joined = String::new();
        for &id in &ids {
            if let Some(piece) = dec.push(id) {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "{model}: partial character in {piece:?}"
                );
                joined.push_str(&piece);
            }
        }
        joined.extend(dec.flush());
        assert_eq!(joined, tok.decode(&ids), "{model}");
        assert_eq!(joined, sample, "{model}");
    }
}

/// Encoding speed on ~1 MB of text (printed, not asserted: run with `--release` for the real
/// number), plus an exact round trip on that much text.
#[test]
fn encode_one_megabyte() {
    let corpus = std::fs::read_to_string(common::golden_dir().join("corpus_pydoc.txt")).unwrap();
    let texts = texts();
    let mut text = String::new();
    while text.len() < 1 << 20 {
        text.push_str(&corpus);
        text.push_str(texts["long_prompt"].as_str().unwrap());
        for s in texts["tokenize"].as_array().unwrap() {
            text.push_str(s.as_str().unwrap());
            text.push('\n');
        }
    }
    for (model, _) in REAL {
        let tok = load(&common::real_model(model));
        let start = Instant::now();
        let ids = tok.encode(&text, false, false);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{model}: encoded {:.2} MB into {} tokens in {:.1} ms ({:.1} MB/s)",
            text.len() as f64 / 1e6,
            ids.len(),
            secs * 1e3,
            text.len() as f64 / 1e6 / secs
        );
        assert_eq!(tok.decode(&ids), text, "{model}: 1 MB round trip");
    }
}

/// Bytes without a byte-level token are dropped, as llama.cpp's BPE session does (it looks
/// each byte up as a one-byte string and skips those that are not tokens).
#[test]
fn smollm2_drops_bytes_missing_from_its_vocabulary() {
    let tok = shared("smollm2");
    assert_eq!(tok.decode(&tok.encode("a\u{4}b", false, false)), "ab");
    assert_eq!(tok.encode("\u{40000}", false, false).len(), 3); // F1 is dropped, 80 80 80 kept
}

fn shared(model: &str) -> &'static Tokenizer {
    use std::sync::OnceLock;
    static SMOL: OnceLock<Tokenizer> = OnceLock::new();
    static GEMMA: OnceLock<Tokenizer> = OnceLock::new();
    let cell = if model == "smollm2" { &SMOL } else { &GEMMA };
    cell.get_or_init(|| load(&common::real_model(model)))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// decode(encode(s)) == s for any text on both real vocabularies, except what neither
    /// vocabulary can represent and llama.cpp drops or alters too: a literal '▁' decodes as a
    /// space with SentencePiece; SmolLM2 has no token for the bytes 04 06 13 14 16 1D C0 C1 F1
    /// F2 F5-FF (so for U+40000..U+BFFFF), and llama.cpp's byte-level BPE drops such bytes.
    #[test]
    fn real_vocabularies_round_trip(
        text in "[^\u{2581}\u{4}\u{6}\u{13}\u{14}\u{16}\u{1d}\u{40000}-\u{bffff}]{0,80}"
    ) {
        for model in ["smollm2", "gemma3"] {
            let tok = shared(model);
            let ids = tok.encode(&text, false, false);
            proptest::prop_assert_eq!(&tok.decode(&ids), &text, "{}", model);
            let mut dec = StreamDecoder::new(tok);
            let mut joined = String::new();
            for &id in &ids {
                joined.extend(dec.push(id));
            }
            joined.extend(dec.flush());
            proptest::prop_assert_eq!(&joined, &text, "{} stream", model);
        }
    }
}

/// Degenerate inputs (one huge word, one huge whitespace run, many candidate special-token
/// starts) stay near-linear and round-trip. Printed timings, no timed assertion.
#[test]
fn degenerate_inputs() {
    let n = 1 << 20;
    let cases = [
        ("a", "a".repeat(n)),
        ("space", " ".repeat(n)),
        ("newline", "\n".repeat(n)),
        ("lt", "<".repeat(n / 2) + &"<|im_start|>".repeat(n / 24)),
        ("mixed-ws", " \t\n".repeat(n / 3)),
    ];
    for model in ["smollm2", "gemma3"] {
        let tok = shared(model);
        for (name, text) in &cases {
            let start = Instant::now();
            let ids = tok.encode(text, false, true);
            eprintln!(
                "{model} {name}: {} tokens in {:.1} ms",
                ids.len(),
                start.elapsed().as_secs_f64() * 1e3
            );
            assert_eq!(&tok.decode(&ids), text, "{model} {name}");
        }
    }
}

#[test]
fn heap_bytes_of_real_tokenizers() {
    for model in ["smollm2", "gemma3"] {
        let tok = shared(model);
        let text_bytes: usize = (0..tok.vocab_size() as u32)
            .map(|id| tok.token_text(id).len())
            .sum();
        let piece_bytes: usize = (0..tok.vocab_size() as u32)
            .map(|id| tok.token_bytes(id).len())
            .sum();
        let heap = tok.heap_bytes();
        eprintln!(
            "{model}: {} tokens, heap {:.1} MB",
            tok.vocab_size(),
            heap as f64 / 1e6
        );
        assert!(
            heap >= text_bytes + piece_bytes + 4 * tok.vocab_size(),
            "{model}: {heap}"
        );
        assert!(heap < 64 << 20, "{model}: {heap}");
    }
}
