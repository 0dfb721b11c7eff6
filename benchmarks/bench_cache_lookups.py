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
import contextvars
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from langchain_tag.cache import open_verdict_cache
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RULES = 55
QUERY = "The input carries trigger-003, trigger-017 and trigger-042."


_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)


def counted(store: Any) -> Counter[str]:
    """Count each call made to `store`'s reads and writes: one round trip each.

    Its methods are wrapped in place (not by `langchain_tag.testing.CountingStore`,
    which older checkouts measured with this script do not have); an async call
    that runs the sync one in a thread counts once.
    """
    calls: Counter[str] = Counter()

    def wrapped(method: Any, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not _INSIDE.get():
                calls[name] += 1
            return method(*args, **kwargs)

        return call

    def awrapped(method: Any, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            token = _INSIDE.set(True)
            try:
                return await method(*args, **kwargs)
            finally:
                _INSIDE.reset(token)

        return call

    for name in ("mget", "mset"):
        setattr(store, name, wrapped(getattr(store, name), name))
        setattr(store, f"a{name}", awrapped(getattr(store, f"a{name}"), name))
    return calls


def measure(location: str, repeats: int) -> dict[str, Any]:
    """Round trips and median seconds of a fully cached retrieval at `location`."""
    store = open_verdict_cache(location)
    calls = counted(store)
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=store)
    retriever = TAGRetriever(rulebook=trigger_rulebook(RULES), judge=judge)
    expected = [d.id for d in retriever.invoke(QUERY)]  # judged, then cached
    figures: dict[str, Any] = {}
    for path in ("sync", "async"):
        calls.clear()
        got = (
            asyncio.run(retriever.ainvoke(QUERY))
            if path == "async"
            else retriever.invoke(QUERY)
        )
        if [d.id for d in got] != expected:
            msg = "a cached retrieval returned other rules"
            raise RuntimeError(msg)
        trips = dict(calls)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            if path == "async":
                asyncio.run(retriever.ainvoke(QUERY))
            else:
                retriever.invoke(QUERY)
            seconds.append(time.perf_counter() - started)
        figures[path] = {
            "round_trips": sum(trips.values()),
            "calls": trips,
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
