#!/usr/bin/env python3
"""Model cards and the loss plot for the trained models.

Reads <model>/training.json (train_kjv.py) and, when present, <model>/quantization.json
(evaluate_quant.py); writes <model>/README.md and docs/training_loss.png (all models on one plot).

    $ORACLE_VENV/bin/python tools/train/render_card.py models/qwen3.5-kjv models/qwen3-kjv
"""

import argparse
import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLOT = REPO / "docs/training_loss.png"
SMOOTH = 20

ARCH_LINES = {
    "Qwen3_5ForCausalLM": "Qwen3.5 hybrid: Gated DeltaNet linear attention in 3 of every 4 layers, gated "
                          "full attention (partial rotary) in every 4th",
    "Qwen3ForCausalLM": "Qwen3 dense: grouped-query attention with q/k RMSNorm and RoPE in every layer",
}


def plot(models):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for m in models:
        t = json.loads((m / "training.json").read_text())
        curve = t["loss_curve"]
        smooth = [sum(curve[max(0, i - SMOOTH + 1):i + 1]) / len(curve[max(0, i - SMOOTH + 1):i + 1])
                  for i in range(len(curve))]
        tokens_per_step = t["args"]["batch"] * t["args"]["seq_len"]
        x = [(i + 1) * tokens_per_step / 1e6 for i in range(len(curve))]
        line, = ax.plot(x, smooth, label=f"{m.name} train (mean of {SMOOTH} steps)")
        ex = [e["step"] * tokens_per_step / 1e6 for e in t["evals"]]
        ax.plot(ex, [math.log(e["held_out_ppl"]) for e in t["evals"]], "o--", color=line.get_color(),
                label=f"{m.name} held-out (first {t['args']['eval_tokens']} tokens)")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(bottom=2, top=8)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("qhx KJV models: training loss (tools/train/train_kjv.py)")
    fig.tight_layout()
    fig.savefig(PLOT)


def mb(n):
    return f"{n / 1e6:.1f} MB"


def card(m: Path):
    t = json.loads((m / "training.json").read_text())
    cfg = json.loads((m / "config.json").read_text())
    arch = cfg["architectures"][0]
    weights = sum(f.stat().st_size for f in m.glob("*.safetensors"))
    c = t["corpus"]
    lines = [
        f"# {m.name}",
        "",
        f"A small **{arch}** trained by qhx on the King James Bible, so that qhx has a default model "
        "that writes readable text and makes quantization quality measurable (real Qwen weights cannot "
        "be downloaded where qhx is built). It continues text in the style of the KJV; it is not an "
        "assistant and knows nothing else.",
        "",
        f"- Architecture: {ARCH_LINES[arch]}; {cfg.get('num_hidden_layers')} layers, hidden "
        f"{cfg['hidden_size']}, tied embeddings, the real Qwen3 tokenizer (151,936 tokens).",
        f"- Parameters: {t['parameters']:,} ({t['parameters'] - cfg['vocab_size'] * cfg['hidden_size']:,} "
        f"outside the embedding table); weights {mb(weights)} (bf16"
        + ("; GDN `A_log` and `linear_attn.norm` in f32 as in the released checkpoints" if arch == "Qwen3_5ForCausalLM" else "")
        + ("; the MTP head below included" if "mtp" in t else "") + ").",
        f"- Training: {t['tokens_seen']:,} tokens ({t['tokens_seen'] / c['train_tokens']:.1f} epochs), "
        f"{t['train_seconds'] / 60:.0f} min on {t['machine']['threads']} CPU thread (the two KJV models "
        f"trained side by side on a 2-core machine), torch {t['versions']['torch']}, transformers "
        f"{t['versions']['transformers']}. Both loss curves were still falling: more steps would help.",
        f"- Command: `{t['command']}`, output copied here (seed {t['args']['seed']}; AdamW, lr {t['args']['lr']} with "
        f"{t['args']['warmup']} warm-up steps and cosine decay to 10%, batch {t['args']['batch']} x "
        f"{t['args']['seq_len']} tokens, bf16 mixed precision with f32 master weights).",
        "",
        "## Corpus and licence",
        "",
        f"Debian package `{c['package']}` {c['version']}, read with {c['reader']}. {c['licence']}. Each "
        "chapter is one document (heading line, one verse per line, no verse numbers), documents "
        f"separated by `<|endoftext|>`. Held out: {c['held_out_rule']} ({c['held_out_chapters']} chapters, "
        f"{c['held_out_tokens']:,} tokens, in `held_out.txt`); trained on the other {c['train_chapters']} "
        f"({c['train_tokens']:,} tokens). The tokenizer files are the Qwen team's, Apache-2.0 (`LICENSE`).",
        "",
        "## Quality",
        "",
        f"Held-out perplexity (windows of {t['held_out_ppl']['window']} tokens): "
        f"**{t['held_out_ppl']['shipped_bf16']:.2f}** for the shipped bf16 weights computed in f32 "
        f"({t['held_out_ppl']['f32_trained']:.2f} for the f32 weights before rounding to bf16), "
        "measured with transformers. Loss curve: `docs/training_loss.png`.",
        "",
    ]
    if "mtp" in t:
        h = t["mtp"]
        agree = h["held_out_first_draft_agreement"]
        lines += [
            "## Multi-token-prediction head (speculative decoding)",
            "",
            f"`mtp.*` in `model.safetensors`: Qwen3.5's MTP module (fc over the next token's embedding "
            f"and the model's final hidden state, one gated full-attention layer, a norm, the tied "
            f"lm_head), {h['parameters']:,} parameters, trained by `{h['command']}` with the model "
            f"frozen: {h['tokens_seen']:,} tokens, {h['train_seconds'] / 60:.0f} min on "
            f"{h['machine']['threads']} CPU threads. It learns the model's own next-step distribution "
            f"(self-distillation) over its draft vocabulary, `draft_vocab.json`: the "
            f"{h['draft_vocab']['tokens']:,} most frequent tokens of the training split "
            f"({100 * h['draft_vocab']['training_coverage']:.2f}% of its tokens). On the held-out "
            f"chapters its first draft is the model's next greedy token at "
            f"{100 * agree['draft_vocab']:.1f}% of {agree['rows']:,} positions. Use: "
            "`--speculative mtp` (docs/speculative.md; speed in bench/RESULTS.md). Goldens of the head "
            "from the PyTorch reference: `mtp_golden.*` (`tools/oracle/make_mtp_fixtures.py`).",
            "",
        ]
    qpath = m / "quantization.json"
    if qpath.exists():
        q = json.loads(qpath.read_text())
        f32 = q["formats"]["f32"]["perplexity"]
        lines += [
            "## Quantization (qhx forge, measured with qhx)",
            "",
            f"Each format against the checkpoint computed in f32, on {q['prompt_suite']['prompts']} held-out "
            f"verse openings (`{q['prompt_suite']['file']}`) x {q['prompt_suite']['greedy_tokens']} greedy "
            f"tokens, and perplexity on the {q['held_out']['tokens']:,} held-out tokens "
            f"(`tools/train/evaluate_quant.py`; f32 perplexity {f32:.4f}). Gate thresholds: docs/gate.md. "
            "The embedding table (also the tied lm_head) is most of the file at this size and stays "
            "bf16 in quantized bundles, so the sizes shrink little; the decoder matrices are what W8/W4 "
            "quantize.",
            "",
            "| weights | size | perplexity | Δ ppl | top-1 | top-5 | min Pearson r | mean KL | greedy match | gate |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for fmt, e in q["formats"].items():
            if fmt == "f32":
                continue
            lines.append(
                f"| {fmt} (embed/head {e['precision_policy']['embed']}) | {mb(e['weight_bytes'])} | "
                f"{e['perplexity']:.4f} | {100 * (e['perplexity'] / f32 - 1):+.3f}% | {e['top1']:.4f} | "
                f"{e['top5']:.4f} | {e['pearson_min']:.6f} | {e['kl_mean']:.2e} | "
                f"{e['greedy_matched']}/{e['prompts']} | {'pass' if e['passed'] else 'FAIL'} |")
        lines.append("")
    lines += [
        "## Use",
        "",
        "```sh",
        f"build/qhx generate --model {m.relative_to(REPO) if m.is_absolute() else m} "
        "--prompt \"And it came to pass\" -n 64",
        "```",
        "",
        "Golden outputs from transformers (float32, eager) for this checkpoint are in "
        f"`tests/fixtures/{'qwen3_5' if arch == 'Qwen3_5ForCausalLM' else 'qwen3'}/kjv_trained/` "
        "(`tools/oracle/make_trained_fixtures.py`); qhx's parity tests run on them.",
        "",
    ]
    (m / "README.md").write_text("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", type=Path, nargs="+")
    args = ap.parse_args()
    models = [m.resolve() for m in args.models]
    plot(models)
    for m in models:
        card(m)


if __name__ == "__main__":
    main()
