"""Structured output end to end: every answer of both shipped models to every schema of
schemas.json parses and validates (jsonschema, formats checked), through the Python package and
through `qhx serve`, streamed and not; tool_choice "required" and a named function give calls
whose arguments follow the tool's schema; GBNF grammars hold; bad formats are one-line errors.

The KJV models have never seen JSON, which makes them a hard test: whatever they would write, the
constraint must keep it valid and bring it to an end (the schemas bound their strings, as a model
that knows no JSON would otherwise write one forever).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

import qhx
from serving import MODELS, SERVER_MODEL, post

SCHEMAS = json.loads((Path(__file__).parent / "schemas.json").read_text())
FORMATS = jsonschema.FormatChecker()
MAX_TOKENS = 600

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


def validate(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


def response_format(name: str) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    with qhx.Model(MODELS[request.param], n_threads=2) as m:
        yield m


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_answer_validates(model, name, stream):
    s = model.generate("And it came to pass", max_tokens=MAX_TOKENS, temperature=0,
                       response_format=response_format(name), stream=True)
    text = "".join(c.text for c in s) if stream else s.text()
    assert s.result.stop_reason == "eos", text  # the format was complete
    validate(text, SCHEMAS[name])


def test_sampled_chat_answers_validate(model):
    for seed in range(3):
        text = model.chat([{"role": "user", "content": "Describe a person as JSON."}],
                          enable_thinking=False, max_tokens=MAX_TOKENS, temperature=1.0,
                          seed=seed, response_format=response_format("nested_objects"))
        validate(text, SCHEMAS["nested_objects"])


def test_json_object_and_grammar(model):
    text = model.generate("And it came to pass", max_tokens=MAX_TOKENS, temperature=0,
                          grammar='root ::= ("yes" | "no") ", " [a-z]{2,6} "."')
    assert re.fullmatch(r"(yes|no), [a-z]{2,6}\.", text), text


def test_a_bad_format_is_an_error_naming_it(model):
    with pytest.raises(qhx.QhxError, match=r"^response_format\.json_schema\.schema: is missing"):
        model.generate("And", max_tokens=4, response_format={"type": "json_schema",
                                                             "json_schema": {"name": "x"}})
    with pytest.raises(qhx.QhxError, match="give response_format or grammar, not both"):
        model.generate("And", max_tokens=4, grammar='root ::= "a"',
                       response_format={"type": "json_object"})
    with pytest.raises(qhx.QhxError, match="EBNF parser error"):
        model.generate("And", max_tokens=4, grammar="root ::= undefined_rule")


# ---- qhx serve ---------------------------------------------------------------------------------

def chat(url: str, stream: bool, **body) -> dict:
    """The answer's message (streamed deltas put together) and finish reason."""
    status, data = post(url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Answer in JSON."}],
                         "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
                         "chat_template_kwargs": {"enable_thinking": False}, **body})
    assert status == 200, data
    if not stream:
        choice = json.loads(data)["choices"][0]
        return {**choice["message"], "finish_reason": choice["finish_reason"]}
    message: dict = {"content": "", "tool_calls": []}
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            if call["index"] == len(message["tool_calls"]):
                message["tool_calls"].append({"function": {"name": "", "arguments": ""}})
            function = message["tool_calls"][call["index"]]["function"]
            function["name"] += call.get("function", {}).get("name") or ""
            function["arguments"] += call.get("function", {}).get("arguments") or ""
        if choice.get("finish_reason"):
            message["finish_reason"] = choice["finish_reason"]
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_server_answers_validate(server, stream):
    for name in SCHEMAS:
        message = chat(server, stream, response_format=response_format(name))
        assert message["finish_reason"] == "stop", message
        validate(message["content"], SCHEMAS[name])
    message = chat(server, stream, response_format={"type": "json_object"})
    if message["finish_reason"] == "length":
        # Nothing bounds a free object's strings: Qwen3.5-kjv writes its first key as scripture
        # without end. What it wrote must still be the start of an object.
        assert SERVER_MODEL[server] == "qwen3.5-kjv", message
        assert re.match(r'\{\s*"', message["content"]), message
    else:
        assert message["finish_reason"] == "stop", message
        assert isinstance(json.loads(message["content"]), dict)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_server_tool_choice(server, stream):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        message = chat(server, stream, tools=[WEATHER, TIME], tool_choice=choice,
                       parallel_tool_calls=False)
        assert message["finish_reason"] == "tool_calls", message
        assert len(message["tool_calls"]) == 1, message
        assert message["tool_calls"], message
        for call in message["tool_calls"]:
            assert call["function"]["name"] in names
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                schemas[call["function"]["name"]])


def test_server_refuses_bad_formats(server):
    for body, param in (
            ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
             "response_format"),
            ({"grammar": "root ::= nothing_here"}, "grammar"),
            ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice")):
        status, data = post(server + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], **body})
        assert status == 400, (body, data)
        error = json.loads(data)["error"]
        assert error["param"] == param, error
        assert "\n" not in error["message"]
