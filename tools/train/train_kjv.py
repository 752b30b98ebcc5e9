#!/usr/bin/env python3
"""Train qhx's small shipped models on the King James Bible, on the CPU, with transformers itself.

Two architectures, one corpus, one tokenizer (the real Qwen3 tokenizer, full 151,936-token vocab):

    qwen3_5  Qwen3_5ForCausalLM: 8 layers (Gated DeltaNet x3 + gated full attention) x 2, value heads
             = 2 x key heads, tied embeddings
    qwen3    Qwen3ForCausalLM: 8 dense GQA layers with q/k-norm, tied embeddings

Corpus: Debian package bible-kjv-text (the KJV text, public domain; read through the `bible` program
of package bible-kjv).  Every chapter is one document: a heading line ("Genesis 1") and one verse per
line, without verse numbers; documents are separated by <|endoftext|>.  Every 50th chapter (index
25, 75, ...) is held out for perplexity.

    apt-get install bible-kjv                           # pulls bible-kjv-text
    $ORACLE_VENV/bin/python tools/train/train_kjv.py --arch qwen3_5 --steps 1800 \
        --threads 1 --out models/qwen3.5-kjv

Writes into --out: config.json, model.safetensors (bf16; GDN A_log and linear_attn.norm in f32 as in
the released Qwen3.5 checkpoints), generation_config.json, the tokenizer files, and training.json
(command, seed, corpus provenance, loss curve, held-out perplexity of the f32 weights and of the
saved bf16 weights).  tools/train/plot_loss.py turns training.json files into docs/ images.
"""

import argparse
import json
import math
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

from kjv_corpus import HELD_OUT_EVERY, HELD_OUT_PHASE, kjv_chapters, split_corpus

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "tests" / "fixtures" / "tokenizer" / "qwen3"
EOT = 151643  # <|endoftext|>
VOCAB = 151936
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")

ARCHS = {
    "qwen3_5": dict(
        cls=Qwen3_5ForCausalLM,
        config=lambda: Qwen3_5TextConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4,
            hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            tie_word_embeddings=True, bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT,
            initializer_range=0.02),
    ),
    "qwen3": dict(
        cls=Qwen3ForCausalLM,
        config=lambda: Qwen3Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            tie_word_embeddings=True, bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT,
            initializer_range=0.02),
    ),
}


def dpkg_version(pkg):
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True, capture_output=True,
                          text=True).stdout


def token_stream(tok, docs):
    ids = []
    for d in docs:
        ids.extend(tok.encode(d, add_special_tokens=False).ids)
        ids.append(EOT)
    return torch.tensor(ids, dtype=torch.int64)


def save_held_out(held, path):
    """The held-out text exactly as tokenised (documents joined by <|endoftext|>)."""
    path.write_text("<|endoftext|>".join(held) + "<|endoftext|>")


@torch.no_grad()
def perplexity(model, stream, seq_len):
    """exp(mean next-token NLL) over non-overlapping seq_len+1 windows covering the whole stream."""
    model.eval()
    nll, n = 0.0, 0
    for s in range(0, len(stream) - 1, seq_len):
        x = stream[s:s + seq_len + 1]
        if len(x) < 2:
            break
        logits = model(input_ids=x[None, :-1]).logits[0].float()
        nll += float(torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum"))
        n += len(x) - 1
    model.train()
    return math.exp(nll / n), n


class FusedHeadCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of softmax(h @ W^T) against y, computed in token chunks.

    The full-vocab head dominates training cost at this size; doing it chunk by chunk with the
    gradients formed in the forward pass never materialises the [tokens, 151936] logits and their
    gradient, and runs the three matmuls in bf16 (mixed precision: softmax and accumulation in f32,
    master weights f32)."""

    CHUNK = 256

    @staticmethod
    def forward(ctx, h, w, y):
        wb = w.to(torch.bfloat16)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(w)
        total = torch.zeros((), dtype=torch.float64)
        n = h.shape[0]
        for s in range(0, n, FusedHeadCrossEntropy.CHUNK):
            hc, yc = h[s:s + FusedHeadCrossEntropy.CHUNK], y[s:s + FusedHeadCrossEntropy.CHUNK]
            hb = hc.to(torch.bfloat16)
            logp = torch.log_softmax(hb @ wb.t(), -1, dtype=torch.float32)
            total -= logp.gather(1, yc[:, None]).sum().double()
            probs = logp.exp_()
            probs[torch.arange(len(yc)), yc] -= 1.0  # d(sum NLL)/d(logits)
            pb = probs.to(torch.bfloat16)
            grad_h[s:s + len(yc)] = (pb @ wb).float()
            grad_w += (pb.t() @ hb).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n = n
        return (total / n).float()

    @staticmethod
    def backward(ctx, g):
        grad_h, grad_w = ctx.saved_tensors
        scale = g / ctx.n
        return grad_h * scale, grad_w * scale, None


def training_loss(model, x):
    """Next-token loss of a [batch, seq_len+1] window: position t predicts x[t+1]."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=x[:, :-1], use_cache=False).last_hidden_state
    hidden = hidden.float().flatten(0, 1)
    return FusedHeadCrossEntropy.apply(hidden, model.lm_head.weight, x[:, 1:].flatten())


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def to_shipped_dtype(model):
    """bf16 everywhere, except the tensors the released Qwen3.5 checkpoints keep in f32."""
    keep = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(F32_SUFFIXES)}
    model = model.to(torch.bfloat16)
    for n, p in model.named_parameters():
        if n in keep:
            p.data = keep[n]
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens used for the periodic eval")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    transformers.logging.set_verbosity_error()

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    train_docs, held_docs = split_corpus(kjv_chapters())
    train_ids, held_ids = token_stream(tok, train_docs), token_stream(tok, held_docs)
    print(f"corpus: {len(train_docs)} train chapters, {len(train_ids)} tokens; "
          f"{len(held_docs)} held-out chapters, {len(held_ids)} tokens", flush=True)

    spec = ARCHS[args.arch]
    cfg = spec["config"]()
    cfg.architectures = [spec["cls"].__name__]
    model = spec["cls"](cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    eval_ids = held_ids[:args.eval_tokens + 1]

    curve, evals = [], []
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.seq_len + 1] for s in starts.tolist()])
        loss = training_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(round(loss.item(), 5))
        if step % 10 == 0:
            el = time.time() - t0
            print(f"step {step} loss {float(loss):.4f} lr {lr_at(step, args):.2e} "
                  f"{el:.0f}s ({el / (step + 1):.2f}s/step)", flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            ppl, _ = perplexity(model, eval_ids, args.seq_len)
            evals.append({"step": step + 1, "held_out_ppl": round(ppl, 4)})
            print(f"eval step {step + 1} held-out ppl {ppl:.3f}", flush=True)
    train_s = time.time() - t0

    model.eval()
    ppl_f32, n_eval = perplexity(model, held_ids, args.seq_len)
    model = to_shipped_dtype(model)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out), safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "LICENSE"):
        shutil.copy(TOKENIZER_DIR / f, args.out / f)
    gen_cfg = {"bos_token_id": EOT, "eos_token_id": [151645, EOT], "pad_token_id": EOT, "do_sample": True,
               "temperature": 0.7, "top_k": 40, "top_p": 0.95, "transformers_version": transformers.__version__}
    (args.out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    shipped = spec["cls"].from_pretrained(str(args.out), dtype=torch.float32, attn_implementation="eager")
    ppl_shipped, _ = perplexity(shipped, held_ids, args.seq_len)
    save_held_out(held_docs, args.out / "held_out.txt")

    report = {
        "command": "tools/train/train_kjv.py " + " ".join(sys.argv[1:]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "corpus": {"package": "bible-kjv-text", "version": dpkg_version("bible-kjv-text"),
                   "reader": f"bible-kjv {dpkg_version('bible-kjv')}: bible -l0 gen1:1-rev22:21",
                   "licence": "King James Version (1611): public domain; the Debian packaging allows "
                              "unrestricted use (debian/copyright of bible-kjv-text)",
                   "train_chapters": len(train_docs), "train_tokens": len(train_ids),
                   "held_out_rule": f"chapter index % {HELD_OUT_EVERY} == {HELD_OUT_PHASE}",
                   "held_out_chapters": len(held_docs), "held_out_tokens": len(held_ids)},
        "parameters": n_params,
        "tokens_seen": args.steps * args.batch * args.seq_len,
        "train_seconds": round(train_s, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "held_out_ppl": {"f32_trained": round(ppl_f32, 4), "shipped_bf16": round(ppl_shipped, 4),
                         "tokens": n_eval, "window": args.seq_len},
        "loss_curve": curve,
        "evals": evals,
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {train_s:.0f}s: held-out ppl f32 {ppl_f32:.3f}, shipped bf16 {ppl_shipped:.3f}")


if __name__ == "__main__":
    main()
