"""Unit tests run with network sockets disabled (Unix sockets stay, for asyncio)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from pydantic import PrivateAttr
from pytest_socket import disable_socket, enable_socket, socket_allow_hosts

from langchain_tag.testing import FakeClock, RuleAwareFakeChatModel

HANG_GUARD = 10.0
"""Seconds before a wait that should end at once fails the test: no speed limit."""

T = TypeVar("T")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Disable internet sockets before every unit test."""
    disable_socket(allow_unix_socket=True)


@pytest.fixture
def loopback() -> None:
    """Sockets to 127.0.0.1 only, where a test's fake server runs."""
    enable_socket()
    socket_allow_hosts(["127.0.0.1"], allow_unix_socket=True)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The concurrency limiter's clock: its pauses sleep on a `FakeClock`."""
    fake = FakeClock()
    monkeypatch.setattr(
        "langchain_tag.matching.limiter.time",
        SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep),
    )
    return fake


class _OverlappingFakeChatModel(RuleAwareFakeChatModel):
    """The first calls (after a `reset`) wait until `overlap` are in flight at once.

    So a bound of `overlap` or more is reached whatever the machine's speed,
    without a latency that sleeps; a lower bound makes the first call fail after
    `HANG_GUARD` seconds.
    """

    overlap: int = 2

    _overlapped: threading.Event = PrivateAttr(default_factory=threading.Event)

    def reset(self) -> None:
        super().reset()
        self._overlapped.clear()

    def _first(self) -> bool:
        """Whether this call, just entered, must wait; set the event if none must."""
        with self._lock:
            if self._in_flight >= self.overlap:
                self._overlapped.set()
            return len(self._prompts) < self.overlap

    def _during_call(self) -> None:
        if self._first():
            assert self._overlapped.wait(HANG_GUARD), "too few calls in flight"

    async def _aduring_call(self) -> None:
        if self._first():
            overlapped = await asyncio.to_thread(self._overlapped.wait, HANG_GUARD)
            assert overlapped, "too few calls in flight"


@pytest.fixture
def overlapping_llm() -> RuleAwareFakeChatModel:
    """A rule-aware fake whose first call waits for a second: calls overlap."""
    return _OverlappingFakeChatModel()


@pytest.fixture
def overlapping() -> Callable[..., RuleAwareFakeChatModel]:
    """Make rule-aware fakes whose calls wait until `overlap` are in flight at once.

    `overlapping(3, confidence=0.9)`: a bound of three is reached, not merely
    allowed, whatever the machine's speed.
    """

    def make(overlap: int, **kwargs: Any) -> RuleAwareFakeChatModel:
        return _OverlappingFakeChatModel(overlap=overlap, **kwargs)

    return make


class HeldFakeChatModel(RuleAwareFakeChatModel):
    """Every call stays in flight until the test lets it through (`one_at_a_time`).

    Proves a bound of one without a latency: each call is held until the test has
    seen it, alone, in flight; any other call let in meanwhile is counted in
    `peak_in_flight` (and fails the step).
    """

    _gate: threading.Condition = PrivateAttr(default_factory=threading.Condition)
    _held: int = PrivateAttr(default=0)
    _passes: int = PrivateAttr(default=0)
    _open: bool = PrivateAttr(default=False)

    def _hold(self, abandoned: threading.Event) -> None:
        """Wait, counted as held, for a pass (or for the caller to give up)."""
        with self._gate:
            self._held += 1
            self._gate.notify_all()
            passed = self._gate.wait_for(
                lambda: self._open or self._passes > 0 or abandoned.is_set(),
                HANG_GUARD,
            )
            self._held -= 1
            if passed and not self._open and not abandoned.is_set():
                self._passes -= 1
            self._gate.notify_all()
        assert passed, "the test never let this call through"

    def one_at_a_time(self, run: Callable[[], T]) -> T:
        """Run `run` in a thread; let its calls through one by one, each seen alone.

        Returns:
            What `run` returned.
        """
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(run)
            future.add_done_callback(lambda _: self._wake())
            try:
                while True:
                    with self._gate:
                        assert self._gate.wait_for(
                            lambda: future.done() or (self._held and not self._passes),
                            HANG_GUARD,
                        ), "no call arrived and the run did not end"
                        if future.done():
                            break
                        assert self._held == 1, "a second call got in"
                        self._passes += 1
                        self._gate.notify_all()
            finally:
                with self._gate:  # let anything still held go, pass or fail
                    self._open = True
                    self._gate.notify_all()
        with self._gate:
            self._open = False
        return future.result()

    def _wake(self) -> None:
        with self._gate:
            self._gate.notify_all()

    def _during_call(self) -> None:
        self._hold(threading.Event())

    async def _aduring_call(self) -> None:
        abandoned = threading.Event()
        try:
            await asyncio.to_thread(self._hold, abandoned)
        except asyncio.CancelledError:
            abandoned.set()  # the waiting thread ends at once, taking no pass
            self._wake()
            raise


@pytest.fixture
def held_llm() -> HeldFakeChatModel:
    """A rule-aware fake whose calls the test lets through one at a time."""
    return HeldFakeChatModel()
