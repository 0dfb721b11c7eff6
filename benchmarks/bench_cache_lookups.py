"""Benchmark: store round trips and time of a fully cached query.

A 55-rule rulebook (the size of the NBA task) is judged once into a verdict cache,
then the same query is asked again: every verdict comes from the cache, so the
retrieval's cost is the lookups. The store is wrapped in a proxy that counts its
calls (`mget`, `mset`, ...), one call being one round trip to the store; the time
is the median of `--repeats` cached retrievals, sync and async. The judge is
`RuleAwareFakeChatModel` (a stand-in, not a model); after the first retrieval it is
never called.

Stores: a fresh SQLite file, and PostgreSQL when `--postgres URI` (or
`TAG_TEST_POSTGRES_URI`, as `eval "$(bash scripts/postgres start)"` sets) is given.

It uses only APIs older versions have too, so the same script measures an older
checkout back to back (`PYTHONPATH=<checkout> python <this script>`).

    python benchmarks/bench_cache_lookups.py [--repeats 20] [--postgres URI]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.stores import BaseStore

from langchain_tag.cache import open_verdict_cache
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RULES = 55
QUERY = "The input carries trigger-003, trigger-017 and trigger-042."


class CountingStore(BaseStore[str, str]):
    """A store that counts each call to the store it wraps: one round trip each."""

    def __init__(self, inner: BaseStore[str, str]) -> None:
        """Wrap `inner`."""
        self.inner = inner
        self.calls: Counter[str] = Counter()

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

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """Count, then list."""
        self.calls["yield_keys"] += 1
        return self.inner.yield_keys(prefix=prefix)


def measure(location: str, repeats: int) -> dict[str, Any]:
    """Round trips and median seconds of a fully cached retrieval at `location`."""
    store = CountingStore(open_verdict_cache(location))
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=store)
    retriever = TAGRetriever(rulebook=trigger_rulebook(RULES), judge=judge)
    expected = [d.id for d in retriever.invoke(QUERY)]  # judged, then cached
    figures: dict[str, Any] = {}
    for path in ("sync", "async"):
        store.calls.clear()
        got = (
            asyncio.run(retriever.ainvoke(QUERY))
            if path == "async"
            else retriever.invoke(QUERY)
        )
        if [d.id for d in got] != expected:
            msg = "a cached retrieval returned other rules"
            raise RuntimeError(msg)
        calls = dict(store.calls)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            if path == "async":
                asyncio.run(retriever.ainvoke(QUERY))
            else:
                retriever.invoke(QUERY)
            seconds.append(time.perf_counter() - started)
        figures[path] = {
            "round_trips": sum(calls.values()),
            "calls": calls,
            "median_ms": 1000 * statistics.median(seconds),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    """Measure each store; print one line per store and path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--postgres", default=os.environ.get("TAG_TEST_POSTGRES_URI") or None
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stores = {"sqlite": str(Path(tmp) / "cache.sqlite")}
        if args.postgres:
            stores["postgresql"] = args.postgres
        print(f"fully cached query, {RULES} rules; median of {args.repeats} runs")
        for name, location in stores.items():
            for path, found in measure(location, args.repeats).items():
                print(
                    f"  {name:<10} {path:<5} {found['round_trips']:>3} store round "
                    f"trip(s) {found['calls']}, {found['median_ms']:.2f} ms"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
