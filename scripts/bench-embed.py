#!/usr/bin/env python3
"""Embedding throughput of kiln against the reference engine's `llama-embedding`, side by side.

Writes a random-weight twin of a bge-base-shaped encoder (BERT: 12 layers, width 768, 12 heads,
FFN 3072, a WordPiece vocabulary of 30,522 tokens, 512 positions, CLS pooling; 2-D weights in
F16 as such models ship, norms and biases F32; `--type Q8_0` quantizes it with the reference's
llama-quantize), 256 texts of about 30 tokens each (words of its vocabulary), then runs
`kiln embedding` and `llama-embedding` on the same file and texts with the same thread count,
alternating which engine goes first round by round, so that load from other processes on a
shared machine hits both alike. Each run is one process embedding all texts (model load
included, output to /dev/null); the table gives the best and median wall time of each, texts
per second, and the ratio kiln / reference; and the same by CPU time (user + system), which
on a machine shared with other work measures the engines' own cost where wall time measures
their share of the cores. A benchmark, not a test: nothing asserts on speed.

    scripts/bench-embed.py                      # F16, 3 rounds, 2 threads
    scripts/bench-embed.py --type Q8_0 --rounds 5 -t 2
    scripts/bench-embed.py --ref-bin /path/to/llama-embedding
    scripts/bench-embed.py --kiln-before /tmp/kiln-old  # a second kiln build in the rounds

The reference's `llama-embedding` is an example program that the reference build
(scripts/reference.py, examples off) does not configure; when it is missing from the build's
bin directory it is compiled there from the vendored source against the build's shared
libraries (one g++ call). Runs the generator inside the reference's venv (numpy, gguf-py).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "target" / "bench-embed"

LAYERS, DIM, HEADS, FFN, VOCAB, CTX = 12, 768, 12, 3072, 30522, 512


def log(msg):
    print(f"[bench-embed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def words():
    """The vocabulary's whole words: syllable pairs and triples, in a fixed order."""
    cons = "bcdfghjklmnprstvwz"
    vows = "aeiou"
    syl = [c + v for c in cons for v in vows]  # 90
    out = []
    for a in syl:
        for b in syl:
            out.append(a + b)
    for a in syl:
        for b in syl[:40]:
            for c in syl[:8]:
                out.append(a + b + c)
    return out


def vocab():
    """A BERT vocabulary as the converter writes it (phantom-space words, `##` dropped from
    pieces): [PAD], [unused*], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, characters,
    pieces, words; padded to VOCAB."""
    toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] * len(toks)
    chars = [chr(c) for c in range(33, 127)]
    for c in chars:
        toks.append(c if not c.isalnum() else "\u2581" + c)
        types.append(1)
    for c in "abcdefghijklmnopqrstuvwxyz":
        toks.append(c)  # a word piece (`##c`)
        types.append(1)
    for w in words():
        if len(toks) == VOCAB:
            break
        toks.append("\u2581" + w)
        types.append(1)
    assert len(toks) == VOCAB, len(toks)
    return toks, types


def make_twin(path, np, gguf):
    """The F16 twin at `path` (random weights, seeded)."""
    rng = np.random.default_rng(51)
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("bge-base-twin")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.CLS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    toks, types = vocab()
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_unk_token_id(100)
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    w.add_bos_token_id(101)  # [CLS]
    w.add_mask_token_id(103)

    def mat(name, rows, cols, scale=0.02):
        # ggml's [cols, rows]: numpy (rows, cols).
        a = (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16)
        w.add_tensor(name, a)

    def vec(name, n, centre=0.0, spread=0.02):
        w.add_tensor(name, (centre + rng.standard_normal(n, dtype=np.float32) * spread)
                     .astype(np.float32))

    mat("token_embd.weight", VOCAB, DIM, 0.5)
    w.add_tensor("token_types.weight",
                 (rng.standard_normal((2, DIM), dtype=np.float32) * 0.5).astype(np.float32))
    mat("position_embd.weight", CTX, DIM, 0.5)
    vec("token_embd_norm.weight", DIM, 1.0, 0.1)
    vec("token_embd_norm.bias", DIM)
    for l in range(LAYERS):
        p = f"blk.{l}."
        for n in "qkv":
            mat(p + f"attn_{n}.weight", DIM, DIM, 0.06 if n != "v" else 0.02)
            vec(p + f"attn_{n}.bias", DIM)
        mat(p + "attn_output.weight", DIM, DIM)
        vec(p + "attn_output.bias", DIM)
        vec(p + "attn_output_norm.weight", DIM, 1.0, 0.1)
        vec(p + "attn_output_norm.bias", DIM)
        mat(p + "ffn_up.weight", FFN, DIM)
        vec(p + "ffn_up.bias", FFN)
        mat(p + "ffn_down.weight", DIM, FFN)
        vec(p + "ffn_down.bias", DIM)
        vec(p + "layer_output_norm.weight", DIM, 1.0, 0.1)
        vec(p + "layer_output_norm.bias", DIM)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def texts(n, n_words):
    """`n` lines of `n_words` vocabulary words each (deterministic)."""
    ws = words()
    out = []
    state = 12345
    for _ in range(n):
        line = []
        for _ in range(n_words):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            line.append(ws[(state >> 33) % 8100])
        out.append(" ".join(line))
    return out


def ref_bin_dir():
    """The reference's shared build for this machine (built with llama-quantize if missing)."""
    name = f"build-{reference.tier()}{'-amx' if reference.amx() else ''}-shared"
    bin_dir = reference.REF_DIR / name / "bin"
    if not (bin_dir / "llama-quantize").exists():
        bin_dir = reference.build(["llama-quantize"], shared=True)
    return bin_dir


def ensure_ref_embedding(bin_dir):
    """llama-embedding in the reference's build, compiled there when missing."""
    exe = bin_dir / "llama-embedding"
    if exe.exists():
        return exe
    llama = reference.source_tree() / "vendor" / "llama.cpp"
    run(["g++", "-std=c++17", "-O3", "-DNDEBUG", "-DGGML_BACKEND_SHARED", "-DGGML_SHARED",
         "-DGGML_USE_CPU", "-DLLAMA_SHARED", f"-I{llama}/common", f"-I{llama}/vendor",
         f"-I{llama}/include", f"-I{llama}/ggml/include",
         llama / "examples" / "embedding" / "embedding.cpp", "-o", exe, f"-L{bin_dir}",
         "-lllama-common", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{bin_dir}"])
    return exe


def timed(cmd, env=None):
    """Wall seconds and CPU seconds (user + system) of one run of `cmd`."""
    t0 = time.perf_counter()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{cmd[0]} failed ({code}):\n{err[-3000:]}")
    return dt, usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--words", type=int, default=28, help="words per text (+ CLS and SEP)")
    ap.add_argument("--type", default="F16", help="F16, or a llama-quantize type (Q8_0)")
    ap.add_argument("--ref-bin", type=Path, help="llama-embedding to run")
    ap.add_argument("--kiln", type=Path, help="kiln binary [default: build it]")
    ap.add_argument("--kiln-before", type=Path,
                    help="another kiln binary (an earlier build) run in the same rounds")
    ap.add_argument("--ref-args", default="", help="extra llama-embedding arguments")
    args = ap.parse_args()

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    twin = OUT_DIR / "bge-base-twin-f16.gguf"
    if not twin.exists():
        # numpy and gguf-py: the reference's venv and source tree.
        bin_dir = reference.venv([("numpy", "numpy")])
        gguf_py = reference.source_tree() / "vendor" / "llama.cpp" / "gguf-py"
        code = (f"import sys; sys.path[:0] = [{str(gguf_py)!r}, {str(Path(__file__).parent)!r}];"
                f"import importlib.util as u; s = u.spec_from_file_location('be', {__file__!r});"
                f"m = u.module_from_spec(s); s.loader.exec_module(m);"
                f"import numpy, gguf; m.make_twin({str(twin) + '.tmp'!r}, numpy, gguf)")
        run([bin_dir / "python", "-c", code])
        os.replace(str(twin) + ".tmp", twin)
    ref = args.ref_bin or ensure_ref_embedding(ref_bin_dir())
    model = twin
    if args.type.upper() != "F16":
        model = OUT_DIR / f"bge-base-twin-{args.type.lower()}.gguf"
        if not model.exists():
            run([ref.parent / "llama-quantize", twin, model, args.type.upper()],
                stdout=subprocess.DEVNULL)
    lines = texts(args.texts, args.words)
    prompts = OUT_DIR / f"texts-{args.texts}x{args.words}.txt"
    prompts.write_text("\n".join(lines) + "\n")
    kiln = args.kiln
    if kiln is None:
        run(["cargo", "build", "--release", "--quiet"], cwd=REPO)
        kiln = REPO / "target" / "release" / "kiln"

    env = dict(os.environ, LD_LIBRARY_PATH=str(ref.parent))
    engines = {
        "kiln": [kiln, "embedding", "-m", model, "-f", prompts, "-t", args.threads],
        "llama-embedding": [ref, "-m", model, "-f", prompts, "-t", args.threads,
                            *args.ref_args.split()],
    }
    if args.kiln_before:
        engines["kiln-before"] = [args.kiln_before, *engines["kiln"][1:]]
    times = {k: [] for k in engines}
    cpu_times = {k: [] for k in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for name in order:
            dt, cpu_s = timed(engines[name], env)
            times[name].append(dt)
            cpu_times[name].append(cpu_s)
            log(f"round {r + 1}: {name} {dt:.2f} s wall, {cpu_s:.2f} s CPU")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"bge-base-shaped twin ({args.type.upper()}), {args.texts} texts of {args.words} words "
          f"(+ CLS, SEP), {args.threads} threads, {args.rounds} rounds alternating; "
          f"{cpu}, kiln {commit}, {time.strftime('%Y-%m-%d')}")
    print(f"{'engine':<16} {'best wall s':>11} {'median wall s':>13} {'texts/s':>8} "
          f"{'best CPU s':>10} {'texts/CPU-s':>11}")
    best, best_cpu = {}, {}
    for name, ts in times.items():
        best[name], best_cpu[name] = min(ts), min(cpu_times[name])
        print(f"{name:<16} {best[name]:11.2f} {statistics.median(ts):13.2f} "
              f"{args.texts / best[name]:8.1f} {best_cpu[name]:10.2f} "
              f"{args.texts / best_cpu[name]:11.1f}")
    for name in [n for n in engines if n != "llama-embedding"]:
        print(f"ratio {name} / llama-embedding: {best['llama-embedding'] / best[name]:.2f}x by "
              f"wall time, {best_cpu['llama-embedding'] / best_cpu[name]:.2f}x by CPU time "
              f"(best runs)")


if __name__ == "__main__":
    main()
