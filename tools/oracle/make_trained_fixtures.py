#!/usr/bin/env python3
"""Golden outputs for the trained models shipped in models/ (tools/train/train_kjv.py).

For each trained checkpoint, loads it from disk with transformers in float32 / eager attention on
the CPU, runs text prompts through the real tokenizer and writes tests/fixtures/<family>/kjv_trained/
golden.{json,safetensors} in the format of the other fixtures (tools/oracle/README.md): prompt ids,
logits at every prompt position (for a subset of vocabulary rows: every 101st id plus every id that
is among the top 32 at some position), 64-step greedy continuations, and for Qwen3.5 the Gated
DeltaNet states after prefill.  Greedy ids are cross-checked through HF's cache and generate().

Candidate prompts are taken in order; one is kept only if, at every greedy step, the top-1 logit
leads the runner-up by at least MIN_REL_MARGIN x max|logit|.  The parity tests accept logits within
1e-4 x max|logit| of these, so a margin of twice that guarantees that an engine passing the logit
test cannot pick a different greedy token.  (The random fixtures use a stricter 2e-3 and a
minimum of distinct greedy ids; a trained model's continuations have genuinely close calls, and
its greedy loops are its real behaviour.)  Rejected candidates are listed in golden.json.

    $ORACLE_VENV/bin/python tools/oracle/make_trained_fixtures.py
"""

import argparse
import platform
import shutil
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from oracle_common import (
    N_GREEDY,
    evaluate,
    greedy_cached,
    greedy_generate,
    make_world_readable,
    rel_margin,
    setup_determinism,
    write_golden,
)
from make_qwen3_5_fixtures import cache_states, prefill_with_cache

REPO = Path(__file__).resolve().parents[2]
SCRIPT_REL = "tools/oracle/make_trained_fixtures.py"
SAMPLE_STRIDE = 101  # the top rows matter; a sparse sample of the rest keeps the files small
TOP_ROWS = 32
N_PROMPTS = 5
MIN_REL_MARGIN = 2e-4  # 2 x the parity tests' logit tolerance (1e-4 x max|logit|)

MODELS = {
    "qwen3": dict(checkpoint="models/qwen3-kjv", golden="tests/fixtures/qwen3/kjv_trained"),
    "qwen3_5": dict(checkpoint="models/qwen3.5-kjv", golden="tests/fixtures/qwen3_5/kjv_trained"),
}

# Short prompts in and out of the corpus's style, then (appended in make_prompts) a long held-out
# passage: > 64 tokens crosses Gated DeltaNet chunk boundaries.
CANDIDATES = [
    "In the beginning God created the heaven and the earth.",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the",
    "The LORD is my shepherd; I shall not want.",
    "And it came to pass, when",
    "For God so loved the world,",
    "Then said Jesus unto them,",
    "The quick brown fox jumps over the lazy dog.",
    "And he answered and said unto them,",
    "O give thanks unto the LORD; for he is good:",
    "And God said, Let there be light:",
    "Hear, O Israel:",
    "And the king said unto",
    "Thus saith the LORD of hosts;",
    "And Jesus answered and said unto him,",
    "My son, hear the instruction of thy father,",
    "And the children of Israel",
    "Praise ye the LORD.",
    "Now the serpent was more subtil than any beast of the field",
    "Once upon a time there was a little girl who",
    "Paul, an apostle of Jesus Christ",
    "And David said to Saul,",
]


def long_prompt(checkpoint: Path, tok, min_tokens=200):
    """The first verses of the first held-out chapter, up to min_tokens tokens."""
    chapter = (checkpoint / "held_out.txt").read_text().split("<|endoftext|>")[0]
    lines = chapter.split("\n")
    text = lines[0]
    for line in lines[1:]:
        text += "\n" + line
        if len(tok.encode(text, add_special_tokens=False).ids) >= min_tokens:
            break
    return text


def make_fixture(family):
    spec = MODELS[family]
    ckpt, gold = REPO / spec["checkpoint"], REPO / spec["golden"]
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    for p in model.parameters():
        assert p.dtype == torch.float32

    def ids_of(text):
        return tok.encode(text, add_special_tokens=False).ids

    kept, rejected = [], []
    candidates = [(t, ids_of(t)) for t in CANDIDATES] + [(long_prompt(ckpt, tok), None)]
    for text, ids in candidates:
        if ids is None:
            ids = ids_of(text)
        elif len(kept) >= N_PROMPTS - 1:
            continue  # the long passage always gets the last slot
        r = evaluate(model, [(f"p{len(kept)}", text, ids)], N_GREEDY)[0]
        if rel_margin(r) >= MIN_REL_MARGIN:
            kept.append(r)
        else:
            rejected.append(dict(text=text, rel_margin=rel_margin(r), distinct=len(set(r["greedy"]))))
    if len(kept) < N_PROMPTS:
        raise SystemExit(f"{family}: only {len(kept)} acceptable prompts; rejected: {rejected}")

    for r in kept:
        toks, _ = greedy_cached(model, r["ids"], N_GREEDY)
        assert toks == r["greedy"], f"{family}/{r['name']}: cached greedy differs from recompute"
        assert greedy_generate(model, r["ids"], N_GREEDY) == r["greedy"], f"{family}/{r['name']}: generate()"

    rows = set(range(0, model.config.vocab_size, SAMPLE_STRIDE))
    for r in kept:
        rows.update(torch.topk(r["logits"], TOP_ROWS, dim=-1).indices.flatten().tolist())
    rows = torch.tensor(sorted(rows), dtype=torch.int64)

    tensors, prompt_meta = {"logit_rows": rows}, []
    for r in kept:
        n = r["name"]
        tensors[f"{n}.ids"] = torch.tensor(r["ids"], dtype=torch.int64)
        tensors[f"{n}.logits"] = r["logits"].index_select(1, rows).to(torch.float32).contiguous()
        tensors[f"{n}.greedy"] = torch.tensor(r["greedy"], dtype=torch.int64)
        prompt_meta.append(dict(name=n, text=r["text"], length=len(r["ids"]),
                                min_greedy_margin=min(r["margins"]), max_abs_logit=r["max_abs"],
                                greedy_text=tok.decode(r["greedy"])))
    if family == "qwen3_5":
        for r in (kept[0], kept[-1]):
            _, cache = prefill_with_cache(model, r["ids"])
            for i, (conv, rec) in cache_states(model, cache).items():
                tensors[f"{r['name']}.conv.layer{i}"] = conv.to(torch.float32).contiguous()
                tensors[f"{r['name']}.state.layer{i}"] = rec.to(torch.float32).contiguous()

    meta = {
        "checkpoint": spec["checkpoint"],
        "generator": {"script": SCRIPT_REL, "torch": torch.__version__,
                      "transformers": transformers.__version__, "python": platform.python_version()},
        "dtype": "float32",
        "attn_implementation": "eager",
        "logit_rows": "sampled",
        "logit_rows_rule": f"every {SAMPLE_STRIDE}th id plus the top {TOP_ROWS} ids at every position",
        "n_greedy": N_GREEDY,
        "prompts": prompt_meta,
        "min_rel_margin_rule": MIN_REL_MARGIN,
        "rejected_prompts": rejected,
    }
    if gold.exists():
        shutil.rmtree(gold)
    gold.mkdir(parents=True)
    write_golden(gold, tensors, meta)
    make_world_readable({gold})
    print(f"{family}: {len(kept)} prompts (lengths {[len(r['ids']) for r in kept]}), "
          f"{len(rows)} logit rows, min rel margin {min(rel_margin(r) for r in kept):.3e}, "
          f"rejected {len(rejected)}")
    for r in kept:
        print(f"  {r['text'][:60]!r} -> {tok.decode(r['greedy'])[:120]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    args = ap.parse_args()
    setup_determinism()
    for family in args.only or sorted(MODELS):
        make_fixture(family)


if __name__ == "__main__":
    main()
