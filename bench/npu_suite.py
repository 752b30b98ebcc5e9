#!/usr/bin/env python3
"""Greedy agreement of the NPU with the CPU on the KJV prompt suite, and what the pack costs.

For each of the 24 verse openings of tools/train/kjv_prompts.txt, the prompt is a held-out
chapter's opening (about 1,000 characters of models/*/held_out.txt, so that the NPU reads at least
two 128-token chunks) followed by the verse opening; qhx generate continues it greedily for 64
tokens on the CPU alone and with prompts on the NPU (--device hexagon:vNN --npu-pack; with
--decode the replies too, --decode-device hexagon), and the ids are compared. Prints, per bundle: identical continuations of 24, the first divergence of the
others, the pack's size per chip and the peak RSS of both runs (the memory the NPU adds while
loaded; on the simulator that is mostly the simulator's own).

The same prompts, written with --write-suite, are what forge npu --suite measures into a pack's
manifest and card (greedy continuations followed as here; the logit measures teacher-forced).

Usage (QHX_QNN_LIB set, or --qnn-lib):
  python3 bench/npu_suite.py --qhx build/qhx --chip v81 BUNDLE:PACK [BUNDLE:PACK ...]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str]) -> tuple[list[int], float, int]:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}:\n{p.stderr}")
    ids = [int(x) for x in p.stdout.strip().split(",") if x]
    rss = float(re.search(r"peak RSS ([0-9.]+) MB", p.stderr).group(1))
    m = re.search(r"(\d+) prompt tokens on", p.stderr)
    return ids, rss, int(m.group(1)) if m else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--qhx", default=str(ROOT / "build" / "qhx"))
    ap.add_argument("--chip", default="v81")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--context-chars", type=int, default=1000)
    ap.add_argument("--decode", action="store_true",
                    help="decode on the NPU too (--decode-device hexagon), not on the CPU")
    ap.add_argument("--held-out", default=str(ROOT / "models" / "qwen3-kjv" / "held_out.txt"))
    ap.add_argument("--write-calibration", metavar="FILE",
                    help="write the held-out chapters past the suite's openings (text the suite "
                         "never reads: forge npu --calibrate FILE) and exit")
    ap.add_argument("--write-suite", metavar="FILE",
                    help="write the suite's prompts, one JSON string per line (forge npu --suite "
                         "FILE records the pack's agreement on them in its manifest) and exit")
    ap.add_argument("pairs", nargs="*", help="BUNDLE:PACK")
    args = ap.parse_args()
    prompts = [l for l in (ROOT / "tools/train/kjv_prompts.txt").read_text().splitlines() if l]
    chapters = [c.strip() for c in Path(args.held_out).read_text().split("<|endoftext|>") if c.strip()]
    if args.write_calibration:
        Path(args.write_calibration).write_text(
            "\n".join(c[args.context_chars:] for c in chapters if len(c) > args.context_chars))
        return
    suite = [chapters[i % len(chapters)][: args.context_chars] + "\n" + verse
             for i, verse in enumerate(prompts)]
    if args.write_suite:
        Path(args.write_suite).write_text("".join(json.dumps(t) + "\n" for t in suite))
        return
    for pair in args.pairs:
        bundle, pack = pair.split(":")
        same, diverged, npu_rss, cpu_rss, npu_tokens = 0, [], 0.0, 0.0, 0
        for text in suite:
            base = [args.qhx, "generate", "--model", bundle, "--prompt", text, "--greedy",
                    "--print-ids", "-n", str(args.tokens), "--ignore-eos"]
            cpu, rss_c, _ = run(base)
            npu, rss_n, on_npu = run(base + ["--device", f"hexagon:{args.chip}", "--npu-pack", pack,
                                             "--device-check", "never"] +
                                     (["--decode-device", "hexagon"] if args.decode else []))
            if on_npu == 0:
                sys.exit(f"{pack}: no prompt token ran on hexagon:{args.chip} (QHX_QNN_LIB set?)")
            cpu_rss, npu_rss, npu_tokens = max(cpu_rss, rss_c), max(npu_rss, rss_n), npu_tokens + on_npu
            if cpu == npu:
                same += 1
            else:
                diverged.append(next(k for k, (a, b) in enumerate(zip(cpu, npu)) if a != b))
        manifest = json.loads((Path(pack) / "MANIFEST.json").read_text())
        sizes = ", ".join(f"v{c['arch']} {c['bytes'] / 1e6:.1f} MB" for c in manifest["chips"])
        print(f"{Path(bundle).name}: {same}/{len(prompts)} greedy-identical over {args.tokens} tokens"
              f" (first divergence of the others at tokens {sorted(diverged)}); "
              f"{npu_tokens} prompt tokens ran on hexagon:{args.chip}"
              f"{', and every reply token' if args.decode else ''}; pack {sizes}; "
              f"peak RSS {cpu_rss:.0f} MB on the CPU, {npu_rss:.0f} MB with the NPU")


if __name__ == "__main__":
    main()
