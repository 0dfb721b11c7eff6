"""The package's one storage layer: pooled SQLite and PostgreSQL connections.

Every store that keeps rows in a database goes through here: the verdict cache
(`cache.py`), the verdict log (`learning/verdict_log.py`), extraction's answer store
and the batch lanes' job records. One place opens, pools and closes connections, so
one process holds at most a pool's worth of PostgreSQL sessions whatever number of
stores and worker threads use it, and one place turns a bad location into a
`StoreLocationError` that says what to do.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_tag.errors import StoreLocationError
from langchain_tag.models import without_password

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

__all__ = [
    "PostgresConnections",
    "SQLiteConnections",
    "checked_table",
    "psycopg_modules",
    "sqlite_problem",
]

_T = TypeVar("_T")


def checked_table(table: str) -> str:
    """`table` if it is a plain SQL identifier (it is put in statements as is)."""
    if not table.isidentifier():
        msg = f"table must be a plain SQL identifier, got {table!r}"
        raise ValueError(msg)
    return table


class SQLiteConnections:
    """One SQLite connection per thread to one file, in WAL mode with a busy timeout.

    What every SQLite store of the package shares (the verdict cache, the verdict
    log): WAL lets readers run beside one writer, and the busy timeout makes
    concurrent writers, in threads or processes, wait for each other instead of
    failing with "database is locked".

    With `read_only`, the file must exist and is opened `mode=ro`: nothing is
    created (not the file, nor its directory) and nothing changed (not the journal
    mode either), and `writing` refuses.

    Args:
        path: The database file; its directory is created if needed.
        timeout: Seconds a writer waits for the lock.
        read_only: Open the existing file for reading only.
    """

    def __init__(
        self, path: str | Path, *, timeout: float = 30.0, read_only: bool = False
    ) -> None:
        """Remember where the database is; connections open on first use."""
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.read_only = read_only
        self._local = threading.local()

    def get(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        # sqlite3 connections must not cross threads; each thread opens its own.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.read_only:
                # A URI, so that `?` or `#` in the file's name is not a parameter.
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                conn = sqlite3.connect(uri, uri=True, timeout=self.timeout)
            else:
                conn = sqlite3.connect(self.path, timeout=self.timeout)
                with contextlib.suppress(sqlite3.OperationalError):
                    conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection inside a write transaction, committed on exit.

        `BEGIN IMMEDIATE` takes the write lock first, waiting out other writers
        with the busy timeout: a deferred transaction would read first, and when a
        writer commits meanwhile SQLite refuses its upgrade at once ("database is
        locked"), busy timeout or not.

        Raises:
            PermissionError: The file was opened `read_only`.
        """
        if self.read_only:
            msg = f"The database {self.path} was opened read-only."
            raise PermissionError(msg)
        conn = self.get()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def close(self) -> None:
        """Close this thread's connection; the next `get` opens a new one."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()


def sqlite_problem(path: Path, error: BaseException) -> str:
    """Why an SQLite file cannot be kept at `path`, with what to do."""
    if path.is_dir():
        return f"it is a directory; name a file in it, e.g. {path / 'verdicts.sqlite'}"
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is not a directory"
    if isinstance(error, sqlite3.DatabaseError) and "not a database" in str(error):
        return "the file is not an SQLite database; name another file"
    reason = error.strerror if isinstance(error, OSError) else str(error)
    return f"it cannot be written ({reason}); choose another path"


def psycopg_modules(user: str) -> tuple[Any, Any]:
    """The modules `psycopg` and `psycopg_pool`, or an error naming the extra."""
    try:
        import psycopg  # noqa: PLC0415 - the postgres extra
        import psycopg_pool  # noqa: PLC0415
    except ImportError as error:
        msg = (
            f"{user} needs psycopg: install the `postgres` extra "
            "(`pip install 'langchain-tag[postgres]'`)."
        )
        raise ImportError(msg) from error
    return psycopg, psycopg_pool


class _SharedPool:
    """A pool, and how many `PostgresConnections` hold it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while the pool opens or grows
        self.pool: ConnectionPool[Connection[Any]] | None = None
        self.holders = 0


class _Pools:
    """One pool per (connection string, read-only), for every store of the process.

    A verdict cache and a verdict log of one judge hold one pool.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every pool: a forked child has none of their threads."""
        self.lock = threading.Lock()
        self.by_key: dict[tuple[str, bool], _SharedPool] = {}


_POOLS = _Pools()
if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_POOLS.reset)


class PostgresConnections:
    """A bounded pool of connections to one PostgreSQL database, shared by threads.

    What the package's PostgreSQL stores share (psycopg 3 and its `ConnectionPool`,
    the `postgres` extra). A pool rather than a connection per thread: the judge runs
    each input's judgments in worker threads of their own, so connections kept per
    thread were opened anew for every input (78 to 79 sessions for 10 retrievals
    with a verdict log, 8 to 9 with the pool: `benchmarks/bench_sessions.py`), up to
    64 at once per process, against PostgreSQL's default limit of 100 for all
    machines together.

    Every `PostgresConnections` of the process with the same connection string
    (as written) and `read_only` uses one pool, opened by the first to use it and
    closed when the last one holding it closes; it is as large as the largest
    `max_size` asked for. So a verdict cache and a verdict log on one database
    have at most that many sessions open together.

    Sessions are autocommit. The pool opens at first use, after one direct
    connection: a wrong address or password fails there at once with the server's
    message, where the pool would only retry in the background until its timeout.

    Args:
        conninfo: A libpq connection string or `postgresql://` URI.
        max_size: At most this many connections (in the pool it shares).
        timeout: Seconds a caller waits for a free connection.
        read_only: The server refuses any write in the sessions, and `run` refuses
            `writes` first.
        user: Who needs psycopg, for the error when it is not installed.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 8,
        timeout: float = 30.0,
        read_only: bool = False,
        user: str = "PostgresConnections",
    ) -> None:
        """Remember where the database is; the pool opens on first use."""
        self._psycopg, self._psycopg_pool = psycopg_modules(user)
        if max_size < 1:
            msg = f"max_size must be at least 1, got {max_size}"
            raise ValueError(msg)
        self.conninfo = conninfo
        self.max_size = max_size
        self.timeout = timeout
        self.read_only = read_only
        self._lock = threading.Lock()
        self._shared: _SharedPool | None = None  # the pool held, when held
        self._pool: ConnectionPool[Connection[Any]] | None = None

    @property
    def location(self) -> str:
        """The connection string, without a password."""
        return without_password(self.conninfo)

    def run(self, work: Callable[[Connection[Any]], _T], *, writes: bool = False) -> _T:
        """`work(connection)` on a connection of the pool.

        A connection the server dropped while it waited in the pool (a restart, an
        idle timeout) fails at its first statement: then the pool drops its dead
        connections and `work` runs once more. So `work` must be safe to repeat.

        Raises:
            PermissionError: `writes`, and the connections are `read_only`.
            StoreLocationError: The first connection failed.
        """
        if writes and self.read_only:
            msg = f"The database {self.location} was opened read-only."
            raise PermissionError(msg)
        pool = self._opened()
        with pool.connection(timeout=self.timeout) as conn:
            try:
                return work(conn)
            except self._psycopg.OperationalError:
                if not conn.broken:
                    raise
        pool.check()
        with pool.connection(timeout=self.timeout) as conn:
            return work(conn)

    def _opened(self) -> ConnectionPool[Connection[Any]]:
        with self._lock:
            if self._pool is None:
                self._shared, self._pool = self._hold()
            return self._pool

    def _hold(self) -> tuple[_SharedPool, ConnectionPool[Connection[Any]]]:
        """The shared pool, opened or grown as needed, with this as one more holder."""
        key = self._key
        with _POOLS.lock:
            shared = _POOLS.by_key.setdefault(key, _SharedPool())
            shared.holders += 1
        try:
            # Not under `_POOLS.lock`: a server slow to answer delays only its users.
            with shared.lock:
                if shared.pool is None:
                    shared.pool = self._open_pool()
                elif shared.pool.max_size < self.max_size:
                    shared.pool.resize(shared.pool.min_size, self.max_size)
                return shared, shared.pool
        except BaseException:
            self._release(key, shared)
            raise

    def _open_pool(self) -> ConnectionPool[Connection[Any]]:
        try:
            self._psycopg.connect(self.conninfo).close()
        except self._psycopg.Error as error:
            msg = f"Cannot connect to PostgreSQL at {self.location}: {error}"
            raise StoreLocationError(msg) from error
        pool: ConnectionPool[Connection[Any]] = self._psycopg_pool.ConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=self.max_size,
            kwargs={"autocommit": True},
            configure=self._read_only if self.read_only else None,
            open=True,
        )
        return pool

    @staticmethod
    def _read_only(conn: Connection[Any]) -> None:
        conn.execute("SET default_transaction_read_only = on")

    @property
    def _key(self) -> tuple[str, bool]:
        return (self.conninfo, self.read_only)

    @staticmethod
    def _release(key: tuple[str, bool], shared: _SharedPool) -> None:
        """One holder less; the last one closes the pool."""
        with _POOLS.lock:
            shared.holders -= 1
            if shared.holders:
                return
            if _POOLS.by_key.get(key) is shared:
                del _POOLS.by_key[key]
            pool, shared.pool = shared.pool, None
        if pool is not None:
            pool.close()

    def close(self) -> None:
        """Let go of the pool (the last holder closes it); a next use holds it anew."""
        with self._lock:
            shared, self._shared, self._pool = self._shared, None, None
        if shared is not None:
            self._release(self._key, shared)
