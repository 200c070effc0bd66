#!/usr/bin/env python3
"""Aggregate generation throughput of `kiln serve`: one stream alone, then N concurrent streams.

    cargo build --release && python3 scripts/bench_server.py [-m smollm2] [-n 128] [-c 8]

Starts its own server (--parallel N) on a free loopback port, warms it up, then measures
  single: one streaming request at a time (N requests in a row), tokens/s of generation
  concurrent: N streaming requests at once, total generated tokens / wall time
and prints both and their ratio (needs `pip install httpx`). Prompts differ per client;
decoding is greedy with `ignore_eos`, so every request generates exactly max_tokens (counted
from the `usage` of each response).

    python3 scripts/bench_server.py --ttft [--long 4000] [--shorts 8] [--kiln PATH]

Short requests behind a long prompt (chunked prefill): one /v1/completions request with a
--long token prompt, and from 1 s later --shorts requests of 4 prompt tokens, one every
--gap seconds, each streaming 4 tokens. Prints the shorts' time to first token (p50, p99,
max), the long prompt's time to first token and the server's prefill speed (long / that
time), then runs `kiln bench -p LONG -n 0 -r 1` (same binary, threads and batch size) for the
prefill speed of the engine alone, and their ratio. Run it with an older binary (--kiln) for
the figures before a change.
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
ap.add_argument("--ttft", action="store_true", help="time to first token of short requests behind a long prompt")
ap.add_argument("--long", type=int, default=4000, help="--ttft: tokens of the long prompt")
ap.add_argument("--shorts", type=int, default=8, help="--ttft: short requests")
ap.add_argument("--gap", type=float, default=1.0, help="--ttft: seconds between short requests")
ap.add_argument("-b", "--batch-size", type=int, default=512, help="--ttft: prefill chunk (-b of serve and bench)")
args = ap.parse_args()

if args.ttft:
    ctx = args.long + 64
    cmd = [args.kiln, "serve", "-m", args.model, "--port", "0", "-P", "4", "-c", str(ctx),
           "-b", str(args.batch_size)]
else:
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


def first_token(prompt, max_tokens, out, key):
    """Stream a /v1/completions request of token ids; record seconds to the first token."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.time()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:]).get("choices"):
                    first = time.time()
    out[key] = (first or time.time()) - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def ttft():
    first_token([1, 2, 3, 4], 2, {}, "warm")  # warm-up
    long_prompt = [(i * 2654435761 + 7) % 40000 + 100 for i in range(args.long)]
    out = {}
    lt = threading.Thread(target=first_token, args=(long_prompt, 1, out, "long"))
    lt.start()
    threads = []
    for i in range(args.shorts):
        time.sleep(1.0 if i == 0 else args.gap)
        p = [(i * 7919 + j * 104729) % 40000 + 100 for j in range(4)]
        t = threading.Thread(target=first_token, args=(p, 4, out, f"short{i}"))
        t.start()
        threads.append(t)
    for t in threads + [lt]:
        t.join()
    shorts = [out[f"short{i}"] for i in range(args.shorts)]
    server_pp = args.long / out["long"]
    bench = subprocess.run([args.kiln, "bench", "-m", args.model, "-p", str(args.long), "-n", "0",
                            "-r", "1", "-b", str(args.batch_size), "--json"]
                           + (["-t", str(args.threads)] if args.threads else []),
                           capture_output=True, text=True, check=True)
    rows = json.loads(bench.stdout)
    rows = rows if isinstance(rows, list) else [rows]
    bench_pp = rows[0]["avg_ts"]
    res = {"model": args.model, "long": args.long, "shorts": args.shorts,
           "short_ttft_p50_s": round(pct(shorts, 50), 2), "short_ttft_p99_s": round(pct(shorts, 99), 2),
           "short_ttft_max_s": round(max(shorts), 2), "long_ttft_s": round(out["long"], 2),
           "server_prefill_tps": round(server_pp, 1), "bench_prefill_tps": round(bench_pp, 1),
           "server_vs_bench": round(server_pp / bench_pp, 3)}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"short requests ({args.shorts}, 4 tokens) behind a {args.long}-token prompt:")
        print(f"  time to first token p50 {res['short_ttft_p50_s']:.2f} s, p99 {res['short_ttft_p99_s']:.2f} s,"
              f" max {res['short_ttft_max_s']:.2f} s")
        print(f"long prompt: first token after {out['long']:.2f} s = {server_pp:.1f} tok/s prefill in the server")
        print(f"kiln bench -p {args.long}: {bench_pp:.1f} tok/s; server / bench = {server_pp / bench_pp:.3f}")


try:
    if args.ttft:
        ttft()
        raise SystemExit(0)
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
