"""One process vs a local Ray pool: wall time and paid judgments of one bulk job.

The job: `--inputs` synthetic inputs x `--rules` trigger rules (`trigger_rulebook`),
match only, judged by `RuleAwareFakeChatModel` sleeping `--latency-ms` a call (a
stand-in for a provider's turnaround), each run with a fresh SQLite verdict cache:

1. local: `BulkJob.run` in this process (`--concurrency` inputs at once, the
   judge's default `max_concurrency` in flight).
2. ray: the same job with backend="ray", `--workers` actors on a local Ray
   started for the run (`ray.init(num_cpus=--workers)`) and stopped after, each
   actor with its own judge and the same bounds. Its start-up cost is measured
   apart: `ray.init` alone, and the time from the run's start to its first
   record (actors started, the job built in each).

Paid judgments are the pairs the judge answered (not from the cache), as the
runs' summaries count them, checked against the rows of each run's cache (the
only place every worker's verdicts meet). The outputs must hold the same records.

Run from the repository root:

    python benchmarks/bench_ray.py [--inputs 1000] [--rules 55] [--workers 2]

The exit status is 1 if the outputs differ or a pair was paid twice.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import _common

from langchain_tag.bulk import BulkInput, BulkJob, BulkSummary
from langchain_tag.cache import SQLiteVerdictCache
from langchain_tag.settings import MatchSettings
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook


def _job(
    rules: int,
    latency: float,
    cache: str,
    concurrency: int,
    backend: str = "local",
    workers: int | None = None,
) -> BulkJob:
    """The job; with backend="ray", also each worker's (its recipe)."""
    engine = MatchSettings(
        llm=RuleAwareFakeChatModel(latency=latency), cache=SQLiteVerdictCache(cache)
    ).build_engine()
    recipe = partial(_job, rules, latency, cache, concurrency, backend, workers)
    return BulkJob(
        engine,
        trigger_rulebook(rules).rules,
        concurrency=concurrency,
        backend="ray" if backend == "ray" else "local",
        workers=workers,
        recipe=recipe if backend == "ray" else None,
    )


def _cache_rows(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM verdicts").fetchone()
    return int(count)


def _records(path: Path) -> dict[str, dict[str, Any]]:
    return {
        json.dumps(record["id"]): record
        for record in map(json.loads, path.read_text().splitlines())
    }


def _run(
    args: Any, folder: Path, backend: str
) -> tuple[BulkSummary, float, float | None, int]:
    cache = folder / f"{backend}.sqlite"
    job = _job(
        args.rules,
        args.latency_ms / 1000,
        str(cache),
        args.concurrency,
        backend,
        args.workers if backend == "ray" else None,
    )
    inputs = [
        BulkInput(id=n, input=f"input {n}: trigger-{n % args.rules:03d}")
        for n in range(args.inputs)
    ]
    first: list[float] = []
    started = time.perf_counter()

    def progress(done: int, _total: int) -> None:
        if done == 1:
            first.append(time.perf_counter() - started)

    summary = job.run(inputs, folder / f"{backend}.jsonl", progress=progress)
    wall = time.perf_counter() - started
    job.close()
    return summary, wall, first[0] if first else None, _cache_rows(cache)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both, print the figures; 1 if the outputs differ or a pair was paid twice."""
    parser = _common.make_parser(__doc__, data=False, repeats_default=None)
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--rules", type=int, default=55)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--latency-ms", type=float, default=5.0, help="the fake judge's, per call"
    )
    args = _common.parse_arguments(parser, argv)

    import ray  # noqa: PLC0415 - the ray extra

    started = time.perf_counter()
    ray.init(
        num_cpus=args.workers, include_dashboard=False, logging_level=logging.WARNING
    )
    ray_init = time.perf_counter() - started
    ray.shutdown()

    pairs = args.inputs * args.rules
    print(
        f"{args.inputs} inputs x {args.rules} rules = {pairs:,} judgments, fake judge "
        f"{args.latency_ms:g} ms a call, {args.concurrency} inputs at once per engine"
    )
    figures: dict[str, Any] = {"pairs": pairs, "ray_init_seconds": ray_init}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = {}
        for backend in ("local", "ray"):
            summary, wall, first, cache_rows = _run(args, folder, backend)
            paid = summary.judgments - summary.cached
            rows[backend] = (wall, paid, cache_rows)
            figures[backend] = {
                "seconds": wall,
                "first_record_seconds": first,
                "paid": paid,
                "cache_rows": cache_rows,
                "workers": summary.workers,
            }
            who = "one process" if backend == "local" else f"{summary.workers} workers"
            print(
                f"  {backend:<5} ({who}): {wall:6.1f} s; paid {paid:,} judgments "
                f"({cache_rows:,} rows in its cache); first record after "
                f"{first or 0:.1f} s"
            )
        same = _records(folder / "local.jsonl") == _records(folder / "ray.jsonl")
    ratio = rows["local"][0] / rows["ray"][0]
    figures |= {"ratio": ratio, "same_output": same}
    print(f"  speed-up (local / ray): {ratio:.2f}x")
    print(
        f"  ray start-up: ray.init {ray_init:.1f} s alone; a run's first record after "
        f"{figures['ray']['first_record_seconds'] or 0:.1f} s (init, actors, each "
        "building its job)"
    )
    print(f"  same output: {same}")
    if args.json is not None:
        _common.write_json(args.json, figures)
    twice = any(paid != cache_rows for _, paid, cache_rows in rows.values())
    return 0 if same and not twice and rows["local"][1] == pairs else 1


if __name__ == "__main__":
    logging.getLogger("ray").setLevel(logging.WARNING)
    sys.exit(main())
