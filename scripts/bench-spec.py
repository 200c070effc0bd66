#!/usr/bin/env python3
"""Speculative decoding against plain decoding, side by side, from one run.

For every model and prompt, runs `kiln run --json` without speculation and with each
speculation setting, alternating round by round (so load from other processes hits both alike),
checks that every setting printed the same text as plain decoding, and prints one table of
generation tokens/s (median over rounds), the ratio, and the drafts accepted.

    scripts/bench-spec.py                                   # both real models, both prompts
    scripts/bench-spec.py --rounds 5 -t 2 --temp 0.8 --seed 7
    scripts/bench-spec.py --models path/to/model.gguf --spec "-md path/to/draft.gguf"

The prompts: "copy" asks for a paragraph back word for word (what prompt lookup is for),
"story" asks for new text (what it cannot guess). Benchmarks, not tests: nothing asserts on
speed. Needs python3 (stdlib only) and cargo; models in $KILN_MODELS (default
~/.cache/kiln/models, `kiln pull --all` when missing).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("KILN_MODELS", Path.home() / ".cache" / "kiln" / "models"))
MODELS = {
    "SmolLM2-135M Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "Gemma-3-270M Q4_K_M": "gemma-3-270m-q4_k_m.gguf",
}
PROMPTS = {
    "copy": (
        "Copy this text exactly, word for word:\n\nThe kiln is a thermally insulated chamber, "
        "a type of oven, that produces temperatures sufficient to complete some process, such "
        "as hardening, drying, or chemical changes. Kilns have been used for millennia to turn "
        "objects made from clay into pottery, tiles and bricks. Various industries use rotary "
        "kilns for pyroprocessing and to calcinate ores, such as limestone to lime for cement."
    ),
    "story": "Write a short story about a dragon who learns to bake bread.",
}


def run(kiln, model, prompt, extra, args):
    cmd = [str(kiln), "run", "-m", str(model), "-p", prompt, "-n", str(args.n_predict),
           "-t", str(args.threads), "--temp", str(args.temp), "--seed", str(args.seed), "--json",
           *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    text = "".join(l["text"] for l in lines[:-1])
    return text, lines[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated GGUF paths (default: the two real models)")
    ap.add_argument("--spec", action="append",
                    help='speculation flags to compare (repeatable; default "--spec-type ngram-simple")')
    ap.add_argument("--prompts", default="copy,story")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=200)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    specs = args.spec or ["--spec-type ngram-simple"]
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=REPO, check=True)
    kiln = REPO / "target" / "release" / "kiln"
    if args.models:
        models = {Path(p).name: Path(p) for p in args.models.split(",")}
    else:
        models = {name: MODELS_DIR / f for name, f in MODELS.items()}
    settings = [("plain", ["--spec-type", "none"])] + [(s, s.split()) for s in specs]
    print(f"| model | prompt | setting | tok/s (median of {args.rounds}) | / plain | drafts accepted |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for mname, mpath in models.items():
        for pname in args.prompts.split(","):
            prompt = PROMPTS[pname]
            tps = {s: [] for s, _ in settings}
            texts, last = {}, {}
            for _ in range(args.rounds):
                for s, extra in settings:
                    text, stats = run(kiln, mpath, prompt, extra, args)
                    tps[s].append(stats["gen_tps"])
                    texts[s], last[s] = text, stats
            base = statistics.median(tps["plain"])
            for s, _ in settings:
                if texts[s] != texts["plain"]:
                    sys.exit(f"{mname} {pname} {s}: the text differs from plain decoding")
                med = statistics.median(tps[s])
                sp = last[s].get("speculative")
                acc = f"{sp['accepted']} / {sp['drafted']}" if sp else ""
                print(f"| {mname} | {pname} | {s} | {med:.1f} | {med / base:.2f}× | {acc} |")


if __name__ == "__main__":
    main()
