#!/usr/bin/env python3
"""Reference oracle for qhx's Qwen3.5 image input (tests/fixtures/vision).

1. Fixture images (PNG and JPEG: sizes that are and are not multiples of 32, portrait, tiny,
   grayscale, RGBA, palette, EXIF-rotated, progressive) and what transformers' image processor for
   Qwen3.5 makes of them with the real checkpoints' preprocessor_config.json: `image_grid_thw`, the
   sha256 of `pixel_values` (float32, little-endian) and of the resized RGB bytes, and samples.
   The processor is the one AutoImageProcessor picks for model_type qwen3_5 when torchvision is
   installed (Qwen2VLImageProcessor, the torchvision backend: torchvision decodes the file with
   its EXIF orientation, drops alpha, and resizes uint8 with torch's antialiased bicubic).
2. Tiny random Qwen3.5 checkpoints with a vision tower, made by transformers (one tied in bf16, one
   untied in f32), each with a preprocessor_config.json of small min/max pixels, and goldens for
   prompts with one image, two images, and a second turn that adds an image: logits at every
   prompt position, greedy ids (HF generate), and each image's features (the merger's output).
3. For tied_bf16, a tokenizer (the Qwen3.5 tokenizer cut to its first 368 entries and 16 of its
   added tokens, at the ids the checkpoint's config gives the vision tokens) with Qwen3.5's chat
   template, and chat.json: conversations with images rendered and tokenized by transformers'
   Qwen3VLProcessor (the processor AutoProcessor picks for qwen3_5), each with its greedy reply.

    $ORACLE_VENV/bin/python tools/oracle/make_vision_fixtures.py         # ~20 s, everything
    $ORACLE_VENV/bin/python tools/oracle/make_vision_fixtures.py --chat  # only part 3

The venv needs torchvision besides tools/oracle/requirements.txt (see tools/oracle/README.md).
"""

import hashlib
import io
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_qwen3_5_fixtures as q35  # noqa: E402
from oracle_common import make_world_readable, setup_determinism, write_golden  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests/fixtures/vision"
SOURCE_TOKENIZER = REPO / "tests/fixtures/tokenizer/qwen3_5"

# Qwen3.5's preprocessor_config.json (the Qwen3-VL image processor settings the family ships).
REAL_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "temporal_patch_size": 2,
}
# The tiny checkpoints' own: few patches per image.
TINY_PREPROCESSOR = dict(REAL_PREPROCESSOR, size={"longest_edge": 128 * 128, "shortest_edge": 32 * 32})


def rng_image(seed, h, w, channels=3):
    """A smooth random image (low-frequency noise plus a little grain): resize has work to do."""
    g = np.random.default_rng(seed)
    small = g.uniform(0, 255, (max(2, h // 8), max(2, w // 8), channels))
    big = np.asarray(Image.fromarray(small.astype(np.uint8).squeeze()).resize((w, h), Image.BILINEAR),
                     dtype=np.float64)
    if big.ndim == 2:
        big = big[:, :, None]
    big = big + g.normal(0, 12, big.shape)
    return np.clip(big, 0, 255).astype(np.uint8).squeeze()


def exif_with_orientation(value):
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def write_images(folder: Path):
    """name -> how it was made. Saved by PIL (its PNG and JPEG writers)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {}

    def save(name, array, how, **kw):
        img = Image.fromarray(array)
        if "mode" in kw:
            img = img.convert(kw.pop("mode"))
        img.save(folder / name, **kw)
        made[name] = how

    save("rgb_256x320.png", rng_image(1, 256, 320), "RGB PNG, both sides multiples of 32")
    save("rgb_37x53.png", rng_image(2, 37, 53), "RGB PNG, small: scaled up to min_pixels")
    save("rgb_480x640.jpg", rng_image(3, 480, 640), "baseline JPEG, 4:2:0, multiples of 32", quality=90)
    save("portrait_300x200.jpg", rng_image(4, 300, 200), "portrait JPEG, 4:4:4", quality=95,
         subsampling=0)
    save("gray_70x50.png", rng_image(5, 70, 50, 1), "grayscale PNG (L)")
    save("gray_90x120.jpg", rng_image(6, 90, 120, 1), "grayscale JPEG", quality=85)
    rgba = np.concatenate([rng_image(7, 60, 40), rng_image(8, 60, 40, 1)[:, :, None]], axis=2)
    save("rgba_60x40.png", rgba, "RGBA PNG with varying alpha (alpha is dropped, not composited)")
    save("palette_64x48.png", rng_image(9, 64, 48), "palette PNG (P, 64 colours)", mode="P")
    save("tiny_5x7.png", rng_image(10, 5, 7), "5x7: the aspect stays, min_pixels decides")
    save("wide_40x700.png", rng_image(11, 40, 700), "wide: 17.5:1")
    save("exif6_120x90.jpg", rng_image(12, 120, 90), "JPEG with EXIF orientation 6 (rotate 90 CW)",
         quality=90, exif=exif_with_orientation(6))
    save("exif3_50x80.jpg", rng_image(13, 50, 80), "JPEG with EXIF orientation 3 (rotate 180)",
         quality=90, exif=exif_with_orientation(3))
    save("exif8_64x96.png", rng_image(14, 64, 96), "PNG with an eXIf chunk, orientation 8",
         exif=exif_with_orientation(8))
    save("progressive_200x150.jpg", rng_image(15, 200, 150), "progressive JPEG", quality=80,
         progressive=True)
    save("big_1100x1500.jpg", rng_image(16, 1100, 1500), "larger than 1024x1024: scaled down",
         quality=88)
    return made


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def processor_goldens(processor, folder: Path, names):
    out = {}
    for name in names:
        r = processor(images=[str(folder / name)], return_tensors="pt")
        pv = r["pixel_values"].contiguous()
        thw = r["image_grid_thw"][0].tolist()
        assert pv.dtype == torch.float32
        t, gh, gw = thw
        # The resized uint8 image back from the patches (temporal copy 0).
        x = pv.reshape(gh // 2, gw // 2, 2, 2, 3, 2, 16, 16)[:, :, :, :, :, 0]
        rgb = x.permute(0, 2, 5, 1, 3, 6, 4).reshape(gh * 16, gw * 16, 3)
        rgb8 = torch.round(rgb * 127.5 + 127.5).to(torch.uint8).contiguous()
        assert torch.equal(((rgb8.float() - 127.5) / 127.5), rgb), name  # pixel_values = f(rgb8)
        flat = pv.flatten()
        picks = [0, 1, 7, flat.numel() // 3, flat.numel() // 2, flat.numel() - 1]
        out[name] = {
            "image_grid_thw": thw,
            "resized_hw": [gh * 16, gw * 16],
            "pixel_values_shape": list(pv.shape),
            "pixel_values_sha256": sha256(pv.numpy().astype("<f4").tobytes()),
            "resized_rgb_sha256": sha256(rgb8.numpy().tobytes()),
            "samples": {str(i): float(flat[i]) for i in picks},
            "image_tokens": t * gh * gw // 4,
        }
    return out


# ----------------------------------------------------------------------------------------
# tiny checkpoints

TEXT = dict(
    arch="Qwen3_5ForConditionalGeneration",
    vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    rope_theta=1e7, partial_rotary_factor=0.5, mrope_section=[3, 3, 2],  # R = 16: 8 frequencies
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    max_shard_size=None, mtp=False,
    extra_text=dict(attn_output_gate=True, mamba_ssm_dtype="float32"),
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                num_position_embeddings=64, deepstack_visual_indexes=[], initializer_range=0.2),
)
TOKENS = dict(image_token_id=380, video_token_id=381, vision_start_token_id=377, vision_end_token_id=378)
TEXT_VOCAB = 376  # prompt text ids are drawn below the vision tokens
FIXTURES = [
    dict(TEXT, name="tied_bf16", tie_word_embeddings=True, storage="bf16+f32", seed=1),
    dict(TEXT, name="untied_f32", tie_word_embeddings=False, storage="f32", seed=2),
]
MODEL_IMAGES = ["rgb_256x320.png", "portrait_300x200.jpg", "gray_70x50.png"]
N_GREEDY = 12


def build_model(fx):
    model = q35.build_random_model(fx, fx["seed"])
    for k, v in TOKENS.items():
        setattr(model.config, k, v)
    # The tower's weights redrawn for conditioning: matrices N(0, 1/fan_in), biases and the
    # LayerNorms' affine parameters random, so that a missing bias or a swapped norm shows.
    g = torch.Generator().manual_seed(fx["seed"] + 31337)
    with torch.no_grad():
        for name, p in model.model.visual.named_parameters():
            shape, dtype = p.shape, p.dtype
            if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(shape, generator=g)
            elif name == "pos_embed.weight":
                v = 0.5 * torch.randn(shape, generator=g)
            else:
                fan_in = int(np.prod(shape[1:]))
                v = torch.randn(shape, generator=g) / math.sqrt(fan_in)
            p.copy_(v.to(dtype))
    return model


def processor_for(ckpt: Path):
    proc = AutoImageProcessor.from_pretrained(str(ckpt))
    assert isinstance(proc, Qwen2VLImageProcessor), type(proc)
    return proc


def expand(ids, grids):
    """One <|image_pad|> per image -> as many as the image has tokens (the processor's job)."""
    out, k = [], 0
    for t in ids:
        if t == TOKENS["image_token_id"]:
            n = int(np.prod(grids[k])) // 4
            out += [t] * n
            k += 1
        else:
            out.append(t)
    assert k == len(grids)
    return out


def text(seed, n):
    return torch.randint(0, TEXT_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def image_part():
    return [TOKENS["vision_start_token_id"], TOKENS["image_token_id"], TOKENS["vision_end_token_id"]]


def run_hf(model, proc, folder, ids, images):
    grids, pixel_values = [], None
    if images:
        r = proc(images=[str(folder / n) for n in images], return_tensors="pt")
        pixel_values, grids = r["pixel_values"], r["image_grid_thw"].tolist()
    full = expand(ids, grids)
    input_ids = torch.tensor([full])
    kw = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
              mm_token_type_ids=(input_ids == TOKENS["image_token_id"]).int())
    if images:
        kw.update(pixel_values=pixel_values, image_grid_thw=torch.tensor(grids))
    with torch.no_grad():
        logits = model(**kw).logits[0].float()
        out = model.generate(**kw, max_new_tokens=N_GREEDY, do_sample=False, num_beams=1)
        features = []
        if images:
            feats = model.model.get_image_features(pixel_values, torch.tensor(grids)).pooler_output
            features = [f.float() for f in feats]
    greedy = out[0, len(full):].tolist()
    assert len(greedy) == N_GREEDY
    top2 = torch.topk(logits[-1], 2).values
    return dict(full=full, grids=grids, logits=logits, greedy=greedy, features=features,
                margin=float((top2[0] - top2[1]) / top2[0].abs().clamp(min=1e-6)))


def make_model_fixture(fx, folder):
    dest = OUT / fx["name"]
    if dest.exists():
        shutil.rmtree(dest)
    model = build_model(fx)
    model.save_pretrained(str(dest), safe_serialization=True)
    with open(dest / "preprocessor_config.json", "w") as f:
        json.dump(TINY_PREPROCESSOR, f, indent=2)
        f.write("\n")
    ref = q35.load_reference(fx, dest)
    proc = processor_for(dest)
    s = fx["seed"] * 1000
    one = text(s + 1, 5) + image_part() + text(s + 2, 6)
    two = text(s + 3, 3) + image_part() + text(s + 4, 2) + image_part() + text(s + 5, 4)
    first = run_hf(ref, proc, folder, one, MODEL_IMAGES[:1])
    # The second turn: the first prompt, its greedy reply, then text, a new image and text,
    # recomputed from scratch as transformers does (qhx continues the first turn's state).
    follow = one + first["greedy"] + text(s + 6, 4) + image_part() + text(s + 7, 3)
    prompts = {
        "one_image": (one, MODEL_IMAGES[:1]),
        "two_images": (two, MODEL_IMAGES[1:3]),
        "second_turn": (follow, [MODEL_IMAGES[0], MODEL_IMAGES[2]]),
        "text_only": (text(s + 8, 9), []),
    }
    tensors, meta = {}, {"fixture": fx["name"], "transformers": transformers.__version__,
                         "torch": torch.__version__, "tokens": TOKENS, "prompts": {}}
    for name, (ids, images) in prompts.items():
        r = first if name == "one_image" else run_hf(ref, proc, folder, ids, images)
        tensors[f"{name}.logits"] = r["logits"].contiguous()
        for i, f in enumerate(r["features"]):
            tensors[f"{name}.image{i}.features"] = f.contiguous()
        meta["prompts"][name] = {
            "ids": ids, "images": images, "expanded_ids": r["full"], "image_grid_thw": r["grids"],
            "greedy": r["greedy"], "last_rel_margin": r["margin"],
        }
        if name == "second_turn":
            meta["prompts"][name]["first_turn"] = "one_image"
            meta["prompts"][name]["first_turn_tokens"] = len(one) + N_GREEDY
    write_golden(dest, tensors, meta)
    make_world_readable([dest])
    print(fx["name"], {k: v["greedy"][:4] for k, v in meta["prompts"].items()})


# ----------------------------------------------------------------------------------------
# a tokenizer and chat goldens

KEEP = 368  # regular tokens 0..367 (the 256 bytes and the first merges); added tokens after them
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
         "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
         "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
         "<|video_pad|>", "<think>", "</think>"]


def make_tokenizer(dest: Path):
    tok = json.loads((SOURCE_TOKENIZER / "tokenizer.json").read_text())
    source_added = {a["content"]: a for a in tok["added_tokens"]}
    vocab = {s: i for s, i in tok["model"]["vocab"].items() if i < KEEP}
    merges = [m for m in tok["model"]["merges"]
              if all(x in vocab for x in (*m.split(" ", 1), m.replace(" ", "", 1)))]
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = merges
    tok["added_tokens"] = [dict(source_added[c], id=KEEP + i) for i, c in enumerate(ADDED)]
    ids = {c: KEEP + i for i, c in enumerate(ADDED)}
    for k, v in TOKENS.items():
        name = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>",
                "vision_end_token_id": "<|vision_end|>"}[k]
        assert ids[name] == v, (name, ids[name], v)
    with open(dest / "tokenizer.json", "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    config = json.loads((SOURCE_TOKENIZER / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        str(ids[c]): {k: v for k, v in source_added[c].items() if k not in ("id", "content")}
        | {"content": c} for c in ADDED}
    config["additional_special_tokens"] = [
        c for c in config["additional_special_tokens"] if c in ids]
    config["model_max_length"] = 4096
    # The template in a file of its own, as the checkpoints ship it (the processor reads it there).
    (dest / "chat_template.jinja").write_text(config.pop("chat_template"))
    with open(dest / "tokenizer_config.json", "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


CHATS = {
    "one_image": [
        {"role": "user", "content": [{"type": "image", "image": "rgb_256x320.png"},
                                     {"type": "text", "text": "What is in this picture?"}]}],
    "two_images_and_a_system": [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [{"type": "text", "text": "Compare "},
                                     {"type": "image", "image": "portrait_300x200.jpg"},
                                     {"type": "text", "text": " and "},
                                     {"type": "image", "image": "gray_70x50.png"}]}],
}
CHAT_MAX_NEW = 10


def make_chat_goldens(dest: Path, folder: Path):
    """What transformers' processor makes of a conversation with images, and the greedy reply
    with <|im_end|> as the stop (the tokenizer's eos, which qhx's chat and server stop at)."""
    from transformers import AutoProcessor, Qwen3_5ForConditionalGeneration
    make_tokenizer(dest)
    processor = AutoProcessor.from_pretrained(str(dest))
    assert type(processor).__name__ == "Qwen3VLProcessor", type(processor)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(
        str(dest), dtype=torch.float32, attn_implementation="eager").eval()
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    goldens = {}
    for name, messages in CHATS.items():
        with_paths = [dict(m, content=m["content"] if isinstance(m["content"], str) else
                           [dict(p, image=str(folder / p["image"])) if "image" in p else p
                            for p in m["content"]]) for m in messages]
        text = processor.apply_chat_template(with_paths, tokenize=False,
                                             add_generation_prompt=True)
        inputs = processor.apply_chat_template(with_paths, tokenize=True, return_dict=True,
                                               add_generation_prompt=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=CHAT_MAX_NEW, do_sample=False,
                                 num_beams=1, eos_token_id=eos)
        n = inputs["input_ids"].shape[1]
        reply = out[0, n:].tolist()
        goldens[name] = {
            "messages": messages, "text": text, "ids": inputs["input_ids"][0].tolist(),
            "image_grid_thw": inputs["image_grid_thw"].tolist(), "greedy": reply,
            "reply_text": processor.tokenizer.decode(
                [t for t in reply if t != eos], skip_special_tokens=False),
        }
    with open(dest / "chat.json", "w") as f:
        json.dump({"transformers": transformers.__version__, "max_new_tokens": CHAT_MAX_NEW,
                   "eos": eos, "chats": goldens}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    make_world_readable([dest])
    print("chat", {k: v["greedy"] for k, v in goldens.items()})


def main():
    setup_determinism()
    folder = OUT / "images"
    if sys.argv[1:] == ["--chat"]:
        make_chat_goldens(OUT / "tied_bf16", folder)
        return
    if folder.exists():
        shutil.rmtree(folder)
    made = write_images(folder)
    proc = Qwen2VLImageProcessor(**{k: v for k, v in REAL_PREPROCESSOR.items()
                                    if k not in ("image_processor_type", "processor_class")})
    goldens = processor_goldens(proc, folder, sorted(made))
    with open(OUT / "processor_golden.json", "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "preprocessor_config": REAL_PREPROCESSOR, "images": made, "goldens": goldens},
                  f, indent=2)
        f.write("\n")
    for fx in FIXTURES:
        make_model_fixture(fx, folder)
    make_chat_goldens(OUT / "tied_bf16", folder)


if __name__ == "__main__":
    main()
