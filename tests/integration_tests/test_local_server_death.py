"""A local model server that dies mid-run is reported, not a connection error.

The server here is a stand-in for llama.cpp's (no compiler needed): a real process
on loopback that answers `/v1/models`, then kills itself with SIGILL at its first
generation, as a llama.cpp build for another CPU does.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from langchain_tag import Rulebook, demo
from langchain_tag.errors import LocalServerError, UnreliableMatchWarning
from langchain_tag.local_model import LocalOpenAIServer, _server
from langchain_tag.local_model._smollm2 import SERVER_INSTALL_HINT
from langchain_tag.models import CallRetry
from langchain_tag.testing import HashingFakeEmbeddings

pytestmark = pytest.mark.server

DIES_AT_FIRST_GENERATION = r"""
import http.server, json, os, signal, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        print("ggml_compute_forward: first generation", flush=True)
        os.kill(os.getpid(), signal.SIGILL)

    def log_message(self, *args):
        pass

print("llama_model_load: model loaded", flush=True)
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
"""


class DyingServer(LocalOpenAIServer):
    """`LocalOpenAIServer` running the stand-in instead of llama.cpp."""

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-c",
            DIES_AT_FIRST_GENERATION,
            self.host,
            str(self.port),
        ]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DyingServer]:
    monkeypatch.setattr(_server, "_SERVER_MODULES", ())  # llama.cpp is not needed
    with DyingServer(tmp_path / "model.gguf", startup_timeout=30) as running:
        yield running


def test_the_check_names_the_signal_the_log_and_the_fix(server: DyingServer) -> None:
    server.check()  # alive
    judge = server.judge(
        on_error="not_applicable", cache=None, retry=CallRetry(max_attempts=1)
    )
    rule = Rulebook.load(
        Path(__file__).parents[1] / "fixtures" / "pep8_rulebook.json"
    ).rules[0]
    with pytest.warns(UnreliableMatchWarning):
        verdict = judge.invoke(("x == None", rule))
    assert verdict.failed  # a connection error, flagged: never a silent NO
    with pytest.raises(LocalServerError) as error:
        server.check()
    message = str(error.value)
    assert "was killed by signal 4 (SIGILL: an instruction this CPU does not run)" in (
        message
    )
    assert "ggml_compute_forward: first generation" in message
    assert SERVER_INSTALL_HINT in message
    assert error.value.returncode == -4


def test_the_demo_stops_with_the_servers_death_and_what_is_not_done(
    server: DyingServer, pep8_rulebook: Rulebook, tmp_path: Path
) -> None:
    models = demo._local_models(
        server, "stand-in server", stop=server.stop, check=server.check
    )
    fast = models.judge.remade(retry=CallRetry(max_attempts=1))
    out = io.StringIO()
    with pytest.raises(LocalServerError) as error:
        demo.run_demo(
            dataclasses.replace(models, judge=fast),
            workdir=tmp_path,
            rulebook=pep8_rulebook,
            embedding=HashingFakeEmbeddings(),
            out=out,
        )
    message = str(error.value)
    assert "signal 4 (SIGILL" in message
    assert message.endswith(
        "The demo stopped while matching snippet 1; not done: matching and "
        f"executing snippets 1-{len(demo.DEMO_SNIPPETS)}."
    )
    assert "Connection refused" not in message
