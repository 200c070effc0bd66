//! Qwen2, Qwen3, GPT-2, Phi-3, SmolLM3, Gemma-2, Granite, Mistral-3, OLMo-2, EXAONE 3 and 4
//! (random weights) and Gemma-3 (the real 270M model) against the reference engine; unknown
//! architectures and missing tensors fail with named errors.

mod common;

use std::sync::Arc;

use common::golden::{agreement, compare, Agreement};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::{Model, ModelError};

fn check_random(stem: &str) {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let agg = agreement(&model, stem);
    agg.assert_meets_bar(stem, 4);
}

#[test]
fn random_qwen2_matches_reference() {
    check_random("random-qwen2-f32");
    check_random("random-qwen2-q4_0");
}

#[test]
fn random_qwen3_matches_reference() {
    check_random("random-qwen3-f32");
    check_random("random-qwen3-q4_k_m");
}

#[test]
fn random_gpt2_matches_reference() {
    check_random("random-gpt2-f32");
    check_random("random-gpt2-q8_0");
}

#[test]
fn gemma3_prompts_teacher_forced_match_reference() {
    let model = Arc::new(Model::load(common::real_model("gemma3")).expect("load"));
    let dir = common::golden_dir().join("gemma3-270m-q4_k_m");
    let mut agg = Agreement::default();
    compare(&model, &dir.join("logits.jsonl"), 2, false, &mut agg);
    agg.assert_meets_bar("gemma3 prompts", 0);
}

/// The 2,600-token prompt exercises the 512-token sliding window and the reference's tiled
/// (batch) kernels: its Q4_K gemm, its Q6_K tiled matmul and its tiled flash attention.
#[test]
fn gemma3_long_prompt_matches_reference() {
    let model = Arc::new(Model::load(common::real_model("gemma3")).expect("load"));
    let dir = common::golden_dir().join("gemma3-270m-q4_k_m");
    let mut long = Agreement::default();
    compare(&model, &dir.join("long.jsonl"), 2, false, &mut long);
    long.assert_meets_bar("gemma3 long prompt (sliding window)", 0);
}

/// Greedy continuations through the KV cache: decode steps take the reference's single-row
/// paths (Q4_K gemv, Q6_K vec_dot, vector flash attention).
#[test]
fn gemma3_greedy_matches_reference() {
    let model = Arc::new(Model::load(common::real_model("gemma3")).expect("load"));
    let dir = common::golden_dir().join("gemma3-270m-q4_k_m");
    let mut agg = Agreement::default();
    compare(&model, &dir.join("logits.jsonl"), 2, true, &mut agg);
    agg.assert_meets_bar("gemma3 greedy", 4);
}

/// Rewrite a real file's header with one metadata value or tensor changed.
fn rewrite(stem: &str, edit: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    let f = GgufFile::open(common::random_model(stem)).expect("open");
    let mut w = GgufWriter::from_file(&f);
    edit(&mut w);
    w.to_bytes()
}

#[test]
fn unknown_architecture_is_named() {
    let bytes = rewrite("random-llama-q4_0", |w| {
        w.set("general.architecture", "mamba9".to_string());
    });
    let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
        .err()
        .expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, ModelError::UnknownArch { .. }), "{msg}");
    assert!(
        msg.contains("mamba9") && msg.contains("llama") && msg.contains("gemma3"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let bytes = rewrite("random-llama-q4_0", |w| {
        w.remove_tensor("blk.2.ffn_down.weight");
    });
    let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("blk.2.ffn_down.weight"), "{err}");
}

/// A RoPE scaling kiln does not compute (LongRoPE as a type, anything new) is refused by
/// name: run as plain RoPE it would give wrong text with no warning.
#[test]
fn unimplemented_rope_scaling_is_refused_by_name() {
    for kind in ["longrope", "dynamic-ntk"] {
        let bytes = rewrite("random-llama-q4_0", |w| {
            w.set("llama.rope.scaling.type", kind.to_string());
            w.set("llama.rope.scaling.factor", 4.0f32);
        });
        let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .err()
            .expect("must fail");
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::UnsupportedRopeScaling { .. }),
            "{kind}: {msg}"
        );
        assert!(
            msg.contains("llama.rope.scaling.type") && msg.contains(kind) && msg.contains("yarn"),
            "{msg}"
        );
    }
    // Linear scaling, an explicit "none" and YaRN with its keys load.
    for kind in ["linear", "none", "yarn"] {
        let bytes = rewrite("random-llama-q4_0", |w| {
            w.set("llama.rope.scaling.type", kind.to_string());
            w.set("llama.rope.scaling.factor", 2.0f32);
            w.set("llama.rope.scaling.original_context_length", 64u32);
        });
        Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
}

/// The llama declaring YaRN (factor 4 over an original context of 32) against the reference:
/// prompts teacher-forced and greedy continuations.
#[test]
fn random_llama_yarn_matches_reference() {
    check_random("random-llama-yarn-f32");
}

/// The same file run as plain RoPE (YaRN's mix, magnitude and position scale dropped) misses
/// the reference's logits: the golden above can fail.
#[test]
fn llama_yarn_as_plain_rope_misses_the_golden() {
    let stem = "random-llama-yarn-f32";
    let mut model = Model::load(common::random_model(stem)).expect("load");
    for l in &mut model.weights.layers {
        let r = l.rope.as_mut().expect("rotary");
        assert!(r.yarn_mix.is_some() && r.mscale != 1.0 && r.freq_scale == 0.25);
        (r.yarn_mix, r.mscale, r.freq_scale) = (None, 1.0, 1.0);
    }
    assert_misses_golden(model, stem, "plain RoPE");
}

/// A YaRN declaration missing its keys, or with a factor that is not a positive number, is a
/// one-line error naming the key.
#[test]
fn yarn_keys_missing_or_bad_are_named() {
    let cases: [(&str, Option<f32>, Option<u32>, &str); 4] = [
        ("no factor", None, Some(64), "llama.rope.scaling.factor"),
        (
            "no original context",
            Some(4.0),
            None,
            "llama.rope.scaling.original_context_length",
        ),
        (
            "negative factor",
            Some(-4.0),
            Some(64),
            "llama.rope.scaling.factor",
        ),
        (
            "zero original context",
            Some(4.0),
            Some(0),
            "llama.rope.scaling.original_context_length",
        ),
    ];
    for (what, factor, orig, key) in cases {
        let bytes = rewrite("random-llama-q4_0", |w| {
            w.set("llama.rope.scaling.type", "yarn".to_string());
            if let Some(f) = factor {
                w.set("llama.rope.scaling.factor", f);
            }
            if let Some(o) = orig {
                w.set("llama.rope.scaling.original_context_length", o);
            }
        });
        let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .err()
            .unwrap_or_else(|| panic!("{what}: must fail"));
        let msg = err.to_string();
        assert!(msg.contains(key) && !msg.contains('\n'), "{what}: {msg}");
    }
    let bytes = rewrite("random-llama-q4_0", |w| {
        w.set("llama.rope.scaling.attn_factor", -1.0f32);
    });
    let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
        .err()
        .expect("a negative attention factor must fail");
    assert!(
        err.to_string().contains("llama.rope.scaling.attn_factor"),
        "{err}"
    );
}

/// Phi-3 (fused qkv and gate/up, partial rotary, LongRoPE's long factors and attention
/// factor) against the reference.
#[test]
fn random_phi3_matches_reference() {
    check_random("random-phi3-f32");
}

/// Run without its LongRoPE factors and attention factor, the Phi-3 file misses the
/// reference's logits: the golden above can fail.
#[test]
fn phi3_without_longrope_misses_the_golden() {
    let stem = "random-phi3-f32";
    let mut model = Model::load(common::random_model(stem)).expect("load");
    for l in &mut model.weights.layers {
        let r = l.rope.as_mut().expect("rotary");
        assert!(r.freq_factors.is_some() && r.mscale != 1.0 && r.n_dims == 24);
        (r.freq_factors, r.mscale) = (None, 1.0);
    }
    assert_misses_golden(model, stem, "plain RoPE");
}

/// LongRoPE picks the long factors when the trained context passes the original one, the
/// short ones otherwise; a factor that is not positive is named; `longrope` is refused on an
/// architecture that has no factors to read.
#[test]
fn longrope_factors_are_chosen_and_checked() {
    let f = GgufFile::open(common::random_model("random-phi3-f32")).expect("open");
    let vector = |name: &str| -> Vec<f32> {
        let t = f.tensor_info(name).expect(name);
        f.tensor_bytes(t)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let (long, short) = (
        vector("rope_factors_long.weight"),
        vector("rope_factors_short.weight"),
    );
    let factors = |bytes: Vec<u8>| {
        let m = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse")).expect("load");
        m.weights.layers[0]
            .rope
            .as_ref()
            .unwrap()
            .freq_factors
            .clone()
    };
    assert_eq!(factors(rewrite("random-phi3-f32", |_| {})), Some(long));
    let at_4096 = rewrite("random-phi3-f32", |w| {
        w.set("phi3.rope.scaling.original_context_length", 4096u32);
    });
    assert_eq!(factors(at_4096), Some(short));

    let bad = rewrite("random-phi3-f32", |w| {
        w.remove_tensor("rope_factors_long.weight");
        w.add_f32_tensor("rope_factors_long.weight", &[12], &[0.0; 12]);
    });
    let err = Model::from_gguf(GgufFile::from_bytes(bad).expect("parse"))
        .err()
        .expect("a zero factor must fail");
    assert!(
        err.to_string().contains("rope_factors_long.weight"),
        "{err}"
    );

    let bytes = rewrite("random-llama-q4_0", |w| {
        w.set("llama.rope.scaling.type", "longrope".to_string());
    });
    let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
        .err()
        .expect("longrope on llama must fail");
    assert!(
        matches!(err, ModelError::UnsupportedRopeScaling { .. }),
        "{err}"
    );
}

/// SmolLM3 (every fourth layer without RoPE) against the reference.
#[test]
fn random_smollm3_matches_reference() {
    check_random("random-smollm3-f32");
}

/// With RoPE on its NoPE layer too, the SmolLM3 file misses the reference's logits.
#[test]
fn smollm3_with_rope_everywhere_misses_the_golden() {
    let stem = "random-smollm3-f32";
    let mut model = Model::load(common::random_model(stem)).expect("load");
    let rope = model.weights.layers[0].rope.clone();
    let layers = &mut model.weights.layers;
    assert!(rope.is_some() && layers[3].rope.is_none() && layers[2].rope.is_some());
    layers[3].rope = rope;
    assert_misses_golden(model, stem, "RoPE on every layer");
}

/// Gemma-2 (post-norms, GELU gate, sliding window on the even layers, soft-capped attention
/// scores and logits) against the reference.
#[test]
fn random_gemma2_matches_reference() {
    check_random("random-gemma2-f32");
}

/// Without either soft cap, or without its sliding window, the Gemma-2 file misses the
/// reference's logits: each feature is checked by the golden above.
#[test]
fn gemma2_without_its_caps_or_window_misses_the_golden() {
    let stem = "random-gemma2-f32";
    let load = || Model::load(common::random_model(stem)).expect("load");
    let mut model = load();
    assert_eq!(model.config.attn_softcap, Some(1.0));
    model.config.attn_softcap = None;
    assert_misses_golden(model, stem, "no attention soft cap");
    let mut model = load();
    assert_eq!(model.config.final_softcap, Some(15.0));
    model.config.final_softcap = None;
    assert_misses_golden(model, stem, "no final soft cap");
    let mut model = load();
    let windows: Vec<_> = model.weights.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    model
        .weights
        .layers
        .iter_mut()
        .for_each(|l| l.window = None);
    assert_misses_golden(model, stem, "no sliding window");
}

/// A Gemma-2 file with a soft cap of 0 or a negative sliding window is a one-line error
/// naming the key, not a division by zero or a wrapped window.
#[test]
fn gemma2_bad_caps_and_windows_are_named() {
    let cases: [(&str, kiln::gguf::Value); 3] = [
        ("gemma2.attn_logit_softcapping", 0.0f32.into()),
        ("gemma2.final_logit_softcapping", 0.0f32.into()),
        ("gemma2.attention.sliding_window", (-8i32).into()),
    ];
    for (key, v) in cases {
        let bytes = rewrite("random-gemma2-f32", |w| {
            w.set(key, v.clone());
        });
        let err = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .err()
            .unwrap_or_else(|| panic!("{key}: must fail"));
        let msg = err.to_string();
        assert!(msg.contains(key) && !msg.contains('\n'), "{msg}");
    }
}

/// Granite (LLaMA with embedding, attention, residual and logit scales) against the reference.
#[test]
fn random_granite_matches_reference() {
    check_random("random-granite-f32");
}

/// Without its residual, logit or embedding scale, the Granite file misses the reference's
/// logits.
#[test]
fn granite_without_its_scales_misses_the_golden() {
    let stem = "random-granite-f32";
    let load = || Model::load(common::random_model(stem)).expect("load");
    let mut m = load();
    assert_eq!(m.config.residual_scale, Some(0.22));
    m.config.residual_scale = None;
    assert_misses_golden(m, stem, "no residual scale");
    let mut m = load();
    assert_eq!(m.config.logit_scale, Some(1.0 / 8.0));
    m.config.logit_scale = None;
    assert_misses_golden(m, stem, "no logit scale");
    let mut m = load();
    assert_eq!(m.embed_scale, 12.0);
    m.embed_scale = 1.0;
    assert_misses_golden(m, stem, "no embedding scale");
    // (Its attention scale is read and used, but this random model's attention moves its
    // logits too little for the golden to tell: unscaled scores give a mean error of 0.0005.)
    assert_eq!(load().config.attn_scale, 0.031_25);
}

/// A Granite file without its logit scale, or with a negative scale, is a one-line error
/// naming the key; an optional bias kiln does not add is refused by name.
#[test]
fn granite_bad_scales_are_named() {
    let bad = |edit: &dyn Fn(&mut GgufWriter)| {
        let bytes = rewrite("random-granite-f32", edit);
        Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .err()
            .expect("must fail")
            .to_string()
    };
    let e = bad(&|w| {
        w.remove("granite.logit_scale");
    });
    assert!(
        e.contains("granite.logit_scale") && !e.contains('\n'),
        "{e}"
    );
    let e = bad(&|w| {
        w.set("granite.residual_scale", -0.5f32);
    });
    assert!(
        e.contains("granite.residual_scale") && !e.contains('\n'),
        "{e}"
    );
    let e = bad(&|w| {
        w.add_f32_tensor("blk.1.ffn_down.bias", &[256], &[0.0; 256]);
    });
    assert!(e.contains("blk.1.ffn_down.bias"), "{e}");
}

/// Mistral-3 (llama with YaRN's corrections and magnitude from the file, and an attention
/// temperature from position 32 on) against the reference.
#[test]
fn random_mistral3_matches_reference() {
    check_random("random-mistral3-f32");
}

/// Without its attention temperature, or with YaRN's default magnitude (the file's log
/// multiplier ignored), the Mistral-3 file misses the reference's logits.
#[test]
fn mistral3_without_its_keys_misses_the_golden() {
    let stem = "random-mistral3-f32";
    let mut m = Model::load(common::random_model(stem)).expect("load");
    let t = m.config.attn_temp.expect("a temperature");
    assert_eq!((t.scale, t.floor), (0.5, 32));
    m.config.attn_temp = None;
    assert_misses_golden(m, stem, "no attention temperature");
    let bytes = rewrite(stem, |w| {
        w.remove("mistral3.rope.scaling.yarn_log_multiplier");
    });
    let m = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse")).expect("load");
    assert_misses_golden(m, stem, "YaRN's default magnitude");
    let bytes = rewrite(stem, |w| {
        w.remove("mistral3.rope.scaling.yarn_beta_fast");
        w.remove("mistral3.rope.scaling.yarn_beta_slow");
    });
    let m = Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse")).expect("load");
    assert_misses_golden(m, stem, "YaRN's default corrections");
}

/// OLMo-2 (no input norms, whole-vector q/k norms, post-norms) against the reference.
#[test]
fn random_olmo2_matches_reference() {
    check_random("random-olmo2-f32");
}

/// OLMo 3 (OLMo-2's block with local layers of window 16 on plain RoPE, a global one with
/// YaRN) against the reference.
#[test]
fn random_olmo3_matches_reference() {
    check_random("random-olmo3-f32");
}

/// Without its window, or with YaRN on its local layers too, the OLMo 3 file misses the
/// reference's logits.
#[test]
fn olmo3_without_its_window_or_plain_local_rope_misses_the_golden() {
    let stem = "random-olmo3-f32";
    let load = || Model::load(common::random_model(stem)).expect("load");
    let mut m = load();
    let windows: Vec<_> = m.weights.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(16), Some(16), Some(16), None]);
    m.weights.layers.iter_mut().for_each(|l| l.window = None);
    assert_misses_golden(m, stem, "no sliding window");
    let mut m = load();
    let global = m.weights.layers[3].rope.clone();
    assert_ne!(global, m.weights.layers[0].rope);
    for l in &mut m.weights.layers[..3] {
        l.rope = global.clone();
    }
    assert_misses_golden(m, stem, "YaRN on the local layers");
}

/// Without its post-norms the OLMo-2 file misses the reference's logits.
#[test]
fn olmo2_without_its_post_norms_misses_the_golden() {
    let stem = "random-olmo2-f32";
    let mut m = Model::load(common::random_model(stem)).expect("load");
    for l in &mut m.weights.layers {
        assert!(l.attn_norm.is_none() && l.ffn_norm.is_none());
        assert_eq!(l.q_norm.as_ref().map(|n| n.weight.len()), Some(256));
        l.attn_post_norm = None;
        l.ffn_post_norm = None;
    }
    assert_misses_golden(m, stem, "no post-norms");
}

/// An OLMo-2 file without its output head or a post-norm, an OLMo 3 file whose window pattern
/// does not fit its layers, or an EXAONE file with a bias its graph does not add: one-line errors naming the tensor or
/// key.
#[test]
fn olmo2_and_exaone_bad_files_are_named() {
    let err = |stem: &str, edit: &dyn Fn(&mut GgufWriter)| {
        let bytes = rewrite(stem, edit);
        Model::from_gguf(GgufFile::from_bytes(bytes).expect("parse"))
            .err()
            .expect("must fail")
            .to_string()
    };
    for (stem, name) in [
        ("random-olmo2-f32", "output.weight"),
        ("random-olmo2-f32", "blk.2.post_ffw_norm.weight"),
        ("random-exaone4-f32", "blk.1.post_attention_norm.weight"),
    ] {
        let e = err(stem, &|w| {
            w.remove_tensor(name);
        });
        assert!(e.contains(name) && !e.contains('\n'), "{e}");
    }
    let e = err("random-olmo3-f32", &|w| {
        w.set("olmo2.attention.sliding_window_pattern", vec![true, false]);
    });
    assert!(e.contains("olmo2.attention.sliding_window_pattern"), "{e}");
    let e = err("random-exaone-f32", &|w| {
        w.add_f32_tensor("blk.3.attn_output.bias", &[256], &[0.0; 256]);
    });
    assert!(e.contains("blk.3.attn_output.bias"), "{e}");
    let e = err("random-exaone4-f32", &|w| {
        w.set("exaone4.nextn_predict_layers", 1u32);
    });
    assert!(e.contains("exaone4.nextn_predict_layers"), "{e}");
}

/// EXAONE 3 (llama with NeoX RoPE, q/k/v biases, a tied head) and EXAONE 4 (OLMo-2's block
/// shape with per-head q/k norms) against the reference.
#[test]
fn random_exaone_matches_reference() {
    check_random("random-exaone-f32");
    check_random("random-exaone4-f32");
}

/// `model`, changed to drop a feature of `stem`'s file, misses the reference's logits: the
/// file's golden check can fail.
fn assert_misses_golden(model: Model, stem: &str, what: &str) {
    let agg = agreement(&Arc::new(model), stem);
    // (`check_random`'s bar, any part of it missed.)
    assert!(
        agg.top1_rate() < 0.99
            || agg.mean_logit_err() > 0.25
            || !agg.confident_misses.is_empty()
            || agg.greedy_equal < 4,
        "{what} met the {stem} golden: top-1 {:.4}, mean error {:.4}, greedy {}/{}",
        agg.top1_rate(),
        agg.mean_logit_err(),
        agg.greedy_equal,
        agg.greedy_total
    );
}
