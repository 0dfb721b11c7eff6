"""Verdict caches: one judgment per (input, judged rule fields, model) is enough.

The caches store verdicts serialised as JSON strings under opaque keys; the judge
builds the keys and decides what is stored. It stores only successful verdicts: a
failed judgment is retried the next time instead of turning into a remembered NO.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "InMemoryVerdictCache",
    "SQLiteVerdictCache",
    "VerdictCache",
]


class VerdictCache(ABC):
    """Where verdicts are remembered, keyed by an opaque string."""

    @abstractmethod
    def lookup(self, key: str) -> str | None:
        """The stored verdict for `key`, or None."""

    @abstractmethod
    def update(self, key: str, value: str) -> None:
        """Store a serialised verdict under `key`."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every stored verdict."""

    async def alookup(self, key: str) -> str | None:
        """Async `lookup`; runs in a worker thread unless overridden."""
        return await asyncio.to_thread(self.lookup, key)

    async def aupdate(self, key: str, value: str) -> None:
        """Async `update`; runs in a worker thread unless overridden."""
        await asyncio.to_thread(self.update, key, value)


class InMemoryVerdictCache(VerdictCache):
    """A bounded, thread-safe LRU cache in process memory (the default)."""

    def __init__(self, maxsize: int = 100_000) -> None:
        """Keep at most `maxsize` verdicts, evicting the least recently used."""
        if maxsize < 1:
            msg = f"maxsize must be at least 1, got {maxsize}"
            raise ValueError(msg)
        self.maxsize = maxsize
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Number of stored verdicts."""
        return len(self._data)

    def lookup(self, key: str) -> str | None:  # noqa: D102
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
        return value

    def update(self, key: str, value: str) -> None:  # noqa: D102
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:  # noqa: D102
        with self._lock:
            self._data.clear()

    # Dictionary access is fast enough that a thread hop would cost more than it saves.
    async def alookup(self, key: str) -> str | None:  # noqa: D102
        return self.lookup(key)

    async def aupdate(self, key: str, value: str) -> None:  # noqa: D102
        self.update(key, value)


class SQLiteConnections:
    """One SQLite connection per thread to one file, in WAL mode with a busy timeout.

    What every SQLite store of the package shares (the verdict cache, the verdict
    log): WAL lets readers run beside one writer, and the busy timeout makes
    concurrent writers, in threads or processes, wait for each other instead of
    failing with "database is locked".

    Args:
        path: The database file; its directory is created if needed.
        timeout: Seconds a writer waits for the lock.
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        """Remember where the database is; connections open on first use."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self._local = threading.local()

    def get(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        # sqlite3 connections must not cross threads; each thread opens its own.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
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
        """
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


class SQLiteVerdictCache(VerdictCache):
    """A persistent cache in one SQLite file, safe for several threads and processes.

    The database runs in WAL mode with a busy timeout, so concurrent writers wait
    for each other instead of failing. Extraction keeps its model answers the same
    way, in a table of its own (`table="extraction_answers"`).
    """

    def __init__(
        self, path: str | Path, *, table: str = "verdicts", timeout: float = 30.0
    ) -> None:
        """Open (creating if needed) the cache table `table` in the file at `path`."""
        if not table.isidentifier():
            msg = f"table must be a plain SQL identifier, got {table!r}"
            raise ValueError(msg)
        self._connections = SQLiteConnections(path, timeout=timeout)
        self.path = self._connections.path
        self.table = table
        self.timeout = timeout
        with self._connections.writing() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                "key TEXT PRIMARY KEY, verdict TEXT NOT NULL, created REAL NOT NULL)"
            )

    def _connection(self) -> sqlite3.Connection:
        return self._connections.get()

    def lookup(self, key: str) -> str | None:  # noqa: D102
        row = (
            self._connection()
            .execute(f"SELECT verdict FROM {self.table} WHERE key = ?", (key,))  # noqa: S608
            .fetchone()
        )
        return None if row is None else str(row[0])

    def update(self, key: str, value: str) -> None:  # noqa: D102
        with self._connections.writing() as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO {self.table} (key, verdict, created) "  # noqa: S608
                "VALUES (?, ?, ?)",
                (key, value, time.time()),
            )

    def clear(self) -> None:  # noqa: D102
        with self._connections.writing() as conn:
            conn.execute(f"DELETE FROM {self.table}")  # noqa: S608

    def __len__(self) -> int:
        """Number of stored verdicts."""
        query = f"SELECT COUNT(*) FROM {self.table}"  # noqa: S608 - checked identifier
        row = self._connection().execute(query).fetchone()
        return int(row[0])
