#!/usr/bin/env python3
"""A tiny random Qwen3.5 at the real vocabulary size (248,320 rows) with the Qwen3.5 tokenizer.

Writes the checkpoint to models/qwen3.5-tiny-random (transformers' save_pretrained, bf16 with the
GDN's A_log and norm in f32, the Qwen3.5 tokenizer files from tests/fixtures/tokenizer/qwen3_5, a
model card) and golden outputs for text prompts to tests/fixtures/qwen3_5/fullvocab_tied_bf16:
the prompts' ids (transformers' AutoTokenizer, cross-checked with the tokenizers library), logits
at every position for every LOGIT_STRIDE-th vocabulary row, 64-step greedy continuations (over the
whole vocabulary) and the GDN states after prefill, with the same HF self-checks as
make_qwen3_5_fixtures.py, whose model construction it reuses.

Prompts: for each slot the first candidate text whose greedy steps clear the acceptance rule
(oracle_common.py's, with the margin of MIN_REL_MARGIN_FULLVOCAB); the choice is deterministic
and recorded in golden.json.

Usage: $ORACLE_VENV/bin/python tools/oracle/make_qwen3_5_fullvocab_fixture.py   (~1 min)
"""

import json
import platform
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_qwen3_5_fixtures as q35  # noqa: E402
from oracle_common import (  # noqa: E402
    MIN_DISTINCT_GREEDY,
    N_GREEDY,
    evaluate,
    make_world_readable,
    rel_margin,
    setup_determinism,
    write_golden,
)

REPO = q35.REPO
SCRIPT_REL = "tools/oracle/make_qwen3_5_fullvocab_fixture.py"
CKPT_REL = "models/qwen3.5-tiny-random"
GOLDEN_REL = "tests/fixtures/qwen3_5/fullvocab_bf16"
TOKENIZER_SRC = REPO / "tests/fixtures/tokenizer/qwen3_5"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "LICENSE", "NOTICE"]
LOGIT_STRIDE = 61  # golden logit rows 0, 61, 122, ...: 4,071 of 248,320
SEED = 3
# Among 248,320 random logits the gap between the two largest is a small fraction of the largest
# (~1/(2 ln V) times an exponential variable), so 64 greedy steps rarely all clear oracle_common's
# 2e-3. 5e-4 still leaves 5x the parity tests' logit tolerance (1e-4 of max|logit|): logits that
# agree within it cannot swap the top two.
MIN_REL_MARGIN_FULLVOCAB = 5e-4

FX = dict(
    name="fullvocab_bf16",
    arch="Qwen3_5ForCausalLM",
    vocab_size=248320, hidden_size=16, intermediate_size=64, num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],  # R = 8
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    tie_word_embeddings=False, storage="bf16+f32", max_shard_size=None, mtp=False,
    extra_text=dict(eos_token_id=248044, pad_token_id=248044, bos_token_id=None),
)

TEXT_CANDIDATES = [
    ["Hello", "Hello!", "Hello, world!", "Hi there", "Hey", "Good morning", "Hello again", "Greetings"],
    ["The quick brown fox jumps over the lazy dog.", "All that glitters is not gold.",
     "A journey of a thousand miles begins with a single step.", "The early bird catches the worm.",
     "To be, or not to be, that is the question.", "Sphinx of black quartz, judge my vow."],
    ["这家餐厅的饺子特别好吃。", "今天天气很好，我们一起去公园散步吧。", "我喜欢学习新的编程语言。",
     "春天来了，花儿都开了。", "请问最近的地铁站在哪里？"],
    # Thai and Devanagari: combining marks join the letters in Qwen3.5's split (\p{M}).
    ["สวัสดีครับ ยินดีที่ได้รู้จัก", "नमस्ते, आप कैसे हैं?", "ภาษาไทยมีวรรณยุกต์", "हिन्दी भाषा सुंदर है।",
     "ขอบคุณมากครับ"],
    ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     "<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"],
    ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
     "SELECT name FROM users WHERE id = 1;", "fn main() { println!(\"hi\"); }"],
]
STATE_PROMPTS = ["p0", "p4"]

# Conditioning (make_qwen3_5_fixtures.py's README note): every block adds a small correction
# (gain 0.2, the last MLP included) to the token's embedding, and the head is untied, so the
# greedy walk does not repeat a token (a tied head would pick the current token) and rounding
# the blocks to W8 or W4 perturbs the logits by a small fraction of their spread: the bundles
# are gated at the default W8/W4 thresholds on this model.
BLOCK_GAIN = 0.2

GENERATION_CONFIG = {
    "bos_token_id": 248044,
    "do_sample": True,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

MODEL_CARD = """---
license: apache-2.0
library_name: transformers
tags:
  - qwen3_5
  - random-weights
  - test-fixture
---

# qwen3.5-tiny-random

A **randomly initialised** Qwen3.5 (hybrid Gated DeltaNet + gated attention) checkpoint for
qhx's tests and demos. It has the real Qwen3.5 vocabulary size (248,320 rows) and the Qwen3.5
tokenizer files, but tiny dimensions and **random weights**: its output is meaningless text. It
is not a trained model and is not derived from any trained model's weights.

| | |
|---|---|
| architecture | `Qwen3_5ForCausalLM` |
| vocab_size | 248320 (tokenizer: 248,077 tokens) |
| hidden_size | 16 |
| layers | 4 (3 Gated DeltaNet, then 1 gated full attention) |
| heads / kv heads / head_dim | 4 / 2 / 32, partial rotary 0.25 |
| DeltaNet key / value heads, head dim | 2 / 4, 16 |
| intermediate_size | 64 |
| tie_word_embeddings | false (every block adds a small correction to the token's embedding: a tied head would repeat the token) |
| stored dtype | bfloat16 (A_log and the DeltaNet norm in float32, as real checkpoints) |

Generated by `tools/oracle/make_qwen3_5_fullvocab_fixture.py` (fixed seed) with Hugging Face
transformers; `config.json` is what `save_pretrained` wrote, `generation_config.json` has the
real Qwen3.5 small models' stop ids and sampling defaults. Golden outputs for it (float32 eager
reference) live in `tests/fixtures/qwen3_5/fullvocab_tied_bf16/`.

`tokenizer.json`, `tokenizer_config.json`, `LICENSE` and `NOTICE` are copies of the Qwen3.5
tokenizer fixture (`tests/fixtures/tokenizer/qwen3_5`, whose README says how the files were rebuilt
from the published ranks and validated; Apache-2.0, Qwen team, Alibaba Cloud).
"""


def tokenize(ckpt: Path, text: str):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(ckpt))
    ids = auto(text, add_special_tokens=False)["input_ids"]
    raw = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert ids == raw, (text, ids, raw)
    assert type(auto).__name__ == "Qwen3_5Tokenizer", type(auto).__name__
    return ids


def choose_prompts(ref, ckpt: Path):
    chosen = []
    for i, candidates in enumerate(TEXT_CANDIDATES):
        for k, text in enumerate(candidates):
            r = evaluate(ref, [(f"p{i}", text, tokenize(ckpt, text))], N_GREEDY)[0]
            print(f"  p{i} candidate {k}: rel margin {rel_margin(r):.3e}, "
                  f"{len(set(r['greedy']))} distinct greedy ids", flush=True)
            if rel_margin(r) >= MIN_REL_MARGIN_FULLVOCAB and len(set(r["greedy"])) >= MIN_DISTINCT_GREEDY:
                chosen.append((k, r))
                break
        else:
            raise SystemExit(f"p{i}: no candidate clears the acceptance rule; add candidates")
    return chosen


def main():
    setup_determinism()
    env = {"fast_paths": q35.fast_path_report(), "provenance": q35.transformers_provenance()}
    ckpt, gold = REPO / CKPT_REL, REPO / GOLDEN_REL
    for d in (ckpt, gold):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)

    q35.INNER_GAIN = q35.LAST_MLP_IN_GAIN = q35.LAST_MLP_DOWN_GAIN = BLOCK_GAIN
    model = q35.build_random_model(FX, SEED)
    q35.save_checkpoint(model, FX, SEED, ckpt)
    del model
    for f in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_SRC / f, ckpt / f)
    gen = dict(GENERATION_CONFIG, transformers_version=q35.transformers.__version__)
    (ckpt / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    (ckpt / "README.md").write_text(MODEL_CARD)

    ref = q35.load_reference(FX, ckpt)
    assert ref.config.get_text_config().vocab_size == FX["vocab_size"]
    q35.check_reference_weights(ref, FX, ckpt)

    chosen = choose_prompts(ref, ckpt)
    res = [r for _, r in chosen]
    lengths = {r["name"]: len(r["ids"]) for r in res}
    # The HF self-checks' multi-segment prefills, from these prompts' lengths.
    q35.SEGMENT_SPLITS = {n: [[1, lengths[n] - 1], [lengths[n] // 2, lengths[n] - lengths[n] // 2]]
                          for n in STATE_PROMPTS}
    checks, prefill_states = q35.hf_checks(ref, res)

    rows = torch.arange(0, FX["vocab_size"], LOGIT_STRIDE, dtype=torch.int64)
    tensors, prompt_meta = {"logit_rows": rows.clone()}, []
    for (k, r) in chosen:
        n = r["name"]
        tensors[f"{n}.ids"] = torch.tensor(r["ids"], dtype=torch.int64)
        tensors[f"{n}.logits"] = r["logits"][:, rows].to(torch.float32).contiguous().clone()
        tensors[f"{n}.greedy"] = torch.tensor(r["greedy"], dtype=torch.int64)
        prompt_meta.append(dict(name=n, text=r["text"], candidate=k, length=len(r["ids"]),
                                min_greedy_margin=min(r["margins"]), max_abs_logit=r["max_abs"],
                                distinct_greedy_ids=len(set(r["greedy"]))))
    for n in STATE_PROMPTS:
        for i, (conv, rec) in prefill_states[n].items():
            tensors[f"{n}.conv.layer{i}"] = conv.to(torch.float32).contiguous()
            tensors[f"{n}.state.layer{i}"] = rec.to(torch.float32).contiguous()

    meta = {
        "checkpoint": CKPT_REL,
        "generator": dict(script=SCRIPT_REL, torch=torch.__version__, **env["provenance"],
                          python=platform.python_version(), seed=SEED, fast_paths=env["fast_paths"]),
        "model_class": FX["arch"],
        "weight_prefix": "model.",
        "storage": "bfloat16, except *.linear_attn.A_log and *.linear_attn.norm.weight in float32",
        "dtype": "float32",
        "attn_implementation": "eager",
        "device": "cpu",
        "tf32": False,
        "gdn_chunk_size": q35.GDN_CHUNK,
        "logit_rows": "sampled",
        "logit_stride": LOGIT_STRIDE,
        "n_greedy": N_GREEDY,
        "min_rel_margin": MIN_REL_MARGIN_FULLVOCAB,
        "prompts": prompt_meta,
        "states": {"prompts": STATE_PROMPTS, "layers": q35.gdn_layers(ref),
                   "after": "one-shot prefill of the whole prompt with use_cache=True (HF DynamicCache)"},
        "hf_checks": checks,
    }
    write_golden(gold, tensors, meta)
    make_world_readable([ckpt, gold])
    print(f"{GOLDEN_REL}: prompts {[(r['name'], len(r['ids'])) for r in res]}, "
          f"min rel margin {min(rel_margin(r) for r in res):.3e}, "
          f"decode-over-prompt {checks['decode_over_prompt']['logits_max_abs_rel']:.2e} rel, "
          f"continued prefill {checks['continued_prefill']['logits_max_abs_rel']:.2e} rel")


if __name__ == "__main__":
    main()
