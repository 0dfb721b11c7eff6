"""The concurrency limiter (`matching/limiter.py`): one bound, one shared backoff."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from pydantic import PrivateAttr

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching import limiter as limiter_module
from langchain_tag.matching.limiter import ConcurrencyLimiter, Slot
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


def test_a_pause_already_waited_is_not_waited_again(clock: FakeClock) -> None:
    limiter = ConcurrencyLimiter(4)
    until = limiter.back_off(2.0, rate_limited=True)
    clock.sleep(5.0)  # the caller's own wait, then a wait for its slot
    limiter.back_off(1.0, rate_limited=True)  # another caller's pause, to t = 6
    limiter.wait_turn(after=until)
    # Before: the pause was counted from the end of the caller's own wait (t = 2),
    # not from now: 4 s, where 1 s is left.
    assert clock.sleeps == [5.0, 1.0]


# --- a slot given back, and taken again under the lowered bound ---------------------


def test_slots_beyond_a_lowered_bound_know_it() -> None:
    limiter = ConcurrencyLimiter(4)
    slots = [Slot(limiter) for _ in range(4)]
    for slot in slots:
        slot.take()
    limiter.back_off(0.0, rate_limited=True)  # allowed: 2
    assert all(slot.held and slot.over_bound for slot in slots)
    slots[0].give_back()
    slots[1].give_back()
    assert not slots[0].held
    assert not any(slot.over_bound for slot in slots[2:])
    for slot in slots[2:]:
        slot.give_back()
    assert limiter._in_use == 0


class _CountingCondition(threading.Condition):
    """A condition that counts the threads waiting on it, and tells when enough do."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.waiting = 0
        self.enough = 0
        self.reached = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # the lock is held
        if self.waiting >= self.enough:
            self.reached.set()
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


def _counting(limiter: ConcurrencyLimiter, enough: int) -> _CountingCondition:
    condition = _CountingCondition(limiter._lock)
    condition.enough = enough
    limiter._freed = condition
    return condition


def test_a_returning_thread_takes_its_slot_before_newcomers() -> None:
    limiter = ConcurrencyLimiter(2)
    waits = _counting(limiter, enough=2)
    holder, returner = Slot(limiter), Slot(limiter)
    holder.take()
    returner.take()
    limiter.back_off(0.0, rate_limited=True)  # allowed: 1
    returner.give_back()  # backing off after the rate limit
    newcomer = Slot(limiter)
    first = threading.Thread(target=newcomer.take)
    second = threading.Thread(target=returner.take)
    first.start()
    second.start()
    assert waits.reached.wait(HANG_GUARD)  # both wait: the holder has the one slot
    holder.give_back()
    second.join(HANG_GUARD)
    # The returner went first, though the newcomer had waited longer.
    assert (returner.held, newcomer.held) == (True, False)
    assert first.is_alive()
    returner.give_back()
    first.join(HANG_GUARD)
    assert newcomer.held
    newcomer.give_back()
    assert limiter._in_use == 0


async def test_a_returning_task_takes_its_slot_before_newcomers() -> None:
    limiter = ConcurrencyLimiter(2)
    holder, returner = Slot(limiter), Slot(limiter)
    await holder.atake()
    await returner.atake()
    limiter.back_off(0.0, rate_limited=True)  # allowed: 1
    returner.give_back()
    newcomer = Slot(limiter)
    first = asyncio.ensure_future(newcomer.atake())
    await asyncio.sleep(0)  # queued
    second = asyncio.ensure_future(returner.atake())
    await asyncio.sleep(0)
    assert len(limiter._waiting) == 2
    holder.give_back()
    await asyncio.wait_for(second, HANG_GUARD)
    assert (returner.held, newcomer.held) == (True, False)
    assert not first.done()
    returner.give_back()
    await asyncio.wait_for(first, HANG_GUARD)
    assert newcomer.held
    newcomer.give_back()
    assert limiter._in_use == 0


async def test_a_slot_taken_again_can_be_cancelled_cleanly() -> None:
    limiter = ConcurrencyLimiter(1, within=ConcurrencyLimiter(1))
    holder, returner = Slot(limiter), Slot(limiter)
    await holder.atake()
    waiting = asyncio.ensure_future(returner.atake())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    holder.give_back()
    assert not returner.held
    assert (limiter._in_use, limiter.within._in_use) == (0, 0)  # type: ignore[union-attr]
    async with limiter.ahold() as slot:  # and the slots are free again
        assert slot.held


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
