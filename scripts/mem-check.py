#!/usr/bin/env python3
"""Plan vs measured peak RSS of a `kiln run` that fills the context.

For each (model, ctx): a prompt of ctx - N_GEN tokens is cut from corpus_pydoc.txt (repeated
as needed), `kiln run -c ctx -n N_GEN --temp 0 --raw` (a plain completion: no chat template) runs under /usr/bin/time -v, and its peak RSS
(the kernel's max RSS, which is VmHWM; `kiln run --json` reports VmHWM too) is compared with
`kiln plan --json`'s total_bytes for the same options.

usage: scripts/mem-check.py [--kiln PATH] [--extra "--kv-type q8_0"] MODEL:CTX [MODEL:CTX ...]
"""
import argparse, json, os, re, subprocess, sys, tempfile

N_GEN = 8
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.environ.get("KILN_CORPUS",
                        os.path.join(HERE, "..", "tests", "golden", "corpus_pydoc.txt"))


def count(kiln, model, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    out = subprocess.run([kiln, "tokenize", "-m", model, "-f", f.name, "--show-count"],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return int(re.search(r"(\d+)", out).group(1))


def prompt_for(kiln, model, corpus, tokens):
    """The longest prefix of `corpus` with at most `tokens` tokens (bisection on characters)."""
    lo, hi = 0, len(corpus)
    while count(kiln, model, corpus[:hi]) <= tokens:
        corpus += corpus
        hi = len(corpus)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if count(kiln, model, corpus[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid
    return corpus[:lo]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    ap.add_argument("--extra", default="", help="flags for both plan and run, e.g. '-b 256'")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="prompt length (default: fill the context)")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    corpus = open(CORPUS).read()
    extra = a.extra.split()
    rows = []
    for case in a.cases:
        model, ctx = case.split(":")
        ctx = int(ctx)
        n_prompt = a.prompt_tokens or ctx - N_GEN
        text = prompt_for(a.kiln, model, corpus, n_prompt)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        plan = json.loads(subprocess.run(
            [a.kiln, "plan", "-m", model, "-c", str(ctx), "--json"] + plan_flags(extra),
            capture_output=True, text=True, check=True).stdout)
        r = subprocess.run(["/usr/bin/time", "-v", a.kiln, "run", "-m", model, "-c", str(ctx),
                            "-f", f.name, "-n", str(N_GEN), "--temp", "0", "--raw", "--json"] + extra,
                           capture_output=True, text=True)
        os.unlink(f.name)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            sys.exit(1)
        max_rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
        # `run --json` writes JSON lines on stdout, the statistics last.
        stats = json.loads(r.stdout.splitlines()[-1])
        total = plan["total_bytes"]
        rows.append((model, ctx, stats["prompt_tokens"] + stats["gen_tokens"], total, max_rss,
                     stats["peak_rss_bytes"], stats["prompt_tps"], stats["gen_tps"]))
        m = lambda b: b / 2**20
        print(f"| {model} | {ctx} | {rows[-1][2]} | {m(total):.1f} | {m(max_rss):.1f} | "
              f"{m(stats['peak_rss_bytes']):.1f} | {100 * (total - max_rss) / max_rss:+.2f}% | "
              f"{stats['prompt_tps']:.0f} | {stats['gen_tps']:.1f} |", flush=True)


def plan_flags(extra):
    """The run flags `kiln plan` understands (-b → --prefill-chunk, -t, --kv-type, --kv-budget,
    and speculative decoding's -md / --model-draft and --draft-max, 16 where run's default
    applies)."""
    out, i, spec = [], 0, False
    while i < len(extra):
        f = extra[i]
        if f in ("-b", "--batch-size"):
            out += ["--prefill-chunk", extra[i + 1]]
            i += 2
        elif f in ("-t", "--threads", "--kv-type", "--kv-budget", "-md", "--model-draft",
                   "--draft-max"):
            out += [f, extra[i + 1]]
            i += 2
        elif f in ("--no-repack", "-nr"):
            out.append("--no-repack")
            i += 1
        elif f == "--spec-type":
            spec = extra[i + 1] != "none"
            i += 2
        else:
            i += 1
    if spec and "--draft-max" not in out:
        out += ["--draft-max", "16"]
    return out


if __name__ == "__main__":
    print("| model | ctx | tokens in KV | plan MiB | max RSS (time -v) MiB | VmHWM MiB | plan − measured | pp tok/s | tg tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    main()
