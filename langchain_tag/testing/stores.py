"""`CountingStore`: a key-value store that counts the round trips made to another."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence

from langchain_core.stores import BaseStore

__all__ = ["CountingStore"]


class CountingStore(BaseStore[str, str]):
    """Wraps any `BaseStore[str, str]` and counts each call made to it.

    One call is one round trip to the store (`calls["mget"]`, `calls["mset"]`, sync
    and async alike), which is what a verdict cache on a server costs: use it to
    check that a query reads its cached verdicts in one lookup.
    """

    def __init__(self, inner: BaseStore[str, str]) -> None:
        """Wrap `inner`."""
        self.inner = inner
        self.calls: Counter[str] = Counter()

    @property
    def round_trips(self) -> int:
        """Calls made so far, of every kind."""
        return sum(self.calls.values())

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        """Count, then read."""
        self.calls["mget"] += 1
        return self.inner.mget(keys)

    async def amget(self, keys: Sequence[str]) -> list[str | None]:
        """Count, then read."""
        self.calls["mget"] += 1
        return await self.inner.amget(keys)

    def mset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        """Count, then write."""
        self.calls["mset"] += 1
        self.inner.mset(key_value_pairs)

    async def amset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        """Count, then write."""
        self.calls["mset"] += 1
        await self.inner.amset(key_value_pairs)

    def mdelete(self, keys: Sequence[str]) -> None:
        """Count, then delete."""
        self.calls["mdelete"] += 1
        self.inner.mdelete(keys)

    async def amdelete(self, keys: Sequence[str]) -> None:
        """Count, then delete."""
        self.calls["mdelete"] += 1
        await self.inner.amdelete(keys)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """Count, then list."""
        self.calls["yield_keys"] += 1
        return self.inner.yield_keys(prefix=prefix)

    async def ayield_keys(self, *, prefix: str | None = None) -> AsyncIterator[str]:
        """Count, then list."""
        self.calls["yield_keys"] += 1
        async for key in self.inner.ayield_keys(prefix=prefix):
            yield key
