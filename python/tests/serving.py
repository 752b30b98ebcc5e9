"""`qhx serve` for the tests: the models it is started on, and requests to it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = {"qwen3.5-kjv": REPO / "models" / "qwen3.5-kjv", "qwen3-kjv": REPO / "models" / "qwen3-kjv"}
# A tiny Qwen3-Embedding checkpoint with transformers' vectors (tools/oracle).
EMBEDDING_MODEL = REPO / "tests" / "fixtures" / "embedding" / "qwen3_tiny"
CLI = Path(os.environ.get("QHX_CLI", REPO / "build" / "qhx"))
SERVER_MODEL: dict[str, str] = {}  # url -> the model it serves


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def events(data: bytes) -> list[dict]:
    """A stream's chunks, [DONE] left out."""
    return [json.loads(line[6:]) for line in data.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@contextlib.contextmanager
def serve(path: Path, *options: str):
    """`qhx serve --port 0` on the model at `path` (with more `options`): its url."""
    assert CLI.exists(), f"no qhx binary at {CLI} (QHX_CLI names it)"
    proc = subprocess.Popen([str(CLI), "serve", "-m", str(path), "--port", "0", "--threads", "2",
                             *options], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "qhx serve did not start"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
