#!/usr/bin/env python3
"""kiln against the reference engine (llama.cpp's llama-bench), side by side, from one run.

Builds the reference from the `llama-cpp-python` source package (its vendored llama.cpp) for this
machine's instruction-set tier (scripts/reference.py: AVX-512, AVX2 or NEON) into a cache
directory outside the repository, builds kiln in release mode, then runs both engines on
the same GGUF files with the same thread count, alternating engine order round by round so that
load from other processes on a shared machine hits both alike. Prints one table with the ratio
kiln / reference for every test. Benchmarks, not tests: nothing here asserts on speed.

    scripts/bench-vs-ref.py                      # both real models, pp512 / tg128 / tg128 @ d4096
    scripts/bench-vs-ref.py -t 2 -r 3 --rounds 2 --tests pp512,tg128
    scripts/bench-vs-ref.py --ref-bin /path/to/llama-bench   # skip the reference build

Needs: python3 (stdlib only), a C/C++ compiler, cargo, network access to PyPI for the first
build (the sdist, and cmake/ninja wheels into a private venv). Everything reference-side lives
in $KILN_CACHE/ref (default ~/.cache/kiln/ref); models in $KILN_MODELS (default
~/.cache/kiln/models, fetched with `kiln pull --all` when missing).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("KILN_MODELS", reference.CACHE / "models"))

MODELS = {
    "SmolLM2-135M Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "Gemma-3-270M Q4_K_M": "gemma-3-270m-q4_k_m.gguf",
}

# name -> (n_prompt, n_gen, depth)
TESTS = {
    "pp512": (512, 0, 0),
    "tg128": (0, 128, 0),
    "tg128@d4096": (0, 128, 4096),
    "pp512@d4096": (512, 0, 4096),
}
DEFAULT_TESTS = "pp512,tg128,tg128@d4096"

def log(msg):
    print(f"[bench-vs-ref {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build_reference(jobs):
    """llama-bench for this machine's instruction-set tier (scripts/reference.py)."""
    return reference.build(["llama-bench"], jobs=jobs) / "llama-bench"


def machine_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    return f"{os.uname().machine}, {os.cpu_count()} CPUs"


def kiln_tier(kiln, model):
    """The kernel tier kiln picks here (the `kernels` field of its bench rows; KILN_ISA caps
    it), from a one-token run on `model`."""
    p = subprocess.run([str(kiln), "bench", "-m", str(model), "-p", "0", "-n", "1", "-r", "1",
                        "--json"], capture_output=True, text=True)
    try:
        return json.loads(p.stdout)[0]["kernels"]
    except (ValueError, LookupError, TypeError):
        return "unknown"


def build_kiln():
    run(["cargo", "build", "--release", "--bin", "kiln"], cwd=REPO)
    return REPO / "target" / "release" / "kiln"


def ensure_models(kiln):
    missing = [f for f in MODELS.values() if not (MODELS_DIR / f).exists()]
    if missing:
        run([kiln, "pull", "--all"])


def timed_wait4(cmd):
    """Run `cmd`, return (stdout text, peak RSS of that process in bytes)."""
    log("$ " + " ".join(str(c) for c in cmd))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.close(r)
        os.close(w)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            os.execv(str(cmd[0]), [str(c) for c in cmd])
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, ru = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed ({os.waitstatus_to_exitcode(status)}): {cmd}")
    return b"".join(chunks).decode(), ru.ru_maxrss * 1024


def bench_ref(binary, model, test, threads, reps):
    n_prompt, n_gen, depth = TESTS[test]
    cmd = [binary, "-m", model, "-p", n_prompt, "-n", n_gen, "-d", depth, "-r", reps,
           "-t", threads, "-o", "json"]
    out, rss = timed_wait4(cmd)
    rows = json.loads(out)
    return rows[0]["avg_ts"], rows[0]["samples_ts"], rss


def bench_kiln(binary, model, test, threads, reps, bandwidth):
    n_prompt, n_gen, depth = TESTS[test]
    cmd = [binary, "bench", "-m", model, "-p", n_prompt, "-n", n_gen, "-d", depth, "-r", reps,
           "-t", threads, "--json"]
    if bandwidth:
        cmd += ["--bandwidth", bandwidth]
    out, rss = timed_wait4(cmd)
    rows = json.loads(out)
    r = rows[0]
    step = r.get("weight_bytes_per_token", 0) + r.get("kv_bytes_per_token", 0)
    return r["avg_ts"], r["samples_ts"], rss, (step if n_gen > 0 else 0, r.get("bandwidth_gbs", 0))


def roofline(step_bytes, tps, probes):
    """The decode's share of the memory bandwidth: the bytes one step reads (kiln's estimate:
    every dense weight, the router, the output head, only `expert_used_count / expert_count`
    of the experts, the KV cache at the test's depth) × tokens/s, over the best read bandwidth
    kiln's probe measured in any of its runs (each probe is three passes over 512 MiB taken
    at one instant before its run: on a shared machine one of them can land in a burst of
    another process's traffic, so a single probe is no denominator; the best of the run is
    what the machine can do). None when nothing was measured."""
    best = max(probes, default=0.0)
    if not step_bytes or best <= 0:
        return None, best
    return step_bytes * tps / (best * 1e9), best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions per engine invocation")
    ap.add_argument("--rounds", type=int, default=2,
                    help="invocations per engine and test, alternating which engine goes first")
    ap.add_argument("--tests", default=DEFAULT_TESTS, help=f"comma list of {', '.join(TESTS)}")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of model names")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                    help="one more GGUF file to bench under NAME (e.g. a twin_gguf.py llama shape); repeatable")
    ap.add_argument("--ref-bin", help="an existing llama-bench binary (skips the build)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs for the reference build")
    ap.add_argument("--bandwidth", type=float,
                    help="memory read GB/s for kiln's roofline column (default: kiln measures)")
    a = ap.parse_args()

    tests = [t.strip() for t in a.tests.split(",") if t.strip()]
    for t in tests:
        if t not in TESTS:
            raise SystemExit(f"unknown test {t!r}; known: {', '.join(TESTS)}")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    paths = {m: MODELS_DIR / MODELS[m] for m in models}
    for spec in a.model:
        name, sep, file = spec.partition("=")
        if not sep or not Path(file).is_file():
            raise SystemExit(f"--model {spec!r}: expected NAME=PATH of an existing file")
        models.append(name)
        paths[name] = Path(file)

    ref = Path(a.ref_bin) if a.ref_bin else build_reference(a.jobs)
    kiln = build_kiln()
    ensure_models(kiln)

    results = {}  # (model, test, engine) -> list of samples
    extra = {}  # (model, test, engine) -> peak rss / bytes a decode step reads
    probes = []  # every kiln run's measured read bandwidth, GB/s
    for rnd in range(a.rounds):
        for m in models:
            path = paths[m]
            for t in tests:
                order = ["ref", "kiln"] if rnd % 2 == 0 else ["kiln", "ref"]
                for eng in order:
                    if eng == "ref":
                        avg, samples, rss = bench_ref(ref, path, t, a.threads, a.reps)
                        step, probe = 0, 0.0
                    else:
                        avg, samples, rss, (step, probe) = bench_kiln(kiln, path, t, a.threads,
                                                                      a.reps, a.bandwidth)
                        probes.append(probe)
                    key = (m, t, eng)
                    results.setdefault(key, []).extend(samples)
                    e = extra.setdefault(key, {"rss": 0, "step": 0})
                    e["rss"] = max(e["rss"], rss)
                    e["step"] = max(e["step"], step)
                    log(f"{m} {t} {eng}: {avg:.1f} t/s, peak RSS {rss / 2**20:.0f} MiB"
                        + (f", {step / 1e9:.3f} GB a step, probe {probe:.1f} GB/s" if step else ""))

    def stats(xs):
        xs = sorted(xs)
        n = len(xs)
        med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
        mean = sum(xs) / n
        sd = (sum((x - mean) ** 2 for x in xs) / (n - 1)) ** 0.5 if n > 1 else 0.0
        return med, sd

    print()
    print(f"threads {a.threads}, {a.rounds} rounds x {a.reps} reps per engine, alternating; "
          f"t/s = median of all samples")
    built = (f"reference: {a.ref_bin} (given; its tier is the builder's)" if a.ref_bin else
             f"reference built for {reference.tier()}{' + AMX' if reference.amx() else ''}")
    print(f"machine: {machine_name()}; {built}; "
          f"kiln: {kiln_tier(kiln, MODELS_DIR / next(iter(MODELS.values())))}")
    print()
    best = max(probes, default=0.0)
    if best > 0:
        print(f"kiln roofline: bytes a decode step reads × kiln t/s over {best:.1f} GB/s, the best "
              f"of the {len(probes)} read-bandwidth probes of kiln's runs "
              f"({min(probes):.1f}-{best:.1f} GB/s)")
        print()
    print("| model | test | reference t/s | kiln t/s | kiln / ref | ref peak RSS | kiln peak RSS | GB a step | kiln roofline |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        for t in tests:
            rm, rsd = stats(results[(m, t, "ref")])
            km, ksd = stats(results[(m, t, "kiln")])
            ek, er = extra[(m, t, "kiln")], extra[(m, t, "ref")]
            share, _ = roofline(ek["step"], km, probes)
            roof = f"{100 * share:.0f}%" if share is not None else "-"
            gb = f"{ek['step'] / 1e9:.3f}" if ek["step"] else "-"
            print(f"| {m} | {t} | {rm:.1f} ± {rsd:.1f} | {km:.1f} ± {ksd:.1f} | {km / rm:.2f}x | "
                  f"{er['rss'] / 2**20:.0f} MiB | {ek['rss'] / 2**20:.0f} MiB | {gb} | {roof} |")


if __name__ == "__main__":
    main()
