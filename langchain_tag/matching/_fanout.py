"""The fan-out of one input's judgments: worker threads or tasks, and their retries.

What the judgments of one fan-out share travels in a context variable (`_FAN_OUT`,
set in each judgment's own context copy): the concurrency limiter whose pauses they
wait out, the judgment's slot of it (given back while it waits out a rate limit),
the event that stops them once one failed for good (sync fan-outs), and the
exploration rates of the rules drawn for shadow judging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ContextThreadPoolExecutor
from tenacity import AsyncRetrying, RetryCallState, Retrying

from langchain_tag.errors import Abandoned, GaveUp
from langchain_tag.models import ONE_ATTEMPT, CallRetry, is_rate_limit
from langchain_tag.usage import active_counter

if TYPE_CHECKING:
    from langchain_tag.matching.limiter import ConcurrencyLimiter, Slot
    from langchain_tag.matching.verdicts import Verdict
    from langchain_tag.rules import Rule

MAX_THREADS = 64

RetryingT = TypeVar("RetryingT", Retrying, AsyncRetrying)
Unit = Sequence["Rule"]


@dataclass(frozen=True)
class _FanOut:
    """What the judgments of one fan-out share, seen from inside a judgment."""

    limiter: ConcurrencyLimiter
    slot: Slot
    """The judgment's slot of `limiter`: given back while it waits out a rate limit."""
    failed: threading.Event | None = None
    """Sync fan-outs: set once a judgment failed for good (stop the others)."""
    explored: Mapping[str, float] = field(default_factory=dict)
    """Rule id -> the exploration rate at which it was drawn for shadow judging."""
    recalled: bool = False
    """The fan-out read the cache for all its rules at once before it started, so
    a judgment does not look its rules up again."""


_FAN_OUT: contextvars.ContextVar[_FanOut | None] = contextvars.ContextVar(
    "tag_fan_out", default=None
)


def _give_up_if_abandoned() -> None:
    fan_out = _FAN_OUT.get()
    if fan_out is not None and fan_out.failed is not None and fan_out.failed.is_set():
        raise Abandoned


def recalled() -> bool:
    """Whether the fan-out already read the cache for the judgment's rules."""
    fan_out = _FAN_OUT.get()
    return fan_out is not None and fan_out.recalled


def explore_rate(rule_id: str) -> float | None:
    """The rate at which the fan-out drew `rule_id` for shadow judging, if it did."""
    fan_out = _FAN_OUT.get()
    return None if fan_out is None else fan_out.explored.get(rule_id)


# Retry hooks. `tag_waited_until` on the retry state: the end of the pause this
# judgment has just slept through, so it waits only for a later one. After the
# pause, a judgment whose slot is beyond the bound as lowered meanwhile gives it
# back and queues again: only the calls the bound now allows go out.
def _before_attempt(state: RetryCallState) -> None:
    _give_up_if_abandoned()
    fan_out = _FAN_OUT.get()
    if fan_out is None:
        return
    while True:
        if not fan_out.slot.held:
            fan_out.slot.take()
            _give_up_if_abandoned()
        fan_out.limiter.wait_turn(getattr(state, "tag_waited_until", None))
        if not fan_out.slot.over_bound:
            return
        fan_out.slot.give_back()


def _free_to_go() -> bool:
    """Whether a first attempt may go at once: its slot held, no pause, in bound.

    Checked before the `before` hook of a first attempt, which would find the same
    and cost the judgment a few µs (a coroutine's, async) for nothing.
    """
    fan_out = _FAN_OUT.get()
    if fan_out is None:
        return True
    if fan_out.failed is not None and fan_out.failed.is_set():
        return False  # `_before_attempt` gives up
    limiter, slot = fan_out.limiter, fan_out.slot
    return slot.held and not limiter.pausing() and not slot.over_bound


async def _abefore_attempt(state: RetryCallState) -> None:
    fan_out = _FAN_OUT.get()
    if fan_out is None:
        return
    while True:
        if not fan_out.slot.held:
            await fan_out.slot.atake()
        await fan_out.limiter.await_turn(getattr(state, "tag_waited_until", None))
        if not fan_out.slot.over_bound:
            return
        fan_out.slot.give_back()


def _before_sleep(state: RetryCallState) -> None:
    # A rate-limited judgment waits without its slot: after the pause only the
    # calls the lowered bound allows go out, not every judgment that was waiting.
    fan_out = _FAN_OUT.get()
    if fan_out is not None and is_rate_limit(_error(state)):
        fan_out.slot.give_back()


def succeeded() -> None:
    """A judgment's call went through (the limiter lets more in flight)."""
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        fan_out.limiter.succeeded()


def _error(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome is not None else None


def _wait(retry: CallRetry, state: RetryCallState) -> float:
    error = _error(state)
    delay = retry.delay(state.attempt_number, error)
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        # This judgment sleeps `delay` now; before its next attempt it waits only
        # for what a pause of the fan-out adds beyond that. A shortage of capacity
        # (a flex tier's 429) is no rate limit: no pause, no lowered bound.
        state.tag_waited_until = fan_out.limiter.back_off(  # type: ignore[attr-defined]
            delay, rate_limited=is_rate_limit(error)
        )
    return delay


def retrying(retry: CallRetry | None, kind: type[RetryingT]) -> RetryingT:
    """The one retry layer of a judgment's model call (the client's are off).

    Before each attempt a judgment waits out the fan-out's shared pause (after a
    rate limit, all wait; under on_error="raise" a sibling's failure ends a sync
    fan-out); a wait the provider asks for (`Retry-After`) is honoured. A judgment
    rate limited gives back its slot while it waits, and takes one again under the
    lowered bound before its next attempt.
    """
    policy = retry or ONE_ATTEMPT
    return policy.retrying(
        kind,
        wait=functools.partial(_wait, policy),
        before=_abefore_attempt if kind is AsyncRetrying else _before_attempt,
        before_sleep=_before_sleep,
    )


class _FirstAttempt:
    """What the `before` hooks read of the first attempt's retry state: nothing."""


_T = TypeVar("_T")


def call(
    retry: CallRetry | None, fn: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """`fn(*args, **kwargs)` under `retry` in its fan-out: the one retry layer.

    The first attempt runs without tenacity, whose loop costs about 15 µs a call
    (36 µs async; measured here, half of a judgment's own overhead); a failure is
    replayed into `retrying` as its first attempt, so every retry, wait and
    budget is the policy's, as if the loop had made that attempt. Each attempt is
    counted by the `UsageCounter` the caller is `counting` with (none: no count).

    Raises:
        GaveUp: The call failed for good (its error, and the attempts made).
    """
    if not _free_to_go():
        _before_attempt(cast("RetryCallState", _FirstAttempt()))
    counter = active_counter()
    try:
        if counter is None:
            return fn(*args, **kwargs)
        counter.add_call()
        output = fn(*args, **kwargs)
    except Exception as first:  # noqa: BLE001 - replayed into the retry loop
        replay = _Replay(first)
    else:
        counter.add_answer(output)
        return output
    loop = retrying(retry, Retrying)
    try:
        return loop(replay.then(fn), *args, **kwargs)
    except Exception as error:
        raise GaveUp(error, loop.statistics.get("attempt_number", 1)) from error


async def acall(
    retry: CallRetry | None, fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any
) -> _T:
    """Async `call`."""
    if not _free_to_go():
        await _abefore_attempt(cast("RetryCallState", _FirstAttempt()))
    counter = active_counter()
    try:
        if counter is None:
            return await fn(*args, **kwargs)
        counter.add_call()
        output = await fn(*args, **kwargs)
    except Exception as first:  # noqa: BLE001 - replayed into the retry loop
        replay = _Replay(first)
    else:
        counter.add_answer(output)
        return output
    loop = retrying(retry, AsyncRetrying)
    try:
        return await loop(replay.athen(fn), *args, **kwargs)
    except Exception as error:
        raise GaveUp(error, loop.statistics.get("attempt_number", 1)) from error


class _Replay:
    """A call whose first attempt already failed: raise that, then call for real."""

    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error

    def _replayed(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def then(self, fn: Callable[..., _T]) -> Callable[..., _T]:
        def attempt(*args: Any, **kwargs: Any) -> _T:
            self._replayed()
            counter = active_counter()
            if counter is not None:
                counter.add_call()
            output = fn(*args, **kwargs)
            if counter is not None:
                counter.add_answer(output)
            return output

        return attempt

    def athen(self, fn: Callable[..., Awaitable[_T]]) -> Callable[..., Awaitable[_T]]:
        async def attempt(*args: Any, **kwargs: Any) -> _T:
            self._replayed()
            counter = active_counter()
            if counter is not None:
                counter.add_call()
            output = await fn(*args, **kwargs)
            if counter is not None:
                counter.add_answer(output)
            return output

        return attempt


def judgment_config(config: RunnableConfig, *rules: Rule) -> RunnableConfig:
    """The config of one model call: its run named after its rules, like the fan-out."""
    ids = [rule.rule_id for rule in rules]
    named = {"tag_rule_id": ids[0]} if len(ids) == 1 else {"tag_rule_ids": ids}
    child = cast(
        "RunnableConfig",
        {
            **config,
            "run_name": "judge:" + "+".join(ids),
            "metadata": {**config.get("metadata", {}), **named},
        },
    )
    child.pop("run_id", None)
    return child


def in_threads(
    judge_unit: Callable[[Unit], list[Verdict]],
    units: Sequence[Unit],
    limiter: ConcurrencyLimiter,
    explored: Mapping[str, float],
    *,
    recalled: bool = False,
) -> list[Verdict]:
    """Run `judge_unit` on every unit in worker threads; the verdicts in unit order.

    The first failure for good stops the fan-out: units not started are dropped,
    running ones make no further attempt, and that failure is raised, never the
    `Abandoned` of a judgment it stopped.
    """
    failed = threading.Event()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def judge_one(unit: Unit) -> list[Verdict]:
        with limiter.hold() as slot:
            # In this task's own copy of the context.
            _FAN_OUT.set(_FanOut(limiter, slot, failed, explored, recalled))
            _give_up_if_abandoned()
            try:
                return judge_unit(unit)
            except Abandoned:
                raise
            except BaseException as error:
                # Recorded before the others are stopped, and before this worker
                # takes the next queued unit.
                with lock:
                    failures.append(error)
                failed.set()
                raise

    workers = min(len(units), limiter.bound or MAX_THREADS)
    with ContextThreadPoolExecutor(max_workers=workers) as executor:
        futures = [executor.submit(judge_one, unit) for unit in units]
        try:
            # The first failure is raised when it happens, not when the units
            # before it are done.
            concurrent.futures.wait(
                futures, return_when=concurrent.futures.FIRST_EXCEPTION
            )
        except BaseException:
            _stop(failed, futures)
            raise
        if any(_raised(future) for future in futures):
            _stop(failed, futures)
    # Every unit has ended: the failure that stopped the others is the one raised.
    if failures:
        raise failures[0]
    errors = [
        error
        for future in futures
        if not future.cancelled() and (error := future.exception()) is not None
    ]
    if errors:
        raise next((e for e in errors if not isinstance(e, Abandoned)), errors[0])
    return [v for future in futures for v in future.result()]


def _stop(
    failed: threading.Event, futures: Sequence[concurrent.futures.Future[Any]]
) -> None:
    # Queued units are dropped; running ones stop before their next attempt, so
    # leaving the pool waits for one call or backoff pause each.
    failed.set()
    for future in futures:
        future.cancel()


def _raised(future: concurrent.futures.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


async def in_tasks(
    ajudge_unit: Callable[[Unit], Awaitable[list[Verdict]]],
    units: Sequence[Unit],
    limiter: ConcurrencyLimiter,
    explored: Mapping[str, float],
    *,
    recalled: bool = False,
) -> list[Verdict]:
    """Run `ajudge_unit` on every unit concurrently; the verdicts in unit order.

    The first failure cancels the units still running or waiting and propagates.
    """

    async def judge_one(unit: Unit) -> list[Verdict]:
        # The slot is taken before any work, so queued judgments cost nothing.
        async with limiter.ahold() as slot:
            # In this task's own copy of the context.
            _FAN_OUT.set(_FanOut(limiter, slot, None, explored, recalled))
            return await ajudge_unit(unit)

    tasks = [asyncio.ensure_future(judge_one(unit)) for unit in units]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [v for unit in results for v in unit]
