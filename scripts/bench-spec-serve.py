#!/usr/bin/env python3
"""Speculative decoding in `kiln serve` against a plain server, side by side, from one run.

Starts two servers on the same model (plain, and `--spec-type ngram-simple` or the flags given),
then for each load runs its requests on one server and then the other, alternating round by
round, checks that both answered every request with the same text, and prints one table of
aggregate generation tokens/s (median over rounds), the ratio and the drafts kept (from
/metrics). Loads: one client asking for a paragraph back ("copy", what prompt lookup is for),
one asking for a story (new text), and 4 clients at once (two of each).

    scripts/bench-spec-serve.py                       # both real models
    scripts/bench-spec-serve.py --rounds 5 --spec "--spec-type ngram-simple --draft-max 8"

A benchmark, not a test: nothing asserts on speed. Needs python3 (stdlib only) and cargo;
models in $KILN_MODELS (default ~/.cache/kiln/models).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("KILN_MODELS", Path.home() / ".cache" / "kiln" / "models"))
MODELS = {
    "SmolLM2-135M Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "Gemma-3-270M Q4_K_M": "gemma-3-270m-q4_k_m.gguf",
}
COPY = (
    "Copy this text exactly, word for word:\n\nThe kiln is a thermally insulated chamber, "
    "a type of oven, that produces temperatures sufficient to complete some process, such "
    "as hardening, drying, or chemical changes. Kilns have been used for millennia to turn "
    "objects made from clay into pottery, tiles and bricks. Various industries use rotary "
    "kilns for pyroprocessing and to calcinate ores, such as limestone to lime for cement."
)
STORY = "Write a short story about a dragon who learns to bake bread."
STORY2 = "Write a short story about a lighthouse keeper who finds a message in a bottle."
LOADS = {
    "1 client, copy": [COPY],
    "1 client, story": [STORY],
    "4 clients, 2 copy + 2 story": [COPY, STORY, COPY, STORY2],
}


class Server:
    def __init__(self, kiln, model, extra, args):
        cmd = [str(kiln), "serve", "-m", str(model), "--port", "0", "-P", str(args.parallel), "-c", "2048",
               "-t", str(args.threads), *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.url = None
        for line in self.proc.stderr:
            if line.startswith("kiln: listening on "):
                self.url = line.split("listening on ", 1)[1].strip()
                break
        if not self.url:
            sys.exit(f"{' '.join(cmd)}: the server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def chat(self, prompt, n):
        body = json.dumps({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": n, "temperature": 0,
        }).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            d = json.load(r)
        return d["choices"][0]["message"]["content"], d["usage"]["completion_tokens"]

    def metric(self, name):
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def load(self, prompts, n):
        """All prompts at once: (texts, generated tokens, seconds)."""
        out = [None] * len(prompts)

        def one(i):
            out[i] = self.chat(prompts[i], n)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
        return [o[0] for o in out], sum(o[1] for o in out), secs

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated GGUF paths (default: the two real models)")
    ap.add_argument("--spec", default="--spec-type ngram-simple", help="the speculating server's flags")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=200)
    ap.add_argument("-P", "--parallel", type=int, default=4, help="sequence slots of both servers")
    ap.add_argument("--kiln", help="the kiln binary (default: this checkout's, built)")
    args = ap.parse_args()
    if args.kiln:
        kiln = Path(args.kiln)
    else:
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=REPO, check=True)
        kiln = REPO / "target" / "release" / "kiln"
    if args.models:
        models = {Path(p).name: Path(p) for p in args.models.split(",")}
    else:
        models = {name: MODELS_DIR / f for name, f in MODELS.items()}
    print(f"| model | load | plain tok/s | `{args.spec}` tok/s | ratio | drafts kept |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for mname, mpath in models.items():
        plain = Server(kiln, mpath, [], args)
        spec = Server(kiln, mpath, args.spec.split(), args)
        try:
            for lname, prompts in LOADS.items():
                speeds = {"plain": [], "spec": []}
                texts = {}
                d0 = spec.metric("kiln_spec_draft_tokens_total")
                a0 = spec.metric("kiln_spec_accepted_tokens_total")
                for _ in range(args.rounds):
                    for key, srv in (("plain", plain), ("spec", spec)):
                        t, n, s = srv.load(prompts, args.n_predict)
                        speeds[key].append(n / s)
                        if key in texts and texts[key] != t:
                            sys.exit(f"{mname}, {lname}: {key} answered differently between rounds")
                        texts[key] = t
                if texts["plain"] != texts["spec"]:
                    sys.exit(f"{mname}, {lname}: the speculating server's text differs")
                drafted = spec.metric("kiln_spec_draft_tokens_total") - d0
                kept = spec.metric("kiln_spec_accepted_tokens_total") - a0
                p, q = statistics.median(speeds["plain"]), statistics.median(speeds["spec"])
                print(f"| {mname} | {lname} | {p:.0f} | {q:.0f} | {q / p:.2f}× | "
                      f"{kept:.0f} / {drafted:.0f} |", flush=True)
        finally:
            plain.stop()
            spec.stop()


if __name__ == "__main__":
    main()
