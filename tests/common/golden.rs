//! Agreement with the reference engine's logits (tests/golden/<model>/logits.jsonl, long.jsonl).
//!
//! Teacher forcing: the golden prompt ids are evaluated in one pass and, at every position,
//! kiln's top-1 token is compared with the reference's; the reference top-1 token's logit is
//! compared too. Greedy continuations are generated token by token through the KV cache.

use std::sync::Arc;

use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

/// What the comparison found over all the golden prompts of one model.
#[derive(Debug, Default)]
pub struct Agreement {
    pub positions: usize,
    pub top1_equal: usize,
    /// Positions where the golden top-1 leads its runner-up by more than 0.5 but kiln disagrees.
    pub confident_misses: Vec<(usize, usize)>,
    /// Sum of |kiln logit − golden logit| for the golden top-1 token.
    pub logit_err_sum: f64,
    pub max_logit_err: f64,
    pub greedy_equal: usize,
    pub greedy_total: usize,
}

impl Agreement {
    pub fn top1_rate(&self) -> f64 {
        self.top1_equal as f64 / self.positions.max(1) as f64
    }
    pub fn mean_logit_err(&self) -> f64 {
        self.logit_err_sum / self.positions.max(1) as f64
    }

    /// The bar: top-1 ≥ 99%, always where the reference is confident, mean logit error
    /// of the reference top-1 token ≤ 0.25.
    pub fn assert_meets_bar(&self, what: &str, min_greedy: usize) {
        eprintln!(
            "{what}: top-1 {}/{} ({:.2}%), mean |Δlogit| {:.4}, max {:.4}, greedy {}/{}",
            self.top1_equal,
            self.positions,
            100.0 * self.top1_rate(),
            self.mean_logit_err(),
            self.max_logit_err,
            self.greedy_equal,
            self.greedy_total
        );
        assert!(self.positions > 0, "{what}: nothing compared");
        assert!(
            self.top1_rate() >= 0.99,
            "{what}: top-1 agreement {:.4} < 0.99",
            self.top1_rate()
        );
        assert!(
            self.confident_misses.is_empty(),
            "{what}: confident positions missed: {:?}",
            self.confident_misses
        );
        assert!(
            self.mean_logit_err() <= 0.25,
            "{what}: mean logit error {:.4} > 0.25",
            self.mean_logit_err()
        );
        assert!(
            self.greedy_equal >= min_greedy,
            "{what}: greedy {}/{} < {min_greedy}",
            self.greedy_equal,
            self.greedy_total
        );
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// How `model` agrees with `stem`'s golden logits (`tests/golden/<stem>/logits.jsonl`), on 2
/// threads with the greedy continuations replayed.
pub fn agreement(model: &Arc<Model>, stem: &str) -> Agreement {
    let mut agg = Agreement::default();
    compare(
        model,
        &super::golden_dir().join(stem).join("logits.jsonl"),
        2,
        true,
        &mut agg,
    );
    agg
}

/// Compare a model against a golden logits file. `check_greedy` also replays `gen_ids`.
pub fn compare(
    model: &Arc<Model>,
    golden_file: &std::path::Path,
    threads: usize,
    check_greedy: bool,
    agg: &mut Agreement,
) {
    compare_on(
        kiln::backend::Device::Cpu,
        model,
        golden_file,
        threads,
        check_greedy,
        agg,
    )
}

/// [`compare`] with the model on `device`.
pub fn compare_on(
    device: kiln::backend::Device,
    model: &Arc<Model>,
    golden_file: &std::path::Path,
    threads: usize,
    check_greedy: bool,
    agg: &mut Agreement,
) {
    for line in super::read_jsonl(golden_file) {
        let prompt = ids(&line["prompt_ids"]);
        let tops = line["prompt_top"].as_array().expect("prompt_top");
        let gen = ids(&line["gen_ids"]);
        let n_ctx = (prompt.len() + gen.len() + 8).next_power_of_two();
        let mut opts = SessionOptions::new(n_ctx, threads);
        opts.logit_rows = 16;
        opts.device = device;
        let mut s = Session::new(Arc::clone(model), opts).expect("session");
        let mut sink = |pos: usize, logits: &[f32]| {
            let top = tops[pos].as_array().expect("top list");
            let g0 = &top[0];
            let (gid, glogit) = (g0[0].as_u64().unwrap() as u32, g0[1].as_f64().unwrap());
            let margin = glogit
                - top
                    .get(1)
                    .map_or(f64::NEG_INFINITY, |t| t[1].as_f64().unwrap());
            let mine = argmax(logits);
            agg.positions += 1;
            if mine == gid {
                agg.top1_equal += 1;
            } else {
                eprintln!("  miss at {pos}/{}: golden {gid} ({glogit:.4}, margin {margin:.4}), kiln {mine} ({:.4} vs {:.4})", prompt.len(), logits[mine as usize], logits[gid as usize]);
                if margin > 0.5 {
                    agg.confident_misses.push((pos, prompt.len()));
                }
            }
            let err = (logits[gid as usize] as f64 - glogit).abs();
            agg.logit_err_sum += err;
            agg.max_logit_err = agg.max_logit_err.max(err);
        };
        s.eval_all(&prompt, 0, &mut sink).expect("eval");
        if check_greedy {
            // Greedy continuation through the KV cache, one decode step per token.
            s.reset();
            s.prefill(&prompt, &mut |_, _| {}).expect("prefill");
            let mut out = Vec::new();
            for _ in 0..gen.len() {
                let t = argmax(s.logits());
                out.push(t);
                if out.len() == gen.len() {
                    break;
                }
                s.decode(t).expect("decode");
            }
            agg.greedy_total += 1;
            if out == gen {
                agg.greedy_equal += 1;
            } else {
                eprintln!("greedy differs: want {gen:?}\n                  got  {out:?}");
            }
        }
    }
}
