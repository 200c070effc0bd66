//! `kiln plan`: the memory the engine will use, before loading any weights.

use anyhow::{Context, Result};
use clap::Args;

use kiln::engine::plan::{plan, HostTerms};
use kiln::engine::SessionOptions;
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model: a GGUF path or a known name (default smollm2).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Context size in tokens (default 4096, capped at the model's training context; 0: the
    /// training context).
    #[arg(short = 'c', long = "ctx-size", alias = "ctx")]
    pub ctx_size: Option<usize>,
    /// Tokens per prefill pass.
    #[arg(
        short = 'b',
        long = "prefill-chunk",
        visible_alias = "batch-size",
        default_value_t = 512
    )]
    pub prefill_chunk: usize,
    /// Threads (default and 0: the physical cores).
    #[arg(short = 't', long = "threads", value_parser = super::common::thread_count)]
    pub threads: Option<usize>,
    /// KV cache element type: f16 or q8_0.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: kiln::cache::KvType,
    /// Sequences served at once (each with its own KV cache and sampler).
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// RAM (device memory with --device cuda) for the KV cache; a larger cache is offloaded to
    /// a file (pinned host memory) (see `kiln run --kv-budget`).
    #[arg(long = "kv-budget", value_parser = super::common::parse_bytes)]
    pub kv_budget: Option<u64>,
    /// Plan sliding-window layers with a cache of the whole context (see `kiln run --swa-full`).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// Memory budget in bytes, K/M/G/KiB/MiB/GiB suffixes allowed (default: the system's
    /// available memory).
    #[arg(long, value_parser = super::common::parse_bytes)]
    pub budget: Option<u64>,
    /// Plan for this device: cpu (RAM), or cuda (device memory of an NVIDIA GPU; the budget
    /// is then the GPU's free memory).
    #[arg(long = "device", value_name = "cpu|cuda", default_value = "cpu")]
    pub device: kiln::backend::Device,
    /// Plan speculative decoding with this draft model as well (`kiln run -md`): its weights
    /// and session are added to the total (with --parallel, `kiln serve -md`'s draft runner of
    /// a slot per sequence).
    #[arg(long = "model-draft", value_name = "MODEL")]
    pub model_draft: Option<String>,
    /// Plan speculative decoding's verification passes: the logits of up to N + 1 positions
    /// together (`kiln run --draft-max`; 16 with --model-draft). With --parallel, `kiln
    /// serve`'s: N more logits rows and step rows per sequence.
    #[arg(long = "draft-max", value_name = "N")]
    pub draft_max: Option<usize>,
    /// The draft model's context (`-cd`, as `kiln run` and `kiln serve` take it).
    #[arg(long = "ctx-size-draft", value_name = "N")]
    pub ctx_size_draft: Option<usize>,
    /// Plan a mixture's experts left row-major in the file mapping (`kiln run --no-repack`,
    /// llama.cpp's -nr).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Plan the runner `kiln perplexity` scores with (one sequence, the output head's rows
    /// and the scores of a prefill chunk; the context defaults to 512, as there).
    #[arg(long, conflicts_with_all = ["parallel", "model_draft", "draft_max"])]
    pub perplexity: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PlanArgs) -> Result<()> {
    if args.device == kiln::backend::Device::Vulkan {
        // The Vulkan executor sizes its buffers at load; no plan states them yet.
        anyhow::bail!("kiln plan --device vulkan: not supported yet (plans are for cpu and cuda)");
    }
    let runtime = super::bench::current_rss();
    let path = kiln::fetch::resolve_model(args.model.as_deref(), true)?;
    let file = GgufFile::open_model(&path, false)
        .with_context(|| format!("opening {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let threads = match args.threads {
        None | Some(0) => kiln::kernels::pool::default_threads(),
        Some(n) => n,
    };
    let (config, _) = kiln::model::read_config(&file)?;
    if args.perplexity && args.device == kiln::backend::Device::Cuda {
        anyhow::bail!("kiln plan --perplexity: plans the scoring runner on the cpu only");
    }
    // (`kiln perplexity` scores chunks of 512 tokens unless told.)
    let default_ctx = if args.perplexity { 512 } else { 4096 };
    let ctx = match args.ctx_size {
        None => default_ctx.min(config.ctx_train).max(8),
        Some(0) => config.ctx_train,
        Some(n) => n,
    };
    let mut opts = SessionOptions::new(ctx, threads);
    opts.prefill_chunk = if args.perplexity {
        args.prefill_chunk.min(ctx)
    } else {
        args.prefill_chunk
    };
    opts.kv_type = args.kv_type;
    opts.kv_budget = args.kv_budget.map(|b| b as usize);
    opts.swa_full = args.swa_full;
    let draft_max = args
        .draft_max
        .or(args.model_draft.as_ref().map(|_| 16))
        .filter(|&n| n > 0);
    if let Some(n) = draft_max.filter(|&n| n > super::spec::MAX_DRAFTS) {
        anyhow::bail!(
            "--draft-max {n}: kiln run takes from 1 to {}",
            super::spec::MAX_DRAFTS
        );
    }
    // (The engine's runner keeps the drafts `BatchRunner::new` keeps, for `kiln run` as for
    // `kiln serve`.)
    let draft_max = draft_max
        .map(|n| kiln::engine::batch::drafts_kept(n, args.prefill_chunk, ctx, args.device))
        .filter(|&n| n > 0);
    let host = HostTerms {
        tokenizer_bytes: tok.heap_bytes() as u64,
        runtime_bytes: runtime,
        memory_limit: args.budget,
        no_repack: args.no_repack,
    };
    let cuda = args.device == kiln::backend::Device::Cuda;
    // (The runner on the GPU holds its verification rows in device memory; the draft model's
    // runner none.)
    let plan_of = |file: &GgufFile, opts: &SessionOptions, host: HostTerms, drafts| {
        if cuda {
            kiln::engine::plan::device_plan(file, opts, args.parallel, drafts)
        } else {
            plan(file, opts, args.parallel, host)
        }
    };
    let mut p = if args.perplexity {
        kiln::engine::plan::scoring_plan(&file, &opts, host)?
    } else {
        plan_of(&file, &opts, host, draft_max.unwrap_or(0))?
    };
    if let Some(n) = draft_max.filter(|_| !cuda) {
        let (v, c) = (config.vocab_size as u64, ctx as u64);
        // The engine's draft buffers: each slot keeps `n` more logits rows, and a step carries
        // up to `n` more rows a slot (the scratch's rows beside the chunk, and `n` more rows of
        // the output head's), and each slot's verification pass and the drafter's copy of its
        // history.
        let slots = args.parallel.max(1);
        let parallel = slots as u64;
        let rows = |draft| {
            let o = kiln::engine::batch::runner_session_options(&opts, slots, draft, 0);
            let spec = kiln::engine::session::scratch_spec_for(&file, &o);
            kiln::cache::Scratch::bytes_for(&config, spec) as u64
        };
        let scratch = rows(n) - rows(0);
        let bytes =
            parallel * n as u64 * v * 4 + scratch + parallel * (n as u64 + 1) * 4 + (c + 1) * 4;
        let formula = format!(
            "{parallel} seq × {n} rows × {v} vocab × 4 + scratch for {} more rows and {n} more head rows ({scratch} B) + {parallel} seq × ({n} + 1) + ({c} + 1) positions × 4 token ids",
            parallel * n as u64
        );
        p.components.push(kiln::engine::plan::Component {
            name: "speculation",
            bytes,
            mapped: false,
            formula,
        });
        p.total_bytes += bytes;
    }
    // The draft model: its own weights, tokenizer and session (as `kiln run -md` sizes it), or
    // with --parallel the runner of a slot per sequence that `kiln serve -md` gives it.
    let draft = match &args.model_draft {
        None => None,
        Some(name) => {
            let dpath = kiln::fetch::resolve_model(Some(name), true)?;
            let dfile = GgufFile::open_model(&dpath, false)
                .with_context(|| format!("opening {}", dpath.display()))?;
            let (dconfig, _) = kiln::model::read_config(&dfile)?;
            let mut dopts = opts;
            dopts.n_ctx =
                kiln::engine::speculative::draft_context(ctx, args.ctx_size_draft, &dconfig);
            dopts.kv_budget = None;
            let dhost = HostTerms {
                tokenizer_bytes: Tokenizer::from_gguf(&dfile)?.heap_bytes() as u64,
                runtime_bytes: 0,
                memory_limit: args.budget,
                no_repack: args.no_repack,
            };
            let mut d = plan_of(&dfile, &dopts, dhost, 0)?;
            // The draft decodes greedily (no sampler of its own), on the model's threads and
            // code (no runtime of its own: `SlotDrafter::share_threads`).
            d.components
                .retain(|c| !matches!(c.name, "sampler and history" | "runtime"));
            d.total_bytes = d.components.iter().map(|c| c.bytes).sum();
            Some((dpath, d))
        }
    };
    let total = p.total_bytes + draft.as_ref().map_or(0, |(_, d)| d.total_bytes);
    let budget = match cuda {
        true => args.budget.or_else(gpu_free_memory),
        false => args.budget.or_else(kiln::model::moe::available_memory),
    };
    // Experts paged from disk (a mixture larger than the budget) are evicted as memory runs
    // short: the rest must fit.
    let paged = p
        .get(kiln::engine::plan::EXPERTS_PAGED)
        .map_or(0, |c| c.bytes);
    let fits = budget.map(|b| total - paged <= b);
    if args.json {
        let draft = draft.as_ref().map(|(dp, d)| {
            serde_json::json!({ "model": dp, "components": d.components, "total_bytes": d.total_bytes })
        });
        let j = serde_json::json!({
            "model": path, "device": if cuda { "cuda" } else { "cpu" }, "ctx": ctx, "prefill_chunk": opts.prefill_chunk, "threads": threads, "parallel": args.parallel, "perplexity": args.perplexity, "kv_type": args.kv_type, "kv_budget": args.kv_budget, "swa_full": args.swa_full, "draft_max": draft_max,
            "components": p.components, "draft": draft, "total_bytes": total, "budget_bytes": budget, "fits": fits,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return verdict(fits, budget);
    }
    println!(
        "memory plan for {} (ctx {}, prefill chunk {}, {} threads, {})",
        path.display(),
        ctx,
        opts.prefill_chunk,
        threads,
        if args.perplexity {
            "perplexity: one sequence scored".to_string()
        } else {
            format!("{} sequences", args.parallel)
        }
    );
    print_components(&p.components);
    if let Some((dp, d)) = &draft {
        println!("  {:<24} {:>10.2} MiB", "model total", mib(p.total_bytes));
        println!("draft model {}", dp.display());
        print_components(&d.components);
        println!("  {:<24} {:>10.2} MiB", "draft total", mib(d.total_bytes));
    }
    println!("  {:<24} {:>10.2} MiB", "total", mib(total));
    match (budget, fits) {
        (Some(b), Some(true)) if paged > 0 => println!(
            "fits in {:.2} MiB with the experts ({:.2} MiB) paged from disk",
            mib(b),
            mib(paged)
        ),
        (Some(b), Some(true)) => println!("fits in {:.2} MiB", mib(b)),
        (Some(b), Some(false)) => println!("does NOT fit in {:.2} MiB", mib(b)),
        _ => {}
    }
    verdict(fits, budget)
}

fn print_components(components: &[kiln::engine::plan::Component]) {
    for c in components {
        let kind = if c.mapped { "mapped" } else { "owned" };
        println!(
            "  {:<24} {:>10.2} MiB  {:<6}  {}",
            c.name,
            mib(c.bytes),
            kind,
            c.formula
        );
    }
}

/// Free memory of the GPU, when there is one.
fn gpu_free_memory() -> Option<u64> {
    let gpu = kiln::backend::cuda::open().ok()?;
    gpu.mem_info().ok().map(|(free, _)| free as u64)
}

/// A plan that does not fit the budget is an error (exit status 1), so scripts can test it.
fn verdict(fits: Option<bool>, budget: Option<u64>) -> Result<()> {
    match (fits, budget) {
        (Some(false), Some(b)) => anyhow::bail!(
            "the plan does not fit the memory budget of {:.2} MiB",
            mib(b)
        ),
        _ => Ok(()),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
