"""The server fixtures: `qhx serve --port 0` on each shipped model (`server`) and on the tiny
Qwen3-Embedding fixture (`embedding_server`), their urls."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from serving import CLI, EMBEDDING_MODEL, MODELS, SERVER_MODEL


def _serve(name: str, path: Path):
    assert CLI.exists(), f"no qhx binary at {CLI} (QHX_CLI names it)"
    proc = subprocess.Popen([str(CLI), "serve", "-m", str(path), "--port", "0", "--threads", "2"],
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "qhx serve did not start"
        SERVER_MODEL[url] = name
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module", params=list(MODELS))
def server(request):
    yield from _serve(request.param, MODELS[request.param])


@pytest.fixture(scope="module")
def embedding_server():
    yield from _serve("qwen3_tiny", EMBEDDING_MODEL)
