"""The verdict log's interface: `VerdictLog`, what every store of it offers.

Writing goes through a write-behind queue (`_write_queue.WriteQueue`), so a store
that fails never fails the judge; reading pages through the records and turns them
into training examples. A store (`verdict_log`'s SQLite and PostgreSQL logs) only
inserts, pages, prunes and counts.
"""

from __future__ import annotations

import abc
import asyncio
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, Literal, overload

from langchain_tag._text import digest
from langchain_tag.learning._records import (
    DEFAULT_TRAINING_SOURCES,
    LogRecord,
    Retention,
    SkipRecord,
    VerdictLogStats,
    VerdictRecord,
)
from langchain_tag.learning._write_queue import WriteQueue
from langchain_tag.learning.learned_prefilter import (
    FeatureHashing,
    HashedFeatures,
    LabelledExample,
    SkippedPair,
)
from langchain_tag.learning.promise import StreamCounts
from langchain_tag.matching.judge import Verdict
from langchain_tag.rules import Rule, Rulebook

__all__ = ["VerdictLog"]

logger = logging.getLogger(__name__)

_PAGE = 1000
"""Records read per query."""


class VerdictLog(abc.ABC):
    """An append-only record of judgments, bounded by a retention setting.

    Args:
        store_text: Keep the inputs' text; False keeps only their hashed features
            (see `verdict_log` for the trade-off).
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
    """Whether the log was opened only to be read (see `verdict_log`)."""

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
        self.store_text = store_text
        self.hashing = hashing or FeatureHashing()
        self.retention = retention or Retention()
        self._queue = WriteQueue(
            self._write,
            prepare=self._stored_form,
            written=self._written,
            location=lambda: self.location,
            writes_at_once=self._writes_at_once,
            max_pending=max_pending,
            retry_after=retry_after,
            max_retry_after=max_retry_after,
            clock=clock,
        )
        self._appended = 0  # rows written since the last prune
        self._appended_lock = threading.Lock()
        # The judge logs one input against every rule in a row: it is hashed once.
        self._last_hashed: tuple[str, HashedFeatures] | None = None

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
        if batch:
            self._queue.defer(batch)

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
        self._queue.put(batch)
        return len(batch)

    def flush(self) -> int:
        """Write the records a failed write left in memory; returns how many.

        Records the store rejects while others are written, or that cannot be
        prepared, are dropped with a warning (they never could be written).

        Raises:
            Exception: The store's error, when the write fails again (the records
                stay pending).
        """
        return self._queue.flush()

    @property
    def pending(self) -> int:
        """Records waiting in memory for the next write.

        Those a failed write left, and skip records (`record_skipped`).
        """
        return self._queue.pending

    @property
    def dropped(self) -> int:
        """Records given up on: past `max_pending`, rejected, or unpreparable."""
        return self._queue.dropped

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

    def _write(self, records: Sequence[LogRecord], wait: bool) -> None:  # noqa: FBT001
        """The queue's `write`: `_insert`, or without `wait` `_insert_at_once`."""
        if wait:
            self._insert(records)
        else:
            self._insert_at_once(records)

    def _insert_at_once(self, records: Sequence[LogRecord]) -> None:
        """`_insert` without waiting on the store (see `_writes_at_once`)."""
        self._insert(records)

    def _written(self, batch: Sequence[LogRecord]) -> None:
        """Bookkeeping after `batch` was written: pruning when due."""
        if not batch:
            return
        with self._appended_lock:
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
