#!/usr/bin/env python3
"""Quantization quality of a trained model, measured with qhx itself (no torch needed).

For each weight format (bf16, W8, W4) the model is converted with `qhx forge convert --no-gate`,
then `qhx forge gate --json` compares it with the checkpoint (computed in f32) on the KJV prompt
suite (tools/train/kjv_prompts.txt: 24 held-out verse openings, 64 greedy tokens each), and
`qhx perplexity` scores the held-out text.  The f32 reference's perplexity comes from the
checkpoint directory itself.  Results go to <model>/quantization.json, which render_card.py puts
into the model card.

    python3 tools/train/evaluate_quant.py models/qwen3.5-kjv [--qhx build/qhx]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "tools/train/kjv_prompts.txt"  # 24 held-out verse openings
GREEDY_TOKENS = 64
WINDOW = 512
FORMATS = ["bf16", "w8", "w4"]


def run(cmd):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)


def perplexity(qhx, model, held_out):
    out = run([qhx, "perplexity", "-m", model, "-f", held_out, "--window", WINDOW, "--json"])
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--qhx", type=Path, default=REPO / "build/qhx")
    args = ap.parse_args()
    held_out = args.model / "held_out.txt"

    reference = perplexity(args.qhx, args.model, held_out)
    report = {
        "reference": "checkpoint computed in f32 (qhx, bitwise equal to an f32 bundle)",
        "prompt_suite": {"file": str(PROMPTS.relative_to(REPO)), "prompts": sum(1 for line in PROMPTS.read_text().splitlines() if line.strip()),
                         "greedy_tokens": GREEDY_TOKENS},
        "held_out": {"file": "held_out.txt (beside the checkpoint)",
                     "tokens": reference["tokens"], "window": WINDOW},
        "formats": {"f32": {"perplexity": reference["perplexity"]}},
    }
    with tempfile.TemporaryDirectory(prefix="qhx-quant-") as tmp:
        for fmt in FORMATS:
            bundle = Path(tmp) / fmt
            run([args.qhx, "forge", "convert", args.model, "-o", bundle, "--weights", fmt, "--no-gate"])
            gate = json.loads(run([args.qhx, "forge", "gate", bundle, "--reference", args.model,
                                   "--gate-prompt-file", PROMPTS, "--gate-tokens", GREEDY_TOKENS,
                                   "--json"]).stdout)
            manifest = json.loads((bundle / "manifest.json").read_text())
            size = sum(f["size"] for f in manifest["files"] if not f["path"].startswith("tokenizer"))
            entry = {k: gate[k] for k in ("passed", "top1", "top5", "pearson_min", "kl_mean",
                                          "greedy_matched", "prompts", "thresholds")}
            entry["first_divergences"] = [p["first_divergence"] for p in gate["per_prompt"]]
            entry["precision_policy"] = manifest["precision_policy"]
            entry["weight_bytes"] = size
            entry["perplexity"] = perplexity(args.qhx, bundle, held_out)["perplexity"]
            report["formats"][fmt] = entry
            print(f"{fmt}: ppl {entry['perplexity']:.3f} (f32 {reference['perplexity']:.3f}), "
                  f"top-1 {entry['top1']:.4f}, greedy {entry['greedy_matched']}/{entry['prompts']}, "
                  f"gate {'passed' if entry['passed'] else 'FAILED'}", flush=True)
    (args.model / "quantization.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
