"""Embeddings from Python and the server: the fixture's vectors are transformers' (within float
tolerance), the server's are Python's (to the bit), and the options and errors behave."""

from __future__ import annotations

import base64
import json
import math
import struct

import pytest

import qhx
from serving import EMBEDDING_MODEL, post

TOLERANCE = 2e-5  # transformers ran one left-padded batch; qhx runs each input alone


def golden() -> tuple[dict, dict[str, list[list[float]]]]:
    """golden.json and golden.safetensors' float32 tensors, read without numpy."""
    meta = json.loads((EMBEDDING_MODEL / "golden.json").read_text())
    data = (EMBEDDING_MODEL / "golden.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32"
        begin, end = t["data_offsets"]
        rows, cols = t["shape"]
        flat = struct.unpack(f"<{rows * cols}f", data[8 + n + begin:8 + n + end])
        tensors[name] = [list(flat[r * cols:(r + 1) * cols]) for r in range(rows)]
    return meta, tensors


@pytest.fixture(scope="module")
def model():
    with qhx.Model(EMBEDDING_MODEL) as m:
        yield m


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOLERANCE for x, y in zip(a, b))


def test_vectors_are_transformers(model):
    meta, tensors = golden()
    assert model.info.pooling == "last" and model.info.embedding_size == 64
    got = model.embed(meta["queries"], prompt_name="query") + model.embed(meta["documents"])
    assert all(close(g, w) for g, w in zip(got, tensors["last_token"], strict=True))
    assert all(abs(math.fsum(x * x for x in v) - 1) < 1e-5 for v in got)
    # One text gives one vector; its token ids (as transformers' tokenizer gives them) the same.
    assert model.embed(meta["documents"][0]) == got[2]
    assert model.embed(meta["ids"][2]) == got[2]
    assert model.embed([meta["ids"][2], meta["ids"][3]]) == got[2:4]
    mean = model.embed(meta["texts"], pooling="mean", normalize=False)
    assert all(close(g, w) for g, w in zip(mean, tensors["mean"], strict=True))
    cut = model.embed(meta["texts"], dimensions=meta["truncate_dim"])
    assert all(close(g, w) for g, w in zip(cut, tensors["truncated"], strict=True))


def test_openai_shape_and_errors(model):
    meta, _ = golden()
    answer = model.create_embedding(["a", "b"])
    assert answer["object"] == "list" and [d["index"] for d in answer["data"]] == [0, 1]
    assert answer["data"][0]["embedding"] == model.embed("a")
    assert answer["usage"]["prompt_tokens"] > 2
    assert model.embed([]) == []
    with pytest.raises(qhx.QhxError, match="is not one of the model's prompts") as e:
        model.embed("x", prompt_name="passage")
    assert e.value.status == "invalid argument"
    with pytest.raises(qhx.QhxError, match="dimensions: must be 0"):
        model.embed("x", dimensions=65)
    with pytest.raises(qhx.QhxError, match="input\\[0\\]: tokens: none to embed"):
        model.embed([[]])
    with pytest.raises(qhx.QhxError, match="must all be strings or all token-id lists"):
        model.embed(["a", [1]])
    with pytest.raises(TypeError):
        model.create_embedding("a", dimension=8)  # misspelt: not silently ignored
    with pytest.raises(qhx.QhxError, match="token ids must be from 0"):
        model.embed([-1, 2])
    # Embedding drops the default session's conversation; generating works after it.
    assert isinstance(model.generate("a", max_tokens=2, temperature=0), str)
    assert model.embed(meta["documents"][0]) == model.embed(meta["documents"][0])


def test_server_answers_pythons_vectors(model, embedding_server):
    meta, _ = golden()
    want = model.embed(meta["queries"], prompt_name="query")
    status, body = post(embedding_server + "/v1/embeddings",
                        {"input": meta["queries"], "prompt_name": "query"})
    assert status == 200, body
    answer = json.loads(body)
    assert [d["embedding"] for d in answer["data"]] == want
    status, body = post(embedding_server + "/v1/embeddings",
                        {"input": meta["queries"], "prompt_name": "query",
                         "encoding_format": "base64"})
    assert status == 200, body
    for d, w in zip(json.loads(body)["data"], want, strict=True):
        raw = base64.b64decode(d["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == w
    status, body = post(embedding_server + "/v1/embeddings", {"input": "x", "dimensions": 0})
    assert status == 400 and json.loads(body)["error"]["param"] == "dimensions"
