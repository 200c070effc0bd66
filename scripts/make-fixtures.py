#!/usr/bin/env python3
"""Regenerate the test fixtures and the reference engine's outputs for them.

The test suite checks kiln against llama.cpp on small random-weight models that it makes itself
(`kiln::fixtures`): nothing binary is committed. This script is how those models and the
reference's answers on them come to be:

1. builds the reference (llama.cpp from the `llama-cpp-python` source package, for this
   machine's instruction-set tier; see scripts/reference.py): `llama-quantize`,
   `llama-perplexity` and the shared libraries its Python bindings load;
2. writes the F32 random models with kiln's generator
   (`cargo run --release --example fixtures -- recipes DIR`);
3. quantizes them with `llama-quantize` into every block format the tests cover;
4. records in `tests/golden/models.json` how each file is made (recipe, or source + file type +
   each tensor's format) and the sha256 of the file the reference wrote;
5. runs the reference on every file: `tests/golden/<model>/logits.jsonl` (top-10 logits at each
   position of the golden prompts, 16 greedy tokens) and `tests/golden/dequant.json` (ggml's own
   dequantization of three tensors of every random-llama file, and of two MXFP4 expert tensors)
   and `tests/golden/iq_blocks.json` (blocks of the i-quants no random model holds, made by
   ggml's own quantizer, and ggml's dequantization of them);
6. checks that kiln makes every file byte for byte as the reference wrote it
   (`cargo run --release --example fixtures -- check`);
7. writes `tests/golden/<model>/logprobs.jsonl` for the models in LOGPROB_MODELS (and, with
   `--real`, the real models): the reference's top-5 log-probabilities (log-softmax of its raw
   logits, in float64) after each position of the golden prompts and at each of its greedy
   steps, which `tests/logprobs.rs` compares with what `kiln serve` reports.
   Also `tests/golden/<model>/perplexity.json` (llama-perplexity, n_ctx 512, 12 chunks) for
   the random models in PERPLEXITY_MODELS.
8. computes the reference's embeddings of the golden prompts on a few of them
   (`tests/golden/<model>/embeddings.json`: mean, cls and last pooling, the pooled vectors as
   `llama_get_embeddings_seq` returns them, before normalization), and the reranker's scores
   (`tests/golden/<model>/rerank.json`: rank pooling of query-document prompts made as
   llama-server's `format_prompt_rerank` makes them).

With `--real` it also regenerates the real models' goldens (SmolLM2, Gemma-3: tokenizer ids,
logits, the long prompt, perplexity), downloading the models as `kiln pull` does. Checked on
2026-11-24 against the committed ones (an AVX-512 build of llama-cpp-python 0.3.36's llama.cpp):
tokenizer ids, prompt ids, the short prompts' logits and both perplexities come out identical;
Gemma-3's long prompt too; SmolLM2's long prompt differs at 4 of 2,618 near-tied positions
(top-1 logits within 0.5) and in its greedy tail, so those committed files were made with a
slightly different context setup. Regenerate them only on purpose.

    scripts/make-fixtures.py                 # random models: manifest, logits, dequant
    scripts/make-fixtures.py --real          # and the real models' goldens
    scripts/make-fixtures.py --out /tmp/g    # write goldens elsewhere (to compare)
    scripts/make-fixtures.py --only-logprobs [--real]   # just the log-probability goldens
    scripts/make-fixtures.py --only-embeddings   # the models, checked; then only step 8
    scripts/make-fixtures.py --only-embeddings --out /tmp/g   # step 8 elsewhere: copy one
                                                 # model's embeddings.json from there
    scripts/make-fixtures.py --only-iq2-blocks   # only tests/golden/iq2_blocks.json

Needs python3, a C/C++ compiler, cargo, and PyPI (the sdist; cmake, ninja, numpy and the
bindings' dependencies into a private venv). Takes ~15 minutes on 2 cores the first time
(the reference build), ~1 minute after.
"""

import argparse
import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
# (module, pip package) the bindings and gguf-py import.
PY_PACKAGES = [("numpy", "numpy"), ("jinja2", "jinja2"), ("diskcache", "diskcache"),
               ("typing_extensions", "typing_extensions"), ("yaml", "pyyaml"),
               ("requests", "requests"), ("tqdm", "tqdm")]

# name -> (recipe, llama-quantize type, --pure). The F32 models are `random-<recipe>-f32`.
VARIANTS = {
    "random-llama-f16": ("llama", "F16", True),
    "random-llama-bf16": ("llama", "BF16", True),
    "random-llama-q8_0": ("llama", "Q8_0", True),
    "random-llama-q4_0": ("llama", "Q4_0", True),
    "random-llama-q4_1": ("llama", "Q4_1", True),
    "random-llama-q5_0": ("llama", "Q5_0", True),
    "random-llama-q5_1": ("llama", "Q5_1", True),
    "random-llama-q2_k": ("llama", "Q2_K", True),
    "random-llama-q3_k": ("llama", "Q3_K", True),
    "random-llama-q4_k": ("llama", "Q4_K", True),
    "random-llama-q5_k": ("llama", "Q5_K", True),
    "random-llama-q6_k": ("llama", "Q6_K", True),
    "random-llama-iq4_nl": ("llama", "IQ4_NL", True),
    "random-llama-iq4_xs": ("llama", "IQ4_XS", True),
    # IQ3_S: the one 3-bit i-quant llama-quantize makes without an importance matrix
    # (IQ3_XXS and the 2- and 1-bit ones it refuses without).
    "random-llama-iq3_s": ("llama", "IQ3_S", True),
    "random-qwen2-q4_0": ("qwen2", "Q4_0", True),
    # Not --pure: llama-quantize's own Q4_K_M mix (Q6_K for some v and ffn_down matrices).
    "random-qwen3-q4_k_m": ("qwen3", "Q4_K_M", False),
    "random-gpt2-q8_0": ("gpt2", "Q8_0", True),
    # Mixtures of experts: every expert of the 3-D tensors quantized (the routers stay F32).
    "random-qwen3moe-q8_0": ("qwen3moe", "Q8_0", True),
    "random-olmoe-q4_k_m": ("olmoe", "Q4_K_M", False),
    "random-qwen2moe-q4_0": ("qwen2moe", "Q4_0", True),
    # gpt-oss as shipped: the experts in MXFP4, every other matrix Q8_0 (llama-quantize's
    # MXFP4_MOE); and its own Q4_K_M mix.
    "random-gpt-oss-mxfp4": ("gpt-oss", "MXFP4_MOE", False),
    "random-gpt-oss-q4_k_m": ("gpt-oss", "Q4_K_M", False),
}
RECIPES = ["llama", "qwen2", "qwen3", "gpt2", "qwen3moe", "olmoe", "qwen2moe", "llama-yarn", "phi3",
           "smollm3", "gpt-oss", "gemma2", "granite", "mistral3", "olmo2", "olmo3", "exaone",
           "exaone4"]
# Encoders: no logits, only embeddings (their recipes declare cls and mean pooling).
ENCODER_RECIPES = ["bert", "nomic-bert", "bert-rerank", "jina-bert-v2"]
DEQUANT_TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"]
# Formats no random-llama file holds: these tensors of these files too.
DEQUANT_EXTRA = {"random-gpt-oss-mxfp4": ["blk.0.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight"]}
# The random models with a log-probability golden (one per architecture, and two formats).
LOGPROB_MODELS = ["random-llama-f32", "random-llama-q4_0", "random-qwen2-f32",
                  "random-qwen3-q4_k_m", "random-gpt2-f32"]
LOGPROB_TOP = 5
# The random models with a perplexity golden (n_ctx 512: prompt batches of 512 take the
# reference's tiled attention, which the short golden prompts never reach).
PERPLEXITY_MODELS = ["random-gemma2-f32", "random-mistral3-f32", "random-olmo2-f32",
                     "random-olmo3-f32", "random-gpt-oss-mxfp4", "random-olmoe-q4_k_m"]

# Embedding goldens: these models, the golden prompts, llama.cpp's pooling types by value.
EMBED_MODELS = ["random-llama-f32", "random-qwen2-f32", "random-qwen3-f32", "random-gpt2-f32",
                "random-llama-q8_0", "random-bert-f32", "random-nomic-bert-f32",
                "random-jina-bert-v2-f32"]
POOLINGS = {"mean": 1, "cls": 2, "last": 3}
# Rerank goldens: these rerankers; each of RERANK_QUERIES (indices of the golden prompts)
# against every golden prompt as a document.
RERANK_MODELS = ["random-bert-rerank-f32"]
RERANK_QUERIES = [0, 3]
POOLING_RANK = 4

# The real models: golden directory -> kiln's short name.
REAL = {
    "smollm2-135m-instruct-q4_1": "smollm2",
    "gemma3-270m-q4_k_m": "gemma3",
}

log = reference.log


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def in_venv():
    return Path(sys.prefix).resolve() == reference.VENV.resolve()


# ---------------------------------------------------------------------------------------------
# The models and the manifest


def make_models(bin_dir, work):
    run_env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    reference.run(["cargo", "run", "--release", "--quiet", "--example", "fixtures", "--",
                   "recipes", work], cwd=REPO)
    for name, (recipe, qtype, pure) in VARIANTS.items():
        src = work / f"random-{recipe}-f32.gguf"
        cmd = [bin_dir / "llama-quantize", *(["--pure"] if pure else []), src,
               work / f"{name}.gguf", qtype]
        reference.run(cmd, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def gguf_reader(path):
    import gguf  # noqa: vendored gguf-py, on sys.path (see main)
    return gguf.GGUFReader(str(path))


def write_manifest(work):
    models = {}
    for recipe in RECIPES + ENCODER_RECIPES:
        p = work / f"random-{recipe}-f32.gguf"
        models[p.stem] = {"recipe": recipe, "sha256": sha256(p), "bytes": p.stat().st_size}
    for name, (recipe, _, _) in VARIANTS.items():
        p = work / f"{name}.gguf"
        r = gguf_reader(p)
        ftype = int(r.fields["general.file_type"].parts[-1][0])
        tensors = [[t.name, t.tensor_type.name] for t in r.tensors]
        models[name] = {"from": f"random-{recipe}-f32", "ftype": ftype, "tensors": tensors,
                        "sha256": sha256(p), "bytes": p.stat().st_size}
    text = json.dumps({"models": dict(sorted(models.items()))}, indent=1)
    # One tensor per line keeps the file short to read and its diffs meaningful.
    text = re.sub(r'\[\n\s+("[^"]+"),\n\s+("[^"]+")\n\s+\]', r"[\1, \2]", text)
    (GOLDEN / "models.json").write_text(text + "\n")
    log(f"wrote {GOLDEN / 'models.json'} ({len(models)} models)")


# ---------------------------------------------------------------------------------------------
# The reference engine through its Python bindings (llama_cpp, from the same sdist)


def _quiet(level, text, user_data):
    pass


_QUIET = None  # the C callback, kept alive for the process (set in main)


class Ref:
    """One loaded model and context; logits of every position, greedy continuation."""

    def __init__(self, path, n_ctx, threads=2, pooling=None):
        import numpy as np
        import llama_cpp.llama_cpp as L
        self.L, self.np = L, np
        L.llama_log_set(_QUIET, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"the reference cannot load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_threads = threads
        cp.n_threads_batch = threads
        if pooling is not None:
            cp.embeddings = True
            cp.pooling_type = pooling
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.batch = L.llama_batch_init(512, 0, 1)

    def close(self):
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def tokenize(self, text, add_special, parse_special=False):
        b = text.encode()
        cap = len(b) + 16
        buf = (self.L.llama_token * cap)()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, cap, add_special, parse_special)
        if n < 0:
            raise SystemExit(f"tokenize failed ({n})")
        return list(buf[:n])

    def detokenize(self, ids):
        out = b""
        buf = ctypes.create_string_buffer(256)
        for t in ids:
            n = self.L.llama_token_to_piece(self.vocab, t, buf, 256, 0, False)
            out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")

    def clear(self):
        mem = self.L.llama_get_memory(self.ctx)
        self.L.llama_memory_clear(mem, True)

    def decode(self, chunk, pos0):
        """Decode `chunk` (at most 512 tokens) of sequence 0 from position `pos0`, every
        token an output."""
        for i, t in enumerate(chunk):
            self.batch.token[i] = t
            self.batch.pos[i] = pos0 + i
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
            self.batch.logits[i] = 1
        self.batch.n_tokens = len(chunk)
        if self.L.llama_decode(self.ctx, self.batch) != 0:
            raise SystemExit("llama_decode failed")

    def eval(self, ids, pos0, on_logits):
        """Decode `ids` from position `pos0`, calling on_logits(i, logits) for every token."""
        L = self.L
        for start in range(0, len(ids), 512):
            chunk = ids[start:start + 512]
            self.decode(chunk, pos0 + start)
            for i in range(len(chunk)):
                ptr = L.llama_get_logits_ith(self.ctx, i)
                on_logits(start + i, self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)))

    def pooled(self, ids):
        """The sequence embedding of `ids` (one ubatch), as llama_get_embeddings_seq gives it."""
        L = self.L
        if len(ids) > 512:
            raise SystemExit("an embedding prompt must fit one batch of 512")
        self.clear()
        self.decode(ids, 0)
        ptr = L.llama_get_embeddings_seq(self.ctx, 0)
        if not ptr:
            raise SystemExit("the reference gave no sequence embedding")
        n = L.llama_model_n_embd(self.model)
        return [float(x) for x in self.np.ctypeslib.as_array(ptr, shape=(n,))]

    def top(self, logits, k):
        np = self.np
        idx = np.argsort(-logits, kind="stable")[:k]
        return [[int(i), float(f"{float(logits[i]):.6g}")] for i in idx]

    def golden_line(self, ids, k, n_gen):
        """prompt_top (top-k after each prompt position) and the greedy continuation."""
        self.clear()
        tops, last = [], []

        def keep(i, logits):
            tops.append(self.top(logits, k))
            if i == len(ids) - 1:
                last.append(logits.copy())

        self.eval(ids, 0, keep)
        gen, logits = [], last[0]
        for step in range(n_gen):
            t = int(self.np.argmax(logits))
            if self.L.llama_vocab_is_eog(self.vocab, t):
                break
            gen.append(t)
            if step + 1 < n_gen:
                out = []
                self.eval([t], len(ids) + step, lambda _i, l: out.append(l.copy()))
                logits = out[0]
        return {"prompt_ids": ids, "prompt_top": tops, "gen_ids": gen,
                "gen_text": self.detokenize(gen)}


def log_softmax_top(logits, k):
    """The top-k tokens (ties: lower id first) and their log-softmax, in float64."""
    import numpy as np
    x = logits.astype(np.float64)
    m = x.max()
    norm = m + np.log(np.exp(x - m).sum())
    idx = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(f"{x[i] - norm:.7g}")] for i in idx]


def logprob_line(ref, ids, k, n_gen):
    """prompt_top: top-k log-probabilities after each prompt position; gen_ids: the greedy
    continuation; gen_top[i]: the top-k of the distribution gen_ids[i] was chosen from."""
    np = ref.np
    ref.clear()
    tops, last = [], []

    def keep(i, logits):
        tops.append(log_softmax_top(logits, k))
        if i == len(ids) - 1:
            last.append(logits.copy())

    ref.eval(ids, 0, keep)
    gen, gen_top, logits = [], [], last[0]
    for step in range(n_gen):
        t = int(np.argmax(logits))
        if ref.L.llama_vocab_is_eog(ref.vocab, t):
            break
        gen.append(t)
        gen_top.append(log_softmax_top(logits, k))
        if step + 1 < n_gen:
            out = []
            ref.eval([t], len(ids) + step, lambda _i, l: out.append(l.copy()))
            logits = out[0]
    return {"prompt_ids": ids, "prompt_top": tops, "gen_ids": gen, "gen_top": gen_top}


def logprobs_golden(path, out_dir, texts, n_gen):
    ref = Ref(path, 4096)
    rows = [logprob_line(ref, ref.tokenize(p, True), LOGPROB_TOP, n_gen)
            for p in texts["prompts"]]
    ref.close()
    write_jsonl(out_dir / "logprobs.jsonl", rows)


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    log(f"wrote {path}")


def logits_goldens(path, out_dir, texts, top_k, n_gen, long_prompt=False):
    prompts = texts["prompts"]
    ref = Ref(path, 4096)
    rows = [ref.golden_line(ref.tokenize(p, True), top_k, n_gen) for p in prompts]
    write_jsonl(out_dir / "logits.jsonl", rows)
    if long_prompt:
        ids = ref.tokenize(texts["long_prompt"], True)
        write_jsonl(out_dir / "long.jsonl", [ref.golden_line(ids, 5, 16)])
    ref.close()


def write_rows_json(path, head, method, rows, row_key):
    """`head`, the `method` that made the golden and its `rows`, as compact JSON with one row
    (an object whose first key is `row_key`) a line: short diffs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**head, "method": method, "rows": rows}, separators=(",", ":"))
    text = text.replace(f',{{"{row_key}"', f',\n{{"{row_key}"')
    path.write_text(text + "\n")
    log(f"wrote {path}")


def embeddings_golden(path, out_dir, texts):
    """The reference's pooled embeddings of the golden prompts, per pooling type."""
    rows, n_embd = [], None
    for name, ptype in POOLINGS.items():
        ref = Ref(path, 512, pooling=ptype)
        for i, p in enumerate(texts["prompts"]):
            # As llama-server tokenizes embedding inputs: special tokens added and parsed.
            ids = ref.tokenize(p, True, True)
            v = ref.pooled(ids)
            n_embd = len(v)
            rows.append({"pooling": name, "prompt_index": i, "ids": ids,
                         "embedding": [float(f"{x:.7g}") for x in v]})
        ref.close()
    method = ("llama.cpp context with embeddings=true and pooling_type set; each prompt decoded "
              "alone in one batch (all tokens output) from an empty cache; "
              "llama_get_embeddings_seq(ctx, 0), not normalized")
    write_rows_json(out_dir / "embeddings.json", {"n_embd": n_embd}, method, rows, "pooling")


def tokenize_golden(path, out_dir, texts):
    ref = Ref(path, 512)
    rows = [{"text_index": i, "ids": ref.tokenize(t, False), "ids_special": ref.tokenize(t, True)}
            for i, t in enumerate(texts["tokenize"])]
    ref.close()
    write_jsonl(out_dir / "tokenize.jsonl", rows)


def perplexity_golden(bin_dir, path, out_dir):
    corpus = GOLDEN / "corpus_pydoc.txt"
    cmd = [bin_dir / "llama-perplexity", "-m", path, "-f", corpus, "-c", "512", "-b", "512",
           "--chunks", "12", "-t", "2"]
    log("$ " + " ".join(map(str, cmd)))
    # Its logger writes from a thread of its own, and loses what it has not written when the
    # process exits: on two cores, with the OpenMP threads spinning, that was the last chunk
    # and the final estimate (the process exiting 0 without them). Passive OpenMP threads
    # leave it the time (the arithmetic is the same); run again if the lines still miss.
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir), OMP_WAIT_POLICY="passive")
    for _attempt in range(6):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
        text = p.stdout + p.stderr
        running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+)", text)]
        final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
        if p.returncode != 0 or (final and len(running) == 12):
            break
    if p.returncode != 0 or not final or len(running) != 12:
        raise SystemExit(f"llama-perplexity failed:\n{text[-2000:]}")
    out = {
        "corpus": corpus.name, "n_ctx": 512, "n_batch": 512, "chunks": 12,
        "method": "llama.cpp perplexity: text tokenized whole (BOS per model); for each chunk "
                  "of n_ctx tokens (first token replaced by BOS when the model adds one) score "
                  "the log-likelihood of the second half of the chunk (tokens n_ctx/2..n_ctx-1); "
                  "running PPL after each chunk",
        "running_ppl": running, "final_ppl": float(final.group(1)),
        "stderr": float(final.group(2)),
    }
    (out_dir / "perplexity.json").write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {out_dir / 'perplexity.json'}")


class GgmlTypeTraits(ctypes.Structure):
    """ggml's `struct ggml_type_traits`."""
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


# ggml's `ggml_to_float_t`: (blocks, values out, element count).
TO_FLOAT_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                              ctypes.c_int64)


def ggml_base(bin_dir):
    """The reference's `libggml-base`, with the signatures the goldens call: the type traits,
    `ggml_quantize_requires_imatrix` and `ggml_quantize_chunk` (its pointers as `void *`, so
    ctypes arrays, buffers, numpy addresses and None all pass)."""
    ggml = ctypes.CDLL(str(bin_dir / "libggml-base.so"))
    ggml.ggml_get_type_traits.restype = ctypes.POINTER(GgmlTypeTraits)
    ggml.ggml_get_type_traits.argtypes = [ctypes.c_int]
    ggml.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    ggml.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    return ggml


def dequant_golden(bin_dir, work, out_path):
    """ggml's own `to_float` on three tensors of every random-llama file."""
    import numpy as np

    ggml = ggml_base(bin_dir)
    out = {}
    names = [n for n in [*VARIANTS, "random-llama-f32"] if n.startswith("random-llama")]
    for name in sorted([*names, *DEQUANT_EXTRA]):
        wanted = DEQUANT_EXTRA.get(name, DEQUANT_TENSORS)
        path = work / f"{name}.gguf"
        r = gguf_reader(path)
        raw = path.read_bytes()
        entry = {}
        for t in r.tensors:
            if t.name not in wanted:
                continue
            n = int(t.n_elements)
            data = raw[t.data_offset:t.data_offset + t.n_bytes]
            traits = ggml.ggml_get_type_traits(int(t.tensor_type)).contents
            if traits.to_float:
                vals = (ctypes.c_float * n)()
                TO_FLOAT_T(traits.to_float)(data, vals, n)
                v = np.ctypeslib.as_array(vals).astype(np.float64)
            else:  # F32: ggml has nothing to convert
                v = np.frombuffer(data, dtype="<f4").astype(np.float64)
            entry[t.name] = {
                "type": t.tensor_type.name, "ne": [int(x) for x in t.shape], "n": n,
                "first": [float(x) for x in v[:64]], "sum": float(v.sum()),
                "sum_sq": float((v * v).sum()), "data_offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
            }
        out[f"{name}.gguf"] = dict(sorted(entry.items(), key=lambda kv: wanted.index(kv[0])))
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {out_path}")


# The 2-bit i-quants, which no fixture holds (llama-quantize wants an importance matrix for two of
# them): blocks made by ggml's own quantizer, and ggml's `to_float` of them and of random bytes.
# name -> (ggml type id, the quantizer needs an importance matrix).
IQ2_BLOCK_TYPES = {"IQ2_XXS": (16, True), "IQ2_XS": (17, True), "IQ2_S": (22, False)}


def iq2_blocks_golden(bin_dir, out_path):
    """`tests/golden/iq2_blocks.json`: for each 2-bit i-quant, 4 super-blocks (two from
    `ggml_quantize_chunk` on seeded random rows, with a seeded random importance matrix where
    the format needs one; two of random bytes under a finite f16 scale) as hex, and every value
    of ggml's `to_float` of them as the hex of its little-endian f32. Then, as rows of 512, the
    CPU backend's own `vec_dot` of each with two Q8_K activation rows (seeded random values
    through the backend's `from_float`): `acts` (hex) and `dots[row][act]` (f32 hex); and the
    backend's `ggml_mul_mat` of the two rows with 9 such activation rows (its tiled kernel's
    batch), `batch[act][row]` (f32 hex), the 9 rows' Q8_K bytes in `batch_acts`."""
    import random
    import struct

    ggml = ggml_base(bin_dir)

    class CpuTraits(ctypes.Structure):
        _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                    ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]

    cpu = ctypes.CDLL(str(bin_dir / "libggml-cpu.so"))
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(CpuTraits)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    from_float_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                    ctypes.c_int64)
    vec_dot_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float),
                                 ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    q8k = 15
    q8k_size = ggml.ggml_get_type_traits(q8k).contents.type_size

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                    ("no_alloc", ctypes.c_bool)]

    ggml.ggml_init.restype = ctypes.c_void_p
    ggml.ggml_init.argtypes = [InitParams]
    ggml.ggml_new_tensor_2d.restype = ctypes.c_void_p
    ggml.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64]
    ggml.ggml_get_data.restype = ctypes.c_void_p
    ggml.ggml_get_data.argtypes = [ctypes.c_void_p]
    ggml.ggml_mul_mat.restype = ctypes.c_void_p
    ggml.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    ggml.ggml_new_graph.restype = ctypes.c_void_p
    ggml.ggml_new_graph.argtypes = [ctypes.c_void_p]
    ggml.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    ggml.ggml_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

    def mul_mat(tid, wdata, rows, xs, nx, n):
        """ggml_mul_mat of `rows` rows of `tid` by `nx` f32 rows: [nx][rows] floats."""
        ctx = ggml.ggml_init(InitParams(64 << 20, None, False))
        a = ggml.ggml_new_tensor_2d(ctx, tid, n, rows)
        ctypes.memmove(ggml.ggml_get_data(a), bytes(wdata), len(wdata))
        b = ggml.ggml_new_tensor_2d(ctx, 0, n, nx)
        ctypes.memmove(ggml.ggml_get_data(b), xs, n * nx * 4)
        c = ggml.ggml_mul_mat(ctx, a, b)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, c)
        cpu.ggml_graph_compute_with_ctx(ctx, gf, 1)
        res = ctypes.string_at(ggml.ggml_get_data(c), rows * nx * 4)
        ggml.ggml_free(ctx)
        return [[res[4 * (j * rows + i):4 * (j * rows + i) + 4].hex() for i in range(rows)]
                for j in range(nx)]
    out = {}
    for name, (tid, needs_imatrix) in IQ2_BLOCK_TYPES.items():
        rng = random.Random(f"kiln-{name}")
        traits = ggml.ggml_get_type_traits(tid).contents
        assert traits.type_name.decode() == name.lower(), traits.type_name
        size = traits.type_size
        n_per_row, rows = 256, 2
        src = (ctypes.c_float * (n_per_row * rows))(
            *[rng.gauss(0.0, 1.0) * (4.0 if rng.random() < 0.05 else 1.0)
              for _ in range(n_per_row * rows)])
        imatrix = None
        if needs_imatrix:
            imatrix = (ctypes.c_float * n_per_row)(
                *[rng.uniform(0.05, 2.0) for _ in range(n_per_row)])
        q = ctypes.create_string_buffer(size * rows)
        done = ggml.ggml_quantize_chunk(tid, src, q, 0, rows, n_per_row, imatrix)
        assert done == size * rows, (name, done)
        data = bytearray(q.raw)
        for _ in range(2):
            blk = bytearray(rng.getrandbits(8) for _ in range(size))
            blk[:2] = struct.pack("<e", rng.choice([1, -1]) * rng.uniform(1e-4, 0.5))
            data += blk
        n = n_per_row * len(data) // size
        vals = (ctypes.c_float * n)()
        TO_FLOAT_T(traits.to_float)(bytes(data), vals, n)
        ct = cpu.ggml_get_type_traits_cpu(tid).contents
        assert ct.vec_dot_type == q8k, (name, ct.vec_dot_type)
        row = 512
        acts = b""
        for _ in range(2):
            xs = (ctypes.c_float * row)(*[rng.uniform(-1.0, 1.0) for _ in range(row)])
            qx = ctypes.create_string_buffer(row // 256 * q8k_size)
            from_float_t(cpu.ggml_get_type_traits_cpu(q8k).contents.from_float)(xs, qx, row)
            acts += qx.raw
        wrow, arow = row // 256 * size, row // 256 * q8k_size
        dots = []
        for i in range(n // row):
            line = []
            for j in range(2):
                r = ctypes.c_float()
                vec_dot_t(ct.vec_dot)(row, ctypes.byref(r), 0, bytes(data[i * wrow:(i + 1) * wrow]),
                                      0, acts[j * arow:(j + 1) * arow], 0, 1)
                line.append(struct.pack("<f", r.value).hex())
            dots.append(line)
        nx = 9
        xs = (ctypes.c_float * (row * nx))(*[rng.uniform(-1.0, 1.0) for _ in range(row * nx)])
        batch_acts = b""
        for j in range(nx):
            qx = ctypes.create_string_buffer(row // 256 * q8k_size)
            xj = ctypes.cast(ctypes.byref(xs, 4 * row * j), ctypes.POINTER(ctypes.c_float))
            from_float_t(cpu.ggml_get_type_traits_cpu(q8k).contents.from_float)(xj, qx, row)
            batch_acts += qx.raw
        batch = mul_mat(tid, data, n // row, xs, nx, row)
        out[name] = {"n": n, "quantized_blocks": rows, "bytes": data.hex(),
                     "values": struct.pack(f"<{n}f", *vals).hex(), "acts": acts.hex(),
                     "dots": dots, "batch_acts": batch_acts.hex(), "batch": batch}
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {out_path}")


# Block formats no random model holds, by ggml type id: `iq_blocks_golden` records the
# reference's own quantizer's blocks of random rows and its `to_float` of them.
IQ_BLOCK_TYPES = {"IQ3_XXS": 18, "IQ1_S": 19, "IQ3_S": 21, "IQ1_M": 29}


def iq_blocks_golden(bin_dir, out_path):
    """`tests/golden/iq_blocks.json`: for each of IQ_BLOCK_TYPES, two random rows of 512
    (a row with one zero sub-block of 32; a row whose first block is small with outliers and
    whose second is zero)
    quantized by ggml's `ggml_quantize_chunk` (with a random importance matrix where the
    format requires one, and for IQ1_M, which llama-quantize makes only with one), and ggml's `to_float` of
    those blocks: the block bytes and the values' f32 bytes, both in hex; and, for the
    formats quantized without an importance matrix (which kiln's quantizer must reproduce),
    the input rows' f32 bytes."""
    import numpy as np

    ggml = ggml_base(bin_dir)
    rng = np.random.default_rng(20261129)
    nrows, n_per_row = 2, 512
    out = {}
    for name, ty in IQ_BLOCK_TYPES.items():
        x = rng.standard_normal(nrows * n_per_row).astype(np.float32)
        x[32:64] = 0
        x[n_per_row:n_per_row + 256] *= np.float32(1e-3)
        x[n_per_row + 7] = np.float32(0.5)
        x[n_per_row + 200] = np.float32(-0.75)
        x[n_per_row + 256:] = 0
        weighted = ty == 29 or ggml.ggml_quantize_requires_imatrix(ty)
        imatrix = (rng.random(n_per_row) + 0.1).astype(np.float32) if weighted else None
        traits = ggml.ggml_get_type_traits(ty).contents
        n_bytes = nrows * n_per_row // traits.blck_size * traits.type_size
        dst = ctypes.create_string_buffer(n_bytes)
        wrote = ggml.ggml_quantize_chunk(ty, x.ctypes.data, dst, 0, nrows, n_per_row,
                                         imatrix.ctypes.data if weighted else None)
        assert wrote == n_bytes, (name, wrote, n_bytes)
        vals = (ctypes.c_float * (nrows * n_per_row))()
        TO_FLOAT_T(traits.to_float)(dst, vals, nrows * n_per_row)
        out[name] = {
            "type": name, "nrows": nrows, "n_per_row": n_per_row, "imatrix": weighted,
            **({} if weighted else {"input_f32le": x.astype("<f4").tobytes().hex()}),
            "blocks": dst.raw.hex(),
            "values_f32le": np.ctypeslib.as_array(vals).astype("<f4").tobytes().hex(),
        }
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {out_path}")


def real_model_path(name):
    kiln = REPO / "target" / "release" / "kiln"
    reference.run(["cargo", "build", "--release", "--quiet", "--bin", "kiln"], cwd=REPO)
    p = subprocess.run([str(kiln), "pull", "--quiet", name], capture_output=True, text=True,
                       check=True)
    return Path(p.stdout.strip().splitlines()[-1])


def rerank_golden(path, out_dir, texts):
    """The reference's relevance scores (rank pooling) of query-document prompts."""
    ref = Ref(path, 512, pooling=POOLING_RANK)
    L = ref.L
    n_out = L.llama_model_n_cls_out(ref.model)
    if L.llama_model_chat_template(ref.model, b"rerank"):
        raise SystemExit("rerank goldens are made without a rerank template")
    eos = L.llama_vocab_eos(ref.vocab)
    if eos == -1:
        eos = L.llama_vocab_sep(ref.vocab)
    rows = []
    for qi in RERANK_QUERIES:
        for di, doc in enumerate(texts["prompts"]):
            query = texts["prompts"][qi]
            # As llama-server's format_prompt_rerank (no rerank template): plain-text pieces.
            ids = [L.llama_vocab_bos(ref.vocab)] if L.llama_vocab_get_add_bos(ref.vocab) else []
            ids += ref.tokenize(query, False, False)
            if L.llama_vocab_get_add_eos(ref.vocab):
                ids.append(eos)
            if L.llama_vocab_get_add_sep(ref.vocab):
                ids.append(L.llama_vocab_sep(ref.vocab))
            ids += ref.tokenize(doc, False, False)
            if L.llama_vocab_get_add_eos(ref.vocab):
                ids.append(eos)
            ref.clear()
            ref.decode(ids, 0)
            ptr = L.llama_get_embeddings_seq(ref.ctx, 0)
            if not ptr:
                raise SystemExit("the reference gave no rank output")
            scores = [float(f"{float(x):.7g}") for x in ref.np.ctypeslib.as_array(ptr, shape=(n_out,))]
            rows.append({"query_index": qi, "document_index": di, "ids": ids, "scores": scores})
    ref.close()
    method = ("llama.cpp context with embeddings=true and pooling_type rank; each query-document "
              "prompt (format_prompt_rerank without a template) decoded alone in one batch from "
              "an empty cache; llama_get_embeddings_seq(ctx, 0)")
    write_rows_json(out_dir / "rerank.json", {"n_cls_out": n_out}, method, rows, "query_index")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="also the real models' goldens")
    ap.add_argument("--out", type=Path, default=GOLDEN,
                    help="where the goldens go (default tests/golden; the manifest always "
                         "goes to tests/golden/models.json)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep the model files in this directory")
    ap.add_argument("--only-logprobs", action="store_true",
                    help="write only the log-probability goldens (the models are made in a "
                         "temporary directory; the manifest and other goldens are untouched)")
    ap.add_argument("--only-embeddings", action="store_true",
                    help="make and check the models, then write only the embedding goldens")
    ap.add_argument("--only-iq2-blocks", action="store_true",
                    help="write only tests/golden/iq2_blocks.json (no models are made)")
    ap.add_argument("--no-check", action="store_true",
                    help="write the goldens even if kiln does not make every file as the "
                         "reference wrote it (while porting a quantizer; the tests will fail)")
    a = ap.parse_args()

    if not in_venv():
        # The bindings and gguf-py need numpy: continue inside the reference's venv.
        bin_dir = reference.venv(PY_PACKAGES)
        os.execv(str(bin_dir / "python"), [str(bin_dir / "python"), __file__, *sys.argv[1:]])

    bin_dir = reference.build(["llama-quantize", "llama-perplexity", "llama"], shared=True,
                              jobs=a.jobs)
    tree = reference.source_tree()
    sys.path[:0] = [str(tree), str(tree / "vendor" / "llama.cpp" / "gguf-py")]
    os.environ["LLAMA_CPP_LIB_PATH"] = str(bin_dir)
    if a.only_iq2_blocks:
        a.out.mkdir(parents=True, exist_ok=True)
        iq2_blocks_golden(bin_dir, a.out / "iq2_blocks.json")
        return
    global _QUIET
    import llama_cpp.llama_cpp as L
    _QUIET = L.llama_log_callback(_quiet)
    texts = json.loads((GOLDEN / "texts.json").read_text())

    with tempfile.TemporaryDirectory(prefix="kiln-fixtures-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        make_models(bin_dir, work)
        if a.only_logprobs:
            for name in LOGPROB_MODELS:
                logprobs_golden(work / f"{name}.gguf", a.out / name, texts, 16)
            if a.real:
                for golden_name, kiln_name in REAL.items():
                    logprobs_golden(real_model_path(kiln_name), a.out / golden_name, texts, 16)
            return
        if not a.only_embeddings:
            write_manifest(work)
        check = subprocess.run(["cargo", "run", "--release", "--quiet", "--example", "fixtures",
                                "--", "check", str(GOLDEN / "models.json"), str(work)], cwd=REPO)
        if check.returncode != 0 and not a.no_check:
            raise SystemExit("kiln does not make every fixture as the reference wrote it (above)")
        a.out.mkdir(parents=True, exist_ok=True)
        for name in EMBED_MODELS:
            embeddings_golden(work / f"{name}.gguf", a.out / name, texts)
        for name in RERANK_MODELS:
            rerank_golden(work / f"{name}.gguf", a.out / name, texts)
        if a.only_embeddings:
            return
        dequant_golden(bin_dir, work, a.out / "dequant.json")
        iq_blocks_golden(bin_dir, a.out / "iq_blocks.json")
        for name in sorted([*VARIANTS, *(f"random-{r}-f32" for r in RECIPES)]):
            logits_goldens(work / f"{name}.gguf", a.out / name, texts, 10, 16)
        for name in LOGPROB_MODELS:
            logprobs_golden(work / f"{name}.gguf", a.out / name, texts, 16)
        for name in PERPLEXITY_MODELS:
            perplexity_golden(bin_dir, work / f"{name}.gguf", a.out / name)

    if a.real:
        for golden_name, kiln_name in REAL.items():
            path = real_model_path(kiln_name)
            out_dir = a.out / golden_name
            tokenize_golden(path, out_dir, texts)
            logits_goldens(path, out_dir, texts, 20, 32, long_prompt=True)
            logprobs_golden(path, out_dir, texts, 16)
            perplexity_golden(bin_dir, path, out_dir)


if __name__ == "__main__":
    main()
