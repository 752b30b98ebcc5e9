#!/usr/bin/env python3
"""Train a multi-token-prediction (MTP) head for a shipped Qwen3.5 model, the base model frozen.

The head is Qwen3.5's own (tools/oracle/mtp_reference.py: fc over the normed embedding of the next
token and the model's final-norm hidden state, one full-attention decoder layer, a norm, the
model's tied lm_head). Row i pairs the model's hidden state at position i with the token at i + 1
and predicts the token at i + 2.

What it learns: the model's own next-step distribution over the draft vocabulary (below;
self-distillation), not the corpus's next token. Speculative decoding keeps a draft token when the model would have produced it (greedy: its
argmax; sampling: by the acceptance rule against its distribution), so the best draft is the
model's prediction; the loss is the cross-entropy of the head's softmax against the model's softmax
at position i + 1, both restricted to the draft vocabulary (KL up to a constant), on the
training split of train_kjv.py's corpus.

The draft vocabulary: the head drafts from the tokens of the training split, most frequent first,
written as draft_vocab.json beside the checkpoint (qhx multiplies the head's output only by those
rows of the lm_head; docs/speculative.md).

    apt-get install bible-kjv
    $ORACLE_VENV/bin/python tools/train/train_mtp.py --model models/qwen3.5-kjv --steps 1500 --warmup 60

Adds the mtp.* tensors (bf16, as the released Qwen3.5 checkpoints) to --model's model.safetensors,
writes draft_vocab.json, and records the run under "mtp" in training.json: command, loss curve,
held-out agreement of the head's argmax with the model's next greedy token.
"""

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Qwen3_5ForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "oracle"))
from mtp_reference import MtpHead, text_parts  # noqa: E402
from train_kjv import TOKENIZER_DIR, kjv_chapters, lr_at, split_corpus, token_stream  # noqa: E402

CHUNK = 256


class DistillHeadLoss(torch.autograd.Function):
    """mean over rows of -sum_v p_v log q_v, q = softmax(h @ W^T) (the head's), p = softmax(t @ W^T)
    (the model's, t its final-norm hidden one position later), computed chunk by chunk so the
    [rows, vocab] logits are never all held; W (rows of the tied lm_head) is frozen: only h gets a
    gradient, q - p per row, formed in the forward pass."""

    @staticmethod
    def forward(ctx, h, t, w):
        wb = w.to(torch.bfloat16)
        grad_h = torch.empty_like(h)
        total = torch.zeros((), dtype=torch.float64)
        for s in range(0, h.shape[0], CHUNK):
            hb, tb = h[s:s + CHUNK].to(torch.bfloat16), t[s:s + CHUNK].to(torch.bfloat16)
            p = torch.softmax(tb @ wb.t(), -1, dtype=torch.float32)
            logq = torch.log_softmax(hb @ wb.t(), -1, dtype=torch.float32)
            total -= (p * logq).sum().double()
            grad_h[s:s + CHUNK] = ((logq.exp_() - p).to(torch.bfloat16) @ wb).float()
        ctx.save_for_backward(grad_h)
        ctx.n = h.shape[0]
        return (total / ctx.n).float()

    @staticmethod
    def backward(ctx, g):
        (grad_h,) = ctx.saved_tensors
        return grad_h * (g / ctx.n), None, None


def head_rows(model, head, x):
    """(head outputs [B*(L-1), H], the model's hidden one position on [B*(L-1), H]) of windows x
    [B, L]: row i pairs the model's hidden at i with x[i + 1]; its target is the model at i + 1."""
    text, _ = text_parts(model)
    with torch.no_grad():
        hidden = text(input_ids=x, use_cache=False).last_hidden_state
    out = head(hidden[:, :-1], x[:, 1:], text.embed_tokens, text.rotary_emb)
    return out.flatten(0, 1), hidden[:, 1:].flatten(0, 1)


@torch.no_grad()
def agreement(model, head, stream, seq_len, vocab_ids):
    """Over non-overlapping windows of the stream: how often the head's argmax (over vocab_ids)
    equals the model's greedy next token one position on, i.e. how often a first draft is kept."""
    _, lm_head = text_parts(model)
    w = lm_head.weight[vocab_ids]
    hits = n = 0
    for s in range(0, len(stream) - 1, seq_len):
        x = stream[s:s + seq_len][None]
        if x.shape[1] < 2:
            break
        out, target = head_rows(model, head, x)
        draft = vocab_ids[(out @ w.t()).argmax(-1)]
        hits += int((draft == lm_head(target).argmax(-1)).sum())
        n += len(draft)
    return hits / n, n


def draft_vocab(stream, coverage):
    """Token ids of the stream, most frequent first, as many as cover `coverage` of its tokens."""
    counts = Counter(stream.tolist()).most_common()
    total, kept, ids = sum(c for _, c in counts), 0, []
    for tok, c in counts:
        if kept >= coverage * total:
            break
        ids.append(tok)
        kept += c
    return ids, kept / total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--coverage", type=float, default=0.999,
                    help="share of the training tokens the draft vocabulary covers")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    train_docs, held_docs = split_corpus(kjv_chapters())
    train_ids, held_ids = token_stream(tok, train_docs), token_stream(tok, held_docs)
    vocab, covered = draft_vocab(train_ids, args.coverage)
    vocab_ids = torch.tensor(vocab, dtype=torch.int64)
    print(f"draft vocabulary: {len(vocab)} tokens cover {covered:.4%} of the training split", flush=True)

    model = Qwen3_5ForCausalLM.from_pretrained(str(args.model), dtype=torch.float32,
                                               attn_implementation="eager")
    model.eval()
    model.requires_grad_(False)
    text, lm_head = text_parts(model)
    cfg = model.config
    head = MtpHead(cfg)
    # The decoder layer starts as the model's last full-attention layer (a trained block that
    # reads states like the head's), the rest from the module's own initialisation.
    last_full = len(cfg.layer_types) - 1 - cfg.layer_types[::-1].index("full_attention")
    head.layers[0].load_state_dict(text.layers[last_full].state_dict())
    head.train()
    decay = [p for p in head.parameters() if p.dim() >= 2]
    no_decay = [p for p in head.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    # The loss is over the draft vocabulary: the head only ever drafts from it, and the [rows,
    # vocab] products it needs are 17x smaller than the whole vocabulary's.
    head_rows_w = lm_head.weight[vocab_ids]

    curve = []
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.seq_len + 1] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, target = head_rows(model, head, x)
        loss = DistillHeadLoss.apply(out.float(), target.float(), head_rows_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        curve.append(round(loss.item(), 5))
        if step % 10 == 0:
            el = time.time() - t0
            print(f"step {step} loss {loss.item():.4f} {el:.0f}s ({el / (step + 1):.2f}s/step)", flush=True)
    train_s = time.time() - t0

    head.eval()
    shipped = {k: v.to(torch.bfloat16) for k, v in head.state_tensors().items()}
    head.load_from(shipped)  # what the checkpoint will hold, upcast again
    agree, n_rows = agreement(model, head, held_ids, args.seq_len, vocab_ids)
    agree_full, _ = agreement(model, head, held_ids, args.seq_len, torch.arange(cfg.vocab_size))
    print(f"held-out: the head's first draft = the model's next greedy token on {agree:.2%} of "
          f"{n_rows} rows ({agree_full:.2%} over the whole vocabulary)", flush=True)

    weights_file = args.model / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(weights_file)).items() if not k.startswith("mtp.")}
    tensors.update({k: v.contiguous() for k, v in shipped.items()})
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    (args.model / "draft_vocab.json").write_text(json.dumps({
        "format": "qhx-draft-vocab", "version": 1, "vocab_size": cfg.vocab_size,
        "source": f"tools/train/train_mtp.py: the tokens of the KJV training split, most frequent first, "
                  f"covering {covered:.4%} of it",
        "ids": vocab}) + "\n")

    report_file = args.model / "training.json"
    report = json.loads(report_file.read_text())
    report["mtp"] = {
        "command": "tools/train/train_mtp.py " + " ".join(sys.argv[1:]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "objective": "cross-entropy of the head's softmax against the frozen model's one position on, over the draft vocabulary",
        "parameters": sum(p.numel() for p in head.parameters()),
        "tokens_seen": args.steps * args.batch * args.seq_len,
        "train_seconds": round(train_s, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "draft_vocab": {"tokens": len(vocab), "training_coverage": round(covered, 6)},
        "held_out_first_draft_agreement": {"draft_vocab": round(agree, 4), "full_vocab": round(agree_full, 4),
                                           "rows": n_rows},
        "loss_curve": curve,
    }
    report_file.write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {train_s:.0f}s")


if __name__ == "__main__":
    main()
