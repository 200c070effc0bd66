#!/usr/bin/env python3
"""Constrained decoding speed against unconstrained, side by side.

    cargo build --release && python3 scripts/bench_structured.py [-m smollm2,gemma3] [-n 128] [--rounds 5]

For each model, runs `kiln run --json` on the same prompt with greedy decoding, alternating a
run constrained by a JSON schema (`--json-schema`) with an unconstrained one (`--ignore-eos`, so
it generates the same number of tokens), for --rounds rounds, and prints the median generation
speed (tokens/s of the decode phase, from run's own statistics) of each and their ratio. The
schema asks for a long list of objects, so the constrained run generates up to -n tokens too;
the tokens each run generated are printed beside its speed. The token mask is computed on a
helper thread while the forward pass runs, so the goal is a ratio within 10% of 1.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

SCHEMA = {
    "type": "object",
    "properties": {
        "cities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "country": {"type": "string"},
                    "population": {"type": "integer"},
                },
                "required": ["name", "country", "population"],
            },
        }
    },
    "required": ["cities"],
}
PROMPT = "List forty large cities of the world as JSON, with their country and population."


def run(kiln, model, n, threads, schema_file):
    cmd = [kiln, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--temp", "0", "--json"]
    if threads:
        cmd += ["-t", str(threads)]
    cmd += ["--json-schema-file", schema_file] if schema_file else ["--ignore-eos"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    stats = json.loads(out.strip().splitlines()[-1])
    return stats["gen_tps"], stats["gen_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--models", default="smollm2,gemma3")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "kiln"))
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SCHEMA, f)
        schema_file = f.name
    print("| model | unconstrained tok/s | constrained tok/s | constrained / unconstrained | tokens (free / constrained) |")
    print("| --- | ---: | ---: | ---: | --- |")
    try:
        for model in args.models.split(","):
            free, cons = [], []
            for r in range(args.rounds):
                order = [None, schema_file] if r % 2 == 0 else [schema_file, None]
                for s in order:
                    (cons if s else free).append(run(args.kiln, model, args.n_predict, args.threads, s))
            mf = statistics.median(t for t, _ in free)
            mc = statistics.median(t for t, _ in cons)
            toks = f"{free[0][1]} / {cons[0][1]}"
            print(f"| {model} | {mf:.1f} | {mc:.1f} | {mc / mf:.3f} | {toks} |", flush=True)
    finally:
        os.unlink(schema_file)


if __name__ == "__main__":
    main()
