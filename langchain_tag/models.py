"""The default chat model, configured from the environment.

Any LangChain `BaseChatModel` works everywhere in langchain-tag; this is only what is
used when none is passed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel

MODEL_ENV_VAR = "TAG_MODEL"
"""Environment variable naming the model to use with the default `ChatOpenAI`."""

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class ModelNotConfiguredError(RuntimeError):
    """No chat model was passed and the environment configures none."""


ContextT = TypeVar("ContextT")


def as_documents(items: Iterable[Document | Mapping[str, Any]]) -> list[Document]:
    """Documents as given in Python, or as the JSON a LangGraph server passes on."""
    return [
        item if isinstance(item, Document) else Document.model_validate(item)
        for item in items
    ]


def coerce_context(context: object, schema: type[ContextT]) -> ContextT:
    """A graph's run context as its dataclass.

    Python callers pass the dataclass; a LangGraph server passes the JSON a client
    sent (a dict, possibly with fields this version does not know, which are
    ignored); no context means the defaults.
    """
    if isinstance(context, schema):
        return context
    if isinstance(context, Mapping):
        known = {f.name for f in fields(schema)}  # type: ignore[arg-type]
        return schema(**{k: v for k, v in context.items() if k in known})
    return schema()


def with_settings(
    llm: BaseChatModel, **settings: Any
) -> tuple[BaseChatModel, set[str]]:
    """A copy of `llm` with those generation settings it has fields for.

    Chat model classes name their options as pydantic fields (`temperature`,
    `top_p`, `max_tokens`, `logprobs`, ...); setting them on a copy leaves the
    caller's model untouched. Settings whose value is None are left alone.

    Returns:
        The configured copy (or `llm` itself when nothing applies) and the names of
        the settings the model has no field for.
    """
    fields = type(llm).model_fields
    wanted = {name: value for name, value in settings.items() if value is not None}
    updates = {name: value for name, value in wanted.items() if name in fields}
    copy = llm.model_copy(update=updates) if updates else llm
    return copy, set(wanted) - set(updates)


def environment_configures_model() -> bool:
    """Whether `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set (and not empty)."""
    return bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"))


def default_chat_model(**kwargs: Any) -> BaseChatModel:
    """`ChatOpenAI` at temperature 0, configured from the environment.

    Reads `OPENAI_API_KEY`, `OPENAI_BASE_URL` (any OpenAI-compatible server, such as
    vLLM, llama.cpp or Ollama) and `TAG_MODEL` (default `gpt-4o-mini`).

    Args:
        **kwargs: Extra `ChatOpenAI` arguments; they override the environment.

    Raises:
        ModelNotConfiguredError: Neither `OPENAI_API_KEY` nor `OPENAI_BASE_URL` is set.
    """
    api_key = os.environ.get("OPENAI_API_KEY") or None
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    if not environment_configures_model() and "api_key" not in kwargs:
        msg = (
            "No chat model is configured for langchain-tag. Do one of these:\n"
            "  1. pass any LangChain chat model, e.g. "
            "TAGRetriever.from_rulebook(path, llm=ChatAnthropic(...));\n"
            "  2. set OPENAI_API_KEY to use OpenAI (and optionally "
            f"{MODEL_ENV_VAR}, default {DEFAULT_OPENAI_MODEL});\n"
            "  3. set OPENAI_BASE_URL to an OpenAI-compatible server (vLLM, llama.cpp, "
            f"Ollama, ...) and {MODEL_ENV_VAR} to its model name; OPENAI_API_KEY is "
            "then optional."
        )
        raise ModelNotConfiguredError(msg)
    from langchain_openai import ChatOpenAI  # noqa: PLC0415 - only when it is the default

    settings: dict[str, Any] = {
        "model": os.environ.get(MODEL_ENV_VAR) or DEFAULT_OPENAI_MODEL,
        "temperature": 0,
        # Local OpenAI-compatible servers ignore the key, but the client requires one.
        "api_key": api_key or "not-needed",
        "base_url": base_url,
    }
    return ChatOpenAI(**{**settings, **kwargs})
