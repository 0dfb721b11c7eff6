"""Load, at a scale fit for CI: rate limits, flat memory, a cache shared by processes.

`benchmarks/bench_load.py` measures the same properties at full scale (thousands of
judgments, 10,000 queries, 4 processes) and prints the figures; these tests assert
them small and fast.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

from langchain_core.rate_limiters import InMemoryRateLimiter

from langchain_tag import TAGRetriever
from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from tests.reliability.report import ReliabilityReport


def test_a_rate_limiter_is_honoured_across_a_batch(
    reliability_report: ReliabilityReport,
) -> None:
    rate, rules, queries = 500.0, 20, 10
    limiter = InMemoryRateLimiter(
        requests_per_second=rate, check_every_n_seconds=0.0005, max_bucket_size=1
    )
    model = RuleAwareFakeChatModel(rate_limiter=limiter)
    retriever = TAGRetriever(
        rulebook=trigger_rulebook(rules),
        judge=ApplicabilityJudge(llm=model, cache=None),
        max_concurrency=8,
    )
    retriever.batch([f"query {i} trigger-00{i % 5}" for i in range(queries)])
    times = model.call_times
    assert len(times) == rules * queries
    measured = (len(times) - 1) / (times[-1] - times[0])
    # A bucket of one token: no burst, so no faster than the limit on average
    # (with a margin for when the threads note the time).
    assert measured <= rate * 1.05
    reliability_report.add_figure(
        "rate limiter (CI scale)",
        f"{len(times)} judgments through TAGRetriever.batch under "
        f"InMemoryRateLimiter({rate:.0f}/s): {measured:.0f}/s measured",
    )


def test_memory_stays_flat_over_2000_queries(
    reliability_report: ReliabilityReport,
) -> None:
    cache = InMemoryVerdictCache(maxsize=500)
    model = RuleAwareFakeChatModel()
    retriever = TAGRetriever(
        rulebook=trigger_rulebook(2),
        judge=ApplicabilityJudge(llm=model, cache=cache),
        max_concurrency=2,
    )

    def blocks() -> int:
        model.reset()  # the fake's own record of prompts is test state, not ours
        gc.collect()
        return sys.getallocatedblocks()

    for i in range(300):  # warm up: caches and lazy imports fill here
        retriever.invoke(f"warm-up {i} trigger-000")
    start = blocks()
    samples = []
    for i in range(2000):
        retriever.invoke(f"query {i} trigger-001")  # every query new: no cache hits
        if i % 500 == 499:
            samples.append(blocks() - start)
    assert len(cache) == cache.maxsize  # the verdict cache stays bounded
    # Per-query state would grow by thousands of blocks; allow allocator noise.
    assert max(samples) < 2000, samples
    reliability_report.add_figure(
        "memory (CI scale)",
        "2,000 queries through TAGRetriever, LRU cache of 500: allocated blocks "
        f"vs. after warm-up at 500/1000/1500/2000 queries: {samples}",
    )


_CACHE_WORKER = textwrap.dedent(
    """
    import random
    import sys
    from langchain_tag.matching import ApplicabilityJudge
    from langchain_tag.cache import SQLiteVerdictCache
    from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

    path, worker = sys.argv[1], int(sys.argv[2])
    rules = trigger_rulebook(10).rules
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(),
                               cache=SQLiteVerdictCache(path, timeout=60))
    # Every worker judges every pair, in its own order: the same keys are written
    # and read by all of them at once.
    pairs = [
        (f"query {q} trigger-{q % 10:03d}", rule) for q in range(30) for rule in rules
    ]
    order = list(pairs)
    random.Random(worker).shuffle(order)
    for text, rule in order:
        verdict = judge.invoke((text, rule))
        expected = rule.condition.split("`")[1] in text
        assert verdict.applies is expected, (text, rule.rule_id)
    print(sum(judge.invoke((t, r)).cached for t, r in pairs))
    """
)


def test_one_sqlite_verdict_cache_for_four_processes(
    tmp_path: Path, reliability_report: ReliabilityReport
) -> None:
    path = tmp_path / "verdicts.sqlite"
    workers = [
        subprocess.Popen(  # noqa: S603 - our own interpreter and code
            [sys.executable, "-c", _CACHE_WORKER, str(path), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    outputs = [worker.communicate(timeout=120) for worker in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
        assert "database is locked" not in err
        assert out.strip() == "300"  # afterwards every pair is a cache hit
    cache = SQLiteVerdictCache(path)
    assert len(cache) == 300  # one row per (input, rule), whoever wrote it first
    reliability_report.add_figure(
        "SQLite verdict cache (CI scale)",
        "4 processes judging the same 300 pairs in different orders on one file: "
        "300 rows, every verdict right, no 'database is locked'",
    )
