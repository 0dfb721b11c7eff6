"""A cap on in-flight LLM calls shared by every concurrent use of one object.

`Runnable.batch(max_concurrency=...)` bounds how many inputs run at once, but each
TAG retrieval fans out into many judgments of its own. The limiter bounds the calls
themselves, across a whole batch, in threads and in event loops alike.

It also reacts to the provider's rate limit, for every caller at once: after a 429
every judgment waits out one shared pause (instead of each retrying on its own
clock), and the number of calls in flight is halved, then grows back by one per
round of successes (additive increase, multiplicative decrease), never above the
bound.

Ours rather than `langchain_core.rate_limiters.InMemoryRateLimiter`: that one paces
requests per second; this one bounds calls in flight and backs off on the
provider's signal, and the two combine (a model may carry a rate limiter too).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext


class ConcurrencyLimiter:
    """Bound the number of simultaneous calls; `None` means unbounded.

    One count of slots is shared by every caller: threads wait on a condition,
    coroutines (in any event loop) on a future that a releasing caller completes
    through the loop's thread-safe callback. A freed slot goes to a waiting
    coroutine first, else to a waiting thread.
    """

    def __init__(
        self, limit: int | None, *, within: ConcurrencyLimiter | None = None
    ) -> None:
        """Create a limiter allowing at most `limit` calls at once.

        Args:
            limit: The bound; None for none.
            within: A limiter whose bound also applies (a caller's own bound inside
                one shared by many callers): a call holds a slot of both, its own
                first, so calls queued on it take none of the shared slots.
        """
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            msg = f"max_concurrency must be a positive integer or None, got {limit!r}"
            raise ValueError(msg)
        self.limit = limit
        self.within = within
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._in_use = 0
        self._allowed = float(limit) if limit is not None else 0.0
        self._resume_at = 0.0
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        self._waiting = deque()

    @property
    def bound(self) -> int | None:
        """The tightest bound of this limiter and those it is within."""
        bounds = [
            limiter.limit for limiter in self._chain() if limiter.limit is not None
        ]
        return min(bounds, default=None)

    @property
    def allowed(self) -> int | None:
        """Calls allowed in flight now: the bound, lowered after rate limits."""
        return None if self.limit is None else max(1, int(self._allowed))

    def _chain(self) -> Iterator[ConcurrencyLimiter]:
        limiter: ConcurrencyLimiter | None = self
        while limiter is not None:
            yield limiter
            limiter = limiter.within

    # -- the provider's signals ------------------------------------------------------

    def back_off(self, delay: float, *, rate_limited: bool) -> float:
        """A call failed and its caller waits `delay` before trying again.

        A rate limit pauses every caller that long (the latest pause wins) and
        halves the calls allowed in flight.

        Returns:
            When the caller's own wait ends (`time.monotonic()` time), to pass to
            `wait_turn` before its next attempt.
        """
        until = time.monotonic() + delay
        if rate_limited:
            for limiter in self._chain():
                with limiter._lock:  # noqa: SLF001 - limiters of one chain
                    limiter._resume_at = max(limiter._resume_at, until)  # noqa: SLF001
                    if limiter.limit is not None:
                        limiter._allowed = max(1.0, limiter._allowed / 2)  # noqa: SLF001
        return until

    def succeeded(self) -> None:
        """A call went through: let one more in flight per round of successes."""
        for limiter in self._chain():
            if limiter.limit is None or limiter._allowed >= limiter.limit:  # noqa: SLF001
                continue
            with limiter._lock:  # noqa: SLF001
                before = limiter.allowed
                limiter._allowed = min(  # noqa: SLF001
                    float(limiter.limit),
                    limiter._allowed + 1 / limiter._allowed,  # noqa: SLF001
                )
                if limiter.allowed != before:
                    limiter._admit()  # noqa: SLF001

    @property
    def resume_at(self) -> float:
        """When the latest shared pause of this limiter (or those it is within) ends."""
        return max(limiter._resume_at for limiter in self._chain())  # noqa: SLF001

    def wait_turn(self, after: float | None = None) -> None:
        """Sleep out the shared pause in a thread (the part later than `after`).

        Args:
            after: The end of a pause the caller already waited for, so that it
                waits only for a later one; None waits from now.
        """
        remaining = self._remaining(after)
        if remaining > 0:
            time.sleep(remaining)

    async def await_turn(self, after: float | None = None) -> None:
        """Async `wait_turn`."""
        remaining = self._remaining(after)
        if remaining > 0:
            await asyncio.sleep(remaining)

    def _remaining(self, after: float | None) -> float:
        resume_at = self.resume_at
        return resume_at - (time.monotonic() if after is None else after)

    # -- slots ------------------------------------------------------------------------

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold one slot (of each bound) in a thread, blocking until one is free."""
        with self._hold(), self.within.hold() if self.within else nullcontext():
            yield

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Hold one slot (of each bound) in the running event loop."""
        async with (
            self._ahold(),
            self.within.ahold() if self.within else nullcontext(),
        ):
            yield

    @contextmanager
    def _hold(self) -> Iterator[None]:
        if self.limit is None:
            yield
            return
        with self._freed:
            while self._in_use >= self._capacity():
                self._freed.wait()
            self._in_use += 1
        try:
            yield
        finally:
            self._release()

    @asynccontextmanager
    async def _ahold(self) -> AsyncIterator[None]:
        if self.limit is None:
            yield
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            granted = self._in_use < self._capacity() and not self._waiting
            if granted:
                self._in_use += 1
            else:
                future: asyncio.Future[None] = loop.create_future()
                self._waiting.append((loop, future))
        if not granted:
            try:
                await future
            except asyncio.CancelledError:
                self._abandon(loop, future)
                raise
        try:
            yield
        finally:
            self._release()

    def _capacity(self) -> int:
        return self.allowed or 0

    def _abandon(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]
    ) -> None:
        """A waiter was cancelled: leave the queue, or pass on a slot it was given.

        Runs in the waiter's loop, as `_grant` does, so the two never interleave.
        """
        with self._lock:
            if (loop, future) in self._waiting:
                self._waiting.remove((loop, future))
                return
        # A releaser chose this waiter. If `_grant` has run, the slot is ours to
        # pass on; if not, it will find the future cancelled and pass it on itself.
        if future.done() and not future.cancelled():
            self._release()

    def _release(self) -> None:
        with self._lock:
            self._in_use -= 1
            self._admit()

    def _admit(self) -> None:
        """Give free slots to waiters, coroutines first (the lock is held)."""
        while self._waiting and self._in_use < self._capacity():
            # Counted as taken at once, so no newcomer jumps ahead of the waiter.
            self._in_use += 1
            loop, future = self._waiting.popleft()
            loop.call_soon_threadsafe(self._grant, future)
        self._freed.notify_all()

    def _grant(self, future: asyncio.Future[None]) -> None:
        # Runs in the waiter's loop; a waiter cancelled meanwhile passes the slot on.
        if future.done():
            self._release()
        else:
            future.set_result(None)
