#!/usr/bin/env python3
"""Independent check of the Qwen3 golden fixtures.

Re-implements the Qwen3 dense forward pass (project spec MODELS.md §1-2) in plain
numpy float64 -- no transformers -- reading config.json and the safetensors files
directly, and compares it with the golden logits and greedy ids written by
make_qwen3_fixtures.py.  Needs only numpy + safetensors.

    python tools/oracle/check_qwen3_fixtures.py            # all fixtures
"""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ["gqa1_hd32_f32", "gqa2_tied_bf16", "gqa4_sharded_f32", "gqa2_f16", "fullvocab_tied_bf16"]


def load_weights(ckpt: Path):
    w = {}
    for f in sorted(ckpt.glob("model*.safetensors")):
        # safetensors.numpy has no bfloat16; read bf16 by hand.
        w.update(read_safetensors_f64(f))
    return w


def read_safetensors_f64(path: Path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float64)
        elif dt == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2").astype(np.uint32)
            arr = (u16 << 16).view(np.float32).astype(np.float64)
        else:
            raise ValueError(dt)
        out[name] = arr.reshape(info["shape"])
    return out


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def forward(cfg, w, ids):
    H, nH, nKV, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    T = len(ids)
    h = w["model.embed_tokens.weight"][ids]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # [T, heads, hd], rotate-half pairing i <-> i + hd/2
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nH, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nKV, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nKV, hd)
        q = rope(rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps))
        k = rope(rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps))
        out = np.empty((T, nH, hd))
        for hh in range(nH):
            g = hh // (nH // nKV)
            sc = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            sc /= sc.sum(axis=-1, keepdims=True)
            out[:, hh, :] = sc @ v[:, g, :]
        h = h + out.reshape(T, nH * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        gt = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gt / (1 + np.exp(-gt)) * up) @ w[p + "mlp.down_proj.weight"].T
    h = rmsnorm(h, w["model.norm.weight"], eps)
    lm = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ lm.T


def check(name):
    gdir = REPO / "tests/fixtures/qwen3" / name
    meta = json.loads((gdir / "golden.json").read_text())
    ckpt = REPO / meta["checkpoint"]
    cfg = json.loads((ckpt / "config.json").read_text())
    w = load_weights(ckpt)
    gold = load_file(str(gdir / "golden.safetensors"))
    rows = gold["logit_rows"] if meta["logit_rows"] == "sampled" else None
    worst = 0.0
    for pm in meta["prompts"]:
        p = pm["name"]
        ids = gold[p + ".ids"].tolist()
        greedy = gold[p + ".greedy"].tolist()
        full = forward(cfg, w, ids + greedy[:-1])  # one pass covers prompt + all greedy steps
        T = len(ids)
        lg = full[:T] if rows is None else full[:T, rows]
        err = np.abs(lg - gold[p + ".logits"]).max() / pm["max_abs_logit"]
        worst = max(worst, err)
        am = full[T - 1:].argmax(axis=-1).tolist()
        if am != greedy:
            k = next(i for i in range(len(greedy)) if am[i] != greedy[i])
            print(f"FAIL {name}/{p}: greedy differs at step {k}")
            return False
        if err > 1e-4:
            print(f"FAIL {name}/{p}: rel logit error {err:.2e}")
            return False
    print(f"ok   {name}: greedy ids match, max |dlogit|/max|logit| = {worst:.2e}")
    return True


def main():
    names = sys.argv[1:] or FIXTURES
    ok = all([check(n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
