"""The storage layer: SQLite connections per thread, PostgreSQL pools per database.

PostgreSQL here runs on recording connections and pools (no server);
tests/integration_tests/test_sql_postgres.py counts the sessions on a server.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from langchain_tag import _sql
from langchain_tag._sql import PostgresConnections, SQLiteConnections
from langchain_tag.errors import StoreLocationError


class RecordingConnection:
    """Records statements; answers with `answer(sql, params)`.

    Given `fail`, every statement raises it, and the connection is then `broken`
    if `breaks` (the server dropped it). `prepared` notes each statement's
    `prepare` argument.
    """

    def __init__(
        self,
        answer: Callable[[str, tuple[Any, ...]], list[Any]],
        fail: Exception | None = None,
        *,
        breaks: bool = False,
    ) -> None:
        self.answer = answer
        self.fail = fail
        self.breaks = breaks
        self.statements: list[tuple[str, tuple[Any, ...]]] = []
        self.prepared: list[bool | None] = []
        self.broken = False

    def execute(
        self, sql: str, params: Any = (), *, prepare: bool | None = None
    ) -> Any:
        if self.fail is not None:
            self.broken = self.breaks
            raise self.fail
        sql = " ".join(sql.split())
        self.statements.append((sql, tuple(params)))
        self.prepared.append(prepare)
        rows = self.answer(sql, tuple(params))

        class Cursor:
            def fetchall(self) -> list[Any]:
                return rows

            def fetchone(self) -> Any:
                return rows[0] if rows else None

        return Cursor()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.statements.append(("BEGIN", ()))
        yield
        self.statements.append(("COMMIT", ()))


class RecordingPool:
    """Hands out its connections in turn; notes `check` calls and timeouts."""

    def __init__(self, *connections: RecordingConnection, max_size: int = 8) -> None:
        self.connections = list(connections)
        self.checks = 0
        self.timeouts: list[float | None] = []
        self.min_size, self.max_size = 1, max_size
        self.closed = False

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[RecordingConnection]:
        self.timeouts.append(timeout)
        conn = (
            self.connections.pop(0)
            if len(self.connections) > 1
            else self.connections[0]
        )
        yield conn

    def check(self) -> None:
        self.checks += 1

    def resize(self, min_size: int, max_size: int) -> None:
        self.min_size, self.max_size = min_size, max_size

    def close(self) -> None:
        self.closed = True


def no_rows(sql: str, params: tuple[Any, ...]) -> list[Any]:
    return [(True,)] if "to_regclass" in sql else []


# --- SQLiteConnections ------------------------------------------------------------


def test_read_only_connections_change_nothing_and_refuse_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "odd?name#.sqlite"  # URI characters in the name are literal
    writer = SQLiteConnections(path)
    with writer.writing() as conn:
        conn.execute("CREATE TABLE verdicts (key TEXT)")
        conn.execute("INSERT INTO verdicts VALUES ('k')")
    writer.close()
    before = path.read_bytes()
    reading = SQLiteConnections(path, read_only=True)
    assert reading.get().execute("SELECT count(*) FROM verdicts").fetchone() == (1,)
    with pytest.raises(PermissionError, match="read-only"), reading.writing():
        pass
    reading.close()
    assert path.read_bytes() == before
    missing = SQLiteConnections(tmp_path / "new" / "x.sqlite", read_only=True)
    assert not (tmp_path / "new").exists()  # no directory made
    with pytest.raises(sqlite3.OperationalError):
        missing.get()


def test_a_failed_write_is_rolled_back_and_threads_have_their_own_connection(
    tmp_path: Path,
) -> None:
    connections = SQLiteConnections(tmp_path / "db" / "x.sqlite")
    with connections.writing() as conn:
        conn.execute("CREATE TABLE t (n INTEGER)")

    def insert_then_fail() -> None:
        with connections.writing() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            msg = "the caller failed"
            raise LookupError(msg)

    with pytest.raises(LookupError):
        insert_then_fail()
    assert connections.get().execute("SELECT count(*) FROM t").fetchone() == (0,)
    seen: list[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: seen.append(connections.get()))
    thread.start()
    thread.join()
    assert seen[0] is not connections.get()
    assert connections.get().execute("PRAGMA journal_mode").fetchone() == ("wal",)


# --- PostgresConnections: one connection, retried once ---------------------------


def test_a_connection_dropped_in_the_pool_is_replaced_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dropped = RecordingConnection(
        no_rows, psycopg.OperationalError("server closed the connection"), breaks=True
    )
    healthy = RecordingConnection(no_rows)
    pool = RecordingPool(dropped, healthy)
    monkeypatch.setattr(PostgresConnections, "_opened", lambda self: pool)
    connections = PostgresConnections("postgresql://db/tag", timeout=2.5)
    assert connections.run(lambda conn: conn.execute("SELECT 1").fetchall()) == []
    assert (pool.checks, healthy.statements) == (1, [("SELECT 1", ())])
    assert pool.timeouts == [2.5, 2.5]  # each caller waits its own timeout
    # An error of a live connection (a cancelled statement) is the caller's.
    cancelled = RecordingConnection(
        no_rows, fail=psycopg.OperationalError("canceling statement")
    )
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(cancelled)
    )
    with pytest.raises(psycopg.OperationalError, match="canceling"):
        connections.run(lambda conn: conn.execute("SELECT 1"))


def test_read_only_connections_refuse_writes_before_any_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = RecordingConnection(no_rows)
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    reading = PostgresConnections("postgresql://tag:pw@db/tag", read_only=True)
    with pytest.raises(PermissionError, match=r"tag:\*\*\*@db/tag was opened"):
        reading.run(lambda conn: conn.execute("DELETE FROM t"), writes=True)
    assert conn.statements == []
    with pytest.raises(ValueError, match="max_size must be at least 1"):
        PostgresConnections("postgresql://db/tag", max_size=0)


# --- PostgresConnections: one pool per database in a process ---------------------


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingPool]]:
    """Every pool opened, in order; after the test none of them may stay held.

    The process's registry is swapped for an empty one, so pools other tests hold
    (a real server's, say) neither count here nor get dropped by `reset`.
    """
    opened: list[RecordingPool] = []
    monkeypatch.setattr(_sql, "_POOLS", _sql._Pools())

    def open_pool(self: PostgresConnections) -> RecordingPool:
        opened.append(
            RecordingPool(RecordingConnection(no_rows), max_size=self.max_size)
        )
        return opened[-1]

    monkeypatch.setattr(PostgresConnections, "_open_pool", open_pool)
    yield opened
    assert _sql._POOLS.by_key == {}


def _select(connections: PostgresConnections) -> None:
    connections.run(lambda conn: conn.execute("SELECT 1"))


def test_stores_on_one_database_share_one_pool_until_the_last_closes(
    pools: list[RecordingPool],
) -> None:
    cache = PostgresConnections("postgresql://db/tag", max_size=4)
    log = PostgresConnections("postgresql://db/tag", max_size=8)
    reader = PostgresConnections("postgresql://db/tag", read_only=True)
    elsewhere = PostgresConnections("postgresql://db/other")
    for connections in (cache, log, reader, elsewhere):
        _select(connections)
    # Read-only sessions and another database are pools of their own.
    assert len(pools) == 3
    shared = pools[0]
    assert shared.max_size == 8  # as large as the largest asked for
    assert shared.connections[0].statements == [("SELECT 1", ())] * 2
    cache.close()
    cache.close()  # closing twice lets go once
    assert [pool.closed for pool in pools] == [False, False, False]
    _select(log)
    log.close()
    assert [pool.closed for pool in pools] == [True, False, False]
    _select(log)  # the next use holds a new pool
    assert len(pools) == 4
    for connections in (log, reader, elsewhere):
        connections.close()
    assert all(pool.closed for pool in pools)


def test_a_pool_that_cannot_open_is_not_held(
    pools: list[RecordingPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(self: PostgresConnections) -> RecordingPool:
        msg = "Cannot connect to PostgreSQL at postgresql://db/tag: refused"
        raise StoreLocationError(msg)

    with monkeypatch.context() as patched:
        patched.setattr(PostgresConnections, "_open_pool", unreachable)
        with pytest.raises(StoreLocationError, match="refused"):
            _select(PostgresConnections("postgresql://db/tag"))
        assert _sql._POOLS.by_key == {}
    connections = PostgresConnections("postgresql://db/tag")
    _select(connections)  # once the server answers, the pool opens
    assert len(pools) == 1
    connections.close()


def test_threads_opening_stores_at_once_open_one_pool(
    pools: list[RecordingPool],
) -> None:
    stores = [PostgresConnections("postgresql://db/tag") for _ in range(8)]
    start = threading.Barrier(len(stores))

    def use(connections: PostgresConnections) -> None:
        start.wait()
        _select(connections)

    threads = [threading.Thread(target=use, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(pools) == 1
    assert len(pools[0].connections[0].statements) == 8
    for connections in stores:
        connections.close()
    assert pools[0].closed


def test_a_forked_child_opens_pools_of_its_own(pools: list[RecordingPool]) -> None:
    parent = PostgresConnections("postgresql://db/tag")
    _select(parent)
    _sql._POOLS.reset()  # what `os.register_at_fork` runs in a child
    child = PostgresConnections("postgresql://db/tag")
    _select(child)  # not the parent's pool, whose threads the child has not
    assert len(pools) == 2
    parent.close()  # the parent's holder lets go of its own pool only
    assert [pool.closed for pool in pools] == [True, False]
    child.close()
    assert pools[1].closed
