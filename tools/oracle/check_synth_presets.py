#!/usr/bin/env python3
"""Checks that every `qhx forge synth` preset writes a checkpoint Hugging Face can run.

For each preset: `build/qhx forge synth` writes it to a temporary folder; the `safetensors`
library opens it (it refuses a hole, an overlap or trailing bytes); transformers loads it with
no missing or unexpected weights; and the greedy ids of a short prompt from transformers (float32,
eager attention, torch-only paths) are compared with `qhx generate --greedy` on the same files.
The 4B preset writes ~8 GB and needs ~25 GB of memory for the float32 reference: --presets
picks fewer.

Usage: $ORACLE_VENV/bin/python tools/oracle/check_synth_presets.py [--presets P ...] [--tokens N]
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
PRESETS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b"]
PROMPT = [9707, 11, 1879, 0, 17, 42, 1000, 5000]


def check(preset: str, work: Path, n_tokens: int) -> str:
    out = work / preset
    subprocess.run([str(REPO / "build/qhx"), "forge", "synth", "--preset", preset, "-o", str(out)],
                   check=True, capture_output=True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        n_tensors = len(list(f.keys()))
    model, info = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        return f"{preset}: transformers loading reports {bad}"
    model.eval()
    with torch.no_grad():
        ids = list(PROMPT)
        for _ in range(n_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    hf = ids[len(PROMPT):]
    del model
    run = subprocess.run([str(REPO / "build/qhx"), "generate", "--model", str(out), "--prompt-ids",
                          ",".join(map(str, PROMPT)), "-n", str(n_tokens), "--greedy",
                          "--ignore-eos", "--print-ids"], check=True, capture_output=True, text=True)
    qhx = [int(x) for x in run.stdout.replace(",", " ").split()]
    shutil.rmtree(out)
    verdict = "same" if qhx == hf else f"DIFFERENT (transformers {hf}, qhx {qhx})"
    return f"{preset}: {n_tensors} tensors, safetensors and transformers load it, greedy {verdict}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=PRESETS, choices=PRESETS)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(2)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            line = check(preset, Path(tmp), args.tokens)
            print(line, flush=True)
            failed |= "DIFFERENT" in line or "reports" in line
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
