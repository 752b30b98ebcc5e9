#!/usr/bin/env python3
"""The context sweep of several forms of one model, as one Markdown table.

For each FORM=MODEL (the CPU) or FORM=MODEL@PACK (prompts and replies on the NPU:
--device hexagon:CHIP --decode-device hexagon --npu-pack PACK), runs
`qhx bench MODEL --context-sweep --json` against the same reference on the CPU and the same text,
then prints one row per form: at each depth, "=" where the reply is the reference's token for
token, else the token where it first departs, and "(incoherent)" where it stopped being coherent
(runtime/context_sweep.h: empty where the reference's is not, or an NLL under the reference more
than 1 nat above the reference's own).

Example (from the repository root; QHX_QNN_LIB set for the NPU forms):
  python3 bench/context_sweep.py --reference models/qwen3-kjv \\
      --text models/qwen3-kjv/held_out.txt cpu-w8=/tmp/q3-w8 npu-w8a16=/tmp/q3-w8@/tmp/q3-npu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep(args: argparse.Namespace, model: str, pack: str | None) -> dict:
    cmd = [args.qhx, "bench", model, "--context-sweep", "--json", "--prompt-file", args.text,
           "--reference", args.reference, "--sweep-tokens", str(args.tokens), "-t",
           str(args.threads)]
    if args.depths:
        cmd += ["--sweep-depths", args.depths]
    if pack:
        cmd += ["--device", f"hexagon:{args.chip}", "--decode-device", "hexagon", "--npu-pack",
                pack]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--qhx", default=str(ROOT / "build" / "qhx"))
    ap.add_argument("--reference", required=True, help="the reference model, run on the CPU")
    ap.add_argument("--text", required=True, help="the text whose first tokens are read")
    ap.add_argument("--tokens", type=int, default=32, help="reply tokens per depth")
    ap.add_argument("--depths", help="comma-separated (default: qhx's, to the model's context)")
    ap.add_argument("--chip", default="v81")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("forms", nargs="+", help="FORM=MODEL or FORM=MODEL@PACK")
    args = ap.parse_args()
    rows = []
    for form in args.forms:
        label, _, where = form.partition("=")
        model, _, pack = where.partition("@")
        r = sweep(args, model, pack or None)
        rows.append((label, r))
        print(f"{label}: done", file=sys.stderr)
    depths = [p["depth"] for p in rows[0][1]["sweep"]]
    print("| form | where | " + " | ".join(str(d) for d in depths) + " |")
    print("|---|---|" + "---:|" * len(depths))
    for label, r in rows:
        cells = []
        for p in r["sweep"]:
            cell = "=" if p["first_departure"] < 0 else f"@{p['first_departure']}"
            if not p["coherent"]:
                cell += " (incoherent)"
            cells.append(cell)
        where = f"{r['prompts_on']} / {r['replies_on']}"
        print(f"| {label} | {where} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
