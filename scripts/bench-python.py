#!/usr/bin/env python3
"""Generation speed of the Python bindings beside `kiln run`, same model, prompt and threads.

    python3 scripts/bench-python.py [--model smollm2] [-n 128] [-t 2] [-r 5] [--kiln target/release/kiln]

Needs the bindings importable (`pip install ./python`, or PYTHONPATH at an unpacked wheel, as
tests/python_bindings.rs does). Greedy decoding of a plain completion; the repetitions of the
two alternate so that a busy machine slows both alike. Reported per repetition and as medians:
- `kiln run`: its own `gen_tps` (`--json`: generated tokens over the time from the end of the
  prompt to the last token);
- bindings, whole: `create_completion` timed from Python, the prompt's share taken out by a
  one-token call on the same prompt: (n - 1) / (t(n) - t(1));
- bindings, stream: the chunks' arrival in Python, (tokens - 1) over the time from the first
  chunk to the last.
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import kiln

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg"
)


def cli_tps(args):
    out = subprocess.run(
        [args.kiln, "run", "-m", args.model, "--raw", "-p", PROMPT, "-n", str(args.n),
         "--temp", "0", "-t", str(args.threads), "-c", str(args.ctx), "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    stats = json.loads(out.splitlines()[-1])
    return stats["gen_tps"], stats["gen_tokens"]


def timed(llm, n, stream=False):
    t0 = time.perf_counter()
    if not stream:
        out = llm.create_completion(PROMPT, max_tokens=n, temperature=0)
        return time.perf_counter() - t0, out["usage"]["completion_tokens"]
    first = last = None
    for c in llm.create_completion(PROMPT, max_tokens=n, temperature=0, stream=True):
        now = time.perf_counter()
        if c["choices"][0]["text"]:
            first = first or now
            last = now
    return first, last


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    ap.add_argument("-r", "--reps", type=int, default=5)
    root = Path(__file__).resolve().parent.parent
    ap.add_argument("--kiln", default=str(root / "target" / "release" / "kiln"))
    args = ap.parse_args()

    llm = kiln.Llama(model_path=args.model, n_ctx=args.ctx, n_threads=args.threads, verbose=False)
    timed(llm, 8)  # warm up: pages of the map, the session's buffers
    rows = {"kiln run": [], "bindings, whole": [], "bindings, stream": []}
    for r in range(args.reps):
        tps, n_cli = cli_tps(args)
        rows["kiln run"].append(tps)
        t1, _ = timed(llm, 1)
        tn, n = timed(llm, args.n)
        rows["bindings, whole"].append((n - 1) / (tn - t1))
        first, last = timed(llm, args.n, stream=True)
        # Chunks are text pieces; with this prompt each token is one piece.
        rows["bindings, stream"].append((n - 1) / (last - first))
        print(f"rep {r}: kiln run {tps:.1f} tok/s ({n_cli} tokens); bindings whole "
              f"{rows['bindings, whole'][-1]:.1f}, stream {rows['bindings, stream'][-1]:.1f} "
              f"({n} tokens)")
    print(f"\nmedian tokens/s ({args.model}, {args.threads} threads, {args.n} tokens, greedy):")
    for k, v in rows.items():
        print(f"  {k:18} {statistics.median(v):8.1f}")
    llm.close()


if __name__ == "__main__":
    main()
