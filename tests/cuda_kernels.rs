//! The CUDA kernels compile: every kernel file, with NVRTC, for the GPUs kiln targets — on any
//! machine, GPU or not. NVRTC comes from `$KILN_NVRTC` (a path to `libnvrtc.so.13`), or else
//! from its PyPI wheel (`nvidia-cuda-nvrtc`), downloaded once into the target directory.
//! A kernel that does not compile fails here, not on a GPU machine.
//!
//! Also: the disk cache of compiled kernels, and `--device cuda` refused with one line where
//! there is no driver.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kiln::backend::cuda::{self, nvrtc};

/// The wheel NVRTC is taken from (CUDA 13, as the GPU machine's toolkit).
const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.5.37";

/// Make NVRTC loadable in this process.
fn nvrtc_ready() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        let lib = match std::env::var_os("KILN_NVRTC") {
            Some(p) => PathBuf::from(p),
            None => wheel_lib(),
        };
        // NVRTC loads its builtins library by name when it compiles: load it first, from
        // beside libnvrtc, so that name is found.
        let dir = lib.parent().expect("libnvrtc's folder");
        for e in std::fs::read_dir(dir).expect("libnvrtc's folder").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("libnvrtc-builtins.so") {
                nvrtc::preload(&e.path()).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        nvrtc::preload(&lib).unwrap_or_else(|e| panic!("{e}"));
        nvrtc::load().unwrap_or_else(|e| panic!("{e}"));
    });
}

/// `libnvrtc.so.13` from the PyPI wheel, fetched and unpacked under the target directory once.
fn wheel_lib() -> PathBuf {
    let root = common::tmp_dir().join("nvrtc");
    let lib = root.join("nvidia/cu13/lib/libnvrtc.so.13");
    if lib.exists() {
        return lib;
    }
    let wheels = root.join("wheel");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(["--no-input", "--quiet", "--dest"])
        .arg(&wheels)
        .arg(NVRTC_WHEEL)
        .status()
        .expect("running python3 -m pip");
    assert!(status.success(), "pip download {NVRTC_WHEEL} failed");
    let whl = std::fs::read_dir(&wheels)
        .expect("the wheel folder")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    unpack_libs(&whl, &root);
    assert!(lib.exists(), "{} not in the wheel", lib.display());
    lib
}

/// Unpack the wheel's shared libraries into `root`, each written beside and renamed (another
/// test process may be reading them).
fn unpack_libs(whl: &Path, root: &Path) {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(whl).unwrap()).unwrap();
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).unwrap();
        let name = f.name().to_string();
        if !name.contains("/lib/") || name.ends_with('/') {
            continue;
        }
        let out = root.join(&name);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        let mut w = std::fs::File::create(&tmp).unwrap();
        std::io::copy(&mut f, &mut w).unwrap();
        std::fs::rename(&tmp, &out).unwrap();
    }
}

#[test]
fn every_kernel_compiles_for_hopper_and_ampere() {
    nvrtc_ready();
    let (major, minor) = nvrtc::version().unwrap();
    println!("NVRTC {major}.{minor}");
    // What a device compiles: each file, or the largest in their parts (nvrtc::programs),
    // for sm_90 as a device does, all at once on several threads (nvrtc::compile_all).
    let programs = nvrtc::all_programs();
    let cache = common::tmp_dir().join(format!("nvrtc-all-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let hopper = nvrtc::compile_all(&cache, &programs, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(&cache).unwrap();
    for ((name, src), sm_90) in programs.iter().zip(hopper) {
        let (name, src) = (name.as_str(), src.as_str());
        let entries = nvrtc::entries(src);
        assert!(!entries.is_empty(), "{name}: no kernels found");
        for arch in ["sm_90", "sm_80", "compute_80"] {
            let ptx = match arch {
                "sm_90" => sm_90.ptx.clone(),
                _ => nvrtc::compile(name, src, arch).unwrap_or_else(|e| panic!("{e}")),
            };
            // KILN_PTX_DUMP=<folder>: keep the PTX, to read what NVRTC made of a kernel.
            if let Some(dir) = std::env::var_os("KILN_PTX_DUMP") {
                let dir = PathBuf::from(dir);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(format!("{name}.{arch}.ptx")), &ptx).unwrap();
            }
            for e in &entries {
                let at = ptx.find(&format!(".entry {e}(")).unwrap_or_else(|| {
                    panic!("{name} for {arch}: kernel {e} missing from the PTX")
                });
                // Launched with programmatic stream serialization on sm_90 (gpu.rs), a kernel
                // may start before the one ahead of it has finished: it must wait before it
                // reads or writes memory (`pdl_begin`), or it races that kernel.
                if arch == "sm_90" {
                    let body = &ptx[at..];
                    let body = &body[..body[1..].find(".entry ").map_or(body.len(), |n| n + 1)];
                    let wait = body.find("griddepcontrol.wait");
                    let first_access = ["ld.global", "st.global", "atom.global", "red.global"]
                        .iter()
                        .filter_map(|op| body.find(op))
                        .min();
                    assert!(
                        wait.is_some_and(|w| first_access.is_none_or(|a| w < a)),
                        "{name}: kernel {e} touches memory before griddepcontrol.wait"
                    );
                }
            }
        }
        // The device code a device loads as it is (an ELF image).
        let cubin = sm_90.cubin.as_deref().unwrap_or_default();
        assert!(cubin.starts_with(b"\x7fELF"), "{name}: no CUBIN for sm_90");
        println!("{name}: {} kernels", entries.len());
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_the_compilers_log() {
    nvrtc_ready();
    let bad = "extern \"C\" __global__ void k(float* x) { x[0] = undefined_thing; }";
    let err = nvrtc::compile("bad.cu", bad, "sm_90").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("bad.cu"), "{text}");
    assert!(text.contains("undefined_thing"), "{text}");
}

#[test]
fn compiled_kernels_are_cached_on_disk_by_hash() {
    nvrtc_ready();
    let dir = common::tmp_dir().join(format!("nvrtc-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (name, src) = nvrtc::KERNELS[0];
    let first = nvrtc::compile_cached(&dir, name, src, "sm_90").unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .collect();
    files.sort();
    let ext: Vec<_> = files.iter().map(|f| f.extension().unwrap()).collect();
    assert_eq!(ext, ["cubin", "ptx"], "the PTX and the device code");
    let (cubin, ptx) = (&files[0], &files[1]);
    // A second build reads the files: make the PTX recognizable to see that it does.
    std::fs::write(ptx, "// cached\n").unwrap();
    let again = nvrtc::compile_cached(&dir, name, src, "sm_90").unwrap();
    assert_eq!(again.ptx, "// cached\n");
    assert_eq!(again.cubin, first.cubin);
    // An entry used whole or not at all: built again (and stored) when its device code is
    // cut short, missing (a cache from before CUBINs were kept) or its PTX has a NUL in it.
    let whole = first.cubin.clone().unwrap();
    std::fs::write(cubin, &whole[..whole.len() - 1]).unwrap();
    assert_eq!(
        nvrtc::compile_cached(&dir, name, src, "sm_90").unwrap(),
        first
    );
    assert_eq!(std::fs::read(cubin).unwrap(), whole, "stored again");
    std::fs::remove_file(cubin).unwrap();
    assert_eq!(
        nvrtc::compile_cached(&dir, name, src, "sm_90").unwrap(),
        first
    );
    std::fs::write(ptx, "// cached\0\n").unwrap();
    assert_eq!(
        nvrtc::compile_cached(&dir, name, src, "sm_90").unwrap(),
        first
    );
    // Another source or architecture is another entry; a virtual architecture has PTX alone.
    let other = format!("{src}\n// changed\n");
    let second = nvrtc::compile_cached(&dir, name, &other, "sm_90").unwrap();
    assert!(second.ptx.contains(".entry"));
    let ptx_only = nvrtc::compile_cached(&dir, name, src, "compute_80").unwrap();
    assert!(ptx_only.cubin.is_none() && ptx_only.ptx.contains(".entry"));
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(names.len(), 5, "no temporary file left: {names:?}");
    assert!(first.ptx.contains(".entry"));
    // A cache that cannot be written (its folder is a file) costs a build, not the kernels.
    let blocked = dir.join("not-a-folder");
    std::fs::write(&blocked, "").unwrap();
    assert_eq!(
        nvrtc::compile_cached(&blocked, name, src, "sm_90").unwrap(),
        first
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_cuda_is_refused_in_one_line_without_a_driver() {
    if cuda::driver_present() {
        println!("skipped: this machine has a CUDA driver (the refusal is for machines without)");
        return;
    }
    // Refused before the model is read: the file need not exist.
    let model = common::tmp_dir().join("unused.gguf");
    for args in [
        &["--device", "cuda"][..],
        &["-ngl", "99"],
        &["--device=cuda"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "-m"])
            .arg(&model)
            .args(["-p", "x", "-n", "1"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains("no CUDA driver"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The host's C compiler builds `blocks.cuh` (the kernels' element dequantizers) into a small
/// program (with the non-linear formats' tables, `cuda::tables`); every format's blocks,
/// quantized from random values and edge cases by the CPU's reference quantizer, and the
/// non-linear formats' random blocks, must dequantize to exactly the CPU reference's values.
#[test]
fn block_dequantizers_match_the_cpu_reference_on_the_host() {
    use kiln::quant::{dequantize_row, quantize_row, GgmlType};
    let dir = common::tmp_dir().join(format!("blocks-twin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("twin.c");
    let formats = [
        ("f32", GgmlType::F32),
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::BF16),
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q5_0", GgmlType::Q5_0),
        ("q5_1", GgmlType::Q5_1),
        ("q8_0", GgmlType::Q8_0),
        ("q2_k", GgmlType::Q2K),
        ("q3_k", GgmlType::Q3K),
        ("q4_k", GgmlType::Q4K),
        ("q5_k", GgmlType::Q5K),
        ("q6_k", GgmlType::Q6K),
        ("iq4_nl", GgmlType::IQ4NL),
        ("iq4_xs", GgmlType::IQ4XS),
        ("mxfp4", GgmlType::MXFP4),
        ("iq2_xxs", GgmlType::IQ2XXS),
        ("iq2_xs", GgmlType::IQ2XS),
        ("iq2_s", GgmlType::IQ2S),
        ("iq3_xxs", GgmlType::IQ3XXS),
        ("iq3_s", GgmlType::IQ3S),
        ("iq1_s", GgmlType::IQ1S),
        ("iq1_m", GgmlType::IQ1M),
    ];
    // The non-linear formats (from iq4_nl on): random blocks too (every grid index, sign and
    // scale code, MXFP4's subnormal and overflowing scales), and for the five formats the CPU
    // quantizes only with an importance matrix, nothing else.
    let nonlinear = |ty: GgmlType| formats.iter().position(|f| f.1 == ty).unwrap() >= 13;
    let mut table = String::new();
    for (name, ty) in formats {
        let (elems, bytes) = (ty.block_size(), ty.type_size());
        table.push_str(&format!("  {{\"{name}\", dq_{name}, {elems}, {bytes}}},\n"));
    }
    let src = format!(
        r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
static float h2f(u16 h) {{ _Float16 f; memcpy(&f, &h, 2); return (float)f; }}
static float u2f(u32 v) {{ float f; memcpy(&f, &v, 4); return f; }}
static u16 ld16(const u8* p) {{ return (u16)(p[0] | (p[1] << 8)); }}
#define KILN_FN static inline
#define KILN_TABLE static const
{tables}
{blocks}
struct fmt {{ const char* name; float (*dq)(const u8*, int); int elems, bytes; }};
static const struct fmt FORMATS[] = {{
{table}}};
/* twin FORMAT IN OUT: dequantize every block of IN (raw bytes) into OUT (f32). */
int main(int argc, char** argv) {{
    if (argc != 4) return 2;
    for (size_t f = 0; f < sizeof FORMATS / sizeof FORMATS[0]; ++f) {{
        if (strcmp(FORMATS[f].name, argv[1])) continue;
        FILE* in = fopen(argv[2], "rb");
        FILE* out = fopen(argv[3], "wb");
        if (!in || !out) return 3;
        u8 block[256 * 4];
        while (fread(block, 1, FORMATS[f].bytes, in) == (size_t)FORMATS[f].bytes)
            for (int i = 0; i < FORMATS[f].elems; ++i) {{
                float v = FORMATS[f].dq(block, i);
                fwrite(&v, 4, 1, out);
            }}
        fclose(out);
        return 0;
    }}
    return 4;
}}
"#,
        blocks = nvrtc::BLOCKS,
        tables = cuda::tables::source()
    );
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("twin");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-O1",
            "-std=gnu11",
            "-Wall",
            "-Werror",
            "-ffp-contract=off",
            "-o",
        ])
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} on blocks.cuh:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for (name, ty) in formats {
        let n = 256 * 24;
        // Random rows of several scales, then edge cases: zeros, one large value, constants.
        let mut x: Vec<f32> = (0..n)
            .map(|i| next() * [1.0, 0.01, 30.0, 1e-4][(i / 1024) % 4])
            .collect();
        x[..256].iter_mut().for_each(|v| *v = 0.0);
        x[256..512].iter_mut().for_each(|v| *v = 0.5);
        x[600] = 1000.0;
        x[1000] = -7.25;
        let mut q = vec![0u8; n / ty.block_size() * ty.type_size()];
        let quantized = quantize_row(ty, &x, &mut q);
        if nonlinear(ty) {
            let random = common::ops::random_blocks(ty, n / ty.block_size(), ty as u64, true);
            q = match quantized {
                Ok(()) => [q, random].concat(),
                Err(_) => random,
            };
        } else {
            quantized.unwrap();
        }
        let n = q.len() / ty.type_size() * ty.block_size();
        let mut want = vec![0f32; n];
        dequantize_row(ty, &q, &mut want).unwrap();
        let (inp, outp) = (
            dir.join(format!("{name}.in")),
            dir.join(format!("{name}.out")),
        );
        std::fs::write(&inp, &q).unwrap();
        let st = Command::new(&exe)
            .arg(name)
            .arg(&inp)
            .arg(&outp)
            .status()
            .unwrap();
        assert!(st.success(), "{name}: twin exited {st}");
        let got: Vec<f32> = std::fs::read(&outp)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got.len(), n, "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}: element {i}: {g} vs {w}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln plan --device cuda` counts the weights from the file's header; the upload lays them
/// out from the loaded model: the two agree for every fixture model and both real models.
#[test]
fn device_plan_of_the_weights_equals_the_upload_layout() {
    use kiln::backend::cuda::{weights::planned_bytes, DeviceWeights};
    let mut paths: Vec<PathBuf> = Vec::new();
    for stem in [
        "random-llama-q4_0",
        "random-gpt2-q8_0",
        "random-qwen3-q4_k_m",
        "random-qwen2-q4_0",
        "random-llama-q2_k",
    ] {
        paths.push(common::random_model(stem));
    }
    paths.push(common::real_model("gemma3"));
    paths.push(common::real_model("smollm2"));
    for p in paths {
        let m = kiln::model::Model::load(&p).unwrap();
        let laid = DeviceWeights::layout_bytes(&m).unwrap();
        assert_eq!(laid, planned_bytes(&m.file), "{}", p.display());
    }
}

/// The command line with `--device cuda`, on the software GPU (`$KILN_CUDA_EMULATOR`): greedy
/// `run` prints the CPU's text, `bench` reports both tests, `perplexity` is the CPU's within
/// 0.5%, `plan --device cuda` lists the device components.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn command_line_on_the_software_gpu() {
    let lib = common::emulator_lib().unwrap_or_else(|why| panic!("no software GPU here: {why}"));
    let model = common::random_model("random-qwen3-q4_k_m");
    let kiln = |args: &[&str]| common::kiln_on_emulator(&lib, &model, args);
    let run = [
        "run",
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "0",
        "--raw",
    ];
    let (cpu, _) = kiln(&run);
    let (gpu, _) = kiln(&[&run[..], &["--device", "cuda"]].concat());
    assert_eq!(gpu, cpu, "greedy text on the GPU");
    let (b, _) = kiln(&[
        "bench", "-ngl", "99", "-p", "16", "-n", "8", "-r", "1", "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&b).unwrap();
    let tests: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp16", "tg8"]);
    assert!(
        rows[0]["kernels"].as_str().unwrap().starts_with("cuda"),
        "{b}"
    );
    let text = std::fs::read_to_string(common::golden_dir().join("corpus_pydoc.txt")).unwrap();
    let f = common::tmp_dir().join(format!("ppl-{}.txt", std::process::id()));
    std::fs::write(&f, &text[..6000.min(text.len())]).unwrap();
    let ppl = |dev: &str| {
        let (o, _) = kiln(&[
            "perplexity",
            "-f",
            f.to_str().unwrap(),
            "-c",
            "128",
            "--chunks",
            "3",
            "--json",
            "--device",
            dev,
        ]);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        v["final_ppl"].as_f64().unwrap()
    };
    let (c, g) = (ppl("cpu"), ppl("cuda"));
    assert!((g - c).abs() / c < 0.005, "perplexity CPU {c} vs GPU {g}");
    let (p, _) = kiln(&["plan", "--device", "cuda", "--json", "--budget", "1GiB"]);
    let v: serde_json::Value = serde_json::from_str(&p).unwrap();
    let names: Vec<&str> = v["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "weights (device)",
            "kv cache (device)",
            "activations (device)"
        ]
    );
    std::fs::remove_file(&f).unwrap();
}
