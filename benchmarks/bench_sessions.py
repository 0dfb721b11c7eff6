"""Benchmark: PostgreSQL sessions opened by 10 retrievals with PostgreSQL stores.

A `TAGRetriever` over an 8-rule rulebook, judged by `RuleAwareFakeChatModel` (a
stand-in, not a model), answers 10 inputs it has not seen, so every judgment is a
cache miss and a verdict logged. Two setups: a `PostgresVerdictLog` alone, and a
`PostgresVerdictCache` with a `PostgresVerdictLog` on the same database.

Sessions opened are counted as calls to psycopg's connect (`psycopg.connect` and
`Connection.connect`, which a pool uses): one server session each, from opening
the stores to closing them. As a check on the server's side, a monitor polls
`pg_stat_activity` every few milliseconds for the backends of this run (marked by
`application_name`): the distinct backend pids it saw, and the most at once (a
session shorter than the poll interval can be missed).

It uses only APIs older versions have too; `--against CHECKOUT` first runs this
script on an older checkout (as `PYTHONPATH=<checkout> python <this script>`), so
the two are measured back to back. Needs a server: `--postgres URI`, or
`TAG_TEST_POSTGRES_URI` as `eval "$(bash scripts/postgres start)"` sets; without
one it says so and measures nothing.

    python benchmarks/bench_sessions.py [--postgres URI] [--against /tmp/old]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from langchain_tag.cache import PostgresVerdictCache
from langchain_tag.learning.verdict_log import PostgresVerdictLog
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RULES = 8
RETRIEVALS = 10
POLL_SECONDS = 0.002


@contextmanager
def counted_connects() -> Iterator[list[int]]:
    """Count psycopg's connects while inside; the count is the list's one item."""
    count = [0]
    lock = threading.Lock()
    connect = psycopg.Connection.connect  # bound to the class

    def counting(*args: Any, **kwargs: Any) -> Any:
        with lock:
            count[0] += 1
        return connect(*args, **kwargs)

    saved_class, saved_module = psycopg.Connection.__dict__["connect"], psycopg.connect
    psycopg.Connection.connect = staticmethod(counting)  # type: ignore[method-assign]
    psycopg.connect = counting
    try:
        yield count
    finally:
        psycopg.Connection.connect = saved_class  # type: ignore[method-assign]
        psycopg.connect = saved_module


@contextmanager
def watched_backends(uri: str, name: str) -> Iterator[dict[str, Any]]:
    """Poll pg_stat_activity for backends named `name`: pids seen, most at once."""
    seen: dict[str, Any] = {"pids": set(), "peak": 0}
    stop = threading.Event()
    monitor = psycopg.connect(uri, autocommit=True)  # opened before counting

    def poll() -> None:
        while not stop.wait(POLL_SECONDS):
            pids = {
                pid
                for (pid,) in monitor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                    (name,),
                )
            }
            seen["pids"] |= pids
            seen["peak"] = max(seen["peak"], len(pids))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        monitor.close()


def with_name(uri: str, name: str) -> str:
    """`uri` with `application_name=name`, so the monitor finds its sessions."""
    return f"{uri}{'&' if '?' in uri else '?'}application_name={name}"


def measure(uri: str, *, cache: bool) -> dict[str, int]:
    """Sessions opened for `RETRIEVALS` retrievals with a log (and a cache)."""
    name = f"bench_sessions_{uuid.uuid4().hex[:10]}"
    table = name
    named = with_name(uri, name)
    rulebook = trigger_rulebook(RULES)
    texts = [f"input {i} names trigger-{i % RULES:03d}" for i in range(RETRIEVALS)]
    try:
        with watched_backends(uri, name) as seen, counted_connects() as count:
            closers: list[Callable[[], None]] = []
            log = PostgresVerdictLog(named, table=f"{table}_log")
            closers.append(log.close)
            store = None
            if cache:
                store = PostgresVerdictCache(named, table=f"{table}_cache")
                closers.append(store.close)
            judge = ApplicabilityJudge(
                llm=RuleAwareFakeChatModel(), cache=store, verdict_log=log
            )
            retriever = TAGRetriever(rulebook=rulebook, judge=judge)
            for text in texts:
                retriever.invoke(text)
            if len(log) != RETRIEVALS * RULES:
                msg = f"the log holds {len(log)} verdicts"
                raise RuntimeError(msg)
            for close in closers:
                close()
    finally:
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(
                f"DROP TABLE IF EXISTS {table}_log, {table}_log_inputs, "
                f"{table}_log_skipped, {table}_cache"
            )
    return {
        "connects": count[0],
        "backends_seen": len(seen["pids"]),
        "most_at_once": seen["peak"],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure both setups (after the older checkout's, with `--against`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres", default=os.environ.get("TAG_TEST_POSTGRES_URI") or None
    )
    parser.add_argument(
        "--against", type=Path, metavar="CHECKOUT", help="measure this one first"
    )
    args = parser.parse_args(argv)
    if not args.postgres:
        print(
            "skipped: no PostgreSQL server (give --postgres URI, or run "
            '`eval "$(bash scripts/postgres start)"`)'
        )
        return 0
    try:
        psycopg.connect(args.postgres, connect_timeout=5).close()
    except psycopg.Error as error:
        print(f"skipped: PostgreSQL at --postgres is unreachable: {error}")
        return 0
    if args.against is not None:
        checkout = args.against.resolve()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(checkout), str(checkout / "experiments")]
            ),
        }
        subprocess.run(  # noqa: S603 - this script, on the given checkout
            [sys.executable, __file__, "--postgres", args.postgres],
            env=env,
            check=True,
        )
    import langchain_tag  # noqa: PLC0415 - only to say which checkout ran

    where = Path(langchain_tag.__file__).resolve().parent.parent
    print(f"{where}: {RETRIEVALS} retrievals, {RULES} rules, each judged once")
    for label, cache in (("verdict log", False), ("verdict cache + log", True)):
        found = measure(args.postgres, cache=cache)
        print(
            f"  {label:<20} {found['connects']:>3} sessions opened (connect calls); "
            f"server saw {found['backends_seen']} backends, "
            f"{found['most_at_once']} at once"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
