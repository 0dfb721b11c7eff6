"""The concurrency limiter (`matching/limiter.py`): one bound, one shared backoff."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from pydantic import PrivateAttr

from langchain_tag import ApplicabilityJudge, Rule, Rulebook, TAGRetriever
from langchain_tag.matching import limiter as limiter_module
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.testing import FakeClock, RuleAwareFakeChatModel, trigger_rulebook
from tests.unit_tests.conftest import HANG_GUARD

"""Seconds before a wait that should end at once fails the test: no speed limit."""

# --- the shared backoff --------------------------------------------------------------


def test_a_rate_limit_pauses_everyone_and_halves_the_calls_in_flight(
    clock: FakeClock,
) -> None:
    limiter = ConcurrencyLimiter(8)
    until = limiter.back_off(2.0, rate_limited=True)
    assert until == limiter.resume_at == 2.0
    assert limiter.allowed == 4
    limiter.wait_turn()  # another caller: waits out the pause
    assert clock.sleeps == [2.0]
    limiter.wait_turn(after=until)  # the caller that slept through it: no more
    assert clock.sleeps == [2.0]
    limiter.back_off(1.0, rate_limited=True)
    limiter.back_off(1.0, rate_limited=True)
    limiter.back_off(1.0, rate_limited=True)
    assert limiter.allowed == 1  # never below one
    # Additive increase: back to the bound after enough successes, never above.
    for _ in range(100):
        limiter.succeeded()
    assert limiter.allowed == 8


def test_other_errors_pause_nobody(clock: FakeClock) -> None:
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(2.0, rate_limited=False)
    limiter.wait_turn()
    assert clock.sleeps == []
    assert limiter.allowed == 4


def test_a_lowered_bound_holds_for_threads_and_event_loops(
    overlapping_llm: RuleAwareFakeChatModel,
) -> None:
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(0.0, rate_limited=True)  # allowed: 2
    model = overlapping_llm  # two calls in flight at once, without a latency
    judge = ApplicabilityJudge(llm=model, cache=None)
    rules = trigger_rulebook(8).rules
    judge.judge_rules("trigger-001", rules, limiter=limiter)
    # Two at first, one more only after rounds of successes (2 -> 2.5 -> 2.9 ...).
    assert 2 <= model.peak_in_flight <= 3
    assert limiter.allowed == 4  # grown back, never past the bound
    model.reset()
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(0.0, rate_limited=True)
    asyncio.run(judge.ajudge_rules("trigger-001", rules, limiter=limiter))
    assert 2 <= model.peak_in_flight <= 3


# --- one bound for threads and event loops -------------------------------------------


class _HeldAsyncModel(RuleAwareFakeChatModel):
    """Async calls wait for `release()`; sync calls answer at once."""

    _released: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)
    _two_held: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    async def two_held(self) -> None:
        """Return once two async calls are held in flight together."""
        await asyncio.wait_for(self._two_held.wait(), HANG_GUARD)

    async def _aduring_call(self) -> None:
        if self.peak_in_flight == 2:
            self._two_held.set()
        await self._released.wait()


def _watch_thread_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set when a thread starts waiting for a slot of a limiter made later."""
    waiting = threading.Event()

    class WatchedCondition(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()
            return super().wait(timeout)

    monkeypatch.setattr(
        limiter_module,
        "threading",
        SimpleNamespace(Lock=threading.Lock, Condition=WatchedCondition),
    )
    return waiting


async def test_limit_holds_across_sync_and_async_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    thread_waits = _watch_thread_waits(monkeypatch)
    rules = [
        Rule(
            rule_id=f"R{i}",
            name=f"Rule {i}",
            condition=f"The input contains `t{i}`",
            action=f"Do {i}",
        )
        for i in range(6)
    ]
    llm = _HeldAsyncModel()
    retriever = TAGRetriever(
        rulebook=Rulebook(rules=rules),
        judge=ApplicabilityJudge(llm=llm, cache=None),
        max_concurrency=2,
    )
    # The loop's judgments take both slots and hold them.
    in_loop = asyncio.ensure_future(retriever.ainvoke("t2 in the loop"))
    worker = threading.Thread(target=retriever.invoke, args=("t1 in threads",))
    try:
        await llm.two_held()
        worker.start()
        # The thread's judgments would reach the model now if the limit were not
        # shared; they wait for a slot instead.
        assert await asyncio.to_thread(thread_waits.wait, HANG_GUARD)
        assert llm.calls == 2
        assert worker.is_alive()
    finally:
        llm.release()
        await in_loop
        if worker.is_alive():
            await asyncio.to_thread(worker.join)
    assert llm.calls == 12  # the thread's six ran after the loop's freed the slots
    assert llm.peak_in_flight == 2  # reached, and never more
