//! The memory plan is what the engine allocates: same formulas, one source of truth.

mod common;

use std::sync::Arc;

use kiln::backend::exec::HasExecutor;
use kiln::cache::KvType;
use kiln::engine::batch::BatchRunner;
use kiln::engine::plan::{plan, MemoryPlan};
use kiln::engine::SessionOptions;
use kiln::model::Model;

/// The runner of the engine `kiln run` drives (one slot, no drafts), sized by `opts`.
fn engine_runner(model: &Arc<Model>, opts: &SessionOptions) -> BatchRunner {
    let (batch, cache) = kiln::engine::batch::BatchOptions::from_session(opts, 1, 0);
    BatchRunner::with_cache(Arc::clone(model), batch, cache, &mut |_, _| {}).unwrap()
}

/// The runner `r` allocates what the plan `p` says: its KV cache, and its host scratch with the
/// logits.
fn assert_allocates_the_plan(p: &MemoryPlan, r: &BatchRunner, what: &str) {
    assert_eq!(
        p.get("KV cache").unwrap().bytes,
        r.kv_bytes() as u64,
        "{what}"
    );
    let scratch = p.get("scratch (activations)").unwrap().bytes + p.get("logits").unwrap().bytes;
    assert_eq!(scratch, r.host_scratch_bytes() as u64, "{what}");
}

/// Without `--parallel`, the plan is what the command line's engine (a runner of one slot)
/// allocates: its KV cache, scratch and logits rows, and every matrix once.
#[test]
fn plan_equals_engine_allocations() {
    for stem in [
        "random-llama-q4_0",
        "random-qwen3-q4_k_m",
        "random-gpt2-q8_0",
        // An i-quant: IQ3_S's 110-byte super-blocks.
        "random-llama-iq3_s",
        // Mixtures of experts: routing scratch, experts (3-D tensors) and a shared expert.
        "random-olmoe-q4_k_m",
        "random-qwen2moe-q4_0",
        // gpt-oss: MXFP4 experts, 2-D expert biases (vectors, one per expert), a window.
        "random-gpt-oss-mxfp4",
    ] {
        for (ctx, chunk, threads, kv_type) in [
            (64, 16, 1, KvType::F16),
            (256, 512, 2, KvType::F16),
            (200, 7, 3, KvType::F16),
            (256, 64, 2, KvType::Q8_0),
        ] {
            let model = Arc::new(Model::load(common::random_model(stem)).unwrap());
            let mut opts = SessionOptions::new(ctx, threads);
            opts.prefill_chunk = chunk;
            opts.kv_type = kv_type;
            let p = plan(&model.file, &opts, 1, Default::default()).unwrap();
            let r = engine_runner(&model, &opts);
            let what = format!("{stem} ctx {ctx} chunk {chunk} threads {threads} {kv_type}");
            assert_allocates_the_plan(&p, &r, &what);
            let all_2d: usize = model
                .file
                .tensors()
                .iter()
                .filter(|t| t.shape.len() >= 2 && !t.name.ends_with(".bias"))
                .map(|t| t.n_bytes)
                .sum();
            // Every matrix the model holds (the embeddings once: a tied one is the output),
            // split into those the loader rearranged (a repacked layout has groups) and those
            // it reads in place.
            let w = &model.weights;
            let held: Vec<_> = w
                .layers
                .iter()
                .flat_map(|l| {
                    let ffn = [
                        Some(&l.wo),
                        l.ffn_gate.as_ref(),
                        l.ffn_up.as_ref(),
                        l.ffn_down.as_ref(),
                        l.moe.as_ref().map(|m| &m.router),
                    ];
                    let experts = l
                        .moe
                        .iter()
                        .flat_map(|m| m.gate.iter().chain(&m.up).chain(&m.down));
                    l.qkv
                        .matrices()
                        .into_iter()
                        .chain(ffn.into_iter().flatten())
                        .chain(experts)
                })
                .chain([&w.output])
                .chain((!w.output_tied).then_some(&w.token_embd))
                .chain(w.pos_embd.as_ref())
                .collect();
            // Bytes of the matrices, and what they take: a rearranged one is an allocation.
            let total = |repacked: bool, size: fn(usize) -> usize| -> usize {
                held.iter()
                    .filter(|l| (l.kernels.group > 1) == repacked)
                    .map(|l| size(l.data.len()))
                    .sum()
            };
            let raw = |n| n;
            let (repacked, in_place) = (total(true, raw), total(false, raw));
            let bytes = |name: &str| p.get(name).unwrap().bytes;
            assert_eq!(
                bytes("weights (repacked)"),
                total(true, kiln::engine::plan::malloc_bytes) as u64,
                "{stem}"
            );
            // An untied token-embedding table is read in place a row per token: a line of its
            // own, counting the rows of at most `ctx` distinct tokens.
            let table = if w.output_tied {
                0
            } else {
                w.token_embd.data.len() as u64
            };
            let rows = (ctx as u64).min(model.config.vocab_size as u64);
            let row = w.token_embd.row_bytes as u64;
            match p.get(kiln::engine::plan::TOKEN_TABLE) {
                Some(t) => {
                    assert!(table > 0 && w.token_embd.kernels.group == 1, "{stem}");
                    assert_eq!(
                        t.bytes,
                        kiln::engine::plan::token_table_resident(table, row, rows),
                        "{stem}"
                    );
                    assert!(t.mapped && t.bytes <= table, "{stem}");
                }
                None => assert_eq!(table, 0, "{stem}: an untied table has its line"),
            }
            assert_eq!(bytes("weights (mapped)") + table, in_place as u64, "{stem}");
            assert_eq!(
                in_place + repacked,
                all_2d,
                "{stem}: every 2-D tensor (and expert) once"
            );
        }
    }
}

#[test]
fn kv_cache_formula_for_smollm2() {
    let file = kiln::gguf::GgufFile::open(common::real_model("smollm2")).unwrap();
    let p = plan(&file, &SessionOptions::new(8192, 2), 1, Default::default()).unwrap();
    // 30 layers × 3 kv heads × 8192 positions × (64 + 64) × 2 bytes
    assert_eq!(p.get("KV cache").unwrap().bytes, 30 * 3 * 8192 * 128 * 2);
}

#[test]
fn q8_0_kv_is_34_64ths_of_f16() {
    let file = kiln::gguf::GgufFile::open(common::real_model("smollm2")).unwrap();
    let mut opts = SessionOptions::new(8192, 2);
    let f16 = plan(&file, &opts, 1, Default::default()).unwrap();
    opts.kv_type = KvType::Q8_0;
    let q8 = plan(&file, &opts, 1, Default::default()).unwrap();
    let kv = |p: &MemoryPlan| p.get("KV cache").unwrap().bytes;
    // 30 layers × 3 kv heads × 8192 positions × (2 + 2) blocks × 34 bytes
    assert_eq!(kv(&q8), 30 * 3 * 8192 * 4 * 34);
    assert_eq!(kv(&q8) * 64, kv(&f16) * 34);
    // Everything else is the same except the attention's tile buffers for dequantizing.
    let rest = |p: &MemoryPlan| p.total_bytes - kv(p);
    assert!(rest(&q8) > rest(&f16) && rest(&q8) - rest(&f16) < 1 << 20);
    // --parallel multiplies the per-sequence terms; the scratch grows by a row per sequence.
    let two = plan(&file, &opts, 2, Default::default()).unwrap();
    assert_eq!(kv(&two), 2 * kv(&q8));
    let scratch = |p: &MemoryPlan| p.get("scratch (activations)").unwrap().bytes;
    assert!(scratch(&two) > scratch(&q8) && scratch(&two) - scratch(&q8) < 1 << 20);
}

/// With `--parallel`, the plan is what a server's batch runner allocates.
#[test]
fn parallel_plan_equals_runner_allocations() {
    use kiln::engine::batch::{BatchOptions, BatchRunner};
    let models = [
        common::random_model("random-llama-q4_0"),
        common::random_model("random-qwen3-q4_k_m"),
        // Sliding-window rings.
        common::real_model("gemma3"),
    ];
    for path in models {
        let stem = path.file_name().unwrap().to_string_lossy().into_owned();
        let model = Arc::new(Model::load(&path).unwrap());
        for (slots, ctx, chunk, kv_type) in [
            (2, 64, 16, KvType::F16),
            (4, 32, 512, KvType::Q8_0),
            (40, 32, 16, KvType::F16),
            (3, 700, 2048, KvType::F16),
            (2, 2048, 64, KvType::F16),
        ] {
            let mut opts = SessionOptions::new(ctx, 2);
            opts.prefill_chunk = chunk;
            opts.kv_type = kv_type;
            let p = plan(&model.file, &opts, slots, Default::default()).unwrap();
            let r = BatchRunner::new(
                Arc::clone(&model),
                BatchOptions {
                    n_slots: slots,
                    n_ctx: ctx,
                    n_threads: 2,
                    prefill_chunk: chunk,
                    kv_type,
                    device: Default::default(),
                    draft_max: 0,
                },
            )
            .unwrap();
            let what = format!("{stem}: {slots} slots, ctx {ctx}, chunk {chunk}");
            assert_allocates_the_plan(&p, &r, &what);
        }
    }
}

#[test]
fn offloaded_plan_equals_session_ring() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    for ty in [KvType::F16, KvType::Q8_0] {
        let mut opts = SessionOptions::new(1024, 2);
        opts.kv_type = ty;
        let full = plan(&model.file, &opts, 1, Default::default()).unwrap();
        let slot = kiln::engine::session::kv_layout(&model.config, &opts).layer_kv_bytes(ty);
        opts.kv_budget = Some(2 * slot + 100);
        let p = plan(&model.file, &opts, 1, Default::default()).unwrap();
        let r = engine_runner(&model, &opts);
        let s = r.executor().kv_cache(0).unwrap();
        assert_eq!(s.offload_ring(), Some(2));
        let kv = p.get("KV cache").unwrap();
        assert_eq!(kv.bytes, s.bytes() as u64, "{ty}");
        assert_eq!(kv.bytes, 2 * slot as u64);
        assert!(kv.bytes <= opts.kv_budget.unwrap() as u64);
        assert!(kv.formula.contains("file"), "{}", kv.formula);
        assert!(full.get("KV cache").unwrap().bytes > kv.bytes);
    }
}

/// Gemma-3's 15 sliding-window layers keep a ring of 512 + 512 − 1 → 1,024 positions, the 3
/// global layers the whole context: at 32K the KV cache is 111 MiB instead of 576 MiB (with
/// `--swa-full`), the plan shows the ring, and it is what a session allocates.
#[test]
fn gemma3_plan_counts_the_sliding_window_ring() {
    let model = Arc::new(Model::load(common::real_model("gemma3")).unwrap());
    let opts = SessionOptions::new(32768, 2);
    let p = plan(&model.file, &opts, 1, Default::default()).unwrap();
    let kv = p.get("KV cache").unwrap();
    // (3 layers × 32768 + 15 layers × 1024) positions × 1 kv head × (256 + 256) × 2 bytes
    assert_eq!(kv.bytes, (3 * 32768 + 15 * 1024) * 512 * 2);
    assert_eq!(kv.bytes, 111 << 20);
    assert!(
        kv.formula
            .contains("15 sliding-window layers × ring of 1024 positions"),
        "{}",
        kv.formula
    );
    let r = engine_runner(&model, &opts);
    assert_eq!(kv.bytes, r.kv_bytes() as u64);
    let mut full = opts;
    full.swa_full = true;
    let pf = plan(&model.file, &full, 1, Default::default()).unwrap();
    assert_eq!(pf.get("KV cache").unwrap().bytes, 576 << 20);
    assert_eq!(pf.total_bytes - p.total_bytes, (576 - 111) << 20);
    // A prefill chunk of 64: 512 + 63 → 576 rows; a context the ring would not shrink has none.
    let mut small = opts;
    small.prefill_chunk = 64;
    let kv = plan(&model.file, &small, 1, Default::default()).unwrap();
    assert_eq!(
        kv.get("KV cache").unwrap().bytes,
        (3 * 32768 + 15 * 576) * 512 * 2
    );
    let short = SessionOptions::new(1024, 2);
    let kv = plan(&model.file, &short, 1, Default::default()).unwrap();
    assert_eq!(kv.get("KV cache").unwrap().bytes, 18 * 1024 * 512 * 2);
    // Offloading streams the global layers only; the rings stay in RAM.
    let mut off = opts;
    off.kv_budget = Some((2 * 32768 + 15 * 1024) * 512 * 2 + 100);
    let po = plan(&model.file, &off, 1, Default::default()).unwrap();
    let ro = engine_runner(&model, &off);
    let so = ro.executor().kv_cache(0).unwrap();
    assert_eq!(so.offload_ring(), Some(2));
    assert_eq!(
        po.get("KV cache").unwrap().bytes,
        (2 * 32768 + 15 * 1024) * 512 * 2
    );
    assert_eq!(po.get("KV cache").unwrap().bytes, so.bytes() as u64);
}

/// A mixture larger than the memory limit: its experts get a plan line of their own, paged from
/// disk (the loader leaves them in the mapping), and nothing of them is rearranged.
#[test]
fn experts_past_the_memory_limit_are_paged_from_disk() {
    use kiln::engine::plan::{HostTerms, EXPERTS_PAGED};
    for stem in ["random-olmoe-q4_k_m", "random-gpt-oss-mxfp4"] {
        let path = common::random_model(stem);
        let opts = SessionOptions::new(64, 2);
        let host = |limit| HostTerms {
            memory_limit: Some(limit),
            ..Default::default()
        };
        let file = kiln::gguf::GgufFile::open_model(&path, false).unwrap();
        let expert_bytes: u64 = file
            .tensors()
            .iter()
            .filter(|t| t.shape.len() == 3)
            .map(|t| t.n_bytes as u64)
            .sum();
        let roomy = plan(&file, &opts, 1, host(u64::MAX)).unwrap();
        assert!(roomy.get(EXPERTS_PAGED).is_none(), "{stem}");
        let tight = plan(&file, &opts, 1, host(1 << 10)).unwrap();
        let paged = tight
            .get(EXPERTS_PAGED)
            .expect("a line for the paged experts");
        assert!(
            paged.mapped && paged.formula.contains("paged from disk"),
            "{stem}"
        );
        assert_eq!(paged.bytes, expert_bytes, "{stem}");
        // The loader under the same limit holds the experts as the plan says: in the mapping.
        let model = kiln::model::Model::load_with(
            &path,
            kiln::model::LoadOptions {
                memory_limit: Some(1 << 10),
                ..Default::default()
            },
        )
        .unwrap();
        let held: u64 = model
            .weights
            .layers
            .iter()
            .flat_map(|l| l.moe.iter())
            .flat_map(|m| m.gate.iter().chain(&m.up).chain(&m.down))
            .filter(|e| e.data.is_mapped() && e.kernels.group == 1)
            .map(|e| e.data.len() as u64)
            .sum();
        assert_eq!(held, expert_bytes, "{stem}");
        let bytes = |p: &MemoryPlan, name: &str| p.get(name).unwrap().bytes;
        // What the roomy plan rearranged of the experts (where this CPU has a layout for
        // their format), the tight one does not: the owned weights shrink by at least the
        // experts' bytes.
        let rearranged = file
            .tensors()
            .iter()
            .filter(|t| t.shape.len() == 3)
            .all(|t| kiln::model::weights::repacked_at_load(&file, t, false));
        if rearranged {
            assert!(
                bytes(&roomy, "weights (repacked)")
                    >= bytes(&tight, "weights (repacked)") + expert_bytes,
                "{stem}"
            );
        }
        assert_eq!(
            bytes(&roomy, "weights (mapped)"),
            bytes(&tight, "weights (mapped)"),
            "{stem}: the other matrices in place as before"
        );
    }
}

/// `kiln plan --perplexity`: the plan of the runner `kiln perplexity` scores with is what that
/// runner allocates (its KV cache, scratch and the output head's score rows), and the scores
/// of a prefill chunk on top.
#[test]
fn scoring_plan_equals_perplexity_runner_allocations() {
    use kiln::engine::perplexity::{scoring_options, SCORE_ROWS};
    use kiln::engine::plan::{scoring_plan, SCORES};
    for stem in [
        "random-llama-q4_0",
        "random-gpt2-q8_0",
        "random-olmoe-q4_k_m",
        "random-gpt-oss-mxfp4",
    ] {
        let model = Arc::new(Model::load(common::random_model(stem)).unwrap());
        for (ctx, chunk, threads) in [(64, 16, 1), (128, 128, 2), (200, 7, 3)] {
            let mut opts = SessionOptions::new(ctx, threads);
            opts.prefill_chunk = chunk;
            let p = scoring_plan(&model.file, &opts, Default::default()).unwrap();
            let (batch, cache) = scoring_options(&opts);
            let r =
                BatchRunner::with_cache(Arc::clone(&model), batch, cache, &mut |_, _| {}).unwrap();
            assert!(r.can_score());
            let what = format!("{stem} ctx {ctx} chunk {chunk} threads {threads}");
            assert_allocates_the_plan(&p, &r, &what);
            // The output head's rows: SCORE_ROWS beside the slot's own row.
            let v = model.config.vocab_size as u64;
            assert_eq!(
                p.get("logits").unwrap().bytes,
                (SCORE_ROWS as u64 + 1) * v * 4,
                "{what}"
            );
            // A generating runner of one slot plans one head row; the rest is the same.
            let g = plan(&model.file, &opts, 1, Default::default()).unwrap();
            let scores = p.get(SCORES).unwrap().bytes;
            let c = chunk as u64;
            assert!(scores >= c * (4 + 8 + 16) + ctx as u64 * 12, "{what}");
            assert!(
                scores < c * (4 + 8 + 16) + ctx as u64 * 12 + 6 * 4096,
                "{what}"
            );
            assert!(g.get(SCORES).is_none());
            let rest = |p: &MemoryPlan| {
                p.total_bytes
                    - p.get(SCORES).map_or(0, |c| c.bytes)
                    - p.get("logits").unwrap().bytes
                    - p.get("scratch (activations)").unwrap().bytes
            };
            assert_eq!(rest(&p), rest(&g), "{what}");
        }
    }
}
