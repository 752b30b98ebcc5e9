"""The server fixtures: `qhx serve --port 0` on each shipped model (`server`) and on the tiny
Qwen3-Embedding fixture (`embedding_server`), their urls."""

from __future__ import annotations

import pytest

from serving import EMBEDDING_MODEL, MODELS, SERVER_MODEL, serve


@pytest.fixture(scope="module", params=list(MODELS))
def server(request):
    with serve(MODELS[request.param]) as url:
        SERVER_MODEL[url] = request.param
        yield url


@pytest.fixture(scope="module")
def embedding_server():
    with serve(EMBEDDING_MODEL) as url:
        SERVER_MODEL[url] = "qwen3_tiny"
        yield url
