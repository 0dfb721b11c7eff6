"""`FakeAnthropicBatchServer`: Anthropic's Messages and Message Batches on loopback.

It serves what the `anthropic` SDK (and `ChatAnthropic`) call: `POST /v1/messages`
(online), and `/v1/messages/batches` create, list, retrieve, cancel and results.
Each request, online or in a batch, is answered by one LangChain chat model (a
fake of `langchain_tag.testing`), so both lanes give the same answers. A batch
runs as a `BatchScript` says, counted in polls (never time): in progress for so
many polls, then ended with every request succeeded, or with the first `answered`
succeeded and the rest expired or canceled; `failed` refuses the batch at
creation (HTTP 400), as Anthropic refuses a malformed one; `line_status` errors
single requests.

Every Messages API body received (online, or a batch request's `params`) is kept
in `requests`, for tests to assert on what was sent. Token usage is about 4
characters a token; nothing here measures a real model.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, convert_to_messages

from langchain_tag.testing.batch_server import BatchScript
from langchain_tag.testing.server import FakeOpenAIServer

__all__ = ["FakeAnthropicBatchServer"]

_CHARS_PER_TOKEN = 4
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_BATCH_ROUTE = re.compile(r"^/v1/messages/batches/([^/]+)(/cancel|/results)?$")


@dataclass
class _Batch:
    id: str
    script: BatchScript
    requests: list[dict[str, Any]]
    created_at: datetime
    status: str = "in_progress"
    polls: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None


class FakeAnthropicBatchServer(FakeOpenAIServer):
    """Anthropic's Messages and Message Batches APIs on 127.0.0.1, for tests.

    Use it as a context manager and point `anthropic.Anthropic(base_url=...)` or
    `ChatAnthropic(base_url=...)` at `base_url`. `scripts` says how the n-th batch
    created runs (the last one for every batch after; default: ended at its second
    poll). `hits` counts requests by route (`"POST /v1/messages/batches"`,
    `"GET /v1/messages/batches/{id}"`, `"POST /v1/messages"`, ...); `faults` maps
    a route so named to HTTP statuses its next requests get instead (one each).
    A batch of more than `max_requests_per_batch` requests, a request body larger
    than `max_body_bytes`, a repeated or malformed `custom_id` or a request
    without `model`, `max_tokens` or `messages` is refused (400 or 413), so memory
    stays bounded and the lane's requests are checked as Anthropic checks them.

    Args:
        model: What answers the requests.
        scripts: How each batch runs, in creation order.
        max_requests_per_batch: Anthropic's limit, 100,000.
        max_body_bytes: Anthropic's limit on a batch's request, 256 MB.
        host: The address to bind (loopback).
        port: The port; 0 picks a free one.
    """

    def __init__(
        self,
        model: BaseChatModel,
        scripts: Sequence[BatchScript] = (),
        *,
        max_requests_per_batch: int = 100_000,
        max_body_bytes: int = 256_000_000,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """Serve `model`; see the class docstring."""
        self.scripts = list(scripts) or [BatchScript()]
        self.max_requests_per_batch = max_requests_per_batch
        self.max_body_bytes = max_body_bytes
        self.hits: Counter[str] = Counter()
        self.faults: dict[str, list[int]] = {}
        self.batches: dict[str, _Batch] = {}
        self._state_lock = threading.RLock()
        super().__init__(model, host, port)

    @property
    def base_url(self) -> str:
        """The `base_url` of an `anthropic.Anthropic` or a `ChatAnthropic`."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def batch_requests(self, batch_id: str) -> list[dict[str, Any]]:
        """A batch's requests (`custom_id`, `params`), as sent."""
        return self.batches[batch_id].requests

    # -- answers ----------------------------------------------------------------------

    def message(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The Messages API response to one request body, answered by the model."""
        number = self._record(dict(params))
        answer = self._chat_model().invoke(_messages(params))
        text = answer.text
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        choice = params.get("tool_choice") or {}
        if choice.get("type") == "tool":  # a forced tool: structured output
            try:
                arguments = json.loads(text)
            except ValueError:
                arguments = None
            if isinstance(arguments, dict):
                content = [
                    {
                        "type": "tool_use",
                        "id": f"toolu_fake_{number}",
                        "name": choice["name"],
                        "input": arguments,
                    }
                ]
        prompt = json.dumps([params.get("system"), params.get("messages")])
        return {
            "id": f"msg_fake_{number}",
            "type": "message",
            "role": "assistant",
            "model": params.get("model", "fake"),
            "content": content,
            "stop_reason": "tool_use"
            if content[0]["type"] == "tool_use"
            else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": _tokens(prompt),
                "output_tokens": _tokens(text),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    # -- batches ----------------------------------------------------------------------

    def _create(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        requests = body.get("requests")
        refusal = self._invalid(requests)
        with self._state_lock:  # the id and the batch in one step
            number = len(self.batches)
            script = self.scripts[min(number, len(self.scripts) - 1)]
            if refusal is None and script.end == "failed":
                refusal = "Refused by script."
            if refusal is not None:
                return 400, _error("invalid_request_error", refusal)
            assert isinstance(requests, list)  # noqa: S101 - `_invalid` checked it
            batch = _Batch(
                f"msgbatch_{number + 1}", script, requests, datetime.now(timezone.utc)
            )
            self.batches[batch.id] = batch
            return 200, self._json(batch)

    def _invalid(self, requests: object) -> str | None:
        """Why Anthropic would refuse these requests; None if it would not."""
        if not isinstance(requests, list) or not requests:
            return "requests: a non-empty list is required"
        if len(requests) > self.max_requests_per_batch:
            return f"requests: at most {self.max_requests_per_batch} per batch"
        seen: set[str] = set()
        for number, request in enumerate(requests):
            custom_id = request.get("custom_id") if isinstance(request, dict) else None
            params = request.get("params") if isinstance(request, dict) else None
            if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
                return f"requests.{number}.custom_id: 1-64 of [a-zA-Z0-9_-]"
            if custom_id in seen:
                return f"requests.{number}.custom_id: {custom_id} is repeated"
            seen.add(custom_id)
            if (
                not isinstance(params, dict)
                or not {
                    "model",
                    "max_tokens",
                    "messages",
                }
                <= params.keys()
            ):
                return f"requests.{number}.params: model, max_tokens, messages needed"
        return None

    def _poll(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        with self._state_lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return 404, _error("not_found_error", f"No batch {batch_id}")
            batch.polls += 1
            if batch.status == "canceling":
                self._end(batch, "canceled", batch.script.answered)
            elif batch.status == "in_progress" and batch.polls > batch.script.polls:
                end = batch.script.end
                everyone = end == "completed"
                answered = len(batch.requests) if everyone else batch.script.answered
                self._end(
                    batch, "expired" if end == "expired" else "canceled", answered
                )
            return 200, self._json(batch)

    def _cancel(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        with self._state_lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return 404, _error("not_found_error", f"No batch {batch_id}")
            if batch.status == "in_progress":
                batch.status = "canceling"
                batch.cancel_initiated_at = datetime.now(timezone.utc)
            return 200, self._json(batch)

    def _end(self, batch: _Batch, unanswered: str, answered: int) -> None:
        """Answer the first `answered` requests; the others end `unanswered`."""
        for number, request in enumerate(batch.requests):
            custom_id = request["custom_id"]
            if number >= answered:
                result: dict[str, Any] = {"type": unanswered}
            else:
                result = self._result(batch.script, request["params"])
            batch.results.append({"custom_id": custom_id, "result": result})
        batch.status = "ended"
        batch.ended_at = datetime.now(timezone.utc)

    def _result(self, script: BatchScript, params: dict[str, Any]) -> dict[str, Any]:
        status = script.line_status(params) if script.line_status else 200
        if status != 200:  # noqa: PLR2004
            kind = "api_error" if status >= 500 else "invalid_request_error"  # noqa: PLR2004
            return {"type": "errored", "error": _error(kind, f"Scripted HTTP {status}")}
        try:
            return {"type": "succeeded", "message": self.message(params)}
        except Exception as failure:  # noqa: BLE001 - the request's error
            return {"type": "errored", "error": _error("api_error", str(failure))}

    def _json(self, batch: _Batch) -> dict[str, Any]:
        counts = Counter(r["result"]["type"] for r in batch.results)
        ended = batch.status == "ended"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": batch.status,
            "request_counts": {
                "processing": 0 if ended else len(batch.requests),
                "succeeded": counts["succeeded"],
                "errored": counts["errored"],
                "canceled": counts["canceled"],
                "expired": counts["expired"],
            },
            "created_at": batch.created_at.isoformat(),
            "expires_at": (batch.created_at + timedelta(days=1)).isoformat(),
            "ended_at": batch.ended_at.isoformat() if batch.ended_at else None,
            "cancel_initiated_at": (
                batch.cancel_initiated_at.isoformat()
                if batch.cancel_initiated_at
                else None
            ),
            "archived_at": None,
            "results_url": (
                f"{self.base_url}/v1/messages/batches/{batch.id}/results"
                if ended
                else None
            ),
        }

    def _list(self) -> dict[str, Any]:
        with self._state_lock:
            newest = [self._json(b) for b in reversed(self.batches.values())]
        return {
            "data": newest,
            "has_more": False,
            "first_id": newest[0]["id"] if newest else None,
            "last_id": newest[-1]["id"] if newest else None,
        }

    def _results(self, batch_id: str) -> tuple[int, Any]:
        with self._state_lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return 404, _error("not_found_error", f"No batch {batch_id}")
            if batch.status != "ended":
                return 400, _error("invalid_request_error", "Not ended yet.")
            lines = "".join(json.dumps(r) + "\n" for r in batch.results)
        return 200, lines.encode()

    # -- HTTP -------------------------------------------------------------------------

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """The status and reply (JSON-able, or bytes) to one request."""
        route = urlsplit(path).path.rstrip("/")
        name = _route_name(method, route)
        if name is None:
            return 404, _error("not_found_error", f"{method} {route} is not served")
        with self._state_lock:
            self.hits[name] += 1
            statuses = self.faults.get(name)
            fault = statuses.pop(0) if statuses else None
        if fault is not None:
            return fault, _error("api_error", f"Scripted HTTP {fault}")
        if len(body) > self.max_body_bytes:
            return 413, _error("request_too_large", "The request is too large.")
        return self._served(name, route, body)

    def _served(self, name: str, route: str, body: bytes) -> tuple[int, Any]:
        if name == "POST /v1/messages":
            try:
                return 200, self.message(json.loads(body))
            except Exception as failure:  # noqa: BLE001 - sent to the client
                return 500, _error("api_error", str(failure))
        if name == "POST /v1/messages/batches":
            return self._create(json.loads(body))
        if name == "GET /v1/messages/batches":
            return 200, self._list()
        match = _BATCH_ROUTE.match(route)
        assert match is not None  # noqa: S101 - `_route_name` matched it
        batch_id, action = match.groups()
        if action == "/cancel":
            return self._cancel(batch_id)
        return self._results(batch_id) if action else self._poll(batch_id)

    def _handler(self) -> type[Any]:
        from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                if length > server.max_body_bytes:
                    self.send_error(413, "The request is too large.")
                    return
                body = self.rfile.read(length) if length else b""
                status, reply = server._route(method, self.path, body)
                binary = isinstance(reply, bytes)
                raw = reply if binary else json.dumps(reply).encode()
                self.send_response(status)
                kind = "application/binary" if binary else "application/json"
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
    if route == "/v1/messages":
        return "POST /v1/messages" if method == "POST" else None
    if route == "/v1/messages/batches":
        return f"{method} /v1/messages/batches"
    match = _BATCH_ROUTE.match(route)
    if match is None:
        return None
    action = match.group(2) or ""
    wanted = "POST" if action == "/cancel" else "GET"
    return f"{method} /v1/messages/batches/{{id}}{action}" if method == wanted else None


def _messages(params: Mapping[str, Any]) -> list[BaseMessage]:
    """The LangChain messages of a Messages API body (text only)."""
    system = params.get("system")
    turns = [("system", _text(system))] if system else []
    turns += [(str(m.get("role")), _text(m.get("content"))) for m in params["messages"]]
    return convert_to_messages(turns)


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    return "" if content is None else str(content)


def _tokens(text: str) -> int:
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
