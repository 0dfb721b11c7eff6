"""Chat models: the default one from the environment, settings, identity, retries.

Any LangChain `BaseChatModel` works everywhere in langchain-tag; `default_chat_model`
is only what is used when none is passed.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import httpx
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

from langchain_tag.errors import TAGError

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable, RunnableConfig
    from langgraph.types import RetryPolicy

__all__ = [
    "ONE_ATTEMPT",
    "STRUCTURED_PARSE_ERRORS",
    "CallRetry",
    "ConfiguredModel",
    "ModelNotConfiguredError",
    "StructuredFallback",
    "configured_model",
    "default_chat_model",
    "model_identity",
    "model_label",
    "structured_model",
    "with_settings",
    "without_password",
]

_RetryingT = TypeVar("_RetryingT", Retrying, AsyncRetrying)

MODEL_ENV_VAR = "TAG_MODEL"
"""Environment variable naming the model to use with the default `ChatOpenAI`."""

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


logger = logging.getLogger(__name__)


class ModelNotConfiguredError(TAGError, RuntimeError):
    """No chat model was passed and the environment configures none."""


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


# --- Calling models ------------------------------------------------------------


_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    asyncio.TimeoutError,
    ConnectionError,
    httpx.TimeoutException,
    httpx.NetworkError,
)
"""Errors retried by default. Also retried: any error carrying a 408/429/5xx
`status_code` (rate limits and overloads of most providers' SDKs) and the OpenAI SDK's
connection and timeout errors."""


def _is_openai_connection_error(error: BaseException) -> bool:
    # Looked up only if the SDK is loaded: importing it costs ~0.8 s, and an error
    # from it implies it is.
    openai = sys.modules.get("openai")
    return openai is not None and isinstance(error, openai.APIConnectionError)


def retry_after(error: BaseException | None) -> float | None:
    """Seconds the provider asked to wait (`retry-after-ms` or `retry-after`), if any.

    Read from the HTTP response the error carries (the OpenAI and Anthropic SDKs'
    errors and httpx's carry one); an HTTP date counts from now.
    """
    headers = getattr(getattr(error, "response", None), "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        return max(0.0, when.timestamp() - time.time())
    return None


def is_rate_limit(error: BaseException | None) -> bool:
    """Whether `error` is the provider's rate limit (HTTP 429)."""
    return getattr(error, "status_code", None) == 429  # noqa: PLR2004


@dataclass(frozen=True)
class CallRetry:
    """Exponential backoff with jitter for transient model errors.

    The one retry layer for the model calls langchain-tag makes: the models it
    builds or wraps have their client's own retries (`max_retries`) turned off, so
    a judgment makes at most `max_attempts` requests. A wait the provider asks for
    (`Retry-After`) replaces the computed one, up to `max_delay`.
    """

    max_attempts: int = 4
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = field(default=TRANSIENT_ERRORS)

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error` is worth retrying."""
        if isinstance(error, self.retry_on) or _is_openai_connection_error(error):
            return True
        # Our own errors (a JudgmentError) say whether their cause was transient.
        transient = getattr(error, "transient", None)
        if isinstance(transient, bool):
            return transient
        return getattr(error, "status_code", None) in _TRANSIENT_STATUS

    def delay(self, attempt: int, error: BaseException | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        Args:
            attempt: The attempt that failed.
            error: Its error; a `Retry-After` it carries sets the wait.
        """
        asked = retry_after(error)
        if asked is not None:
            return min(self.max_delay, asked)
        base = min(self.max_delay, self.initial_delay * self.backoff ** (attempt - 1))
        return base * (1 + self.jitter * random.random())  # noqa: S311 - not crypto

    def retrying(
        self,
        kind: type[_RetryingT],
        *,
        wait: Callable[[RetryCallState], float] | None = None,
        before: Callable[[RetryCallState], Any] | None = None,
    ) -> _RetryingT:
        """A tenacity `Retrying` / `AsyncRetrying` running this policy.

        Args:
            kind: `Retrying` or `AsyncRetrying`.
            wait: The wait after a failed attempt; default `delay` (which honours
                `Retry-After`).
            before: Called before each attempt (e.g. to wait for a shared pause).
        """
        options: dict[str, Any] = {"before": before} if before is not None else {}
        return kind(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait or self._wait,
            retry=retry_if_exception(self.is_transient),
            reraise=True,
            **options,
        )

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return self.delay(state.attempt_number, error)

    def as_node_policy(self) -> RetryPolicy:
        """The same policy as a LangGraph node `RetryPolicy`."""
        from langgraph.types import RetryPolicy  # noqa: PLC0415 - only for graphs

        return RetryPolicy(
            initial_interval=self.initial_delay,
            backoff_factor=self.backoff,
            max_interval=self.max_delay,
            max_attempts=self.max_attempts,
            # LangGraph's jitter adds up to a second to every wait, whatever the policy.
            jitter=False,
            retry_on=self.is_transient,
        )


_ENDPOINT_FIELDS = ("openai_api_base", "base_url", "api_base", "endpoint_url", "host")
_ENDPOINT = "endpoint:"
"""How `model_identity` marks the endpoint fields among a model's settings."""
_NAME_FIELDS = ("model", "model_name", "model_id", "deployment_name", "repo_id")
"""Settings that name the model, in the order `model_label` looks for one."""
_URL_PASSWORD = re.compile(r"://([^:/@]*):.*@")
"""Up to the last "@": a password may hold one unencoded (`tag:s3cr@t@db`)."""
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)\S+")


ONE_ATTEMPT = CallRetry(max_attempts=1)
"""No retry: what a `retry=None` setting runs."""

STRUCTURED_PARSE_ERRORS = (ValidationError, json.JSONDecodeError, OutputParserException)
"""What a structured-output call raises when the model answered in plain text."""


def _supports_structured_output(llm: BaseChatModel) -> bool:
    """Whether `llm`'s class implements structured output (or tool binding)."""
    cls = type(llm)
    return (
        cls.with_structured_output is not BaseChatModel.with_structured_output
        or cls.bind_tools is not BaseChatModel.bind_tools
    )


def structured_model(
    llm: BaseChatModel,
    schema: type[BaseModel],
    mode: Literal["auto", "always", "never"],
) -> Runnable[Any, Any] | None:
    """`llm` answering `schema` with the raw message (`include_raw`), or None.

    Args:
        llm: The model.
        schema: The answer's pydantic model.
        mode: `auto`: when the model's class implements structured output;
            `always`: required; `never`: None (the caller parses text).

    Raises:
        ValueError: `always`, and the model does not support structured output.
    """
    wanted = mode == "always" or (mode == "auto" and _supports_structured_output(llm))
    if not wanted:
        return None
    try:
        return llm.with_structured_output(schema, include_raw=True)
    except NotImplementedError:
        if mode == "always":
            msg = (
                f"{type(llm).__name__} does not support structured output; use "
                "structured_output='auto' or 'never'."
            )
            raise ValueError(msg) from None
    return None


def model_identity(llm: BaseChatModel) -> str:
    """A string naming the model, its settings and its endpoint, for cache keys.

    `module.Class:{settings as JSON}`; `model_label` shortens it for display. The
    endpoint matters: two OpenAI-compatible servers may serve different models
    under one name, and `_identifying_params` leaves the address out.
    """
    params = dict(llm._identifying_params)  # noqa: SLF001 - the public-facing identity
    for name in _ENDPOINT_FIELDS:
        value = getattr(llm, name, None)
        if isinstance(value, str) and value:
            params[f"{_ENDPOINT}{name}"] = value
    return f"{type(llm).__module__}.{type(llm).__qualname__}:" + json.dumps(
        params, sort_keys=True, default=str
    )


def model_label(identity: str) -> str:
    """A model's identity (`model_identity`) as a short label: `name @ endpoint`.

    The identity is the model's class and every setting, as JSON: too long for a
    line. The name is the model's setting that names it, else its class; the
    endpoint is shown without the password its URL may carry. Anything else (a
    name a caller logged) is returned as it is.
    """
    kind, _, settings = identity.partition(":")
    try:
        params = json.loads(settings)
    except ValueError:
        return identity
    if not isinstance(params, dict):
        return identity
    name = next(
        (str(params[key]) for key in _NAME_FIELDS if params.get(key)),
        kind.rsplit(".", 1)[-1],
    )
    endpoint = next(
        (str(v) for k, v in sorted(params.items()) if k.startswith(_ENDPOINT) and v),
        None,
    )
    return name if endpoint is None else f"{name} @ {without_password(endpoint)}"


def without_password(url: str) -> str:
    """`url` with the password it may carry as ***, for messages.

    Both forms: a URL's (`scheme://user:password@host`) and a libpq connection
    string's (`host=db password=secret`).
    """
    return _KEYWORD_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"://\1:***@", url))


_JSON_START = re.compile(r"\A\s*(?:```(?:json)?\s*)?[\[{]")


def _answer_in(error: BaseException) -> str | None:
    """The answer text a structured-output parse error carries, if it does."""
    if isinstance(error, json.JSONDecodeError):
        return error.doc
    if isinstance(error, OutputParserException):
        return error.llm_output
    if isinstance(error, ValidationError):
        # The OpenAI SDK parses the answer with pydantic: JSON that is not valid
        # comes back whole as the input of a `json_invalid` error.
        for detail in error.errors():
            if detail["type"] == "json_invalid" and isinstance(detail["input"], str):
                return detail["input"]
    return None


class StructuredFallback:
    """A model asked for structured answers, read from its text when it ignores that.

    The one structured-then-text path of the package's judges (the applicability
    judge, the NPOV grader). Under `auto`, a structured call is made when the
    model's class implements structured output. Some OpenAI-compatible servers
    ignore `response_format` and answer in prose, which the SDK's schema parsing
    refuses before the caller's lenient parser could read it: an answer that is
    not JSON at all switches this instance (and only it) to text calls, and that
    call is made again as a text call. An answer that is JSON but off the schema
    (a value not allowed, a truncated object) leaves structured output on: that one
    answer is handed back as text for the caller's lenient parser (or, when the
    SDK kept no text of it, asked again as text, once).

    Outputs are what the calls return: `{"raw", "parsed", "parsing_error"}` from a
    structured call (`include_raw`), the message from a text call.

    Args:
        llm: The model (the caller's configured copy).
        mode: `auto`, `always` (structured, never a fallback) or `never` (text).
        schemas: The answer schemas the caller asks for.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        mode: Literal["auto", "always", "never"],
        schemas: Sequence[type[BaseModel]],
    ) -> None:
        """Build the structured runnables of `llm` for `schemas` (see `mode`)."""
        self.llm = llm
        self.mode = mode
        self._structured = {
            schema: structured_model(llm, schema, mode) for schema in schemas
        }
        self._ignored = False
        self._lock = threading.Lock()

    @property
    def ignores_structured_output(self) -> bool:
        """Whether the model was seen answering a structured request in prose."""
        return self._ignored

    def remember(self, other: StructuredFallback) -> None:
        """Take over what `other` (on the same model) learnt about the server."""
        if other.ignores_structured_output and self.mode == "auto":
            self._ignored = True

    def structured(self, schema: type[BaseModel]) -> Runnable[Any, Any] | None:
        """The structured runnable asked for `schema`, or None (text calls)."""
        return None if self._ignored else self._structured.get(schema)

    def invoke(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig,
        schema: type[BaseModel],
    ) -> Any:
        """One call for an answer in `schema` (structured, or the text)."""
        runnable = self.structured(schema)
        if runnable is not None:
            try:
                return self._checked(runnable.invoke(messages, config))
            except STRUCTURED_PARSE_ERRORS as error:
                if (recovered := self._refused(error)) is not None:
                    return recovered
        return self.llm.invoke(messages, config)

    async def ainvoke(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig,
        schema: type[BaseModel],
    ) -> Any:
        """Async `invoke`."""
        runnable = self.structured(schema)
        if runnable is not None:
            try:
                return self._checked(await runnable.ainvoke(messages, config))
            except STRUCTURED_PARSE_ERRORS as error:
                if (recovered := self._refused(error)) is not None:
                    return recovered
        return await self.llm.ainvoke(messages, config)

    def _checked(self, output: Any) -> Any:
        # A structured output whose answer could not be parsed: prose means the
        # server ignored the request (remembered); the caller reads the raw text.
        if isinstance(output, Mapping) and output.get("parsed") is None:
            raw = output.get("raw")
            if isinstance(raw, BaseMessage) and not _JSON_START.match(raw.text):
                self._ignores(raw.text)
        return output

    def _refused(self, error: Exception) -> AIMessage | None:
        """After the SDK refused an answer: the answer to read, or None (ask text).

        Raises:
            Exception: `error` again, unless `mode` is `auto`.
        """
        if self.mode != "auto":
            raise error
        text = _answer_in(error)
        if text is None:
            return None
        if _JSON_START.match(text):
            return AIMessage(text)
        self._ignores(text)
        return None

    def _ignores(self, answer: str) -> None:
        if self.mode != "auto":
            return
        with self._lock:
            first, self._ignored = not self._ignored, True
        if first:
            logger.warning(
                "%s answered a structured-output request in prose (%r); reading "
                "its answers with the text parser from now on.",
                type(self.llm).__name__,
                answer[:200],
            )
