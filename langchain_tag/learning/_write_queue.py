"""The verdict log's write-behind queue: a store that fails never fails a caller.

A write that fails warns once (`VerdictLogWarning`) and its records wait in memory,
written first, in order, at the next write that succeeds or at `flush()`. While the
store fails, a write only queues its records: one writer at a time retries, waiting
on the store at most once per retry interval (doubling up to a maximum), and in
between only when the store can be tried without waiting (SQLite's zero busy
timeout). Two kinds of records are given up on, with a warning and counted: the
oldest past `max_pending`, and one the store rejects while it takes the others (or
that cannot be prepared), which would otherwise block the records after it.

The queue knows records, not stores: the log gives it how to write a batch, how to
prepare a record and what to do once a batch is written.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence

from langchain_tag.errors import StoreLocationError, VerdictLogWarning
from langchain_tag.learning._records import LogRecord

__all__ = ["WriteQueue"]

logger = logging.getLogger(__name__)

# DB-API errors of the store itself (a lock, a lost connection, a full disk), not of
# the record written: the records are kept, not tried one by one.
_STORE_ERRORS = frozenset({"OperationalError", "InterfaceError"})

_DEFERRED_AT_MOST = 1000
"""Deferred records waiting for the next write at most; past it they are written
at once (only when the log writes nothing else for that long)."""

Write = Callable[[Sequence[LogRecord], bool], None]
"""`write(records, wait)`: insert in one transaction; without `wait`, only if the
store can be tried without waiting on it."""


def _error_of(
    write: Callable[[Sequence[LogRecord]], None], records: Sequence[LogRecord]
) -> Exception | None:
    """The error of `write(records)`, None when it passes."""
    try:
        write(records)
    except Exception as error:  # noqa: BLE001 - the caller tells what it means
        return error
    return None


def _store_failing(error: BaseException) -> bool:
    """Whether `error` is the store failing, whichever record is written."""
    return isinstance(error, (OSError, MemoryError, StoreLocationError)) or any(
        kind.__name__ in _STORE_ERRORS for kind in type(error).__mro__
    )


class WriteQueue:
    """The records a log could not write yet, and the one writer that retries.

    Args:
        write: Inserts a batch (see `Write`).
        prepare: A record in the form the store keeps (it may raise: the record
            is then dropped).
        written: Called with each batch written.
        location: Where the log is, for the warnings.
        writes_at_once: Whether `write(records, False)` can try the store without
            waiting on it; else, while it fails, writes only queue between retries.
        max_pending: At most this many records wait; past it the oldest are dropped.
        retry_after: Seconds after a failed write before a write waits on the
            store again (doubling up to `max_retry_after`, reset at a success).
        max_retry_after: The longest interval between such retries.
        clock: Seconds on a monotonic clock.
    """

    def __init__(
        self,
        write: Write,
        *,
        prepare: Callable[[LogRecord], LogRecord],
        written: Callable[[Sequence[LogRecord]], None],
        location: Callable[[], str],
        writes_at_once: bool,
        max_pending: int = 100_000,
        retry_after: float = 1.0,
        max_retry_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Check the settings; nothing waits yet."""
        if max_pending < 1:
            msg = f"max_pending must be at least 1, got {max_pending}"
            raise ValueError(msg)
        if not 0 <= retry_after <= max_retry_after:
            msg = (
                "retry_after and max_retry_after must satisfy 0 <= retry_after <= "
                f"max_retry_after, got {retry_after} and {max_retry_after}"
            )
            raise ValueError(msg)
        self._write = write
        self._prepare = prepare
        self._written = written
        self._location = location
        self._writes_at_once = writes_at_once
        self.max_pending = max_pending
        self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self._clock = clock
        # Guards the fields below (never held during I/O).
        self._lock = threading.Lock()
        # Records not written yet, oldest first, as given (prepared at write):
        # while the store fails, and deferred records waiting for the next write.
        self._pending: list[LogRecord] = []
        self._dropped = 0
        self._failing = False
        self._interval = retry_after
        self._retry_at = 0.0
        self._overflow_warned = False
        self._dropped_at_failure = 0
        # Held while the pending records are written, so they go first, in order.
        self._write_lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Records waiting in memory for the next write."""
        with self._lock:
            return len(self._pending)

    @property
    def dropped(self) -> int:
        """Records given up on: past `max_pending`, rejected, or unpreparable."""
        with self._lock:
            return self._dropped

    def defer(self, records: Sequence[LogRecord]) -> None:
        """Queue records for the next write, without waiting on the store.

        Written at once only when 1,000 of them wait and the store works.
        """
        with self._lock:
            failing = self._failing
            overflow = self._enqueue(records, front=False)
            due = not failing and len(self._pending) >= _DEFERRED_AT_MOST
        self._warn_overflow(overflow)
        if due:
            self.put([])

    def put(self, records: Iterable[LogRecord]) -> None:
        """Write the pending records, then `records`; never raises the store's error.

        While the store fails, the records only queue, and one caller at a time
        retries when a retry is due (or can be tried without waiting).
        """
        batch = list(records)
        with self._lock:
            failing = self._failing
            overflow = 0
            if failing:
                overflow = self._enqueue(batch, front=False)
            else:  # what waits is deferred records (or a write that failed just now)
                batch[:0], self._pending = self._pending, []
        self._warn_overflow(overflow)
        if not batch:
            return
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

    def flush(self) -> int:
        """Write the pending records, waiting on the store; returns how many.

        Raises:
            Exception: The store's error, when the write fails again (the records
                stay pending).
        """
        with self._write_lock:
            written, error = self._drain(wait=True)
        if error is not None:
            raise error
        return written

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
                f"The verdict log {self._location()} still cannot be written and "
                f"keeps at most {self.max_pending} records in memory: the oldest "
                f"{dropped} are lost, and so will be the oldest of the next ones "
                "while it fails (counted in `dropped`).",
                VerdictLogWarning,
                stacklevel=3,
            )

    def _drop(self, records: Sequence[tuple[LogRecord, Exception]], why: str) -> None:
        """Give up on records that can never be written, with a warning."""
        if not records:
            return
        with self._lock:
            self._dropped += len(records)
        kinds = sorted({f"{type(e).__name__}: {e}" for _, e in records})
        warnings.warn(
            f"The verdict log {self._location()} dropped {len(records)} record(s) "
            f"that {why} ({'; '.join(kinds)[:500]}).",
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
                f"The verdict log {self._location()} cannot be written "
                f"({type(error).__name__}: {error}); its records are kept in "
                f"memory ({pending} so far) and written at the next write that "
                "succeeds, or at flush().",
                VerdictLogWarning,
                stacklevel=5,
            )

    def _schedule_retry(self) -> None:
        """The next wait on the store after this interval, then double it."""
        self._retry_at = self._clock() + self._interval
        self._interval = min(2 * self._interval, self.max_retry_after)

    def _drain(self, *, wait: bool) -> tuple[int, BaseException | None]:
        """Write the pending records, oldest first (with `_write_lock` held).

        Returns how many were written, and the store's error if it failed (the
        records left stay pending). `wait`: wait on the store; else try only what
        can be tried at once.
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
            logger.info("The verdict log %s is written again.", self._location())
            if lost:
                logger.warning(
                    "The verdict log %s lost %d records while it failed.",
                    self._location(),
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
                ready.append(self._prepare(record))
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

        def insert(records: Sequence[LogRecord]) -> None:
            self._write(records, wait)

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
            if written:
                self._written(written)
            self._drop(rejected, "the store rejects")
        return len(written), error
