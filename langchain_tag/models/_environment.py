"""The chat model used when none is passed: from the environment, with settings."""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any, NamedTuple

from langchain_core.language_models import BaseChatModel

from langchain_tag.errors import ModelNotConfiguredError

if TYPE_CHECKING:
    pass

MODEL_ENV_VAR = "TAG_MODEL"
"""Environment variable naming the model to use with the default `ChatOpenAI`."""

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

SERVICE_TIER_ENV_VAR = "TAG_SERVICE_TIER"
SERVICE_TIERS = ("auto", "default", "flex", "priority")
"""OpenAI's service tiers; another value is refused before any call."""
"""Environment variable naming the default `ChatOpenAI`'s `service_tier` (`flex`)."""

FLEX_TIMEOUT = 900.0
"""Seconds a flex-tier request may take: OpenAI's advice, 15 minutes (the SDK's
default is 10)."""


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
    if "max_retries" in updates and fields.keys() >= _SDK_CLIENTS:
        # ChatOpenAI builds its SDK client, retries included, when it is made: a
        # copy must be made anew (with everything else, a custom http_client too).
        kept = {name: getattr(llm, name) for name in fields if name not in _SDK_CLIENTS}
        return type(llm).model_validate({**kept, **updates}), set(wanted) - set(updates)
    copy = llm.model_copy(update=updates) if updates else llm
    return copy, set(wanted) - set(updates)


_SDK_CLIENTS = frozenset({"client", "async_client", "root_client", "root_async_client"})


def environment_configures_model() -> bool:
    """Whether `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set (and not empty)."""
    return bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"))


class ConfiguredModel(NamedTuple):
    """The environment's chat model, its name, and where it runs."""

    llm: BaseChatModel
    name: str
    where: str


def configured_model(model: str | None = None) -> ConfiguredModel | None:
    """The environment's model, named, if the environment configures one.

    The one selector of the demo and the notebooks: with `OPENAI_API_KEY` or
    `OPENAI_BASE_URL` set, `default_chat_model()` (`model` overriding `TAG_MODEL`);
    otherwise None, and the caller uses its offline stand-in.
    """
    if not environment_configures_model():
        return None
    llm = default_chat_model(**({"model": model} if model else {}))
    name = getattr(llm, "model_name", None) or type(llm).__name__
    where = getattr(llm, "openai_api_base", None) or "the OpenAI API"
    return ConfiguredModel(llm, name, where)


def default_chat_model(
    *, service_tier: str | None = None, **kwargs: Any
) -> BaseChatModel:
    """`ChatOpenAI` at temperature 0, configured from the environment.

    Reads `OPENAI_API_KEY`, `OPENAI_BASE_URL` (any OpenAI-compatible server, such as
    vLLM, llama.cpp or Ollama), `TAG_MODEL` (default `gpt-4o-mini`) and
    `TAG_SERVICE_TIER`.

    Flex tier:
        `service_tier="flex"` (or `TAG_SERVICE_TIER=flex`) sends every call through
        OpenAI's flex processing: Batch API prices for synchronous calls that are
        slower, and refused with a 429 "resource unavailable" (not billed) when
        flex capacity is short. The model then gets a request timeout of
        `FLEX_TIMEOUT` (15 minutes, unless `timeout` is given), and the judges'
        retries (`CallRetry`) tell that 429 from a rate limit: it lowers no
        concurrency and pauses no other call; the refused call backs off on its
        own and is tried again for up to `CallRetry.capacity_wait` seconds. Flex
        suits evaluations and offline runs, not interactive retrieval; a verdict
        is cached under the same key on every tier.

    Args:
        service_tier: The OpenAI `service_tier` (`flex`, `auto`, `default`, ...);
            None reads `TAG_SERVICE_TIER`, and if that is unset sends none.
        **kwargs: Extra `ChatOpenAI` arguments; they override the environment.

    Raises:
        ModelNotConfiguredError: Neither `OPENAI_API_KEY` nor `OPENAI_BASE_URL` is set.
        ValueError: The service tier, or a `model` given as "", is not one to send.
    """
    if "model" in kwargs and not str(kwargs["model"] or "").strip():
        msg = (
            f"the model name is empty; give one, or leave it out for ${MODEL_ENV_VAR}."
        )
        raise ValueError(msg)
    api_key = os.environ.get("OPENAI_API_KEY") or None
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    if base_url is not None:
        _check_base_url(base_url)
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
    tier = service_tier or os.environ.get(SERVICE_TIER_ENV_VAR) or None
    if tier is not None and tier not in SERVICE_TIERS:
        source = "service_tier" if service_tier else f"${SERVICE_TIER_ENV_VAR}"
        msg = (
            f"{source}={tier!r} is not an OpenAI service tier; use one of "
            f"{', '.join(SERVICE_TIERS)} (or unset it)."
        )
        raise ValueError(msg)
    if tier is not None:
        settings["service_tier"] = tier
    if tier == "flex" and not {"timeout", "request_timeout"} & kwargs.keys():
        settings["timeout"] = FLEX_TIMEOUT
    return ChatOpenAI(**{**settings, **kwargs})


def _check_base_url(url: str) -> None:
    """Refuse an `OPENAI_BASE_URL` that is no http(s) URL, before any call.

    Else every call fails to connect and is retried as if the server were down.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        msg = (
            f"OPENAI_BASE_URL={url!r} is not an http(s) URL; set it to the server's "
            "address, such as http://localhost:8000/v1 (or unset it for OpenAI)."
        )
        raise ValueError(msg)
