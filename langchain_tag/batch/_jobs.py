"""Batch jobs: split, stage, create, poll and read, recorded for resuming.

The same for every provider: what is provider-specific (uploading a file,
creating, listing, polling and reading a batch) is a `BatchProvider`.

Every batch is recorded (`_records`: tables beside the verdict cache) before it is
created (under its input file's id) and again once created (its batch id), so that
a run killed at any point leaves what it paid for findable: the next run polls the
recorded batches instead of creating them again, and adopts a batch created just
before the kill by listing the account's batches (OpenAI; Anthropic's batches
name no input, so such a record is dropped after `adopt_grace` and its requests
done online). A finished batch's answers are
stored (under their custom id) and its record deleted in one transaction; so a kill
while reading loses nothing either.

Several processes may share one database (shards of a job): a call
collects only the records holding its own requests, and creates the batch of a
record it did not make only once the record has stayed without one for
`adopt_grace` seconds, so it never pays again for a batch another live process is
about to create. Polling outlasts transient API errors (they read as "still
running") until `max_wait`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag.batch._providers import BatchProvider, BatchState, provider_of_client
from langchain_tag.batch._records import JobRecord, JobRecords, Lane
from langchain_tag.errors import BatchLaneError
from langchain_tag.models import CallRetry

logger = logging.getLogger(__name__)


class BatchSettings(BaseModel):
    """How batches are made and waited for.

    The limits default to OpenAI's (50,000 requests and 200 MB per input file),
    within Anthropic's (100,000 requests and 256 MB per batch);
    `sleep` and `clock` are what polling waits with and measures `max_wait` by
    (tests pass a fake clock's).
    """

    model_config = ConfigDict(frozen=True)

    max_requests_per_file: int = Field(default=50_000, ge=1)
    """Requests per input file (one batch each)."""
    max_bytes_per_file: int = Field(default=200_000_000, ge=1)
    """Bytes per input file."""
    completion_window: Literal["24h"] = "24h"
    poll_interval: float = Field(default=60.0, ge=0)
    """Seconds between two polls of the running batches."""
    max_wait: float | None = Field(default=None, ge=0)
    """Seconds to wait for the batches; then return with them still running (their
    requests counted as pending; a later call collects them). None: until done;
    0: submit and return."""
    adopt_grace: float = Field(default=300.0, ge=0)
    """Seconds a record another process saved must stay without a batch (none
    listed for its file) before this call creates that batch: the other process
    may be about to."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """Added to every batch's metadata (shown in the provider's dashboard)."""
    sleep: Callable[[float], None] = Field(default=time.sleep, exclude=True)
    clock: Callable[[], float] = Field(default=time.monotonic, exclude=True)


class BatchProgress(BaseModel):
    """One poll of one batch: what a progress callback receives."""

    batch_id: str
    status: str
    completed: int = 0
    failed: int = 0
    total: int = 0
    waited: float = Field(description="Seconds since this call began polling.")


class BatchFile(BaseModel):
    """An input file uploaded and the batch made of it."""

    file_id: str
    batch_id: str | None = None
    requests: int
    bytes: int


@dataclass
class Collected:
    """What polling the recorded batches came to."""

    failures: dict[str, str] = field(default_factory=dict)
    """Custom id -> why its line came back without an answer."""
    failed_batches: list[BatchState] = field(default_factory=list)
    """Batches that failed validation (nothing in them was run)."""
    collected: list[str] = field(default_factory=list)
    """Batch ids finished and read."""
    running: list[JobRecord] = field(default_factory=list)
    """Records of the batches still running when `max_wait` ran out (or not yet
    created: see `BatchSettings.adopt_grace`)."""


class BatchJobs:
    """The batches of one lane at one provider's API, recorded in `kept`."""

    def __init__(
        self,
        provider: BatchProvider | Any,
        kept: JobRecords,
        lane: Lane,
        settings: BatchSettings,
        progress: Callable[[BatchProgress], None] | None = None,
    ) -> None:
        """Work through `provider` (or an SDK client of one), recording in `kept`."""
        # An SDK client (`openai.OpenAI`, `anthropic.Anthropic`) names its provider.
        self.provider: BatchProvider = (
            provider if hasattr(provider, "stage") else provider_of_client(provider)
        )
        self.kept = kept
        self.lane = lane
        self.settings = settings
        self.progress = progress
        self.endpoint = self.provider.endpoint
        self._transient = CallRetry().is_transient
        self._own: set[str] = set()
        """Input ids of the records this object saved (their batches it creates)."""

    @property
    def name(self) -> str:
        """The provider's name, as the records say it."""
        return self.provider.name

    def records(self) -> list[JobRecord]:
        """The recorded batches of this lane at this API, oldest first."""
        return self.kept.jobs(self.name, self.endpoint, self.lane)

    # -- submitting -----------------------------------------------------------------

    def submit(
        self, requests: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> list[BatchFile]:
        """Stage `requests` (custom id, body) in jobs within the limits; a batch each.

        Each job is staged and batched as soon as it is full, so at most one
        job's requests are in memory.

        Raises:
            BatchLaneError: One request alone is larger than `max_bytes_per_file`.
        """
        files = []
        for chunk in self._split(requests):
            input_id, created = self.provider.stage(self.lane, chunk)
            record = JobRecord(
                provider=self.name,
                endpoint=self.endpoint,
                lane=self.lane,
                input_file_id=input_id,
                custom_ids=[custom_id for custom_id, _ in chunk],
                created=created,
            )
            self.kept.save(record)
            self._own.add(record.input_file_id)
            _, batch = self._create(record)
            files.append(
                BatchFile(
                    file_id=input_id,
                    batch_id=batch.id,
                    requests=len(chunk),
                    bytes=sum(len(line) for _, line in chunk),
                )
            )
        return files

    def _split(
        self, requests: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> Iterator[list[tuple[str, bytes]]]:
        most, limit = (
            self.settings.max_requests_per_file,
            self.settings.max_bytes_per_file,
        )
        chunk: list[tuple[str, bytes]] = []
        size = 0
        for custom_id, body in requests:
            line = self.provider.line(custom_id, body)
            if len(line) > limit:
                msg = (
                    f"The request {custom_id} is {len(line):,} bytes, more than a "
                    f"batch file may hold (max_bytes_per_file={limit:,}); shorten "
                    "its input or judge it online."
                )
                raise BatchLaneError(msg)
            if chunk and (len(chunk) == most or size + len(line) > limit):
                yield chunk
                chunk, size = [], 0
            chunk.append((custom_id, line))
            size += len(line)
        if chunk:
            yield chunk

    def _create(self, record: JobRecord) -> tuple[JobRecord, BatchState]:
        metadata = {"tag_lane": self.lane, **self.settings.metadata}
        batch = self.provider.create(record, metadata)
        return self._with_batch(record, batch), batch

    def _with_batch(self, record: JobRecord, batch: BatchState) -> JobRecord:
        record = record.model_copy(update={"batch_id": batch.id, "state": batch.status})
        self.kept.save(record)
        return record

    def _adopt(
        self, record: JobRecord, orphaned: float
    ) -> tuple[JobRecord, BatchState | None] | None:
        """The batch of a record saved before its creation: found, else created.

        A record this object did not save gets its batch created only once it has
        been seen without one for `adopt_grace` seconds (`orphaned` is when it was
        first seen so); until then its batch is None (still to come). None (the
        record dropped) if its provider cannot create it here (see
        `BatchProvider.finds_orphans`).
        """
        found = self.provider.find(record)
        if found is not None:
            return self._with_batch(record, found), found
        waited = self.settings.clock() - orphaned
        if record.input_file_id in self._own:
            return self._create(record)
        if waited < self.settings.adopt_grace:
            return record, None
        if not self.provider.finds_orphans:
            logger.warning(
                "Job %s at %s was recorded without a batch by a process that "
                "stopped; its record is dropped and its requests done online.",
                record.input_file_id,
                self.endpoint,
            )
            self.kept.delete(record)
            return None
        return self._create(record)

    # -- collecting -----------------------------------------------------------------

    def holding(self, custom_ids: AbstractSet[str]) -> list[JobRecord]:
        """The recorded batches holding any of `custom_ids`, oldest first."""
        return [r for r in self.records() if not custom_ids.isdisjoint(r.custom_ids)]

    def collect(self, custom_ids: AbstractSet[str]) -> Collected:
        """Poll the batches holding `custom_ids` until they end (or `max_wait`).

        Only those: another process sharing the records polls its own. A finished
        batch's answers are stored and its record deleted; lines that came back
        without an answer (an error, expiry, cancellation) are reported in
        `failures`; a batch that failed validation in `failed_batches`.
        """
        settings = self.settings
        collected = Collected()
        live = self.holding(custom_ids)
        start = settings.clock()
        orphaned: dict[str, float] = {}
        while live:
            running = []
            for known in live:
                polled = self._poll(known, start, orphaned)
                if polled is None:
                    continue
                record, batch = polled
                if batch is None or not batch.ended:
                    running.append(record)
                elif not self._finish(record, batch, collected):
                    running.append(record)  # read again at the next poll
            live = running
            waited = settings.clock() - start
            if not live or (
                settings.max_wait is not None
                and waited + settings.poll_interval > settings.max_wait
            ):
                break
            settings.sleep(settings.poll_interval)
        collected.running = live
        return collected

    def _poll(
        self, record: JobRecord, start: float, orphaned: dict[str, float]
    ) -> tuple[JobRecord, BatchState | None] | None:
        """The record (with its batch id) and the batch's state now.

        The batch is None when there is no news: a transient API error, or a batch
        still to be created by the process that saved the record. None (the
        record dropped) if the API does not know the batch, or another process
        finished it.
        """
        try:
            found = self._batch_of(record, orphaned)
        except Exception as error:  # noqa: BLE001 - raised again unless known
            return self._poll_failed(record, error)
        if found is None:
            return None
        record, batch = found
        if batch is None:
            return record, None
        if batch.status != record.state:  # seen in the records table
            self.kept.set_state(record, batch.status)
            record = record.model_copy(update={"state": batch.status})
        if self.progress is not None:
            self.progress(
                BatchProgress(
                    batch_id=batch.id,
                    status=batch.status,
                    completed=batch.completed,
                    failed=batch.failed,
                    total=batch.total or len(record.custom_ids),
                    waited=self.settings.clock() - start,
                )
            )
        return record, batch

    def _batch_of(
        self, record: JobRecord, orphaned: dict[str, float]
    ) -> tuple[JobRecord, BatchState | None] | None:
        """`_poll`'s answer, but for the state's bookkeeping; errors raised."""
        if record.batch_id is None and record.input_file_id not in self._own:
            # Another process may have added its batch id, or read it.
            reloaded = self.kept.get(record)
            if reloaded is None:
                return None
            record = reloaded
        if record.batch_id is None:
            since = orphaned.setdefault(record.input_file_id, self.settings.clock())
            return self._adopt(record, since)
        return record, self.provider.retrieve(record.batch_id)

    def _poll_failed(
        self, record: JobRecord, error: Exception
    ) -> tuple[JobRecord, BatchState | None] | None:
        """A poll's error: the record dropped (None) or no news; else raised."""
        if self.provider.is_unknown(error):
            logger.warning(
                "Batch %s (job %s) is unknown to %s; its record is dropped and "
                "its requests will be sent again.",
                record.batch_id,
                record.input_file_id,
                self.endpoint,
            )
            self.kept.delete(record)
            return None
        if not self._transient(error):
            raise error
        logger.warning(
            "Polling batch %s failed (%s); trying again at the next poll.",
            record.batch_id or record.input_file_id,
            error,
        )
        return record, None

    def _finish(
        self, record: JobRecord, batch: BatchState, collected: Collected
    ) -> bool:
        """Store an ended batch's answers and drop its record, at once.

        False if a transient error stopped the download (tried at the next poll).
        """
        if batch.refusals:
            collected.failed_batches.append(batch)
            self.kept.delete(record)
            return True
        answers: dict[str, str] = {}
        failures: dict[str, str] = {}
        try:
            # Read whole before anything is stored: an error leaves nothing half done.
            lines = list(self.provider.results(batch))
        except Exception as error:
            if not self._transient(error):
                raise
            logger.warning(
                "Downloading the output of batch %s failed (%s); trying again at "
                "the next poll.",
                batch.id,
                error,
            )
            return False
        for custom_id, body, why in lines:
            if body is not None:
                answers[custom_id] = body
            else:
                failures[custom_id] = why
        for custom_id in record.custom_ids:
            if custom_id not in answers and custom_id not in failures:
                failures[custom_id] = f"no answer in batch {batch.status}"
        self.kept.finish(record, answers)
        for custom_id in answers:
            failures.pop(custom_id, None)
        collected.failures.update(failures)
        collected.collected.append(batch.id)
        return True

    # -- answers --------------------------------------------------------------------

    def answers(self, custom_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored answers (the provider's answer bodies) of `custom_ids`."""
        stored = self.kept.answers(self.name, self.lane, custom_ids)
        return {custom_id: json.loads(value) for custom_id, value in stored.items()}

    def answered(self, custom_ids: Iterable[str]) -> set[str]:
        """Those of `custom_ids` whose answers are stored."""
        return self.kept.answered(self.name, self.lane, custom_ids)

    def forget(self, custom_ids: Iterable[str]) -> None:
        """Delete the stored answers of `custom_ids` (kept elsewhere now)."""
        self.kept.forget(self.name, self.lane, custom_ids)

    def cancel(self) -> list[str]:
        """Ask the API to cancel every recorded batch still running; their ids."""
        cancelled = []
        for record in self.records():
            if record.batch_id is None:
                continue
            if self.provider.retrieve(record.batch_id).cancellable:
                self.provider.cancel(record.batch_id)
                cancelled.append(record.batch_id)
        return cancelled
