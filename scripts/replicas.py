#!/usr/bin/env python3
"""Start N `kiln serve` replicas behind sglang-router, a cache-aware router from PyPI.

    scripts/replicas.py -n 2 -m smollm2 --port 8080 -- -P 4 -c 4096
    # then any OpenAI client on http://127.0.0.1:8080/v1

Each replica is `kiln serve -m MODEL --host HOST --port (free) ARGS...` (ARGS: what follows
`--`). Once every replica answers /health with 200, the router starts on --port with the
cache-aware policy: a request whose text shares a long prefix with earlier ones goes to the
replica that served them (whose prefix cache holds it), others to the least loaded replica.
The script prints one JSON line on stdout when the router is ready:

    {"router": URL, "router_pid": PID, "router_metrics": URL,
     "replicas": [{"url": URL, "pid": PID}, ...]}

and runs until SIGINT or SIGTERM, which it passes on (the replicas finish the responses in
progress). A replica that dies leaves the router's pool within about a second; one restarted
on the same port comes back as soon as its /health answers 200.

The router settings that make a replica's death lose no request that had not started:
- health checks every second, one failure to leave the pool, one success to come back
  (`--health-check-interval-secs 1 --health-failure-threshold 1 --health-success-threshold 1`);
- a request sent to a replica that has just died (connection refused, 5xx) is retried with
  backoff for about four seconds (`--retry-max-retries 8 --retry-initial-backoff-ms 100
  --retry-max-backoff-ms 1000`), past the health check that removes the replica, so the retry
  goes to a live one;
- no circuit breaker (`--disable-circuit-breaker`): this router counts 4xx answers as worker
  failures, so a few malformed client requests in a row would take a healthy replica out.
A request a replica was generating when it died is lost with it (the router may retry it from
the start elsewhere when the connection breaks before any byte of the answer).

sglang-router (pinned, below) is installed on first use into a virtual environment
(--venv, default ~/.cache/kiln/router-venv) unless the running Python already imports it.
Python 3.9+, x86-64 or aarch64 Linux (the router is a prebuilt Rust wheel); no GPU.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROUTER_PACKAGE = "sglang-router==0.3.2"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln")) / "router-venv"

# Health checks, retries and no circuit breaker: see the module docstring.
ROUTER_SETTINGS = [
    "--policy", "cache_aware",
    "--health-check-interval-secs", "1",
    "--health-check-timeout-secs", "2",
    "--health-failure-threshold", "1",
    "--health-success-threshold", "1",
    "--retry-max-retries", "8",
    "--retry-initial-backoff-ms", "100",
    "--retry-max-backoff-ms", "1000",
    "--disable-circuit-breaker",
    "--worker-startup-check-interval", "1",
]


def log(msg):
    print(f"[replicas] {msg}", file=sys.stderr, flush=True)


def router_importable(python):
    return subprocess.run([str(python), "-c", "import sglang_router"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def ensure_router(venv):
    """Continue in a Python that imports sglang_router (installing it if needed)."""
    if router_importable(sys.executable):
        return
    python = venv / "bin" / "python"
    if not (python.exists() and router_importable(python)):
        log(f"installing {ROUTER_PACKAGE} into {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", ROUTER_PACKAGE], check=True)
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return 0, b""


def wait_until(what, ready, procs, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"{what}: {' '.join(map(str, p.args[:3]))}... exited with {p.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"{what}: not ready after {timeout} s")


def kiln_binary(given):
    if given:
        return given
    built = REPO / "target" / "release" / "kiln"
    return shutil.which("kiln") or str(built)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--replicas", type=int, default=2)
    ap.add_argument("-m", "--model", default="smollm2", help="what kiln serve -m takes")
    ap.add_argument("--host", default="127.0.0.1", help="address of the router and replicas")
    ap.add_argument("--port", type=int, default=8080, help="the router's port (0: a free one)")
    ap.add_argument("--kiln", help="the kiln binary (default: kiln on PATH, else target/release/kiln)")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                    help=f"where sglang-router is installed if missing (default {DEFAULT_VENV})")
    ap.add_argument("--router-arg", action="append", default=[],
                    help="one more sglang-router argument (repeatable; after the defaults)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for readiness")
    ap.add_argument("serve_args", nargs="*", help="after --: arguments of every kiln serve")
    a = ap.parse_args()
    if a.replicas < 1:
        raise SystemExit("-n must be at least 1")
    ensure_router(a.venv)

    procs = []

    def stop(code=0):
        for p in reversed(procs):  # the router first, then the replicas
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 40
        for p in reversed(procs):
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        sys.exit(code)

    signal.signal(signal.SIGTERM, lambda *_: stop(0))
    signal.signal(signal.SIGINT, lambda *_: stop(0))
    try:
        kiln = kiln_binary(a.kiln)
        replicas = []
        for i in range(a.replicas):
            port = free_port(a.host)
            cmd = [kiln, "serve", "-m", a.model, "--host", a.host, "--port", str(port),
                   *a.serve_args]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr))
            replicas.append({"url": f"http://{a.host}:{port}", "pid": procs[-1].pid})
            log(f"replica {i}: {replicas[-1]['url']} (pid {procs[-1].pid})")
        for r in replicas:
            wait_until(f"replica {r['url']}", lambda r=r: get(r["url"] + "/health")[0] == 200,
                       procs, a.timeout)
        port = a.port or free_port(a.host)
        prom = free_port(a.host)
        router = [sys.executable, "-m", "sglang_router.launch_router", "--host", a.host,
                  "--port", str(port), "--worker-urls", *(r["url"] for r in replicas),
                  *ROUTER_SETTINGS, "--prometheus-host", a.host, "--prometheus-port", str(prom),
                  "--log-level", "error", *a.router_arg]
        # The router logs on stdout: stdout carries only the JSON line.
        procs.append(subprocess.Popen(router, stdin=subprocess.DEVNULL, stdout=sys.stderr))
        url = f"http://{a.host}:{port}"

        def router_ready():
            status, body = get(url + "/readiness")
            try:
                return status == 200 and json.loads(body)["healthy_workers"] == a.replicas
            except (ValueError, KeyError):
                return False

        wait_until("the router", router_ready, procs, a.timeout)
        print(json.dumps({"router": url, "router_pid": procs[-1].pid,
                          "router_metrics": f"http://{a.host}:{prom}/metrics",
                          "replicas": replicas}), flush=True)
        log(f"router: {url} ({a.replicas} replicas; Ctrl-C to stop)")
        while procs[-1].poll() is None:
            for r, p in zip(replicas, procs):
                if p.poll() is not None and not r.get("gone"):
                    r["gone"] = True
                    log(f"replica {r['url']} exited with {p.returncode}")
            time.sleep(0.2)
        log(f"the router exited with {procs[-1].returncode}")
        stop(1)
    except SystemExit as e:
        if e.code not in (0, None):
            log(str(e.code))
            stop(1)
        raise


if __name__ == "__main__":
    main()
