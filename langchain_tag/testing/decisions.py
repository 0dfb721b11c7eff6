"""OpenAI Decisions offline: a rule-aware fake decision model, and the API on loopback.

`RuleAwareFakeDecisionModel` is a LangChain decision model (`BaseDecisionModel`)
that answers `Noul` questions rendered by `render_decision_question` from the
fakes' ground truth (`condition_holds`: YES iff a backtick-quoted fragment of the
rule's condition occurs in the input). `FakeDecisionsServer` serves OpenAI's
`POST /v1/decisions` on 127.0.0.1, answering each predicate question through such
a model, so the OpenAI SDK's `client.decisions.create` and langchain-openai's
`OpenAIClassifier` run offline for real, with scriptable refusals, HTTP errors and
malformed responses. Given a chat model it serves `/v1/chat/completions` too (it is
a `FakeOpenAIServer`), so one `OPENAI_BASE_URL` stands in for a decision-model
judge and a chat executor.

Token usage is a stand-in count, never a measurement of a real model: a token per
`CHARS_PER_TOKEN` characters (rounded up) of the input text, plus the same for each
question's instructions as sent; no output, reasoning or cached tokens.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn, cast

from langchain_core.decisions import (
    BaseDecisionModel,
    ClassifierResponse,
    Noul,
    Question,
    State,
)
from langchain_core.exceptions import ModelRefusalError
from langchain_core.language_models import BaseChatModel
from pydantic import Field, PrivateAttr

from langchain_tag.matching.decision import noul_response
from langchain_tag.matching.prompts import read_decision_question
from langchain_tag.testing.judges import condition_holds
from langchain_tag.testing.server import FakeOpenAIServer, Refusal
from langchain_tag.usage import sent_instructions

__all__ = ["FakeDecisionsServer", "RuleAwareFakeDecisionModel"]

CHARS_PER_TOKEN = 4
"""How the fakes count tokens: a token per 4 characters, rounded up."""

DEFAULT_MAX_QUESTIONS = 200
"""The questions one request may ask `FakeDecisionsServer` unless told otherwise."""

RATE_LIMIT = Refusal(
    status=429,
    headers={"retry-after": "0"},
    message="Rate limit reached for requests. Please try again later.",
    code="rate_limit_exceeded",
    error_type="requests",
)
"""What `FakeDecisionsServer` sends to its first `rate_limited` requests by default.

The OpenAI SDK honours only a positive wait: after `retry-after: 0` it backs off
by its own schedule (about half a second). Add `retry-after-ms: 1` to retry at once.
"""

_ENDPOINT = "/v1/decisions"
_CHAT_ENDPOINT = "/v1/chat/completions"
_QUESTION_TYPES = ("predicate", "choice", "score")


def _tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _input_tokens(state: str, instructions: Sequence[str]) -> int:
    """The stand-in count of a request's input tokens (see the module docstring)."""
    return _tokens(state) + sum(_tokens(text) for text in instructions)


class RuleAwareFakeDecisionModel(BaseDecisionModel):
    """A deterministic decision model answering rule questions from their text.

    A `Noul` whose instructions hold a rule block (`render_decision_question`) gets
    `yes_probability` when the rule's condition holds for the state
    (`condition_holds`), else `no_probability`. The state must be text. `Choice`,
    `Score` and `Box` questions, and a `Noul` that is no decision question, are
    refused with `ValueError`. `refuse(state, rule_fields)` makes the model refuse
    a question: `invoke` then raises `ModelRefusalError` naming every refused
    question, as `OpenAIClassifier` does. Every request it answers (refusals
    included) is recorded in `requests` (thread-safe), those `FakeDecisionsServer`
    passes on too; one it cannot answer is not.

    Usage is a stand-in count: see the module docstring.
    """

    model: str = "fake-decisions"
    yes_probability: float = Field(default=0.93, ge=0.0, le=1.0)
    """P(yes) when the rule's condition holds."""
    no_probability: float = Field(default=0.04, ge=0.0, le=1.0)
    """P(yes) when it does not."""
    refuse: Callable[[str, dict[str, str]], bool] | None = Field(
        default=None, exclude=True
    )
    """Called with the state and a question's rule fields: True refuses it."""

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _requests: list[tuple[str, list[str]]] = PrivateAttr(default_factory=list)

    @property
    def _provider(self) -> str:
        return "fake"

    @property
    def requests(self) -> list[tuple[str, list[str]]]:
        """The requests answered so far: (state, question names), in arrival order."""
        with self._lock:
            return [(state, list(names)) for state, names in self._requests]

    @property
    def calls(self) -> int:
        """How many requests were answered."""
        with self._lock:
            return len(self._requests)

    def answer(self, state: str, name: str, instructions: str) -> float | None:
        """P(yes) for one question about `state`; None if the model refuses it.

        Args:
            state: The input text.
            name: The question's name (for the error message).
            instructions: The question's instructions as sent (criteria may follow).

        Raises:
            ValueError: The instructions hold no rendered decision question.
        """
        fields = read_decision_question(instructions)
        if fields is None:
            msg = (
                f"Question {name!r} is not a decision question: the fake decision "
                "model answers only instructions made by render_decision_question"
            )
            raise ValueError(msg)
        if self.refuse is not None and self.refuse(state, fields):
            return None
        if condition_holds(state, fields):
            return self.yes_probability
        return self.no_probability

    def answer_all(
        self, state: str, questions: Sequence[tuple[str, str]]
    ) -> list[float | None]:
        """Answer one request's (name, instructions) questions in order; record it.

        Returns:
            P(yes) per question, None where the model refuses.

        Raises:
            ValueError: A question is no decision question (see `answer`).
        """
        return self._answer_request(state, questions)[1]

    def _answer_request(
        self, state: str, questions: Sequence[tuple[str, str]]
    ) -> tuple[int, list[float | None]]:
        """The request's number (1-based) and its answers; recorded if answered."""
        answers = [self.answer(state, name, text) for name, text in questions]
        with self._lock:
            self._requests.append((state, [name for name, _ in questions]))
            return len(self._requests), answers

    def _classify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        if not isinstance(state, str):
            msg = (
                "RuleAwareFakeDecisionModel classifies text only: the state must be "
                f"a str, not {type(state).__name__}"
            )
            raise TypeError(msg)
        if not questions:
            msg = "A decision request needs at least one question."
            raise ValueError(msg)
        asked: list[tuple[str, str]] = []
        for name, question in questions.items():
            if not isinstance(question, Noul):
                msg = (
                    f"Question {name!r}: RuleAwareFakeDecisionModel answers Noul "
                    f"questions only, not {type(question).__name__}"
                )
                raise ValueError(msg)  # noqa: TRY004 - as OpenAIClassifier's for Box
            # As `OpenAIClassifier` sends it, so the fake model, the fake server
            # and the estimates count the same text.
            asked.append((name, sent_instructions(question)))
        number, probabilities = self._answer_request(state, asked)
        answered = dict(zip(questions, probabilities, strict=True))
        refused = [
            name for name, probability in answered.items() if probability is None
        ]
        if refused:
            msg = f"The fake decision model refused to answer: {', '.join(refused)}."
            raise ModelRefusalError(msg)
        input_tokens = _input_tokens(state, [text for _, text in asked])
        return noul_response(
            self.model,
            {name: p for name, p in answered.items() if p is not None},
            input_tokens,
            f"req_fake_{number}",
        )

    async def _aclassify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        # No I/O and no waits: a thread from the executor would only cost time.
        return self._classify(state, questions)


class _InvalidRequestError(Exception):
    """A request the API refuses with a 400 `invalid_request_error`."""

    def __init__(self, message: str, param: str | None, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class _Reply(NamedTuple):
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = {}


def _error(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> _Reply:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    error = {"message": message, "type": error_type, "param": param, "code": code}
    return _Reply(status, {"error": error}, headers or {})


def _missing(param: str) -> NoReturn:
    message = f"Missing required parameter: '{param}'."
    raise _InvalidRequestError(message, param, "missing_required_parameter")


def _wrong_type(param: str, expected: str, value: object) -> NoReturn:
    message = (
        f"Invalid type for '{param}': expected {expected}, but got "
        f"{type(value).__name__}."
    )
    raise _InvalidRequestError(message, param, "invalid_type")


def _parts_text(content: object, param: str) -> str:
    """The text of a string or of content parts (JSON parts as JSON text).

    Parts are joined by a blank line, as `OpenAIClassifier` appends criteria to
    string instructions; image parts carry no text.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _wrong_type(param, "a string or an array of content parts", content)
    texts: list[str] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict):
            _wrong_type(f"{param}[{index}]", "an object", part)
        if part.get("type") == "input_json":
            texts.append(json.dumps(part.get("data"), ensure_ascii=False))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n\n".join(texts)


def _input_text(request: Mapping[str, Any]) -> str:
    """The state: the input if a string, else its user messages' text, in order."""
    if "input" not in request:
        _missing("input")
    value = request["input"]
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        _wrong_type("input", "a string or a non-empty array of items", value)
    texts: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            _wrong_type(f"input[{index}]", "an object", item)
        if item.get("role") == "user" and item.get("type", "message") == "message":
            texts.append(_parts_text(item.get("content"), f"input[{index}].content"))
    return "\n".join(texts)


class FakeDecisionsServer(FakeOpenAIServer):
    """OpenAI's `POST /v1/decisions` on 127.0.0.1, answered by a fake decision model.

    Point `openai.OpenAI(base_url=...)` or `OpenAIClassifier(base_url=...)` at
    `base_url`; use it as a context manager. Each predicate question is answered
    through `model.answer` (one `model.answer_all` per request); the state is the
    request's `input` if a string, else the text of its user messages, joined by
    newlines. Answers come in question order; a question the model refuses comes
    back as `{"type": "refusal", "name": ...}` in its slot. Every response carries
    an `x-request-id` (`req_fake_<n>`, n counting requests to the endpoint).

    Refused with a 400 `invalid_request_error` (a specific message, `param` and
    `code`): a body that is no JSON object; a missing or mistyped `model`, `input`
    or `questions`; no questions, or more than `max_questions`
    (`too_many_questions`); a question of an unknown type, or a choice or score
    question (this fake answers predicates only); a missing or repeated question
    name (the real API allows unnamed questions; this fake matches answers by
    name); missing instructions, or instructions that hold no rendered decision
    question. Any other path or method gets OpenAI's 404.

    Given a `chat_model`, it also serves `POST /v1/chat/completions` as its base
    class `FakeOpenAIServer` does (the pattern of `FakeBatchServer`), so one
    `OPENAI_BASE_URL` serves a decision-model judge and a chat executor or
    extractor: those bodies go to `chat_requests`, and `chat_refuse` may refuse
    them. Without a chat model that path gets the 404 too. `model`, `requests`,
    `request_count` and the `x-request-id` numbers are the decision endpoint's
    (where `FakeOpenAIServer` has a chat model and chat bodies).

    Scripted, in this order, before validation: the first `rate_limited` requests
    (or the next n, after `rate_limit_next(n)`) get `rate_limit`; then `fault`,
    called with each request body, may return a `Refusal` to send instead of an
    answer (a 429 with `retry-after`, a 500, ...). After answering,
    `drop_answers(request)` names answers to leave out of the response, and
    `extra_answers(request)` gives answers to append (an unknown name, say), so
    clients can be tested on answers that do not match their questions. Each of
    these is a plain attribute and may be changed between requests.

    Usage is a stand-in count (see the module docstring): input tokens for the
    state's text and each question's instructions as sent; no output, reasoning or
    cached tokens. Chat answers report the chat model's own usage.

    Args:
        model: What answers the questions; default a new
            `RuleAwareFakeDecisionModel`.
        max_questions: More questions in a request are refused.
        rate_limited: How many of the first requests get `rate_limit`.
        rate_limit: What those requests get (default `RATE_LIMIT`: a 429 with
            `retry-after: 0`).
        fault: Called with each request body; a `Refusal` it returns is sent.
        drop_answers: Called with each answered request body; the names it returns
            get no answer in the response.
        extra_answers: Called with each answered request body; the answers it
            returns are appended to the response's.
        chat_model: What answers `/v1/chat/completions`; None serves no chat.
        chat_refuse: Called with each chat request body first; a `Refusal` it
            returns is sent instead of an answer (`FakeOpenAIServer`'s `refuse`).
        host: The address to bind (loopback).
        port: The port; 0 picks a free one.
    """

    # The decision model, as before chat was served too (the chat model is
    # `chat_model`): not the base class's chat model.
    model: RuleAwareFakeDecisionModel  # type: ignore[assignment]

    def __init__(
        self,
        model: RuleAwareFakeDecisionModel | None = None,
        *,
        max_questions: int = DEFAULT_MAX_QUESTIONS,
        rate_limited: int = 0,
        rate_limit: Refusal = RATE_LIMIT,
        fault: Callable[[dict[str, Any]], Refusal | None] | None = None,
        drop_answers: Callable[[dict[str, Any]], Collection[str]] | None = None,
        extra_answers: Callable[[dict[str, Any]], Sequence[Mapping[str, Any]]]
        | None = None,
        chat_model: BaseChatModel | None = None,
        chat_refuse: Callable[[dict[str, Any]], Refusal | None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """Serve `model` (and `chat_model`) on `host:port`; see the class docstring."""
        # The base class binds the socket, with this class's handler; the `model`
        # it keeps is replaced by the decision model below.
        super().__init__(
            cast("BaseChatModel", chat_model), host, port, refuse=chat_refuse
        )
        self.model = model if model is not None else RuleAwareFakeDecisionModel()
        self.chat_model = chat_model
        self.chat_requests: list[dict[str, Any]] = []
        self.max_questions = max_questions
        self.rate_limit = rate_limit
        self.fault = fault
        self.drop_answers = drop_answers
        self.extra_answers = extra_answers
        self._request_count = 0
        self._rate_limited = rate_limited
        # Polled often, so that `__exit__` returns at once, not after up to 0.5 s.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), daemon=True
        )

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies received at `/v1/decisions`, in arrival order (a copy).

        Chat bodies are in `chat_requests`.
        """
        with self._lock:
            return list(self._requests)

    @requests.setter
    def requests(self, bodies: list[dict[str, Any]]) -> None:
        # The base class starts its record with `self.requests = []`, before it
        # makes the lock: one assignment, which no request can interleave.
        self._requests = list(bodies)

    @property
    def request_count(self) -> int:
        """Requests received at the endpoint, refused ones and non-JSON included."""
        with self._lock:
            return self._request_count

    def rate_limit_next(self, n: int, refusal: Refusal | None = None) -> None:
        """Send the next `n` requests `refusal` (default: `rate_limit`) instead.

        Args:
            n: How many requests; 0 stops a rate limit still pending.
            refusal: What they get; it becomes `rate_limit`.
        """
        with self._lock:
            self._rate_limited = n
            if refusal is not None:
                self.rate_limit = refusal

    # -- chat -------------------------------------------------------------------------

    def _chat_model(self) -> BaseChatModel:
        if self.chat_model is None:
            msg = "This FakeDecisionsServer serves no chat: give it a chat_model."
            raise RuntimeError(msg)
        return self.chat_model

    def _record(self, request: dict[str, Any]) -> int:
        # Chat bodies apart: `requests` holds the decision requests.
        with self._lock:
            self.chat_requests.append(request)
            return len(self.chat_requests)

    # -- one request ------------------------------------------------------------------

    def _route(self, method: str, path: str, raw: bytes) -> tuple[int, _Reply]:
        """The decision request's number (0 for any other request) and the reply."""
        route = path.split("?", 1)[0].rstrip("/")
        if method == "POST" and route == _ENDPOINT:
            return self._decide(raw)
        if method == "POST" and route == _CHAT_ENDPOINT and self.chat_model is not None:
            try:
                request: object = json.loads(raw)
            except ValueError:
                request = None
            if not isinstance(request, dict):
                return 0, _error(400, "The chat request body must be a JSON object.")
            status, headers, body = self._reply(request)
            return 0, _Reply(status, body, headers)
        return 0, _error(404, f"Invalid URL ({method} {path})", code="unknown_url")

    def _decide(self, raw: bytes) -> tuple[int, _Reply]:
        """The decision request's number and its reply."""
        try:
            request: object = json.loads(raw)
        except ValueError:
            request = None
        with self._lock:
            self._request_count += 1
            number = self._request_count
            if isinstance(request, dict):
                self._requests.append(request)
            limited = self._rate_limited > 0
            self._rate_limited -= limited
            refusal = self.rate_limit if limited else None
        if refusal is None and isinstance(request, dict) and self.fault is not None:
            refusal = self.fault(request)
        if refusal is not None:
            return number, _error(
                refusal.status,
                refusal.message,
                error_type=refusal.error_type,
                code=refusal.code,
                headers=refusal.headers,
            )
        if not isinstance(request, dict):
            message = (
                "We could not parse the JSON body of your request: the body must be "
                "a JSON object."
            )
            return number, _error(400, message)
        try:
            return number, _Reply(200, self._answer(request))
        except _InvalidRequestError as invalid:
            return number, _error(
                400, invalid.message, param=invalid.param, code=invalid.code
            )
        except Exception as failure:  # noqa: BLE001 - sent to the client
            return number, _error(500, str(failure), error_type="server_error")

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The decision answering a request body.

        Raises:
            _InvalidRequestError: The API would refuse the request.
        """
        if "model" not in request:
            _missing("model")
        if not isinstance(request["model"], str) or not request["model"]:
            _wrong_type("model", "a non-empty string", request["model"])
        state = _input_text(request)
        asked = self._questions(request)
        try:
            probabilities = self.model.answer_all(state, asked)
        except ValueError as unanswerable:
            # The fake cannot answer it: say so to the client rather than a 500,
            # which the SDK would retry.
            raise _InvalidRequestError(
                str(unanswerable), "questions", "unsupported_question"
            ) from unanswerable
        dropped = set(self.drop_answers(request)) if self.drop_answers else set()
        answers: list[dict[str, Any]] = [
            {"type": "refusal", "name": name}
            if probability is None
            else {"type": "predicate", "name": name, "probability": probability}
            for (name, _), probability in zip(asked, probabilities, strict=True)
            if name not in dropped
        ]
        if self.extra_answers is not None:
            answers.extend(dict(answer) for answer in self.extra_answers(request))
        input_tokens = _input_tokens(state, [text for _, text in asked])
        return {
            "answers": answers,
            "model": request["model"],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens,
            },
        }

    def _questions(self, request: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The request's (name, instructions text) questions, validated.

        Raises:
            _InvalidRequestError: The API (or this fake) would refuse them.
        """
        if "questions" not in request:
            _missing("questions")
        questions = request["questions"]
        if not isinstance(questions, list):
            _wrong_type("questions", "an array", questions)
        if not questions:
            message = (
                "Invalid 'questions': empty array. Expected an array with at least "
                "1 question, but got an empty array instead."
            )
            raise _InvalidRequestError(message, "questions", "empty_array")
        if len(questions) > self.max_questions:
            message = (
                "Invalid 'questions': array too long. Expected an array with at most "
                f"{self.max_questions} questions, but got an array with "
                f"{len(questions)} questions instead."
            )
            raise _InvalidRequestError(message, "questions", "too_many_questions")
        asked: list[tuple[str, str]] = []
        first: dict[str, int] = {}
        for index, question in enumerate(questions):
            param = f"questions[{index}]"
            if not isinstance(question, dict):
                _wrong_type(param, "an object", question)
            name = self._name(question, param, first)
            first[name] = index
            if "instructions" not in question:
                _missing(f"{param}.instructions")
            text = _parts_text(question["instructions"], f"{param}.instructions")
            asked.append((name, text))
        return asked

    @staticmethod
    def _name(question: Mapping[str, Any], param: str, first: Mapping[str, int]) -> str:
        """A question's name, its type checked first.

        Raises:
            _InvalidRequestError: An unknown or unanswered type; a missing or
                repeated name.
        """
        if "type" not in question:
            _missing(f"{param}.type")
        kind = question["type"]
        if kind not in _QUESTION_TYPES:
            message = (
                f"Invalid value: {kind!r}. Supported values are: 'predicate', "
                "'choice', and 'score'."
            )
            raise _InvalidRequestError(message, f"{param}.type", "invalid_value")
        if kind != "predicate":
            message = (
                f"{param} is a {kind} question: FakeDecisionsServer answers predicate "
                "questions only."
            )
            raise _InvalidRequestError(
                message, f"{param}.type", "unsupported_question_type"
            )
        name = question.get("name")
        if not isinstance(name, str) or not name:
            message = (
                f"Missing required parameter: '{param}.name' (FakeDecisionsServer "
                "matches answers to questions by name)."
            )
            raise _InvalidRequestError(
                message, f"{param}.name", "missing_required_parameter"
            )
        if name in first:
            message = (
                f"Duplicate question name {name!r}: questions[{first[name]}] and "
                f"{param}. Question names must be unique."
            )
            raise _InvalidRequestError(
                message, f"{param}.name", "duplicate_question_name"
            )
        return name

    def _handler(self) -> type[Any]:
        from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                # Read even a body it refuses: unread bytes at close reset the
                # connection before the client reads the reply.
                raw = self.rfile.read(length) if length else b""
                number, reply = server._route(self.command, self.path, raw)
                payload = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if number:
                    self.send_header("x-request-id", f"req_fake_{number}")
                self.end_headers()
                self.wfile.write(payload)

            do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # keep test output clean

        return Handler
