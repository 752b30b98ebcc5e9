#!/usr/bin/env python3
"""Hugging Face Qwen3 / Qwen3.5 checkpoint -> GGUF, with numpy and llama.cpp's gguf-py only.

llama.cpp's own converter (convert_hf_to_gguf.py) imports torch and transformers at module level,
which is several GB of wheels from PyPI (CUDA builds only). For the two architectures qhx runs,
this script writes the GGUF that the converter of the vendored llama.cpp writes for the same
checkpoint: the same tensor names (gguf-py's TensorNameMap), the same transforms (Qwen3.5:
A_log -> -exp(A_log), dt_bias -> ssm_dt.bias, squeezed conv1d, zero-centred norms + 1, V heads
reordered to the tiled order when there are more value than key heads), the same per-tensor
types (1-D tensors, *_norm.weight, ssm_conv1d and non-.weight tensors f32; everything else the
output type) and the same hyperparameter and tokenizer keys. `compare_llama_cpp.py --check-converter`
compares its output with the official converter's, tensor by tensor.

Run it with an interpreter that has numpy, pyyaml and tqdm (gguf-py's imports), and point
--llama-cpp at the llama.cpp source tree whose gguf-py should be used:

    python hf_to_gguf_numpy.py CHECKPOINT --llama-cpp SRC --outtype q8_0 --outfile model.gguf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

# The pre-tokenizer check text of llama.cpp's converter (convert_hf_to_gguf.py,
# get_vocab_base_pre): its token ids, hashed, name the pre-tokenizer.
CHECK_TEXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis '
    'concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 '
    'កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български '
    '\'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? '
    '\'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'
)

ARCHITECTURES = {"Qwen3ForCausalLM": "QWEN3", "Qwen3_5ForCausalLM": "QWEN35"}


def log(msg: str) -> None:
    print(f"hf_to_gguf_numpy: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# safetensors, read with numpy (no safetensors package needed)

def read_safetensors(directory: Path, np):
    """Yields (name, float32 array) in file order; bf16/f16/f32 only."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for file in files:
        path = directory / file
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            raw = data[begin:end]
            shape = info["shape"]
            if info["dtype"] == "BF16":
                bits = raw.view(np.uint16).astype(np.uint32) << 16
                array = bits.view(np.float32)
            elif info["dtype"] == "F16":
                array = raw.view(np.float16).astype(np.float32)
            elif info["dtype"] == "F32":
                array = np.array(raw.view(np.float32))
            else:
                raise SystemExit(f"{path}: tensor {name} has dtype {info['dtype']}; "
                                 "only BF16, F16 and F32 are supported")
            yield name, array.reshape(shape)


# ---------------------------------------------------------------------------------------------
# tokenizer

def pre_tokenizer_name(llama_src: Path, qhx: str | None, model_dir: Path) -> str:
    """The converter's hash of the check text's ids, looked up in its table; qhx tokenizes."""
    fallback = "qwen2"
    if not qhx:
        log(f"no --qhx binary to tokenize the check text; tokenizer.ggml.pre = {fallback}")
        return fallback
    out = subprocess.run([qhx, "tokenize", "--model", str(model_dir)], input=CHECK_TEXT.encode(),
                         capture_output=True, check=True)
    ids = json.loads(out.stdout)
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    sources = [llama_src / "convert_hf_to_gguf.py", *sorted((llama_src / "conversion").glob("*.py"))]
    for source in sources:
        text = source.read_text(encoding="utf-8")
        match = re.search(r'if chkhsh == "' + digest + r'":.*?res = "([^"]+)"', text, re.S)
        if match:
            return match.group(1)
    log(f"pre-tokenizer hash {digest} is not in llama.cpp's table; tokenizer.ggml.pre = {fallback}")
    return fallback


def looks_special(token: str) -> bool:  # the converter's does_token_look_special
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def write_vocab(writer, gguf, model_dir: Path, vocab_size: int, pre: str) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(tok["model"]["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    reverse = {i: s for s, i in vocab.items()}
    if max(reverse) >= vocab_size:
        raise SystemExit(f"{model_dir}: tokenizer ids reach {max(reverse)}, config vocab_size is "
                         f"{vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if added[token].get("special") or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True).add_to_gguf(writer)


# ---------------------------------------------------------------------------------------------
# hyperparameters

def write_hparams(writer, gguf, arch: str, hp: dict, ftype) -> None:
    rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    if "rope_theta" not in rope and "rope_theta" in hp:
        rope["rope_theta"] = hp["rope_theta"]
    if "partial_rotary_factor" not in rope and "partial_rotary_factor" in hp:
        rope["partial_rotary_factor"] = hp["partial_rotary_factor"]
    writer.add_block_count(hp["num_hidden_layers"])
    writer.add_context_length(hp["max_position_embeddings"])
    writer.add_embedding_length(hp["hidden_size"])
    writer.add_feed_forward_length(hp["intermediate_size"])
    writer.add_head_count(hp["num_attention_heads"])
    writer.add_head_count_kv(hp["num_key_value_heads"])
    if rope.get("rope_type") not in (None, "default"):
        raise SystemExit(f"rope_type {rope['rope_type']!r} is not handled here; use the official "
                         "converter")
    if arch == "QWEN35":
        sections = list(rope.get("mrope_section", [11, 11, 10]))
        sections += [0] * (4 - len(sections))
        writer.add_rope_dimension_sections(sections[:4])
    if "rope_theta" in rope:
        writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if "head_dim" in hp:
        writer.add_key_length(hp["head_dim"])
        writer.add_value_length(hp["head_dim"])
    writer.add_file_type(ftype)
    if arch == "QWEN35":  # the converter's Qwen3NextModel.set_gguf_parameters
        writer.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
        writer.add_ssm_state_size(hp["linear_key_head_dim"])
        writer.add_ssm_group_count(hp["linear_num_key_heads"])
        writer.add_ssm_time_step_rank(hp["linear_num_value_heads"])
        writer.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
        layer_types = hp.get("layer_types")
        if layer_types is not None:
            writer.add_recurrent_layers([t == "linear_attention" for t in layer_types])
        writer.add_full_attention_interval(hp.get("full_attention_interval", 4))
        head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))


# ---------------------------------------------------------------------------------------------
# tensors

def reorder_v_heads(np, t, dim: int, n_k: int, v_per_k: int, head_dim: int):
    """Grouped-by-key-head V heads -> tiled order (the converter's _reorder_v_heads)."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(shape[:dim] + [n_k, v_per_k, head_dim] + shape[dim + 1:])
    return np.ascontiguousarray(np.swapaxes(t, dim, dim + 1)).reshape(shape)


def qwen35_transform(np, name: str, t, hp: dict):
    """Qwen3.5 tensor transforms: _LinearAttentionVReorderBase, then Qwen3NextModel."""
    n_k, n_v = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
    if n_k != n_v and "linear_attn." in name:
        dk, dv, r = hp["linear_key_head_dim"], hp["linear_value_head_dim"], n_v // n_k
        if ".in_proj_qkv." in name:
            qk = dk * n_k * 2
            t = np.concatenate([t[:qk], reorder_v_heads(np, t[qk:], 0, n_k, r, dv)], axis=0)
        elif ".in_proj_z." in name:
            t = reorder_v_heads(np, t, 0, n_k, r, dv)
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            t = reorder_v_heads(np, t, 0, n_k, r, 1)
        elif ".A_log" in name or ".dt_bias" in name:
            t = reorder_v_heads(np, t[:, None], 0, n_k, r, 1)[:, 0]
        elif ".conv1d" in name:
            t = np.squeeze(t)
            qk = dk * n_k * 2
            t = np.concatenate([t[:qk], reorder_v_heads(np, t[qk:], 0, n_k, r, dv)], axis=0)
        elif ".out_proj." in name:
            t = reorder_v_heads(np, t, 1, n_k, r, dv)
    if name.endswith(".A_log"):
        t = -np.exp(t)
    elif name.endswith(".dt_bias"):
        name = name[: -len(".dt_bias")] + ".dt_proj.bias"
    elif "conv1d" in name:
        t = np.squeeze(t)
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        t = t + np.float32(1)
    return name, t


def compare_gguf(a: Path, b: Path, llama_src: Path) -> int:
    """Prints every difference between two GGUF files (metadata and tensors); 0 if none."""
    sys.path.insert(1, str(llama_src / "gguf-py"))
    import numpy as np
    import gguf

    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    ignored = {"GGUF.kv_count", "GGUF.tensor_count"}  # compared below, through the lists

    def fields(r):
        out = {}
        for name, f in r.fields.items():
            if name in ignored:
                continue
            out[name] = [f.types, [f.parts[i].tobytes() for i in f.data]]
        return out

    fa, fb = fields(ra), fields(rb)
    differences = 0
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            differences += 1
            where = "only in " + (str(a) if key not in fb else str(b)) if key not in fa or key not in fb else "differs"
            print(f"metadata {key}: {where}")
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    max_ulp_tensors = []
    for name in sorted(set(ta) | set(tb)):
        if name not in ta or name not in tb:
            differences += 1
            print(f"tensor {name}: only in {a if name in ta else b}")
            continue
        x, y = ta[name], tb[name]
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape):
            differences += 1
            print(f"tensor {name}: {x.tensor_type.name}{list(x.shape)} vs {y.tensor_type.name}{list(y.shape)}")
            continue
        if not np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)):
            if x.tensor_type == gguf.GGMLQuantizationType.F32:
                dx, dy = np.asarray(x.data), np.asarray(y.data)
                rel = float(np.max(np.abs(dx - dy) / np.maximum(np.abs(dy), 1e-30)))
                if rel < 1e-6:  # -exp() of torch vs numpy: last-bit differences
                    max_ulp_tensors.append(name)
                    continue
            differences += 1
            print(f"tensor {name}: same type and shape, different bytes")
    if max_ulp_tensors:
        print(f"{len(max_ulp_tensors)} f32 tensors differ only in the last bits "
              f"(relative < 1e-6), e.g. {max_ulp_tensors[0]}")
    print(f"{len(ta)} vs {len(tb)} tensors, {len(fa)} vs {len(fb)} metadata keys compared; "
          f"{differences} differences")
    return 1 if differences else 0


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        cp = argparse.ArgumentParser(prog="hf_to_gguf_numpy.py --compare")
        cp.add_argument("a", type=Path)
        cp.add_argument("b", type=Path)
        cp.add_argument("--llama-cpp", type=Path, required=True)
        c = cp.parse_args(sys.argv[2:])
        sys.exit(compare_gguf(c.a, c.b, c.llama_cpp))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="Hugging Face checkpoint directory")
    ap.add_argument("--llama-cpp", type=Path, required=True,
                    help="llama.cpp source tree (its gguf-py and converter's tables are used)")
    ap.add_argument("--outfile", type=Path, required=True)
    ap.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="q8_0")
    ap.add_argument("--qhx", help="qhx binary, to tokenize the pre-tokenizer check text")
    args = ap.parse_args()

    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    import numpy as np
    import gguf

    hp = json.loads((args.model / "config.json").read_text())
    if "text_config" in hp:
        hp = {**hp, **hp["text_config"]}
    hf_arch = (hp.get("architectures") or ["?"])[0]
    if hf_arch not in ARCHITECTURES:
        raise SystemExit(f"{args.model}: architecture {hf_arch} is not handled by this converter "
                         f"(only {', '.join(ARCHITECTURES)}); use llama.cpp's convert_hf_to_gguf.py")
    arch = ARCHITECTURES[hf_arch]
    model_arch = getattr(gguf.MODEL_ARCH, arch)
    arch_name = gguf.MODEL_ARCH_NAMES[model_arch]
    qtype, ftype = {
        "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
        "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
        "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    }[args.outtype]
    n_layers = hp["num_hidden_layers"]
    tensor_map = gguf.get_tensor_name_map(model_arch, n_layers)
    writer = gguf.GGUFWriter(path=None, arch=arch_name)

    n_params = 0
    for name, data in read_safetensors(args.model, np):
        if name.startswith(("mtp.", "model.mtp.")) or "visual." in name:
            continue  # multi-token prediction and vision weights: not part of the text model
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model."):]
        if arch == "QWEN35":
            name, data = qwen35_transform(np, name, data, hp)
        new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise SystemExit(f"cannot map tensor {name!r}")
        bid = next((int(p) for p in name.split(".") if p.isdecimal()), None)
        n_params += data.size
        keep_f32 = (data.ndim <= 1 or new_name.endswith("_norm.weight")
                    or not new_name.endswith(".weight")
                    or new_name == gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.SSM_CONV1D].format(bid=bid)
                    + ".weight")
        t_type = gguf.GGMLQuantizationType.F32 if keep_f32 else qtype
        data = np.ascontiguousarray(data, dtype=np.float32)
        try:
            packed = gguf.quants.quantize(data, t_type)
        except gguf.QuantError as e:
            log(f"{e}, falling back to F16")
            t_type = gguf.GGMLQuantizationType.F16
            packed = gguf.quants.quantize(data, t_type)
        writer.add_tensor(new_name, packed, raw_dtype=t_type)
        log(f"{new_name:<32} {t_type.name:<5} {list(reversed(data.shape))}")

    # general.*: as the converter's prepare_metadata (name, size label, sampling defaults from
    # generation_config.json, ...)
    total, shared, expert, n_expert = writer.get_total_parameter_count()
    metadata = gguf.Metadata.load(None, args.model, None, total)
    if metadata.name is None:
        metadata.name = args.model.name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, n_expert)
    writer.add_type(gguf.GGUFType.MODEL)
    metadata.set_gguf_meta_model(writer)
    write_hparams(writer, gguf, arch, hp, ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    pre = pre_tokenizer_name(args.llama_cpp, args.qhx, args.model)
    write_vocab(writer, gguf, args.model, hp["vocab_size"], pre)

    tmp = args.outfile.with_name(args.outfile.name + ".partial")
    writer.write_header_to_file(path=tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    tmp.replace(args.outfile)
    log(f"wrote {args.outfile} ({args.outfile.stat().st_size / 1e6:.0f} MB, {n_params / 1e6:.0f}M "
        f"parameters, {arch_name}, {args.outtype}, tokenizer.ggml.pre={pre})")


if __name__ == "__main__":
    main()
