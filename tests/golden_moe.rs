//! Mixture-of-experts models (random weights) against the reference engine: Qwen3-MoE
//! (renormalized top-4 of 16), OLMoE (top-3 of 20, whole-vector q/k norms), Qwen2-MoE (top-2
//! of 8 plus a gated shared expert) and gpt-oss (top-4 of 8 with biases everywhere, attention
//! sinks, alternating sliding-window layers, YaRN, the clamped SwiGLU; its experts in MXFP4),
//! in F32 and quantized; and the bad files the loader must refuse with a named error.

mod common;

use std::sync::Arc;

use common::golden::agreement;
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::{LoadOptions, Model, ModelError};

fn check_random(stem: &str) {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    assert!(model.config.moe.is_some(), "{stem} is a mixture of experts");
    let agg = agreement(&model, stem);
    agg.assert_meets_bar(stem, 4);
}

/// A mixture larger than the memory it may take keeps its experts row-major in the file
/// mapping (paged from disk as tokens choose them) instead of rearranging them into owned
/// memory: the same logits, the reference's.
#[test]
fn experts_paged_from_disk_match_reference() {
    for stem in ["random-olmoe-q4_k_m", "random-gpt-oss-mxfp4"] {
        let path = common::random_model(stem);
        let experts = |m: &Model| -> Vec<(usize, bool)> {
            m.weights
                .layers
                .iter()
                .flat_map(|l| l.moe.iter())
                .flat_map(|e| e.gate.iter().chain(&e.up).chain(&e.down))
                .map(|e| (e.kernels.group, e.data.is_mapped()))
                .collect()
        };
        let roomy = Model::load_with(
            &path,
            LoadOptions {
                memory_limit: Some(u64::MAX),
                ..Default::default()
            },
        )
        .expect("load");
        assert!(!roomy.experts_in_place, "{stem}");
        let tight = Model::load_with(
            &path,
            LoadOptions {
                memory_limit: Some(1 << 10),
                ..Default::default()
            },
        )
        .expect("load");
        assert!(
            tight.experts_in_place,
            "{stem}: a file larger than the limit"
        );
        let e = experts(&tight);
        assert!(!e.is_empty(), "{stem}");
        assert!(
            e.iter().all(|&(group, mapped)| group == 1 && mapped),
            "{stem}: every expert row-major in the mapping"
        );
        // With room, this CPU's kernels rearrange them (where it has a layout for the format).
        let rearranged = roomy
            .file
            .tensors()
            .iter()
            .filter(|t| t.shape.len() == 3)
            .all(|t| kiln::model::weights::repacked_at_load(&roomy.file, t, false));
        if rearranged {
            assert!(
                experts(&roomy)
                    .iter()
                    .all(|&(group, mapped)| group > 1 && !mapped),
                "{stem}: rearranged with room"
            );
        }
        let tight = Arc::new(tight);
        let agg = agreement(&tight, stem);
        agg.assert_meets_bar(stem, 4);
    }
}

/// `--no-repack` (llama.cpp's flag): the experts stay row-major in the file mapping whatever
/// the memory, and the logits are the reference's, as with the rearranged experts.
#[test]
fn no_repack_experts_match_reference() {
    for stem in [
        "random-olmoe-q4_k_m",
        "random-qwen3moe-q8_0",
        "random-qwen2moe-q4_0",
        "random-gpt-oss-mxfp4",
    ] {
        let model = Model::load_with(
            common::random_model(stem),
            LoadOptions {
                memory_limit: Some(u64::MAX),
                no_repack: true,
            },
        )
        .expect("load");
        assert!(model.experts_in_place, "{stem}");
        let experts: Vec<_> = model
            .weights
            .layers
            .iter()
            .flat_map(|l| l.moe.iter())
            .flat_map(|e| e.gate.iter().chain(&e.up).chain(&e.down))
            .collect();
        assert!(!experts.is_empty(), "{stem}");
        assert!(
            experts
                .iter()
                .all(|e| e.kernels.group == 1 && e.data.is_mapped()),
            "{stem}: every expert row-major in the mapping"
        );
        let agg = agreement(&Arc::new(model), stem);
        agg.assert_meets_bar(stem, 4);
    }
}

#[test]
fn random_qwen3moe_matches_reference() {
    check_random("random-qwen3moe-f32");
    check_random("random-qwen3moe-q8_0");
}

#[test]
fn random_olmoe_matches_reference() {
    check_random("random-olmoe-f32");
    check_random("random-olmoe-q4_k_m");
}

#[test]
fn random_qwen2moe_matches_reference() {
    check_random("random-qwen2moe-f32");
    check_random("random-qwen2moe-q4_0");
}

#[test]
fn random_gpt_oss_matches_reference() {
    check_random("random-gpt-oss-f32");
    check_random("random-gpt-oss-mxfp4");
    check_random("random-gpt-oss-q4_k_m");
}

/// gpt-oss as the reference reads it: sinks on every layer, local layers first and then every
/// other one, the experts of the shipped file in MXFP4.
#[test]
fn gpt_oss_layout_is_read_as_the_reference_reads_it() {
    let model = Model::load(common::random_model("random-gpt-oss-mxfp4")).expect("load");
    let c = &model.config;
    assert_eq!(c.sliding_window, Some(16));
    assert_eq!(c.swa_layers, [true, false, true, false]);
    let mc = c.moe.as_ref().expect("experts");
    assert_eq!(mc.gating, kiln::model::moe::Gating::SoftmaxWeight);
    assert!(mc.clamped_swiglu.is_some() && !mc.norm_weights);
    for (i, l) in model.weights.layers.iter().enumerate() {
        assert_eq!(
            l.attn_sinks.as_ref().map(Vec::len),
            Some(c.n_heads),
            "layer {i}"
        );
        assert_eq!(l.window, c.swa_layers[i].then_some(16), "layer {i}");
        let moe = l.moe.as_ref().expect("experts");
        assert_eq!(moe.up[0].kernels.weight, kiln::quant::GgmlType::MXFP4);
        assert!(moe.down[0].bias.is_some() && moe.router.bias.is_some() && l.wo.bias.is_some());
    }
}

/// Each gpt-oss feature is needed to meet its golden (so the check above can fail): without
/// the sinks, with the experts' plain SwiGLU, or with every layer attending to the whole
/// context, kiln misses the reference's logits.
#[test]
fn gpt_oss_golden_needs_sinks_clamped_swiglu_and_windows() {
    let stem = "random-gpt-oss-f32";
    let load = || Model::load(common::random_model(stem)).expect("load");
    let misses = |model: Model, what: &str| {
        let agg = agreement(&Arc::new(model), stem);
        assert!(
            agg.top1_rate() < 0.99 || agg.mean_logit_err() > 0.25,
            "{what} met the {stem} golden: top-1 {:.4}, mean error {:.4}",
            agg.top1_rate(),
            agg.mean_logit_err()
        );
    };
    let mut m = load();
    m.weights
        .layers
        .iter_mut()
        .for_each(|l| l.attn_sinks = None);
    misses(m, "attention without sinks");
    let mut m = load();
    m.config.moe.as_mut().expect("experts").clamped_swiglu = None;
    misses(m, "the plain SwiGLU");
    let mut m = load();
    m.weights.layers.iter_mut().for_each(|l| l.window = None);
    misses(m, "full attention on every layer");
}

/// A gpt-oss file without one of the tensors the reference requires is refused naming it.
#[test]
fn gpt_oss_missing_sinks_or_biases_are_named() {
    for tensor in [
        "blk.0.attn_sinks.weight",
        "blk.1.attn_output.bias",
        "blk.2.ffn_gate_inp.bias",
        "blk.3.ffn_up_exps.bias",
        "blk.0.ffn_down_exps.bias",
    ] {
        let err = load_err(rewrite("random-gpt-oss-mxfp4", |w| {
            w.remove_tensor(tensor);
        }));
        assert!(
            matches!(err, ModelError::MissingTensor { .. }),
            "{tensor}: {err}"
        );
        assert!(err.to_string().contains(tensor), "{err}");
    }
    // The window is required too (the reference's `get_key` without a default).
    let err = load_err(rewrite("random-gpt-oss-f32", |w| {
        w.remove("gpt-oss.attention.sliding_window");
    }));
    assert!(
        err.to_string().contains("gpt-oss.attention.sliding_window"),
        "{err}"
    );
}

/// An MXFP4 tensor whose rows are not whole 32-element blocks is refused when the file is
/// parsed, naming the tensor and the block.
#[test]
fn mxfp4_row_not_whole_blocks_is_named() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gpt-oss");
    w.add_raw_tensor(kiln::gguf::RawTensor {
        name: "blk.0.ffn_up_exps.weight".into(),
        dims: vec![48, 2, 1],
        type_id: 39,
        offset: None,
        data: vec![0; 2 * 2 * 17],
    });
    let err = GgufFile::from_bytes(w.to_bytes()).expect_err("must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.ffn_up_exps.weight") && msg.contains("MXFP4") && msg.contains("32"),
        "{msg}"
    );
}

/// The file of `stem` with its header rewritten by `edit`.
fn rewrite(stem: &str, edit: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    let f = GgufFile::open(common::random_model(stem)).expect("open");
    let mut w = GgufWriter::from_file(&f);
    edit(&mut w);
    w.to_bytes()
}

fn load_err(bytes: Vec<u8>) -> ModelError {
    Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
        .err()
        .expect("must fail")
}

/// An expert count that disagrees with the expert tensors' shape names the tensor, both shapes
/// and the count.
#[test]
fn expert_count_disagreeing_with_the_tensors_is_named() {
    let err = load_err(rewrite("random-qwen3moe-q8_0", |w| {
        w.set("qwen3moe.expert_count", 12u32);
    }));
    let msg = err.to_string();
    assert!(matches!(err, ModelError::BadShape { .. }), "{msg}");
    assert!(
        msg.contains("blk.0.ffn_gate_inp.weight") && msg.contains("12") && msg.contains("16"),
        "{msg}"
    );
    // The router agreeing but an expert tensor not: that tensor is named.
    let bytes = rewrite("random-olmoe-f32", |w| {
        w.remove_tensor("blk.1.ffn_up_exps.weight");
    });
    let err = load_err(bytes);
    assert!(
        err.to_string().contains("blk.1.ffn_up_exps.weight"),
        "{err}"
    );
}

#[test]
fn more_experts_used_than_exist_is_named() {
    for used in [17u32, 0] {
        let err = load_err(rewrite("random-qwen3moe-q8_0", |w| {
            w.set("qwen3moe.expert_used_count", used);
        }));
        let msg = err.to_string();
        assert!(matches!(err, ModelError::BadConfig(_)), "{msg}");
        assert!(
            msg.contains("qwen3moe.expert_used_count") && msg.contains("qwen3moe.expert_count"),
            "{msg}"
        );
    }
    // A missing count names its key.
    let err = load_err(rewrite("random-qwen2moe-q4_0", |w| {
        w.remove("qwen2moe.expert_count");
    }));
    assert!(err.to_string().contains("qwen2moe.expert_count"), "{err}");
}

/// A gating function kiln does not compute is refused by its key, not run as softmax; the two
/// it computes load.
#[test]
fn unknown_gating_function_is_refused_by_name() {
    let err = load_err(rewrite("random-olmoe-q4_k_m", |w| {
        w.set("olmoe.expert_gating_func", 4u32);
    }));
    let msg = err.to_string();
    assert!(matches!(err, ModelError::UnsupportedValue { .. }), "{msg}");
    assert!(
        msg.contains("olmoe.expert_gating_func") && msg.contains('4'),
        "{msg}"
    );
    for ok in [1u32, 2] {
        let bytes = rewrite("random-olmoe-q4_k_m", |w| {
            w.set("olmoe.expert_gating_func", ok);
        });
        Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .unwrap_or_else(|e| panic!("gating {ok}: {e}"));
    }
}

/// A file cut inside its last expert tensor is refused when parsed, naming that tensor.
#[test]
fn truncated_expert_tensor_is_named() {
    let path = common::random_model("random-qwen3moe-q8_0");
    let mut bytes = std::fs::read(&path).expect("read");
    let f = GgufFile::open(&path).expect("open");
    let last = f.tensors().last().expect("tensors").name.clone();
    assert!(last.contains("_exps"), "{last}");
    bytes.truncate(bytes.len() - 1000);
    let err = GgufFile::from_bytes(bytes).expect_err("must fail");
    assert!(err.to_string().contains(&last), "{err}");
}

/// A step of several sequences' prompts and decode rows together (continuous batching) groups
/// all of their rows by expert in one pass, yet gives every sequence the logits it gets alone,
/// bit for bit: an expert's rows of each sequence run as a batch of their own (Q4_K's and
/// Q6_K's arithmetic depends on the batch), for the K-quant experts, MXFP4 and Q8_0.
#[test]
fn batched_prompts_and_decodes_get_each_sequences_own_bits() {
    use kiln::engine::batch::{BatchOptions, BatchRunner};
    use kiln::engine::{Session, SessionOptions};
    for stem in [
        "random-olmoe-q4_k_m",
        "random-gpt-oss-mxfp4",
        "random-qwen3moe-q8_0",
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let prompt = |i: u32, len: u32| -> Vec<u32> {
            (0..len).map(|j| 1 + (i * 31 + j * 17) % 250).collect()
        };
        let session = |p: &[u32]| {
            let mut s = Session::new(Arc::clone(&m), SessionOptions::new(256, 2)).unwrap();
            s.prefill(p, &mut |_, _| {}).unwrap();
            s
        };
        let opts = BatchOptions {
            n_slots: 6,
            n_ctx: 256,
            n_threads: 2,
            prefill_chunk: 512,
            kv_type: kiln::cache::KvType::F16,
            device: Default::default(),
            draft_max: 0,
        };
        let mut runner = BatchRunner::new(Arc::clone(&m), opts).unwrap();
        // Slots 0 and 3 decode; slots 1, 2 and 5 bring whole prompts of 9, 23 and 4 tokens in
        // the same step.
        let mut decoding = Vec::new();
        for (i, slot) in [0usize, 3].into_iter().enumerate() {
            let p = prompt(i as u32, 5 + 3 * i as u32);
            runner.prefill_chunk(slot, &p, true).unwrap();
            decoding.push((slot, session(&p)));
        }
        let prompts = [
            (1usize, prompt(7, 9)),
            (2, prompt(8, 23)),
            (5, prompt(9, 4)),
        ];
        for step in 0..3 {
            runner.begin_step();
            // Parts by increasing slot: 0 decodes, 1 and 2 bring prompts, 3 decodes, 5 a prompt.
            for slot in 0..6 {
                if let Some((_, s)) = decoding.iter_mut().find(|(d, _)| *d == slot) {
                    let t = kiln::sampler::argmax(runner.logits(slot));
                    runner.push_part(slot, &[t], true);
                    s.decode(t).unwrap();
                } else if let Some((_, p)) = prompts.iter().find(|(d, _)| *d == slot) {
                    if step == 1 {
                        runner.push_part(slot, p, true);
                    }
                }
            }
            runner.run_step().unwrap();
            for (slot, s) in &decoding {
                assert_eq!(
                    runner.logits(*slot),
                    s.logits(),
                    "{stem}: slot {slot} step {step}"
                );
            }
        }
        for (slot, p) in &prompts {
            assert_eq!(
                runner.logits(*slot),
                session(p).logits(),
                "{stem}: slot {slot}"
            );
        }
    }
}

/// The bytes a decode step reads (the roofline's numerator, `kiln bench`): every matrix but
/// the embedding table (one row a token) and, of the experts, `expert_used_count` of every
/// `expert_count`; counted here from the file's tensor table.
#[test]
fn decode_step_reads_only_the_chosen_experts() {
    for stem in [
        "random-olmoe-q4_k_m",
        "random-gpt-oss-mxfp4",
        "random-qwen2moe-q4_0",
    ] {
        let model = Model::load(common::random_model(stem)).expect("load");
        let mc = model.config.moe.as_ref().unwrap();
        let tensors = model.file.tensors();
        let tied = model.file.tensor_info("output.weight").is_none();
        let matrices = tensors
            .iter()
            .filter(|t| t.shape.len() >= 2 && !t.name.ends_with(".bias"))
            .filter(|t| tied || t.name != "token_embd.weight");
        let (experts, dense): (Vec<_>, Vec<_>) = matrices.partition(|t| t.shape.len() == 3);
        // (1-D tensors are vectors; Qwen2-MoE's shared-expert gate is one, read whole.)
        let shared_gate: usize = tensors
            .iter()
            .filter(|t| t.name.ends_with("ffn_gate_inp_shexp.weight"))
            .map(|t| t.n_bytes)
            .sum();
        let per_layer_experts: usize = experts
            .iter()
            .map(|t| t.n_bytes / mc.n_expert * mc.n_used)
            .sum();
        let want = dense.iter().map(|t| t.n_bytes).sum::<usize>() + per_layer_experts + shared_gate;
        let got = model.weights_bytes_per_token();
        assert_eq!(got, want, "{stem}");
        let all: usize = tensors.iter().map(|t| t.n_bytes).sum();
        assert!(got < all, "{stem}: a step reads less than the file");
    }
}
