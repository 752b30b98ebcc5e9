"""ctypes declarations of qhx's C API (include/qhx/qhx.h, QHX_API_VERSION 5).

The structs mirror the header field by field, in order: the header only ever appends fields, so a
newer libqhx reads these structs correctly. ctypes releases the GIL around every foreign call, so
a generation runs without holding it; the token callback takes it back for each token.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint64, c_void_p)
from pathlib import Path

API_VERSION = 5


class ModelOptions(Structure):
    _fields_ = [
        ("n_threads", c_int32),
        ("context_length", c_int64),
        ("max_sessions", c_int32),
        ("prefix_cache_bytes", c_int64),
        ("verify_sha256", c_int32),
        ("check_memory", c_int32),
        ("device", c_char_p),
        ("decode_device", c_char_p),
        ("device_check", c_char_p),
        ("draft_model", c_char_p),
        ("mtp_vocab_size", c_int64),
        ("qnn_lib", c_char_p),
        ("npu_pack", c_char_p),
        ("kv_type", c_char_p),
    ]


class ModelInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("family", c_char_p),
        ("vocab_size", c_int64),
        ("context_length", c_int64),
        ("memory_estimate", c_int64),
        ("admission_note", c_char_p),
        ("eos_ids", POINTER(c_int32)),
        ("n_eos_ids", c_size_t),
        ("has_chat_template", c_int32),
        ("n_threads", c_int32),
        ("prefill_device", c_char_p),
        ("decode_device", c_char_p),
        ("device_note", c_char_p),
        ("model_note", c_char_p),
        ("embedding_size", c_int64),
        ("pooling", c_char_p),
        ("reads_images", c_int32),
        ("vision_note", c_char_p),
    ]


class TemplateOptions(Structure):
    _fields_ = [("add_generation_prompt", c_int32), ("enable_thinking", c_int32)]


class Sampling(Structure):
    _fields_ = [
        ("greedy", c_int32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repetition_penalty", c_float),
        ("presence_penalty", c_float),
        ("frequency_penalty", c_float),
        ("seed", c_uint64),
        ("logit_bias_ids", POINTER(c_int32)),
        ("logit_bias_values", POINTER(c_float)),
        ("n_logit_bias", c_size_t),
    ]


class GenerateOptions(Structure):
    _fields_ = [
        ("max_new_tokens", c_int64),
        ("sampling", Sampling),
        ("stop_at_eos", c_int32),
        ("stop_ids", POINTER(c_int32)),
        ("n_stop_ids", c_size_t),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_size_t),
        ("speculative", c_char_p),
        ("draft_max", c_int32),
        ("response_format", c_char_p),
        ("logprobs", c_int32),
        ("top_logprobs", c_int32),
    ]


class TokenLogprobs(Structure):
    _fields_ = [
        ("token", c_int32),
        ("logprob", ctypes.c_float),
        ("n_top", c_int32),
        ("top_tokens", POINTER(c_int32)),
        ("top_logprobs", POINTER(ctypes.c_float)),
    ]


class GenerateResult(Structure):
    _fields_ = [
        ("stop_reason", c_int),
        ("n_prompt", c_int64),
        ("n_reused", c_int64),
        ("n_processed", c_int64),
        ("n_generated", c_int64),
        ("prefill_ms", c_double),
        ("ttft_ms", c_double),
        ("decode_ms", c_double),
        ("text", c_void_p),  # char*, freed with qhx_string_free
        ("device_failures", c_int64),
        ("verify_passes", c_int64),
        ("drafted", c_int64),
        ("accepted", c_int64),
        ("device_tokens", c_int64),
        ("constraint_ms", c_double),
    ]


class EmbedOptions(Structure):
    _fields_ = [
        ("pooling", c_char_p),
        ("normalize", c_int32),
        ("dimensions", c_int64),
        ("prompt", c_char_p),
        ("prompt_name", c_char_p),
    ]


class EmbedResult(Structure):
    _fields_ = [("dimensions", c_int64), ("n_tokens", c_int64), ("ms", c_double),
                ("n_truncated", c_int64)]


class SessionOptions(Structure):
    _fields_ = [("context_length", c_int64), ("prefill_chunk", c_int64),
                ("max_checkpoints", c_int32)]


TOKEN_CALLBACK = CFUNCTYPE(c_int, c_void_p, c_int32, POINTER(ctypes.c_char), c_size_t)

STATUS_NAMES = {
    1: "invalid argument", 2: "model", 3: "template", 4: "context full", 5: "out of memory",
    6: "state file", 7: "buffer too small", 8: "internal", 9: "cancelled",
}
BUFFER_TOO_SMALL = 7
STOP_REASONS = {0: "length", 1: "eos", 2: "stop_string", 3: "callback", 4: "cancelled"}


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    status = c_int
    model, session = c_void_p, c_void_p
    signatures = {
        "qhx_version": (c_char_p, []),
        "qhx_last_error": (c_char_p, []),
        "qhx_string_free": (None, [c_void_p]),
        "qhx_model_options_default": (None, [POINTER(ModelOptions)]),
        "qhx_model_open": (status, [c_char_p, POINTER(ModelOptions), POINTER(c_void_p)]),
        "qhx_model_close": (None, [model]),
        "qhx_model_get_info": (status, [model, POINTER(ModelInfo)]),
        "qhx_tokenize": (status, [model, c_char_p, c_size_t, POINTER(c_int32), c_size_t,
                                  POINTER(c_size_t)]),
        "qhx_detokenize": (status, [model, POINTER(c_int32), c_size_t, c_int32,
                                    ctypes.c_char_p, c_size_t, POINTER(c_size_t)]),
        "qhx_template_options_default": (None, [POINTER(TemplateOptions)]),
        "qhx_apply_chat_template": (status, [model, c_char_p, POINTER(TemplateOptions),
                                             POINTER(c_void_p)]),
        "qhx_generate_options_default": (status, [model, POINTER(GenerateOptions)]),
        "qhx_generate_options_check": (status, [model, POINTER(GenerateOptions)]),
        "qhx_session_options_default": (None, [POINTER(SessionOptions)]),
        "qhx_session_create": (status, [model, POINTER(SessionOptions), POINTER(c_void_p)]),
        "qhx_session_destroy": (None, [session]),
        "qhx_session_generate": (status, [session, POINTER(c_int32), c_size_t,
                                          POINTER(GenerateOptions), TOKEN_CALLBACK, c_void_p,
                                          POINTER(GenerateResult)]),
        "qhx_session_chat_tokens": (status, [session, POINTER(c_int32), c_size_t,
                                             POINTER(GenerateOptions), TOKEN_CALLBACK, c_void_p,
                                             POINTER(GenerateResult)]),
        "qhx_session_chat": (status, [session, c_char_p, POINTER(TemplateOptions),
                                      POINTER(GenerateOptions), TOKEN_CALLBACK, c_void_p,
                                      POINTER(GenerateResult)]),
        "qhx_session_cancel": (None, [session]),
        "qhx_session_token_logprobs": (status, [session, POINTER(TokenLogprobs)]),
        "qhx_token_bytes": (status, [model, c_int32, ctypes.c_char_p, c_size_t,
                                     POINTER(c_size_t)]),
        "qhx_embed_options_default": (None, [POINTER(EmbedOptions)]),
        "qhx_embed": (status, [session, POINTER(c_char_p), POINTER(c_size_t), c_size_t,
                               POINTER(EmbedOptions), POINTER(c_float), c_size_t,
                               POINTER(EmbedResult)]),
        "qhx_embed_tokens": (status, [session, POINTER(c_int32), POINTER(c_size_t), c_size_t,
                                      POINTER(EmbedOptions), POINTER(c_float), c_size_t,
                                      POINTER(EmbedResult)]),
        "qhx_session_reusable": (c_int64, [session, POINTER(c_int32), c_size_t]),
        "qhx_session_tokens": (status, [session, POINTER(POINTER(c_int32)), POINTER(c_size_t)]),
        "qhx_session_reset": (status, [session]),
        "qhx_session_save": (status, [session, c_char_p]),
        "qhx_session_load": (status, [session, c_char_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def library_path() -> Path:
    """libqhx.so: $QHX_LIBRARY, else the one installed beside this package."""
    if os.environ.get("QHX_LIBRARY"):
        return Path(os.environ["QHX_LIBRARY"])
    return Path(__file__).resolve().parent / "libqhx.so"


def load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise ImportError(f"qhx: no libqhx.so at {path} (pip install . from a qhx clone builds "
                          "it; QHX_LIBRARY names another)")
    return _declare(ctypes.CDLL(str(path)))
