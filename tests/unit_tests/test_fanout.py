"""The fan-out of one input's judgments: first failure, limits, shadow judging."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables.config import ContextThreadPoolExecutor
from pydantic import ConfigDict, Field, PrivateAttr
from tenacity import AsyncRetrying

from langchain_tag import Rule
from langchain_tag.errors import JudgmentError, UnreliableMatchWarning
from langchain_tag.matching import ApplicabilityJudge, Verdict, _fanout
from langchain_tag.matching.limiter import ConcurrencyLimiter, Slot
from langchain_tag.matching.prompts import read_judge_message
from langchain_tag.models import CallRetry
from langchain_tag.testing import (
    FakeClock,
    RuleAwareFakeChatModel,
    TransientFakeError,
    trigger_rulebook,
)
from tests.unit_tests.conftest import HANG_GUARD

if TYPE_CHECKING:
    from tests.unit_tests.conftest import HeldFakeChatModel

NO_WAIT = CallRetry(max_attempts=5, initial_delay=0.0, max_delay=0.0, jitter=0.0)
SLOW = 10.0
"""Seconds an event wait may take before the test counts as hung (never reached)."""


def make_rules(n: int) -> list[Rule]:
    return list(trigger_rulebook(n).rules)


# --- the first failure is the one raised ---------------------------------------------


@dataclass
class Choreography:
    """The interleaving that let a private error escape, forced.

    R-001 fails for good while R-000 is between attempts, and R-000's judgment
    (given up) ends before R-001's does.
    """

    failing_thread: threading.Thread | None = None
    failed_for_good: threading.Event = field(default_factory=threading.Event)
    first_unit_done: threading.Event = field(default_factory=threading.Event)
    watched: bool = False


class ChoreographedModel(BaseChatModel):
    """R-000: a 429 once R-001 has failed; R-001: a permanent error; others: NO."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    choreography: Choreography

    @property
    def _llm_type(self) -> str:
        return "choreographed"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        parsed = read_judge_message("\n".join(str(m.content) for m in messages))
        rule_id = parsed[1]["rule_id"] if parsed else ""
        if rule_id == "R-001":
            self.choreography.failing_thread = threading.current_thread()
            msg = "boom"
            raise ValueError(msg)
        if rule_id == "R-000":
            assert self.choreography.failed_for_good.wait(SLOW)
            raise TransientFakeError  # rate limited: R-000 will try again
        message = AIMessage('{"verdict": "NO"}')
        return ChatResult(generations=[ChatGeneration(message=message)])


class ChoreographedLimiter(ConcurrencyLimiter):
    """Holds R-001's worker, failed, until R-000's unit has ended."""

    def __init__(self, choreography: Choreography) -> None:
        super().__init__(2)
        self.choreography = choreography

    @contextmanager
    def hold(self) -> Iterator[Slot]:
        with super().hold() as slot:
            try:
                yield slot
            finally:
                if threading.current_thread() is self.choreography.failing_thread:
                    # The fan-out knows of the failure by now; R-000 may go on.
                    self.choreography.failed_for_good.set()
                    assert self.choreography.first_unit_done.wait(SLOW)


def test_a_judgment_given_up_never_hides_the_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: R-000, stopped between attempts by R-001's failure, ended first, and
    # the fan-out raised its private `_Abandoned` instead of R-001's JudgmentError
    # (22 of 200 retriever runs under persistent 429s).
    choreography = Choreography()
    submit = ContextThreadPoolExecutor.submit

    def submit_watched(
        self: ContextThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any
    ) -> Any:
        future = submit(self, fn, *args, **kwargs)
        if not choreography.watched:  # the first unit: R-000's
            choreography.watched = True
            future.add_done_callback(lambda _: choreography.first_unit_done.set())
        return future

    monkeypatch.setattr(ContextThreadPoolExecutor, "submit", submit_watched)
    judge = ApplicabilityJudge(
        llm=ChoreographedModel(choreography=choreography), cache=None, retry=NO_WAIT
    )
    with pytest.raises(JudgmentError, match="R-001") as raised:
        judge.judge_rules(
            "x", make_rules(2), limiter=ChoreographedLimiter(choreography)
        )
    assert "boom" in raised.value.error
    assert choreography.first_unit_done.is_set()


# --- shadow judging ----------------------------------------------------------------


class ListSink:
    """A verdict sink that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        self.records.append((rule.rule_id, fields))

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        self.record(text, rule, verdict, **fields)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_explored_rules_are_logged_with_their_rate(mode: str) -> None:
    sink = ListSink()
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=sink)
    rules = make_rules(3)
    explored = {"R-001": 0.25}
    if mode == "sync":
        judge.judge_rules("x", rules, explored=explored)
    else:
        await judge.ajudge_rules("x", rules, explored=explored)
    logged = {rule_id: fields["explore"] for rule_id, fields in sink.records}
    assert logged == {"R-000": None, "R-001": 0.25, "R-002": None}
    # Outside a fan-out nothing is marked explored.
    judge.invoke(("y", rules[1]))
    assert sink.records[-1] == ("R-001", {**sink.records[-1][1], "explore": None})


# --- the first failure stops the fan-out ---------------------------------------------


def _rule_id(messages: list[BaseMessage]) -> str:
    parsed = read_judge_message("\n".join(str(m.content) for m in messages))
    return parsed[1]["rule_id"] if parsed else ""


class HeldUntilCancelled(RuleAwareFakeChatModel):
    """Async calls with a fault fail at once; any other is held until cancelled."""

    held: list[str] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            if fault is None:
                self.held.append(_rule_id(messages))
                try:  # never let through: only a cancellation ends the call
                    await asyncio.wait_for(asyncio.Event().wait(), SLOW)
                except asyncio.CancelledError:
                    self.cancelled.append(_rule_id(messages))
                    raise
            return self._respond(messages, prompt, fault)
        finally:
            self._leave()


async def test_async_raise_policy_fails_fast() -> None:
    rules = make_rules(30)
    llm = HeldUntilCancelled(faults={"R-000": [ValueError("boom")]})
    judge = ApplicabilityJudge(llm=llm)
    with pytest.raises(JudgmentError, match="R-000"):
        await judge.ajudge_rules("x", rules, limiter=ConcurrencyLimiter(2))
    # Raised while R-001's call was still in flight (it is never let through); that
    # call was cancelled before the raise, not left running; the rest never ran.
    assert "R-001" in llm.held
    assert llm.cancelled == llm.held
    assert llm.calls < len(rules)


def test_sync_raise_policy_propagates() -> None:
    rules = make_rules(5)
    llm = RuleAwareFakeChatModel(faults={"R-003": [ValueError("boom")]})
    with pytest.raises(JudgmentError, match="R-003"):
        ApplicabilityJudge(llm=llm).judge_rules("x", rules)


class WatchedLimiter(ConcurrencyLimiter):
    """A bound of two that tells when a judgment backs off and when one failed."""

    def __init__(self) -> None:
        super().__init__(2)
        self.backing_off = threading.Event()
        self.failure_seen = threading.Event()

    def back_off(self, delay: float, *, rate_limited: bool) -> float:
        until = super().back_off(delay, rate_limited=rate_limited)
        self.backing_off.set()
        return until

    @contextmanager
    def hold(self) -> Iterator[Slot]:
        with super().hold() as slot:
            try:
                yield slot
            except JudgmentError:
                # Raised out of the fan-out's worker: the fan-out has seen it.
                self.failure_seen.set()
                raise


class FailsWhileBackingOff(RuleAwareFakeChatModel):
    """R-001's call arrives only once another judgment is backing off."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    backing_off: threading.Event

    def _generate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        if _rule_id(messages) == "R-001":
            assert self.backing_off.wait(SLOW)
        return super()._generate(messages, *args, **kwargs)

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        if _rule_id(messages) == "R-001":
            assert await asyncio.to_thread(self.backing_off.wait, SLOW)
        return await super()._agenerate(messages, *args, **kwargs)


def _backoff_sleeps(
    monkeypatch: pytest.MonkeyPatch,
    sleep: Callable[[float], None],
    asleep: Callable[[float], Awaitable[None]],
) -> None:
    """The judgments' backoff pauses sleep with `sleep` (threads), `asleep` (tasks)."""
    made = _fanout.retrying

    def retrying(retry: CallRetry | None, kind: Any) -> Any:
        return made(retry, kind).copy(sleep=asleep if kind is AsyncRetrying else sleep)

    monkeypatch.setattr(_fanout, "retrying", retrying)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_raise_policy_stops_the_fan_out_at_the_first_failure(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # R-000 is still backing off when R-001 fails for good: R-000 makes no further
    # attempt, and no queued rule is judged after the failure. Forced, not timed:
    # R-001 fails once R-000 backs off, and R-000's pause lasts until the fan-out
    # has seen the failure (threads) or until it is cancelled (tasks).
    limiter = WatchedLimiter()
    pauses: list[float] = []
    cancelled: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        assert limiter.failure_seen.wait(SLOW)

    async def asleep(seconds: float) -> None:
        pauses.append(seconds)
        try:
            await asyncio.wait_for(asyncio.Event().wait(), SLOW)
        except asyncio.CancelledError:
            cancelled.append(seconds)
            raise

    _backoff_sleeps(monkeypatch, sleep, asleep)
    rules = make_rules(10)
    overloaded = TransientFakeError("overloaded", 503)  # no shared pause: R-000 alone
    llm = FailsWhileBackingOff(
        backing_off=limiter.backing_off,
        faults={"R-000": [overloaded] * 3, "R-001": [ValueError("boom")]},
    )
    judge = ApplicabilityJudge(
        llm=llm, cache=None, retry=CallRetry(initial_delay=0.2, jitter=0.0)
    )

    async def fan_out() -> list[Verdict]:
        if mode == "sync":
            return judge.judge_rules("x", rules, limiter=limiter)
        return await judge.ajudge_rules("x", rules, limiter=limiter)

    with pytest.raises(JudgmentError, match="R-001"):
        await fan_out()
    judged = [
        parsed[1]["rule_id"]
        for prompt in llm.prompts
        if (parsed := read_judge_message(prompt)) is not None
    ]
    assert judged == ["R-000", "R-001"]
    assert pauses == [0.2]  # R-000 was backing off when R-001 failed
    assert cancelled == ([0.2] if mode == "async" else [])


# --- concurrency --------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3])
def test_sync_fan_out_honours_the_limit(
    limit: int,
    overlapping: Callable[..., RuleAwareFakeChatModel],
    held_llm: HeldFakeChatModel,
) -> None:
    # A bound above one is reached (calls wait until `limit` are in flight); a bound
    # of one is kept while each call is held until the test has seen it alone.
    llm = held_llm if limit == 1 else overlapping(limit)
    judge = ApplicabilityJudge(llm=llm, cache=None)

    def fan_out() -> list[Verdict]:
        return judge.judge_rules(
            "trigger-004", make_rules(12), limiter=ConcurrencyLimiter(limit)
        )

    verdicts = held_llm.one_at_a_time(fan_out) if limit == 1 else fan_out()
    assert llm.peak_in_flight == limit
    assert [v.rule_id for v in verdicts] == [f"R-{i:03d}" for i in range(12)]
    assert [v.applies for v in verdicts].count(True) == 1


@pytest.mark.parametrize("limit", [1, 4])
def test_async_fan_out_honours_the_limit(
    limit: int,
    overlapping: Callable[..., RuleAwareFakeChatModel],
    held_llm: HeldFakeChatModel,
) -> None:
    llm = held_llm if limit == 1 else overlapping(limit)
    judge = ApplicabilityJudge(llm=llm, cache=None)

    def fan_out() -> list[Verdict]:
        return asyncio.run(
            judge.ajudge_rules(
                "trigger-004", make_rules(12), {"max_concurrency": limit}
            )
        )

    verdicts = held_llm.one_at_a_time(fan_out) if limit == 1 else fan_out()
    assert llm.peak_in_flight == limit
    assert [v.applies for v in verdicts].count(True) == 1


# --- rate limits: the calls after a pause, the time budget; shortages of capacity ----


@dataclass
class FakeTime:
    """One fake clock for every wait: the limiter's pauses, the judgments' own."""

    clock: FakeClock
    waits: list[float]
    """The judgments' own waits (tenacity's), in order."""


@pytest.fixture
def fake_time(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    """The judgments' waits advance the limiter's `clock`; the budgets read it too."""
    waits: list[float] = []
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            waits.append(seconds)
            clock.now += seconds

    async def asleep(seconds: float) -> None:
        sleep(seconds)
        await asyncio.sleep(0)

    _backoff_sleeps(monkeypatch, sleep, asleep)
    monkeypatch.setattr(
        "langchain_tag.models._retry.time",
        SimpleNamespace(monotonic=clock.monotonic, time=clock.time),
    )
    return FakeTime(clock, waits)


RATE_LIMITED = TransientFakeError("rate limited", 429, headers={"retry-after": "1"})
SHORT_OF_CAPACITY = TransientFakeError(
    "Error code: 429 - Resource unavailable: flex processing is short of capacity.",
    429,
)


class BurstThenGated(RuleAwareFakeChatModel):
    """The first `burst` calls, all in flight together, are refused (429, 1 s).

    The first call after them is held until `go` is set: by the test once the
    other judgments wait for a slot, or by this model when a second call arrives
    meanwhile (`crowded`: the lowered bound was not kept).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    burst: int = 8
    go: threading.Event = Field(default_factory=threading.Event)
    limiter: ConcurrencyLimiter | None = None
    """Async: `go` is also due once `burst - 1` tasks wait for its slots."""
    crowded: bool = False

    _number: int = PrivateAttr(default=0)
    _later_in_flight: int = PrivateAttr(default=0)
    _all_in: threading.Event = PrivateAttr(default_factory=threading.Event)

    def _arrive(self) -> int:
        with self._lock:
            self._number += 1
            if self._in_flight >= self.burst:
                self._all_in.set()
            if self._number > self.burst:
                self._later_in_flight += 1
                if self._later_in_flight > 1:
                    self.crowded = self.crowded or not self.go.is_set()
                    self.go.set()
            return self._number

    def _depart(self, number: int) -> None:
        with self._lock:
            if number > self.burst:
                self._later_in_flight -= 1

    def _released(self) -> bool:
        waiting = len(self.limiter._waiting) if self.limiter is not None else 0
        if waiting >= self.burst - 1:
            self.go.set()
        return self.go.is_set()

    def _generate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        number = self._arrive()
        try:
            if number <= self.burst:
                assert self._all_in.wait(HANG_GUARD)
                raise RATE_LIMITED
            assert self.go.wait(HANG_GUARD)
            return self._respond(messages, prompt, fault)
        finally:
            self._depart(number)
            self._leave()

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        number = self._arrive()
        try:
            ready = self._all_in.is_set if number <= self.burst else None
            for _ in range(100_000):  # turns of the loop, not time
                if (ready or self._released)():
                    break
                await asyncio.sleep(0)
            if ready is not None:
                assert ready()
                raise RATE_LIMITED
            assert self._released()
            return self._respond(messages, prompt, fault)
        finally:
            self._depart(number)
            self._leave()


class _CountingCondition(threading.Condition):
    """Sets `reached` once `enough` threads wait on it at the same time."""

    def __init__(
        self, lock: threading.Lock, enough: int, reached: threading.Event
    ) -> None:
        super().__init__(lock)
        self.waiting = 0
        self.enough = enough
        self.reached = reached

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # the lock is held
        if self.waiting >= self.enough:
            self.reached.set()
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_after_a_rate_limit_only_the_allowed_calls_go_out(
    mode: str, fake_time: FakeTime
) -> None:
    # Before: a judgment kept its slot through its retries, so the 8 refused
    # together all tried again together after the pause, whatever the lowered
    # bound (8 x 429, then 8 again).
    limiter = ConcurrencyLimiter(8)
    llm = BurstThenGated(limiter=limiter if mode == "async" else None)
    if mode == "sync":
        limiter._freed = _CountingCondition(limiter._lock, 7, llm.go)
    judge = ApplicabilityJudge(llm=llm, cache=None)
    rules = make_rules(8)
    if mode == "sync":
        verdicts = judge.judge_rules("trigger-003", rules, limiter=limiter)
    else:
        verdicts = await judge.ajudge_rules("trigger-003", rules, limiter=limiter)
    assert [v.applies for v in verdicts] == [r.rule_id == "R-003" for r in rules]
    # The bound went to 1; the first call after the pause went out alone while
    # the 7 others waited for a slot.
    assert not llm.crowded
    assert llm.calls == 16
    assert fake_time.waits == [1.0] * 8
    assert limiter._in_use == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("refusals", [10, 100])
async def test_a_rate_limit_with_the_providers_wait_has_a_time_budget(
    mode: str, refusals: int, fake_time: FakeTime
) -> None:
    # Before: 4 attempts, whatever the wait: 3 s of `Retry-After: 1` failed the
    # judgment. Now 60 s (`rate_limit_wait`) of them are waited out.
    rule = make_rules(1)[0]
    llm = RuleAwareFakeChatModel(faults={rule.rule_id: [RATE_LIMITED] * refusals})
    judge = ApplicabilityJudge(llm=llm, cache=None)
    limiter = ConcurrencyLimiter(4)

    async def fan_out() -> list[Verdict]:
        if mode == "sync":
            return judge.judge_rules("trigger-000", [rule], limiter=limiter)
        return await judge.ajudge_rules("trigger-000", [rule], limiter=limiter)

    if refusals < 60:  # a storm shorter than the budget (`rate_limit_wait`)
        assert [v.applies for v in await fan_out()] == [True]
        assert llm.calls == refusals + 1
        assert fake_time.waits == [1.0] * refusals
        return
    with pytest.raises(JudgmentError, match="after 61 attempt") as raised:
        await fan_out()
    assert raised.value.kind == "transient"
    assert "retry later" in str(raised.value)
    # It stopped before a wait that would end past 60 s of rate limits.
    assert sum(fake_time.waits) == 60.0  # `CallRetry().rate_limit_wait`
    assert llm.calls == 61


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_shortage_of_capacity_is_no_rate_limit(
    mode: str, fake_time: FakeTime
) -> None:
    # The flex tier's 429 "resource unavailable": the refused judgment backs off
    # on its own; nobody else pauses, the bound stays.
    rules = make_rules(4)
    llm = RuleAwareFakeChatModel(faults={"R-000": [SHORT_OF_CAPACITY] * 3})
    judge = ApplicabilityJudge(
        llm=llm, cache=None, retry=CallRetry(jitter=0.0, max_attempts=2)
    )
    limiter = ConcurrencyLimiter(4)
    if mode == "sync":
        verdicts = judge.judge_rules("trigger-000", rules, limiter=limiter)
    else:
        verdicts = await judge.ajudge_rules("trigger-000", rules, limiter=limiter)
    assert [v.applies for v in verdicts] == [True, False, False, False]
    assert limiter.allowed == 4
    assert limiter.resume_at == 0.0
    assert fake_time.clock.sleeps == []  # no judgment waited for a shared pause
    # Its own backoff, by time, not `max_attempts` (2): three refusals outlived.
    assert fake_time.waits == [1.0, 2.0, 4.0]
    assert llm.calls == 7
    # A rate limit, for contrast, pauses everyone and halves the bound.
    rate_limited = RuleAwareFakeChatModel(faults={"R-000": [RATE_LIMITED]})
    judge = ApplicabilityJudge(llm=rate_limited, cache=None)
    judge.judge_rules("trigger-000", rules, limiter=limiter)
    assert limiter.resume_at > 0.0
    assert limiter.allowed < 4  # halved to 2, grown back by a few successes


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_long_shortage_of_capacity_fails_as_one(
    mode: str, fake_time: FakeTime
) -> None:
    rule = make_rules(1)[0]
    llm = RuleAwareFakeChatModel(faults={rule.rule_id: [SHORT_OF_CAPACITY] * 100})
    judge = ApplicabilityJudge(
        llm=llm, cache=None, retry=CallRetry(jitter=0.0), on_error="not_applicable"
    )
    limiter = ConcurrencyLimiter(4)

    async def fan_out() -> list[Verdict]:
        if mode == "sync":
            return judge.judge_rules("trigger-000", [rule], limiter=limiter)
        return await judge.ajudge_rules("trigger-000", [rule], limiter=limiter)

    with pytest.warns(UnreliableMatchWarning, match="1 of 1 judgments failed"):
        [verdict] = await fan_out()
    assert verdict.failed  # flagged, never a silent NO
    assert "Resource unavailable" in str(verdict.error)
    # Waits of 1, 2, 4, 8, 16, then 30 s, while they end within 600 s.
    assert fake_time.waits == [1.0, 2.0, 4.0, 8.0, 16.0] + [30.0] * 18
    assert llm.calls == 24
    assert limiter.allowed == 4
    with pytest.raises(JudgmentError) as raised:
        ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(faults={rule.rule_id: [SHORT_OF_CAPACITY] * 9}),
            cache=None,
            retry=CallRetry(jitter=0.0, capacity_wait=10.0),
        ).invoke(("trigger-000", rule))
    assert raised.value.kind == "capacity"
    assert raised.value.transient
    assert "short of capacity" in str(raised.value)
