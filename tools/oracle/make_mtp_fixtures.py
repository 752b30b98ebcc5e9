"""Golden outputs of the Qwen3.5 MTP head (mtp_reference.py) for checkpoints that carry mtp.*:
tests/fixtures/qwen3_5/multimodal_layout (random placeholders, multimodal layout) and, when it
has a trained head, models/qwen3.5-kjv. Writes mtp_golden.safetensors + mtp_golden.json beside
each checkpoint's other goldens (which it leaves alone).

Per prompt: the head's logits for every row (the model's final-norm hidden at position i with
the token at i + 1; the last row with the model's greedy next token), and a greedy chain of
N_CHAIN drafts fed back through the head, with each chained row's logits.

    $ORACLE_VENV/bin/python tools/oracle/make_mtp_fixtures.py      # ~10 s
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_reference import MtpHead, mtp_logits_and_chain  # noqa: E402
from oracle_common import random_ids, setup_determinism  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_CHAIN = 4
CHECKPOINTS = [
    dict(dir=ROOT / "tests/fixtures/qwen3_5/multimodal_layout", prompt_lengths=[1, 9, 40]),
    dict(dir=ROOT / "models/qwen3.5-kjv", prompt_lengths=[1, 12, 48]),
]


def load(ckpt: Path):
    config = AutoConfig.from_pretrained(str(ckpt))
    cls = (Qwen3_5ForConditionalGeneration if config.architectures[0].endswith("ConditionalGeneration")
           else Qwen3_5ForCausalLM)
    model = cls.from_pretrained(str(ckpt), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tensors = {}
    for f in sorted(ckpt.glob("model*.safetensors")):
        tensors.update(load_file(str(f)))
    if "mtp.fc.weight" not in tensors:
        return None
    head = MtpHead(config.get_text_config())
    head.load_from(tensors)
    head.eval()
    return model, head, config.get_text_config()


def main():
    setup_determinism()
    for c in CHECKPOINTS:
        loaded = load(c["dir"])
        if loaded is None:
            print(f"{c['dir']}: no mtp.* tensors, skipped")
            continue
        model, head, text_config = loaded
        tensors, prompts = {}, []
        for i, n in enumerate(c["prompt_lengths"]):
            ids = random_ids(7000 + i, n, text_config.vocab_size)
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            next_id = int(torch.argmax(logits[-1]))
            rows, chain_ids, chain_logits = mtp_logits_and_chain(model, head, ids, next_id, N_CHAIN)
            name = f"p{i}"
            tensors[f"{name}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"{name}.row_logits"] = rows.contiguous()
            tensors[f"{name}.chain_ids"] = torch.tensor(chain_ids, dtype=torch.int32)
            tensors[f"{name}.chain_logits"] = chain_logits.contiguous()
            prompts.append(dict(name=name, length=n, next_id=next_id,
                                max_abs_logit=float(max(rows.abs().max(), chain_logits.abs().max()))))
        save_file(tensors, str(c["dir"] / "mtp_golden.safetensors"))
        meta = dict(generator="tools/oracle/make_mtp_fixtures.py", reference="tools/oracle/mtp_reference.py",
                    torch=torch.__version__, dtype="float32", attn_implementation="eager",
                    n_chain=N_CHAIN, prompts=prompts)
        (c["dir"] / "mtp_golden.json").write_text(json.dumps(meta, indent=2) + "\n")
        (c["dir"] / "mtp_golden.safetensors").chmod(0o644)
        print(f"{c['dir']}: {len(prompts)} prompts")


if __name__ == "__main__":
    main()
