"""Benchmark of pairwise applicability matching: concurrency and framework overhead.

What it measures, with `RuleAwareFakeChatModel` standing in for the chat model (it
answers after a fixed simulated latency L, so no network and no real model):

1. Concurrency. For M=200 rules and `max_concurrency` C in {1, 8, 32} with L=50 ms,
   the wall time of one retrieval, async (`await retriever.ainvoke(query)`) and sync
   (`retriever.invoke(query)`), against the ideal ceil(M/C)·L, and the fake's peak
   number of in-flight calls (which must not exceed C).
2. Overhead. With L=0, the time per judgment of whole retrievals (C=32), next to
   the bare cost of one `RuleAwareFakeChatModel().ainvoke(messages)` /
   `.invoke(messages)`: langchain-core's own chat-model invocation machinery plus the
   fake's prompt parsing. "ours" is the difference. The heap the process holds
   after the warm-up (imports, the rulebook) is frozen (`gc.freeze`) while timing:
   else whether one full collection of it (~50 ms here) lands in a 0.35 s window
   decides the figure (50 us a judgment), and its cost grows with whatever the
   application imported, not with TAG's work. The collector's pauses while timing
   are printed apart.
3. The share of prompt characters that the 200 judgments of the query have in common
   (`ApplicabilityJudge.prefix_share`).

Every measurement uses a fresh retriever and a fresh judge with `cache=None`, so no
verdict is served from a cache. One warm-up retrieval (L=0) runs first and is not
counted. C=1 is timed once per path (10 s each); C=8 and C=32 take the best of
`--repeats` runs.

Targets (from the issue): wall/ideal within 1.15x at C=32, L=50 ms, and under 1 ms of
overhead per judgment.

Run from the repository root:

    python benchmarks/bench_matching.py [--repeats 3] [--json results.json]

The exit status is 1 if the fake ever saw more than C calls in flight or a retrieval
returned the wrong rules; missed targets are reported as FAIL but do not change it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import _common
from langchain_core.documents import Document

from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rule, Rulebook
from langchain_tag.testing import RuleAwareFakeChatModel

M = 200
LATENCY = 0.05
CONCURRENCIES = (1, 8, 32)
PATHS = ("async", "sync")
"""How a retrieval is called: `await retriever.ainvoke` or `retriever.invoke`."""
TARGET_C = 32
TARGET_RATIO = 1.15
TARGET_OVERHEAD_MS = 1.0
OVERHEAD_REPEATS = 5
BARE_CALLS = 2000

APPLICABLE = (17, 42, 108, 150, 199)
"""Rules whose trigger the query mentions (triggers are zero-padded, so `token_017`
never matches inside another token)."""

QUERY = (
    "Incident report: the nightly job failed while reading token_017 and token_042 "
    "from the cache; token_108 was rotated, token_150 expired during the run, and "
    "token_199 was never issued. Please review the configuration and advise."
)


@dataclass
class Run:
    """One timed retrieval."""

    path: str
    concurrency: int
    latency_s: float
    wall_s: float
    cpu_s: float
    peak_in_flight: int
    matched: list[str]


@dataclass
class ConcurrencyRow:
    """The best run of one (path, C) at latency L, against the ideal."""

    path: str
    concurrency: int
    runs: int
    wall_s: float
    ideal_s: float
    ratio: float
    peak_in_flight: int
    max_peak_in_flight: int


@dataclass
class OverheadRow:
    """Per-judgment cost with L=0, and the bare model call it contains."""

    path: str
    judgments: int
    per_judgment_ms: float
    cpu_per_judgment_ms: float
    bare_model_call_ms: float
    ours_ms: float
    gc_ms: float
    """The garbage collector's pauses during the timed retrievals, per judgment."""


def rule_id(index: int) -> str:
    """The id of rule number `index`.

    Args:
        index: The rule's position, 0-based.

    Returns:
        The rule id, e.g. `R-017`.
    """
    return f"R-{index:03d}"


def build_rulebook(size: int = M) -> Rulebook:
    """Build `size` distinct rules, each triggered by one backtick-quoted token.

    Args:
        size: Number of rules.

    Returns:
        The rulebook; rule `i` applies to inputs that mention `token_{i:03d}`.
    """
    rules = [
        Rule(
            rule_id=rule_id(i),
            name=f"Handle credential token {i:03d}",
            condition=f"The input mentions `token_{i:03d}`",
            action=f"Rotate credential token_{i:03d} and notify its owner.",
            tags=("credentials", f"group-{i % 10}"),
        )
        for i in range(size)
    ]
    return Rulebook.from_rules(rules)


def make_retriever(
    rulebook: Rulebook, latency: float, concurrency: int
) -> tuple[RuleAwareFakeChatModel, TAGRetriever]:
    """A fresh fake model and a fresh uncached retriever over `rulebook`.

    Args:
        rulebook: The rules to judge.
        latency: Seconds each fake model call takes.
        concurrency: The retriever's `max_concurrency`.

    Returns:
        The fake (to read `peak_in_flight`) and the retriever.
    """
    fake = RuleAwareFakeChatModel(latency=latency)
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=ApplicabilityJudge(llm=fake, cache=None),
        max_concurrency=concurrency,
    )
    return fake, retriever


@dataclass
class Timing:
    """Wall and CPU seconds of a timed block, set when the block ends."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def timing() -> Iterator[Timing]:
    """Time the `with` block: wall clock and process CPU time (all threads).

    Yields:
        The timing, filled in when the block ends.
    """
    measured = Timing()
    cpu_started = time.process_time()
    started = time.perf_counter()
    yield measured
    measured.wall_s = time.perf_counter() - started
    measured.cpu_s = time.process_time() - cpu_started


def run_retrieval(
    path: str, rulebook: Rulebook, latency: float, concurrency: int
) -> Run:
    """Time one retrieval of QUERY on a fresh retriever.

    The async path times `await retriever.ainvoke(QUERY)` inside the event loop, so
    starting the loop is not counted; the sync path times `retriever.invoke(QUERY)`.

    Args:
        path: "async" or "sync".
        rulebook: The rules to judge.
        latency: Seconds each fake model call takes.
        concurrency: The retriever's `max_concurrency`.

    Returns:
        The timed run.
    """
    fake, retriever = make_retriever(rulebook, latency, concurrency)

    async def retrieve_async() -> tuple[Timing, list[Document]]:
        with timing() as timed:
            documents = await retriever.ainvoke(QUERY)
        return timed, documents

    if path == "async":
        timed, documents = asyncio.run(retrieve_async())
    else:
        with timing() as timed:
            documents = retriever.invoke(QUERY)
    return Run(
        path=path,
        concurrency=concurrency,
        latency_s=latency,
        wall_s=timed.wall_s,
        cpu_s=timed.cpu_s,
        peak_in_flight=fake.peak_in_flight,
        matched=[str(doc.id) for doc in documents],
    )


def sleep_ms(latency: float = LATENCY, samples: int = 20) -> dict[str, float]:
    """How long the fake's sleeps really take here: the floor under every wall time.

    Args:
        latency: The requested sleep, in seconds.
        samples: Sleeps timed per kind.

    Returns:
        `{"time.sleep": ms, "asyncio.sleep": ms}`, the mean of each.
    """
    started = time.perf_counter()
    for _ in range(samples):
        time.sleep(latency)
    blocking = time.perf_counter() - started

    async def async_sleeps() -> float:
        started = time.perf_counter()
        for _ in range(samples):
            await asyncio.sleep(latency)
        return time.perf_counter() - started

    non_blocking = asyncio.run(async_sleeps())
    return {
        "time.sleep": blocking / samples * 1e3,
        "asyncio.sleep": non_blocking / samples * 1e3,
    }


def measure_concurrency(
    rulebook: Rulebook, repeats: int, all_runs: list[Run]
) -> list[ConcurrencyRow]:
    """Wall time against ceil(M/C)·L for every C and both paths.

    Args:
        rulebook: The rules to judge.
        repeats: Runs per (path, C) for C > 1; the best one is reported.
        all_runs: Every run is appended here, for the correctness checks.

    Returns:
        One row per (C, path).
    """
    rows = []
    for concurrency in CONCURRENCIES:
        ideal = math.ceil(len(rulebook) / concurrency) * LATENCY
        runs_wanted = 1 if concurrency == 1 else repeats
        for path in PATHS:
            runs = [
                run_retrieval(path, rulebook, LATENCY, concurrency)
                for _ in range(runs_wanted)
            ]
            all_runs.extend(runs)
            best = min(runs, key=lambda run: run.wall_s)
            rows.append(
                ConcurrencyRow(
                    path=path,
                    concurrency=concurrency,
                    runs=runs_wanted,
                    wall_s=best.wall_s,
                    ideal_s=ideal,
                    ratio=best.wall_s / ideal,
                    peak_in_flight=best.peak_in_flight,
                    max_peak_in_flight=max(run.peak_in_flight for run in runs),
                )
            )
    return rows


def bare_model_call_ms(rulebook: Rulebook, calls: int = BARE_CALLS) -> dict[str, float]:
    """Milliseconds per bare `RuleAwareFakeChatModel` call on a judge prompt.

    Args:
        rulebook: Supplies the rule whose judge prompt is sent.
        calls: Number of calls timed per path.

    Returns:
        `{"async": ms, "sync": ms}`.
    """
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None)
    messages = judge.messages(QUERY, rulebook.rules[0])

    async def async_calls() -> float:
        model = RuleAwareFakeChatModel()
        await model.ainvoke(messages)  # warm-up
        started = time.perf_counter()
        for _ in range(calls):
            await model.ainvoke(messages)
        return time.perf_counter() - started

    model = RuleAwareFakeChatModel()
    model.invoke(messages)  # warm-up
    started = time.perf_counter()
    for _ in range(calls):
        model.invoke(messages)
    sync_s = time.perf_counter() - started
    async_s = asyncio.run(async_calls())
    return {"async": async_s / calls * 1e3, "sync": sync_s / calls * 1e3}


def measure_overhead(rulebook: Rulebook, all_runs: list[Run]) -> list[OverheadRow]:
    """Per-judgment time of whole retrievals with L=0, C=32, and its parts.

    Args:
        rulebook: The rules to judge.
        all_runs: Every run is appended here, for the correctness checks.

    Returns:
        One row per path.
    """
    with _frozen_heap() as paused:
        bare = bare_model_call_ms(rulebook)
        return [_overhead_row(path, rulebook, bare, paused, all_runs) for path in PATHS]


@contextmanager
def _frozen_heap() -> Iterator[list[float]]:
    """The warm heap frozen; yields a list the collector's pauses (s) are added to."""
    paused: list[float] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        del info
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            paused.append(time.perf_counter() - started[0])

    gc.collect()
    gc.freeze()
    gc.callbacks.append(timed)
    try:
        yield paused
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()


def _overhead_row(
    path: str,
    rulebook: Rulebook,
    bare: dict[str, float],
    paused: list[float],
    all_runs: list[Run],
) -> OverheadRow:
    paused.clear()
    runs = [
        run_retrieval(path, rulebook, 0.0, TARGET_C) for _ in range(OVERHEAD_REPEATS)
    ]
    gc_s = sum(paused)
    all_runs.extend(runs)
    judgments = OVERHEAD_REPEATS * len(rulebook)
    per_judgment = sum(run.wall_s for run in runs) / judgments * 1e3
    return OverheadRow(
        path=path,
        judgments=judgments,
        per_judgment_ms=per_judgment,
        cpu_per_judgment_ms=sum(run.cpu_s for run in runs) / judgments * 1e3,
        bare_model_call_ms=bare[path],
        ours_ms=per_judgment - bare[path],
        gc_ms=gc_s / judgments * 1e3,
    )


def print_report(
    concurrency: list[ConcurrencyRow],
    sleeps: dict[str, float],
    overhead: list[OverheadRow],
    prefix_share: float,
    targets: dict[str, dict[str, Any]],
) -> None:
    """Print the tables.

    Args:
        concurrency: Rows of the latency section.
        sleeps: Measured duration of the fake's sleep, per kind.
        overhead: Rows of the overhead section.
        prefix_share: The query's shared-prefix share over the rules.
        targets: Target name -> value, unit, goal and pass flag.
    """
    print(
        f"TAG pairwise matching benchmark: M={M} rules, the query makes "
        f"{len(APPLICABLE)} apply;\nRuleAwareFakeChatModel, verdict cache off, "
        "fresh retriever per run.\n"
    )

    print(f"1. Concurrency, L = {LATENCY * 1e3:.0f} ms per call")
    header = (
        f"{'path':<6} {'C':>3} {'runs':>4} {'wall (s)':>9} {'ideal (s)':>9} "
        f"{'wall/ideal':>10} {'peak in flight':>14}"
    )
    print(header)
    print("-" * len(header))
    for row in concurrency:
        peak = row.max_peak_in_flight
        flag = (
            ""
            if peak == row.concurrency
            else (" (> C!)" if peak > row.concurrency else " (< C)")
        )
        print(
            f"{row.path:<6} {row.concurrency:>3} {row.runs:>4} {row.wall_s:>9.3f} "
            f"{row.ideal_s:>9.3f} {row.ratio:>9.3f}x {peak:>14}{flag}"
        )
    print("(wall: best of the runs; peak: highest over the runs)")
    print(
        f"(timer check: a {LATENCY * 1e3:.0f} ms sleep takes "
        f"{sleeps['asyncio.sleep']:.2f} ms (asyncio.sleep) / "
        f"{sleeps['time.sleep']:.2f} ms (time.sleep) here)\n"
    )

    print(f"2. Overhead, L = 0, C = {TARGET_C}, {OVERHEAD_REPEATS} retrievals per path")
    header = (
        f"{'path':<6} {'judgments':>9} {'per judgment':>13} {'(CPU)':>9} "
        f"{'bare model call':>16} {'ours':>10} {'gc pauses':>10}"
    )
    print(header)
    print("-" * len(header))
    for o_row in overhead:
        print(
            f"{o_row.path:<6} {o_row.judgments:>9} "
            f"{o_row.per_judgment_ms * 1e3:>10.0f} us "
            f"{o_row.cpu_per_judgment_ms * 1e3:>6.0f} us "
            f"{o_row.bare_model_call_ms * 1e3:>13.0f} us {o_row.ours_ms * 1e3:>7.0f} us"
            f" {o_row.gc_ms * 1e3:>7.0f} us"
        )
    print(
        "(per judgment: wall time of the retrievals / judgments; CPU: process time\n"
        " of all threads. bare model call: RuleAwareFakeChatModel().ainvoke/.invoke(\n"
        " messages), i.e. langchain-core's chat-model machinery plus the fake's\n"
        " prompt parsing, wall. ours = per judgment - bare model call. The warm\n"
        " heap is frozen while timing; gc pauses: the collector's, per judgment.)\n"
    )

    print(f"3. Prompt shared-prefix share over the {M} judgments: {prefix_share:.1%}\n")

    _common.print_targets(targets)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(
        __doc__, data=False, repeats_help="runs per (path, C) for C > 1"
    )
    return _common.parse_arguments(parser, argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on `argv` (`sys.argv[1:]` when None); print the report.

    Returns:
        The exit status: 1 if the concurrency cap was exceeded or a retrieval
        returned the wrong rules, else 0.
    """
    args = parse_args(argv)
    rulebook = build_rulebook()
    expected = [rule_id(i) for i in APPLICABLE]

    # Warm-up: imports, lazy initialisation in langchain-core, first-call caches.
    for path in PATHS:
        run_retrieval(path, rulebook, 0.0, TARGET_C)

    all_runs: list[Run] = []
    concurrency = measure_concurrency(rulebook, args.repeats, all_runs)
    sleeps = sleep_ms()
    overhead = measure_overhead(rulebook, all_runs)
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None)
    prefix_share = judge.prefix_share(QUERY, rulebook.rules)

    targets: dict[str, dict[str, Any]] = {}
    for row in concurrency:
        if row.concurrency == TARGET_C:
            targets[f"{row.path} wall/ideal, C={TARGET_C}, L=50 ms"] = {
                "value": row.ratio,
                "unit": "x",
                "goal": f"<= {TARGET_RATIO}",
                "pass": row.ratio <= TARGET_RATIO,
            }
    for o_row in overhead:
        targets[f"{o_row.path} overhead per judgment"] = {
            "value": o_row.per_judgment_ms,
            "unit": "ms",
            "goal": f"< {TARGET_OVERHEAD_MS}",
            "pass": o_row.per_judgment_ms < TARGET_OVERHEAD_MS,
        }

    print_report(concurrency, sleeps, overhead, prefix_share, targets)

    problems = [
        f"{run.path} C={run.concurrency}: peak in flight {run.peak_in_flight} > C"
        for run in all_runs
        if run.peak_in_flight > run.concurrency
    ] + [
        f"{run.path} C={run.concurrency} L={run.latency_s}: matched {run.matched}, "
        f"expected {expected}"
        for run in all_runs
        if run.matched != expected
    ]
    for problem in problems:
        print(f"ERROR: {problem}", file=sys.stderr)

    if args.json is not None:
        figures = {
            "rules": M,
            "latency_s": LATENCY,
            "measured_sleep_ms": sleeps,
            "concurrency": [asdict(row) for row in concurrency],
            "overhead": [asdict(row) for row in overhead],
            "prefix_share": prefix_share,
            "targets": targets,
            "problems": problems,
        }
        _common.write_json(args.json, figures)
        print(f"\nFigures written to {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
