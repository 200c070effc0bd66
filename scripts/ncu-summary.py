#!/usr/bin/env python3
"""Sum the per-kernel device times that `gpu-check.sh run` with KILN_NCU=1 writes
($OUT/ncu-<model>.csv: Nsight Compute's gpu__time_duration.sum per kernel launch) by kernel and
launch shape, and per decoded token (tokens counted by the embedding kernel's launches).
Caches are flushed before each kernel there, so small kernels read as cold.

    python3 scripts/ncu-summary.py ncu-smol.csv
"""
import collections
import csv
import sys


def main(path: str) -> None:
    rows = [r for r in csv.reader(open(path)) if len(r) > 14 and r[0].isdigit()]
    by = collections.defaultdict(list)
    for r in rows:
        # (kernel, block, grid) -> durations in ns
        by[(r[4], r[7], r[8])].append(float(r[14].replace(",", "")))
    total = sum(sum(v) for v in by.values())
    tokens = max(1, sum(1 for r in rows if r[4].startswith("embed")))
    print(f"{len(rows)} kernels, {tokens} tokens: {total / 1e3:.1f} µs, {total / 1e3 / tokens:.1f} µs per token")
    for (name, block, grid), v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:<18} block {block:<12} grid {grid:<16} n={len(v):4d}  avg {sum(v) / len(v) / 1e3:7.2f} µs"
              f"  min {min(v) / 1e3:7.2f}  total {sum(v) / 1e3:8.1f} µs")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
