"""A cap on in-flight LLM calls shared by every concurrent use of one object.

`Runnable.batch(max_concurrency=...)` bounds how many inputs run at once, but each
TAG retrieval fans out into many judgments of its own. The limiter bounds the calls
themselves, across a whole batch, in threads and in event loops alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager


class ConcurrencyLimiter:
    """Bound the number of simultaneous calls; `None` means unbounded.

    One count of slots is shared by every caller: threads wait on a condition,
    coroutines (in any event loop) on a future that a releasing caller completes
    through the loop's thread-safe callback. A freed slot goes to a waiting
    coroutine first, else to a waiting thread.
    """

    def __init__(self, limit: int | None) -> None:
        """Create a limiter allowing at most `limit` calls at once."""
        if limit is not None and limit < 1:
            msg = f"max_concurrency must be a positive integer or None, got {limit}"
            raise ValueError(msg)
        self.limit = limit
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._in_use = 0
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        self._waiting = deque()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold one slot in a thread, blocking until one is free."""
        if self.limit is None:
            yield
            return
        with self._freed:
            while self._in_use >= self.limit:
                self._freed.wait()
            self._in_use += 1
        try:
            yield
        finally:
            self._release()

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Hold one slot in the running event loop, waiting until one is free."""
        if self.limit is None:
            yield
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            granted = self._in_use < self.limit and not self._waiting
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
            if self._waiting:
                # Hand the slot over without freeing it, so no newcomer jumps ahead.
                loop, future = self._waiting.popleft()
            else:
                self._in_use -= 1
                self._freed.notify()
                return
        loop.call_soon_threadsafe(self._grant, future)

    def _grant(self, future: asyncio.Future[None]) -> None:
        # Runs in the waiter's loop; a waiter cancelled meanwhile passes the slot on.
        if future.done():
            self._release()
        else:
            future.set_result(None)
