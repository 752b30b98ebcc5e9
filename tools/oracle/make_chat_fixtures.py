"""Renders chat-template golden cases with transformers' own apply_chat_template (tokenize=False)
into tests/fixtures/chat/<template>.jsonl: one JSON object per case with the inputs and either the
expected "text" or the expected "error" message. No network: the tokenizer is the local Qwen3 one.

Usage: $ORACLE_VENV/bin/python tools/oracle/make_chat_fixtures.py
"""

import json
import pathlib

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "tests" / "fixtures" / "tokenizer" / "qwen3"
OUT_DIR = ROOT / "tests" / "fixtures" / "chat"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}

USER = {"role": "user", "content": "Hello there, how are you?"}
SYSTEM = {"role": "system", "content": "  You are terse.  \n"}

# name -> (messages, extra apply_chat_template arguments)
CASES = {
    "user": ([USER], {}),
    "user_think_true": ([USER], {"enable_thinking": True}),
    "user_think_false": ([USER], {"enable_thinking": False}),
    "user_no_generation_prompt": ([USER], {"add_generation_prompt": False}),
    "system_user": ([SYSTEM, USER], {}),
    "multi_turn": (
        [SYSTEM, USER, {"role": "assistant", "content": "Fine, thanks."}, {"role": "user", "content": "And you?"}],
        {"enable_thinking": False},
    ),
    "reasoning_content_last": (
        [USER, {"role": "assistant", "reasoning_content": "\nThink it over.\n", "content": "\nWell."}],
        {"add_generation_prompt": False},
    ),
    "reasoning_content_history": (
        [USER, {"role": "assistant", "reasoning_content": "Hidden.", "content": "Shown."}, {"role": "user", "content": "More?"}],
        {},
    ),
    "thinking_field_alias": (
        [USER, {"role": "assistant", "thinking": "Via the thinking key.", "content": "Done."}],
        {"add_generation_prompt": False},
    ),
    "think_in_content_last": (
        [USER, {"role": "assistant", "content": "<think>\nPonder.\n</think>\n\nAnswer."}],
        {"add_generation_prompt": False},
    ),
    "think_in_content_history": (
        [USER, {"role": "assistant", "content": "<think>\nPonder.\n</think>\n\nAnswer."}, {"role": "user", "content": "Next"}],
        {"enable_thinking": True},
    ),
    "tools_only": ([USER], {"tools": [WEATHER, TIME]}),
    "tools_with_system": ([SYSTEM, USER], {"tools": [WEATHER], "enable_thinking": False}),
    "tool_call_object_args": (
        [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": 2, "detail": {"hourly": True}}}}]},
            {"role": "tool", "content": "{\"temp\": 21}"},
        ],
        {"tools": [WEATHER]},
    ),
    "tool_calls_string_args_two_responses": (
        [
            {"role": "user", "content": "Weather in Oslo and time in Tokyo?"},
            {"role": "assistant", "content": "Checking both.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"Asia/Tokyo\"}"}},
            ]},
            {"role": "tool", "content": "{\"temp\": -3}"},
            {"role": "tool", "content": "{\"time\": \"09:15\"}"},
            {"role": "assistant", "content": "Cold in Oslo; 09:15 in Tokyo."},
        ],
        {"tools": [WEATHER, TIME], "enable_thinking": False, "add_generation_prompt": False},
    ),
    "tool_call_null_content": (
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_time", "arguments": {"tz": "UTC"}}}]},
            {"role": "tool", "content": "12:00"},
        ],
        {"tools": [TIME]},
    ),
    "unicode_emoji": (
        [{"role": "user", "content": "你好！请介绍一下你自己。😀 Ünïcödé — “quotes” \t tab"}, {"role": "assistant", "content": "我是助手 🙏"}, {"role": "user", "content": "谢谢"}],
        {"enable_thinking": False},
    ),
    "content_parts": (
        [
            {"role": "system", "content": [{"type": "text", "text": "Parted system."}]},
            {"role": "user", "content": [{"type": "text", "text": " Look: "}, {"type": "image"}, {"type": "text", "text": "what is it? "}]},
        ],
        {},
    ),
    "empty_content": ([{"role": "user", "content": ""}], {"enable_thinking": True}),
    "error_system_not_first": ([USER, {"role": "system", "content": "late"}], {}),
    "error_no_user": ([{"role": "system", "content": "Only system."}], {}),
    "error_bad_part": ([{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], {}),
}


def render(tokenizer, template, messages, extra):
    kwargs = {"add_generation_prompt": True, **extra}
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


def main():
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    templates = {
        "qwen3": config["chat_template"],
        "qwen3_5_style": (OUT_DIR / "qwen3_5_style.jinja").read_text(),
        "features": (OUT_DIR / "features.jinja").read_text(),
    }
    for template_name, template in templates.items():
        lines = []
        for case_name, (messages, extra) in CASES.items():
            case = {"name": case_name, "messages": messages}
            if "tools" in extra:
                case["tools"] = extra["tools"]
            case["add_generation_prompt"] = extra.get("add_generation_prompt", True)
            if "enable_thinking" in extra:
                case["enable_thinking"] = extra["enable_thinking"]
            try:
                case["text"] = render(tokenizer, template, messages, extra)
            except Exception as e:  # the template's own error is the expected outcome
                case["error"] = str(e)
            lines.append(json.dumps(case, ensure_ascii=False))
        (OUT_DIR / f"{template_name}.jsonl").write_text("\n".join(lines) + "\n")
        print(f"{template_name}: {len(lines)} cases")


if __name__ == "__main__":
    main()
