"""`FakeOpenAIServer`: an OpenAI-compatible HTTP endpoint answered by a chat model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from typing_extensions import Self


@dataclass(frozen=True)
class Refusal:
    """An HTTP error `FakeOpenAIServer` sends instead of an answer.

    The body is OpenAI's error object: `{"error": {"message", "type", "code"}}`.
    The default is a rate limit; `Refusal.resource_unavailable()` is what the
    flex tier answers when it is short of capacity.
    """

    status: int = 429
    headers: Mapping[str, str] = field(default_factory=lambda: {"retry-after": "0"})
    message: str = "Rate limit reached; slow down."
    code: str | None = None
    """The error's `code` (OpenAI's rate limits say `rate_limit_exceeded`)."""
    error_type: str = "refused"
    """The error's `type`."""

    @classmethod
    def resource_unavailable(cls, headers: Mapping[str, str] | None = None) -> Refusal:
        """The flex tier's 429 when it is short of capacity (no `retry-after`)."""
        return cls(
            headers=headers or {},
            message="Resource unavailable: flex processing is short of capacity.",
            code="resource_unavailable",
        )


class FakeOpenAIServer:
    """An OpenAI-compatible `/v1/chat/completions` endpoint on loopback, for tests.

    It answers every request with a LangChain chat model (a fake of this module, say),
    so code that talks to OpenAI over HTTP, such as `ChatOpenAI(base_url=...)` or a
    LangGraph server configured from `OPENAI_BASE_URL`, runs offline for real. Use
    it as a context manager; `base_url` is the address to configure. It binds to
    127.0.0.1 only and serves each request on its own thread.
    """

    def __init__(
        self,
        model: BaseChatModel,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        refuse: Callable[[dict[str, Any]], Refusal | None] | None = None,
    ) -> None:
        """Serve `model` on `host:port` (port 0 picks a free one).

        Args:
            model: What answers the requests.
            host: The address to bind (loopback).
            port: The port; 0 picks a free one.
            refuse: Called with each request body first; a `Refusal` it returns is
                sent instead of an answer (a 429 with `retry-after`, a 503, ...).
        """
        from http.server import ThreadingHTTPServer  # noqa: PLC0415

        self.model = model
        self.refuse = refuse
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        # socketserver's backlog of 5 would leave a burst of concurrent calls
        # waiting for the kernel's SYN retry (a second or more): not the provider.
        server_class = type(
            "FakeOpenAIHTTPServer", (ThreadingHTTPServer,), {"request_queue_size": 128}
        )
        self._server = server_class((host, port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The `base_url` / `OPENAI_BASE_URL` of this server."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> Self:
        """Start serving."""
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """The chat completion answering one request body."""
        from langchain_core.messages import convert_to_messages  # noqa: PLC0415

        number = self._record(request)
        messages = convert_to_messages(
            [(m["role"], _text_of(m.get("content"))) for m in request["messages"]]
        )
        answer = self._chat_model().invoke(messages)
        usage: Mapping[str, Any] = answer.usage_metadata or {}
        prompt_tokens = usage.get("input_tokens", 0)
        completion_tokens = usage.get("output_tokens", 0)
        return {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer.text},
                    "finish_reason": "stop",
                    "logprobs": answer.response_metadata.get("logprobs"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _chat_model(self) -> BaseChatModel:
        """The model answering chat completions (a subclass may serve another)."""
        return self.model

    def _record(self, request: dict[str, Any]) -> int:
        """Record a chat request body; its number (1 for the first)."""
        with self._lock:
            self.requests.append(request)
            return len(self.requests)

    def _reply(
        self, request: dict[str, Any]
    ) -> tuple[int, Mapping[str, str], dict[str, Any]]:
        """The status, headers and body answering one request body."""
        refusal = self.refuse(request) if self.refuse else None
        if refusal is not None:
            self._record(request)
            error = {
                "message": refusal.message,
                "type": refusal.error_type,
                "code": refusal.code,
            }
            return refusal.status, refusal.headers, {"error": error}
        try:
            return 200, {}, self.complete(request)
        except Exception as failure:  # noqa: BLE001 - sent to the client
            error = {"message": str(failure), "type": "server_error"}
            return 500, {}, {"error": error}

    def _handler(self) -> type[Any]:
        from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_error(404, "only /v1/chat/completions is served")
                    return
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length))
                status, headers, body = server._reply(request)
                payload = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # keep test output clean

        return Handler


def _text_of(content: object) -> str:
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict)
        )
    return "" if content is None else str(content)
