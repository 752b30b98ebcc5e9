"""Golden sampling distributions for the C++ Sampler (tests/sampling_test.cc).

For random logit rows and parameter sets, builds the LogitsProcessorList exactly as generate() does
(`model._get_logits_processor` on a tiny Qwen3 model: repetition penalty, then with do_sample the
temperature, top-k, top-p and min-p warpers) and runs it on the row, with the sequence so far
(prompt + generated) as input_ids. presence/frequency penalties and logit_bias are not
transformers features: they are applied first, to the raw float32 logits, with the OpenAI formula
(l[t] += bias[t] - frequency·count[t] - presence·[count[t] > 0], counts over generated tokens).

Writes tests/fixtures/sampling/distributions.json: per case the inputs and the surviving ids
(ascending) with their probabilities (float64 softmax of the processed float32 scores). A case
whose top-p or min-p cut lies within MARGIN of a token is redrawn, so float32-vs-float64
rounding cannot move the boundary.

Usage: $ORACLE_VENV/bin/python tools/oracle/make_sampling_fixtures.py
"""

import json
from pathlib import Path

import torch
from transformers import GenerationConfig, LogitsProcessorList, Qwen3Config, Qwen3ForCausalLM

from oracle_common import setup_determinism

OUT = Path(__file__).resolve().parents[2] / "tests/fixtures/sampling/distributions.json"
MARGIN = 1e-4

# name, vocab, sampling parameters (SamplingParams field names), prompt length, generated length
CASES = [
    ("qwen3_defaults", 64, dict(temperature=0.6, top_k=20, top_p=0.95), 8, 4),
    ("top_p_only", 64, dict(temperature=1.0, top_p=0.8), 8, 0),
    ("top_k_min_p_hot", 64, dict(temperature=1.3, top_k=10, min_p=0.05), 4, 4),
    ("min_p_cold", 64, dict(temperature=0.5, min_p=0.1), 4, 0),
    ("repetition_penalty", 64, dict(temperature=0.9, top_k=30, repetition_penalty=1.3), 12, 10),
    ("repetition_reward", 64, dict(temperature=1.0, top_p=0.9, repetition_penalty=0.8), 12, 6),
    ("presence_frequency_bias", 64,
     dict(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.3,
          logit_bias=[[3, 2.0], [10, -5.0], [40, 1.5]]), 6, 12),
    ("everything", 64,
     dict(temperature=0.7, top_k=20, top_p=0.95, min_p=0.02, repetition_penalty=1.1,
          presence_penalty=1.5, frequency_penalty=0.2, logit_bias=[[5, 3.0], [17, -2.0]]), 10, 10),
    ("greedy_penalized", 64,
     dict(greedy=True, repetition_penalty=1.5, presence_penalty=2.0, logit_bias=[[7, 1.0]]), 10, 8),
    ("large_vocab_top_p", 1000, dict(temperature=0.8, top_p=0.9), 16, 8),
]


def tiny_model(vocab):
    config = Qwen3Config(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    return Qwen3ForCausalLM(config).eval()


def additive_terms(logits, params, generated):
    out = logits.clone()
    for token_id, bias in params.get("logit_bias", []):
        out[token_id] += torch.tensor(bias, dtype=torch.float32)
    presence = torch.tensor(params.get("presence_penalty", 0.0), dtype=torch.float32)
    frequency = torch.tensor(params.get("frequency_penalty", 0.0), dtype=torch.float32)
    if presence != 0 or frequency != 0:
        for token_id in sorted(set(generated)):
            count = torch.tensor(float(generated.count(token_id)), dtype=torch.float32)
            out[token_id] -= frequency * count + presence
    return out


def processors(model, params, seq_len):
    greedy = params.get("greedy", False)
    gc = GenerationConfig(
        do_sample=not greedy,
        temperature=params.get("temperature", 1.0),
        top_k=params.get("top_k", 0),
        top_p=params.get("top_p", 1.0),
        min_p=params.get("min_p") or None,
        repetition_penalty=params.get("repetition_penalty", 1.0),
        num_beams=1,
    )
    mask = torch.ones(1, seq_len, dtype=torch.int64)
    return model._get_logits_processor(generation_config=gc, input_ids_seq_length=seq_len,
                                       logits_processor=LogitsProcessorList(), device="cpu",
                                       model_kwargs={"attention_mask": mask})


def clear_of_boundaries(scores, params):
    """True when no top-p or min-p cut is within MARGIN (checked on the float64 distribution the
    filters see: top-p after top-k, min-p after top-p)."""
    s = scores.double()
    if params.get("top_p", 1.0) < 1.0:
        cumulative = torch.sort(s, descending=False).values.softmax(-1).cumsum(-1)
        if (cumulative - (1.0 - params["top_p"])).abs().min() < MARGIN:
            return False
    if params.get("min_p", 0.0) > 0.0:
        p = s.softmax(-1)
        if ((p / p.max()) - params["min_p"]).abs().min() < MARGIN:
            return False
    return True


def make_case(model, name, vocab, params, n_prompt, n_generated, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(vocab, generator=g) * 1.2).to(torch.float32)
    ids = torch.randint(0, vocab, (n_prompt + n_generated,), generator=g).tolist()
    if n_generated >= 4:  # repeats in the generated part make the frequency term matter
        ids[-1] = ids[-2] = ids[n_prompt]
    prompt, generated = ids[:n_prompt], ids[n_prompt:]
    scores = additive_terms(logits, params, generated)
    procs = processors(model, params, len(ids))
    input_ids = torch.tensor([ids], dtype=torch.int64)
    # Check the cut margins on the scores each filter sees, by running the list one step at a time.
    for proc in procs:
        if type(proc).__name__ in ("TopPLogitsWarper", "MinPLogitsWarper"):
            if not clear_of_boundaries(scores, params if type(proc).__name__ == "TopPLogitsWarper"
                                       else {"min_p": params.get("min_p", 0.0)}):
                return None
        scores = proc(input_ids, scores[None, :])[0]
    if params.get("greedy", False):
        survivors = [[int(torch.argmax(scores)), 1.0]]
    else:
        probs = scores.double().softmax(-1)
        survivors = [[i, float(probs[i])] for i in range(vocab) if probs[i] > 0]
    return {
        "name": name,
        "params": params,
        "logits": [float(x) for x in logits],
        "prompt": prompt,
        "generated": generated,
        "processors": [type(p).__name__ for p in procs],
        "expected": survivors,
    }


def main():
    setup_determinism()
    cases = []
    for index, (name, vocab, params, n_prompt, n_generated) in enumerate(CASES):
        model = tiny_model(vocab)
        seed = 1000 * index
        while (case := make_case(model, name, vocab, params, n_prompt, n_generated, seed)) is None:
            seed += 1
        case["seed"] = seed
        cases.append(case)
        print(f"{name}: {len(case['expected'])} of {vocab} survive ({', '.join(case['processors'])})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"transformers_version": __import__("transformers").__version__,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
