#!/usr/bin/env python3
"""Generation speed of the Python bindings beside `kiln run`, same model, prompt and threads.

    python3 scripts/bench-python.py [--model smollm2] [-n 128] [-t 2] [-r 5] [--kiln target/release/kiln]

Needs the bindings importable (`pip install ./python`, or PYTHONPATH at an unpacked wheel, as
tests/python_bindings.rs does). Greedy decoding of a plain completion; the repetitions of the
two alternate so that a busy machine slows both alike. Reported per repetition and as medians:
- `kiln run`: its `gen_tps` (`--json`: generated tokens over the time from the end of the
  prompt to the last token);
- bindings: the same figure from the response's `timings` (`predicted_per_second`, the same
  clock in the same loop), and the tokens per second Python sees: generated tokens over the
  call's wall time less the engine's prompt time;
- the bindings' cost: the call's wall time in Python less the engine's prompt and generation
  time (starting the generating thread, the JSON of the request and the response, the
  hand-over of each piece of text), per call and per token.
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


def timed(llm, n):
    t0 = time.perf_counter()
    out = llm.create_completion(PROMPT, max_tokens=n, temperature=0)
    wall_ms = (time.perf_counter() - t0) * 1e3
    return wall_ms, out["timings"], out["usage"]["completion_tokens"]


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
    rows = {"kiln run": [], "bindings (engine clock)": [], "bindings (Python clock)": []}
    cost = []
    for r in range(args.reps):
        tps, n_cli = cli_tps(args)
        wall_ms, t, n = timed(llm, args.n)
        rows["kiln run"].append(tps)
        rows["bindings (engine clock)"].append(t["predicted_per_second"])
        rows["bindings (Python clock)"].append(n * 1e3 / (wall_ms - t["prompt_ms"]))
        cost.append(wall_ms - t["prompt_ms"] - t["predicted_ms"])
        print(f"rep {r}: kiln run {tps:.1f} tok/s ({n_cli} tokens); bindings "
              f"{rows['bindings (engine clock)'][-1]:.1f} engine clock, "
              f"{rows['bindings (Python clock)'][-1]:.1f} Python clock ({n} tokens); "
              f"cost {cost[-1]:.2f} ms")
    print(f"\nmedian tokens/s ({args.model}, {args.threads} threads, {args.n} tokens, greedy):")
    for k, v in rows.items():
        print(f"  {k:24} {statistics.median(v):8.1f}")
    c = statistics.median(cost)
    print(f"  bindings' cost per call {c:.2f} ms ({c * 1e3 / args.n:.1f} us per token)")
    llm.close()


if __name__ == "__main__":
    main()
