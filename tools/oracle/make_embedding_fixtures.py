"""A tiny Qwen3-Embedding checkpoint and the vectors transformers and sentence-transformers give.

Writes tests/fixtures/embedding/qwen3_tiny: laid out as Qwen's Qwen3-Embedding repositories are
(config.json saying Qwen3ForCausalLM over a base Qwen3Model's weights, without the "model." prefix
and without an lm_head; modules.json + 1_Pooling/config.json with last-token pooling, a Normalize
module; config_sentence_transformers.json with the "query" instruction prompt; a tokenizer whose
post-processor appends <|endoftext|>), with random weights and a vocabulary cut to the genuine
Qwen3 tokenizer's first 2,048 tokens so that the checkpoint stays small.

Goldens (golden.json + golden.safetensors): every text's ids as transformers' tokenizer gives them
(add_special_tokens=True), and its embedding as the model card computes it: one left-padded batch
through AutoModel, the last token's last_hidden_state, F.normalize. Checked against each text run
alone and against sentence-transformers' encode (prompt_name="query" for the queries), which must
agree; mean pooling and a 16-dimension truncation (then L2-normalised) are recorded too.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import sentence_transformers
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModel, AutoTokenizer, Qwen3Config, Qwen3Model

from oracle_common import setup_determinism, write_golden

ROOT = Path(__file__).resolve().parents[2]
SOURCE_TOKENIZER = ROOT / "tests/fixtures/tokenizer/qwen3"
OUT = ROOT / "tests/fixtures/embedding/qwen3_tiny"
KEEP = 2048  # vocabulary entries kept, ids 0..KEEP-1 (the 256 byte tokens and the first merges)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids KEEP, KEEP+1, KEEP+2
TASK = "Given a web search query, retrieve relevant passages that answer the query"
QUERY_PROMPT = f"Instruct: {TASK}\nQuery:"
QUERIES = ["What is the capital of China?", "Explain gravity"]
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other. It gives weight to "
    "physical objects and is responsible for the movement of planets around the sun.",
    "",
    "Ünïcödé, 中文 and emoji 🙂 all the same",
]
TRUNCATE_DIM = 16


def write_json(path: Path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def make_tokenizer():
    """The genuine Qwen3 tokenizer.json with its vocabulary cut to KEEP entries (and the merges
    among them), three special tokens after them and Qwen3-Embedding's post-processor."""
    tok = json.loads((SOURCE_TOKENIZER / "tokenizer.json").read_text())
    vocab = {s: i for s, i in tok["model"]["vocab"].items() if i < KEEP}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = merges
    tok["added_tokens"] = [
        dict(id=KEEP + i, content=s, single_word=False, lstrip=False, rstrip=False,
             normalized=False, special=True) for i, s in enumerate(SPECIAL)]
    eot = KEEP
    tok["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False},
            {"type": "TemplateProcessing",
             "single": [{"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                      {"Sequence": {"id": "B", "type_id": 1}},
                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot],
                                                  "tokens": ["<|endoftext|>"]}}},
        ],
    }
    with open(OUT / "tokenizer.json", "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    write_json(OUT / "tokenizer_config.json", {
        "added_tokens_decoder": {str(KEEP + i): dict(content=s, lstrip=False, normalized=False,
                                                     rstrip=False, single_word=False,
                                                     special=True)
                                 for i, s in enumerate(SPECIAL)},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })


def make_checkpoint():
    config = Qwen3Config(
        vocab_size=KEEP + 64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        initializer_range=0.2, bos_token_id=KEEP, eos_token_id=KEEP, dtype="float32")
    torch.manual_seed(20261207)
    model = Qwen3Model(config).to(torch.float32)
    with torch.no_grad():  # non-trivial norm weights (they initialise to ones)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    model.save_pretrained(OUT, safe_serialization=True)
    config_path = OUT / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]  # as Qwen's repositories say
    write_json(config_path, cfg)


def make_sentence_transformers_files():
    write_json(OUT / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ])
    write_json(OUT / "1_Pooling/config.json", {
        "word_embedding_dimension": 64, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True, "include_prompt": True})
    write_json(OUT / "sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False})
    write_json(OUT / "config_sentence_transformers.json", {
        "prompts": {"query": QUERY_PROMPT, "document": ""},
        "default_prompt_name": None, "similarity_fn_name": "cosine"})


def main():
    setup_determinism()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for name in ["LICENSE", "NOTICE"]:
        shutil.copy(SOURCE_TOKENIZER / name, OUT / name)
    make_tokenizer()
    make_checkpoint()
    make_sentence_transformers_files()

    texts = [QUERY_PROMPT + q for q in QUERIES] + DOCUMENTS
    tokenizer = AutoTokenizer.from_pretrained(OUT, padding_side="left")
    model = AutoModel.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager").eval()
    ids = [tokenizer(t)["input_ids"] for t in texts]
    assert all(i[-1] == KEEP for i in ids), "the post-processor must append <|endoftext|>"

    batch = tokenizer(texts, padding=True, return_tensors="pt")
    hidden = model(**batch).last_hidden_state
    assert bool((batch["attention_mask"][:, -1] == 1).all())  # left padding
    last = F.normalize(hidden[:, -1], p=2, dim=1)
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum(1) / mask.sum(1)
    truncated = F.normalize(last[:, :TRUNCATE_DIM], p=2, dim=1)

    # Each text alone (no padding) gives the same vector.
    for i, row in enumerate(ids):
        alone = model(input_ids=torch.tensor([row])).last_hidden_state[0, -1]
        assert torch.allclose(F.normalize(alone, dim=0), last[i], atol=2e-6), i

    # sentence-transformers reads the same files to the same vectors.
    st = sentence_transformers.SentenceTransformer(str(OUT), device="cpu")
    st_queries = st.encode(QUERIES, prompt_name="query", convert_to_tensor=True)
    st_documents = st.encode(DOCUMENTS, convert_to_tensor=True)
    st_all = torch.cat([st_queries, st_documents])
    diff = float((st_all - last).abs().max())
    assert diff < 2e-6, diff

    # sentence-transformers cuts a long text to max_seq_length as tokenizer(truncation=True)
    # does: the text's ids, then <|endoftext|> (what qhx's truncation is tested against).
    st.max_seq_length = 16
    cut_ids = ids[3][:15] + [KEEP]
    cut = model(input_ids=torch.tensor([cut_ids])).last_hidden_state[0, -1]
    st_cut = st.encode([DOCUMENTS[1]], convert_to_tensor=True)[0]
    assert float((F.normalize(cut, dim=0) - st_cut).abs().max()) < 2e-6

    meta = dict(
        transformers=transformers.__version__, torch=torch.__version__,
        sentence_transformers=sentence_transformers.__version__,
        query_prompt=QUERY_PROMPT, queries=QUERIES, documents=DOCUMENTS, texts=texts, ids=ids,
        truncate_dim=TRUNCATE_DIM,
        sentence_transformers_max_abs_diff=diff,
        tensors={"last_token": "[texts, hidden] normalized last-token embeddings",
                 "mean": "[texts, hidden] mean over each text's tokens, not normalized",
                 "truncated": f"[texts, {TRUNCATE_DIM}] last_token's first dims, renormalized"})
    write_golden(OUT, {"last_token": last.contiguous(), "mean": mean.contiguous(),
                       "truncated": truncated.contiguous()}, meta)
    for f in OUT.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)  # safetensors writes some files 0600
    print("ids lengths", [len(i) for i in ids], "sentence-transformers max diff", diff)
    print("written", OUT)


if __name__ == "__main__":
    main()
