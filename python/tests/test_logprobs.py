"""Log-probabilities through the Python package and `qhx serve`, in OpenAI's shapes (chat's
`logprobs.content`, completions' `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`),
whole and streamed. That they are the model's log-softmax at each chosen token is tested against
the model's own logits in tests/session_test.cc; here: that every interface carries the same
numbers for the same tokens, and that the tokens spell the answer.
"""

from __future__ import annotations

import json
import math

import pytest

import qhx
from serving import MODELS, events, post

PROMPT = "And it came to pass"


def test_python_chunks_carry_logprobs():
    with qhx.Model(MODELS["qwen3.5-kjv"], n_threads=2) as model:
        ids = model.tokenize(PROMPT)
        chunks = [c for c in model.generate(ids, stream=True, max_tokens=12, temperature=0,
                                            logprobs=3) if c.token >= 0]
        assert len(chunks) == 12
        for c in chunks:
            assert c.logprob is not None and c.logprob <= 0
            assert len(c.top_logprobs) == 3
            assert c.top_logprobs[0] == (c.token, c.logprob)  # greedy: the most likely
            assert [lp for _, lp in c.top_logprobs] == sorted(
                (lp for _, lp in c.top_logprobs), reverse=True)
        # Without the option there are none; the tokens are the same.
        plain = [c for c in model.generate(ids, stream=True, max_tokens=12, temperature=0)
                 if c.token >= 0]
        assert [c.token for c in plain] == [c.token for c in chunks]
        assert all(c.logprob is None for c in plain)
        completion = model.create_chat_completion(
            [{"role": "user", "content": "Who was Moses?"}], max_tokens=8, temperature=0,
            logprobs=True, top_logprobs=2, enable_thinking=False)
        content = completion["choices"][0]["logprobs"]["content"]
        assert content and all(len(e["top_logprobs"]) == 2 for e in content)
        assert all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in content)
        with pytest.raises(qhx.QhxError, match="top_logprobs"):
            model.generate(ids, max_tokens=1, logprobs=21)
        with pytest.raises(qhx.QhxError, match="top_logprobs needs logprobs"):
            model.create_chat_completion([{"role": "user", "content": "hi"}], top_logprobs=2)


def chat_body(stream: bool, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "Who was Moses?"}], "max_tokens": 16,
            "temperature": 0, "stream": stream, "logprobs": True, "top_logprobs": 2,
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def test_server_chat_logprobs_whole_and_streamed(server):
    status, data = post(server + "/v1/chat/completions", chat_body(False))
    assert status == 200, data
    answer = json.loads(data)
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    # One entry per generated token but an end-of-turn id, which has no text.
    ended = choice["finish_reason"] == "stop"
    assert len(content) == answer["usage"]["completion_tokens"] - (1 if ended else 0)
    assert "".join(e["token"] for e in content).strip() == choice["message"]["content"].strip()
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy
        assert math.isclose(e["top_logprobs"][0]["logprob"], e["logprob"])
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]

    status, data = post(server + "/v1/chat/completions", chat_body(True))
    assert status == 200, data
    streamed = [e for chunk in events(data) for c in chunk["choices"]
                if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert streamed == content


def test_server_completion_logprobs_whole_and_streamed(server):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 3,
            "ignore_eos": True}
    status, data = post(server + "/v1/completions", body)
    assert status == 200, data
    choice = json.loads(data)["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 10
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) <= 3 and math.isclose(top[token], logprob)

    status, data = post(server + "/v1/completions", {**body, "stream": True})
    assert status == 200, data
    tokens, logprobs = [], []
    for chunk in events(data):
        for c in chunk["choices"]:
            if c.get("logprobs"):
                tokens += c["logprobs"]["tokens"]
                logprobs += c["logprobs"]["token_logprobs"]
    assert tokens == lp["tokens"] and logprobs == lp["token_logprobs"]


def test_server_refuses_bad_logprobs(server):
    for body, param in (({"top_logprobs": 2}, "top_logprobs"),
                        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                        ({"logprobs": 2}, "logprobs")):
        status, data = post(server + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], **body})
        assert status == 400, (body, data)
        assert json.loads(data)["error"]["param"] == param
