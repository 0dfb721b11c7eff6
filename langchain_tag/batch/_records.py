"""Where the batch lane keeps its jobs and their answers: tables of their own.

A job's record (the requests uploaded, the batch made of them, its last known
state) lives from before its batch is created until its answers are stored; an
answer (a judgment or an execution paid for) until the judge has made it a verdict
(the executor's stay: they are its cache). `job_records(store)` keeps both beside
the verdict cache the caller gave, through that cache's own connections:

- `SQLiteVerdictCache`: tables `batch_jobs` and `batch_job_answers` in its file;
- `PostgresVerdictCache`: `tag_batch_jobs` and `tag_batch_job_answers` in its
  database, through its pool (no second one);
- `InMemoryVerdictCache`: dictionaries kept with the cache object, for this process
  only, and never evicted (the cache's own entries are, least recently used first);
- any other `BaseStore`: that store itself, under the keys
  `tag-batch:job:<lane>:<input file id>` and `tag-batch:answer:<lane>:<custom id>`
  (the lane cannot make a table in a store it does not know).

Tables rather than cache keys: listing a lane's records read every key of an
SQLite cache (185 ms per listing beside 200,000 verdicts, 0.3 ms from the table);
a finished batch's answers and the deletion of its record are one transaction; and
no cache eviction reaches them.

The previous version kept records and answers under those keys in the verdict
cache's table. Opening the tables moves any found there, in the transaction that
creates the tables, so a run resumes what a run of that version left.

Rows are provider-neutral (provider, endpoint, lane, the provider's input id, batch
id, custom ids, state): another provider's batches fit the same tables. Every
method is one transaction.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar
from weakref import WeakKeyDictionary

from langchain_core.stores import BaseStore
from pydantic import BaseModel, ConfigDict, ValidationError

from langchain_tag._sql import PostgresConnections, SQLiteConnections
from langchain_tag.cache import (
    InMemoryVerdictCache,
    PostgresVerdictCache,
    SQLiteVerdictCache,
)

if TYPE_CHECKING:
    from psycopg import Connection

logger = logging.getLogger(__name__)

Lane = Literal["judge", "execute"]

RECORDS = "tag-batch:job:"
"""Prefix of the store keys of records: `tag-batch:job:<lane>:<input file id>`."""
ANSWERS = "tag-batch:answer:"
"""Prefix of the store keys of answers: `tag-batch:answer:<lane>:<custom id>`."""

_T = TypeVar("_T")


class JobRecord(BaseModel):
    """What is kept of a batch job until its answers are stored."""

    model_config = ConfigDict(frozen=True)

    provider: str
    """Whose Batch API runs the job (`openai`)."""
    endpoint: str
    """The API's base URL: a record is collected through a client of the same."""
    lane: Lane
    input_file_id: str
    """The uploaded requests: the job's id at its provider before it has a batch."""
    batch_id: str | None = None
    custom_ids: list[str]
    """The requests' keys (a judgment's cache key, an execution's request hash)."""
    state: str = "uploaded"
    """`uploaded` until the batch exists; then the batch's status when last seen
    (`validating`, `in_progress`, ...; `created` for a record of the previous
    version)."""
    created: int
    """When the input file was uploaded (the provider's clock)."""
    updated: float = 0.0
    """When the record was last saved (this machine's clock, seconds since 1970)."""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What identifies the record: provider, endpoint, lane, input file id."""
        return (self.provider, self.endpoint, self.lane, self.input_file_id)


def _record(value: str) -> JobRecord:
    """A record from its JSON, in this version's form or the previous one's."""
    data = json.loads(value)
    if isinstance(data, dict) and "file_id" in data:  # the previous version's
        data = {
            "provider": "openai",
            "input_file_id": data.pop("file_id"),
            "state": "uploaded" if data.get("batch_id") is None else "created",
            **data,
        }
    return JobRecord.model_validate(data)


class JobRecords(ABC):
    """The batch jobs and answers of every lane; each method one transaction."""

    @abstractmethod
    def save(self, record: JobRecord) -> None:
        """Insert `record`, or replace the stored one with its key."""

    @abstractmethod
    def get(self, record: JobRecord) -> JobRecord | None:
        """The record with `record`'s key as stored now; None if there is none."""

    @abstractmethod
    def jobs(self, provider: str, endpoint: str, lane: Lane) -> list[JobRecord]:
        """The records of `lane` at `endpoint`, oldest first."""

    @abstractmethod
    def set_state(self, record: JobRecord, state: str) -> None:
        """Change the stored record's state; nothing if it was deleted meanwhile.

        Never an insert: a process that polls a batch another one has just
        collected must not bring its record back.
        """

    @abstractmethod
    def delete(self, record: JobRecord) -> None:
        """Delete the record with `record`'s key."""

    @abstractmethod
    def finish(self, record: JobRecord, answers: Mapping[str, str]) -> None:
        """Store `answers` (custom id -> body) and delete `record`, at once."""

    @abstractmethod
    def answers(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> dict[str, str]:
        """The stored answers of those of `custom_ids` that have one."""

    @abstractmethod
    def answered(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> set[str]:
        """Those of `custom_ids` that have a stored answer."""

    @abstractmethod
    def forget(self, provider: str, lane: Lane, custom_ids: Iterable[str]) -> None:
        """Delete the answers of `custom_ids`."""


# --- in memory -----------------------------------------------------------------------


class _MemoryJobRecords(JobRecords):
    """Records and answers in dictionaries: this process only."""

    def __init__(self) -> None:
        """Start empty."""
        self._jobs: dict[tuple[str, str, str, str], JobRecord] = {}
        self._answers: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def save(self, record: JobRecord) -> None:
        with self._lock:
            self._jobs[record.key] = record.model_copy(update={"updated": time.time()})

    def get(self, record: JobRecord) -> JobRecord | None:
        with self._lock:
            return self._jobs.get(record.key)

    def jobs(self, provider: str, endpoint: str, lane: Lane) -> list[JobRecord]:
        with self._lock:
            found = [
                r
                for key, r in self._jobs.items()
                if key[:3] == (provider, endpoint, lane)
            ]
        return sorted(found, key=lambda r: (r.created, r.input_file_id))

    def set_state(self, record: JobRecord, state: str) -> None:
        with self._lock:
            stored = self._jobs.get(record.key)
            if stored is not None:
                update = {"state": state, "updated": time.time()}
                self._jobs[record.key] = stored.model_copy(update=update)

    def delete(self, record: JobRecord) -> None:
        with self._lock:
            self._jobs.pop(record.key, None)

    def finish(self, record: JobRecord, answers: Mapping[str, str]) -> None:
        with self._lock:
            for custom_id, body in answers.items():
                self._answers[record.provider, record.lane, custom_id] = body
            self._jobs.pop(record.key, None)

    def answers(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> dict[str, str]:
        with self._lock:
            found = ((i, self._answers.get((provider, lane, i))) for i in custom_ids)
            return {i: body for i, body in found if body is not None}

    def answered(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> set[str]:
        with self._lock:
            return {i for i in custom_ids if (provider, lane, i) in self._answers}

    def forget(self, provider: str, lane: Lane, custom_ids: Iterable[str]) -> None:
        with self._lock:
            for custom_id in custom_ids:
                self._answers.pop((provider, lane, custom_id), None)


# --- in any store, under keys --------------------------------------------------------


class _KeyedJobRecords(JobRecords):
    """Records and answers as values of a `BaseStore` the lane has no table in.

    A `BaseStore` has no transaction: `finish` stores the answers before it deletes
    the record (a kill between leaves both, and the batch is read again), and
    `set_state` reads, then writes.
    """

    def __init__(self, store: BaseStore[str, str]) -> None:
        """Keep the records and answers in `store`."""
        self.store = store

    @staticmethod
    def _job_key(record: JobRecord) -> str:
        return f"{RECORDS}{record.lane}:{record.input_file_id}"

    @staticmethod
    def _answer_keys(lane: Lane, custom_ids: Iterable[str]) -> list[str]:
        return [f"{ANSWERS}{lane}:{custom_id}" for custom_id in custom_ids]

    def save(self, record: JobRecord) -> None:
        stamped = record.model_copy(update={"updated": time.time()})
        self.store.mset([(self._job_key(record), stamped.model_dump_json())])

    def get(self, record: JobRecord) -> JobRecord | None:
        (value,) = self.store.mget([self._job_key(record)])
        return None if value is None else _record(value)

    def jobs(self, provider: str, endpoint: str, lane: Lane) -> list[JobRecord]:
        keys = list(self.store.yield_keys(prefix=f"{RECORDS}{lane}:"))
        found = [_record(value) for value in self.store.mget(keys) if value is not None]
        return sorted(
            (r for r in found if (r.provider, r.endpoint) == (provider, endpoint)),
            key=lambda r: (r.created, r.input_file_id),
        )

    def set_state(self, record: JobRecord, state: str) -> None:
        stored = self.get(record)
        if stored is not None:
            self.save(stored.model_copy(update={"state": state}))

    def delete(self, record: JobRecord) -> None:
        self.store.mdelete([self._job_key(record)])

    def finish(self, record: JobRecord, answers: Mapping[str, str]) -> None:
        keys = self._answer_keys(record.lane, answers)
        self.store.mset(list(zip(keys, answers.values(), strict=True)))
        self.delete(record)

    def answers(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> dict[str, str]:
        ids = list(custom_ids)
        stored = self.store.mget(self._answer_keys(lane, ids))
        return {i: v for i, v in zip(ids, stored, strict=True) if v is not None}

    def answered(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> set[str]:
        return set(self.answers(provider, lane, custom_ids))

    def forget(self, provider: str, lane: Lane, custom_ids: Iterable[str]) -> None:
        self.store.mdelete(self._answer_keys(lane, custom_ids))


# --- in tables -----------------------------------------------------------------------


class _Cursor(Protocol):
    """What SQLite's and psycopg's cursors both do."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...

    def fetchall(self) -> list[Any]: ...


# One statement text for both databases: `?` marks become `%s` for psycopg, and
# SQLite reads BIGINT and DOUBLE PRECISION as its INTEGER and REAL.
_COLUMNS = (
    "provider, endpoint, lane, input_file_id, batch_id, state, custom_ids, "
    "created, updated"
)
_CREATE_JOBS = (
    "CREATE TABLE IF NOT EXISTS {jobs} (provider TEXT NOT NULL, "
    "endpoint TEXT NOT NULL, lane TEXT NOT NULL, input_file_id TEXT NOT NULL, "
    "batch_id TEXT, state TEXT NOT NULL, custom_ids TEXT NOT NULL, "
    "created BIGINT NOT NULL, updated DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (provider, endpoint, lane, input_file_id))"
)
_CREATE_ANSWERS = (
    "CREATE TABLE IF NOT EXISTS {answers} (provider TEXT NOT NULL, "
    "lane TEXT NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL, "
    "created DOUBLE PRECISION NOT NULL, PRIMARY KEY (provider, lane, custom_id))"
)
_INSERT = (
    f"INSERT INTO {{jobs}} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "  # noqa: S608 - checked identifiers
    "ON CONFLICT (provider, endpoint, lane, input_file_id) DO "
)
_SAVE = _INSERT + (
    "UPDATE SET batch_id = excluded.batch_id, state = excluded.state, "
    "custom_ids = excluded.custom_ids, created = excluded.created, "
    "updated = excluded.updated"
)
_KEEP = _INSERT + "NOTHING"
_THE_JOB = "provider = ? AND endpoint = ? AND lane = ? AND input_file_id = ?"
_GET = f"SELECT {_COLUMNS} FROM {{jobs}} WHERE {_THE_JOB}"  # noqa: S608
_JOBS = (
    f"SELECT {_COLUMNS} FROM {{jobs}} WHERE provider = ? AND endpoint = ? "  # noqa: S608
    "AND lane = ? ORDER BY created, input_file_id"
)
_STATE = f"UPDATE {{jobs}} SET state = ?, updated = ? WHERE {_THE_JOB}"  # noqa: S608
_DELETE = f"DELETE FROM {{jobs}} WHERE {_THE_JOB}"  # noqa: S608
_ANSWER = (
    "INSERT INTO {answers} (provider, lane, custom_id, body, created) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (provider, lane, custom_id) DO "
)
_PUT_ANSWER = _ANSWER + "UPDATE SET body = excluded.body, created = excluded.created"
_KEEP_ANSWER = _ANSWER + "NOTHING"
_ANSWERS = (
    "SELECT custom_id, {what} FROM {answers} WHERE provider = ? AND lane = ? "
    "AND custom_id IN ({marks})"
)
_FORGET = "DELETE FROM {answers} WHERE provider = ? AND lane = ? AND custom_id = ?"
# The previous version's keys in the cache's table, a page after the last one read.
_LEGACY = (
    "SELECT key, verdict FROM {cache} WHERE key > ? AND key < ? ORDER BY key LIMIT ?"
)
_DROP_LEGACY = "DELETE FROM {cache} WHERE key = ?"
_PAGE = 500
"""Keys moved, or answers read, per statement (SQLite's default limit on bound
parameters is 999)."""


def _row(record: JobRecord) -> tuple[Any, ...]:
    return (
        *record.key,
        record.batch_id,
        record.state,
        json.dumps(record.custom_ids),
        record.created,
        time.time(),
    )


def _from_row(row: Sequence[Any]) -> JobRecord:
    provider, endpoint, lane, file_id, batch_id, state, ids, created, updated = row
    return JobRecord(
        provider=provider,
        endpoint=endpoint,
        lane=lane,
        input_file_id=file_id,
        batch_id=batch_id,
        custom_ids=json.loads(ids),
        state=state,
        created=created,
        updated=updated,
    )


class _TableJobRecords(JobRecords):
    """Records and answers in two tables beside a verdict cache's."""

    def __init__(self, jobs: str, answers: str, cache_table: str) -> None:
        if cache_table in (jobs, answers):
            msg = (
                f"The verdict cache's table is named {cache_table}, as a table of "
                "the batch lane's jobs is: give the cache another table name."
            )
            raise ValueError(msg)
        self._tables = {"jobs": jobs, "answers": answers, "cache": cache_table}
        self.jobs_table, self.answers_table = jobs, answers
        self._write(self._open)

    @abstractmethod
    def _read(self, work: Callable[[_Cursor], _T]) -> _T:
        """`work` on a cursor."""

    @abstractmethod
    def _write(self, work: Callable[[_Cursor], _T]) -> _T:
        """`work` on a cursor, in one transaction."""

    def _sql(self, template: str, **parts: str) -> str:
        return template.format(**self._tables, **parts)

    def _open(self, cur: _Cursor) -> None:
        """Create the tables; move in what the previous version kept as cache keys."""
        cur.execute(self._sql(_CREATE_JOBS))
        cur.execute(self._sql(_CREATE_ANSWERS))
        moved = self._move(cur, RECORDS, self._moved_record)
        moved += self._move(cur, ANSWERS, self._moved_answer)
        if moved:
            logger.info(
                "Moved %d batch records and answers from the cache table %s into "
                "%s and %s.",
                moved,
                self._tables["cache"],
                self.jobs_table,
                self.answers_table,
            )

    def _move(
        self, cur: _Cursor, prefix: str, move: Callable[[_Cursor, str, str], bool]
    ) -> int:
        """Move the cache's keys under `prefix` with `move`; how many moved.

        A key `move` cannot read stays where it is (said in a warning): nothing the
        previous version kept is deleted unread.
        """
        after, end = prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
        moved: list[str] = []
        while True:
            cur.execute(self._sql(_LEGACY), (after, end, _PAGE))
            page = cur.fetchall()
            moved += [key for key, value in page if move(cur, key, value)]
            if len(page) < _PAGE:
                break
            after = page[-1][0]
        cur.executemany(self._sql(_DROP_LEGACY), [(key,) for key in moved])
        return len(moved)

    def _moved_record(self, cur: _Cursor, key: str, value: str) -> bool:
        try:
            record = _record(value)
        except (ValueError, ValidationError) as error:
            logger.warning("The batch record %s is unreadable, left: %s", key, error)
            return False
        cur.execute(self._sql(_KEEP), _row(record))
        return True

    def _moved_answer(self, cur: _Cursor, key: str, value: str) -> bool:
        lane, _, custom_id = key.removeprefix(ANSWERS).partition(":")
        if lane not in ("judge", "execute") or not custom_id:
            logger.warning("The batch answer key %s is not one, left.", key)
            return False
        parameters = ("openai", lane, custom_id, value, time.time())
        cur.execute(self._sql(_KEEP_ANSWER), parameters)
        return True

    def save(self, record: JobRecord) -> None:
        self._write(lambda cur: cur.execute(self._sql(_SAVE), _row(record)))

    def get(self, record: JobRecord) -> JobRecord | None:
        def read(cur: _Cursor) -> list[Any]:
            cur.execute(self._sql(_GET), record.key)
            return cur.fetchall()

        rows = self._read(read)
        return _from_row(rows[0]) if rows else None

    def jobs(self, provider: str, endpoint: str, lane: Lane) -> list[JobRecord]:
        def read(cur: _Cursor) -> list[Any]:
            cur.execute(self._sql(_JOBS), (provider, endpoint, lane))
            return cur.fetchall()

        return [_from_row(row) for row in self._read(read)]

    def set_state(self, record: JobRecord, state: str) -> None:
        parameters = (state, time.time(), *record.key)
        self._write(lambda cur: cur.execute(self._sql(_STATE), parameters))

    def delete(self, record: JobRecord) -> None:
        self._write(lambda cur: cur.execute(self._sql(_DELETE), record.key))

    def finish(self, record: JobRecord, answers: Mapping[str, str]) -> None:
        now = time.time()
        # In key order: writers of the same answers lock them in one order.
        rows = [
            (record.provider, record.lane, custom_id, answers[custom_id], now)
            for custom_id in sorted(answers)
        ]

        def finish(cur: _Cursor) -> None:
            cur.executemany(self._sql(_PUT_ANSWER), rows)
            cur.execute(self._sql(_DELETE), record.key)

        self._write(finish)

    def _answers(
        self, provider: str, lane: Lane, custom_ids: Iterable[str], what: str
    ) -> list[Any]:
        ids = list(dict.fromkeys(custom_ids))

        def read(cur: _Cursor) -> list[Any]:
            found = []
            for start in range(0, len(ids), _PAGE):
                chunk = ids[start : start + _PAGE]
                marks = ", ".join("?" * len(chunk))
                query = self._sql(_ANSWERS, what=what, marks=marks)
                cur.execute(query, (provider, lane, *chunk))
                found += cur.fetchall()
            return found

        return self._read(read) if ids else []

    def answers(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> dict[str, str]:
        ids = list(custom_ids)
        found = dict(self._answers(provider, lane, ids, "body"))
        return {i: found[i] for i in ids if i in found}  # in the order asked

    def answered(
        self, provider: str, lane: Lane, custom_ids: Iterable[str]
    ) -> set[str]:
        return {i for i, _ in self._answers(provider, lane, custom_ids, "NULL")}

    def forget(self, provider: str, lane: Lane, custom_ids: Iterable[str]) -> None:
        rows = [(provider, lane, custom_id) for custom_id in sorted(set(custom_ids))]
        if rows:
            self._write(lambda cur: cur.executemany(self._sql(_FORGET), rows))


class _SQLiteJobRecords(_TableJobRecords):
    """The tables `batch_jobs` and `batch_job_answers` in an SQLite cache's file."""

    def __init__(self, connections: SQLiteConnections, cache_table: str) -> None:
        """Use `connections` (the cache's); create the tables, move legacy keys."""
        self._connections = connections
        super().__init__("batch_jobs", "batch_job_answers", cache_table)

    def _read(self, work: Callable[[_Cursor], _T]) -> _T:
        return work(self._connections.get().cursor())

    def _write(self, work: Callable[[_Cursor], _T]) -> _T:
        with self._connections.writing() as conn:
            return work(conn.cursor())


# Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalogue, and two
# processes moving the same legacy keys could bring back a record a third has
# collected between them: the opening transactions run one after another.
_OPEN_LOCK = "SELECT pg_advisory_xact_lock(hashtext(%s))"


class _PostgresJobRecords(_TableJobRecords):
    """Tables `tag_batch_jobs` and `tag_batch_job_answers`, through a cache's pool."""

    def __init__(self, connections: PostgresConnections, cache_table: str) -> None:
        """Use `connections` (the cache's); create the tables, move legacy keys."""
        self._connections = connections
        super().__init__("tag_batch_jobs", "tag_batch_job_answers", cache_table)

    def _sql(self, template: str, **parts: str) -> str:
        return super()._sql(template, **parts).replace("?", "%s")

    def _read(self, work: Callable[[_Cursor], _T]) -> _T:
        def read(conn: Connection[Any]) -> _T:
            with conn.cursor() as cur:
                return work(cur)

        return self._connections.run(read)

    def _write(self, work: Callable[[_Cursor], _T]) -> _T:
        def transaction(conn: Connection[Any]) -> _T:
            # The pool repeats `work` on a dropped connection: rolled back first.
            with conn.transaction(), conn.cursor() as cur:
                return work(cur)

        return self._connections.run(transaction, writes=True)

    def _open(self, cur: _Cursor) -> None:
        cur.execute(_OPEN_LOCK, (self.jobs_table,))
        super()._open(cur)


# --- which ---------------------------------------------------------------------------

_OPENED: WeakKeyDictionary[BaseStore[str, str], JobRecords] = WeakKeyDictionary()
_OPENING = threading.Lock()


def job_records(store: BaseStore[str, str]) -> JobRecords:
    """The job records kept beside `store` (see the module), opened once per store.

    Raises:
        ValueError: The cache's table has the name of one of the lane's tables.
    """
    if not isinstance(
        store, SQLiteVerdictCache | PostgresVerdictCache | InMemoryVerdictCache
    ):
        return _KeyedJobRecords(store)
    with _OPENING:
        records = _OPENED.get(store)
        if records is None:
            records = _opened(store)
            _OPENED[store] = records
        return records


def _opened(
    cache: SQLiteVerdictCache | PostgresVerdictCache | InMemoryVerdictCache,
) -> JobRecords:
    # The cache's own connections: one set per thread (SQLite) or one pool
    # (PostgreSQL) per database, whatever number of stores use it.
    if isinstance(cache, SQLiteVerdictCache):
        return _SQLiteJobRecords(cache._connections, cache.table)  # noqa: SLF001
    if isinstance(cache, PostgresVerdictCache):
        return _PostgresJobRecords(cache._connections, cache.table)  # noqa: SLF001
    return _MemoryJobRecords()
