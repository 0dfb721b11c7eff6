"""Verdict and answer caches: LangChain `BaseStore[str, str]`s.

The judge (`cache=`) and extraction (`answers=`) take any `BaseStore[str, str]`
(`mget`/`mset`/`mdelete`/`yield_keys` and their async twins): the bounded LRU
`InMemoryVerdictCache` (the judge's default), the persistent `SQLiteVerdictCache`,
or a LangChain store of your own. Values are opaque strings under opaque keys (a
verdict's JSON, a model's answer); the caller builds the keys and decides what is
stored. The judge stores only successful verdicts: a failed judgment is retried the
next time instead of turning into a remembered NO.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from langchain_core.stores import BaseStore

__all__ = [
    "InMemoryVerdictCache",
    "SQLiteVerdictCache",
]


class InMemoryVerdictCache(BaseStore[str, str]):
    """A bounded, thread-safe LRU store in process memory (the judge's default)."""

    def __init__(self, maxsize: int = 100_000) -> None:
        """Keep at most `maxsize` values, evicting the least recently used."""
        if maxsize < 1:
            msg = f"maxsize must be at least 1, got {maxsize}"
            raise ValueError(msg)
        self.maxsize = maxsize
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Number of stored values."""
        return len(self._data)

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        """The values of `keys` (None where missing); each hit becomes most recent."""
        with self._lock:
            values = [self._data.get(key) for key in keys]
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    self._data.move_to_end(key)
        return values

    def mset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        """Store the pairs, evicting the least recently used beyond `maxsize`."""
        with self._lock:
            for key, value in key_value_pairs:
                self._data[key] = value
                self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def mdelete(self, keys: Sequence[str]) -> None:
        """Forget `keys`."""
        with self._lock:
            for key in keys:
                self._data.pop(key, None)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """The stored keys (those starting with `prefix`), least recent first."""
        with self._lock:
            keys = list(self._data)
        yield from (k for k in keys if prefix is None or k.startswith(prefix))

    def clear(self) -> None:
        """Forget every stored value."""
        with self._lock:
            self._data.clear()

    # Dictionary access is fast enough that a thread hop would cost more than it saves.
    async def amget(self, keys: Sequence[str]) -> list[str | None]:  # noqa: D102
        return self.mget(keys)

    async def amset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:  # noqa: D102
        self.mset(key_value_pairs)

    async def amdelete(self, keys: Sequence[str]) -> None:  # noqa: D102
        self.mdelete(keys)


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


class SQLiteVerdictCache(BaseStore[str, str]):
    """A persistent store in one SQLite file, safe for several threads and processes.

    The database runs in WAL mode with a busy timeout, so concurrent writers wait
    for each other instead of failing. Extraction keeps its model answers the same
    way, in a table of its own (`table="extraction_answers"`). The async methods
    are `BaseStore`'s: the sync ones in a worker thread.
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

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        """The values of `keys`, None where missing."""
        if not keys:
            return []
        found: dict[str, str] = {}
        conn = self._connections.get()
        # In chunks under SQLite's default limit of 999 bound parameters.
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            marks = ", ".join("?" * len(chunk))
            query = f"SELECT key, verdict FROM {self.table} WHERE key IN ({marks})"  # noqa: S608 - checked identifier
            found.update((str(k), str(v)) for k, v in conn.execute(query, chunk))
        return [found.get(key) for key in keys]

    def mset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        """Store the pairs, in one transaction."""
        if not key_value_pairs:
            return
        now = time.time()
        with self._connections.writing() as conn:
            conn.executemany(
                f"INSERT OR REPLACE INTO {self.table} (key, verdict, created) "  # noqa: S608
                "VALUES (?, ?, ?)",
                [(key, value, now) for key, value in key_value_pairs],
            )

    def mdelete(self, keys: Sequence[str]) -> None:
        """Forget `keys`."""
        if not keys:
            return
        with self._connections.writing() as conn:
            conn.executemany(
                f"DELETE FROM {self.table} WHERE key = ?",  # noqa: S608
                [(key,) for key in keys],
            )

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """The stored keys (those starting with `prefix`)."""
        query = f"SELECT key FROM {self.table}"  # noqa: S608 - checked identifier
        rows = self._connections.get().execute(query).fetchall()
        yield from (
            str(k) for (k,) in rows if prefix is None or str(k).startswith(prefix)
        )

    def clear(self) -> None:
        """Forget every stored value."""
        with self._connections.writing() as conn:
            conn.execute(f"DELETE FROM {self.table}")  # noqa: S608

    def __len__(self) -> int:
        """Number of stored values."""
        query = f"SELECT COUNT(*) FROM {self.table}"  # noqa: S608 - checked identifier
        row = self._connections.get().execute(query).fetchone()
        return int(row[0])
