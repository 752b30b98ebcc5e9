"""The Python package against the CLI and the C API's contracts (pytest python/tests).

QHX_CLI: the qhx binary whose output the package must reproduce (default: build/qhx);
QHX_LIBRARY: a libqhx.so to load instead of the installed package's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import qhx

REPO = Path(__file__).resolve().parents[2]
KJV35 = REPO / "models" / "qwen3.5-kjv"
KJV3 = REPO / "models" / "qwen3-kjv"
TINY = REPO / "tests" / "fixtures" / "qwen3" / "gqa2_f16"  # no tokenizer: ids only
CLI = Path(os.environ.get("QHX_CLI", REPO / "build" / "qhx"))


def cli(*args: str) -> str:
    assert CLI.exists(), f"no qhx binary at {CLI} (QHX_CLI names it)"
    out = subprocess.run([str(CLI), *args], capture_output=True, text=True, check=True)
    return out.stdout


@pytest.fixture(scope="module")
def kjv35():
    with qhx.Model(KJV35, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def kjv3():
    with qhx.Model(KJV3, n_threads=2) as m:
        yield m


def test_greedy_text_is_the_clis(kjv35):
    # The contract later checks use: the same text qhx generate --greedy prints.
    text = kjv35.generate("And it came to pass", max_tokens=16, temperature=0)
    expected = cli("generate", "--model", str(KJV35), "--prompt", "And it came to pass",
                   "--greedy", "-n", "16")
    assert text == expected.rstrip("\n")
    assert len(text) > 0


def test_streamed_ids_are_the_clis_and_join_to_the_text(kjv3):
    prompt = "In the beginning"
    ids = kjv3.tokenize(prompt)
    stream = kjv3.generate(ids, max_tokens=12, temperature=0, ignore_eos=True, stream=True)
    chunks = list(stream)
    assert stream.result is not None
    assert stream.result.stop_reason == "length"
    assert stream.result.n_generated == 12
    assert [c.token for c in chunks if c.token >= 0] == stream.result.tokens
    printed = cli("generate", "--model", str(KJV3), "--prompt-ids", ",".join(map(str, ids)),
                  "--greedy", "--ignore-eos", "-n", "12", "--print-ids").strip()
    assert stream.result.tokens == [int(x) for x in printed.split(",")]
    assert "".join(c.text for c in chunks) == stream.result.text
    assert stream.result.text == kjv3.detokenize(stream.result.tokens)


def test_tokenize_round_trip_and_special_tokens(kjv3):
    text = "<|im_start|>user\nAnd God said, Let there be light: and there was light.<|im_end|>"
    ids = kjv3.tokenize(text)
    assert ids[0] == kjv3.tokenize("<|im_start|>")[0]
    assert kjv3.detokenize(ids) == text
    assert "<|im_start|>" not in kjv3.detokenize(ids, skip_special=True)
    long = "light " * 3000  # more ids than the first buffer guess holds is no error
    assert kjv3.detokenize(kjv3.tokenize(long)) == long


def test_breaking_out_of_a_stream_cancels_it_and_the_session_goes_on(kjv3):
    with kjv3.session() as s:
        ids = kjv3.tokenize("And the earth was without form")
        stream = s.generate(ids, max_tokens=200, temperature=0, ignore_eos=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        assert stream.result is not None
        assert stream.result.stop_reason in ("callback", "cancelled")
        assert stream.result.n_generated < 200
        again = s.generate(ids, max_tokens=6, temperature=0, ignore_eos=True)
        again.text()
        fresh = kjv3.generate(ids, max_tokens=6, temperature=0, ignore_eos=True, stream=True)
        fresh.text()
        assert again.result.tokens == fresh.result.tokens


def test_one_generation_at_a_time_on_a_session(kjv3):
    with kjv3.session() as s:
        ids = kjv3.tokenize("And the evening")
        first = s.generate(ids, max_tokens=50, temperature=0, ignore_eos=True)
        with pytest.raises(qhx.QhxError, match="already generating"):
            s.generate(ids, max_tokens=5)
        first.close()


def test_ctrl_c_cancels_the_generation(kjv3):
    ids = kjv3.tokenize("And the spirit of God")
    stream = kjv3.generate(ids, max_tokens=4000, temperature=0, ignore_eos=True, stream=True)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    timer.join()
    assert stream.result is not None and stream.result.stop_reason in ("callback", "cancelled")
    assert kjv3.generate(ids, max_tokens=3, temperature=0)  # the model's session goes on


def test_the_gil_is_released_while_generating(kjv3):
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    prompt = kjv3.tokenize("light " * 400)
    t = threading.Thread(target=count)
    t.start()
    try:
        # A long prefill is one C call: had it held the GIL, the counter would stand still for
        # nearly all of it (a tick a millisecond at most).
        start = time.perf_counter()
        kjv3.generate(prompt, max_tokens=2, temperature=0)
        elapsed = time.perf_counter() - start
    finally:
        done.set()
        t.join()
    assert elapsed > 0.02
    assert ticks > 0.2 * elapsed * 1000, (ticks, elapsed)


def test_stop_strings_end_the_text_before_them(kjv3):
    ids = kjv3.tokenize("And God said")
    full = kjv3.generate(ids, max_tokens=24, temperature=0, ignore_eos=True)
    words = full.split()
    assert len(words) > 3
    stop = words[2]
    cut = kjv3.generate(ids, max_tokens=24, temperature=0, ignore_eos=True, stop=[stop],
                        stream=True)
    text = cut.text()
    assert cut.result.stop_reason == "stop_string"
    assert stop not in text and full.startswith(text)


def test_sampling_is_seeded(kjv3):
    a = kjv3.generate("And God said", max_tokens=12, temperature=1.0, seed=7)
    b = kjv3.generate("And God said", max_tokens=12, temperature=1.0, seed=7)
    assert a == b


def test_a_second_turn_reuses_the_first_and_a_saved_state_loads(kjv35, tmp_path):
    with kjv35.session() as s:
        messages = [{"role": "user", "content": "Who was Moses?"}]
        first = s.chat(messages, max_tokens=12, temperature=0, enable_thinking=False)
        reply = first.text()
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And Aaron?"}]
        second = s.chat(messages, max_tokens=8, temperature=0, enable_thinking=False)
        second.text()
        assert second.result.n_reused > 0
        assert second.result.n_processed < second.result.n_prompt
        state = tmp_path / "s.qhxs"
        s.save(state)
        tokens = s.tokens
        with kjv35.session() as t:
            t.load(state)
            assert t.tokens == tokens


def test_chat_completion_is_openai_shaped_streamed_or_not(kjv35):
    messages = [{"role": "user", "content": "Who was Moses?"}]
    whole = kjv35.create_chat_completion(messages, max_tokens=10, temperature=0,
                                         enable_thinking=False)
    assert whole["object"] == "chat.completion"
    choice = whole["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    assert whole["usage"]["completion_tokens"] <= 10
    chunks = list(kjv35.create_chat_completion(messages, max_tokens=10, temperature=0,
                                               enable_thinking=False, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


def test_errors_carry_qhxs_message():
    with pytest.raises(qhx.QhxError, match="config.json") as e:
        qhx.Model("/nonexistent/model")
    assert e.value.status == "model"
    with qhx.Model(TINY, n_threads=1, context_length=64) as m:
        assert m.info.family == "qwen3"
        with pytest.raises(qhx.QhxError):
            m.generate(list(range(60)), max_tokens=32)  # past the context
        with pytest.raises(qhx.QhxError, match="top_p"):
            m.generate([1, 2, 3], max_tokens=2, top_p=2.0)
        with pytest.raises(qhx.QhxError, match="temperature"):
            m.generate([1, 2, 3], max_tokens=2, temperature=-1.0)
        ids = m.generate([1, 2, 3], max_tokens=4, temperature=0, ignore_eos=True, stream=True)
        ids.text()  # after the errors, the model's session still generates
        assert len(ids.result.tokens) == 4
