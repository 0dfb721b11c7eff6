"""Load benchmark: a rate limiter, memory over 10,000 queries, a shared SQLite cache.

What it measures, with `RuleAwareFakeChatModel` standing in for the chat model:

1. Rate limit. 5,000 judgments (50 rules x 100 queries) through
   `TAGRetriever.batch` with `max_concurrency` 16, the model carrying a
   `langchain_core.rate_limiters.InMemoryRateLimiter` of 500 requests/s (bucket of
   one): the measured rate, overall and in the busiest second, which must not
   exceed the limit.
2. Memory. 10,000 queries (5 rules each) through one `TAGRetriever`, with no verdict
   cache and with an LRU cache of 5,000: Python-allocated memory (tracemalloc) and
   RSS every 1,000 queries, and the slope of a least-squares line through the
   samples after the first (KiB per 1,000 queries). Flat means a slope near zero
   once the LRU cache is full. The fake's own record of prompts is cleared at each
   sample: it is test state, not the library's.
3. SQLite verdict cache. 4 processes judge the same 2,000 (input, rule) pairs, each
   in its own order, through `ApplicabilityJudge` on one `SQLiteVerdictCache` file:
   wall time, rows at the end, verdicts that disagree with the expected answer, and
   `database is locked` errors (all must be 2,000, 0 and 0).

Run from the repository root:

    python benchmarks/bench_load.py [--queries 10000] [--json results.json]

The exit status is 1 if the rate was exceeded, a verdict was wrong, a row was
missing or a lock error occurred.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common
from langchain_core.rate_limiters import InMemoryRateLimiter

from langchain_tag import TAGRetriever
from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RATE = 500.0
RATE_RULES, RATE_QUERIES, RATE_CONCURRENCY = 50, 100, 16
MEMORY_RULES, SAMPLE_EVERY, LRU_SIZE = 5, 1000, 5000
PROCESSES, CACHE_QUERIES, CACHE_RULES = 4, 200, 10


def rate_limit() -> dict[str, Any]:
    """Figures of 1: judgments under the rate limiter."""
    limiter = InMemoryRateLimiter(
        requests_per_second=RATE, check_every_n_seconds=0.0005, max_bucket_size=1
    )
    model = RuleAwareFakeChatModel(rate_limiter=limiter)
    retriever = TAGRetriever(
        rulebook=trigger_rulebook(RATE_RULES),
        judge=ApplicabilityJudge(llm=model, cache=None),
        max_concurrency=RATE_CONCURRENCY,
    )
    queries = [f"query {q} trigger-{q % RATE_RULES:03d}" for q in range(RATE_QUERIES)]
    started = time.perf_counter()
    results = retriever.batch(queries)
    wall = time.perf_counter() - started
    times = model.call_times
    busiest, first = 0, 0
    for last, now in enumerate(times):
        while now - times[first] >= 1.0:
            first += 1
        busiest = max(busiest, last - first + 1)
    right = all(
        [d.id for d in docs] == [f"R-{q % RATE_RULES:03d}"]
        for q, docs in enumerate(results)
    )
    return {
        "judgments": len(times),
        "limit_per_s": RATE,
        "measured_per_s": (len(times) - 1) / (times[-1] - times[0]),
        "busiest_second": busiest,
        "wall_s": wall,
        "documents_right": right,
    }


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / (
        spread or 1.0
    )


def _rss_kib() -> int:
    # ru_maxrss is the peak (KiB on Linux); the current size is in /proc if present.
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory(queries: int, cache_size: int | None) -> dict[str, Any]:
    """Figures of 2 for one cache setting (None: no cache)."""
    model = RuleAwareFakeChatModel()
    cache = None if cache_size is None else InMemoryVerdictCache(maxsize=cache_size)
    retriever = TAGRetriever(
        rulebook=trigger_rulebook(MEMORY_RULES),
        judge=ApplicabilityJudge(llm=model, cache=cache),
        max_concurrency=MEMORY_RULES,
    )
    for q in range(200):  # warm-up: lazy imports and module caches fill here
        retriever.invoke(f"warm-up {q} trigger-000")
    tracemalloc.start()
    samples: list[tuple[int, float, int]] = []
    started = time.perf_counter()
    for q in range(1, queries + 1):
        retriever.invoke(f"query {q} trigger-{q % MEMORY_RULES:03d}")
        if q % SAMPLE_EVERY == 0:
            model.reset()
            current, _ = tracemalloc.get_traced_memory()
            samples.append((q, current / 1024, _rss_kib()))
    wall = time.perf_counter() - started
    tracemalloc.stop()
    later = samples[1:]
    per_thousand = 1000 / SAMPLE_EVERY
    return {
        "cache": "none" if cache_size is None else f"LRU {cache_size}",
        "queries": queries,
        "wall_s": wall,
        "traced_kib": [round(kib) for _, kib, _ in samples],
        "rss_kib": [rss for _, _, rss in samples],
        "traced_slope_kib_per_1000": _slope(
            [q / SAMPLE_EVERY for q, _, _ in later], [kib for _, kib, _ in later]
        )
        / per_thousand,
        "rss_slope_kib_per_1000": _slope(
            [q / SAMPLE_EVERY for q, _, _ in later], [rss for _, _, rss in later]
        )
        / per_thousand,
        "cache_entries": None if cache is None else len(cache),
    }


_CACHE_WORKER = textwrap.dedent(
    """
    import random
    import sqlite3
    import sys
    from langchain_tag import SQLiteVerdictCache
    from langchain_tag.matching import ApplicabilityJudge
    from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

    path, worker, queries, n_rules = sys.argv[1], *map(int, sys.argv[2:5])
    rules = trigger_rulebook(n_rules).rules
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(),
                               cache=SQLiteVerdictCache(path, timeout=60))
    pairs = [(f"query {q} trigger-{q % n_rules:03d}", r)
             for q in range(queries) for r in rules]
    random.Random(worker).shuffle(pairs)
    wrong = locked = 0
    for text, rule in pairs:
        try:
            verdict = judge.invoke((text, rule))
        except sqlite3.OperationalError as error:
            locked += "locked" in str(error)
            continue
        wrong += verdict.applies is not (rule.condition.split("`")[1] in text)
    print(wrong, locked)
    """
)


def shared_cache() -> dict[str, Any]:
    """Figures of 3: processes on one SQLite verdict cache."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "verdicts.sqlite"
        started = time.perf_counter()
        workers = [
            subprocess.Popen(  # noqa: S603 - our own interpreter and code
                [
                    sys.executable,
                    "-c",
                    _CACHE_WORKER,
                    *map(str, (path, n, CACHE_QUERIES, CACHE_RULES)),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(PROCESSES)
        ]
        outputs = [worker.communicate(timeout=600) for worker in workers]
        wall = time.perf_counter() - started
        wrong = locked = failed = 0
        for worker, (out, err) in zip(workers, outputs, strict=True):
            if worker.returncode != 0:
                failed += 1
                print(err, file=sys.stderr)
                continue
            worker_wrong, worker_locked = map(int, out.split())
            wrong += worker_wrong
            locked += worker_locked + err.count("database is locked")
        rows = len(SQLiteVerdictCache(path))
    return {
        "processes": PROCESSES,
        "pairs": CACHE_QUERIES * CACHE_RULES,
        "judgments": PROCESSES * CACHE_QUERIES * CACHE_RULES,
        "wall_s": wall,
        "rows": rows,
        "wrong_verdicts": wrong,
        "locked_errors": locked,
        "failed_processes": failed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and print the figures."""
    parser = _common.make_parser(__doc__, data=False, repeats_default=None)
    parser.add_argument(
        "--queries", type=int, default=10_000, help="queries for the memory runs"
    )
    args = _common.parse_arguments(parser, argv)

    rate = rate_limit()
    print(
        f"1. Rate limit: {rate['judgments']} judgments through TAGRetriever.batch "
        f"(max_concurrency {RATE_CONCURRENCY}) under InMemoryRateLimiter("
        f"{RATE:.0f}/s): {rate['measured_per_s']:.1f}/s measured, busiest second "
        f"{rate['busiest_second']} calls, {rate['wall_s']:.1f} s; documents right: "
        f"{rate['documents_right']}"
    )
    runs = [memory(args.queries, size) for size in (None, LRU_SIZE)]
    print(f"\n2. Memory over {args.queries} queries ({MEMORY_RULES} rules each):")
    for run in runs:
        print(
            f"   cache {run['cache']:<9} {run['wall_s']:6.1f} s; traced KiB "
            f"{run['traced_kib']}; slope {run['traced_slope_kib_per_1000']:+.1f} "
            f"KiB/1000 queries; RSS slope {run['rss_slope_kib_per_1000']:+.1f} "
            f"KiB/1000 (RSS {run['rss_kib'][0]}..{run['rss_kib'][-1]} KiB); "
            f"cache entries {run['cache_entries']}"
        )
    cache = shared_cache()
    print(
        f"\n3. SQLite verdict cache: {cache['processes']} processes x "
        f"{cache['pairs']} pairs in {cache['wall_s']:.1f} s: {cache['rows']} rows, "
        f"{cache['wrong_verdicts']} wrong verdicts, {cache['locked_errors']} "
        f"'database is locked', {cache['failed_processes']} failed processes"
    )
    if args.json:
        _common.write_json(args.json, {"rate": rate, "memory": runs, "cache": cache})
    ok = (
        rate["measured_per_s"] <= RATE * 1.01
        and rate["busiest_second"] <= RATE + 1
        and rate["documents_right"]
        and cache["rows"] == cache["pairs"]
        and cache["wrong_verdicts"] == cache["locked_errors"] == 0
        and cache["failed_processes"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
