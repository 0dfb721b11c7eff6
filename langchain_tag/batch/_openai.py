"""OpenAI's Files and Batch APIs as a `BatchProvider`.

A job's requests are uploaded as a JSONL file (its id is the job's input id), a
batch is created of the file, and its output and error files are downloaded once
it ends. A batch created just before a kill is found again by listing the
account's batches for the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import openai
from openai.types import Batch

from langchain_tag._text import json_lines
from langchain_tag.batch._providers import BATCH_DISCOUNT, BatchState, ResultLine
from langchain_tag.batch._requests import ENDPOINT, request_line

if TYPE_CHECKING:
    from langchain_tag.batch._records import JobRecord, Lane

PROVIDER: Final = "openai"
"""The provider column of this API's records and answers."""

_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
_RUNNING = frozenset({"validating", "in_progress", "finalizing"})
_ADOPT_SLACK = 3600
"""Seconds before its file's upload that a batch listing stops looking for it."""


class OpenAIBatches:
    """OpenAI's Files and Batch APIs through `client`."""

    name = PROVIDER
    discount = BATCH_DISCOUNT
    finds_orphans = True

    def __init__(self, client: openai.OpenAI) -> None:
        """Work through `client` (its key, base URL and retries)."""
        self.client = client
        self.endpoint = str(client.base_url)

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        return request_line(custom_id, body)

    def stage(self, lane: Lane, lines: Sequence[tuple[str, bytes]]) -> tuple[str, int]:
        content = b"".join(line for _, line in lines)
        uploaded = self.client.files.create(
            file=(f"tag-{lane}.jsonl", content), purpose="batch"
        )
        return uploaded.id, uploaded.created_at

    def create(self, record: JobRecord, metadata: Mapping[str, str]) -> BatchState:
        batch = self.client.batches.create(
            input_file_id=record.input_file_id,
            endpoint=ENDPOINT,
            completion_window="24h",
            metadata=dict(metadata),
        )
        return _state(batch)

    def find(self, record: JobRecord) -> BatchState | None:
        for batch in self.client.batches.list(limit=100):  # newest first
            if batch.input_file_id == record.input_file_id:
                return _state(batch)
            if batch.created_at < record.created - _ADOPT_SLACK:
                break
        return None

    def retrieve(self, batch_id: str) -> BatchState:
        return _state(self.client.batches.retrieve(batch_id))

    def results(self, state: BatchState) -> Iterator[ResultLine]:
        # Both files are downloaded before any line is given: a transient error
        # then leaves nothing half read.
        contents = [self.client.files.content(i).text for i in state.outputs]
        for content in contents:
            yield from _lines(content)

    def cancel(self, batch_id: str) -> None:
        self.client.batches.cancel(batch_id)

    def is_unknown(self, error: Exception) -> bool:
        return isinstance(error, openai.NotFoundError)


def _state(batch: Batch) -> BatchState:
    counts = batch.request_counts
    refusals = []
    if batch.status == "failed":
        errors = (batch.errors.data if batch.errors else None) or []
        refusals = [
            f"{batch.id}: {error.code or 'error'}"
            + (f" at line {error.line}" if error.line is not None else "")
            + f": {error.message}"
            for error in errors
        ] or [f"{batch.id}: no reason given"]
    return BatchState(
        id=batch.id,
        status=batch.status,
        ended=batch.status in _TERMINAL,
        cancellable=batch.status in _RUNNING,
        refusals=refusals,
        completed=counts.completed if counts else 0,
        failed=counts.failed if counts else 0,
        total=counts.total if counts else 0,
        outputs=[f for f in (batch.output_file_id, batch.error_file_id) if f],
    )


def _lines(content: str) -> Iterable[ResultLine]:
    """The lines of an output or error file."""
    for raw in json_lines(content):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # its request is then reported as not answered
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str):
            continue
        response = line.get("response") or {}
        error = line.get("error")
        status = response.get("status_code")
        body = response.get("body")
        if error:
            yield ResultLine(custom_id, None, str(error.get("code") or "error"))
        elif status != 200 or not isinstance(body, dict):  # noqa: PLR2004
            yield ResultLine(custom_id, None, f"HTTP {status}")
        else:
            yield ResultLine(custom_id, json.dumps(body), "")
