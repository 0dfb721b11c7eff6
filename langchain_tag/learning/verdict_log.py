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
  `postgres` extra).

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
"""

from __future__ import annotations

import abc
import asyncio
import heapq
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag._sql import SQLiteConnections
from langchain_tag._text import digest
from langchain_tag.errors import TAGError
from langchain_tag.learning.learned_prefilter import (
    FeatureHashing,
    HashedFeatures,
    LabelledExample,
    SkippedPair,
)
from langchain_tag.learning.promise import StreamCounts
from langchain_tag.matching.judge import Verdict
from langchain_tag.models import without_password
from langchain_tag.rules import Rule, Rulebook

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

logger = logging.getLogger(__name__)


class VerdictLogWarning(UserWarning):
    """The verdict log could not be written; its records are kept in memory."""


class MissingVerdictLogError(TAGError, LookupError):
    """A log opened read-only is not there: no such file, or not the log's tables."""


DEFAULT_TRAINING_SOURCES = ("judge", "cascade-cheap", "cascade-strong")
"""Sources whose verdicts are applicability verdicts. The relevance baseline's
judge sees the action and answers another question: not trained on by default."""

_PAGE = 1000

# DB-API errors of the store itself (a lock, a lost connection, a full disk), not of
# the record written: the records are kept, not tried one by one.
_STORE_ERRORS = frozenset({"OperationalError", "InterfaceError"})


def _error_of(
    insert: Callable[[Sequence[LogRecord]], None],
    records: Sequence[LogRecord],
) -> Exception | None:
    """The error of `insert(records)`, None when it passes."""
    try:
        insert(records)
    except Exception as error:  # noqa: BLE001 - the caller tells what it means
        return error
    return None


def _store_failing(error: BaseException) -> bool:
    """Whether `error` is the store failing, whichever record is written."""
    return isinstance(error, (OSError, MemoryError)) or any(
        kind.__name__ in _STORE_ERRORS for kind in type(error).__mro__
    )


class _PairRecord(BaseModel):
    """What every record of the log holds: the (input, rule) pair it is about."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int | None = Field(default=None, description="Assigned by the log.")
    input_digest: str = Field(min_length=1, description="SHA-256 of the input.")
    text: str | None = Field(default=None, description="The input, if kept.")
    features: HashedFeatures | None = Field(
        default=None, description="The input's hashed features, if no text is kept."
    )
    rule_id: str = Field(min_length=1)
    rule_hash: str = Field(min_length=1, description="`Rule.content_hash()`.")


class VerdictRecord(_PairRecord):
    """One judgment as the log keeps it."""

    applies: bool
    score: float | None = None
    error: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    profile: str | None = None
    source: str = Field(default="judge", min_length=1)
    explore: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="For a shadow judgment of a pair the prefilter skipped: the "
        "exploration rate it was drawn at.",
    )
    created: float = Field(default_factory=time.time, description="Unix time.")
    reason: str | None = Field(
        default=None, description="The judge's reason for the verdict, if it gave one."
    )

    @classmethod
    def of(
        cls,
        text: str,
        rule: Rule,
        verdict: Verdict,
        *,
        model: str | None = None,
        prompt_version: str | None = None,
        profile: str | None = None,
        source: str = "judge",
        explore: float | None = None,
    ) -> VerdictRecord:
        """The record of `verdict` on (`text`, `rule`)."""
        return cls(
            input_digest=digest(text),
            text=text,
            rule_id=rule.rule_id,
            rule_hash=rule.content_hash(),
            applies=verdict.applies,
            score=verdict.score,
            error=verdict.error,
            model=model,
            prompt_version=prompt_version,
            profile=profile,
            source=source,
            explore=explore,
            reason=verdict.reason,
        )

    @property
    def weight(self) -> float:
        """How many judgments it stands for: `1 / explore` for a shadow one."""
        return 1.0 if self.explore is None else 1.0 / self.explore


class SkipRecord(_PairRecord):
    """A pair a learned prefilter skipped: a record without a verdict.

    Kept apart from the verdicts (see the module docs): no reader of verdicts sees
    it. A skipped pair that was explored has a verdict too (with its `explore`).
    """

    skipped_yes: float = Field(
        ge=0.0,
        le=1.0,
        description="P(YES | skipped) the model in force predicted for the rule "
        "(`Screening.skipped_yes`).",
    )
    explore: float = Field(
        ge=0.0, le=1.0, description="The rate skipped pairs were explored at."
    )
    created: float = Field(default_factory=time.time, description="Unix time.")

    @classmethod
    def of(
        cls, text: str, rule: Rule, skipped_yes: float, *, explore: float
    ) -> SkipRecord:
        """The record of skipping `rule` for `text`."""
        return cls(
            input_digest=digest(text),
            text=text,
            rule_id=rule.rule_id,
            rule_hash=rule.content_hash(),
            skipped_yes=skipped_yes,
            explore=explore,
        )


LogRecord = VerdictRecord | SkipRecord
"""What the log writes: verdicts, and skip records."""

_DEFERRED_AT_MOST = 1000
"""Skip records waiting for the next write at most; past it they are written at
once (only when the log writes nothing else for that long)."""


class Retention(BaseModel):
    """How much of the log to keep."""

    model_config = ConfigDict(frozen=True)

    max_rows: int | None = Field(default=None, ge=1)
    """Keep at most this many verdicts, the newest."""
    max_age: timedelta | None = None
    """Delete verdicts older than this."""
    prune_every: int = Field(default=1000, ge=1)
    """A writer prunes after appending this many rows."""


class RuleCounts(BaseModel):
    """A rule's verdicts in the log."""

    judged: int
    applies: int


class VerdictLogStats(BaseModel):
    """What a verdict log holds."""

    verdicts: int
    skipped: int = Field(default=0, description="Skip records (not verdicts).")
    inputs: int
    inputs_with_text: int
    inputs_hashed: int
    rules: int
    applies: int
    failed: int
    shadow: int
    oldest: float | None = Field(description="Unix time of the oldest verdict.")
    newest: float | None
    position: int = Field(description="The newest verdict's id (only grows).")
    by_source: dict[str, int]
    by_model: dict[str, int]
    per_rule: dict[str, RuleCounts]


class VerdictLog(abc.ABC):
    """An append-only record of judgments, bounded by a retention setting.

    Args:
        store_text: Keep the inputs' text; False keeps only their hashed features
            (see the module docs for the trade-off).
        hashing: How inputs are hashed when no text is kept; the learner trained
            on this log must use the same.
        retention: How much to keep.
        max_pending: At most this many records wait in memory while the store
            fails; past it the oldest are dropped (counted in `dropped`).
        retry_after: Seconds after a failed write before a write waits on the
            store again (doubling at each failure up to `max_retry_after`, reset
            at the next success); meanwhile writes only queue their records.
        max_retry_after: The longest interval between such retries.
        clock: Seconds on a monotonic clock, for the retry interval.
    """

    # Whether `_insert_at_once` can try a write without waiting on the store.
    _writes_at_once = False
    read_only = False
    """Whether the log was opened only to be read (see the module docs)."""

    def __init__(
        self,
        *,
        store_text: bool = True,
        hashing: FeatureHashing | None = None,
        retention: Retention | None = None,
        max_pending: int = 100_000,
        retry_after: float = 1.0,
        max_retry_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Set the storage policy."""
        if max_pending < 1:
            msg = f"max_pending must be at least 1, got {max_pending}"
            raise ValueError(msg)
        if not 0 <= retry_after <= max_retry_after:
            msg = (
                "retry_after and max_retry_after must satisfy 0 <= retry_after <= "
                f"max_retry_after, got {retry_after} and {max_retry_after}"
            )
            raise ValueError(msg)
        self.store_text = store_text
        self.hashing = hashing or FeatureHashing()
        self.retention = retention or Retention()
        self.max_pending = max_pending
        self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self._clock = clock
        self._appended = 0
        # Guards the fields below (never held during I/O).
        self._lock = threading.Lock()
        self._last_hashed: tuple[str, HashedFeatures] | None = None
        # Records not written yet, oldest first, as appended (prepared at write):
        # while the log fails, and skip records waiting for the next write.
        self._pending: list[LogRecord] = []
        self._dropped = 0
        self._failing = False
        self._interval = retry_after
        self._retry_at = 0.0
        self._overflow_warned = False
        self._dropped_at_failure = 0
        # Held while the pending records are written, so they go first, in order.
        self._write_lock = threading.Lock()

    # -- writing ----------------------------------------------------------------------

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        """Append the record of one judgment (see `VerdictRecord.of` for `fields`)."""
        self.append([VerdictRecord.of(text, rule, verdict, **fields)])

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        """Async `record`; runs in a worker thread."""
        await asyncio.to_thread(self.record, text, rule, verdict, **fields)

    def record_skipped(
        self, text: str, skipped: Iterable[tuple[str, str, float]], *, explore: float
    ) -> None:
        """Remember the rules a learned prefilter skipped for `text`, without waiting.

        The skip records (`SkipRecord`) wait in memory and are written with the
        log's next write (usually the judge's verdicts on the same input), or at
        `flush()` / `close()`; so shadow judging, which calls this while planning a
        retrieval (on the event loop, for an async one), never waits on the store
        (unless 1,000 of them wait, when this call writes them).

        Args:
            text: The input.
            skipped: Each skipped rule as (rule id, content hash, P(YES | skipped)
                under the model that skipped it): what `LearnedPrefilter.screen`
                and `known_rules` say, so that no rule is hashed again here.
            explore: The rate skipped pairs were explored at.

        Raises:
            PermissionError: The log was opened `read_only`.
            ValueError: A P(YES | skipped) or `explore` is not in [0, 1].
        """
        self._refuse_if_read_only()
        input_digest = digest(text)
        batch = [
            SkipRecord(
                input_digest=input_digest,
                text=text,
                rule_id=rule_id,
                rule_hash=rule_hash,
                skipped_yes=rate,
                explore=explore,
            )
            for rule_id, rule_hash, rate in skipped
        ]
        if not batch:
            return
        with self._lock:
            failing = self._failing
            overflow = self._enqueue(batch, front=False)
            due = not failing and len(self._pending) >= _DEFERRED_AT_MOST
        self._warn_overflow(overflow)
        if due:
            self.append([])

    def append(self, records: Iterable[LogRecord]) -> int:
        """Append records in one transaction; returns how many it accepted.

        Under `store_text=False` a record's text is replaced by its hashed features
        before anything is written; skip records waiting for a write (see
        `record_skipped`) are written first. Nothing here raises into the caller:

        - A write that fails warns once (`VerdictLogWarning`) and the records wait
          in memory (`pending`, at most `max_pending`). While the store fails, an
          append only queues its records; one caller at a time writes the pending
          ones first, in order: waiting on the store at most once per retry
          interval (`retry_after`, doubling), and in between only when the store
          can be tried without waiting (SQLite: a zero busy timeout).
        - A record the store rejects while others are written (a PostgreSQL text
          with a NUL character, ...) can never be written: it is dropped with a
          warning, and so is a record that cannot be prepared (hashed).

        Raises:
            PermissionError: The log was opened `read_only`.
        """
        self._refuse_if_read_only()
        batch = list(records)
        accepted = len(batch)
        with self._lock:
            failing = self._failing
            overflow = 0
            if failing:
                overflow = self._enqueue(batch, front=False)
            else:  # what waits is skip records (or a write that failed just now)
                batch[:0], self._pending = self._pending, []
        self._warn_overflow(overflow)
        if not batch:
            return 0
        if not failing:
            _, error = self._write_batch(batch, wait=True)
            if error is not None:
                self._failed(error)
        elif self._write_lock.acquire(blocking=False):  # else another one retries
            try:
                due = self._clock() >= self._retry_at
                if due or self._writes_at_once:
                    self._drain(wait=due)
            finally:
                self._write_lock.release()
        return accepted

    def flush(self) -> int:
        """Write the records a failed write left in memory; returns how many.

        Records the store rejects while others are written, or that cannot be
        prepared, are dropped with a warning (they never could be written).

        Raises:
            Exception: The store's error, when the write fails again (the records
                stay pending).
        """
        with self._write_lock:
            written, error = self._drain(wait=True)
        if error is not None:
            raise error
        return written

    @property
    def pending(self) -> int:
        """Records waiting in memory for the next write.

        Those a failed write left, and skip records (`record_skipped`).
        """
        with self._lock:
            return len(self._pending)

    @property
    def dropped(self) -> int:
        """Records given up on: past `max_pending`, rejected, or unpreparable."""
        with self._lock:
            return self._dropped

    @property
    def location(self) -> str:
        """Where the log is, for messages (no password)."""
        return type(self).__name__

    def _refuse_if_read_only(self) -> None:
        # A programming error, not a store failing: raised, never queued.
        if self.read_only:
            msg = (
                f"The verdict log {self.location} was opened read-only; open it "
                "without read_only=True to write to it."
            )
            raise PermissionError(msg)

    def _enqueue(self, records: Sequence[LogRecord], *, front: bool) -> int:
        """Add to the pending records (with `_lock` held), the oldest first.

        Past `max_pending` the oldest are dropped; returns how many to warn of (0
        when warned of already in this failure).
        """
        if front:
            self._pending[:0] = records
        else:
            self._pending.extend(records)
        excess = len(self._pending) - self.max_pending
        if excess <= 0:
            return 0
        del self._pending[:excess]
        self._dropped += excess
        if self._overflow_warned:
            return 0
        self._overflow_warned = True
        return excess

    def _requeue(self, records: Sequence[LogRecord]) -> None:
        """Put records back before the pending ones (they are older)."""
        with self._lock:
            overflow = self._enqueue(records, front=True)
        self._warn_overflow(overflow)

    def _warn_overflow(self, dropped: int) -> None:
        if dropped:
            warnings.warn(
                f"The verdict log {self.location} still cannot be written and keeps "
                f"at most {self.max_pending} records in memory: the oldest "
                f"{dropped} are lost, and so will be the oldest of the next ones "
                "while it fails (counted in `dropped`).",
                VerdictLogWarning,
                stacklevel=2,
            )

    def _drop(self, records: Sequence[tuple[LogRecord, Exception]], why: str) -> None:
        """Give up on records that can never be written, with a warning."""
        if not records:
            return
        with self._lock:
            self._dropped += len(records)
        kinds = sorted({f"{type(e).__name__}: {e}" for _, e in records})
        warnings.warn(
            f"The verdict log {self.location} dropped {len(records)} record(s) that "
            f"{why} ({'; '.join(kinds)[:500]}).",
            VerdictLogWarning,
            stacklevel=2,
        )

    def _failed(self, error: BaseException) -> None:
        """A write outside `_drain` failed: fail, schedule a retry, warn once."""
        with self._lock:
            first = not self._failing
            self._failing = True
            if first:
                self._interval = self.retry_after
                self._schedule_retry()
                self._dropped_at_failure = self._dropped
            pending = len(self._pending)
        if first:
            warnings.warn(
                f"The verdict log {self.location} cannot be written "
                f"({type(error).__name__}: {error}); its records are kept in "
                f"memory ({pending} so far) and written at the next write that "
                "succeeds, or at flush().",
                VerdictLogWarning,
                stacklevel=4,
            )

    def _schedule_retry(self) -> None:
        """The next wait on the store after this interval, then double it."""
        self._retry_at = self._clock() + self._interval
        self._interval = min(2 * self._interval, self.max_retry_after)

    def _drain(self, *, wait: bool) -> tuple[int, BaseException | None]:
        """Write the pending records, oldest first (with `_write_lock` held).

        Returns how many were written, and the store's error if it failed (the
        records left stay pending). `wait`: wait on the store (its busy timeout);
        else try only what can be tried at once (`_insert_at_once`).
        """
        written = 0
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    recovered = self._failing
                    self._failing = False
                    self._interval = self.retry_after
                    self._overflow_warned = False
                    lost = self._dropped - self._dropped_at_failure
                    break
            count, error = self._write_batch(batch, wait=wait)
            written += count
            if error is not None:
                with self._lock:
                    if not self._failing:
                        self._dropped_at_failure = self._dropped
                    self._failing = True
                    if wait:
                        self._schedule_retry()
                return written, error
        if recovered:
            logger.info("The verdict log %s is written again.", self.location)
            if lost:
                logger.warning(
                    "The verdict log %s lost %d records while it failed.",
                    self.location,
                    lost,
                )
        return written, None

    def _write_batch(
        self, batch: Sequence[LogRecord], *, wait: bool
    ) -> tuple[int, BaseException | None]:
        """Prepare and insert `batch`: how many were written, and the store's error.

        When the store fails, what was not written is back in `pending`. A record
        that cannot be prepared is dropped (see `_drop`); one that fails for want of
        memory may pass later: the batch is kept whole.
        """
        ready: list[LogRecord] = []
        unpreparable: list[tuple[LogRecord, Exception]] = []
        for record in batch:
            try:
                ready.append(self._stored_form(record))
            except MemoryError as error:  # noqa: PERF203 - one record's failure
                self._requeue(batch)
                return 0, error
            except Exception as error:  # noqa: BLE001 - never into the caller
                unpreparable.append((record, error))
        try:
            return self._insert_batch(ready, wait=wait)
        finally:
            self._drop(unpreparable, "cannot be prepared for the store")

    def _insert_batch(
        self, records: list[LogRecord], *, wait: bool
    ) -> tuple[int, BaseException | None]:
        """Insert prepared records (see `_write_batch`).

        When the store fails on the batch with an error that is not the store's own
        (`_store_failing`), the records are tried one by one, in order (`_write_each`).
        """
        if not records:
            return 0, None
        insert = self._insert if wait else self._insert_at_once
        try:
            insert(records)
        except Exception as error:  # noqa: BLE001 - a side channel never fails a caller
            if _store_failing(error):
                self._requeue(records)
                return 0, error
            return self._write_each(records, error, insert)
        except BaseException:
            self._requeue(records)
            raise
        self._written(records)
        return len(records), None

    def _write_each(
        self,
        records: list[LogRecord],
        batch_error: Exception,
        insert: Callable[[Sequence[LogRecord]], None],
    ) -> tuple[int, BaseException | None]:
        """Insert one record at a time, after the batch failed with `batch_error`.

        A record the store rejects while it works (another record was written, or
        an empty write passes) never will be written: it is dropped. When the store
        itself fails, that record and the next stay pending: a failing store costs
        one more write and an empty one, not one per record.
        """
        written: list[LogRecord] = []
        rejected: list[tuple[LogRecord, Exception]] = []
        works = False  # whether the store was seen to work
        error: Exception | None = None
        settled = 0  # records written or rejected, from the first
        try:
            for record in records:
                failure = (
                    batch_error if len(records) == 1 else _error_of(insert, [record])
                )
                if failure is None:
                    written.append(record)
                elif _store_failing(failure) or not (
                    works or _error_of(insert, []) is None
                ):
                    error = failure
                    break
                else:
                    rejected.append((record, failure))
                works = True
                settled += 1
        finally:
            self._requeue(records[settled:])
            self._written(written)
            self._drop(rejected, "the store rejects")
        return len(written), error

    def _insert_at_once(self, records: Sequence[LogRecord]) -> None:
        """`_insert` without waiting on the store (see `_writes_at_once`)."""
        self._insert(records)

    def _written(self, batch: Sequence[LogRecord]) -> None:
        """Bookkeeping after `batch` was written: pruning when due."""
        if not batch:
            return
        with self._lock:
            self._appended += len(batch)
            due = self._appended >= self.retention.prune_every
            if due:
                self._appended = 0
        if due:
            try:
                self.prune()
            except Exception as error:  # noqa: BLE001 - tried again at the next mark
                logger.warning(
                    "Pruning the verdict log %s failed (%s: %s); tried again later.",
                    self.location,
                    type(error).__name__,
                    error,
                )

    async def aappend(self, records: Iterable[LogRecord]) -> int:
        """Async `append`; runs in a worker thread."""
        return await asyncio.to_thread(self.append, list(records))

    def _stored_form(self, record: LogRecord) -> LogRecord:
        if self.store_text or record.text is None:
            return record
        # The judge logs one input against every rule in a row: hash it once.
        last = self._last_hashed
        if last is not None and last[0] == record.input_digest:
            features = last[1]
        else:
            features = self.hashing.hash(record.text)
            self._last_hashed = (record.input_digest, features)
        return record.model_copy(update={"text": None, "features": features})

    def prune(self) -> int:
        """Apply the retention setting now; returns how many verdicts it deleted."""
        self._refuse_if_read_only()
        cutoff = (
            None
            if self.retention.max_age is None
            else time.time() - self.retention.max_age.total_seconds()
        )
        return self._prune(cutoff, self.retention.max_rows)

    # -- reading ----------------------------------------------------------------------

    def records(
        self, *, after: int = 0, rule_ids: Sequence[str] | None = None
    ) -> Iterator[VerdictRecord]:
        """The records with ids above `after` (of `rule_ids` if given), oldest first.

        Read a page at a time, so appends meanwhile do not disturb the iteration.
        """
        wanted = None if rule_ids is None else set(rule_ids)
        while True:
            page = self._page(after, _PAGE)
            for record in page:
                if wanted is None or record.rule_id in wanted:
                    yield record
            if len(page) < _PAGE:
                return
            after = page[-1].id or after

    def skips(self, *, after: int = 0) -> Iterator[SkipRecord]:
        """The skip records with ids above `after`, oldest first (not verdicts).

        Read a page at a time, as `records`; a log without the skip table (made
        by an older release, read only) holds none.
        """
        while True:
            page = self._skip_page(after, _PAGE)
            yield from page
            if len(page) < _PAGE:
                return
            after = page[-1].id or after

    @overload
    def examples(
        self,
        rulebook: Rulebook | None = None,
        *,
        sources: Sequence[str] | None = DEFAULT_TRAINING_SOURCES,
        include_failed: bool = False,
        skipped: Literal[False] = False,
    ) -> Iterator[LabelledExample]: ...

    @overload
    def examples(
        self,
        rulebook: Rulebook | None = None,
        *,
        sources: Sequence[str] | None = DEFAULT_TRAINING_SOURCES,
        include_failed: bool = False,
        skipped: Literal[True],
    ) -> Iterator[LabelledExample | SkippedPair]: ...

    def examples(
        self,
        rulebook: Rulebook | None = None,
        *,
        sources: Sequence[str] | None = DEFAULT_TRAINING_SOURCES,
        include_failed: bool = False,
        skipped: bool = False,
    ) -> Iterator[LabelledExample | SkippedPair]:
        """Training examples for `LearnedPrefilter.fit`, in order of last use.

        The last verdict on each (input, rule) counts; a shadow judgment weighs
        `1 / explore`. Left out: failed judgments (their NO is a policy, not a
        verdict) unless `include_failed`, sources not in `sources` (None: all),
        records whose input was pruned, and, given a rulebook, verdicts on rules it
        does not hold or on an older version of a rule (another content hash).

        Args:
            rulebook: Keep only the verdicts on its rules as they are now.
            sources: Keep only the verdicts of these sources (None: all).
            include_failed: Keep failed judgments too (as NO).
            skipped: Also yield the skip records, as `SkippedPair`s (the last one
                per pair, under the same rulebook and pruning rules), merged with
                the verdicts by time: what a `Retrainer` trains on. False yields
                verdicts only (`LabelledExample`), as every release did.
        """
        current = (
            None
            if rulebook is None
            else {rule.rule_id: rule.content_hash() for rule in rulebook.rules}
        )
        stream: Iterable[LogRecord] = (
            heapq.merge(self.records(), self.skips(), key=lambda r: r.created)
            if skipped
            else self.records()
        )
        inputs: dict[str, str | HashedFeatures] = {}
        # (input, rule, is a skip) -> (applies, weight) or P(YES | skipped); the
        # order of last use.
        latest: dict[tuple[str, str, bool], tuple[bool, float] | float] = {}
        for record in stream:
            value: tuple[bool, float] | float
            if isinstance(record, VerdictRecord):
                if (record.error is not None and not include_failed) or (
                    sources is not None and record.source not in sources
                ):
                    continue
                value = (record.applies, record.weight)
            else:
                value = record.skipped_yes
            features = record.text if record.text is not None else record.features
            if features is None or (
                current is not None and current.get(record.rule_id) != record.rule_hash
            ):
                continue
            inputs[record.input_digest] = features
            key = (record.input_digest, record.rule_id, isinstance(value, float))
            latest.pop(key, None)
            latest[key] = value
        for (input_digest, rule_id, _), value in latest.items():
            if isinstance(value, tuple):
                yield LabelledExample(inputs[input_digest], rule_id, *value)
            else:
                yield SkippedPair(inputs[input_digest], rule_id, value)

    @abc.abstractmethod
    def stream_counts(
        self,
        *,
        since: int = 0,
        sources: Sequence[str] | None = DEFAULT_TRAINING_SOURCES,
    ) -> StreamCounts:
        """The stream so far, for the miss-budget controller (`StreamCounts`).

        Every verdict and skip record the log holds counts (the last verdict per
        pair, of `sources`, failed ones left out), whichever rule version it was
        on: the promise is over the stream's YES verdicts.

        Args:
            since: A log position (the last training's): `recent_*` count the
                verdicts after it.
            sources: The verdicts that are applicability verdicts (None: all).
        """

    def export(self, out: IO[str], *, rule_ids: Sequence[str] | None = None) -> int:
        """Write the verdict records as JSON lines, oldest first; returns how many.

        Verdicts only: skip records (`skips`) are no judgments.
        """
        written = 0
        for record in self.records(rule_ids=rule_ids):
            out.write(record.model_dump_json() + "\n")
            written += 1
        return written

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of verdicts held."""

    # -- what a store implements ------------------------------------------------------

    @abc.abstractmethod
    def _insert(self, records: Sequence[LogRecord]) -> None:
        """Write the records (and their inputs) in one transaction."""

    @abc.abstractmethod
    def _page(self, after: int, limit: int) -> list[VerdictRecord]:
        """Up to `limit` records with ids above `after`, by id."""

    @abc.abstractmethod
    def _skip_page(self, after: int, limit: int) -> list[SkipRecord]:
        """Up to `limit` skip records with ids above `after`, by id."""

    @abc.abstractmethod
    def _prune(self, cutoff: float | None, max_rows: int | None) -> int:
        """Delete verdicts created before `cutoff` or beyond the newest `max_rows`."""

    @abc.abstractmethod
    def stats(self) -> VerdictLogStats:
        """Counts of what the log holds."""

    @abc.abstractmethod
    def position(self) -> int:
        """The id of the newest verdict (0 when empty); see `RetrainPolicy`."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Delete every verdict, skip record and input."""

    def close(self) -> None:
        """Write the pending records (see `flush`), then close the connection.

        Raises:
            Exception: The store's error, when pending records still cannot be
                written; the log stays open and keeps them.
        """
        self.flush()
        self._close()

    @abc.abstractmethod
    def _close(self) -> None:
        """Close this thread's connection."""


# --- SQL stores ----------------------------------------------------------------------

# The statements of both stores: `{t}` is the verdicts table, `{i}` the inputs table
# (checked identifiers), `{id}`, `{bool}`, `{real}` the dialect's types, `?` a
# parameter (PostgreSQL's store turns it into `%s`).

# The verdicts table's columns after `id`, each named as its `VerdictRecord` field,
# with its type: the one list the statements below are built from.
_VERDICT_COLUMNS = (
    ("input_digest", "TEXT NOT NULL"),
    ("rule_id", "TEXT NOT NULL"),
    ("rule_hash", "TEXT NOT NULL"),
    ("applies", "{bool} NOT NULL"),
    ("score", "{real}"),
    ("error", "TEXT"),
    ("model", "TEXT"),
    ("prompt_version", "TEXT"),
    ("profile", "TEXT"),
    ("source", "TEXT NOT NULL"),
    ("explore", "{real}"),
    ("created", "{real} NOT NULL"),
    # Added later: logs made before get these at open (`_ADDED_COLUMNS`), last, so
    # old and new tables have one layout.
    ("reason", "TEXT"),
)
_ADDED_COLUMNS = _VERDICT_COLUMNS[-1:]
"""Columns a log made by an older version may lack: nullable, added when opened."""
_COLUMN_NAMES = tuple(name for name, _ in _VERDICT_COLUMNS)

# The skip records' table (`{s}`), beside the verdicts: its columns after `id`,
# each named as its `SkipRecord` field.
_SKIP_COLUMNS = (
    ("input_digest", "TEXT NOT NULL"),
    ("rule_id", "TEXT NOT NULL"),
    ("rule_hash", "TEXT NOT NULL"),
    ("skipped_yes", "{real} NOT NULL"),
    ("explore", "{real} NOT NULL"),
    ("created", "{real} NOT NULL"),
)
_SKIP_NAMES = tuple(name for name, _ in _SKIP_COLUMNS)

_SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS {i} (digest TEXT PRIMARY KEY, text TEXT, "
        "features TEXT, last_used {real} NOT NULL)"
    ),
    "CREATE TABLE IF NOT EXISTS {t} (id {id}, "
    + ", ".join(f"{name} {kind}" for name, kind in _VERDICT_COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS {t}_created ON {t} (created)",
    "CREATE INDEX IF NOT EXISTS {t}_input ON {t} (input_digest)",
    "CREATE TABLE IF NOT EXISTS {s} (id {id}, "
    + ", ".join(f"{name} {kind}" for name, kind in _SKIP_COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS {s}_created ON {s} (created)",
    "CREATE INDEX IF NOT EXISTS {s}_input ON {s} (input_digest)",
)
_ADD_COLUMN = "ALTER TABLE {t} ADD COLUMN "
# The newest use keeps an input from being pruned as an orphan while its verdict is
# written (see _DELETE_ORPHANS).
_UPSERT_INPUT = (
    "INSERT INTO {i} (digest, text, features, last_used) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (digest) DO UPDATE SET last_used = excluded.last_used, "
    "text = COALESCE({i}.text, excluded.text), "
    "features = COALESCE({i}.features, excluded.features)"
)
# Built from constant column names only (S608).
_INSERT_VERDICT = (
    f"INSERT INTO {{t}} ({', '.join(_COLUMN_NAMES)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(_COLUMN_NAMES))})"
)
_INSERT_SKIP = (
    f"INSERT INTO {{s}} ({', '.join(_SKIP_NAMES)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(_SKIP_NAMES))})"
)
_SKIP_PAGE = (
    f"SELECT k.id, {', '.join(f'k.{name}' for name in _SKIP_NAMES)}, "  # noqa: S608
    "i.text, i.features FROM {s} k LEFT JOIN {i} i ON i.digest = k.input_digest "
    "WHERE k.id > ? ORDER BY k.id LIMIT ?"
)
_NO_SKIPS = (
    "(SELECT id, "  # noqa: S608 - constant column names
    + ", ".join(
        name
        if name in {"input_digest", "rule_id", "rule_hash", "created"}
        else f"0.0 AS {name}"
        for name in _SKIP_NAMES
    )
    + " FROM {t} WHERE 1 = 0)"
)
"""Stands for the skip table in a log read only that has none: no rows, the
same columns (a subquery, so every use of `{s}` in a read names an alias)."""


def _page_query(absent: frozenset[str] = frozenset()) -> str:
    """The query of a page of records; NULL for the `absent` (added) columns."""
    columns = (
        f"NULL AS {name}" if name in absent else f"v.{name}" for name in _COLUMN_NAMES
    )
    return (
        f"SELECT v.id, {', '.join(columns)}, i.text, i.features "  # noqa: S608
        "FROM {t} v LEFT JOIN {i} i ON i.digest = v.input_digest "
        "WHERE v.id > ? ORDER BY v.id LIMIT ?"
    )


_PAGE_QUERY = _page_query()
_INPUT_COLUMNS = ("digest", "text", "features", "last_used")
_TABLES_SHOWN = 20
"""At most this many tables are listed when the log's are not there."""
_DELETE_OLDER = "DELETE FROM {t} WHERE created < ?"
_DELETE_BEYOND = (
    "DELETE FROM {t} WHERE id <= (SELECT id FROM {t} ORDER BY id DESC LIMIT 1 OFFSET ?)"
)
_DELETE_ORPHANS = (
    "DELETE FROM {i} WHERE last_used <= ? AND NOT EXISTS "
    "(SELECT 1 FROM {t} WHERE {t}.input_digest = {i}.digest) AND NOT EXISTS "
    "(SELECT 1 FROM {s} WHERE {s}.input_digest = {i}.digest)"
)
_DELETE_OLDER_SKIPS = "DELETE FROM {s} WHERE created < ?"
# Skip records as old as the verdicts kept: the stream the log still holds.
_DELETE_SKIPS_BEFORE_VERDICTS = (
    "DELETE FROM {s} WHERE created < (SELECT MIN(created) FROM {t})"
)
_TOTALS = (
    "SELECT COUNT(*), COUNT(DISTINCT input_digest), COUNT(DISTINCT rule_id), "
    "COALESCE(SUM(CASE WHEN applies THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN error IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN explore IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "MIN(created), MAX(created), COALESCE(MAX(id), 0) FROM {t}"
)
_STORED = (
    "SELECT COALESCE(SUM(CASE WHEN text IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN features IS NOT NULL THEN 1 ELSE 0 END), 0) FROM {i}"
)
_BY_SOURCE = "SELECT source, COUNT(*) FROM {t} GROUP BY source ORDER BY source"
_BY_MODEL = (
    "SELECT COALESCE(model, ''), COUNT(*) FROM {t} "
    "GROUP BY COALESCE(model, '') ORDER BY COALESCE(model, '')"
)
_PER_RULE = (
    "SELECT rule_id, COUNT(*), SUM(CASE WHEN applies THEN 1 ELSE 0 END) FROM {t} "
    "GROUP BY rule_id ORDER BY rule_id"
)
_COUNT = "SELECT COUNT(*) FROM {t}"
_SKIP_COUNT = "SELECT COUNT(*) FROM {s} k"
_POSITION = "SELECT COALESCE(MAX(id), 0) FROM {t}"
_CLEAR = ("DELETE FROM {t}", "DELETE FROM {s}", "DELETE FROM {i}")

# `stream_counts`: `{sources}` is the filter on the verdicts' source, `{latest}`
# the last verdict of each pair (`_LATEST`).
_LATEST = (
    "SELECT v.input_digest, v.applies, v.explore FROM {t} v JOIN (SELECT "
    "MAX(id) AS id FROM {t} WHERE error IS NULL{sources} GROUP BY input_digest, "
    "rule_id) last ON last.id = v.id"
)
_STREAM_YES = (
    "SELECT COALESCE(SUM(CASE WHEN l.applies AND l.explore IS NULL AND "
    "k.input_digest IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN l.applies AND l.explore IS NOT NULL THEN 1 ELSE 0 "
    "END), 0), "
    "COALESCE(SUM(CASE WHEN l.applies AND k.input_digest IS NULL THEN 1 ELSE 0 "
    "END), 0) "
    "FROM ({latest}) l LEFT JOIN (SELECT DISTINCT input_digest FROM {s} k) k "
    "ON k.input_digest = l.input_digest"
)
_STREAM_SKIPS = (
    "SELECT COUNT(DISTINCT input_digest), COALESCE(SUM(skipped_yes), 0), "
    "COALESCE(SUM(skipped_yes * explore), 0) FROM {s} k"
)
_STREAM_INPUTS = (
    "SELECT COUNT(*) FROM (SELECT input_digest FROM {t} WHERE error IS NULL"
    "{sources} UNION SELECT input_digest FROM {s} k) u"
)
_STREAM_RECENT = "SELECT COUNT(*), COUNT(DISTINCT input_digest) FROM {t} WHERE id > ?"

Statement = tuple[str, Sequence[Sequence[Any]]]
"""A statement template and the parameter rows to run it with."""


class _SQLVerdictLog(VerdictLog):
    """What both SQL stores run; each supplies connections and the dialect."""

    _types: Mapping[str, str]
    """The dialect's `id`, `bool` and `real` column types."""
    orphan_grace = 0.0
    """Seconds since its last use before an input no verdict points at is deleted."""

    def __init__(self, table: str, *, read_only: bool = False, **kwargs: Any) -> None:
        if not table.isidentifier():
            msg = f"table must be a plain SQL identifier, got {table!r}"
            raise ValueError(msg)
        super().__init__(**kwargs)
        self.table = table
        self.inputs_table = f"{table}_inputs"
        self.skipped_table = f"{table}_skipped"
        self.read_only = read_only
        self._page_template = _PAGE_QUERY
        # False only for a log read only that was made before skip records.
        self._has_skips = True

    def _check_tables(self) -> None:
        """For reading only: refuse a database without the log's tables.

        A log made before a column was added (`_ADDED_COLUMNS`) is read with that
        column empty, as opening it for writing would have added it. A refused
        log's connection is closed.

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
        added = {name for name, _ in _ADDED_COLUMNS}
        needed = {
            self.table: [name for name in _COLUMN_NAMES if name not in added],
            self.inputs_table: list(_INPUT_COLUMNS),
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
        return _page_query(frozenset(added - set(found[self.table])))

    @abc.abstractmethod
    def _columns_of(self, table: str) -> list[str]:
        """The columns of `table`, none when there is no such table."""

    @abc.abstractmethod
    def _table_names(self) -> list[str]:
        """The tables the database holds (where the log's would be), sorted."""

    def _sql(self, template: str) -> str:
        skips = self.skipped_table if self._has_skips else _NO_SKIPS
        return template.format(
            t=self.table,
            i=self.inputs_table,
            s=skips.format(t=self.table),
            **self._types,
        )

    @abc.abstractmethod
    def _execute(self, statements: Sequence[Statement]) -> list[int]:
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
            tuple(getattr(r, name) for name in _COLUMN_NAMES)
            for r in records
            if isinstance(r, VerdictRecord)
        ]
        skips = [
            tuple(getattr(r, name) for name in _SKIP_NAMES)
            for r in records
            if isinstance(r, SkipRecord)
        ]
        statements: list[Statement] = [
            (_UPSERT_INPUT, list(inputs.values())),
            (_INSERT_VERDICT, verdicts),
        ]
        if skips:
            statements.append((_INSERT_SKIP, skips))
        self._execute(statements)

    def _page(self, after: int, limit: int) -> list[VerdictRecord]:
        return [
            _record(row) for row in self._query(self._page_template, (after, limit))
        ]

    def _skip_page(self, after: int, limit: int) -> list[SkipRecord]:
        return [_skip_record(row) for row in self._query(_SKIP_PAGE, (after, limit))]

    def _prune(self, cutoff: float | None, max_rows: int | None) -> int:
        statements: list[Statement] = []
        if cutoff is not None:
            statements.append((_DELETE_OLDER, [(cutoff,)]))
        if max_rows is not None:
            statements.append((_DELETE_BEYOND, [(max_rows,)]))
        if not statements:
            return 0
        deleted = len(statements)
        if cutoff is not None:
            statements.append((_DELETE_OLDER_SKIPS, [(cutoff,)]))
        if max_rows is not None:
            statements.append((_DELETE_SKIPS_BEFORE_VERDICTS, [()]))
        statements.append((_DELETE_ORPHANS, [(time.time() - self.orphan_grace,)]))
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
        latest = _LATEST.replace("{sources}", where)
        ((kept, shadow, warm_yes),) = self._query(
            _STREAM_YES.replace("{latest}", latest), chosen
        )
        ((screened, predicted, explored),) = self._query(_STREAM_SKIPS)
        ((inputs,),) = self._query(_STREAM_INPUTS.replace("{sources}", where), chosen)
        ((recent, recent_inputs),) = self._query(_STREAM_RECENT, (since,))
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
        (totals,) = self._query(_TOTALS)
        (stored,) = self._query(_STORED)
        ((skipped,),) = self._query(_SKIP_COUNT)
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
            by_source=dict(self._query(_BY_SOURCE)),
            by_model=dict(self._query(_BY_MODEL)),
            per_rule={
                rule_id: RuleCounts(judged=n, applies=applies)
                for rule_id, n, applies in self._query(_PER_RULE)
            },
        )

    def __len__(self) -> int:
        """Number of verdicts held."""
        return int(self._query(_COUNT)[0][0])

    def position(self) -> int:
        """The id of the newest verdict (0 when empty); see `RetrainPolicy`."""
        return int(self._query(_POSITION)[0][0])

    def clear(self) -> None:
        """Delete every verdict and input."""
        self._refuse_if_read_only()
        self._execute([(template, [()]) for template in _CLEAR])


def _skip_record(row: Sequence[Any]) -> SkipRecord:
    """The skip record of a `_SKIP_PAGE` row: id, the columns, text, features."""
    id_, *columns, text, features = row
    return SkipRecord(
        **dict(zip(_SKIP_NAMES, columns, strict=True)),
        id=id_,
        text=text,
        features=None
        if features is None
        else HashedFeatures.model_validate_json(features),
    )


def _record(row: Sequence[Any]) -> VerdictRecord:
    """The record of a `_PAGE_QUERY` row: id, the columns, text, features."""
    id_, *columns, text, features = row
    fields: dict[str, Any] = dict(zip(_COLUMN_NAMES, columns, strict=True))
    fields["applies"] = bool(fields["applies"])  # SQLite stores an integer
    return VerdictRecord(
        **fields,
        id=id_,
        text=text,
        features=None
        if features is None
        else HashedFeatures.model_validate_json(features),
    )


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
            MissingVerdictLogError: `read_only`, and there is no such file or it
                holds no verdict log in `table`.
        """
        super().__init__(table, read_only=read_only, **kwargs)
        if read_only and not Path(path).is_file():
            why = "it is a directory" if Path(path).is_dir() else "no such file"
            msg = f"no verdict log at {path}: {why}"
            raise MissingVerdictLogError(msg)
        self._connections = SQLiteConnections(
            path, timeout=timeout, read_only=read_only
        )
        self.path = self._connections.path
        if read_only:
            self._check_tables()
            return
        self._execute([(template, [()]) for template in _SCHEMA])
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Add the columns a log made by an older version lacks (`_ADDED_COLUMNS`).

        SQLite has no `ADD COLUMN IF NOT EXISTS`: the check and the change run in
        one write transaction, so processes opening the log at once add each once.
        """
        with self._connections.writing() as conn:
            have = {row[1] for row in conn.execute(self._sql("PRAGMA table_info({t})"))}
            for name, kind in _ADDED_COLUMNS:
                if name not in have:
                    conn.execute(self._sql(f"{_ADD_COLUMN}{name} {kind}"))

    def _execute(self, statements: Sequence[Statement]) -> list[int]:
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

    Needs psycopg 3 (the `postgres` extra). Each thread uses its own connection.

    Args:
        conninfo: A libpq connection string or `postgresql://` URI.
        table: The verdicts table; inputs go in `<table>_inputs`.
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
        read_only: bool = False,
        **kwargs: Any,
    ) -> None:
        """Connect and create the log's tables if needed.

        Raises:
            MissingVerdictLogError: `read_only`, and the database holds no verdict
                log in `table`.
        """
        super().__init__(table, read_only=read_only, **kwargs)
        self.conninfo = conninfo
        self._local = threading.local()
        if read_only:
            self._check_tables()
            return
        # Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalogue; the
        # first writer creates the schema while the others wait on the lock.
        lock = ("SELECT pg_advisory_xact_lock(hashtext(?))", [(table,)])
        # A log made by an older version gets the columns it lacks.
        added = (
            f"{_ADD_COLUMN}IF NOT EXISTS {name} {kind}" for name, kind in _ADDED_COLUMNS
        )
        self._execute([lock, *((template, [()]) for template in (*_SCHEMA, *added))])
        # After an ALTER, psycopg drops its prepared statements, and one prepared
        # later in that session was found missing (InvalidSqlStatementName): the
        # session that set the schema up is not used for records.
        self._close()

    @property
    def location(self) -> str:
        """The connection string, without a password."""
        return without_password(self.conninfo)

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            try:
                import psycopg  # noqa: PLC0415 - the postgres extra
            except ImportError as error:
                msg = (
                    "PostgresVerdictLog needs psycopg: install the `postgres` extra "
                    "(`pip install 'langchain-tag[postgres]'`)."
                )
                raise ImportError(msg) from error
            conn = psycopg.connect(self.conninfo, autocommit=True)
            if self.read_only:
                # The server refuses any write in this session, whatever runs.
                conn.execute("SET default_transaction_read_only = on")
            self._local.conn = conn
        return conn

    def _sql(self, template: str) -> str:
        return super()._sql(template).replace("?", "%s")

    def _execute(self, statements: Sequence[Statement]) -> list[int]:
        conn = self._connection()
        counts = []
        with conn.transaction(), conn.cursor() as cursor:
            for template, rows in statements:
                cursor.executemany(self._sql(template), rows)
                counts.append(max(cursor.rowcount, 0))
        return counts

    def _query(self, template: str, parameters: Sequence[Any] = ()) -> list[Any]:
        cursor = self._connection().execute(self._sql(template), parameters)
        return list(cursor.fetchall())

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
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()


def open_verdict_log(location: str | Path, **kwargs: Any) -> VerdictLog:
    """The log at `location`: a `postgresql://` URI, else an SQLite file path."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresVerdictLog(text, **kwargs)
    return SQLiteVerdictLog(location, **kwargs)
