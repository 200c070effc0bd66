//! Speculative decoding on the GPU, on the machine's GPU or on the software GPU (see
//! `tests/cuda_backend.rs`). A verification pass must give each of its rows the logits a
//! decode step of its token gives, bit for bit, so that speculation samples what plain
//! decoding samples:
//! - a session's pass (`kiln run`) runs as decode rows, with the CPU's short-context attention
//!   arithmetic and with f32 split over the keys, and replays the graph of its row count;
//! - a runner's step (`kiln serve`) with a prompt chunk beside more verification rows than a
//!   pass of decode rows holds runs as a pass of the chunk and passes of at most
//!   `MAX_GRAPH_ROWS` decode rows; a pass that fails rolls back the ones before it;
//! - `kiln run --device cuda` prints the same text with speculation as without.
//!
//! (The scheduler's speculation on the GPU: `tests/serve_speculative.rs`.)

mod common;

use std::sync::Arc;

use common::gpu;
use kiln::backend::cuda::exec::OnCuda;
use kiln::backend::cuda::MAX_GRAPH_ROWS;
use kiln::backend::Device;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;

/// A context long enough that decode attention splits over the keys (more than 256).
const CTX: usize = 320;

/// A context whose decode attention takes one block per row and head (the rows' modes).
const SHORT_CTX: usize = 200;

fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|j| 1 + (seed * 41 + j * 29) % 250)
        .collect()
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|x| x.to_bits()).collect()
}

fn session(m: &Arc<Model>, ctx: usize, mirror: bool) -> Session {
    let mut o = SessionOptions::new(ctx, 2);
    o.device = Device::Cuda;
    o.prefill_chunk = 32;
    o.logit_rows = 8;
    let mut s = Session::new(Arc::clone(m), o).expect("GPU session");
    s.set_cuda_mirror(mirror);
    s
}

/// `pass` through `a`'s verification and `b`'s decode steps, from the same cache: the same
/// logits after every token, bit for bit.
fn verify_matches_decodes(what: &str, a: &mut Session, b: &mut Session, pass: &[u32]) {
    let v = a.model.config.vocab_size;
    let mut rows = vec![0.0f32; pass.len() * v];
    a.eval_as_decodes(pass, &mut |p, l| {
        rows[p * v..(p + 1) * v].copy_from_slice(&l[..v])
    })
    .expect("verification pass");
    for (i, &t) in pass.iter().enumerate() {
        let want = bits(b.decode(t).expect("decode"));
        let got = bits(&rows[i * v..(i + 1) * v]);
        assert!(got == want, "{what}: row {i} of the pass");
    }
    assert_eq!(a.tokens(), b.tokens(), "{what}");
}

/// A session's verification passes on the GPU: each row's logits are a decode step's, bit
/// for bit, with the CPU's f16 arithmetic on short contexts (mirror) and with f32, split over
/// the keys or not (a short context); the pass is recorded as the graph of its row count, and a second pass after a
/// rollback (other tokens, other positions) replays it.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn gpu_verification_rows_are_decode_steps() {
    let _gpu = gpu("gpu_verification_rows_are_decode_steps");
    for stem in ["random-llama-q4_0", "random-qwen3-q4_k_m"] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        for (ctx, mirror) in [(CTX, true), (CTX, false), (SHORT_CTX, false)] {
            let what = format!("{stem}, context {ctx}, mirror {mirror}");
            let (mut a, mut b) = (session(&m, ctx, mirror), session(&m, ctx, mirror));
            let prompt = tokens(1, 40);
            a.prefill(&prompt, &mut |_, _| {}).unwrap();
            b.prefill(&prompt, &mut |_, _| {}).unwrap();
            verify_matches_decodes(&what, &mut a, &mut b, &tokens(2, 6));
            let graph = a.cuda().and_then(|s| s.graph_launches(6));
            assert!(graph.is_some(), "{what}: the pass is recorded as a graph");
            // Keep three of the six, as after a partly kept pass.
            let keep = prompt.len() + 3;
            assert_eq!(a.rollback(keep), keep);
            assert_eq!(b.rollback(keep), keep);
            verify_matches_decodes(&format!("{what}, replayed"), &mut a, &mut b, &tokens(3, 6));
            assert_eq!(a.cuda().unwrap().graph_launches(6), graph, "{what}");
        }
    }
}

fn runner(m: &Arc<Model>, n_slots: usize, draft_max: usize) -> BatchRunner {
    let o = BatchOptions {
        n_slots,
        n_ctx: CTX,
        n_threads: 2,
        prefill_chunk: 32,
        kv_type: KvType::F16,
        device: Device::Cuda,
        draft_max,
    };
    BatchRunner::new(Arc::clone(m), o).expect("GPU runner")
}

/// A runner's step on the GPU with slot 0's prompt chunk beside eight verification passes of
/// nine rows (72 rows: more than a pass of decode rows holds): every verified row's logits
/// are those of plain decode steps of the same tokens, bit for bit, and the chunk's those of
/// a plain prefill; with the CPU's short-context arithmetic and with f32 (where a batch's
/// rows and a decode step's differ). Then a step whose last pass fails (a token outside the
/// vocabulary): the passes before it are rolled back, and the slots decode on as plain ones
/// do.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn gpu_runner_runs_verification_passes_as_decode_rows() {
    let _gpu = gpu("gpu_runner_runs_verification_passes_as_decode_rows");
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).expect("load"));
    for mirror in [true, false] {
        runner_passes(&m, mirror);
    }
}

fn runner_passes(m: &Arc<Model>, mirror: bool) {
    let (slots, drafts) = (9, 8);
    assert!(
        (slots - 1) * (1 + drafts) > MAX_GRAPH_ROWS,
        "the verification rows take two passes"
    );
    let (mut a, mut b) = (runner(m, slots, drafts), runner(m, slots, 0));
    a.set_cuda_mirror(mirror);
    b.set_cuda_mirror(mirror);
    for s in 1..slots {
        let p = tokens(s as u32, 5 + 3 * s);
        a.prefill_chunk(s, &p, true).unwrap();
        b.prefill_chunk(s, &p, true).unwrap();
    }
    let chunk = tokens(20, 24);
    let passes: Vec<Vec<u32>> = (1..slots)
        .map(|s| tokens(30 + s as u32, 1 + drafts))
        .collect();
    a.begin_step();
    a.push_part(0, &chunk, true);
    for (s, pass) in (1..slots).zip(&passes) {
        a.push_verify(s, pass);
    }
    a.run_step().expect("the step");

    b.prefill_chunk(0, &chunk, true).unwrap();
    assert!(
        bits(a.logits(0)) == bits(b.logits(0)),
        "mirror {mirror}: the chunk's logits are a plain prefill's"
    );
    for i in 0..=drafts {
        let step: Vec<(usize, u32)> = (1..slots).zip(&passes).map(|(s, p)| (s, p[i])).collect();
        b.decode(&step).unwrap();
        for s in 1..slots {
            assert!(
                bits(a.logits_at(s, i)) == bits(b.logits(s)),
                "mirror {mirror}: slot {s}, row {i} of its pass"
            );
        }
    }
    for s in 0..slots {
        assert_eq!(a.tokens(s), b.tokens(s), "slot {s}");
    }

    // A step that fails in its last pass leaves every slot where it was: the same tokens
    // (none added), and caches rolled back (the decode step after it).
    let held: Vec<Vec<u32>> = (0..slots).map(|s| a.tokens(s).to_vec()).collect();
    let bad = m.config.vocab_size as u32 + 5;
    a.begin_step();
    a.push_part(0, &[7], true);
    for s in 1..slots {
        let mut pass = tokens(50 + s as u32, 1 + drafts);
        if s == slots - 1 {
            pass[drafts] = bad;
        }
        a.push_verify(s, &pass);
    }
    let e = a.run_step().expect_err("a token outside the vocabulary");
    assert!(e.to_string().contains(&bad.to_string()), "{e}");
    for (s, held) in held.iter().enumerate() {
        assert_eq!(a.tokens(s), held, "slot {s} after the failed step");
    }
    let step: Vec<(usize, u32)> = (0..slots).map(|s| (s, 11 + s as u32)).collect();
    a.decode(&step).unwrap();
    b.decode(&step).unwrap();
    for s in 0..slots {
        assert!(
            bits(a.logits(s)) == bits(b.logits(s)),
            "mirror {mirror}: slot {s} decodes on after the failed step"
        );
    }
}

/// `kiln run --device cuda` with prompt lookup and with a draft model, on the software GPU
/// (`$KILN_CUDA_EMULATOR`): the text of plain greedy decoding on the GPU, drafts verified.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn run_speculates_on_the_software_gpu() {
    let lib = common::emulator_lib().unwrap_or_else(|why| panic!("no software GPU here: {why}"));
    let model = common::random_model("random-llama-q4_0");
    let kiln = |extra: &[&str]| {
        let run = [
            "run", "--device", "cuda", "-n", "40", "--temp", "0", "--raw",
        ];
        let prompt = ["-p", "a b c a b c a b c a b c a b c"];
        common::kiln_on_emulator(&lib, &model, &[&run[..], &prompt, extra].concat())
    };
    let draft = model.to_string_lossy().into_owned();
    // Greedy on the device between passes, and (`--ignore-eos`) on the host.
    for eos in [&[][..], &["--ignore-eos"][..]] {
        let (plain, _) = kiln(eos);
        for spec in [
            &["--spec-type", "ngram-simple", "--draft-max", "4"][..],
            &["-md", &draft, "--draft-max", "6", "--draft-p-min", "0"][..],
        ] {
            let extra = [eos, spec].concat();
            let (text, err) = kiln(&extra);
            assert_eq!(text, plain, "{extra:?}");
            let passes = err
                .lines()
                .find_map(|l| l.strip_prefix("speculative    = "))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse::<usize>().ok());
            assert!(passes.is_some_and(|n| n > 0), "{extra:?}: {err}");
        }
    }
}
