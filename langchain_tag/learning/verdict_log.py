"""Verdict log: every judgment the judge makes, kept to learn from.

Each judgment (input, rule, verdict) is a labelled example for `LearnedPrefilter`.
The log appends one `VerdictRecord` per judgment that reached a model (cache
misses): the input, the rule's id and content hash, the verdict (applies, score,
error, and the judge's reason when it gave one), the model, prompt version and
profile, where it came from (`source`: `judge`, `cascade-cheap`, `cascade-strong`,
`relevance`) and when.

```python
log = SQLiteVerdictLog(".langchain-tag/verdicts.sqlite")
log.record(text, rule, verdict, model=..., prompt_version=..., profile=...)
prefilter.fit(log.examples(rulebook))
```

Two stores, one interface (`VerdictLog`):

- `SQLiteVerdictLog`: one file, WAL mode with a busy timeout, safe for several
  threads and processes on one machine (the verdict cache's connections).
- `PostgresVerdictLog`: one database shared by several machines (psycopg, the
  `postgres` extra); the threads of a process share a bounded pool of
  connections, the same as a verdict cache on that database.

Inputs are stored once each (keyed by SHA-256), verdicts point at them. A log
made before a column existed (`reason`) gets it, empty for the old rows, when it is
opened.

**Skip records** (`SkipRecord`, in the sibling table `<table>_skipped`): the pairs a
learned prefilter skipped, each with the P(YES | skipped) its model predicted and
the exploration rate. They are not verdicts: `records`, `examples` (unless
`skipped=True`, which yields them as `SkippedPair`s for `LearnedPrefilter.fit`),
`export`, `len` and `position` see verdicts only, and a release that does not know
the table never reads it. What they are for: the threshold step counts the skipped
pairs nobody judged, and `stream_counts` gives the miss-budget controller the
misses the models predicted (`langchain_tag.learning.promise`). Shadow judging
writes them (`record_skipped`) without waiting on the store: they go with the
log's next write. A log made before the table existed gets it when opened for
writing; read only, it reads as holding none.

**Reading only** (`read_only=True`, what `tag verdicts` and `tag prefilter train`
use): the log must exist, and nothing is created, altered or written (SQLite opens
the file `mode=ro`; a PostgreSQL session is read-only). A missing file, or a database
without the log's tables, raises `MissingVerdictLogError`; a log made before a
column existed reads it as empty.

**Keeping no text** (`store_text=False`): the input is stored as its hashed word
n-gram counts (`HashedFeatures`, what the learner trains on) and its SHA-256, never
as text. Nothing can be read back verbatim, but hashing is not encryption: whoever
has the file and a guess of the vocabulary can test which words and word pairs
occurred, and the digest confirms a guessed whole text. The trade-off: the log can
train only a learner with the same `FeatureHashing` (a new feature scheme needs new
verdicts), `tag verdicts export` gives features instead of texts, and the inputs
cannot be judged again by another model or read in a review. Switching an existing
log to `store_text=False` does not erase the texts it already holds.

**Retention** (`Retention`): at most `max_rows` verdicts and/or none older than
`max_age`, the oldest deleted first. Writers apply it every `prune_every` rows they
append, so a log may exceed `max_rows` by that much per writer until the next prune;
`prune()` applies it at once. Inputs no verdict points at any more are deleted with
it.

**A side channel**: the judge's retrieval never fails, nor waits, because its log
does. A write that fails (a locked database, a lost connection, ...) warns once
(`VerdictLogWarning`, naming the log and the error), and its records wait in memory
(`pending`); they are written first, in order, at the next successful write or at
`flush()`. While the log fails, a write only queues its records: one writer at a
time retries, waiting on the store at most once per retry interval (`retry_after`,
doubling up to `max_retry_after`), and SQLite in between without waiting (so a
released lock is noticed at the next write). Nothing paid for is lost while the
process lives, with two exceptions, each warned of and counted in `dropped`: past
`max_pending` records in memory the oldest are dropped, and a record that can never
be written (one the store rejects while it takes the others, such as a text with a
NUL character in PostgreSQL, or one that cannot be hashed) is dropped instead of
blocking the records after it.

Where it lives: the records in `_records`, the write-behind queue in `_write_queue`,
the interface every store offers in `_log` (`VerdictLog`), the statements in
`_log_sql`; this module holds the two stores.
"""

from __future__ import annotations

import abc
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from langchain_tag._sql import (
    PostgresConnections,
    SQLiteConnections,
    checked_table,
    sqlite_problem,
)
from langchain_tag.errors import (
    MissingVerdictLogError,
    StoreLocationError,
    VerdictLogWarning,
)
from langchain_tag.learning import _log_sql as log_sql
from langchain_tag.learning._log import VerdictLog
from langchain_tag.learning._records import (
    DEFAULT_TRAINING_SOURCES,
    LogRecord,
    Retention,
    RuleCounts,
    SkipRecord,
    VerdictLogStats,
    VerdictRecord,
)
from langchain_tag.learning.promise import StreamCounts

if TYPE_CHECKING:
    from psycopg import Connection

__all__ = [
    "DEFAULT_TRAINING_SOURCES",
    "MissingVerdictLogError",
    "PostgresVerdictLog",
    "Retention",
    "RuleCounts",
    "SQLiteVerdictLog",
    "SkipRecord",
    "VerdictLog",
    "VerdictLogStats",
    "VerdictLogWarning",
    "VerdictRecord",
    "open_verdict_log",
]

_TABLES_SHOWN = 20
"""At most this many tables are listed when the log's are not there."""


class _SQLVerdictLog(VerdictLog):
    """What both SQL stores run; each supplies connections and the dialect."""

    _types: Mapping[str, str]
    """The dialect's `id`, `bool` and `real` column types."""
    orphan_grace = 0.0
    """Seconds since its last use before an input no verdict points at is deleted."""

    def __init__(self, table: str, *, read_only: bool = False, **kwargs: Any) -> None:
        self.table = checked_table(table)
        super().__init__(**kwargs)
        self.inputs_table = f"{table}_inputs"
        self.skipped_table = f"{table}_skipped"
        self.read_only = read_only
        self._page_template = log_sql.PAGE_QUERY
        # False only for a log read only that was made before skip records.
        self._has_skips = True

    def _check_tables(self) -> None:
        """For reading only: refuse a database without the log's tables.

        A log made before a column was added (`log_sql.ADDED_COLUMNS`) is read
        with that column empty, as opening it for writing would have added it. A
        refused log's connections are closed.

        Raises:
            MissingVerdictLogError: A table is missing, or lacks a column every
                log has.
        """
        try:
            self._page_template = self._read_template()
        except BaseException:
            self._close()
            raise

    def _read_template(self) -> str:
        """The page query of the log's tables as they are; see `_check_tables`."""
        found = {
            name: self._columns_of(name) for name in (self.table, self.inputs_table)
        }
        missing = [name for name, columns in found.items() if not columns]
        if missing:
            names = self._table_names()
            shown = ", ".join(names[:_TABLES_SHOWN])
            if len(names) > _TABLES_SHOWN:
                shown += f", ... ({len(names)} in all)"
            msg = (
                f"{self.location} holds no table {' or '.join(missing)} (its "
                f"tables: {shown or 'none'})"
            )
            raise MissingVerdictLogError(msg)
        added = {name for name, _ in log_sql.ADDED_COLUMNS}
        needed = {
            self.table: [name for name in log_sql.COLUMN_NAMES if name not in added],
            self.inputs_table: list(log_sql.INPUT_COLUMNS),
        }
        for name, columns in needed.items():
            lacking = [column for column in columns if column not in found[name]]
            if lacking:
                msg = (
                    f"the table {name} in {self.location} is not a verdict log's: "
                    f"it has no column {', '.join(lacking)}"
                )
                raise MissingVerdictLogError(msg)
        self._has_skips = bool(self._columns_of(self.skipped_table))
        return log_sql.page_query(frozenset(added - set(found[self.table])))

    @abc.abstractmethod
    def _columns_of(self, table: str) -> list[str]:
        """The columns of `table`, none when there is no such table."""

    @abc.abstractmethod
    def _table_names(self) -> list[str]:
        """The tables the database holds (where the log's would be), sorted."""

    def _sql(self, template: str) -> str:
        skips = self.skipped_table if self._has_skips else log_sql.NO_SKIPS
        return template.format(
            t=self.table,
            i=self.inputs_table,
            s=skips.format(t=self.table),
            **self._types,
        )

    @abc.abstractmethod
    def _execute(self, statements: Sequence[log_sql.Statement]) -> list[int]:
        """Run each statement once per parameter row, all in one transaction.

        Returns the rows each statement affected.
        """

    @abc.abstractmethod
    def _query(self, template: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """The rows of one query."""

    def _insert(self, records: Sequence[LogRecord]) -> None:
        now = time.time()
        inputs = {
            r.input_digest: (
                r.input_digest,
                r.text,
                None if r.features is None else r.features.model_dump_json(),
                now,
            )
            for r in records
        }
        verdicts = [
            tuple(getattr(r, name) for name in log_sql.COLUMN_NAMES)
            for r in records
            if isinstance(r, VerdictRecord)
        ]
        skips = [
            tuple(getattr(r, name) for name in log_sql.SKIP_NAMES)
            for r in records
            if isinstance(r, SkipRecord)
        ]
        statements: list[log_sql.Statement] = [
            (log_sql.UPSERT_INPUT, list(inputs.values())),
            (log_sql.INSERT_VERDICT, verdicts),
        ]
        if skips:
            statements.append((log_sql.INSERT_SKIP, skips))
        self._execute(statements)

    def _page(self, after: int, limit: int) -> list[VerdictRecord]:
        return [
            log_sql.verdict_record(row)
            for row in self._query(self._page_template, (after, limit))
        ]

    def _skip_page(self, after: int, limit: int) -> list[SkipRecord]:
        return [
            log_sql.skip_record(row)
            for row in self._query(log_sql.SKIP_PAGE, (after, limit))
        ]

    def _prune(self, cutoff: float | None, max_rows: int | None) -> int:
        statements: list[log_sql.Statement] = []
        if cutoff is not None:
            statements.append((log_sql.DELETE_OLDER, [(cutoff,)]))
        if max_rows is not None:
            statements.append((log_sql.DELETE_BEYOND, [(max_rows,)]))
        if not statements:
            return 0
        deleted = len(statements)
        if cutoff is not None:
            statements.append((log_sql.DELETE_OLDER_SKIPS, [(cutoff,)]))
        if max_rows is not None:
            statements.append((log_sql.DELETE_SKIPS_BEFORE_VERDICTS, [()]))
        statements.append(
            (log_sql.DELETE_ORPHANS, [(time.time() - self.orphan_grace,)])
        )
        return sum(self._execute(statements)[:deleted])

    def stream_counts(
        self,
        *,
        since: int = 0,
        sources: Sequence[str] | None = DEFAULT_TRAINING_SOURCES,
    ) -> StreamCounts:
        """See `VerdictLog.stream_counts`; a few aggregate queries."""
        chosen = () if sources is None else tuple(sources)
        where = (
            ""
            if sources is None
            else f" AND source IN ({', '.join('?' * len(chosen))})"
            if chosen
            else " AND 1 = 0"
        )
        latest = log_sql.LATEST.replace("{sources}", where)
        ((kept, shadow, warm_yes),) = self._query(
            log_sql.STREAM_YES.replace("{latest}", latest), chosen
        )
        ((screened, predicted, explored),) = self._query(log_sql.STREAM_SKIPS)
        ((inputs,),) = self._query(
            log_sql.STREAM_INPUTS.replace("{sources}", where), chosen
        )
        ((recent, recent_inputs),) = self._query(log_sql.STREAM_RECENT, (since,))
        return StreamCounts(
            inputs=int(inputs),
            warm_inputs=max(0, int(inputs) - int(screened)),
            warm_yes=int(warm_yes),
            kept_yes=int(kept),
            shadow_yes=int(shadow),
            predicted_misses=float(predicted),
            explored_misses=float(explored),
            recent_inputs=int(recent_inputs),
            recent_verdicts=int(recent),
        )

    def stats(self) -> VerdictLogStats:
        """Counts of what the log holds."""
        (totals,) = self._query(log_sql.TOTALS)
        (stored,) = self._query(log_sql.STORED)
        ((skipped,),) = self._query(log_sql.SKIP_COUNT)
        return VerdictLogStats(
            verdicts=totals[0],
            skipped=skipped,
            inputs=totals[1],
            inputs_with_text=stored[0],
            inputs_hashed=stored[1],
            rules=totals[2],
            applies=totals[3],
            failed=totals[4],
            shadow=totals[5],
            oldest=totals[6],
            newest=totals[7],
            position=totals[8],
            by_source=dict(self._query(log_sql.BY_SOURCE)),
            by_model=dict(self._query(log_sql.BY_MODEL)),
            per_rule={
                rule_id: RuleCounts(judged=n, applies=applies)
                for rule_id, n, applies in self._query(log_sql.PER_RULE)
            },
        )

    def __len__(self) -> int:
        """Number of verdicts held."""
        return int(self._query(log_sql.COUNT)[0][0])

    def position(self) -> int:
        """The id of the newest verdict (0 when empty); see `RetrainPolicy`."""
        return int(self._query(log_sql.POSITION)[0][0])

    def clear(self) -> None:
        """Delete every verdict and input."""
        self._refuse_if_read_only()
        self._execute([(template, [()]) for template in log_sql.CLEAR])


class SQLiteVerdictLog(_SQLVerdictLog):
    """The verdict log in one SQLite file, safe for several threads and processes.

    Args:
        path: The database file (created with its directory if needed); it may be
            the verdict cache's file, the tables differ.
        table: The verdicts table; inputs go in `<table>_inputs`.
        timeout: Seconds a writer waits for another's lock; then its records are
            kept in memory until the next write (see `VerdictLog.append`). While
            the log fails, writes wait this long at most once per retry interval,
            and in between try without waiting.
        read_only: Only read the log, which must exist: the file is opened
            `mode=ro` and nothing is created or changed in it.
        **kwargs: `store_text`, `hashing`, `retention`, `max_pending`,
            `retry_after`, `max_retry_after`, `clock` (see `VerdictLog`).
    """

    # AUTOINCREMENT: ids are never reused, so positions only grow (RetrainPolicy).
    _types: Mapping[str, str] = MappingProxyType(
        {"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "bool": "INTEGER", "real": "REAL"}
    )

    def __init__(
        self,
        path: str | Path,
        *,
        table: str = "verdict_log",
        timeout: float = 30.0,
        read_only: bool = False,
        **kwargs: Any,
    ) -> None:
        """Open (creating if needed) the log's tables in the file at `path`.

        Raises:
            StoreLocationError: `path` is a directory, cannot be created or
                written, or is not an SQLite database.
            MissingVerdictLogError: `read_only`, and there is no such file or it
                holds no verdict log in `table`.
        """
        super().__init__(table, read_only=read_only, **kwargs)
        if read_only and not Path(path).is_file():
            why = "it is a directory" if Path(path).is_dir() else "no such file"
            msg = f"no verdict log at {path}: {why}"
            raise MissingVerdictLogError(msg)
        self.path = Path(path)
        if read_only:
            self._connections = SQLiteConnections(path, timeout=timeout, read_only=True)
            self._check_tables()
            return
        try:
            self._connections = SQLiteConnections(path, timeout=timeout)
            self._execute([(template, [()]) for template in log_sql.SCHEMA])
            self._add_missing_columns()
        except (OSError, sqlite3.Error) as error:
            if "locked" in str(error):
                raise  # a writer held the lock past the timeout: not the path's fault
            why = sqlite_problem(Path(path), error)
            msg = f"No verdict log can be kept at {path}: {why}."
            raise StoreLocationError(msg) from error

    def _add_missing_columns(self) -> None:
        """Add the columns a log made by an older version lacks (`ADDED_COLUMNS`).

        SQLite has no `ADD COLUMN IF NOT EXISTS`: the check and the change run in
        one write transaction, so processes opening the log at once add each once.
        """
        with self._connections.writing() as conn:
            have = {row[1] for row in conn.execute(self._sql("PRAGMA table_info({t})"))}
            for name, kind in log_sql.ADDED_COLUMNS:
                if name not in have:
                    conn.execute(self._sql(f"{log_sql.ADD_COLUMN}{name} {kind}"))

    def _execute(self, statements: Sequence[log_sql.Statement]) -> list[int]:
        with self._connections.writing() as conn:
            return [
                conn.executemany(self._sql(template), rows).rowcount
                for template, rows in statements
            ]

    def _query(self, template: str, parameters: Sequence[Any] = ()) -> list[Any]:
        conn = self._connections.get()
        with conn:  # ends the read transaction, so WAL checkpoints can proceed
            return conn.execute(self._sql(template), parameters).fetchall()

    def _columns_of(self, table: str) -> list[str]:
        return [row[1] for row in self._query(f"PRAGMA table_info({table})")]

    def _table_names(self) -> list[str]:
        rows = self._query(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        )
        return [name for (name,) in rows]

    _writes_at_once = True

    def _insert_at_once(self, records: Sequence[LogRecord]) -> None:
        """`_insert` with no busy timeout: "database is locked" at once if it is."""
        conn = self._connections.get()
        conn.execute("PRAGMA busy_timeout=0")
        try:
            self._insert(records)
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self._connections.timeout * 1000)}")

    @property
    def location(self) -> str:
        """The database file."""
        return str(self.path)

    def _close(self) -> None:
        self._connections.close()


class PostgresVerdictLog(_SQLVerdictLog):
    """The verdict log in a PostgreSQL database, for several machines.

    Needs psycopg 3 (the `postgres` extra). Threads share a bounded pool of
    connections (`_sql.PostgresConnections`), the one a verdict cache on the same
    database in this process uses too.

    Args:
        conninfo: A libpq connection string or `postgresql://` URI.
        table: The verdicts table; inputs go in `<table>_inputs`.
        max_size: At most this many connections to the server (in the pool it
            shares).
        timeout: Seconds a write waits for a free connection; then its records
            are kept in memory until the next write (see `VerdictLog.append`).
        read_only: Only read the log, which must exist: no schema statement is
            run, and the sessions are read-only.
        **kwargs: `store_text`, `hashing`, `retention`, `max_pending`,
            `retry_after`, `max_retry_after`, `clock` (see `VerdictLog`).
    """

    _types: Mapping[str, str] = MappingProxyType(
        {"id": "BIGSERIAL PRIMARY KEY", "bool": "BOOLEAN", "real": "DOUBLE PRECISION"}
    )
    # Writers in other sessions commit independently: an input whose verdict is
    # still being written has been used within the last minute, and is kept.
    orphan_grace = 60.0

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "tag_verdict_log",
        max_size: int = 8,
        timeout: float = 30.0,
        read_only: bool = False,
        **kwargs: Any,
    ) -> None:
        """Connect and create the log's tables if needed.

        Raises:
            StoreLocationError: The server cannot be reached.
            MissingVerdictLogError: `read_only`, and the database holds no verdict
                log in `table`.
        """
        super().__init__(table, read_only=read_only, **kwargs)
        self._connections = PostgresConnections(
            conninfo,
            max_size=max_size,
            timeout=timeout,
            read_only=read_only,
            user="PostgresVerdictLog",
        )
        if read_only:
            self._check_tables()
        else:
            self._connections.run(self._create, writes=True)

    def _create(self, conn: Connection[Any]) -> None:
        """Create the tables, and add the columns a log made before lacks."""
        added = (
            f"{log_sql.ADD_COLUMN}IF NOT EXISTS {name} {kind}"
            for name, kind in log_sql.ADDED_COLUMNS
        )
        # One statement at a time, not prepared (nor pipelined, as `executemany`
        # is): after an ALTER psycopg forgets its prepared statements, and in a
        # pipeline it forgot those prepared after the ALTER too, which were then
        # missing (InvalidSqlStatementName). So the session goes back to the pool
        # fit for the records.
        with conn.transaction():
            # Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalogue:
            # the first writer creates the schema while the others wait on it.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (self.table,),
                prepare=False,
            )
            for template in (*log_sql.SCHEMA, *added):
                conn.execute(self._sql(template), prepare=False)

    @property
    def conninfo(self) -> str:
        """The connection string."""
        return self._connections.conninfo

    @property
    def location(self) -> str:
        """The connection string, without a password."""
        return self._connections.location

    def _sql(self, template: str) -> str:
        return super()._sql(template).replace("?", "%s")

    def _execute(self, statements: Sequence[log_sql.Statement]) -> list[int]:
        def run(conn: Connection[Any]) -> list[int]:
            counts = []
            with conn.transaction(), conn.cursor() as cursor:
                for template, rows in statements:
                    cursor.executemany(self._sql(template), rows)
                    counts.append(max(cursor.rowcount, 0))
            return counts

        return self._connections.run(run, writes=True)

    def _query(self, template: str, parameters: Sequence[Any] = ()) -> list[Any]:
        sql = self._sql(template)
        return self._connections.run(
            lambda conn: list(conn.execute(sql, parameters).fetchall())
        )

    def _columns_of(self, table: str) -> list[str]:
        # to_regclass resolves the name as the log's statements do (search path,
        # unquoted names folded to lower case), and is NULL when there is none.
        rows = self._query(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(?) "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (table,),
        )
        return [name for (name,) in rows]

    def _table_names(self) -> list[str]:
        rows = self._query(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = ANY (current_schemas(false)) ORDER BY table_name"
        )
        return [name for (name,) in rows]

    def _close(self) -> None:
        self._connections.close()


def open_verdict_log(location: str | Path, **kwargs: Any) -> VerdictLog:
    """The log at `location`: a `postgresql://` URI, else an SQLite file path."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresVerdictLog(text, **kwargs)
    return SQLiteVerdictLog(location, **kwargs)
