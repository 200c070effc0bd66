//! Mixture-of-experts models (random weights) against the reference engine: Qwen3-MoE
//! (renormalized top-4 of 16), OLMoE (top-3 of 20, whole-vector q/k norms) and Qwen2-MoE (top-2
//! of 8 plus a gated shared expert), in F32 and quantized; and the bad files the loader must
//! refuse with a named error.

mod common;

use std::sync::Arc;

use common::golden::{compare, Agreement};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::{Model, ModelError};

fn check_random(stem: &str) {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    assert!(model.config.moe.is_some(), "{stem} is a mixture of experts");
    let mut agg = Agreement::default();
    compare(
        &model,
        &common::golden_dir().join(stem).join("logits.jsonl"),
        2,
        true,
        &mut agg,
    );
    agg.assert_meets_bar(stem, 4);
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
