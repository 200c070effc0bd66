//! The llama family against the reference engine: every block format of the random llama
//! model, and the real SmolLM2-135M-Instruct (Q4_1).

mod common;

use std::sync::Arc;

use common::golden::{agreement, compare, Agreement};
use kiln::model::Model;

const FORMATS: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
    "q6_k", "iq4_nl", "iq4_xs", "iq3_s",
];

#[test]
fn random_llama_every_format_matches_reference() {
    for f in FORMATS {
        let stem = format!("random-llama-{f}");
        let model = Arc::new(Model::load(common::random_model(&stem)).expect("load"));
        let agg = agreement(&model, &stem);
        agg.assert_meets_bar(&stem, 4);
    }
}

#[test]
fn smollm2_matches_reference() {
    let model = Arc::new(Model::load(common::real_model("smollm2")).expect("load"));
    let dir = common::golden_dir().join("smollm2-135m-instruct-q4_1");
    let mut agg = Agreement::default();
    compare(&model, &dir.join("logits.jsonl"), 2, true, &mut agg);
    agg.assert_meets_bar("smollm2 prompts", 4);
    let mut long = Agreement::default();
    compare(&model, &dir.join("long.jsonl"), 2, false, &mut long);
    long.assert_meets_bar("smollm2 long prompt", 0);
}
