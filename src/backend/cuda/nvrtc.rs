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
/// tests), after the non-linear formats' tables ([`super::tables::source`]).
pub const BLOCKS: &str = include_str!("kernels/blocks.cuh");

/// The kernel files, by name.
pub const KERNELS: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("embed.cu", include_str!("kernels/embed.cu")),
    // (The non-linear formats' products continue matvec.cu in a file of their own: its
    // kernels stamped with their `dot_*`; then the experts' products over every format.)
    (
        "matvec.cu",
        concat!(
            include_str!("kernels/matvec.cu"),
            include_str!("kernels/matvec_iq.cu"),
            include_str!("kernels/matvec_id.cu")
        ),
    ),
    ("gemm.cu", include_str!("kernels/gemm.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("probe.cu", include_str!("kernels/probe.cu")),
    ("moe.cu", include_str!("kernels/moe.cu")),
];

/// The stamping macros of the kernel files: a line that starts with one is an instance, one or
/// more kernels named by its first argument.
const STAMPS: [&str; 10] = [
    "MATVEC_Q(",
    "MATVEC_ID(",
    "MATVEC_PLAIN_ID(",
    "MATVEC_GATED(",
    "MATVEC_PLAIN(",
    "EMBED(",
    "DEQUANT_BF16(",
    "ATTEND(",
    "ATTEND_SPLIT(",
    "ATTEND_TILE(",
];

/// The stamping macro a line of a kernel file starts with, and the rest of the line after
/// its parenthesis.
fn stamp(line: &str) -> Option<(&'static str, &str)> {
    let l = line.trim_start();
    STAMPS
        .iter()
        .find_map(|&m| l.strip_prefix(m).map(|rest| (m, rest)))
}

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
        if let Some((mac, rest)) = stamp(line) {
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
        let stamped = stamp(line).is_some();
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
    let tables = super::tables::source();
    s.push_str(&format!(
        "#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"tables\"\n{tables}\n#line 1 \"blocks.cuh\"\n{BLOCKS}\n"
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
        if let Some(path) = &crate::tuning::get().nvrtc {
            preload(path).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    if let Err(reason) = r {
        return Err(CudaError::Load {
            path: (crate::tuning::get().nvrtc.as_deref())
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
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

/// The source NVRTC compiles for kernel file `name`: the prelude (common.cuh, the tables,
/// blocks.cuh), then the file (with line
/// numbers of the file in messages). For measuring, `KILN_CUDA_PREFETCH=0` compiles the
/// kernels without their L2 prefetch of the weights (`prefetch_l2` in common.cuh), and
/// `KILN_CUDA_MV_UNROLL=n` (1 to 8) unrolls the matvecs' loop over a row's groups n times
/// (`KILN_MV_UNROLL` in matvec.cu); the cache's hash covers both.
fn full_source(name: &str, src: &str) -> String {
    let mut switches = String::new();
    let tuning = crate::tuning::get();
    if !tuning.cuda_prefetch {
        switches.push_str("#define KILN_L2_PREFETCH 0\n");
    }
    if let Some(n) = tuning.cuda_mv_unroll {
        switches.push_str(&format!("#define KILN_MV_UNROLL {n}\n"));
    }
    let file = name.split('~').next().unwrap_or(name);
    let tables = super::tables::source();
    format!(
        "{switches}{COMMON}\n#line 1 \"tables\"\n{tables}\n#line 1 \"blocks.cuh\"\n{BLOCKS}\n\
         #line 1 \"{file}\"\n{src}"
    )
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
    use std::ffi::CString;
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
    // destroyed once, below, after its last use; the buffer NVRTC writes the CUBIN into is as
    // long as the size it gave.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Err(e) => {
                let log = result::get_program_log(prog).map(|l| text_of(&l));
                Err(error(match log {
                    Ok(log) if !log.trim().is_empty() => log,
                    _ => e.to_string(),
                }))
            }
            Ok(()) => result::get_ptx(prog).map_err(nvrtc_error).and_then(|ptx| {
                let ptx = text_of(&ptx);
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
    // SAFETY: `prog` came from create_program and is not used after this. (Failing to free
    // it leaks a program; what it made is already copied out.)
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The text of a NUL-terminated buffer NVRTC filled (up to its first NUL, or all of it).
fn text_of(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .map(|c| u8::from_ne_bytes(c.to_ne_bytes()))
        .collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Whether `b` holds a whole 64-bit ELF image: its program and section header tables lie
/// inside it (a cache file cut short is not one; the driver reads an image by its headers).
fn whole_elf(b: &[u8]) -> bool {
    let field = |at: usize, n: usize| -> Option<u64> {
        let bytes = b.get(at..at + n)?;
        Some(bytes.iter().rev().fold(0u64, |v, &x| (v << 8) | x as u64))
    };
    let table = |off: usize, size: usize, count: usize| -> Option<bool> {
        let end = field(off, 8)?.checked_add(field(size, 2)?.checked_mul(field(count, 2)?)?)?;
        Some(end <= b.len() as u64)
    };
    b.starts_with(b"\x7fELF\x02\x01")
        && table(0x20, 0x36, 0x38) == Some(true)
        && table(0x28, 0x3a, 0x3c) == Some(true)
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
    let (ptx_path, cubin_path) = entry(dir, name, src, arch)?;
    // A cache entry is used whole or not at all: PTX with no NUL in it (the driver reads it to
    // the first) and, for a real architecture, a whole device image beside it (a cache
    // written before CUBINs were kept has the PTX alone).
    if let Ok(ptx) = std::fs::read_to_string(&ptx_path) {
        if !ptx.contains('\0') {
            match is_real(arch).then(|| std::fs::read(&cubin_path)) {
                None => return Ok(Compiled { ptx, cubin: None }),
                Some(Ok(cubin)) if whole_elf(&cubin) => {
                    return Ok(Compiled {
                        ptx,
                        cubin: Some(cubin),
                    })
                }
                Some(_) => {}
            }
        }
    }
    build(&ptx_path, &cubin_path, name, src, arch)
}

/// [`compile_program`], stored over the cache's entry (one the driver refused, say).
pub fn rebuild(
    dir: &Path,
    name: &str,
    src: &str,
    arch: &'static str,
) -> Result<Compiled, CudaError> {
    let (ptx_path, cubin_path) = entry(dir, name, src, arch)?;
    build(&ptx_path, &cubin_path, name, src, arch)
}

/// [`compile_program`], stored at the cache entry's paths.
fn build(
    ptx_path: &Path,
    cubin_path: &Path,
    name: &str,
    src: &str,
    arch: &'static str,
) -> Result<Compiled, CudaError> {
    let compiled = compile_program(name, src, arch)?;
    store(ptx_path, cubin_path, &compiled);
    Ok(compiled)
}

/// The cache's files for a program: its PTX and its CUBIN.
fn entry(
    dir: &Path,
    name: &str,
    src: &str,
    arch: &'static str,
) -> Result<(PathBuf, PathBuf), CudaError> {
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
    Ok((
        dir.join(format!("{name}-{hex}.ptx")),
        dir.join(format!("{name}-{hex}.cubin")),
    ))
}

/// Write a compiled program into the cache (see [`compile_cached`]), the CUBIN first, so that
/// a PTX found means its CUBIN is there. Each file is written whole under a name no other
/// writer uses (process, thread, count), then renamed over the entry: a concurrent start never
/// reads half a file. A cache that cannot be written costs the next start a build, no more:
/// said once on stderr.
fn store(ptx_path: &Path, cubin_path: &Path, c: &Compiled) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    static WARNED: std::sync::Once = std::sync::Once::new();
    let files = [
        (cubin_path, c.cubin.as_deref()),
        (ptx_path, Some(c.ptx.as_bytes())),
    ];
    for (path, bytes) in files {
        let Some(bytes) = bytes else { continue };
        let tmp = path.with_extension(format!(
            "{}.{}.{:?}.{}.tmp",
            path.extension().and_then(|e| e.to_str()).unwrap_or(""),
            std::process::id(),
            std::thread::current().id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            WARNED.call_once(|| {
                eprintln!(
                    "kiln: kernel cache {}: {e} (compiled kernels are not kept)",
                    path.display()
                )
            });
            return;
        }
    }
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
    let helpers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(programs.len())
        .saturating_sub(1);
    // Take programs until none is left; what each took, by index.
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((label, src)) = programs.get(i) else {
                return done;
            };
            done.push((i, compile_cached(dir, label, src, arch)));
        }
    };
    let mut out: Vec<Option<Result<Compiled, CudaError>>> = programs.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        // Helper threads with a main thread's stack, as many as the machine has cores less
        // this one, which works too (so a machine that refuses threads still builds).
        let helpers: Vec<_> = (0..helpers)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .stack_size(8 << 20)
                    .spawn_scoped(s, work)
                    .ok()
            })
            .collect();
        let mine = work();
        for done in std::iter::once(Ok(mine)).chain(helpers.into_iter().map(|h| h.join())) {
            match done {
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

    /// An ELF image is whole when both of its header tables lie inside it.
    #[test]
    fn a_device_image_cut_short_is_not_whole() {
        let mut elf = vec![0u8; 256];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let put = |e: &mut Vec<u8>, at: usize, v: u64, n: usize| {
            e[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
        };
        put(&mut elf, 0x20, 64, 8); // program headers at 64: 2 of 56 bytes
        put(&mut elf, 0x36, 56, 2);
        put(&mut elf, 0x38, 2, 2);
        put(&mut elf, 0x28, 192, 8); // section headers at 192: 1 of 64 bytes, to the end
        put(&mut elf, 0x3a, 64, 2);
        put(&mut elf, 0x3c, 1, 2);
        assert!(whole_elf(&elf));
        assert!(!whole_elf(&elf[..255]), "section headers cut");
        put(&mut elf, 0x38, 4, 2);
        assert!(!whole_elf(&elf), "program headers past the end");
        put(&mut elf, 0x38, 2, 2);
        elf[4] = 1;
        assert!(!whole_elf(&elf), "a 32-bit image");
        assert!(!whole_elf(b"cubin"));
    }

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
                .filter(|l| stamp(l).is_none())
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
