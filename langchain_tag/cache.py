"""Verdict and answer caches: LangChain `BaseStore[str, str]`s.

The judge (`cache=`) and extraction (`answers=`) take any `BaseStore[str, str]`
(`mget`/`mset`/`mdelete`/`yield_keys` and their async twins): the bounded LRU
`InMemoryVerdictCache` (the judge's default), the persistent `SQLiteVerdictCache`
(one machine), the `PostgresVerdictCache` several machines share, or a LangChain
store of your own. `open_verdict_cache(location)` picks one from a location. Values
are opaque strings under opaque keys (a verdict's JSON, a model's answer); the caller
builds the keys and decides what is stored. The judge stores only successful
verdicts: a failed judgment is retried the next time instead of turning into a
remembered NO.

```python
cache = open_verdict_cache("postgresql://tag@db/tag")  # or a path, or ":memory:"
judge = ApplicabilityJudge(llm=llm, cache=cache)
```
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.stores import BaseStore

from langchain_tag._sql import (
    PostgresConnections,
    SQLiteConnections,
    checked_table,
    sqlite_problem,
)
from langchain_tag.errors import StoreLocationError

if TYPE_CHECKING:
    from psycopg import Connection

__all__ = [
    "InMemoryVerdictCache",
    "PostgresVerdictCache",
    "SQLiteVerdictCache",
    "open_verdict_cache",
]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


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

    def close(self) -> None:
        """Nothing to release (every cache `open_verdict_cache` opens has `close`)."""

    # Dictionary access is fast enough that a thread hop would cost more than it saves.
    async def amget(self, keys: Sequence[str]) -> list[str | None]:  # noqa: D102
        return self.mget(keys)

    async def amset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:  # noqa: D102
        self.mset(key_value_pairs)

    async def amdelete(self, keys: Sequence[str]) -> None:  # noqa: D102
        self.mdelete(keys)


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
        """Open (creating if needed) the cache table `table` in the file at `path`.

        Raises:
            StoreLocationError: `path` is a directory, cannot be created or
                written, or is not an SQLite database.
        """
        self.table = checked_table(table)
        self.timeout = timeout
        try:
            self._connections = SQLiteConnections(path, timeout=timeout)
            with self._connections.writing() as conn:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, "
                    "verdict TEXT NOT NULL, created REAL NOT NULL)"
                )
        except (OSError, sqlite3.Error) as error:
            if "locked" in str(error):
                raise  # a writer held the lock past the timeout: not the path's fault
            why = sqlite_problem(Path(path), error)
            msg = f"No cache can be kept at {path}: {why}."
            raise StoreLocationError(msg) from error
        self.path = self._connections.path

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

    def close(self) -> None:
        """Close this thread's connection; the next use opens a new one."""
        self._connections.close()


# Keys compare byte by byte (COLLATE "C"): a prefix is then a range of the primary
# key's index, which `LIKE 'prefix%'` and the pages of `yield_keys` read.
_CREATE = (
    'CREATE TABLE IF NOT EXISTS {table} (key TEXT COLLATE "C" PRIMARY KEY, '
    "verdict TEXT NOT NULL, "
    "created DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now()))"
)
# Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalogue: the first
# session creates the table while the others wait on this lock.
_CREATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext(%s))"
_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
_GET = "SELECT key, verdict FROM {table} WHERE key = ANY(%s::text[])"
# In key order, so that writers of overlapping keys lock their rows in the same
# order and never deadlock.
_UPSERT = (
    "INSERT INTO {table} (key, verdict) "
    "SELECT key, verdict FROM unnest(%s::text[], %s::text[]) AS pair (key, verdict) "
    "ORDER BY key "
    "ON CONFLICT (key) DO UPDATE SET verdict = EXCLUDED.verdict, "
    "created = EXCLUDED.created"
)
_DELETE = "DELETE FROM {table} WHERE key = ANY(%s::text[])"
# One page of keys after the last one read (`>=` the prefix on the first page).
_KEYS = (
    "SELECT key FROM {table} WHERE key LIKE %s ESCAPE '\\' AND key {after} %s "
    "ORDER BY key LIMIT %s"
)
_KEYS_PAGE = 1000
_COUNT = "SELECT count(*) FROM {table}"
_CLEAR = "DELETE FROM {table}"


def _like_prefix(prefix: str) -> str:
    """The LIKE pattern of the strings that start with `prefix`."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


class PostgresVerdictCache(BaseStore[str, str]):
    """A store in one PostgreSQL table, shared by every machine that reaches it.

    Machines splitting one job (`tag run --shard I/N`) share their verdicts through
    it: a pair one of them judged is not paid for again by another. Needs psycopg 3
    (the `postgres` extra); threads share a bounded pool of connections
    (`PostgresConnections`). Each method is one statement, in one round trip.

    Writes are upserts (`INSERT ... ON CONFLICT DO UPDATE`) in key order, so writers
    of the same keys, on any machine, neither fail nor deadlock: the last one wins.
    Keys compare byte by byte (`COLLATE "C"`), so `yield_keys(prefix=)` reads a
    range of the primary key's index. PostgreSQL's text refuses NUL characters, in
    keys and values.

    The async methods are `BaseStore`'s (the sync ones in a worker thread): an async
    pool is bound to one event loop, while a cache serves sync and async callers on
    any loop, and the hop to a thread is small beside the round trip to the server.
    LangGraph's `PostgresStore` is not used: it keeps JSON documents under namespaces
    in one fixed table, and cannot list keys by prefix.

    Args:
        conninfo: A libpq connection string or `postgresql://` URI.
        table: The table, created if missing (an unquoted name, so PostgreSQL folds
            it to lower case).
        max_size: At most this many connections to the server.
        timeout: Seconds a caller waits for a free connection.
        read_only: Only read: the table must exist, nothing is created, the sessions
            are read-only, and `mset`, `mdelete` and `clear` raise `PermissionError`.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "tag_verdicts",
        max_size: int = 8,
        timeout: float = 30.0,
        read_only: bool = False,
    ) -> None:
        """Connect, and create the table if needed.

        Raises:
            StoreLocationError: The server cannot be reached, or `read_only` and
                the table is not there.
        """
        self.table = checked_table(table)
        self.read_only = read_only
        self._connections = PostgresConnections(
            conninfo,
            max_size=max_size,
            timeout=timeout,
            read_only=read_only,
            user="PostgresVerdictCache",
        )
        if read_only:
            if not self._connections.run(self._exists):
                msg = f"No table {table} at {self.location}: nothing was created."
                raise StoreLocationError(msg)
        else:
            self._connections.run(self._create, writes=True)

    @property
    def location(self) -> str:
        """The connection string, without a password."""
        return self._connections.location

    def _sql(self, template: str, **parts: str) -> str:
        return template.format(table=self.table, **parts)

    def _exists(self, conn: Connection[Any]) -> bool:
        row = conn.execute(_EXISTS, (self.table,)).fetchone()
        return bool(row and row[0])

    def _create(self, conn: Connection[Any]) -> None:
        with conn.transaction():
            conn.execute(_CREATE_LOCK, (self.table,))
            conn.execute(self._sql(_CREATE))

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        return self._connections.run(
            lambda conn: conn.execute(sql, parameters).fetchall()
        )

    def _write(self, sql: str, parameters: Sequence[Any] = ()) -> None:
        self._connections.run(lambda conn: conn.execute(sql, parameters), writes=True)

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        """The values of `keys`, None where missing."""
        if not keys:
            return []
        found = dict(self._query(self._sql(_GET), (list(keys),)))
        return [found.get(key) for key in keys]

    def mset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        """Store the pairs, in one statement (the last value of a repeated key).

        Raises:
            PermissionError: The cache was opened `read_only`.
        """
        if not key_value_pairs:
            return
        # One statement cannot update a row twice.
        pairs = dict(key_value_pairs)
        self._write(self._sql(_UPSERT), (list(pairs), list(pairs.values())))

    def mdelete(self, keys: Sequence[str]) -> None:
        """Forget `keys`.

        Raises:
            PermissionError: The cache was opened `read_only`.
        """
        if keys:
            self._write(self._sql(_DELETE), (list(keys),))

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """The stored keys (those starting with `prefix`), in byte order.

        Read a page at a time, each in its own statement: no connection is held
        while the caller iterates.
        """
        pattern = _like_prefix(prefix or "")
        after, compare = prefix or "", ">="
        while True:
            page = self._query(
                self._sql(_KEYS, after=compare), (pattern, after, _KEYS_PAGE)
            )
            yield from (key for (key,) in page)
            if len(page) < _KEYS_PAGE:
                return
            after, compare = page[-1][0], ">"

    def clear(self) -> None:
        """Forget every stored value.

        Raises:
            PermissionError: The cache was opened `read_only`.
        """
        self._write(self._sql(_CLEAR))

    def __len__(self) -> int:
        """Number of stored values."""
        return int(self._query(self._sql(_COUNT))[0][0])

    def close(self) -> None:
        """Close the connections; the next use opens them anew."""
        self._connections.close()


def open_verdict_cache(
    location: str | Path | None = None, **kwargs: Any
) -> InMemoryVerdictCache | SQLiteVerdictCache | PostgresVerdictCache:
    """The cache at `location`.

    Args:
        location: A `postgresql://` URI (`PostgresVerdictCache`, for several
            machines), `:memory:` or None (`InMemoryVerdictCache`, this process
            only), else the path of an SQLite file (`SQLiteVerdictCache`).
        **kwargs: The chosen cache's options (`table`, `timeout`, `maxsize`, ...).

    Raises:
        StoreLocationError: The path cannot hold a cache, or the server cannot be
            reached.
    """
    text = None if location is None else str(location)
    if text is None or text == ":memory:":
        return InMemoryVerdictCache(**kwargs)
    if text.startswith(_POSTGRES_SCHEMES):
        return PostgresVerdictCache(text, **kwargs)
    return SQLiteVerdictCache(text, **kwargs)
