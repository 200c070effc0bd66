//! Flags and helpers shared by the subcommands.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use kiln::engine::batch::{BatchOptions, BatchRunner, CacheOptions};
use kiln::engine::{EngineError, SessionOptions};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

/// Which model, and how to size the session.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a GGUF path, a known name (smollm2, gemma3) or a pulled model's name; default
    /// smollm2, downloaded if missing.
    #[arg(short = 'm', long = "model", help_heading = "Model")]
    pub model: Option<String>,
    /// A model by its Hugging Face repository (llama.cpp's -hf): USER/REPO[:QUANT], the
    /// quantization's GGUF file (default Q4_K_M), downloaded into the models directory if
    /// missing. HF_TOKEN is sent; HF_ENDPOINT points elsewhere.
    #[arg(
        long = "hf-repo",
        value_name = "USER/REPO[:QUANT]",
        conflicts_with = "model",
        help_heading = "Model"
    )]
    pub hf_repo: Option<String>,
    /// The file of --hf-repo to use instead of its quantization's (llama.cpp's -hff).
    #[arg(
        long = "hf-file",
        value_name = "FILE",
        requires = "hf_repo",
        help_heading = "Model"
    )]
    pub hf_file: Option<String>,
    /// The Hugging Face token for --hf-repo [default: $HF_TOKEN] (llama.cpp's -hft).
    #[arg(
        long = "hf-token",
        value_name = "TOKEN",
        requires = "hf_repo",
        help_heading = "Model"
    )]
    pub hf_token: Option<String>,
    /// Read the whole model file at load instead of paging it in on first use (kiln always maps
    /// the file; this populates the map up front, as llama.cpp's --no-mmap reads it).
    #[arg(long = "no-mmap", help_heading = "Model")]
    pub no_mmap: bool,
    /// Leave a mixture's experts row-major in the file mapping instead of rearranging them for
    /// this CPU's kernels at load (llama.cpp's -nr/--no-repack; same results).
    #[arg(long = "no-repack", help_heading = "Model")]
    pub no_repack: bool,
    /// Use this Jinja chat template instead of the model's (llama.cpp's option): for example
    /// one that renders tools, for a model whose file has none.
    #[arg(long, value_name = "FILE", help_heading = "Model")]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Where the model runs: cpu, or cuda (an NVIDIA GPU; refused where there is no driver).
    #[arg(
        long = "device",
        value_name = "cpu|cuda",
        default_value = "cpu",
        help_heading = "Model"
    )]
    pub device: kiln::backend::Device,
    /// Layers on the GPU (llama.cpp's -ngl): any N > 0 means the whole model on the GPU, as
    /// --device cuda.
    #[arg(long = "n-gpu-layers", alias = "gpu-layers", value_name = "N", default_value_t = 0,
          value_parser = gpu_layers, help_heading = "Model")]
    pub n_gpu_layers: u32,
    /// Flash attention (llama.cpp's -fa [on|off|auto]). kiln's attention is always the fused,
    /// online-softmax kernel, so `on` and `auto` are what it does and `off` is refused.
    #[arg(long = "flash-attn", value_name = "on|off|auto", num_args = 0..=1,
          default_missing_value = "on", value_parser = flash_attn, help_heading = "Model")]
    pub flash_attn: Option<String>,
    /// Threads (default and 0: the physical cores).
    #[arg(short = 't', long = "threads", value_parser = thread_count, help_heading = "Performance")]
    pub threads: Option<usize>,
    /// More logging on stderr.
    #[arg(short = 'v', long = "verbose", help_heading = "Performance")]
    pub verbose: bool,
    /// Context size in tokens (default 4096, capped at the model's training context; 0: the
    /// training context).
    #[arg(short = 'c', long = "ctx-size", help_heading = "Context")]
    pub ctx_size: Option<usize>,
    /// Tokens per prefill pass (bounds activation memory).
    #[arg(
        short = 'b',
        long = "batch-size",
        default_value_t = 512,
        help_heading = "Context"
    )]
    pub batch_size: usize,
    /// KV cache element type: f16, or q8_0 (about half the memory).
    #[arg(
        long = "kv-type",
        alias = "cache-type-k",
        default_value = "f16",
        help_heading = "Memory"
    )]
    pub kv_type: kiln::cache::KvType,
    /// RAM for the KV cache (bytes; K/M/G/KiB/MiB/GiB suffixes). A larger cache lives in a
    /// temporary file, streamed through a ring of layer buffers that fits this budget. With
    /// --device cuda: device memory for it; a larger cache lives in pinned host memory.
    #[arg(long = "kv-budget", value_parser = parse_bytes, help_heading = "Memory")]
    pub kv_budget: Option<u64>,
    /// Give sliding-window layers (Gemma-3's local layers) a KV cache of the whole context
    /// instead of a ring of their window (more memory, same results).
    #[arg(long = "swa-full", help_heading = "Memory")]
    pub swa_full: bool,
}

/// `-t`: 0 (the physical cores) up to 4 threads per logical CPU.
pub fn thread_count(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a thread count"))?;
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max = (4 * logical).min(1024);
    if n > max {
        return Err(format!(
            "{n} threads on {logical} logical CPUs makes no sense (at most {max}; 0 = the physical cores)"
        ));
    }
    Ok(n)
}

/// `-ngl`: a layer count (llama.cpp's `-ngl 99` is the usual "everything").
fn gpu_layers(s: &str) -> Result<u32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a layer count"))
}

/// `-fa`: on / auto are what kiln does; off does not exist.
fn flash_attn(s: &str) -> Result<String, String> {
    match s {
        "on" | "auto" | "1" | "true" => Ok(s.to_string()),
        "off" | "0" | "false" => Err(
            "kiln's attention is always the fused (flash) kernel; it cannot be turned off".into(),
        ),
        _ => Err(format!("{s:?}: expected on, off or auto")),
    }
}

/// A byte count: digits with an optional K, M, G (powers of 1000) or KiB, MiB, GiB suffix.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 512MiB)"))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        u => {
            return Err(format!(
                "unknown unit {u:?} in {s:?} (K, M, G, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))
}

impl ModelArgs {
    /// The model file: `--hf-repo`'s (pulled if missing), else `-m`'s.
    pub fn model_path(&self) -> Result<PathBuf> {
        let Some(repo) = &self.hf_repo else {
            return Ok(kiln::fetch::resolve_model(self.model.as_deref(), true)?);
        };
        let r = kiln::fetch::HfRef::parse(repo)?.with_file(self.hf_file.as_deref())?;
        let pull = kiln::fetch::PullOptions::new(kiln::fetch::models_dir(), true);
        let mut opts = kiln::fetch::HfOptions::from_env(pull);
        if let Some(t) = &self.hf_token {
            opts.token = Some(t.clone());
        }
        Ok(kiln::fetch::resolve_hf(&r, &opts)?)
    }

    /// `--device`, or cuda for `-ngl N` with N > 0; refused (one line) where it cannot run.
    pub fn device(&self) -> Result<kiln::backend::Device> {
        let d = if self.n_gpu_layers > 0 {
            kiln::backend::Device::Cuda
        } else {
            self.device
        };
        d.open()?;
        Ok(d)
    }

    /// `device()` for a command not yet run on the Vulkan executor: `--device vulkan` is
    /// refused there by name (before any device is opened).
    pub fn device_not_vulkan(&self, command: &str) -> Result<kiln::backend::Device> {
        if self.device == kiln::backend::Device::Vulkan {
            anyhow::bail!(
                "kiln {command} --device vulkan: not supported yet (run, chat, bench and serve run on Vulkan)"
            );
        }
        self.device()
    }

    /// `-t`, with 0 or absent meaning the physical cores.
    pub fn threads(&self) -> usize {
        match self.threads {
            None | Some(0) => kiln::kernels::pool::default_threads().max(1),
            Some(n) => n,
        }
    }

    /// `-c`: `default` when absent (capped at the training context `train`), `train` for 0.
    pub fn ctx(&self, train: usize, default: usize) -> usize {
        match self.ctx_size {
            None => default.min(train).max(8),
            Some(0) => train,
            Some(n) => n,
        }
    }
}

/// Sampling flags, spelled as the reference engine spells them.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8, help_heading = "Sampling")]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40, help_heading = "Sampling")]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95, help_heading = "Sampling")]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05, help_heading = "Sampling")]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        help_heading = "Sampling"
    )]
    pub repeat_penalty: f32,
    /// Tokens of history the penalties consider.
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        help_heading = "Sampling"
    )]
    pub repeat_last_n: usize,
    /// Frequency penalty (0 = off).
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        help_heading = "Sampling"
    )]
    pub frequency_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        help_heading = "Sampling"
    )]
    pub presence_penalty: f32,
    /// RNG seed (default: random).
    #[arg(short = 's', long = "seed", help_heading = "Sampling")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> Result<SamplerConfig> {
        let mut c = SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            ..SamplerConfig::default()
        };
        if let Some(s) = self.seed {
            c.seed = s;
        }
        c.validate().context("invalid sampling parameters")?;
        Ok(c)
    }
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub load_ms: f64,
}

/// Resolve (downloading the default model if needed), map and load.
pub fn load(args: &ModelArgs) -> Result<Loaded> {
    args.device()?;
    let path = args.model_path()?;
    let t0 = Instant::now();
    let spinner = spinner(&format!("loading {}", path.display()));
    let file = kiln::gguf::GgufFile::open_model(&path, args.no_mmap);
    let model = file
        .map_err(kiln::model::ModelError::from)
        .and_then(|f| {
            let opts = kiln::model::LoadOptions {
                no_repack: args.no_repack,
                ..Default::default()
            };
            Model::from_gguf_with(f, opts)
        })
        .with_context(|| format!("loading {}", path.display()))?;
    let mut tokenizer = Tokenizer::from_gguf(&model.file)
        .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    if let Some(tpl) = &args.chat_template_file {
        let text = std::fs::read_to_string(tpl)
            .with_context(|| format!("reading the chat template {}", tpl.display()))?;
        tokenizer
            .set_chat_template(text)
            .with_context(|| format!("the chat template {}", tpl.display()))?;
    }
    spinner.finish_and_clear();
    Ok(Loaded {
        path,
        model: Arc::new(model),
        tokenizer,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// The session options the flags ask for: the context (-c, else the training context up to
/// 4096), threads, prefill chunk (-b), KV type and placement, device.
pub fn session_options(loaded: &Loaded, args: &ModelArgs) -> Result<SessionOptions> {
    let train = loaded.model.config.ctx_train;
    let n_ctx = args.ctx(train, 4096);
    let mut opts = SessionOptions::new(n_ctx, args.threads());
    opts.prefill_chunk = args.batch_size.max(1);
    opts.kv_type = args.kv_type;
    opts.kv_budget = args.kv_budget.map(|b| b as usize);
    opts.swa_full = args.swa_full;
    opts.device = args.device()?;
    Ok(opts)
}

/// The engine's runner of one sequence slot sized as a session with `opts`, verifying up to
/// `draft_max` drafts a pass (0: no speculation), with a progress bar while the weights go to
/// the GPU.
pub fn new_runner(
    model: &Arc<Model>,
    opts: &SessionOptions,
    draft_max: usize,
) -> Result<BatchRunner> {
    let (batch, cache) = BatchOptions::from_session(opts, 1, draft_max);
    new_runner_with(model, batch, cache)
}

/// A runner sized by `batch` and `cache`, with a progress bar while the weights go to the GPU.
pub fn new_runner_with(
    model: &Arc<Model>,
    batch: BatchOptions,
    cache: CacheOptions,
) -> Result<BatchRunner> {
    let r = with_upload_bar(|p| BatchRunner::with_cache(Arc::clone(model), batch, cache, p))?;
    Ok(r)
}

/// Run `f` with a progress callback that shows a bar while the weights go to the GPU.
fn with_upload_bar<T>(
    f: impl FnOnce(&mut dyn FnMut(usize, usize)) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    let mut bar: Option<ProgressBar> = None;
    let mut progress = |done: usize, total: usize| {
        let b = bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template("uploading weights {bar:30} {bytes}/{total_bytes}")
                    .expect("valid template"),
            );
            b
        });
        b.set_position(done as u64);
    };
    let r = f(&mut progress);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    r
}

/// A spinner on stderr (hidden when stderr is not a terminal).
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(100));
    pb
}

/// A progress bar over `total` prompt tokens, shown only for long prompts.
pub fn prefill_bar(total: usize, threshold: usize) -> Option<ProgressBar> {
    (total > threshold).then(|| {
        let pb = ProgressBar::new(total as u64);
        pb.set_style(
            ProgressStyle::with_template("prefill {bar:30} {pos}/{len} tokens ({per_sec})")
                .expect("valid template"),
        );
        pb
    })
}

/// Read the prompt from `-p`, `-f`, or standard input.
pub fn read_prompt(prompt: &Option<String>, file: &Option<PathBuf>) -> Result<String> {
    if let Some(p) = prompt {
        return Ok(p.clone());
    }
    if let Some(f) = file {
        return std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()));
    }
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
        .context("reading the prompt from stdin")?;
    Ok(s)
}

/// Install a Ctrl-C handler: the first press sets the flag (stop generating cleanly), the
/// second exits.
pub fn cancel_flag() -> &'static AtomicBool {
    static FLAG: AtomicBool = AtomicBool::new(false);
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if FLAG.swap(true, Ordering::SeqCst) {
                eprintln!();
                std::process::exit(130);
            }
        });
    });
    &FLAG
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn thread_counts() {
        use super::thread_count;
        assert_eq!(thread_count("0"), Ok(0));
        assert_eq!(thread_count("2"), Ok(2));
        assert!(thread_count("100000")
            .unwrap_err()
            .contains("makes no sense"));
        assert!(thread_count("-1").is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("24MiB"), Ok(24 << 20));
        assert_eq!(parse_bytes("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("5k"), Ok(5000));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
    }
}
