"""The storage layer on a real PostgreSQL server: the sessions a process opens.

Needs a PostgreSQL server: set `TAG_TEST_POSTGRES_URI` (`scripts/postgres start`
prints it for a throwaway local one); the tests skip when it is unset or
unreachable. Sessions are counted on the client, as psycopg's connects and closes.
"""

from __future__ import annotations

import threading
import uuid
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from langchain_tag.cache import PostgresVerdictCache
from langchain_tag.learning.verdict_log import PostgresVerdictLog
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

pytestmark = pytest.mark.postgres


@dataclass
class Sessions:
    """Sessions opened since the fixture started, and the most open at once."""

    opened: int = 0
    open_now: int = 0
    most: int = 0


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Sessions:
    """Counts every psycopg connection opened and closed (a pool's too)."""
    counts = Sessions()
    lock = threading.Lock()
    mine: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
    connect, close = psycopg.Connection.connect, psycopg.Connection.close

    def counting_connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect(*args, **kwargs)
        with lock:
            mine.add(conn)
            counts.opened += 1
            counts.open_now += 1
            counts.most = max(counts.most, counts.open_now)
        return conn

    def counting_close(conn: psycopg.Connection[Any]) -> None:
        with lock:
            if conn in mine and not conn.closed:
                counts.open_now -= 1
        close(conn)

    monkeypatch.setattr(psycopg.Connection, "connect", staticmethod(counting_connect))
    monkeypatch.setattr(psycopg.Connection, "close", counting_close)
    monkeypatch.setattr(psycopg, "connect", counting_connect)
    return counts


@pytest.fixture
def table(uri: str) -> Iterator[str]:
    """A name no other run uses for the tables; they are dropped afterwards."""
    name = f"test_sql_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(
            f"DROP TABLE IF EXISTS {name}, {name}_inputs, {name}_skipped, {name}_cache"
        )


@pytest.fixture
def conninfo(uri: str, table: str) -> str:
    """The server's address, as no other test spells it: no pool of theirs serves."""
    return make_conninfo(uri, application_name=table)


def test_ten_retrievals_with_a_cache_and_a_log_open_one_pool_of_sessions(
    conninfo: str, table: str, sessions: Sessions
) -> None:
    """Before, the log opened a session per worker thread.

    88 to 91 sessions with the cache, 13 to 16 at once (`benchmarks/bench_sessions.py`).
    """
    max_size = 4
    rules = trigger_rulebook(8)
    log = PostgresVerdictLog(conninfo, table=table, max_size=max_size)
    cache = PostgresVerdictCache(conninfo, table=f"{table}_cache", max_size=max_size)
    judge = ApplicabilityJudge(
        llm=RuleAwareFakeChatModel(), cache=cache, verdict_log=log
    )
    retriever = TAGRetriever(rulebook=rules, judge=judge)
    for i in range(10):
        retriever.invoke(f"input {i} names trigger-{i % 8:03d}")
    assert (len(log), len(cache)) == (10 * 8, 10 * 8)
    log.close()
    cache.close()
    # One pool for both, and the one session that checked the address first.
    assert 0 < sessions.most <= max_size
    assert sessions.opened <= max_size + 1
    assert sessions.open_now == 0  # the last holder closed the pool


def test_a_log_altering_its_table_leaves_the_shared_sessions_usable(
    uri: str, conninfo: str, table: str, sessions: Sessions
) -> None:
    """The log's ALTER runs in the session the cache prepared its statements in.

    Run by `executemany`, psycopg then lost a statement prepared after it
    (InvalidSqlStatementName), and the session was not used again; now the
    schema statements run unprepared, and the session serves on.
    """
    with psycopg.connect(uri, autocommit=True) as conn:  # a log made before reasons
        conn.execute(
            f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, input_digest TEXT NOT "
            "NULL, rule_id TEXT NOT NULL, rule_hash TEXT NOT NULL, applies BOOLEAN "
            "NOT NULL, score DOUBLE PRECISION, error TEXT, model TEXT, prompt_version "
            "TEXT, profile TEXT, source TEXT NOT NULL, explore DOUBLE PRECISION, "
            "created DOUBLE PRECISION NOT NULL)"
        )
    opened_before = sessions.opened
    cache = PostgresVerdictCache(conninfo, table=f"{table}_cache", max_size=1)
    for i in range(6):  # past psycopg's threshold for preparing a statement
        cache.mset([(f"k{i}", "v")])
        assert cache.mget([f"k{i}"]) == ["v"]
    log = PostgresVerdictLog(conninfo, table=table, max_size=1)
    rule = trigger_rulebook(2).rules[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a VerdictLogWarning would fail the test
        for i in range(8):
            log.record(
                f"text {i}",
                rule,
                Verdict(rule_id=rule.rule_id, applies=True, reason=str(i)),
            )
            cache.mset([(f"k{i}", "w")])
            assert cache.mget([f"k{i}"]) == ["w"]
    assert [r.reason for r in log.records()] == [str(i) for i in range(8)]
    # The address check and the pool's one session.
    assert sessions.opened - opened_before == 2
    log.close()
    cache.close()
