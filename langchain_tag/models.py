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
import urllib.parse
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
)

from langchain_tag.errors import TAGError
from langchain_tag.usage import count_call

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable, RunnableConfig
    from langgraph.types import RetryPolicy

__all__ = [
    "FLEX_TIMEOUT",
    "ONE_ATTEMPT",
    "STRUCTURED_PARSE_ERRORS",
    "CallRetry",
    "ConfiguredModel",
    "ModelNotConfiguredError",
    "StructuredFallback",
    "configured_model",
    "default_chat_model",
    "is_capacity_shortage",
    "is_rate_limit",
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

SERVICE_TIER_ENV_VAR = "TAG_SERVICE_TIER"
SERVICE_TIERS = ("auto", "default", "flex", "priority")
"""OpenAI's service tiers; another value is refused before any call."""
"""Environment variable naming the default `ChatOpenAI`'s `service_tier` (`flex`)."""

FLEX_TIMEOUT = 900.0
"""Seconds a flex-tier request may take: OpenAI's advice, 15 minutes (the SDK's
default is 10)."""


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
`status_code` (rate limits and overloads of most providers' SDKs), a shortage of
capacity (`is_capacity_shortage`) and the OpenAI SDK's connection and timeout
errors."""


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


_CAPACITY_STATUS = frozenset({429, 498})
_CAPACITY_CODES = frozenset({"resource_unavailable", "capacity_exceeded"})
_CAPACITY_MESSAGE = re.compile(r"resource[\s_-]*unavailable", re.IGNORECASE)


def is_capacity_shortage(error: BaseException | None) -> bool:
    """Whether `error` is the provider short of capacity: no rate limit of ours.

    OpenAI's flex processing (`service_tier="flex"`) answers HTTP 429 "Resource
    Unavailable" when it lacks capacity (not billed), Groq's flex tier 498
    `capacity_exceeded`. Told from a rate limit by the error's code or type, as
    the SDK parsed them from the response body (the OpenAI SDK's `code`, `type`
    and `body`), else by its message, where an SDK that keeps neither says it.
    """
    if getattr(error, "status_code", None) not in _CAPACITY_STATUS:
        return False
    body, inner = _bodies(error)
    messages = [str(error), *(str(_field(h, "message")) for h in (body, inner))]
    if isinstance(body, str):
        messages.append(body)
    return bool(_labels(error) & _CAPACITY_CODES) or any(
        _CAPACITY_MESSAGE.search(message) for message in messages
    )


def _bodies(error: BaseException | None) -> tuple[object, object]:
    """The error's response body, and the body's "error" object when it has one.

    The OpenAI SDK keeps the "error" object as `body`; others the whole body.
    """
    body = getattr(error, "body", None)
    return body, body.get("error") if isinstance(body, Mapping) else None


def _labels(error: BaseException | None) -> set[str]:
    """The `code` and `type` the error or its body give, lower-case with `_`."""
    return {
        str(_field(holder, name)).lower().replace(" ", "_")
        for holder in (error, *_bodies(error))
        for name in ("code", "type")
    }


def _field(holder: object, name: str) -> object:
    if isinstance(holder, Mapping):
        return holder.get(name)
    return None if holder is None else getattr(holder, name, None)


def is_quota_exhausted(error: BaseException | None) -> bool:
    """Whether `error` is OpenAI's 429 `insufficient_quota`: out of credit.

    Retrying cannot help (only billing does), so it is not transient, though it
    comes as a 429 like a rate limit.
    """
    status = getattr(error, "status_code", None)
    return status == 429 and "insufficient_quota" in _labels(error)  # noqa: PLR2004


def is_rate_limit(error: BaseException | None) -> bool:
    """Whether `error` is the provider's rate limit (HTTP 429, not a capacity one)."""
    status = getattr(error, "status_code", None)
    return status == 429 and not is_capacity_shortage(error)  # noqa: PLR2004


@dataclass
class _Spent:
    """What one call has spent of its retry budgets (kept on its retry state)."""

    attempts: int = 0
    """Failed attempts counted against `max_attempts`."""
    since: dict[str, float] = field(default_factory=dict)
    """Per time budget: when the call first failed under it (`time.monotonic()`)."""


@dataclass(frozen=True)
class CallRetry:
    """Exponential backoff with jitter for transient model errors.

    The one retry layer for the model calls langchain-tag makes: the models it
    builds or wraps have their client's own retries (`max_retries`) turned off. A
    wait the provider asks for (`Retry-After`) replaces the computed one, up to
    `max_delay`.

    Most failures count against `max_attempts`. Two are retried by time instead,
    counted from the call's first such failure (waiting for a slot included):

    - a rate limit (HTTP 429) that comes with the provider's wait
      (`Retry-After`), for up to `rate_limit_wait` seconds: a short storm across
      a fleet delays the calls instead of failing them;
    - a shortage of capacity (`is_capacity_shortage`: the flex tier's 429
      "resource unavailable"), for up to `capacity_wait` seconds, on its own
      backoff (the computed wait, or longer if the provider asks); in a fan-out it
      pauses no other call and lowers no bound, for it is not a rate limit.

    A call stops before a wait that would end past its budget, and fails as any
    call that ran out of attempts. A wait of zero spends no time, so it counts as
    an attempt (a persistent 429 with `Retry-After: 0` ends after `max_attempts`);
    a budget of 0 turns it off (those failures count as attempts too).
    """

    max_attempts: int = 4
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = field(default=TRANSIENT_ERRORS)
    rate_limit_wait: float = 60.0
    """Seconds a call is retried through rate limits that come with the
    provider's wait, from the first; 0: they count as attempts."""
    capacity_wait: float = 600.0
    """Seconds a call is retried through shortages of capacity (flex tier), from
    the first; 0: they count as attempts."""

    def __post_init__(self) -> None:
        """Check the time budgets.

        Raises:
            ValueError: A budget is negative or not a number.
        """
        for name in ("rate_limit_wait", "capacity_wait"):
            value = getattr(self, name)
            if not value >= 0:
                msg = (
                    f"CallRetry.{name} must be a number of seconds >= 0 (0 turns "
                    f"that budget off), got {value!r}"
                )
                raise ValueError(msg)

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error` is worth retrying."""
        if isinstance(error, self.retry_on) or _is_openai_connection_error(error):
            return True
        # Our own errors (a JudgmentError) say whether their cause was transient.
        transient = getattr(error, "transient", None)
        if isinstance(transient, bool):
            return transient
        if is_quota_exhausted(error):
            return False
        status = getattr(error, "status_code", None)
        return status in _TRANSIENT_STATUS or is_capacity_shortage(error)

    def delay(self, attempt: int, error: BaseException | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        Args:
            attempt: The attempt that failed.
            error: Its error; a `Retry-After` it carries sets the wait (for a
                shortage of capacity, the least wait).
        """
        asked = retry_after(error)
        asked = None if asked is None else min(self.max_delay, asked)
        jitter = self.jitter * random.random()  # noqa: S311 - not crypto
        backoff = self._backoff(attempt) * (1 + jitter)
        if is_capacity_shortage(error):
            return max(backoff, asked or 0.0)
        return backoff if asked is None else asked

    def _backoff(self, attempt: int) -> float:
        """The computed wait after failed attempt `attempt`, without jitter."""
        return min(self.max_delay, self.initial_delay * self.backoff ** (attempt - 1))

    def retrying(
        self,
        kind: type[_RetryingT],
        *,
        wait: Callable[[RetryCallState], float] | None = None,
        before: Callable[[RetryCallState], Any] | None = None,
        before_sleep: Callable[[RetryCallState], Any] | None = None,
    ) -> _RetryingT:
        """A tenacity `Retrying` / `AsyncRetrying` running this policy.

        Args:
            kind: `Retrying` or `AsyncRetrying`.
            wait: The wait after a failed attempt; default `delay` (which honours
                `Retry-After`). Its result is the wait the budgets count.
            before: Called before each attempt (e.g. to wait for a shared pause).
            before_sleep: Called before each wait (after `wait`, once it is sure
                the call is tried again).
        """
        hooks = {"before": before, "before_sleep": before_sleep}
        options: dict[str, Any] = {k: v for k, v in hooks.items() if v is not None}
        return kind(
            stop=self._stop,
            wait=wait or self._wait,
            retry=retry_if_exception(self.is_transient),
            reraise=True,
            **options,
        )

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return self.delay(state.attempt_number, error)

    def _stop(self, state: RetryCallState) -> bool:
        """Whether a call that just failed is given up (its wait is computed)."""
        error = state.outcome.exception() if state.outcome is not None else None
        spent: _Spent = vars(state).setdefault("tag_spent", _Spent())
        budget = self._time_budget(error, state.upcoming_sleep)
        if budget is None:
            spent.attempts += 1
            return spent.attempts >= self.max_attempts
        name, seconds = budget
        now = time.monotonic()
        since = spent.since.setdefault(name, now)
        return now - since + state.upcoming_sleep > seconds

    def _time_budget(
        self, error: BaseException | None, wait: float
    ) -> tuple[str, float] | None:
        """The time budget `error` is retried under (name, seconds), if any."""
        if wait <= 0:
            return None
        if is_capacity_shortage(error) and self.capacity_wait > 0:
            return "capacity", self.capacity_wait
        if self._paced_rate_limit(error) and self.rate_limit_wait > 0:
            return "rate_limit", self.rate_limit_wait
        return None

    @staticmethod
    def _paced_rate_limit(error: BaseException | None) -> bool:
        """A rate limit that comes with the provider's wait (a positive one)."""
        return is_rate_limit(error) and (retry_after(error) or 0.0) > 0

    def as_node_policy(self) -> list[RetryPolicy]:
        """The same policy as LangGraph node retry policies, as near as they go.

        LangGraph's `RetryPolicy` waits by its own exponential schedule (it cannot
        read `Retry-After`) and counts attempts, not time, one count for all the
        policies of a node. So the time budgets become attempts: a shortage of
        capacity, and a rate limit that comes with the provider's wait, are tried
        as often as the backoff waits that fit in `capacity_wait` and
        `rate_limit_wait` allow (never fewer than `max_attempts`); any other
        transient error `max_attempts` times.
        """
        from langgraph.types import RetryPolicy  # noqa: PLC0415 - only for graphs

        def policy(attempts: int, retry_on: Callable[[Exception], bool]) -> RetryPolicy:
            return RetryPolicy(
                initial_interval=self.initial_delay,
                backoff_factor=self.backoff,
                max_interval=self.max_delay,
                max_attempts=attempts,
                # LangGraph's jitter adds up to a second to every wait, whatever
                # the policy.
                jitter=False,
                retry_on=retry_on,
            )

        return [
            policy(self._attempts_within(self.capacity_wait), is_capacity_shortage),
            policy(self._attempts_within(self.rate_limit_wait), self._paced_rate_limit),
            policy(self.max_attempts, self.is_transient),
        ]

    def _attempts_within(self, budget: float) -> int:
        """Attempts whose backoff waits (without jitter) fit in `budget` seconds."""
        attempts, waited = 1, 0.0
        while budget > 0 and attempts < _MOST_NODE_ATTEMPTS:
            wait = self._backoff(attempts)
            if wait <= 0 or waited + wait > budget:
                break
            waited += wait
            attempts += 1
        return max(self.max_attempts, attempts)


_MOST_NODE_ATTEMPTS = 1000
"""A bound for `_attempts_within` on a schedule whose waits shrink."""


_ENDPOINT_FIELDS = ("openai_api_base", "base_url", "api_base", "endpoint_url", "host")
_ENDPOINT = "endpoint:"
"""How `model_identity` marks the endpoint fields among a model's settings."""
_NOT_IDENTITY = ("service_tier",)
"""Settings that change what a call costs and how long it takes, not its answer."""
_NAME_FIELDS = ("model", "model_name", "model_id", "deployment_name", "repo_id")
"""Settings that name the model, in the order `model_label` looks for one."""
_URL_PASSWORD = re.compile(r"://([^:/@]*):.*@")
"""Up to the last "@": a password may hold one unencoded (`tag:s3cr@t@db`)."""
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)\S+")


ONE_ATTEMPT = CallRetry(max_attempts=1, rate_limit_wait=0.0, capacity_wait=0.0)
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
    under one name, and `_identifying_params` leaves the address out. The service
    tier does not (`flex` or not, the same model answers): a verdict judged on one
    tier is found on the others.
    """
    params = dict(llm._identifying_params)  # noqa: SLF001 - the public-facing identity
    for name in _NOT_IDENTITY:
        params.pop(name, None)
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
            count_call()  # asked again, as text
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
            count_call()  # asked again, as text
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
