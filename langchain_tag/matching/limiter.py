"""A cap on in-flight LLM calls shared by every concurrent use of one object.

`Runnable.batch(max_concurrency=...)` bounds how many inputs run at once, but each
TAG retrieval fans out into many judgments of its own. The limiter bounds the calls
themselves, across a whole batch, in threads and in event loops alike.

It also reacts to the provider's rate limit, for every caller at once: after a 429
every judgment waits out one shared pause (instead of each retrying on its own
clock), and the number of calls in flight is halved, then grows back by one per
round of successes (additive increase, multiplicative decrease), never above the
bound. A caller that was rate limited gives its slot back while it waits and
queues again, ahead of callers that have not started, so that after the pause only
the calls now allowed go out.

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
from contextlib import asynccontextmanager, contextmanager


class ConcurrencyLimiter:
    """Bound the number of simultaneous calls; `None` means unbounded.

    One count of slots is shared by every caller: threads wait on a condition,
    coroutines (in any event loop) on a future that a releasing caller completes
    through the loop's thread-safe callback. A freed slot goes to a waiting
    coroutine first, else to a waiting thread; among each, a caller taking its slot
    back after a rate limit goes first.
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
        # This limiter and those it is within, and the bounded ones among them:
        # read by every judgment's attempts, so computed once.
        self._limiters: tuple[ConcurrencyLimiter, ...] = (
            (self,) if within is None else (self, *within._chain())  # noqa: SLF001
        )
        self._bounded = tuple(lim for lim in self._limiters if lim.limit is not None)
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._in_use = 0
        self._allowed = float(limit) if limit is not None else 0.0
        self._returning = 0
        """Threads waiting to take their slot back (newcomers let them go first)."""
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

    def _chain(self) -> tuple[ConcurrencyLimiter, ...]:
        return self._limiters

    # -- the provider's signals ------------------------------------------------------

    def back_off(self, delay: float, *, rate_limited: bool) -> float:
        """A call failed and its caller waits `delay` before trying again.

        A rate limit pauses every caller that long (the latest pause wins) and
        halves the calls allowed in flight. Each one does: a provider limited by
        requests per second refuses a burst whatever the bound, and a pause's end
        frees little of it, so the bound drops fast and grows back by successes.

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
        if self.within is None:
            return self._resume_at
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

    def pausing(self) -> bool:
        """Whether a shared pause is on now (a caller would wait its turn)."""
        return self._remaining(None) > 0

    def _remaining(self, after: float | None) -> float:
        now = time.monotonic()
        # Not before `after`: a caller's own wait may run on another clock.
        return self.resume_at - (now if after is None else max(now, after))

    # -- slots ------------------------------------------------------------------------

    @contextmanager
    def hold(self) -> Iterator[Slot]:
        """Hold one slot (of each bound) in a thread, blocking until one is free."""
        slot = Slot(self)
        slot.take()
        try:
            yield slot
        finally:
            slot.give_back()

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[Slot]:
        """Hold one slot (of each bound) in the running event loop."""
        slot = Slot(self)
        await slot.atake()
        try:
            yield slot
        finally:
            slot.give_back()

    def _capacity(self) -> int:
        return self.allowed or 0

    def _acquire(self, *, returning: bool) -> None:
        """Take a slot of this limiter in a thread, waiting until one is free."""
        with self._freed:
            if returning:
                self._returning += 1
            try:
                while self._in_use >= self._capacity() or (
                    self._returning and not returning
                ):
                    self._freed.wait()
            finally:
                if returning:
                    self._returning -= 1
                    self._freed.notify_all()  # newcomers may be next
            self._in_use += 1

    async def _aacquire(self, *, returning: bool) -> None:
        """Take a slot of this limiter in the running event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            granted = self._in_use < self._capacity() and not self._waiting
            if granted:
                self._in_use += 1
            else:
                future: asyncio.Future[None] = loop.create_future()
                if returning:
                    self._waiting.appendleft((loop, future))
                else:
                    self._waiting.append((loop, future))
        if not granted:
            try:
                await future
            except asyncio.CancelledError:
                self._abandon(loop, future)
                raise

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


class Slot:
    """One caller's place under a limiter and the limiters it is within.

    `hold()` and `ahold()` take it and give it back when their block ends. In
    between, a caller backing off after a rate limit gives it back (`give_back`)
    and takes it again (`take`, `atake`) under the bound as it is then, ahead of
    callers that have not started: a judgment would otherwise keep its slot through
    its retries, and halving the bound would not lower the calls in flight.
    """

    def __init__(self, limiter: ConcurrencyLimiter) -> None:
        """A slot of `limiter` (and those it is within), not taken yet."""
        self._bounded = limiter._bounded  # noqa: SLF001 - the slot's own limiters
        self._held: list[ConcurrencyLimiter] = []
        self._taken_before = False

    @property
    def held(self) -> bool:
        """Whether the slot is held (of every bound)."""
        return len(self._held) == len(self._bounded)

    def take(self) -> None:
        """Take the slot in a thread, blocking until every bound has one free."""
        try:
            for limiter in self._bounded[len(self._held) :]:
                limiter._acquire(returning=self._taken_before)  # noqa: SLF001
                self._held.append(limiter)
        except BaseException:
            self.give_back()
            raise
        self._taken_before = True

    async def atake(self) -> None:
        """Take the slot in the running event loop (cancellation leaves none held)."""
        try:
            for limiter in self._bounded[len(self._held) :]:
                await limiter._aacquire(returning=self._taken_before)  # noqa: SLF001
                self._held.append(limiter)
        except BaseException:
            self.give_back()
            raise
        self._taken_before = True

    @property
    def over_bound(self) -> bool:
        """Whether more slots are taken than a bound allows now (it was lowered)."""
        return any(
            limiter._in_use > limiter._capacity()  # noqa: SLF001
            for limiter in self._bounded
        )

    def give_back(self) -> None:
        """Give back what is held (the shared bounds first); held again by `take`."""
        while self._held:
            self._held.pop()._release()  # noqa: SLF001
