"""The `server` fixture: `qhx serve --port 0` on each shipped model, its url."""

from __future__ import annotations

import re
import subprocess

import pytest

from serving import CLI, MODELS, SERVER_MODEL


@pytest.fixture(scope="module", params=list(MODELS))
def server(request):
    assert CLI.exists(), f"no qhx binary at {CLI} (QHX_CLI names it)"
    proc = subprocess.Popen([str(CLI), "serve", "-m", str(MODELS[request.param]), "--port", "0",
                             "--threads", "2"], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "qhx serve did not start"
        SERVER_MODEL[url] = request.param
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
