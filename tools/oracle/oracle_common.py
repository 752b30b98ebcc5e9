"""Helpers shared by the reference-oracle scripts (make_qwen3_fixtures.py, make_qwen3_5_fixtures.py).

Everything here is model-agnostic: determinism settings, the forward-argmax greedy loop (without and
with the HF cache, and through generate()), the greedy-margin acceptance rule, random prompt ids and
writing golden files.  See tools/oracle/README.md for the golden file format.
"""

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import GenerationConfig

N_GREEDY = 64
# A fixture is accepted only if, on every greedy step of every prompt,
# (top1 - top2) >= MIN_REL_MARGIN * max|logit| (max over that prompt's logits).
MIN_REL_MARGIN = 2e-3
# ... and its 64 greedy ids contain at least this many distinct tokens (margin selection
# otherwise favours degenerate one-token loops).
MIN_DISTINCT_GREEDY = 12


def setup_determinism():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def random_ids(generator_seed, n, vocab_size):
    """n ids uniform in [0, vocab_size) from a fresh torch.Generator seeded with generator_seed."""
    g = torch.Generator().manual_seed(generator_seed)
    return torch.randint(0, vocab_size, (n,), generator=g, dtype=torch.int64).tolist()


def forward_logits(model, ids):
    x = torch.tensor([ids], dtype=torch.int64)
    out = model(input_ids=x, use_cache=False)
    lg = out.logits[0]
    assert lg.dtype == torch.float32
    return lg


def greedy_recompute(model, ids, n):
    """Forward-argmax loop WITHOUT KV cache: every step re-runs the full sequence."""
    prompt_logits = forward_logits(model, ids)
    seq = list(ids)
    step = prompt_logits[-1]
    greedy, margins = [], []
    max_abs = float(prompt_logits.abs().max())
    for k in range(n):
        tok = int(torch.argmax(step))  # first index on ties
        top2 = torch.topk(step, 2).values
        assert float(step[tok]) == float(top2[0])
        margins.append(float(top2[0] - top2[1]))
        greedy.append(tok)
        seq.append(tok)
        if k + 1 < n:
            lg = forward_logits(model, seq)
            step = lg[-1]
            max_abs = max(max_abs, float(step.abs().max()))
    return prompt_logits, greedy, margins, max_abs


def greedy_cached(model, ids, n):
    """Same loop through the HF cache (cross-check only)."""
    x = torch.tensor([ids], dtype=torch.int64)
    out = model(input_ids=x, use_cache=True)
    past = out.cache
    step = out.logits[0, -1]
    toks, steps = [], []
    for k in range(n):
        tok = int(torch.argmax(step))
        toks.append(tok)
        steps.append(step.clone())
        if k + 1 < n:
            out = model(input_ids=torch.tensor([[tok]]), cache=past, use_cache=True)
            past = out.cache
            step = out.logits[0, -1]
    return toks, steps


def greedy_generate(model, ids, n):
    """HF generate() greedy (cross-check only; the stored eos ids can only stop it early)."""
    gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=0,
                          pad_token_id=0, eos_token_id=None)
    # Explicit all-ones mask: without it generate() infers one from pad_token_id and masks
    # any prompt token equal to it.
    out = model.generate(torch.tensor([ids], dtype=torch.int64),
                         attention_mask=torch.ones(1, len(ids), dtype=torch.int64), generation_config=gc)
    return out[0, len(ids):].tolist()


def evaluate(model, prompts, n):
    """prompts: [(name, text or None, ids)] -> one result dict per prompt."""
    res = []
    for name, text, ids in prompts:
        plog, greedy, margins, max_abs = greedy_recompute(model, ids, n)
        res.append(dict(name=name, text=text, ids=ids, logits=plog, greedy=greedy,
                        margins=margins, max_abs=max_abs))
    return res


def rel_margin(r):
    return min(r["margins"]) / r["max_abs"]


def acceptable(r):
    """The acceptance rule for one evaluated prompt (see MIN_REL_MARGIN / MIN_DISTINCT_GREEDY)."""
    return rel_margin(r) >= MIN_REL_MARGIN and len(set(r["greedy"])) >= MIN_DISTINCT_GREEDY


def write_golden(gold: Path, tensors, meta):
    """golden.safetensors (safetensors library) + golden.json (indent 2, trailing newline)."""
    save_file(tensors, str(gold / "golden.safetensors"))
    with open(gold / "golden.json", "w") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")


def make_world_readable(dirs):
    for d in dirs:
        for f in Path(d).iterdir():
            f.chmod(0o644)  # safetensors/huggingface write some files 0600
