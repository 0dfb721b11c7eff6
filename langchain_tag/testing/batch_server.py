"""`FakeBatchServer`: OpenAI's Files and Batch APIs on loopback, for tests.

It serves what the OpenAI SDK calls for batch work (`/v1/files` upload and
content, `/v1/batches` create, retrieve, cancel and list) and, like
`FakeOpenAIServer`, whose subclass it is, `/v1/chat/completions`: one server
stands in for the API, batch and online lanes alike. Each batch line is answered
by the same chat model the online endpoint uses, so both lanes give the same
answers. How a batch runs is scripted (`BatchScript`) by the number of times it is
polled, never by time: in progress for so many polls, then completed, expired or
cancelled with part of its lines answered, or failed at validation; per line,
an HTTP error instead of an answer.

Token usage is reported for every answer (online or batch): about 4 characters a
token, with cached input tokens as OpenAI's prompt caching would count them
(`langchain_tag.usage.SimulatedPromptCache`), so usage and cost figures can be
checked offline. None of it is a measurement of a real model.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from urllib.parse import parse_qs, urlsplit

from langchain_core.language_models import BaseChatModel

from langchain_tag.testing.server import FakeOpenAIServer, Refusal
from langchain_tag.usage import PromptCaching, SimulatedPromptCache

__all__ = ["BatchScript", "FakeBatchServer"]

CHARS_PER_TOKEN = 4
"""How the fake counts tokens: a token per 4 characters, rounded up."""

_ENDPOINT = "/v1/chat/completions"
_LIMIT_EXPIRED = (
    "This request could not be executed before the completion window expired."
)
_BATCH_ROUTE = re.compile(r"^/v1/batches/([^/]+)(/cancel)?$")
_FILE_ROUTE = re.compile(r"^/v1/files/([^/]+)(/content)?$")


@dataclass(frozen=True)
class BatchScript:
    """How `FakeBatchServer` runs one batch, counted in polls (`GET` of the batch).

    The first `polls` polls see it `in_progress` (its completed count rising);
    the next one sees it end as `end`:

    - `completed`: every line answered (or refused by `line_status`);
    - `expired`, `cancelled`: the first `answered` lines answered, the others in
      the error file with the code `batch_expired` / `batch_cancelled`;
    - `failed`: refused at validation, nothing run (also what a batch that breaks
      the server's limits or the line format gets, whatever its script).

    A cancel request makes the batch `cancelling`; the next poll sees it
    `cancelled`, with its first `answered` lines answered.
    """

    polls: int = 1
    end: Literal["completed", "expired", "cancelled", "failed"] = "completed"
    answered: int = 0
    """Lines answered before the batch expired or was cancelled."""
    line_status: Callable[[dict[str, Any]], int] | None = None
    """The HTTP status of a line from its request body; other than 200, the line
    goes to the error file with that status instead of an answer."""


class _Reply(NamedTuple):
    status: int
    body: Any
    """JSON-able, or the bytes of a file."""
    headers: Mapping[str, str] = {}


@dataclass
class _File:
    id: str
    purpose: str
    filename: str
    content: bytes
    created_at: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


@dataclass
class _Batch:
    state: dict[str, Any]
    script: BatchScript
    lines: list[dict[str, Any]]
    invalid: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0


class FakeBatchServer(FakeOpenAIServer):
    """OpenAI's Files and Batch APIs, and chat completions, on 127.0.0.1.

    Use it as a context manager and point an `openai.OpenAI(base_url=...)` or a
    `ChatOpenAI(base_url=...)` at `base_url`. `scripts` says how the n-th batch
    created runs (the last one for every batch after; default: completed at its
    second poll). `hits` counts requests by route (`"POST /v1/batches"`,
    `"GET /v1/batches/{id}"`, `"POST /v1/chat/completions"`, ...); `requests`
    holds every chat request body answered, online or in a batch. `faults` maps a
    route (named as in `hits`) to the HTTP statuses its next requests get instead
    of being served, one each (a transient 503, say). Uploads larger than
    `max_upload_bytes` are refused (413), so memory stays bounded. Batch ids and
    state changes are made under one lock: concurrent clients see one history.

    Args:
        model: What answers chat requests and batch lines.
        scripts: How each batch runs, in creation order.
        max_requests_per_file: A batch with more lines fails validation.
        max_bytes_per_file: A batch whose file is larger fails validation.
        max_upload_bytes: Larger uploads are refused.
        refuse: As `FakeOpenAIServer`'s, for online chat requests.
        host: The address to bind (loopback).
        port: The port; 0 picks a free one.
    """

    def __init__(
        self,
        model: BaseChatModel,
        scripts: Sequence[BatchScript] = (),
        *,
        max_requests_per_file: int = 50_000,
        max_bytes_per_file: int = 200_000_000,
        max_upload_bytes: int = 256_000_000,
        refuse: Callable[[dict[str, Any]], Refusal | None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """Serve `model`; see the class docstring."""
        self.scripts = list(scripts) or [BatchScript()]
        self.max_requests_per_file = max_requests_per_file
        self.max_bytes_per_file = max_bytes_per_file
        self.max_upload_bytes = max_upload_bytes
        self.hits: Counter[str] = Counter()
        self.faults: dict[str, list[int]] = {}
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        # Reentrant: finishing a batch answers its lines, which counts their
        # prompts in the simulated prompt cache under the same lock.
        self._state_lock = threading.RLock()
        self._prompt_cache = SimulatedPromptCache(PromptCaching(), _tokens)
        super().__init__(model, host, port, refuse=refuse)

    # -- answers ----------------------------------------------------------------------

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """The chat completion answering one request body, with its token usage."""
        completion = super().complete(request)
        prompt = "".join(
            f"{m.get('role')}:{m.get('content')}\n" for m in request["messages"]
        )
        answer = completion["choices"][0]["message"]["content"] or ""
        with self._state_lock:
            cached = self._prompt_cache.send(prompt)
        prompt_tokens = _tokens(prompt)
        completion_tokens = _tokens(answer)
        completion["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return completion

    def input_lines(self, batch_id: str) -> list[dict[str, Any]]:
        """The lines of a batch's input file, as sent."""
        return self.batches[batch_id].lines

    # -- files ------------------------------------------------------------------------

    def _add_file(self, purpose: str, filename: str, content: bytes) -> _File:
        with self._state_lock:
            file = _File(
                f"file-{len(self.files) + 1}",
                purpose,
                filename,
                content,
                int(time.time()),
            )
            self.files[file.id] = file
        return file

    # -- batches ----------------------------------------------------------------------

    def _create(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        file = self.files.get(str(request.get("input_file_id")))
        if file is None:
            return 400, _error("input_file_id names no file")
        lines, invalid = self._validate(file, str(request.get("endpoint")))
        now = int(time.time())
        state = {
            "object": "batch",
            "endpoint": request.get("endpoint"),
            "errors": None,
            "input_file_id": file.id,
            "completion_window": request.get("completion_window"),
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "expires_at": now + 86_400,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": request.get("metadata"),
        }
        with self._state_lock:  # the id and the batch in one step
            number = len(self.batches)
            script = self.scripts[min(number, len(self.scripts) - 1)]
            batch_id = state["id"] = f"batch_{number + 1}"
            self.batches[batch_id] = _Batch(state, script, lines, invalid)
            return 200, dict(state)

    def _validate(
        self, file: _File, endpoint: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The file's lines, and what the API would refuse in them."""
        invalid: list[dict[str, Any]] = []
        lines: list[dict[str, Any]] = []
        if len(file.content) > self.max_bytes_per_file:
            invalid.append(_refusal("file_too_large", "The file is too large."))
        seen: set[str] = set()
        models: set[str] = set()
        for number, raw in enumerate(file.content.decode().splitlines(), 1):
            try:
                line = json.loads(raw)
            except ValueError:
                invalid.append(_refusal("invalid_json_line", "Not JSON.", number))
                continue
            lines.append(line)
            custom_id = line.get("custom_id")
            if custom_id in seen:
                invalid.append(_refusal("duplicate_custom_id", "Repeated.", number))
            seen.add(custom_id)
            if line.get("method") != "POST" or line.get("url") != endpoint:
                invalid.append(_refusal("invalid_url", "Not the endpoint.", number))
            models.add(str((line.get("body") or {}).get("model")))
        if len(lines) > self.max_requests_per_file:
            invalid.append(_refusal("too_many_requests", "Too many requests."))
        if len(models) > 1:
            invalid.append(_refusal("mixed_models", "One model per file."))
        return lines, invalid

    def _poll(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        with self._state_lock:
            return self._advance(batch_id)

    def _advance(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        """One poll of a batch: its state moved on by its script (under the lock)."""
        batch = self.batches.get(batch_id)
        if batch is None:
            return 404, _error(f"No batch {batch_id}")
        state = batch.state
        batch.polls += 1
        polls = batch.polls
        if state["status"] in {"completed", "failed", "expired", "cancelled"}:
            return 200, dict(state)
        if batch.invalid or batch.script.end == "failed":
            reasons = batch.invalid or [_refusal("scripted", "Refused by script.")]
            state.update(
                status="failed",
                failed_at=int(time.time()),
                errors={"object": "list", "data": reasons},
            )
        elif state["status"] == "cancelling":
            self._finish(batch, "cancelled", batch.script.answered)
        elif polls <= batch.script.polls:
            total = len(batch.lines)
            state.update(status="in_progress", in_progress_at=int(time.time()))
            state["request_counts"]["completed"] = (
                total * polls // (batch.script.polls + 1)
            )
        else:
            end = batch.script.end
            answered = len(batch.lines) if end == "completed" else batch.script.answered
            self._finish(batch, end, answered)
        return 200, dict(state)

    def _cancel(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        with self._state_lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return 404, _error(f"No batch {batch_id}")
            if batch.state["status"] in {"validating", "in_progress", "finalizing"}:
                batch.state.update(status="cancelling", cancelling_at=int(time.time()))
            return 200, dict(batch.state)

    def _finish(self, batch: _Batch, end: str, answered: int) -> None:
        """Answer the first `answered` lines; the rest end in the error file."""
        output: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for number, line in enumerate(batch.lines):
            record = {"id": f"batch_req_{number}", "custom_id": line.get("custom_id")}
            if number >= answered:
                code = "batch_expired" if end == "expired" else "batch_cancelled"
                errors.append(
                    {
                        **record,
                        "response": None,
                        "error": {"code": code, "message": _LIMIT_EXPIRED},
                    }
                )
                continue
            status, body = self._answer_line(batch.script, line.get("body") or {})
            response = {
                "status_code": status,
                "request_id": f"req_{number}",
                "body": body,
            }
            (output if status == 200 else errors).append(  # noqa: PLR2004
                {**record, "response": response, "error": None}
            )
        batch.state.update(
            status=end,
            output_file_id=self._results(output),
            error_file_id=self._results(errors),
            request_counts={
                "total": len(batch.lines),
                "completed": len(output),
                "failed": len(errors),
            },
            **{f"{end}_at": int(time.time())},
        )

    def _answer_line(
        self, script: BatchScript, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        status = script.line_status(body) if script.line_status else 200
        if status != 200:  # noqa: PLR2004
            return status, _error(f"Scripted HTTP {status}")
        try:
            return 200, self.complete(body)
        except Exception as failure:  # noqa: BLE001 - the line's error
            return 500, _error(str(failure))

    def _results(self, lines: list[dict[str, Any]]) -> str | None:
        if not lines:
            return None
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        return self._add_file("batch_output", "results.jsonl", content).id

    def _list(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        limit = int(query.get("limit", ["20"])[0])
        after = query.get("after", [None])[0]
        with self._state_lock:
            newest = [dict(b.state) for b in reversed(self.batches.values())]
        if after is not None:
            ids = [s["id"] for s in newest]
            newest = newest[ids.index(after) + 1 :] if after in ids else []
        page = [dict(s) for s in newest[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(newest) > limit,
        }

    # -- HTTP -------------------------------------------------------------------------

    def _route(self, method: str, path: str, content_type: str, body: bytes) -> _Reply:
        """The reply to one request."""
        url = urlsplit(path)
        route = url.path.rstrip("/")
        name = _route_name(method, route)
        if name is None:
            return _Reply(404, _error(f"{method} {route} is not served"))
        with self._state_lock:
            self.hits[name] += 1
            statuses = self.faults.get(name)
            fault = statuses.pop(0) if statuses else None
        if fault is not None:
            return _Reply(fault, _error(f"Scripted HTTP {fault}"))
        if name == f"POST {_ENDPOINT}":
            status, headers, answer = self._reply(json.loads(body))
            return _Reply(status, answer, headers)
        if route.startswith("/v1/files"):
            return self._files_route(route, content_type, body)
        return self._batches_route(method, route, url.query, body)

    def _files_route(self, route: str, content_type: str, body: bytes) -> _Reply:
        if route == "/v1/files":
            if len(body) > self.max_upload_bytes:
                return _Reply(413, _error("The upload is too large."))
            form = _form(content_type, body)
            filename, content = form.get("file", (None, b""))
            purpose = form.get("purpose", (None, b""))[1].decode()
            file = self._add_file(purpose, filename or "upload", content)
            return _Reply(200, file.as_json())
        match = _FILE_ROUTE.match(route)
        assert match is not None  # noqa: S101 - `_route_name` matched it
        file_or_none = self.files.get(match.group(1))
        if file_or_none is None:
            return _Reply(404, _error(f"No file {match.group(1)}"))
        wants_content = match.group(2) is not None
        return _Reply(
            200, file_or_none.content if wants_content else file_or_none.as_json()
        )

    def _batches_route(
        self, method: str, route: str, query: str, body: bytes
    ) -> _Reply:
        if route == "/v1/batches":
            if method == "POST":
                return _Reply(*self._create(json.loads(body)))
            return _Reply(200, self._list(parse_qs(query)))
        match = _BATCH_ROUTE.match(route)
        assert match is not None  # noqa: S101 - `_route_name` matched it
        if match.group(2):
            return _Reply(*self._cancel(match.group(1)))
        return _Reply(*self._poll(match.group(1)))

    def _handler(self) -> type[Any]:
        from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else b""
                reply = server._route(
                    method, self.path, self.headers.get("Content-Type", ""), body
                )
                binary = isinstance(reply.body, bytes)
                raw = reply.body if binary else json.dumps(reply.body).encode()
                kind = "application/octet-stream" if binary else "application/json"
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # keep test output clean

        return Handler


def _route_name(method: str, route: str) -> str | None:
    """A request's route as `hits` and `faults` name it; None if not served."""
    name = None
    if method == "POST" and route.endswith("/chat/completions"):
        name = f"POST {_ENDPOINT}"
    elif route == "/v1/files":
        name = "POST /v1/files" if method == "POST" else None
    elif file := _FILE_ROUTE.match(route):
        content = "/content" if file.group(2) else ""
        name = f"GET /v1/files/{{id}}{content}" if method == "GET" else None
    elif route == "/v1/batches":
        name = f"{method} /v1/batches"
    elif batch := _BATCH_ROUTE.match(route):
        name = (
            "POST /v1/batches/{id}/cancel" if batch.group(2) else "GET /v1/batches/{id}"
        )
    return name


def _tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _refusal(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": None}


def _form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (file name, content)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = (part.get_filename(), payload)
    return fields
