#!/usr/bin/env python3
"""Independent check of the Qwen3.5 golden fixtures.

Re-implements the Qwen3.5 text decoder (project spec MODELS.md §1, §3) in plain numpy float64 --
no transformers -- reading config.json and the safetensors files directly, with the Gated DeltaNet
evaluated token by token in its recurrent form (§3.7 Step 7; HF's golden prefill uses the chunked
form), and compares it with the golden logits, greedy ids and GDN states written by
make_qwen3_5_fixtures.py.  Needs only numpy + safetensors.

    python tools/oracle/check_qwen3_5_fixtures.py            # all fixtures
"""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from check_qwen3_fixtures import load_weights

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ["gva2_tied", "hk_eq_hv_untied_f32", "multimodal_layout"]
MAX_REL_LOGIT_ERR = 1e-5     # vs max|logit|; observed ≤ 1.3e-6 (the golden's own f32 rounding)
MAX_REL_STATE_ERR = 1e-5     # vs max|state| of the layer; observed ≤ 1.0e-6


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):  # PyTorch default: beta 1, threshold 20
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def zc_norm(x, w, eps):  # variant B: (1 + w)
    return rms(x, eps) * (1.0 + w)


def gdn(tc, w, p, x):
    """Gated DeltaNet layer (spec §3.7) with the recurrent rule.  Returns (out, conv [C,K], S [Hv,dk,dv])."""
    T = x.shape[0]
    Hk, Hv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv, K = tc["linear_key_head_dim"], tc["linear_value_head_dim"], tc["linear_conv_kernel_dim"]
    Kd = Hk * dk
    eps = tc["rms_norm_eps"]
    u = x @ w[p + "in_proj_qkv.weight"].T                      # [T, C]
    z = (x @ w[p + "in_proj_z.weight"].T).reshape(T, Hv, dv)
    braw = x @ w[p + "in_proj_b.weight"].T
    araw = x @ w[p + "in_proj_a.weight"].T
    Wc = w[p + "conv1d.weight"][:, 0, :]                       # [C, K]
    upad = np.concatenate([np.zeros((K, u.shape[1])), u])      # K zero columns before the prompt
    conv = sum(Wc[:, j] * upad[1 + j:1 + j + T] for j in range(K))   # W[:, K-1] on the current token
    s = silu(conv)
    q = s[:, :Kd].reshape(T, Hk, dk)
    k = s[:, Kd:2 * Kd].reshape(T, Hk, dk)
    v = s[:, 2 * Kd:].reshape(T, Hv, dv)
    r = Hv // Hk
    q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)    # value head j <- key head j // r
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    beta = sigmoid(braw)
    g = -np.exp(w[p + "A_log"]) * softplus(araw + w[p + "dt_bias"])
    S = np.zeros((Hv, dk, dv))
    o = np.empty((T, Hv, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]                    # decay first
        m = np.einsum("hab,ha->hb", S, k[t])                   # read with the decayed state
        delta = beta[t][:, None] * (v[t] - m)
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hab,ha->hb", S, q[t])                # read with the updated state
    y = rms(o, eps) * w[p + "norm.weight"] * silu(z)           # variant C: norm, then gate
    out = y.reshape(T, Hv * dv) @ w[p + "out_proj.weight"].T
    return out, upad[-K:].T.copy(), S


def attention(tc, w, p, x, cos, sin, R):
    T = x.shape[0]
    nH, nKV, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    eps = tc["rms_norm_eps"]
    y = (x @ w[p + "q_proj.weight"].T).reshape(T, nH, 2 * hd)  # per head [q_h | gate_h]
    q, gate = y[..., :hd], y[..., hd:].reshape(T, nH * hd)
    k = (x @ w[p + "k_proj.weight"].T).reshape(T, nKV, hd)
    v = (x @ w[p + "v_proj.weight"].T).reshape(T, nKV, hd)
    q = zc_norm(q, w[p + "q_norm.weight"], eps)
    k = zc_norm(k, w[p + "k_norm.weight"], eps)

    def rope(t):  # partial rotary, rotate-half inside the first R dims
        a, b, rest = t[..., :R // 2], t[..., R // 2:R], t[..., R:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s, rest], axis=-1)

    q, k = rope(q), rope(k)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    out = np.empty((T, nH, hd))
    for hh in range(nH):
        gk = hh // (nH // nKV)
        sc = q[:, hh, :] @ k[:, gk, :].T / np.sqrt(hd) + mask
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        out[:, hh, :] = sc @ v[:, gk, :]
    return (out.reshape(T, nH * hd) * sigmoid(gate)) @ w[p + "o_proj.weight"].T


def forward(cfg, w, ids):
    tc = cfg.get("text_config", cfg)
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in w else "model."
    eps, hd = tc["rms_norm_eps"], tc["head_dim"]
    rp = tc["rope_parameters"]
    R = int(hd * rp.get("partial_rotary_factor", 0.25))
    T = len(ids)
    inv = 1.0 / rp["rope_theta"] ** (np.arange(0, R, 2, dtype=np.float64) / R)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]   # text: t = h = w = position
    cos, sin = np.cos(ang), np.sin(ang)
    h = w[pre + "embed_tokens.weight"][ids]
    states = {}
    for i, lt in enumerate(tc["layer_types"]):
        p = f"{pre}layers.{i}."
        x = zc_norm(h, w[p + "input_layernorm.weight"], eps)
        if lt == "linear_attention":
            o, conv, S = gdn(tc, w, p + "linear_attn.", x)
            states[i] = (conv, S)
        else:
            o = attention(tc, w, p + "self_attn.", x, cos, sin, R)
        h = h + o
        x = zc_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gt = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (silu(gt) * up) @ w[p + "mlp.down_proj.weight"].T
    h = zc_norm(h, w[pre + "norm.weight"], eps)
    lm = w.get("lm_head.weight", w[pre + "embed_tokens.weight"])
    return h @ lm.T, states


def check(name):
    gdir = REPO / "tests/fixtures/qwen3_5" / name
    meta = json.loads((gdir / "golden.json").read_text())
    ckpt = REPO / meta["checkpoint"]
    cfg = json.loads((ckpt / "config.json").read_text())
    w = load_weights(ckpt)
    gold = load_file(str(gdir / "golden.safetensors"))
    worst, worst_state = 0.0, 0.0
    for pm in meta["prompts"]:
        p = pm["name"]
        ids = gold[p + ".ids"].tolist()
        greedy = gold[p + ".greedy"].tolist()
        T = len(ids)
        full, _ = forward(cfg, w, ids + greedy[:-1])    # one pass covers prompt + all greedy steps
        err = np.abs(full[:T] - gold[p + ".logits"]).max() / pm["max_abs_logit"]
        worst = max(worst, err)
        am = full[T - 1:].argmax(axis=-1).tolist()
        if am != greedy:
            k = next(i for i in range(len(greedy)) if am[i] != greedy[i])
            print(f"FAIL {name}/{p}: greedy differs at step {k}")
            return False
        if err > MAX_REL_LOGIT_ERR:
            print(f"FAIL {name}/{p}: rel logit error {err:.2e}")
            return False
        if p in meta["states"]["prompts"]:
            _, states = forward(cfg, w, ids)
            for i, (conv, S) in states.items():
                for key, ref in ((f"{p}.conv.layer{i}", conv), (f"{p}.state.layer{i}", S)):
                    e = np.abs(gold[key] - ref).max() / np.abs(ref).max()
                    worst_state = max(worst_state, e)
                    if e > MAX_REL_STATE_ERR:
                        print(f"FAIL {name}/{key}: rel state error {e:.2e}")
                        return False
    print(f"ok   {name}: greedy ids match, max |dlogit|/max|logit| = {worst:.2e}, "
          f"max |dstate|/max|state| = {worst_state:.2e}")
    return True


def main():
    names = sys.argv[1:] or FIXTURES
    ok = all([check(n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
