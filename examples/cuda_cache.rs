//! Fill kiln's CUDA kernel cache on a machine without a GPU, so that a GPU machine's first
//! start loads every kernel as it is and compiles nothing (`scripts/gpu-check.sh prepare`).
//!
//!     cargo run --release --example cuda_cache -- LIBNVRTC DIR [ARCH]
//!         compile every kernel program with the NVRTC at LIBNVRTC (a `libnvrtc.so.13` of the
//!         version the GPU machine loads: the cache's entries are keyed by it) for ARCH
//!         (default `sm_90`) into DIR, the folder `kiln` reads as `cuda/` beside its models
//!         directory
//!
//! Prints the NVRTC version, the number of programs and the bytes written.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln::backend::cuda::{gpu::NATIVE_ARCHS, nvrtc};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (lib, dir, arch) = match &args[..] {
        [lib, dir] => (lib, dir, "sm_90"),
        [lib, dir, arch] => (lib, dir, arch.as_str()),
        _ => {
            eprintln!("usage: cuda_cache LIBNVRTC DIR [ARCH]");
            return ExitCode::from(2);
        }
    };
    // The architectures a device start asks for (`NATIVE_ARCHS`).
    let Some(arch) = NATIVE_ARCHS.iter().map(|&(_, a)| a).find(|a| *a == arch) else {
        eprintln!("cuda_cache: {arch} is not an architecture kiln compiles for");
        return ExitCode::from(2);
    };
    match fill(Path::new(lib), &PathBuf::from(dir), arch) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda_cache: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fill(lib: &Path, dir: &Path, arch: &'static str) -> Result<(), Box<dyn std::error::Error>> {
    // NVRTC loads its builtins library by name when it compiles: load it first, from beside
    // libnvrtc, so that name is found.
    let folder = lib.parent().ok_or("LIBNVRTC has no folder")?;
    for e in std::fs::read_dir(folder)?.flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with("libnvrtc-builtins.so")
        {
            nvrtc::preload(&e.path())?;
        }
    }
    nvrtc::preload(lib)?;
    nvrtc::load()?;
    let (major, minor) = nvrtc::version()?;
    let programs = nvrtc::all_programs();
    let compiled = nvrtc::compile_all(dir, &programs, arch)?;
    let bytes: usize = compiled
        .iter()
        .map(|c| c.ptx.len() + c.cubin.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "NVRTC {major}.{minor}: {} programs for {arch} in {} ({:.1} MiB)",
        programs.len(),
        dir.display(),
        bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
