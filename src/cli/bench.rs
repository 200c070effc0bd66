//! `kiln bench`: prompt-processing (pp) and text-generation (tg) throughput, as `llama-bench`
//! measures them, plus load time, peak RSS and decode's share of the memory-bandwidth roofline.

use anyhow::Result;
use clap::Args;

use super::common::{self, ModelArgs};
use kiln::backend::cuda::exec::OnCuda;
use kiln::backend::exec::HasExecutor;
use kiln::engine::{Engine, GenStats, GenerateRequest, SessionOptions};
use kiln::sampler::{Sampler, SamplerConfig};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the pp test (0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens for the tg test (0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Tokens already in the KV cache before each test (llama-bench's -d).
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Print rows as JSON (llama-bench's `-o json` fields plus kiln's own).
    #[arg(long)]
    pub json: bool,
    /// Memory read bandwidth in GB/s for the roofline (default: measured now).
    #[arg(long)]
    pub bandwidth: Option<f64>,
}

#[derive(serde::Serialize)]
struct Row {
    model_filename: String,
    model_type: String,
    /// The kernel tier chosen at load (`avx512vnni`, `avx2`, `neon`, ...; `KILN_ISA` caps it).
    kernels: String,
    model_size: u64,
    model_n_params: u64,
    n_threads: usize,
    n_batch: usize,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    test: String,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
    // kiln's own fields
    load_ms: f64,
    peak_rss_bytes: u64,
    weight_bytes_per_token: u64,
    /// Mean KV-cache bytes read per generated token (in the roofline with the weights).
    kv_bytes_per_token: u64,
    bandwidth_gbs: f64,
    roofline_share: Option<f64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let loaded = common::load(&args.model)?;
    let model = &loaded.model;
    let threads = args.model.threads();
    let n_ctx = args.depth + args.n_prompt.max(args.n_gen) + 1;
    let mut opts = SessionOptions::new(n_ctx, threads);
    opts.prefill_chunk = args.model.batch_size;
    opts.kv_type = args.model.kv_type;
    opts.kv_budget = args.model.kv_budget.map(|b| b as usize);
    opts.swa_full = args.model.swa_full;
    opts.device = args.model.device()?;
    let runner = common::new_runner(model, &opts, 0)?;
    let mut engine = Engine::new(runner, &loaded.tokenizer)?;
    let mut sampler = Sampler::new(SamplerConfig::greedy(), model.config.vocab_size);
    let vocab = model.config.vocab_size as u32;
    // Deterministic pseudo-random tokens, as llama-bench uses random ids.
    let tokens = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt)) % vocab)
            .collect()
    };
    let depth_tokens = tokens(args.depth, 7);
    // Each test's prompt follows the depth's tokens: the engine keeps them cached and every
    // repetition rolls back to them (its prefix reuse), as llama-bench restores a saved state
    // instead of re-running the depth prompt. The rates count the tokens evaluated.
    let mut measure = |engine: &mut Engine<'_>, test: &[u32], n_gen: usize| -> Result<GenStats> {
        let prompt = [&depth_tokens[..], test].concat();
        let mut req = GenerateRequest::new(&prompt, Some(n_gen));
        req.reuse_prefix = true;
        req.ignore_eos = true;
        Ok(engine.generate(&req, &mut sampler, None, &mut |_, _| {}, &mut |_, _| true)?)
    };

    let weight_bytes = model.weights_bytes_per_token() as u64;
    let on_gpu = engine.runner().cuda().map(|c| c.gpu().name.clone());
    let bandwidth = match args.bandwidth {
        Some(b) => b,
        // The host's bandwidth says nothing of the device's: no roofline unless given.
        None if on_gpu.is_some() => 0.0,
        None => {
            let b =
                kiln::kernels::membw::measure_read_gbs(&engine.runner().executor().runtime().pool);
            // The probe's buffer is gone; do not let it count as the engine's peak RSS.
            reset_peak_rss();
            b
        }
    };
    let mut rows = Vec::new();
    let file_size = std::fs::metadata(&loaded.path)
        .map(|m| m.len())
        .unwrap_or(0);
    let n_params: u64 = model
        .file
        .tensors()
        .iter()
        .map(|t| t.n_elements as u64)
        .sum();
    // llama-bench's model column: architecture, size label, block format ("llama 135M Q4_1").
    let summary = kiln::gguf::ModelSummary::from_file(&model.file);
    let format = kiln::fetch::store::format_name(&model.file, &summary).unwrap_or_default();
    let model_type = format!(
        "{} {} {}",
        model.config.arch_name,
        size_label(n_params),
        format
    );
    let kernels = match &on_gpu {
        Some(name) => format!("cuda ({name})"),
        None => kiln::quant::Isa::detect().name().to_string(),
    };
    let mut push = |test: &str, n_prompt: usize, n_gen: usize, samples: Vec<f64>| {
        let (avg, sd) = mean_sd(&samples);
        // Bytes one decode step reads: every weight once, plus the cached keys and values it
        // attends to (f16) at the test's mean position.
        let kv_bytes = if n_gen > 0 {
            let pos = args.depth + n_gen / 2;
            let c = &model.config;
            model
                .weights
                .layers
                .iter()
                .map(|l| l.window.map_or(pos, |w| pos.min(w)) * (c.kv_dim_k() + c.kv_dim_v()) * 2)
                .sum::<usize>() as u64
        } else {
            0
        };
        let step_bytes = weight_bytes + kv_bytes;
        let roofline =
            (n_gen > 0 && bandwidth > 0.0).then(|| step_bytes as f64 * avg / (bandwidth * 1e9));
        rows.push(Row {
            model_filename: loaded.path.display().to_string(),
            model_type: model_type.clone(),
            kernels: kernels.clone(),
            model_size: file_size,
            model_n_params: n_params,
            n_threads: threads,
            n_batch: args.model.batch_size,
            n_prompt,
            n_gen,
            n_depth: args.depth,
            test: test.to_string(),
            avg_ts: avg,
            stddev_ts: sd,
            samples_ts: samples,
            load_ms: loaded.load_ms,
            peak_rss_bytes: peak_rss(),
            weight_bytes_per_token: weight_bytes,
            kv_bytes_per_token: kv_bytes,
            bandwidth_gbs: bandwidth,
            roofline_share: roofline,
        });
    };

    if args.n_prompt > 0 {
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            // (Another prompt each time, so that nothing of it is cached.)
            let prompt = tokens(args.n_prompt, 1 + rep as u32);
            let stats = measure(&mut engine, &prompt, 0)?;
            if rep > 0 {
                samples.push(stats.prompt_tps()); // rep 0 is the warm-up
            }
        }
        let name = with_depth(&format!("pp{}", args.n_prompt), args.depth);
        push(&name, args.n_prompt, 0, samples);
    }
    if args.n_gen > 0 {
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            // Greedy from one token: `n_gen` decode steps (as llama-bench's), timed from the
            // first token sampled (the prompt's) to the last, which ends the request
            // unevaluated: `n_gen + 1` tokens.
            let first = tokens(1, rep as u32);
            let stats = measure(&mut engine, &first, args.n_gen + 1)?;
            if rep > 0 && stats.gen_ms > 0.0 {
                let steps = stats.gen_tokens.saturating_sub(1);
                samples.push(steps as f64 * 1e3 / stats.gen_ms);
            }
        }
        let name = with_depth(&format!("tg{}", args.n_gen), args.depth);
        push(&name, 0, args.n_gen, samples);
    }

    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("| model | size | params | threads | test | t/s | load | peak RSS | roofline |");
    println!("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {:.2} ± {:.2} | {:.0} ms | {:.1} MiB | {} |",
            r.model_type,
            r.model_size as f64 / (1 << 20) as f64,
            r.model_n_params as f64 / 1e6,
            r.n_threads,
            r.test,
            r.avg_ts,
            r.stddev_ts,
            r.load_ms,
            r.peak_rss_bytes as f64 / (1 << 20) as f64,
            r.roofline_share.map_or("-".to_string(), |x| format!(
                "{:.0}% of {:.1} GB/s",
                x * 100.0,
                r.bandwidth_gbs
            )),
        );
    }
    Ok(())
}

/// A parameter count as llama.cpp labels model sizes: 135M, 1.2B.
fn size_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round() as u64)
    }
}

fn with_depth(name: &str, depth: usize) -> String {
    if depth > 0 {
        format!("{name} @ d{depth}")
    } else {
        name.to_string()
    }
}

fn mean_sd(x: &[f64]) -> (f64, f64) {
    if x.is_empty() {
        return (0.0, 0.0);
    }
    let m = x.iter().sum::<f64>() / x.len() as f64;
    let v = if x.len() > 1 {
        x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64
    } else {
        0.0
    };
    (m, v.sqrt())
}

/// Peak resident set size of this process (VmHWM), in bytes; 0 where unknown.
pub fn peak_rss() -> u64 {
    proc_status_kb("VmHWM:")
}

/// Restart the peak-RSS watermark at the current RSS (Linux; a no-op elsewhere).
fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM (Documentation/filesystems/proc.rst).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Current resident set size of this process (VmRSS), in bytes; 0 where unknown.
pub fn current_rss() -> u64 {
    proc_status_kb("VmRSS:")
}

fn proc_status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
