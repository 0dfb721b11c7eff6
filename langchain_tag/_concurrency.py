"""A cap on in-flight LLM calls shared by every concurrent use of one object.

`Runnable.batch(max_concurrency=...)` bounds how many inputs run at once, but each
TAG retrieval fans out into many judgments of its own. The limiter bounds the calls
themselves, across a whole batch, in threads and in event loops alike.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager


class ConcurrencyLimiter:
    """Bound the number of simultaneous calls; `None` means unbounded.

    Threads share one semaphore. Each event loop gets its own asyncio semaphore,
    because asyncio primitives belong to the loop that first uses them.
    """

    def __init__(self, limit: int | None) -> None:
        """Create a limiter allowing at most `limit` calls at once."""
        if limit is not None and limit < 1:
            msg = f"max_concurrency must be a positive integer or None, got {limit}"
            raise ValueError(msg)
        self.limit = limit
        self._threads = threading.BoundedSemaphore(limit) if limit else None
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold one slot in a thread, blocking until one is free."""
        if self._threads is None:
            yield
            return
        with self._threads:
            yield

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Hold one slot in the running event loop, waiting until one is free."""
        if self.limit is None:
            yield
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            semaphore = self._loops.get(loop)
            if semaphore is None:
                semaphore = self._loops[loop] = asyncio.Semaphore(self.limit)
        async with semaphore:
            yield
