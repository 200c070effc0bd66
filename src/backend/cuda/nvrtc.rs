//! Building the kernels: CUDA C files embedded in the binary, compiled by NVRTC at first use for
//! the GPU present, and cached on disk under the hash of what went in (sources, architecture,
//! NVRTC's version), so a second start loads PTX instead of compiling.
//!
//! The kernels need no CUDA headers: f16 conversions are inline PTX (`common.cuh`), so the NVRTC
//! library alone (the toolkit's, or the `nvidia-cuda-nvrtc` wheel's) compiles them, on a machine
//! without a GPU too; the test suite does that for every file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::CudaError;

/// The prelude of every kernel file: f16 conversion, reductions.
pub const COMMON: &str = include_str!("kernels/common.cuh");
/// Then the block formats' element dequantizers (plain C; also compiled on the host by the
/// tests).
pub const BLOCKS: &str = include_str!("kernels/blocks.cuh");

/// The kernel files, by name.
pub const KERNELS: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("embed.cu", include_str!("kernels/embed.cu")),
    ("matvec.cu", include_str!("kernels/matvec.cu")),
    ("gemm.cu", include_str!("kernels/gemm.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("probe.cu", include_str!("kernels/probe.cu")),
];

/// The stamping macros of the kernel files: a line that starts with one is an instance, one or
/// more kernels named by its first argument.
const STAMPS: [&str; 8] = [
    "MATVEC_Q(",
    "MATVEC_GATED(",
    "MATVEC_PLAIN(",
    "EMBED(",
    "DEQUANT_BF16(",
    "ATTEND(",
    "ATTEND_SPLIT(",
    "ATTEND_TILE(",
];

/// The `extern "C" __global__` functions a kernel file defines, found in its text: plain
/// definitions and the instances of its stamping macros (`MATVEC_Q(matvec_q4_0, ...)`).
pub fn entries(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in src.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("extern \"C\" __global__ void ") {
            if !rest.starts_with("NAME") {
                names.push(rest.split('(').next().unwrap_or("").trim().to_string());
            }
        }
        for mac in STAMPS {
            if let Some(rest) = l.strip_prefix(mac) {
                let name = rest.split(',').next().unwrap_or("").trim();
                names.push(name.to_string());
                // (These two also stamp the kernel over f32 input; MATVEC_Q both with a RoPE
                // epilogue too, and the f32 one with a post-norm epilogue.)
                if (mac == "MATVEC_Q(" || mac == "MATVEC_GATED(") && !name.is_empty() {
                    names.push(format!("{name}_f"));
                }
                if mac == "MATVEC_Q(" && !name.is_empty() {
                    names.push(format!("{name}_rope"));
                    names.push(format!("{name}_f_rope"));
                    names.push(format!("{name}_f_post"));
                }
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// How many programs kernel file `name` compiles as ([`programs`]): matvec.cu stamps over a
/// hundred kernels, most of a build's time (about 40 s of NVRTC on one core), and the
/// attention's tiles are the next largest.
fn parts(name: &str) -> usize {
    match name {
        "matvec.cu" => 8,
        "attention.cu" => 2,
        _ => 1,
    }
}

/// The programs kernel file `name` compiles as, `(label, source)`: the file whole (label
/// `name`), or, for the largest ([`parts`]), n parts that compile in parallel ([`compile_all`])
/// and load as modules of their own (labels `name~0`...): each has every line of the file
/// but the stamping macros' instances, and every n-th of those, a blank line in place of the
/// others so that the compiler's line numbers stay the file's. (A part repeats the file's
/// plain kernels; they are small.)
pub fn programs(name: &str, src: &str) -> Vec<(String, String)> {
    let n = parts(name);
    if n == 1 {
        return vec![(name.to_string(), src.to_string())];
    }
    let mut out = vec![String::with_capacity(src.len()); n];
    let mut instance = 0;
    for line in src.lines() {
        let stamped = STAMPS.iter().any(|m| line.trim_start().starts_with(m));
        for (k, part) in out.iter_mut().enumerate() {
            if !stamped || instance % n == k {
                part.push_str(line);
            }
            part.push('\n');
        }
        instance += stamped as usize;
    }
    out.into_iter()
        .enumerate()
        .map(|(k, s)| (format!("{name}~{k}"), s))
        .collect()
}

/// Every kernel file's programs ([`programs`]).
pub fn all_programs() -> Vec<(String, String)> {
    KERNELS
        .iter()
        .flat_map(|(name, src)| programs(name, src))
        .collect()
}

/// The software GPU's source (`emulator.cpp`): the emulation layer, the prelude, the block
/// formats and every kernel file, then `kiln_emu_launch(name, grid, block, params)`, which runs
/// a kernel as `cuLaunchKernel` would (parameters by address). The tests build it with the
/// host's C++ compiler into a library [`super::Gpu::emulated`] loads.
pub fn emulator_source() -> String {
    let mut s = String::from(include_str!("emulator.cpp"));
    s.push_str(&format!(
        "#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"blocks.cuh\"\n{BLOCKS}\n"
    ));
    let mut table = String::new();
    for (name, src) in KERNELS {
        s.push_str(&format!("#line 1 \"{name}\"\n{src}\n"));
        for e in entries(src) {
            table.push_str(&format!(
                "    {{\"{e}\", [](void** p) {{ call({e}, p); }}}},\n"
            ));
        }
    }
    s.push_str(&format!(
        r#"
static const Launcher LAUNCHERS[] = {{
{table}}};

extern "C" int kiln_emu_launch(const char* name, unsigned grid, unsigned block, void** params) {{
    for (const auto& l : LAUNCHERS)
        if (!std::strcmp(l.name, name)) {{
            if (block == 0 || block > 1024 || grid == 0) return 2;
            emulate(grid, block, [&] {{ l.run(params); }});
            return 0;
        }}
    return 1;
}}
"#
    ));
    s
}

/// Make NVRTC loadable: the library named by `KILN_NVRTC` (a path to `libnvrtc.so.13`) if set,
/// else the one the dynamic loader finds by name.
pub fn load() -> Result<(), CudaError> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    let r = LOADED.get_or_init(|| {
        if let Some(path) = std::env::var_os("KILN_NVRTC") {
            preload(Path::new(&path)).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    if let Err(reason) = r {
        return Err(CudaError::Load {
            path: std::env::var("KILN_NVRTC").unwrap_or_default(),
            reason: reason.clone(),
        });
    }
    // SAFETY: loading libnvrtc runs its initializers only; cudarc keeps it loaded.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoNvrtc)
    }
}

/// Load the library at `path` for the rest of the process, with its symbols global, so that
/// loading it by its name (`libnvrtc.so.13`, which cudarc does) finds this copy.
pub fn preload(path: &Path) -> Result<(), CudaError> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: libnvrtc's initializers have no preconditions; the handle is leaked on purpose,
    // so the library is never unloaded while cudarc's copy of the handle is in use.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        CudaError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    })?;
    std::mem::forget(lib);
    Ok(())
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    load()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::NoNvrtc);
    }
    Ok((major, minor))
}

/// The source NVRTC compiles for kernel file `name`: the prelude, then the file (with line
/// numbers of the file in messages). For measuring, `KILN_CUDA_PREFETCH=0` compiles the
/// kernels without their L2 prefetch of the weights (`prefetch_l2` in common.cuh), and
/// `KILN_CUDA_MV_UNROLL=n` (1 to 8) unrolls the matvecs' loop over a row's groups n times
/// (`KILN_MV_UNROLL` in matvec.cu); the cache's hash covers both.
fn full_source(name: &str, src: &str) -> String {
    let mut switches = String::new();
    if std::env::var("KILN_CUDA_PREFETCH").is_ok_and(|v| v == "0") {
        switches.push_str("#define KILN_L2_PREFETCH 0\n");
    }
    let unroll = std::env::var("KILN_CUDA_MV_UNROLL").ok();
    if let Some(n) = unroll
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| (1..=8).contains(n))
    {
        switches.push_str(&format!("#define KILN_MV_UNROLL {n}\n"));
    }
    let file = name.split('~').next().unwrap_or(name);
    format!("{switches}{COMMON}\n#line 1 \"blocks.cuh\"\n{BLOCKS}\n#line 1 \"{file}\"\n{src}")
}

/// What NVRTC makes of a kernel file: PTX, and for a real architecture (`sm_90`, not
/// `compute_90`) the device code too (a CUBIN), which the driver loads as it is, where PTX
/// would be compiled a second time by the driver's JIT (about as long as NVRTC's own
/// translation of it: 11 of matvec.cu's 21 s on a Zen 5 core).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    pub ptx: String,
    pub cubin: Option<Vec<u8>>,
}

/// Whether `arch` names a real architecture (NVRTC then makes device code).
fn is_real(arch: &str) -> bool {
    arch.starts_with("sm_")
}

/// Compile kernel file `name` for `arch` (`"sm_90"`, or `"compute_90"` for PTX that any later
/// GPU can run); returns PTX.
pub fn compile(name: &str, src: &str, arch: &'static str) -> Result<String, CudaError> {
    compile_program(name, src, arch).map(|c| c.ptx)
}

/// Compile kernel file `name` for `arch`: its PTX and, for a real architecture, its CUBIN.
pub fn compile_program(name: &str, src: &str, arch: &'static str) -> Result<Compiled, CudaError> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};
    load()?;
    let error = |log: String| CudaError::Compile {
        file: name.to_string(),
        arch: arch.to_string(),
        log,
    };
    let text = CString::new(full_source(name, src)).map_err(|e| error(e.to_string()))?;
    let label = CString::new(name).map_err(|e| error(e.to_string()))?;
    let options = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ];
    let prog = result::create_program(&text, Some(&label)).map_err(|e| error(e.to_string()))?;
    let nvrtc_error = |e: result::NvrtcError| error(e.to_string());
    // SAFETY: `prog` was made just above from `text` and `label`, which outlive it, and is
    // destroyed once, below, after its last use; the buffers NVRTC writes into are as long as
    // the sizes it gave.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Err(_) => match result::get_program_log(prog) {
                Ok(log) => Err(error(
                    CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned(),
                )),
                Err(e) => Err(nvrtc_error(e)),
            },
            Ok(()) => result::get_ptx(prog).map_err(nvrtc_error).and_then(|ptx| {
                let ptx = CStr::from_ptr(ptx.as_ptr()).to_string_lossy().into_owned();
                if !is_real(arch) {
                    return Ok(Compiled { ptx, cubin: None });
                }
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(nvrtc_error)?;
                let mut cubin = vec![0u8; size];
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                    .result()
                    .map_err(nvrtc_error)?;
                Ok(Compiled {
                    ptx,
                    cubin: Some(cubin),
                })
            }),
        }
    };
    // SAFETY: `prog` came from create_program and is not used after this.
    unsafe { result::destroy_program(prog) }.map_err(nvrtc_error)?;
    out
}

/// [`compile_program`], through a cache in `dir`: the PTX is kept as `{name}-{hash}.ptx` and
/// the CUBIN beside it as `{name}-{hash}.cubin`, the hash over the prelude, the file, the
/// architecture and NVRTC's version.
pub fn compile_cached(
    dir: &Path,
    name: &str,
    src: &str,
    arch: &'static str,
) -> Result<Compiled, CudaError> {
    let (major, minor) = version()?;
    let mut h = Sha256::new();
    for part in [full_source(name, src).as_bytes(), arch.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(major.to_le_bytes());
    h.update(minor.to_le_bytes());
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let ptx_path = dir.join(format!("{name}-{hex}.ptx"));
    let cubin_path = dir.join(format!("{name}-{hex}.cubin"));
    if let Ok(ptx) = std::fs::read_to_string(&ptx_path) {
        // (A cache written before CUBINs were kept has the PTX alone: built again.)
        match is_real(arch).then(|| std::fs::read(&cubin_path)) {
            None => return Ok(Compiled { ptx, cubin: None }),
            Some(Ok(cubin)) => {
                return Ok(Compiled {
                    ptx,
                    cubin: Some(cubin),
                })
            }
            Some(Err(_)) => {}
        }
    }
    let compiled = compile_program(name, src, arch)?;
    let cache_err = |p: &Path, e: std::io::Error| CudaError::Cache {
        path: p.display().to_string(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| cache_err(dir, e))?;
    // Each written whole beside, then renamed: a concurrent start never reads half a file;
    // the CUBIN first, so a PTX found means its CUBIN is there.
    let files = [
        (&cubin_path, compiled.cubin.as_deref()),
        (&ptx_path, Some(compiled.ptx.as_bytes())),
    ];
    for (path, bytes) in files {
        let Some(bytes) = bytes else { continue };
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let tmp = path.with_extension(format!("{ext}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| cache_err(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| cache_err(path, e))?;
    }
    Ok(compiled)
}

/// [`compile_cached`] for each of `programs` (`(label, source)`, as [`programs`] makes them),
/// on as many threads as the machine has cores; in the programs' order. (NVRTC compiles
/// programs on several threads at once.)
pub fn compile_all(
    dir: &Path,
    programs: &[(String, String)],
    arch: &'static str,
) -> Result<Vec<Compiled>, CudaError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(programs.len());
    let mut out: Vec<Option<Result<Compiled, CudaError>>> = programs.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((label, src)) = programs.get(i) else {
                            return done;
                        };
                        done.push((i, compile_cached(dir, label, src, arch)));
                    }
                })
            })
            .collect();
        for w in workers {
            match w.join() {
                Ok(done) => done.into_iter().for_each(|(i, r)| out[i] = Some(r)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    out.into_iter()
        .map(|r| r.expect("every program was taken by a thread"))
        .collect()
}

/// Where compiled kernels are cached: `cuda/` beside the models directory
/// ([`crate::fetch::models_dir`]).
pub fn cache_dir() -> PathBuf {
    crate::fetch::models_dir().with_file_name("cuda")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's parts hold each stamped kernel once and its plain kernels each, with the
    /// file's line numbers, so that together they are the file.
    #[test]
    fn a_kernel_files_parts_are_the_file() {
        let mut split = 0;
        for (name, src) in KERNELS {
            let parts = programs(name, src);
            assert_eq!(parts.len(), super::parts(name));
            let all = entries(src);
            let plain: Vec<String> = src
                .lines()
                .filter(|l| !STAMPS.iter().any(|m| l.trim_start().starts_with(m)))
                .flat_map(entries)
                .collect();
            let mut seen: Vec<String> = Vec::new();
            for (k, (label, part)) in parts.iter().enumerate() {
                let want = if parts.len() > 1 {
                    format!("{name}~{k}")
                } else {
                    name.to_string()
                };
                assert_eq!(label, &want);
                assert_eq!(part.lines().count(), src.lines().count(), "{label}");
                let own = entries(part);
                for p in &plain {
                    assert!(own.contains(p), "{label} lacks plain kernel {p}");
                }
                seen.extend(own.into_iter().filter(|e| !plain.contains(e)));
            }
            seen.extend(plain);
            seen.sort();
            let mut want = all.clone();
            want.sort();
            assert_eq!(
                seen, want,
                "{name}: every stamped kernel in exactly one part"
            );
            split += (parts.len() > 1) as usize;
        }
        assert_eq!(split, 2, "matvec.cu and attention.cu compile in parts");
    }
}
