"""qhx: Qwen3 and Qwen3.5 on the CPU, GPUs (Vulkan) and NPUs, from Python.

A thin layer over qhx's C API (libqhx.so, include/qhx/qhx.h) through ctypes::

    import qhx
    model = qhx.Model("models/qwen3.5-kjv")
    print(model.generate("And it came to pass", max_tokens=16, temperature=0))
    for chunk in model.chat([{"role": "user", "content": "Who was Moses?"}], stream=True):
        print(chunk.text, end="", flush=True)

    embedder = qhx.Model("Qwen3-Embedding-0.6B")  # a sentence-transformers checkpoint
    vectors = embedder.embed(["What is the capital of China?"], prompt_name="query")

Generation runs in a thread of its own without the GIL; its tokens come back through a queue, so
a loop over a stream can stop at any time (``break``, an exception, Ctrl-C), which cancels the
generation at its next token. Errors are :class:`QhxError` carrying qhx's one-line message.
"""

from __future__ import annotations

import ctypes
import json
import numbers
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from . import _capi

__all__ = ["Model", "Session", "Chunk", "Result", "Stream", "QhxError", "version"]

_lib = _capi.load()


class QhxError(RuntimeError):
    """A failed qhx call: ``status`` is the C API's status name, the message qhx's own line."""

    def __init__(self, status: int, message: str):
        self.status = _capi.STATUS_NAMES.get(status, str(status))
        super().__init__(message or f"qhx call failed ({self.status})")


def _check(status: int) -> None:
    if status != 0:
        raise QhxError(status, _lib.qhx_last_error().decode("utf-8", "replace"))


def _str(value: str | None) -> bytes | None:
    return None if value is None else value.encode("utf-8")


def version() -> str:
    """The version of the libqhx.so loaded."""
    return _lib.qhx_version().decode()


@dataclass(frozen=True)
class Chunk:
    """One generated token and the text it completes (possibly "" while a multi-byte character
    or a possible stop string is held back; token -1 for text released at the end)."""

    token: int
    text: str
    # With generate(..., logprobs=N): the token's log-probability under the model (log-softmax of
    # its logits at that step) and the N most likely (token, log-probability), most likely first.
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Result:
    """How a generation ended and what it cost."""

    text: str
    tokens: list[int]
    stop_reason: str  # "length", "eos", "stop_string", "callback" or "cancelled"
    n_prompt: int
    n_reused: int
    n_processed: int
    n_generated: int
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    constraint_ms: float = 0.0  # response_format / grammar: time in the constraint (in the above)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    vocab_size: int
    context_length: int
    eos_ids: list[int]
    has_chat_template: bool
    n_threads: int
    prefill_device: str
    decode_device: str
    device_note: str
    model_note: str
    admission_note: str
    embedding_size: int = 0
    pooling: str = ""  # an embedding checkpoint's ("last", "mean", "cls"), else ""
    reads_images: bool = False  # a Qwen3.5 checkpoint with its vision tower (docs/vision.md)
    vision_note: str = ""  # why it reads no images, or ""


def _int_array(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int32 * len(values))(*values)


class Stream:
    """An iterator of :class:`Chunk` for a generation running in its own thread. ``result``
    holds the :class:`Result` once the iteration ended; ``close()`` (or leaving a ``for`` loop
    early) cancels the generation and waits for it."""

    _DONE = object()

    def __init__(self, session: "Session", run: Callable[[Any, Any], int], keep: list,
                 logprobs: bool = False):
        self._session = session
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._keep = keep  # the ctypes arrays the call reads: alive until it returns
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._ended = False  # the worker's end marker was taken off the queue
        self.result: Result | None = None
        self._error: BaseException | None = None

        def on_token(_user, token, text, length):
            piece = ctypes.string_at(text, length).decode("utf-8", "replace")
            lp = _capi.TokenLogprobs()
            if token >= 0 and logprobs and _lib.qhx_session_token_logprobs(
                    session._handle, ctypes.byref(lp)) == 0:
                top = tuple((lp.top_tokens[i], lp.top_logprobs[i]) for i in range(lp.n_top))
                self._queue.put(Chunk(token, piece, lp.logprob, top))
            else:
                self._queue.put(Chunk(token, piece))
            return 1 if self._stop.is_set() else 0

        self._callback = _capi.TOKEN_CALLBACK(on_token)
        self._raw = _capi.GenerateResult()

        def work():
            try:
                status = run(self._callback, ctypes.byref(self._raw))
                if status != 0:  # the message is this thread's
                    self._error = QhxError(status, _lib.qhx_last_error().decode("utf-8", "replace"))
            except BaseException as e:  # noqa: BLE001 - handed to the reading thread
                self._error = e
            finally:
                self._queue.put(Stream._DONE)

        self._thread = threading.Thread(target=work, name="qhx-generate", daemon=True)
        session._begin(self)
        self._thread.start()

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        while True:
            try:  # a timeout, so that Ctrl-C reaches this thread while it waits
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            except BaseException:
                self.close()
                raise
            if not self._take(item):
                self._finish()
                raise StopIteration
            return item

    def _take(self, item) -> bool:
        """Records a chunk from the queue; False for the end marker."""
        if item is Stream._DONE:
            self._ended = True
            return False
        if item.token >= 0:
            self._tokens.append(item.token)
        self._text.append(item.text)
        return True

    def _finish(self) -> None:
        self._thread.join()
        self._session._end(self)
        raw = self._raw
        if raw.text:
            _lib.qhx_string_free(raw.text)
            raw.text = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.result is None:
            self.result = Result(
                text="".join(self._text), tokens=list(self._tokens),
                stop_reason=_capi.STOP_REASONS.get(raw.stop_reason, str(raw.stop_reason)),
                n_prompt=raw.n_prompt, n_reused=raw.n_reused, n_processed=raw.n_processed,
                n_generated=raw.n_generated, prefill_ms=raw.prefill_ms, ttft_ms=raw.ttft_ms,
                decode_ms=raw.decode_ms, constraint_ms=raw.constraint_ms)

    def close(self) -> None:
        """Cancels the generation (at its next token or prefill chunk) and waits for it."""
        if self._thread.is_alive():
            self._stop.set()
            _lib.qhx_session_cancel(self._session._handle)
        while not self._ended and self._take(self._queue.get()):
            pass
        self._finish()

    def __del__(self):
        if getattr(self, "_thread", None) is not None and self._thread.is_alive():
            self._stop.set()

    def text(self) -> str:
        """Runs the generation to its end and returns all its text."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result.text


class _Closable:
    """``with`` closes it, and so does the garbage collector (close() must be idempotent)."""

    _handle = None

    def close(self) -> None:  # pragma: no cover - each subclass has its own
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if self._handle:
            self.close()


class Session(_Closable):
    """A conversation's state on a model: give it the whole conversation each time (token ids,
    or chat messages) and it processes only what it has not seen. One generation at a time."""

    def __init__(self, model: "Model", context_length: int = 0, prefill_chunk: int = 0):
        options = _capi.SessionOptions()
        _lib.qhx_session_options_default(ctypes.byref(options))
        if context_length:
            options.context_length = context_length
        if prefill_chunk:
            options.prefill_chunk = prefill_chunk
        handle = ctypes.c_void_p()
        _check(_lib.qhx_session_create(model._handle, ctypes.byref(options), ctypes.byref(handle)))
        self._model = model
        self._running: Stream | None = None
        self._lock = threading.Lock()
        self._handle = handle

    def _begin(self, stream: Stream) -> None:
        with self._lock:
            if self._running is not None:
                raise QhxError(1, "this session is already generating: finish or close its "
                                  "stream first (or use another session)")
            self._running = stream

    def _end(self, stream: Stream) -> None:
        with self._lock:
            if self._running is stream:
                self._running = None

    def generate(self, tokens: Sequence[int], **options: Any) -> Stream:
        """Continues the conversation `tokens` (all of it so far): a :class:`Stream`. Options as
        :meth:`Model.generate`'s."""
        ids = _int_array(tokens)
        opts, keep = self._model._options(**options)
        return Stream(self, lambda cb, res: _lib.qhx_session_generate(
            self._handle, ids, len(tokens), ctypes.byref(opts), cb, None, res), [ids, opts, keep],
            logprobs=bool(opts.logprobs))

    def chat(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
             add_generation_prompt: bool = True, enable_thinking: bool | None = None,
             chat_template_kwargs: dict | None = None, **options: Any) -> Stream:
        """Renders the messages with the model's chat template and continues that conversation,
        keeping the state where the next turn's rendering of this reply will differ."""
        request = _request_json(messages, tools, chat_template_kwargs)
        template = _template_options(add_generation_prompt, enable_thinking)
        opts, keep = self._model._options(**options)
        return Stream(self, lambda cb, res: _lib.qhx_session_chat(
            self._handle, request, ctypes.byref(template), ctypes.byref(opts), cb, None, res),
            [request, template, opts, keep], logprobs=bool(opts.logprobs))

    def embed(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], *,
              prompt_name: str | None = None, prompt: str | None = None,
              pooling: str | None = None, normalize: bool | None = None,
              dimensions: int = 0) -> list[float] | list[list[float]]:
        """Sentence embeddings on this session's state (its conversation is dropped): see
        :meth:`Model.embed`."""
        with self._lock:
            if self._running is not None:
                raise QhxError(1, "this session is generating: finish or close its stream first")
            return _embed(self._handle, input, prompt_name, prompt, pooling, normalize,
                          dimensions)[0]

    def cancel(self) -> None:
        """Stops the generation running now at its next token (any thread may call it)."""
        _lib.qhx_session_cancel(self._handle)

    @property
    def tokens(self) -> list[int]:
        """The tokens the session's state holds."""
        ptr = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_size_t()
        _check(_lib.qhx_session_tokens(self._handle, ctypes.byref(ptr), ctypes.byref(n)))
        return ptr[: n.value] if n.value else []

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the session could reuse without processing them."""
        return int(_lib.qhx_session_reusable(self._handle, _int_array(tokens), len(tokens)))

    def reset(self) -> None:
        _check(_lib.qhx_session_reset(self._handle))

    def save(self, path: str | Path) -> None:
        """The state and its tokens to a file (``load`` reads it back, on the same model)."""
        _check(_lib.qhx_session_save(self._handle, _str(str(path))))

    def load(self, path: str | Path) -> None:
        _check(_lib.qhx_session_load(self._handle, _str(str(path))))

    def close(self) -> None:
        if self._handle:
            if self._running is not None:
                self._running.close()
            _lib.qhx_session_destroy(self._handle)
            self._handle = None


def _single_input(input) -> bool:
    """One text, or one list of token ids (ints of any kind: numpy's too)."""
    return isinstance(input, str) or (len(input) > 0 and isinstance(input[0], numbers.Integral))


def _embed(session, input, prompt_name, prompt, pooling, normalize, dimensions):
    """(vectors, qhx_embed_result): one list per input, or one list for a single input (a str,
    or a list of token ids)."""
    o = _capi.EmbedOptions()
    _lib.qhx_embed_options_default(ctypes.byref(o))
    keep = [_str(pooling), _str(prompt), _str(prompt_name)]
    o.pooling, o.prompt, o.prompt_name = keep
    if normalize is not None:
        o.normalize = int(bool(normalize))
    o.dimensions = dimensions
    single = _single_input(input)
    inputs = [input] if single else list(input)
    if not inputs:
        return [], None
    result = _capi.EmbedResult()
    if isinstance(inputs[0], str):
        if not all(isinstance(t, str) for t in inputs):
            raise QhxError(1, "embed: inputs must all be strings or all token-id lists")
        data = [t.encode("utf-8") for t in inputs]
        texts = (ctypes.c_char_p * len(data))(*data)
        lens = (ctypes.c_size_t * len(data))(*[len(d) for d in data])
        run = lambda out, n: _lib.qhx_embed(  # noqa: E731
            session, texts, lens, len(data), ctypes.byref(o), out, n, ctypes.byref(result))
    else:
        flat = [int(i) for ids in inputs for i in ids]
        if any(not 0 <= i < 2**31 for i in flat):
            raise QhxError(1, "embed: token ids must be from 0 to 2**31 - 1")
        offsets = [0]
        for ids in inputs:
            offsets.append(offsets[-1] + len(ids))
        ids_array = _int_array(flat)
        offsets_array = (ctypes.c_size_t * len(offsets))(*offsets)
        run = lambda out, n: _lib.qhx_embed_tokens(  # noqa: E731
            session, ids_array, offsets_array, len(inputs), ctypes.byref(o), out, n,
            ctypes.byref(result))
    status = run(None, 0)
    if status != _capi.BUFFER_TOO_SMALL:
        _check(status)
    dims = result.dimensions
    out = (ctypes.c_float * (len(inputs) * dims))()
    _check(run(out, len(out)))
    vectors = [list(out[k * dims:(k + 1) * dims]) for k in range(len(inputs))]
    return (vectors[0] if single else vectors), result


def _request_json(messages, tools, kwargs) -> bytes:
    request: dict[str, Any] = {"messages": list(messages)}
    if tools:
        request["tools"] = list(tools)
    if kwargs:
        request["chat_template_kwargs"] = dict(kwargs)
    return json.dumps(request).encode("utf-8")


def _template_options(add_generation_prompt: bool, enable_thinking: bool | None):
    t = _capi.TemplateOptions()
    _lib.qhx_template_options_default(ctypes.byref(t))
    t.add_generation_prompt = 1 if add_generation_prompt else 0
    t.enable_thinking = -1 if enable_thinking is None else int(bool(enable_thinking))
    return t


class Model(_Closable):
    """An opened model: a qhx bundle, a pack of bundles, or a Hugging Face checkpoint directory.

    Args:
        path: the model's directory.
        device: where prompts run: "cpu", "vulkan" / "vulkan:N", "hexagon" / "hexagon:vNN".
        decode_device: where replies are decoded (None: the device's default).
        n_threads: compute threads (0: every one the process may use).
        context_length: tokens per session (0: as long as the model and memory allow).
        max_sessions: sessions alive at once, counted by memory admission.
        device_check: "once" (default), "always" or "never".
        draft_model: a smaller model with the same tokenizer, for ``speculative="draft"``.
        kv_type: how the KV cache holds keys and values: "f32" (default, exact), "f16", "q8"
            or "q4" (docs/kv_cache.md).
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", decode_device: str | None = None,
                 n_threads: int = 0, context_length: int = 0, max_sessions: int = 2,
                 prefix_cache_bytes: int = 0, device_check: str | None = None,
                 draft_model: str | Path | None = None, verify_sha256: bool = False,
                 kv_type: str = "f32"):
        o = _capi.ModelOptions()
        _lib.qhx_model_options_default(ctypes.byref(o))
        o.n_threads = n_threads
        o.context_length = context_length
        o.max_sessions = max_sessions
        o.prefix_cache_bytes = prefix_cache_bytes
        o.verify_sha256 = int(verify_sha256)
        keep = [_str(device), _str(decode_device), _str(device_check),
                _str(None if draft_model is None else str(draft_model)), _str(kv_type)]
        o.device, o.decode_device, o.device_check, o.draft_model, o.kv_type = keep
        handle = ctypes.c_void_p()
        _check(_lib.qhx_model_open(_str(str(path)), ctypes.byref(o), ctypes.byref(handle)))
        self._handle = handle
        self.path = Path(path)
        self._default: Session | None = None
        self.info = self._info()

    def _info(self) -> ModelInfo:
        i = _capi.ModelInfo()
        _check(_lib.qhx_model_get_info(self._handle, ctypes.byref(i)))
        s = lambda p: (p or b"").decode("utf-8", "replace")  # noqa: E731
        return ModelInfo(
            name=s(i.name), family=s(i.family), vocab_size=i.vocab_size,
            context_length=i.context_length, eos_ids=[i.eos_ids[k] for k in range(i.n_eos_ids)],
            has_chat_template=bool(i.has_chat_template), n_threads=i.n_threads,
            prefill_device=s(i.prefill_device), decode_device=s(i.decode_device),
            device_note=s(i.device_note), model_note=s(i.model_note),
            admission_note=s(i.admission_note), embedding_size=i.embedding_size,
            pooling=s(i.pooling), reads_images=bool(i.reads_images),
            vision_note=s(i.vision_note))

    # -- text ------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """UTF-8 text to token ids (special tokens in the text become their ids; no BOS)."""
        data = text.encode("utf-8")
        n = ctypes.c_size_t()
        capacity = len(data) + 16
        while True:
            ids = (ctypes.c_int32 * capacity)()
            status = _lib.qhx_tokenize(self._handle, data, len(data), ids, capacity, ctypes.byref(n))
            if status == _capi.BUFFER_TOO_SMALL:
                capacity = n.value
                continue
            _check(status)
            return ids[: n.value]

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Token ids to text (invalid UTF-8 becomes U+FFFD)."""
        arr = _int_array(ids)
        n = ctypes.c_size_t()
        capacity = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            status = _lib.qhx_detokenize(self._handle, arr, len(ids), int(skip_special), buf,
                                         capacity, ctypes.byref(n))
            if status == _capi.BUFFER_TOO_SMALL:
                capacity = n.value + 1
                continue
            _check(status)
            return buf.raw[: n.value].decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        """One token's bytes as the tokenizer holds them (may end inside a UTF-8 character)."""
        n = ctypes.c_size_t()
        capacity = 64
        while True:
            buf = ctypes.create_string_buffer(capacity)
            status = _lib.qhx_token_bytes(self._handle, token, buf, capacity, ctypes.byref(n))
            if status == _capi.BUFFER_TOO_SMALL:
                capacity = n.value
                continue
            _check(status)
            return buf.raw[: n.value]

    def _logprob_entry(self, token: int, logprob: float) -> dict:
        raw = self.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": max(logprob, -9999.0),
                "bytes": list(raw)}

    def _logprobs_of(self, chunk: Chunk) -> dict:
        """OpenAI's chat logprobs entry for a chunk."""
        if chunk.logprob is None:
            raise QhxError(8, f"no log-probability came with token {chunk.token}")
        entry = self._logprob_entry(chunk.token, chunk.logprob)
        entry["top_logprobs"] = [self._logprob_entry(t, lp) for t, lp in chunk.top_logprobs]
        return entry

    def apply_chat_template(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                            add_generation_prompt: bool = True,
                            enable_thinking: bool | None = None, **chat_template_kwargs) -> str:
        """The conversation as the model's chat template renders it (as transformers'
        ``apply_chat_template(..., tokenize=False)``)."""
        out = ctypes.c_void_p()
        _check(_lib.qhx_apply_chat_template(
            self._handle, _request_json(messages, tools, chat_template_kwargs),
            ctypes.byref(_template_options(add_generation_prompt, enable_thinking)),
            ctypes.byref(out)))
        try:
            return ctypes.string_at(out.value).decode("utf-8")
        finally:
            _lib.qhx_string_free(out)

    # -- generation ------------------------------------------------------------------------

    def session(self, context_length: int = 0, prefill_chunk: int = 0) -> Session:
        """A new conversation state on this model (``with model.session() as s: ...``)."""
        return Session(self, context_length, prefill_chunk)

    def _session(self) -> Session:
        if self._default is None:
            self._default = Session(self)
        return self._default

    def _options(self, *, max_tokens: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repeat_penalty: float | None = None, presence_penalty: float | None = None,
                 frequency_penalty: float | None = None, seed: int | None = None,
                 logit_bias: dict[int, float] | None = None, stop: str | Iterable[str] | None = None,
                 stop_token_ids: Iterable[int] | None = None, ignore_eos: bool = False,
                 speculative: str | None = None, draft_max: int = 0,
                 response_format: dict | str | None = None, grammar: str | None = None,
                 logprobs: int | None = None):
        o = _capi.GenerateOptions()
        _check(_lib.qhx_generate_options_default(self._handle, ctypes.byref(o)))
        keep: list = []
        s = o.sampling
        if max_tokens is not None:
            o.max_new_tokens = max_tokens
        if temperature is not None:  # 0: greedy; a negative one is refused by the check below
            s.greedy = 1 if temperature == 0 else 0
            if temperature != 0:
                s.temperature = temperature
        for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                            ("repetition_penalty", repeat_penalty),
                            ("presence_penalty", presence_penalty),
                            ("frequency_penalty", frequency_penalty), ("seed", seed)):
            if value is not None:
                setattr(s, name, value)
        if logit_bias:
            ids = _int_array(list(logit_bias))
            values = (ctypes.c_float * len(logit_bias))(*logit_bias.values())
            s.logit_bias_ids, s.logit_bias_values, s.n_logit_bias = (
                ctypes.cast(ids, ctypes.POINTER(ctypes.c_int32)),
                ctypes.cast(values, ctypes.POINTER(ctypes.c_float)), len(logit_bias))
            keep += [ids, values]
        o.stop_at_eos = 0 if ignore_eos else 1
        if stop_token_ids:
            ids = _int_array(list(stop_token_ids))
            o.stop_ids, o.n_stop_ids = ctypes.cast(ids, ctypes.POINTER(ctypes.c_int32)), len(ids)
            keep.append(ids)
        if stop:
            strings = [stop] if isinstance(stop, str) else list(stop)
            arr = (ctypes.c_char_p * len(strings))(*[x.encode("utf-8") for x in strings])
            o.stop_strings, o.n_stop_strings = arr, len(strings)
            keep.append(arr)
        if speculative is not None:
            o.speculative = speculative.encode()
        o.draft_max = draft_max
        if grammar is not None:
            if response_format is not None:
                raise QhxError(1, "generate options: give response_format or grammar, not both")
            response_format = {"type": "grammar", "grammar": grammar}
        if response_format is not None:
            text = (response_format if isinstance(response_format, str)
                    else json.dumps(response_format))
            encoded = text.encode("utf-8")
            o.response_format = encoded
            keep.append(encoded)
        if logprobs is not None:
            o.logprobs, o.top_logprobs = 1, logprobs
        _check(_lib.qhx_generate_options_check(self._handle, ctypes.byref(o)))
        return o, keep

    def generate(self, prompt: str | Sequence[int], *, stream: bool = False,
                 **options: Any) -> str | Stream:
        """A continuation of `prompt` (text, or token ids), on the model's own session (which
        reuses what a previous call's prompt shares with this one).

        Options: ``max_tokens``, ``temperature`` (0: greedy; default: the model's
        generation_config.json), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``,
        ``presence_penalty``, ``frequency_penalty``, ``seed``, ``logit_bias`` ({id: bias}),
        ``stop`` (strings, not part of the text), ``stop_token_ids``, ``ignore_eos``,
        ``speculative`` ("ngram", "mtp", "draft") and ``draft_max``, ``response_format`` or
        ``grammar`` (docs/structured_output.md), ``logprobs`` (N: each :class:`Chunk` carries its
        token's log-probability and the N most likely alternatives, 0..20).

        Returns the text, or with ``stream=True`` a :class:`Stream` of :class:`Chunk`.
        """
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        s = self._session().generate(ids, **options)
        return s if stream else s.text()

    def chat(self, messages: Sequence[dict], *, stream: bool = False, **options: Any) -> str | Stream:
        """The assistant's reply to `messages` (OpenAI-style dicts) on the model's own session:
        the text, or with ``stream=True`` a :class:`Stream`. ``tools``, ``enable_thinking`` and
        ``chat_template_kwargs`` go to the template; the rest as :meth:`generate`'s."""
        s = self._session().chat(messages, **options)
        return s if stream else s.text()

    # -- embeddings ------------------------------------------------------------------------

    def embed(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], *,
              prompt_name: str | None = None, prompt: str | None = None,
              pooling: str | None = None, normalize: bool | None = None,
              dimensions: int = 0) -> list[float] | list[list[float]]:
        """Sentence embeddings, as sentence-transformers' ``encode`` computes them from the
        checkpoint's modules.json and 1_Pooling/config.json (Qwen3-Embedding: the last token,
        L2-normalised): a list of floats for one text (or one list of token ids), a list of them
        for a list. Texts are tokenized as Hugging Face's ``tokenizer(prompt + text)`` and cut to
        the checkpoint's max_seq_length as sentence-transformers cuts them; token ids are taken
        as they are.

        Args:
            prompt_name: one of the model's prompts (config_sentence_transformers.json;
                Qwen3-Embedding's "query"), put before each text.
            prompt: text put before each text instead (Qwen3-Embedding's queries:
                ``"Instruct: <task>\\nQuery:"``).
            pooling: "last", "mean" or "cls" (default: the checkpoint's; needed for a model
                without one).
            normalize: L2-normalise (default: the checkpoint's Normalize module).
            dimensions: keep the first N (Matryoshka), normalised after the cut as OpenAI's
                ``dimensions`` is (sentence-transformers' ``truncate_dim`` cuts the normalised
                vector: the same cosines, other lengths); 0: all.

        Runs on the model's own session, whose conversation it drops.
        """
        return self._session().embed(input, prompt_name=prompt_name, prompt=prompt,
                                     pooling=pooling, normalize=normalize, dimensions=dimensions)

    def create_embedding(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                         *, prompt_name: str | None = None, prompt: str | None = None,
                         pooling: str | None = None, normalize: bool | None = None,
                         dimensions: int = 0) -> dict:
        """An OpenAI-shaped embeddings answer (as llama-cpp-python's ``create_embedding``); the
        options are :meth:`embed`'s."""
        session = self._session()
        with session._lock:
            if session._running is not None:
                raise QhxError(1, "the model's session is generating: finish its stream first")
            vectors, result = _embed(session._handle, input, prompt_name, prompt, pooling,
                                     normalize, dimensions)
        if _single_input(input):
            vectors = [vectors]
        n_tokens = result.n_tokens if result is not None else 0
        return {"object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": v}
                         for i, v in enumerate(vectors)],
                "model": self.info.name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

    def create_chat_completion(self, messages: Sequence[dict], *, stream: bool = False,
                               max_tokens: int | None = None, logprobs: bool = False,
                               top_logprobs: int | None = None, **options: Any):
        """An OpenAI-shaped chat completion (as llama-cpp-python's): a dict, or with
        ``stream=True`` an iterator of ``chat.completion.chunk`` dicts. ``logprobs`` and
        ``top_logprobs`` as OpenAI's (``choices[0].logprobs.content``); ``response_format``
        as generate()'s."""
        ident = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        name = self.info.name
        if top_logprobs is not None and not logprobs:
            raise QhxError(1, "create_chat_completion: top_logprobs needs logprobs=True")
        if logprobs:
            options["logprobs"] = top_logprobs or 0
        s = self._session().chat(messages, max_tokens=max_tokens, **options)
        ends = set(self.info.eos_ids)

        def entries(chunks: Iterable[Chunk]) -> dict | None:
            if not logprobs:
                return None
            return {"content": [self._logprobs_of(c) for c in chunks
                                if c.token >= 0 and c.token not in ends]}
        finish = {"length": "length", "cancelled": "stop", "callback": "stop"}

        def usage(r: Result) -> dict:
            return {"prompt_tokens": r.n_prompt, "completion_tokens": r.n_generated,
                    "total_tokens": r.n_prompt + r.n_generated}

        if not stream:
            got = list(s)
            r = s.result
            assert r is not None
            text = r.text
            return {"id": ident, "object": "chat.completion", "created": created, "model": name,
                    "choices": [{"index": 0,
                                 "message": {"role": "assistant", "content": text},
                                 "logprobs": entries(got),
                                 "finish_reason": finish.get(r.stop_reason, "stop")}],
                    "usage": usage(r)}

        def chunks() -> Iterator[dict]:
            base = {"id": ident, "object": "chat.completion.chunk", "created": created,
                    "model": name}
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                        "logprobs": None, "finish_reason": None}]}
            try:
                held: list[Chunk] = []  # tokens whose text is still held back
                for c in s:
                    held.append(c)
                    if c.text:
                        yield {**base, "choices": [{"index": 0, "delta": {"content": c.text},
                                                    "logprobs": entries(held),
                                                    "finish_reason": None}]}
                        held = []
            finally:
                if s.result is None:
                    s.close()
            r = s.result
            assert r is not None
            yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": finish.get(r.stop_reason, "stop")}],
                   "usage": usage(r)}

        return chunks()

    def close(self) -> None:
        """Closes the model (and its own session); sessions made with session() must be closed
        first."""
        if self._default is not None:
            self._default.close()
            self._default = None
        if self._handle:
            _lib.qhx_model_close(self._handle)
            self._handle = None
