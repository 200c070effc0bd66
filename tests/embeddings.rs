//! Embeddings against the reference engine: the random llama, qwen2, qwen3 and gpt2 models
//! (and a Q8_0 llama), and the encoders bert, nomic-bert and jina-bert-v2 (bidirectional
//! attention, ALiBi for jina-bert-v2, whole
//! prompts per pass, several sequences per pass; a generation asked of them refused by
//! name), mean / cls / last pooling of the golden prompts, computed through the
//! scheduler as `kiln serve` computes them (prefill chunks smaller than the prompts, several
//! embeddings and a generating sequence in the same steps), agree with llama.cpp's
//! `llama_get_embeddings_seq` (tests/golden/<model>/embeddings.json, scripts/make-fixtures.py)
//! to 1e-3 in cosine distance. The pooling a GGUF file declares is read; what kiln cannot pool
//! is refused by name. `kiln embedding` prints the same vectors.

mod common;

use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::pooling::{cosine, EmbedSpec, Pooling, PoolingError};
use kiln::engine::scheduler::{
    FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

/// Largest cosine distance from the reference's vector.
const MAX_COS_DIST: f64 = 1e-3;

#[derive(Clone, Default)]
struct Out(Arc<Mutex<Outcome>>);

#[derive(Default)]
struct Outcome {
    rows: Option<Vec<Vec<f32>>>,
    tokens: Vec<u32>,
    finished: Option<Finished>,
}

impl SeqSink for Out {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().tokens.push(id);
    }
    fn embedding(&mut self, rows: Vec<Vec<f32>>) {
        self.0.lock().unwrap().rows = Some(rows);
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap().finished = Some(f);
    }
}

fn request(prompt: Vec<u32>, embed: Option<EmbedSpec>, max_new: usize) -> (Out, SeqRequest) {
    let out = Out::default();
    let req = SeqRequest {
        prompt,
        max_new,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        code: Default::default(),
        cache_prompt: true,
        tenant: 0,
        ignore_eos: true,
        grammar: None,
        logprobs: None,
        forks: Vec::new(),
        embed,
        score: None,
        sink: Box::new(out.clone()),
    };
    (out, req)
}

fn scheduler_runner(m: &Arc<Model>, slots: usize, chunk: usize) -> BatchRunner {
    BatchRunner::new(
        Arc::clone(m),
        BatchOptions {
            n_slots: slots,
            n_ctx: 256,
            n_threads: 2,
            prefill_chunk: chunk,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap()
}

/// Run every request to its end on one scheduler; returns the steps it took.
fn run_all(sched: &mut Scheduler<'_>, reqs: Vec<SeqRequest>) -> usize {
    for r in reqs {
        sched.submit(r);
    }
    let mut steps = 0;
    while !sched.is_idle() {
        sched.step();
        steps += 1;
        assert!(steps < 10_000, "the scheduler does not finish");
    }
    steps
}

/// A generation alone (greedy, 12 tokens), to compare with one run beside embeddings.
fn generate_alone(m: &Arc<Model>, tok: &Tokenizer, prompt: &[u32]) -> Vec<u32> {
    let mut sched = Scheduler::new(
        scheduler_runner(m, 1, 7),
        tok,
        Arc::new(SchedMetrics::default()),
    );
    let (out, req) = request(prompt.to_vec(), None, 12);
    run_all(&mut sched, vec![req]);
    let o = out.0.lock().unwrap();
    o.tokens.clone()
}

fn check_model(stem: &str) {
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let path = common::golden_dir().join(stem).join("embeddings.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(golden["n_embd"].as_u64(), Some(m.config.dim as u64));
    let rows = golden["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 15, "{stem}: 5 prompts x mean, cls, last");

    // Every golden row at once on 4 slots, prefill chunks of 7 (so that the prompts span
    // several steps and share them), beside a generating sequence.
    let gen_prompt: Vec<u32> = rows[0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut reqs = Vec::new();
    let mut outs = Vec::new();
    for r in rows {
        let ids: Vec<u32> = r["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let pooling = Pooling::parse(r["pooling"].as_str().unwrap()).unwrap();
        let spec = EmbedSpec {
            pooling,
            normalize: -1,
        };
        let (out, req) = request(ids, Some(spec), 0);
        reqs.push(req);
        outs.push(out);
    }
    let (gen_out, gen_req) = request(gen_prompt.clone(), None, 12);
    reqs.insert(3, gen_req);
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(scheduler_runner(&m, 4, 7), &tok, Arc::clone(&metrics));
    let steps = run_all(&mut sched, reqs);
    let encoder = m.config.arch.is_encoder();
    if encoder {
        // Whole prompts, four per pass (4 slots; the chunk of 7 does not apply: a pass holds
        // a whole sequence).
        assert_eq!(steps, rows.len().div_ceil(4), "{stem}: passes");
    }

    let mut worst: f64 = 0.0;
    for (r, out) in rows.iter().zip(&outs) {
        let what = format!(
            "{stem} {} prompt {}",
            r["pooling"].as_str().unwrap(),
            r["prompt_index"]
        );
        let o = out.0.lock().unwrap();
        let f = o.finished.as_ref().expect("finished");
        assert_eq!(f.reason, FinishReason::Stop, "{what}");
        assert_eq!(
            f.usage.prompt_tokens,
            r["ids"].as_array().unwrap().len(),
            "{what}"
        );
        assert_eq!(f.usage.completion_tokens, 0, "{what}: no tokens generated");
        assert!(o.tokens.is_empty(), "{what}: no tokens generated");
        let got = o.rows.as_ref().expect("an embedding");
        assert_eq!(got.len(), 1, "{what}: one pooled vector");
        let want: Vec<f32> = r["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let dist = 1.0 - cosine(&got[0], &want);
        assert!(dist <= MAX_COS_DIST, "{what}: cosine distance {dist:.2e}");
        // Unnormalized (embd_normalize -1): the same length too.
        let norm = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let ratio = norm(&got[0]) / norm(&want);
        assert!((ratio - 1.0).abs() < 1e-2, "{what}: length ratio {ratio}");
        worst = worst.max(dist);
    }
    eprintln!("{stem}: worst cosine distance {worst:.2e}");
    if encoder {
        // An encoder generates nothing: the request is refused by name.
        let o = gen_out.0.lock().unwrap();
        let f = o.finished.as_ref().expect("finished");
        match &f.reason {
            FinishReason::Error(e) => assert!(
                e.contains(&format!("'{}' is an encoder", m.config.arch_name)),
                "{e}"
            ),
            other => panic!("{stem}: a generation ended {other:?}"),
        }
        assert!(o.tokens.is_empty());
        return;
    }
    // The generation beside them is the one it gives alone: embeddings only add rows.
    let together = gen_out.0.lock().unwrap().tokens.clone();
    assert_eq!(together.len(), 12);
    assert_eq!(together, generate_alone(&m, &tok, &gen_prompt), "{stem}");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(metrics.requests_finished.load(Relaxed), 16);
    assert_eq!(metrics.slots_in_use.load(Relaxed), 0);
    assert_eq!(metrics.kv_tokens_in_use.load(Relaxed), 0);
}

#[test]
fn random_llama_embeddings_match_reference() {
    check_model("random-llama-f32");
    check_model("random-llama-q8_0");
}

#[test]
fn random_qwen2_embeddings_match_reference() {
    check_model("random-qwen2-f32");
}

#[test]
fn random_qwen3_embeddings_match_reference() {
    check_model("random-qwen3-f32");
}

#[test]
fn random_gpt2_embeddings_match_reference() {
    check_model("random-gpt2-f32");
}

#[test]
fn random_bert_embeddings_match_reference() {
    check_model("random-bert-f32");
}

#[test]
fn random_nomic_bert_embeddings_match_reference() {
    check_model("random-nomic-bert-f32");
}

#[test]
fn random_jina_bert_v2_embeddings_match_reference() {
    check_model("random-jina-bert-v2-f32");
}

/// L2 normalization (the server's default) gives unit vectors in the reference's direction,
/// and `none` gives one vector per position whose last is `last`'s.
#[test]
fn normalized_and_per_token_vectors() {
    let m = Arc::new(Model::load(common::random_model("random-llama-f32")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let ids = tok.encode("The three primary colors are", true, true);
    let spec = |pooling, normalize| Some(EmbedSpec { pooling, normalize });
    let (l2, r1) = request(ids.clone(), spec(Pooling::Last, 2), 0);
    let (raw, r2) = request(ids.clone(), spec(Pooling::Last, -1), 0);
    let (none, r3) = request(ids.clone(), spec(Pooling::None, -1), 0);
    let mut sched = Scheduler::new(
        scheduler_runner(&m, 2, 5),
        &tok,
        Arc::new(SchedMetrics::default()),
    );
    run_all(&mut sched, vec![r1, r2, r3]);
    let get = |o: &Out| o.0.lock().unwrap().rows.clone().expect("rows");
    let (l2, raw, none) = (get(&l2), get(&raw), get(&none));
    let n: f64 = l2[0].iter().map(|&x| x as f64 * x as f64).sum::<f64>();
    assert!((n - 1.0).abs() < 1e-5, "unit length: {n}");
    assert!(1.0 - cosine(&l2[0], &raw[0]) < 1e-6);
    assert_eq!(none.len(), ids.len(), "one vector per position");
    assert_eq!(none.last().unwrap(), &raw[0], "the last position is `last`");
}

/// The pooling a file declares is read, an override wins, and what kiln cannot pool is
/// refused by name.
#[test]
fn declared_pooling_and_refusals() {
    let with = |edit: &dyn Fn(&mut GgufWriter)| {
        let f = GgufFile::open(common::random_model("random-llama-f32")).expect("open");
        let mut w = GgufWriter::from_file(&f);
        edit(&mut w);
        Model::from_gguf(GgufFile::from_bytes(w.to_bytes()).unwrap()).expect("load")
    };
    let plain = with(&|_| {});
    assert_eq!(Pooling::for_model(&plain, None), Ok(Pooling::None));
    assert_eq!(
        Pooling::for_model(&plain, Some(Pooling::Mean)),
        Ok(Pooling::Mean)
    );
    for (v, want) in [(1u32, Pooling::Mean), (2, Pooling::Cls), (3, Pooling::Last)] {
        let m = with(&|w| {
            w.set("llama.pooling_type", v);
        });
        assert_eq!(Pooling::for_model(&m, None), Ok(want), "pooling_type {v}");
        assert_eq!(
            Pooling::for_model(&m, Some(Pooling::Cls)),
            Ok(Pooling::Cls),
            "--pooling wins"
        );
    }
    let rank = with(&|w| {
        w.set("llama.pooling_type", 4u32);
    });
    let arch = "llama".to_string();
    assert_eq!(
        Pooling::for_model(&rank, None),
        Err(PoolingError::RankDecoder { arch })
    );
    let odd = with(&|w| {
        w.set("llama.pooling_type", 7u32);
    });
    let e = Pooling::for_model(&odd, None).unwrap_err();
    assert!(e.to_string().contains("llama.pooling_type = 7"), "{e}");
    let bidirectional = with(&|w| {
        w.set("llama.attention.causal", false);
    });
    let e = Pooling::for_model(&bidirectional, Some(Pooling::Mean)).unwrap_err();
    assert!(e.to_string().contains("llama.attention.causal"), "{e}");
}

/// `kiln embedding` as llama-embedding is run: the reference's vector through --json, one line
/// per prompt and the similarity matrix in text, and bad flags refused.
#[test]
fn embedding_command() {
    let model = common::random_model("random-llama-f32");
    let path = common::golden_dir()
        .join("random-llama-f32")
        .join("embeddings.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let row = golden["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pooling"] == "cls" && r["prompt_index"] == 1)
        .unwrap();
    let texts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("texts.json")).unwrap(),
    )
    .unwrap();
    let prompt = texts["prompts"][1].as_str().unwrap();
    let kiln = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("embedding")
            .arg("-m")
            .arg(&model)
            .args(args)
            .output()
            .unwrap()
    };
    let out = kiln(&[
        "-p",
        prompt,
        "--pooling",
        "cls",
        "--json",
        "--embd-normalize",
        "-1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<f32> = v["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let want: Vec<f32> = row["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert!(1.0 - cosine(&got, &want) < MAX_COS_DIST);
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(row["ids"].as_array().unwrap().len() as u64)
    );

    let two = format!("{}\n{prompt}\n", texts["prompts"][0].as_str().unwrap());
    let out = kiln(&["-p", &two, "--pooling", "mean"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("embedding ")).count(),
        2
    );
    assert!(text.contains("cosine similarity matrix"), "{text}");
    assert!(text.contains("  1.00"), "{text}");

    for (flag, needle) in [("rank", "rank pooling"), ("max", "expected none, mean")] {
        let out = kiln(&["-p", "x", "--pooling", flag]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(needle));
    }
}

/// A cached prefix is reused only where the pooling reads no state of it (`last`), and gives
/// the same vector; a prompt may fill the whole context, one token more is refused.
#[test]
fn prefix_reuse_and_context_limits() {
    let m = Arc::new(Model::load(common::random_model("random-qwen2-f32")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let ids = tok.encode(
        "Once upon a time, in a small village by the sea,",
        true,
        true,
    );
    let mut sched = Scheduler::new(
        scheduler_runner(&m, 1, 7),
        &tok,
        Arc::new(SchedMetrics::default()),
    );
    let mut run = |pooling, prompt: &[u32]| {
        let spec = EmbedSpec {
            pooling,
            normalize: -1,
        };
        let (out, req) = request(prompt.to_vec(), Some(spec), 0);
        run_all(&mut sched, vec![req]);
        let o = out.0.lock().unwrap();
        let f = o.finished.clone().expect("finished");
        (o.rows.clone(), f)
    };
    for pooling in [Pooling::Last, Pooling::Mean, Pooling::Cls] {
        let (first, f1) = run(pooling, &ids);
        let (again, f2) = run(pooling, &ids);
        assert_eq!(f1.reason, FinishReason::Stop);
        let reused = f2.usage.cached_tokens;
        if pooling == Pooling::Last {
            assert_eq!(reused, ids.len() - 1, "last: all but the last token reused");
        } else {
            assert_eq!(reused, 0, "{pooling:?} reads every state: no reuse");
        }
        let (a, b) = (&first.unwrap()[0], &again.unwrap()[0]);
        assert!(1.0 - cosine(a, b) < 1e-6, "{pooling:?}: same vector");
    }
    // The runner's context is 256 positions.
    let full: Vec<u32> = (0..256).map(|i| 3 + (i % 200) as u32).collect();
    let (rows, f) = run(Pooling::Mean, &full);
    assert_eq!(f.reason, FinishReason::Stop, "a prompt filling the context");
    assert_eq!(rows.unwrap().len(), 1);
    let over: Vec<u32> = (0..257).map(|i| 3 + (i % 200) as u32).collect();
    let (rows, f) = run(Pooling::Mean, &over);
    assert!(
        matches!(f.reason, FinishReason::Error(ref e) if e.contains("257")),
        "{:?}",
        f.reason
    );
    assert!(rows.is_none());
}

/// An encoder is refused by name where kiln does not run it: on the GPU, and for logits.
#[test]
fn encoder_refusals() {
    let m = Arc::new(Model::load(common::random_model("random-bert-f32")).expect("load"));
    let e = BatchRunner::new(
        Arc::clone(&m),
        BatchOptions {
            n_slots: 1,
            n_ctx: 64,
            n_threads: 1,
            prefill_chunk: 16,
            kv_type: KvType::F16,
            device: kiln::backend::Device::Cuda,
            draft_max: 0,
        },
    )
    .err()
    .expect("refused on CUDA");
    let msg = e.to_string();
    assert!(
        msg.contains("'bert' is an encoder") && msg.contains("CUDA"),
        "{msg}"
    );
    // Generation (kiln run, chat, perplexity) is refused by name.
    let opts = kiln::engine::session::SessionOptions::new(64, 1);
    let e = kiln::engine::session::Session::new(Arc::clone(&m), opts)
        .err()
        .expect("no generating session");
    assert!(e.to_string().contains("'bert' is an encoder"), "{e}");
    // The forward pass computes no logits for it.
    use kiln::engine::session::{kv_layout, scratch_spec};
    let o = kiln::engine::session::SessionOptions::new(64, 1);
    let mut kv = kiln::cache::KvCache::new(kv_layout(&m.config, &o));
    let mut scratch = kiln::cache::Scratch::new(&m.config, scratch_spec(&m, &o));
    let rt = kiln::backend::cpu::Runtime::new(1);
    let e = kiln::model::forward::forward_cpu(
        &m,
        &rt,
        &mut kv,
        &mut scratch,
        &[1, 2, 3],
        kiln::model::forward::Logits::Last,
    )
    .unwrap_err();
    assert!(e.to_string().contains("bert is an encoder"), "{e}");
    assert_eq!(kv.len(), 0, "nothing written");
}

/// A malformed encoder file is refused at load in one line naming the key or tensor: no
/// token-type count, no token-type embeddings, no embedding norm; an unknown pooling type.
#[test]
fn malformed_encoders_are_refused_by_name() {
    let edited = |stem: &str, edit: &dyn Fn(&mut GgufWriter)| {
        let f = GgufFile::open(common::random_model(stem)).expect("open");
        let mut w = GgufWriter::from_file(&f);
        edit(&mut w);
        Model::from_gguf(GgufFile::from_bytes(w.to_bytes()).unwrap())
    };
    type Edit<'a> = &'a dyn Fn(&mut GgufWriter);
    let cases: [(&str, Edit, &str); 5] = [
        (
            "random-bert-f32",
            &|w| {
                w.remove("tokenizer.ggml.token_type_count");
            },
            "tokenizer.ggml.token_type_count",
        ),
        (
            "random-nomic-bert-f32",
            &|w| {
                w.remove_tensor("token_types.weight");
            },
            "token_types.weight",
        ),
        (
            "random-bert-f32",
            &|w| {
                w.remove_tensor("token_embd_norm.bias");
            },
            "token_embd_norm.bias",
        ),
        (
            "random-bert-f32",
            &|w| {
                w.remove_tensor("blk.2.layer_output_norm.weight");
            },
            "blk.2.layer_output_norm.weight",
        ),
        (
            // A jina-bert-v2 variant's q LayerNorm, which kiln does not compute.
            "random-jina-bert-v2-f32",
            &|w| {
                w.add_f32_tensor("blk.1.attn_q_norm.weight", &[256], &[1.0; 256]);
            },
            "blk.1.attn_q_norm.weight",
        ),
    ];
    for (stem, edit, needle) in cases {
        let e = edited(stem, edit).err().expect("refused").to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{stem}: {e}");
    }
    let odd = edited("random-bert-f32", &|w| {
        w.set("bert.pooling_type", 9u32);
    })
    .expect("loads");
    let e = Pooling::for_model(&odd, None).unwrap_err().to_string();
    assert!(e.contains("bert.pooling_type = 9"), "{e}");
    // The declared pooling is read: cls for bert, mean for nomic-bert.
    for (stem, want) in [
        ("random-bert-f32", Pooling::Cls),
        ("random-nomic-bert-f32", Pooling::Mean),
        ("random-jina-bert-v2-f32", Pooling::Mean),
    ] {
        let m = Model::load(common::random_model(stem)).unwrap();
        assert_eq!(Pooling::for_model(&m, None), Ok(want), "{stem}");
    }
}

/// `kiln embedding` runs an encoder with no flags (its declared pooling, the reference's
/// vector); `kiln run` refuses it by name.
#[test]
fn encoder_commands() {
    let model = common::random_model("random-bert-f32");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::golden_dir()
                .join("random-bert-f32")
                .join("embeddings.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let row = golden["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pooling"] == "cls" && r["prompt_index"] == 1)
        .unwrap();
    let texts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("texts.json")).unwrap(),
    )
    .unwrap();
    let kiln = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .arg("-m")
            .arg(&model)
            .output()
            .unwrap()
    };
    let prompt = texts["prompts"][1].as_str().unwrap();
    let out = kiln(&["embedding", "-p", prompt, "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let vec = |x: &serde_json::Value| -> Vec<f32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let got = vec(&v["data"][0]["embedding"]);
    assert!(1.0 - cosine(&got, &vec(&row["embedding"])) < MAX_COS_DIST);
    let out = kiln(&["run", "-p", "hi", "-n", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'bert' is an encoder"), "{err}");
}

/// Under bidirectional attention a cached key has seen its own prompt's later tokens, so an
/// encoder reuses no prefix, even with `last` pooling (which reads no earlier state).
#[test]
fn encoders_reuse_no_prefix() {
    let m = Arc::new(Model::load(common::random_model("random-bert-f32")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let first = tok.encode("the cat sat on the mat and looked out", true, true);
    let second = tok.encode("the cat sat on the mat and then slept", true, true);
    let shared = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared >= 4, "the prompts share a prefix ({shared} tokens)");
    let spec = EmbedSpec {
        pooling: Pooling::Last,
        normalize: -1,
    };
    let embed = |sched: &mut Scheduler<'_>, prompt: &[u32]| {
        let (out, req) = request(prompt.to_vec(), Some(spec), 0);
        run_all(sched, vec![req]);
        let o = out.0.lock().unwrap();
        let f = o.finished.clone().expect("finished");
        (
            o.rows.clone().expect("a vector")[0].clone(),
            f.usage.cached_tokens,
        )
    };
    let mut warm = Scheduler::new(
        scheduler_runner(&m, 1, 64),
        &tok,
        Arc::new(SchedMetrics::default()),
    );
    embed(&mut warm, &first);
    let (after, cached) = embed(&mut warm, &second);
    assert_eq!(cached, 0, "an encoder reused {cached} cached tokens");
    let mut cold = Scheduler::new(
        scheduler_runner(&m, 1, 64),
        &tok,
        Arc::new(SchedMetrics::default()),
    );
    let (alone, _) = embed(&mut cold, &second);
    assert_eq!(after, alone, "the same vector as from an empty cache");
}

/// `embed_prompts` of many short prompts (a pass carries as many whole prompts as fit, 16 and
/// more here) gives every prompt the bits it gets alone, for an encoder and a decoder, with the
/// pooling that reads every row (`mean`) and the one that reads the first (`cls`).
#[test]
fn many_prompts_at_once_match_each_alone() {
    use kiln::engine::embed::embed_prompts;
    for stem in ["random-bert-f32", "random-llama-f32"] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let words = [
            "the", "cat", "sat", "on", "a", "mat", "and", "then", "slept", "well",
        ];
        let prompts: Vec<Vec<u32>> = (0..40)
            .map(|i| {
                let text: Vec<&str> = (0..2 + i % 7).map(|k| words[(i * 3 + k) % 10]).collect();
                tok.encode(&text.join(" "), true, true)
            })
            .collect();
        let opts = BatchOptions {
            n_slots: 4,
            n_ctx: 128,
            n_threads: 2,
            prefill_chunk: 128,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        };
        for pooling in [Pooling::Mean, Pooling::Cls] {
            let spec = EmbedSpec {
                pooling,
                normalize: 2,
            };
            let all = embed_prompts(&m, &tok, &prompts, spec, opts).expect("embed");
            assert_eq!(all.len(), prompts.len());
            for (i, p) in prompts.iter().enumerate() {
                let alone = embed_prompts(&m, &tok, std::slice::from_ref(p), spec, opts)
                    .expect("embed one");
                assert_eq!(all[i].len(), 1, "{stem} {pooling:?} prompt {i}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&all[i][0]),
                    bits(&alone[0][0]),
                    "{stem} {pooling:?} prompt {i}: batched differs from alone"
                );
            }
        }
    }
}
