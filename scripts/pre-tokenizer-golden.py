#!/usr/bin/env python3
"""The reference's token ids for the pre-tokenizers that have no test vectors of their own.

llama.cpp's source package ships `models/ggml-vocab-*.gguf` with test vectors for many
pre-tokenizers but none for `gpt-4o` (o200k), `tekken` or `deepseek-v3`. This script takes a
vocabulary that has vectors, rewrites its `tokenizer.ggml.pre` to each of those names, and records
what the reference's `llama-tokenize` makes of a set of tricky texts (every vector text of the
package plus a few of its own), without and with special tokens added. The result is
`tests/golden/pre_tokenizers.json`; `tests/tokenizer_vectors.rs` rewrites the same key with
kiln's GgufWriter and compares.

    scripts/pre-tokenizer-golden.py

Needs the reference's `llama-tokenize` (scripts/reference.py builds it).
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "golden" / "pre_tokenizers.json"
SEPARATOR = "\n__ggml_vocab_test__\n"
# How many of the texts are also tokenized with special tokens added.
N_SPECIAL = 6

# (pre-tokenizer, the vocabulary whose `tokenizer.ggml.pre` is rewritten to it)
CASES = [
    ("gpt-4o", "ggml-vocab-llama-bpe.gguf"),
    ("tekken", "ggml-vocab-llama-bpe.gguf"),
    ("deepseek-v3", "ggml-vocab-deepseek-llm.gguf"),
]

EXTRA_TEXTS = [
    "HelloWorld XMLHttpRequest iPhone McDONALD's",
    "DON'T I'LL we'RE they've She'd",
    "Ünïcödé ÀB Éa ÉCOLE école",
    "1 22 333 4444 55555 666666 1234567890",
    "a/b//c\n/// x\r\n\r\ny",
    "tab\tsep\u000bvt\u000cff",
    "no\u00a0break\u3000ideo\u2003em space",
    "日本語のテキスト、カタカナ。한국어 텍스트",
    "e\u0301 a\u0308 n\u0303o combining",
    "x  y   z    \n  \n\n   ",
    "$100.00 +5% <tag> a^b ~c |d| `code`",
    "«guillemets» “quotes” ‘single’ — dash… ellipsis",
    "😀 emoji 👍🏽 mixed😀text",
    "Ⅻ ½ ² ३४५ ١٢٣",
    "   leading and trailing   ",
]


def rewrite_pre(src: Path, dst: Path, pre: str):
    """Copy a GGUF file with its `tokenizer.ggml.pre` string replaced (the vocabularies hold
    no tensors, so nothing after the metadata moves)."""
    b = src.read_bytes()
    magic, version = struct.unpack_from("<4sI", b, 0)
    assert magic == b"GGUF" and version >= 2, src
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    assert n_tensors == 0, f"{src} has tensors"
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_str(p):
        (n,) = struct.unpack_from("<Q", b, p)
        return b[p + 8:p + 8 + n], p + 8 + n

    def skip_value(t, p):
        if t in sizes:
            return p + sizes[t]
        if t == 8:
            return read_str(p)[1]
        assert t == 9, t
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        if et in sizes:
            return p + sizes[et] * n
        for _ in range(n):
            p = skip_value(et, p)
        return p

    for _ in range(n_kv):
        key, p = read_str(pos)
        (t,) = struct.unpack_from("<I", b, p)
        vstart = p + 4
        vend = skip_value(t, vstart)
        if key == b"tokenizer.ggml.pre":
            assert t == 8
            v = pre.encode()
            dst.write_bytes(b[:vstart] + struct.pack("<Q", len(v)) + v + b[vend:])
            return
        pos = vend
    raise SystemExit(f"{src} has no tokenizer.ggml.pre")


def tokenize(tool, model, text, special):
    args = [tool, "-m", model, "--stdin", "--no-escape", "--ids", "--log-disable",
            "--no-parse-special"]
    if not special:
        args.append("--no-bos")
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(tool).parent))
    r = subprocess.run(args, input=text.encode(), capture_output=True, env=env, check=True)
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main():
    built = reference.REF_DIR / f"build-{reference.tier()}-shared" / "bin"
    if (built / "llama-tokenize").exists():
        bin_dir = built
    else:
        bin_dir = reference.build(["llama-tokenize"], shared=True)
    tool = str(bin_dir / "llama-tokenize")
    models = reference.source_tree() / "vendor" / "llama.cpp" / "models"
    texts = []
    for inp in sorted(models.glob("ggml-vocab-*.gguf.inp")):
        for t in inp.read_text(encoding="utf-8").split(SEPARATOR):
            if t not in texts:
                texts.append(t)
    texts += [t for t in EXTRA_TEXTS if t not in texts]
    cases = []
    with tempfile.TemporaryDirectory(prefix="kiln-pre-") as tmp:
        for pre, vocab in CASES:
            path = Path(tmp) / f"{pre}.gguf"
            rewrite_pre(models / vocab, path, pre)
            ids = [tokenize(tool, str(path), t, False) for t in texts]
            # The BOS / EOS policy does not depend on the text: a few suffice.
            ids_special = [tokenize(tool, str(path), t, True) for t in texts[:N_SPECIAL]]
            cases.append({"pre": pre, "vocab": vocab, "ids": ids, "ids_special": ids_special})
            print(f"{pre} on {vocab}: {len(texts)} texts", file=sys.stderr)
    doc = {
        "about": "llama-tokenize (llama-cpp-python 0.3.36's llama.cpp) on each vocabulary with "
                 "tokenizer.ggml.pre rewritten; ids: --no-bos --no-parse-special; ids_special (the "
                 "first texts only): the model's BOS/EOS policy, --no-parse-special. Made by "
                 "scripts/pre-tokenizer-golden.py.",
        "texts": texts,
        "cases": cases,
    }
    OUT.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
