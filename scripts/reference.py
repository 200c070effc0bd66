"""The reference engine (llama.cpp), built from the `llama-cpp-python` source package.

Shared by `bench-vs-ref.py` (llama-bench) and `make-fixtures.py` (llama-quantize, llama-perplexity
and the shared libraries its Python bindings load). Everything lives in $KILN_CACHE/ref (default
~/.cache/kiln/ref), outside the repository:

    ref/venv/              cmake and ninja wheels (and numpy for make-fixtures.py)
    ref/src/               the sdist and its unpacked tree (vendor/llama.cpp)
    ref/build-<tier>[-shared]/bin/

The build is portable (no -march=native) for the instruction-set tier of this machine, so the
reference runs the same kernels kiln picks here: `avx512` (F/BW/VL/VNNI, as every AVX-512 machine
the project measures has), `avx2` (AVX2 + FMA + F16C: every x86-64-v3 machine), or `neon` on
aarch64. AMX stays off unless asked for (`KILN_REF_AMX=1`): it faults on the shared machines.
"""

import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))
REF_DIR = CACHE / "ref"
VENV = REF_DIR / "venv"

COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
]

TIER_FLAGS = {
    "avx512": ["-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON"],
    # With GGML_NATIVE off, ggml turns AVX, AVX2, FMA, F16C and BMI2 on by default.
    "avx2": ["-DGGML_AVX512=OFF"],
    "neon": [],
}
AMX_OFF = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
AMX_ON = ["-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON", "-DGGML_AMX_BF16=ON"]


def log(msg):
    print(f"[reference {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def tier():
    """The instruction-set tier this machine runs: avx512, avx2, neon (or exits)."""
    override = os.environ.get("KILN_REF_TIER")
    if override:
        if override not in TIER_FLAGS:
            raise SystemExit(f"KILN_REF_TIER={override!r}: one of {', '.join(TIER_FLAGS)}")
        return override
    if platform.machine() in ("aarch64", "arm64"):
        return "neon"
    f = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f:
        return "avx512"
    if {"avx2", "fma", "f16c"} <= f:
        return "avx2"
    raise SystemExit("this CPU has neither AVX2 nor AVX-512: no reference tier to build")


def amx():
    return os.environ.get("KILN_REF_AMX") == "1"


def venv(extra_packages=()):
    """The private venv with cmake and ninja (and `extra_packages`: (module, pip name)
    pairs); returns its bin dir."""
    bin_dir = VENV / "bin"
    if not (bin_dir / "cmake").exists():
        REF_DIR.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "venv", VENV])
        run([bin_dir / "pip", "install", "-q", "cmake", "ninja"])
    missing = [pip for module, pip in extra_packages
               if subprocess.run([bin_dir / "python", "-c", f"import {module}"],
                                 capture_output=True).returncode != 0]
    if missing:
        run([bin_dir / "pip", "install", "-q", *missing])
    return bin_dir


def source_tree():
    """The unpacked sdist (its `vendor/llama.cpp` is the reference's source)."""
    bin_dir = venv()
    src = REF_DIR / "src"
    sdists = sorted(src.glob("llama_cpp_python-*.tar.gz")) if src.exists() else []
    if not sdists:
        src.mkdir(parents=True, exist_ok=True)
        # `--no-binary llama-cpp-python` (not `:all:`): only this package as source; pip's
        # metadata step then gets its build dependencies as wheels instead of compiling cmake.
        run([bin_dir / "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
             "llama-cpp-python", "-d", src])
        sdists = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    sdist = sdists[-1]
    tree = src / sdist.name[: -len(".tar.gz")]
    if not (tree / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as t:
            t.extractall(src, filter="data") if sys.version_info >= (3, 12) else t.extractall(src)
    return tree


def build(targets, shared=False, jobs=2):
    """Build `targets` for this machine's tier; returns the directory holding the binaries
    (and, with `shared`, the libraries: libllama, libggml-base, ...)."""
    bin_dir = venv()
    llama = source_tree() / "vendor" / "llama.cpp"
    name = f"build-{tier()}{'-amx' if amx() else ''}{'-shared' if shared else ''}"
    out = REF_DIR / name
    flags = COMMON_FLAGS + TIER_FLAGS[tier()] + (AMX_ON if amx() else AMX_OFF)
    flags.append(f"-DBUILD_SHARED_LIBS={'ON' if shared else 'OFF'}")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    if not (out / "build.ninja").exists():
        run([bin_dir / "cmake", "-S", llama, "-B", out, "-G", "Ninja", *flags], env=env,
            stdout=subprocess.DEVNULL)
    run([bin_dir / "cmake", "--build", out, "--target", *targets, "-j", str(jobs)], env=env)
    return out / "bin"
