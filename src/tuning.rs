//! Every `KILN_*` environment variable kiln reads, in one place (docs/tuning.md is their
//! table): read once, on first use, into a [`Tuning`] of typed fields. A value that does not
//! parse, or is out of its range, is the same as an unset one (the default), as documented
//! per field.
//!
//! Two kinds: paths and commands a deployment sets (`KILN_MODELS`, `KILN_PIP`, `KILN_NVRTC`,
//! ...), and switches for measuring what an optimization is worth or for comparing kernel
//! paths (`KILN_ISA`, `KILN_CUDA_*`), whose defaults are what kiln runs.
//! `KILN_API_KEY` is `kiln serve --api-key`'s variable, read with the command line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment's settings (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    // ---- files and commands
    /// `KILN_MODELS`: the models directory (unset or empty: `$XDG_CACHE_HOME/kiln/models`,
    /// else `~/.cache/kiln/models`).
    pub models: Option<PathBuf>,
    /// `KILN_PIP`: the pip command, split at whitespace (unset or empty: `python3 -m pip`,
    /// else `pip`, else `pip3`, whichever runs).
    pub pip: Option<Vec<String>>,
    /// `KILN_HISTORY`: `kiln chat`'s history file; `Some("")` (set but empty) keeps none
    /// (unset: `chat_history` in kiln's cache directory).
    pub history: Option<PathBuf>,
    /// `KILN_LOAD_GATE`: `kiln serve` holds the model's load until this path exists (an
    /// orchestrator may start the server before the file is in place; the tests watch the
    /// loading state with it).
    pub load_gate: Option<PathBuf>,
    /// `KILN_NVRTC`: the NVRTC library (`libnvrtc.so.13`) to load (unset: the one the dynamic
    /// loader finds by name).
    pub nvrtc: Option<PathBuf>,
    /// `KILN_CUDA_EMULATOR`: without a CUDA driver, the software GPU's library to run
    /// `--device cuda` on.
    pub cuda_emulator: Option<PathBuf>,
    /// `KILN_VULKAN_DEVICE`: the Vulkan device to use, by its index in the driver's list (by
    /// default the first discrete GPU, else the first device).
    pub vulkan_device: Option<usize>,

    // ---- CPU kernels
    /// `KILN_ISA`: caps the CPU kernel tier at this one (a tier's name: `scalar`, `avx2`,
    /// `avx512`, `avx512vnni`, ...; an unknown name is ignored), to compare paths.
    pub isa: Option<String>,
    /// `KILN_PREFETCH=0|1`: whether the 16-row group kernels ask for weights ahead (unset:
    /// everywhere but on a Zen 4, whose own prefetcher does better alone).
    pub prefetch: Option<bool>,
    /// `KILN_Q6K_GROUPS=0`: a Q6_K output matrix stays row-major instead of in 16-row groups
    /// on AVX-512 VNNI (the same bits either way; default on).
    pub q6k_groups: bool,

    // ---- GPU: switches, on unless set to `0`
    /// `KILN_CUDA_FUSE=0`: each op launched alone (no products sharing an input in one
    /// launch, no epilogues).
    pub cuda_fuse: bool,
    /// `KILN_CUDA_MIRROR=0`: f32 decode attention instead of the CPU's f16 arithmetic on
    /// short contexts.
    pub cuda_mirror: bool,
    /// `KILN_CUDA_REPACK=0`: weights uploaded as the file stores them (no rearranging of the
    /// 32-element formats and q6_K for wide loads).
    pub cuda_repack: bool,
    /// `KILN_CUDA_DEQUANT_AHEAD=0`: prompt products' weights dequantized on the session's
    /// stream into one buffer, instead of ahead on a second stream.
    pub cuda_dequant_ahead: bool,
    /// `KILN_CUDA_ROPE_EPILOGUE=0`: RoPE launched after the q, k, v products instead of in
    /// their epilogue.
    pub cuda_rope_epilogue: bool,
    /// `KILN_CUDA_POST_EPILOGUE=0`: Gemma-3's post-norm launched as `rms_norm_add_f32`
    /// instead of in the output product's epilogue.
    pub cuda_post_epilogue: bool,
    /// `KILN_CUDA_PREFETCH=0`: kernels compiled without their L2 prefetch of the weights.
    pub cuda_prefetch: bool,

    // ---- GPU: what to see
    /// `KILN_CUDA_PROFILE` (set): time per kernel, ops one at a time without graphs, printed
    /// when the session ends.
    pub cuda_profile: bool,
    /// `KILN_CUDA_TRACE` (set): every launch (kernel, grid, block) on stderr, a graph's when
    /// it is recorded.
    pub cuda_trace: bool,

    // ---- GPU: launch shapes, for measuring
    /// `KILN_CUDA_MV_UNROLL` (1 to 8): unrolling of the matvecs' loop over a row's groups
    /// (unset: the kernel's own, 2).
    pub cuda_mv_unroll: Option<u32>,
    /// `KILN_CUDA_MV_THREADS` (a multiple of 32, 32 to 1024): threads per block of a wide
    /// row's matvec (unset: 128, 32 on the software GPU).
    pub cuda_mv_threads: Option<u32>,
    /// `KILN_CUDA_MV_WARP_GROUPS`: rows of up to this many 32-element groups take one warp
    /// each, wider ones a block (default 512).
    pub cuda_mv_warp_groups: usize,
    /// `KILN_CUDA_F32_INPUT_COLS`: the widest rows whose products quantize their f32 input
    /// themselves (default 2048; capped by the kernels' limit).
    pub cuda_f32_input_cols: Option<usize>,
    /// `KILN_CUDA_NORM_SLICE` (a multiple of 256): elements of a row each block of
    /// `rms_norm_q8` normalizes and quantizes (default 512).
    pub cuda_norm_slice: usize,
    /// `KILN_CUDA_TILE_Q` (64, 32 or 16): query vectors per tile of prompt attention (unset:
    /// the largest that still gives 256 blocks).
    pub cuda_tile_q: Option<usize>,
    /// `KILN_CUDA_SPLIT_KEYS` (16 to 4096): positions per split of decode attention, at
    /// least (default 64).
    pub cuda_split_keys: usize,
}

/// The process's settings, read from the environment the first time they are asked for.
pub fn get() -> &'static Tuning {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    TUNING.get_or_init(|| Tuning::from_lookup(|name| std::env::var_os(name)))
}

impl Tuning {
    /// The settings `env` gives (`env(name)`: the variable's value, `None` when unset).
    pub fn from_lookup(env: impl Fn(&str) -> Option<OsString>) -> Tuning {
        let text = |name: &str| env(name).and_then(|v| v.into_string().ok());
        let path = |name: &str| env(name).map(PathBuf::from);
        let nonempty = |name: &str| path(name).filter(|p| !p.as_os_str().is_empty());
        // on unless set to `0`
        let switch = |name: &str| text(name).as_deref() != Some("0");
        let number = |name: &str| text(name).and_then(|v| v.parse::<usize>().ok());
        Tuning {
            models: nonempty("KILN_MODELS"),
            pip: text("KILN_PIP")
                .map(|s| s.split_whitespace().map(String::from).collect::<Vec<_>>())
                .filter(|v| !v.is_empty()),
            history: path("KILN_HISTORY"),
            load_gate: path("KILN_LOAD_GATE"),
            nvrtc: path("KILN_NVRTC"),
            cuda_emulator: path("KILN_CUDA_EMULATOR"),
            vulkan_device: number("KILN_VULKAN_DEVICE"),
            isa: text("KILN_ISA"),
            prefetch: match text("KILN_PREFETCH").as_deref() {
                Some("0") => Some(false),
                Some("1") => Some(true),
                _ => None,
            },
            q6k_groups: switch("KILN_Q6K_GROUPS"),
            cuda_fuse: switch("KILN_CUDA_FUSE"),
            cuda_mirror: switch("KILN_CUDA_MIRROR"),
            cuda_repack: switch("KILN_CUDA_REPACK"),
            cuda_dequant_ahead: switch("KILN_CUDA_DEQUANT_AHEAD"),
            cuda_rope_epilogue: switch("KILN_CUDA_ROPE_EPILOGUE"),
            cuda_post_epilogue: switch("KILN_CUDA_POST_EPILOGUE"),
            cuda_prefetch: switch("KILN_CUDA_PREFETCH"),
            cuda_profile: env("KILN_CUDA_PROFILE").is_some(),
            cuda_trace: env("KILN_CUDA_TRACE").is_some(),
            cuda_mv_unroll: number("KILN_CUDA_MV_UNROLL")
                .filter(|n| (1..=8).contains(n))
                .map(|n| n as u32),
            cuda_mv_threads: number("KILN_CUDA_MV_THREADS")
                .filter(|v| v.is_multiple_of(32) && (32..=1024).contains(v))
                .map(|v| v as u32),
            cuda_mv_warp_groups: number("KILN_CUDA_MV_WARP_GROUPS").unwrap_or(512),
            cuda_f32_input_cols: number("KILN_CUDA_F32_INPUT_COLS"),
            cuda_norm_slice: number("KILN_CUDA_NORM_SLICE")
                .filter(|v| *v > 0 && v.is_multiple_of(256))
                .unwrap_or(512),
            cuda_tile_q: number("KILN_CUDA_TILE_Q").filter(|v| [64, 32, 16].contains(v)),
            cuda_split_keys: number("KILN_CUDA_SPLIT_KEYS")
                .filter(|v| (16..=4096).contains(v))
                .unwrap_or(64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Tuning {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_lookup(move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let t = with(&[]);
        assert_eq!(t.models, None);
        assert_eq!(t.pip, None);
        assert_eq!(t.history, None);
        assert_eq!(t.isa, None);
        assert_eq!(t.prefetch, None);
        assert!(t.q6k_groups && t.cuda_fuse && t.cuda_mirror && t.cuda_repack);
        assert!(t.cuda_dequant_ahead && t.cuda_rope_epilogue && t.cuda_post_epilogue);
        assert!(t.cuda_prefetch);
        assert!(!t.cuda_profile && !t.cuda_trace);
        assert_eq!(t.cuda_mv_unroll, None);
        assert_eq!(t.cuda_mv_threads, None);
        assert_eq!(t.cuda_mv_warp_groups, 512);
        assert_eq!(t.cuda_f32_input_cols, None);
        assert_eq!(t.cuda_norm_slice, 512);
        assert_eq!(t.cuda_tile_q, None);
        assert_eq!(t.cuda_split_keys, 64);
    }

    #[test]
    fn values_are_read_and_typed() {
        let t = with(&[
            ("KILN_MODELS", "/m"),
            ("KILN_PIP", " uv  pip "),
            ("KILN_HISTORY", ""),
            ("KILN_ISA", "avx2"),
            ("KILN_PREFETCH", "1"),
            ("KILN_Q6K_GROUPS", "0"),
            ("KILN_CUDA_FUSE", "0"),
            ("KILN_CUDA_MIRROR", "1"),
            ("KILN_CUDA_PROFILE", ""),
            ("KILN_CUDA_MV_UNROLL", "8"),
            ("KILN_CUDA_MV_THREADS", "256"),
            ("KILN_CUDA_MV_WARP_GROUPS", "0"),
            ("KILN_CUDA_F32_INPUT_COLS", "4096"),
            ("KILN_CUDA_NORM_SLICE", "65536"),
            ("KILN_CUDA_TILE_Q", "32"),
            ("KILN_CUDA_SPLIT_KEYS", "256"),
        ]);
        assert_eq!(t.models, Some(PathBuf::from("/m")));
        assert_eq!(t.pip, Some(vec!["uv".to_string(), "pip".to_string()]));
        assert_eq!(t.history, Some(PathBuf::new()), "set but empty: no history");
        assert_eq!(t.isa.as_deref(), Some("avx2"));
        assert_eq!(t.prefetch, Some(true));
        assert!(!t.q6k_groups && !t.cuda_fuse);
        assert!(t.cuda_mirror, "only `0` turns a switch off");
        assert!(t.cuda_profile, "set, even empty, asks for it");
        assert_eq!(t.cuda_mv_unroll, Some(8));
        assert_eq!(t.cuda_mv_threads, Some(256));
        assert_eq!(t.cuda_mv_warp_groups, 0);
        assert_eq!(t.cuda_f32_input_cols, Some(4096));
        assert_eq!(t.cuda_norm_slice, 65536);
        assert_eq!(t.cuda_tile_q, Some(32));
        assert_eq!(t.cuda_split_keys, 256);
    }

    /// Every variable read here has its row in docs/tuning.md, every row there is read here
    /// (or, `KILN_API_KEY`, by the command line), and no other file of src/ reads a `KILN_*`
    /// variable itself.
    #[test]
    fn the_table_and_the_reads_agree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let names = |text: &str, open: &str| -> std::collections::BTreeSet<String> {
            text.split(open)
                .skip(1)
                .filter_map(|rest| rest.split(['"', '`']).next())
                .filter(|n| n.starts_with("KILN_"))
                .map(String::from)
                .collect()
        };
        let src = std::fs::read_to_string(root.join("src/tuning.rs")).unwrap();
        let code = &src[..src.find("#[cfg(test)]").unwrap()];
        let read = names(code, "(\"");
        let doc = std::fs::read_to_string(root.join("docs/tuning.md")).unwrap();
        let rows: std::collections::BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(String::from)
            .collect();
        let mut want = read.clone();
        want.insert("KILN_API_KEY".into());
        assert_eq!(
            rows, want,
            "docs/tuning.md's rows against src/tuning.rs's reads"
        );
        assert!(read.len() >= 25, "{read:?}");
        let mut stack = vec![root.join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("src/tuning.rs")
                {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for call in ["var(\"KILN_", "var_os(\"KILN_"] {
                        assert!(
                            !text.contains(call),
                            "{} reads a KILN_ variable",
                            p.display()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn values_out_of_range_are_the_defaults() {
        let t = with(&[
            ("KILN_MODELS", ""),
            ("KILN_PIP", "   "),
            ("KILN_PREFETCH", "yes"),
            ("KILN_CUDA_MV_UNROLL", "9"),
            ("KILN_CUDA_MV_THREADS", "48"),
            ("KILN_CUDA_MV_WARP_GROUPS", "many"),
            ("KILN_CUDA_NORM_SLICE", "300"),
            ("KILN_CUDA_TILE_Q", "8"),
            ("KILN_CUDA_SPLIT_KEYS", "8192"),
        ]);
        assert_eq!(t, with(&[]));
    }
}
