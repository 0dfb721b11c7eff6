"""Verdict caches: `BaseStore`s, bounded in memory, persistent and shared in SQLite.

And shared by several machines in PostgreSQL: its SQL here, on a recording
connection (`test_sql`, where the connections themselves are tested);
tests/integration_tests/test_verdict_cache_postgres.py runs it on a server.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.stores import BaseStore

from langchain_tag import cache as cache_module
from langchain_tag._sql import PostgresConnections
from langchain_tag.cache import (
    InMemoryVerdictCache,
    PostgresVerdictCache,
    SQLiteVerdictCache,
    open_verdict_cache,
)
from langchain_tag.errors import StoreLocationError
from tests.unit_tests.test_sql import RecordingConnection, RecordingPool, no_rows


def test_in_memory_cache_evicts_least_recently_used() -> None:
    cache = InMemoryVerdictCache(maxsize=3)
    cache.mset([(key, key.upper()) for key in "abc"])
    assert cache.mget(["a"]) == ["A"]  # now most recent
    cache.mset([("d", "D")])
    assert cache.mget(["b"]) == [None]
    assert cache.mget(list("acd")) == ["A", "C", "D"]
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError, match="at least 1"):
        InMemoryVerdictCache(maxsize=0)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_caches_are_langchain_stores(tmp_path: Path, kind: str) -> None:
    cache: BaseStore[str, str] = (
        InMemoryVerdictCache()
        if kind == "memory"
        else SQLiteVerdictCache(tmp_path / "c")
    )
    assert isinstance(cache, BaseStore)
    await cache.amset([("k", '{"x": 1}'), ("k2", "v2"), ("other", "o")])
    assert await cache.amget(["k", "missing", "k2"]) == ['{"x": 1}', None, "v2"]
    assert cache.mget(["k"]) == ['{"x": 1}']
    assert sorted(cache.yield_keys()) == ["k", "k2", "other"]
    assert sorted(cache.yield_keys(prefix="k")) == ["k", "k2"]
    cache.mdelete(["k", "missing"])
    await cache.amdelete(["other"])
    assert cache.mget(["k", "k2", "other"]) == [None, "v2", None]
    assert cache.mget([]) == []
    cache.mset([])


def test_sqlite_cache_reads_many_keys_at_once(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "many.sqlite")
    cache.mset([(str(i), str(i)) for i in range(1500)])
    keys = [str(i) for i in range(1600)]
    assert cache.mget(keys) == [str(i) for i in range(1500)] + [None] * 100


def test_sqlite_cache_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "verdicts.sqlite"
    SQLiteVerdictCache(path).mset([("k", "v")])
    reopened = SQLiteVerdictCache(path)
    assert reopened.mget(["k"]) == ["v"]
    reopened.mset([("k", "w")])
    assert len(reopened) == 1
    assert SQLiteVerdictCache(path).mget(["k"]) == ["w"]


def test_sqlite_cache_from_many_threads(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "threads.sqlite")

    def write(worker: int) -> None:
        for i in range(50):
            cache.mset([(f"{worker}-{i}", str(i))])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 400
    assert cache.mget(["7-49"]) == ["49"]


def test_sqlite_cache_from_several_processes(tmp_path: Path) -> None:
    path = tmp_path / "processes.sqlite"
    writer = textwrap.dedent(
        """
        import sys
        from langchain_tag.cache import SQLiteVerdictCache
        cache = SQLiteVerdictCache(sys.argv[1])
        for i in range(100):
            cache.mset([(f"{sys.argv[2]}-{i}", str(i))])
        """
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", writer, str(path), str(n)])  # noqa: S603
        for n in range(3)
    ]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    cache = SQLiteVerdictCache(path)
    assert len(cache) == 300
    assert cache.mget([f"{n}-99" for n in range(3)]) == ["99"] * 3


# --- open_verdict_cache: a location picks the store -----------------------------------


def test_open_verdict_cache_picks_the_store_from_the_location(tmp_path: Path) -> None:
    assert isinstance(open_verdict_cache(), InMemoryVerdictCache)
    memory = open_verdict_cache(":memory:", maxsize=5)
    assert isinstance(memory, InMemoryVerdictCache)
    assert memory.maxsize == 5
    local = open_verdict_cache(tmp_path / "c.sqlite", table="answers")
    assert isinstance(local, SQLiteVerdictCache)
    assert (local.path, local.table) == (tmp_path / "c.sqlite", "answers")
    local.mset([("k", "v")])
    local.close()
    assert open_verdict_cache(str(tmp_path / "c.sqlite"), table="answers").mget(
        ["k"]
    ) == ["v"]


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_verdict_cache_reaches_postgres_for_a_uri(scheme: str) -> None:
    # Nothing listens on port 1: the error shows the cache went to PostgreSQL, and
    # names the server without the password.
    with pytest.raises(StoreLocationError, match="Cannot connect") as caught:
        open_verdict_cache(f"{scheme}://tag:s3cret@127.0.0.1:1/tag")
    assert f"{scheme}://tag:***@127.0.0.1:1/tag" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI prints it in one line


def test_a_path_that_cannot_hold_a_cache_is_named_with_the_reason(
    tmp_path: Path,
) -> None:
    with pytest.raises(StoreLocationError, match="is a directory; name a file in it"):
        open_verdict_cache(tmp_path)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(StoreLocationError, match="plain is not a directory"):
        open_verdict_cache(tmp_path / "plain" / "sub" / "c.sqlite")
    (tmp_path / "notes.txt").write_text("not a database, but long enough " * 40)
    with pytest.raises(StoreLocationError, match="not an SQLite database"):
        open_verdict_cache(tmp_path / "notes.txt")


def test_a_locked_database_is_not_blamed_on_the_path(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SQLiteVerdictCache(path).close()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            SQLiteVerdictCache(path, timeout=0)
    finally:
        holder.rollback()
        holder.close()


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0,
    reason="root writes in any directory",
)
def test_an_unwritable_directory_is_refused_clearly(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(StoreLocationError, match="cannot be written"):
            open_verdict_cache(locked / "c.sqlite")
    finally:
        locked.chmod(0o700)


def test_every_cache_can_be_closed(tmp_path: Path) -> None:
    sqlite_cache = SQLiteVerdictCache(tmp_path / "c.sqlite")
    sqlite_cache.mset([("k", "v")])
    sqlite_cache.close()
    assert sqlite_cache.mget(["k"]) == ["v"]  # reopened on use
    memory = InMemoryVerdictCache()
    memory.mset([("k", "v")])
    memory.close()
    assert memory.mget(["k"]) == ["v"]


# --- PostgresVerdictCache: its SQL, on a recording connection ----------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> RecordingConnection:
    """The connection every `PostgresVerdictCache` here runs its statements on."""
    conn = RecordingConnection(no_rows)
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    return conn


def test_postgres_cache_creates_its_table_once_under_a_lock(
    recorded: RecordingConnection,
) -> None:
    PostgresVerdictCache("postgresql://db/tag", table="shared_verdicts")
    assert recorded.statements == [
        ("BEGIN", ()),
        ("SELECT pg_advisory_xact_lock(hashtext(%s))", ("shared_verdicts",)),
        (
            (
                'CREATE TABLE IF NOT EXISTS shared_verdicts (key TEXT COLLATE "C" '
                "PRIMARY KEY, verdict TEXT NOT NULL, created DOUBLE PRECISION NOT NULL "
                "DEFAULT extract(epoch FROM now()))"
            ),
            (),
        ),
        ("COMMIT", ()),
    ]


def test_postgres_cache_writes_an_upsert_in_one_statement(
    recorded: RecordingConnection,
) -> None:
    cache = PostgresVerdictCache("postgresql://db/tag")
    recorded.statements.clear()
    cache.mset([("b", "1"), ("a", "2"), ("b", "3")])
    cache.mset([])
    ((sql, params),) = recorded.statements
    assert sql == (
        "INSERT INTO tag_verdicts (key, verdict) SELECT key, verdict FROM "
        "unnest(%s::text[], %s::text[]) AS pair (key, verdict) ORDER BY key "
        "ON CONFLICT (key) DO UPDATE SET verdict = EXCLUDED.verdict, "
        "created = EXCLUDED.created"
    )
    # A repeated key once, with its last value: one statement updates a row once.
    assert params == (["b", "a"], ["3", "2"])


def test_postgres_cache_reads_and_deletes_by_key_array(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def answer(sql: str, params: tuple[Any, ...]) -> list[Any]:
        if sql.startswith("SELECT key, verdict"):
            return [("b", "B"), ("a", "A")]
        return no_rows(sql, params)

    conn = RecordingConnection(answer)
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    cache = PostgresVerdictCache("postgresql://db/tag")
    conn.statements.clear()
    assert cache.mget(["a", "missing", "b"]) == ["A", None, "B"]
    assert cache.mget([]) == []
    cache.mdelete(["a", "b"])
    cache.mdelete([])
    assert conn.statements == [
        (
            "SELECT key, verdict FROM tag_verdicts WHERE key = ANY(%s::text[])",
            (["a", "missing", "b"],),
        ),
        ("DELETE FROM tag_verdicts WHERE key = ANY(%s::text[])", (["a", "b"],)),
    ]


def test_postgres_cache_lists_keys_by_a_literal_prefix_a_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = sorted(["a%_\\1", "a%_\\2", "a%_\\3", "a%_\\4", "a%_\\5"])

    def answer(sql: str, params: tuple[Any, ...]) -> list[Any]:
        if sql.startswith("SELECT key FROM"):
            _, after, limit = params
            later = [k for k in stored if (k >= after if ">=" in sql else k > after)]
            return [(k,) for k in later[:limit]]
        return no_rows(sql, params)

    conn = RecordingConnection(answer)
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    monkeypatch.setattr(cache_module, "_KEYS_PAGE", 2)
    cache = PostgresVerdictCache("postgresql://db/tag")
    conn.statements.clear()
    assert list(cache.yield_keys(prefix="a%_\\")) == stored
    # LIKE's wildcards and escape in the prefix are literal.
    query = (
        "SELECT key FROM tag_verdicts WHERE key LIKE %s ESCAPE '\\' AND key {} %s "
        "ORDER BY key LIMIT %s"
    )
    assert conn.statements == [
        (query.format(">="), ("a\\%\\_\\\\%", "a%_\\", 2)),
        (query.format(">"), ("a\\%\\_\\\\%", stored[1], 2)),
        (query.format(">"), ("a\\%\\_\\\\%", stored[3], 2)),
    ]
    conn.statements.clear()
    list(cache.yield_keys())
    assert conn.statements[0][1] == ("%", "", 2)


def test_postgres_cache_read_only_checks_and_refuses_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found: list[Any] = [(True,)]
    conn = RecordingConnection(
        lambda sql, params: found if "to_regclass" in sql else []
    )
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    cache = PostgresVerdictCache(
        "postgresql://tag:pw@db/tag", table="shared", read_only=True
    )
    assert conn.statements == [("SELECT to_regclass(%s) IS NOT NULL", ("shared",))]
    writes: list[Callable[[], None]] = [
        lambda: cache.mset([("k", "v")]),
        lambda: cache.mdelete(["k"]),
        cache.clear,
    ]
    for write in writes:
        with pytest.raises(PermissionError, match=r"tag:\*\*\*@db/tag was opened"):
            write()
    assert len(conn.statements) == 1  # nothing was sent
    found[:] = [(False,)]
    with pytest.raises(StoreLocationError, match=r"No table shared at .*nothing was"):
        PostgresVerdictCache("postgresql://db/tag", table="shared", read_only=True)


def test_postgres_cache_table_name_and_location(recorded: RecordingConnection) -> None:
    with pytest.raises(ValueError, match="plain SQL identifier"):
        PostgresVerdictCache("postgresql://db/tag", table="verdicts; DROP TABLE x")
    keyword = PostgresVerdictCache("host=db dbname=tag password=s3cret user=tag")
    assert keyword.location == "host=db dbname=tag password=*** user=tag"
    with pytest.raises(ValueError, match="max_size must be at least 1"):
        PostgresVerdictCache("postgresql://db/tag", max_size=0)


def test_postgres_cache_without_psycopg_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(
        ImportError, match=r"PostgresVerdictCache needs psycopg.*`postgres` extra"
    ):
        open_verdict_cache("postgresql://db/tag")
