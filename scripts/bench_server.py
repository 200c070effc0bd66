#!/usr/bin/env python3
"""Aggregate generation throughput of `kiln serve`: one stream alone, then N concurrent streams.

    cargo build --release && python3 scripts/bench_server.py [-m smollm2] [-n 128] [-c 8]

Starts its own server (--parallel N) on a free loopback port, warms it up, then measures
  single: one streaming request at a time (N requests in a row), tokens/s of generation
  concurrent: N streaming requests at once, total generated tokens / wall time
and prints both and their ratio (needs `pip install httpx`). Prompts differ per client;
decoding is greedy with `ignore_eos`, so every request generates exactly max_tokens (counted
from the `usage` of each response).
"""

import argparse
import json
import os
import subprocess
import threading
import time

import httpx

ap = argparse.ArgumentParser()
ap.add_argument("-m", "--model", default="smollm2")
ap.add_argument("-n", "--max-tokens", type=int, default=128)
ap.add_argument("-c", "--clients", type=int, default=8)
ap.add_argument("-t", "--threads", type=int, default=None)
ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "kiln"))
ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
args = ap.parse_args()

cmd = [args.kiln, "serve", "-m", args.model, "--port", "0", "-P", str(args.clients), "-c", "1024"]
if args.threads:
    cmd += ["-t", str(args.threads)]
server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
url = None
for line in server.stderr:
    if line.startswith("kiln: listening on "):
        url = line.split("listening on ", 1)[1].strip()
        break
threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

TOPICS = ["the sea", "a mountain", "the city at night", "a library", "the desert", "a forest",
          "the moon", "a train journey", "winter", "a market", "the river", "a storm"]


def one(i, out):
    body = {"messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": args.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.time()
    first = None
    tokens = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            if first is None and c.get("choices"):
                first = time.time()
            if c.get("usage"):
                tokens = c["usage"]["completion_tokens"]
    out[i] = (tokens, time.time() - t0, (first or t0) - t0)


try:
    one(0, {})  # warm-up
    single = {}
    t0 = time.time()
    for i in range(args.clients):
        one(i, single)
    single_s = time.time() - t0
    single_tokens = sum(v[0] for v in single.values())
    conc = {}
    threads = [threading.Thread(target=one, args=(i, conc)) for i in range(args.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conc_s = time.time() - t0
    conc_tokens = sum(v[0] for v in conc.values())
    s_tps = single_tokens / single_s
    c_tps = conc_tokens / conc_s
    res = {"model": args.model, "clients": args.clients, "max_tokens": args.max_tokens,
           "single_tokens": single_tokens, "single_s": round(single_s, 2),
           "single_tps": round(s_tps, 1), "concurrent_tokens": conc_tokens,
           "concurrent_s": round(conc_s, 2), "concurrent_tps": round(c_tps, 1),
           "ratio": round(c_tps / s_tps, 2)}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"single stream : {single_tokens:5d} tokens in {single_s:7.2f} s = {s_tps:7.1f} tok/s")
        print(f"{args.clients} concurrent  : {conc_tokens:5d} tokens in {conc_s:7.2f} s = {c_tps:7.1f} tok/s")
        print(f"ratio         : {c_tps / s_tps:.2f}x")
finally:
    server.terminate()
    server.wait(timeout=60)
