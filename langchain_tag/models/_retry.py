"""Retrying model calls: transient errors, rate limits, capacity, `CallRetry`."""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
)

if TYPE_CHECKING:
    from langgraph.types import RetryPolicy

_RetryingT = TypeVar("_RetryingT", Retrying, AsyncRetrying)

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


def _is_sdk_connection_error(error: BaseException) -> bool:
    # Looked up only if an SDK is loaded: importing one costs ~0.8 s, and an error
    # from it implies it is. OpenAI's and Anthropic's (the batch lanes' clients).
    return any(
        sdk is not None and isinstance(error, sdk.APIConnectionError)
        for sdk in (sys.modules.get("openai"), sys.modules.get("anthropic"))
    )


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
        if isinstance(error, self.retry_on) or _is_sdk_connection_error(error):
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

ONE_ATTEMPT = CallRetry(max_attempts=1, rate_limit_wait=0.0, capacity_wait=0.0)
"""No retry: what a `retry=None` setting runs."""
