#!/usr/bin/env python3
"""Side-by-side speed of two qhx builds (before and after a change) on the same models.

Runs `qhx bench --json` of each build in alternating rounds (before, after, before, ...) on each
model, so both see the same machine state, then prints prefill and decode tok/s (mean ± sample
stddev over rounds) and the ratio after / before. A round's figure is qhx bench's mean over -r
repetitions.

Example (from the repository root; an older build in /tmp/old-qhx/build):
  python3 bench/compare_builds.py --before /tmp/old-qhx/build/qhx --after build/qhx \\
      /tmp/m/q06-w8 /tmp/m/q06-w4 -p 512 -n 128 -t 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def bench(qhx: Path, model: Path, args: argparse.Namespace) -> dict:
    cmd = [str(qhx), "bench", str(model), "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-r", str(args.reps), "-t", str(args.threads), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(records) != 1:
        sys.exit(f"{' '.join(cmd)}: expected one JSON record, got {len(records)}")
    return records[0]


def spread(values: list[float]) -> str:
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {sd:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="bundles or checkpoints")
    ap.add_argument("--before", type=Path, required=True, help="the qhx binary before")
    ap.add_argument("--after", type=Path, required=True, help="the qhx binary after")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    builds = {"before": args.before, "after": args.after}
    print(f"pp{args.n_prompt} / tg{args.n_gen}, {args.threads} threads, {args.rounds} rounds "
          f"of -r {args.reps}")
    print(f"{'model':<28} {'':<8} {'prefill tok/s':>18} {'decode tok/s':>18}")
    for model in args.models:
        figures = {name: {"prefill": [], "decode": []} for name in builds}
        for _ in range(args.rounds):
            for name, qhx in builds.items():
                r = bench(qhx, model, args)
                figures[name]["prefill"].append(r["prefill_tok_s"])
                figures[name]["decode"].append(r["decode_tok_s"])
        for name in builds:
            f = figures[name]
            print(f"{model.name:<28} {name:<8} {spread(f['prefill']):>18} {spread(f['decode']):>18}")
        ratio = {k: statistics.mean(figures["after"][k]) / statistics.mean(figures["before"][k])
                 for k in ("prefill", "decode")}
        print(f"{model.name:<28} {'ratio':<8} {ratio['prefill']:>17.3f}x {ratio['decode']:>17.3f}x")


if __name__ == "__main__":
    main()
