"""A model call as an OpenAI Batch API request body, and its answer read back.

A line's body is the request the online call POSTs: ChatOpenAI's own payload
(`_get_request_payload`, what its `_generate` sends), with the arguments the call
binds (the judge's structured output) and the OpenAI SDK's conversion of a pydantic
`response_format` (what `chat.completions.parse` sends). An answer is read back the
way the online call reads its response: the SDK's structured-output parsing
(`parse_chat_completion`'s checks and content parsing), then ChatOpenAI's
`_create_chat_result`. Neither half has a public API in
langchain-openai, so these private methods are used, and
`tests/unit_tests/test_batch.py` checks the bodies against what the online call
sends.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final

import openai
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableParallel,
    RunnableSequence,
)
from langchain_openai import ChatOpenAI
from openai.lib._parsing import (  # the SDK's own, used by chat.completions.parse
    maybe_parse_content,
    type_to_response_format_param,
)
from openai.types.chat import ChatCompletion

from langchain_tag.batch._providers import unsupported
from langchain_tag.errors import BatchLaneError
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.models import STRUCTURED_PARSE_ERRORS

ENDPOINT: Final = "/v1/chat/completions"
"""The Batch API endpoint every request of this lane goes to."""


def _openai_model(llm: BaseChatModel, owner: str) -> ChatOpenAI:
    if not isinstance(llm, ChatOpenAI):
        raise unsupported(llm, owner)
    return llm


_FILE_AND_BATCH_RETRIES = 2
"""The SDK's retries for file and batch calls when the model's client has none."""


def sdk_client(llm: BaseChatModel, owner: str) -> openai.OpenAI:
    """The OpenAI client of `llm` (its key, base URL, headers and retries).

    A model built for `CallRetry` has its client's retries off (`max_retries=0`);
    its file and batch calls, which nothing else retries, get the SDK's default
    retries back.
    """
    client: openai.OpenAI | None = _openai_model(llm, owner).root_client
    if client is None:  # pragma: no cover - ChatOpenAI makes one unless told not to
        msg = "Pass client=openai.OpenAI(...): the model has no synchronous client."
        raise BatchLaneError(msg)
    if client.max_retries == 0:
        return client.with_options(max_retries=_FILE_AND_BATCH_RETRIES)
    return client


def _bound_arguments(runnable: Runnable[Any, Any]) -> dict[str, Any]:
    """What `with_structured_output` bound to the model in `runnable`."""
    stack: list[Any] = [runnable]
    while stack:
        node = stack.pop()
        if isinstance(node, RunnableBinding):
            if isinstance(node.bound, BaseChatModel):
                return dict(node.kwargs)
            stack.append(node.bound)
        elif isinstance(node, RunnableSequence):
            stack.extend(node.steps)
        elif isinstance(node, RunnableParallel):
            stack.extend(node.steps__.values())
    msg = "The judge's structured-output call binds nothing to its model."
    raise BatchLaneError(msg)


@dataclass(frozen=True)
class ChatCall:
    """One kind of model call: its configured model and what the call binds to it."""

    llm: ChatOpenAI
    bound: Mapping[str, Any] = field(default_factory=dict)
    """Arguments bound to the model for the call (a structured call's format)."""
    structured: bool = False
    """Whether the call returns `{"raw", "parsed", "parsing_error"}`."""

    @classmethod
    def of_judge(cls, judge: ApplicabilityJudge) -> ChatCall:
        """The call one judgment of `judge` makes.

        Raises:
            BatchLaneError: The judge judges several rules per call, or its model
                is not a `ChatOpenAI`.
        """
        if judge.rules_per_call != 1:
            msg = (
                "The batch lane sends one request per (input, rule) pair; this judge "
                f"has rules_per_call={judge.rules_per_call}. Use rules_per_call=1."
            )
            raise BatchLaneError(msg)
        llm = _openai_model(judge.calls.llm, "judge")
        runnable = judge.calls.structured(judge.asked_profile.output_schema)
        if runnable is None:
            return cls(llm)
        bound = _bound_arguments(runnable)
        # LangChain's tracing metadata, popped before the request is made.
        bound.pop("ls_structured_output_format", None)
        return cls(llm, bound, structured=True)

    @classmethod
    def of_executor(cls, executor: ActionOnlyExecutor) -> ChatCall:
        """The call `executor` makes (a text call)."""
        return cls(_openai_model(executor.configured_llm, "executor"))

    @property
    def model(self) -> str:
        """The model every request names (one model per batch file)."""
        return str(self.llm.model_name)

    @property
    def invocation_params(self) -> dict[str, Any]:
        """The model's settings, as its own runs report them."""
        return dict(self.llm._default_params)  # noqa: SLF001 - see the module docstring

    def body(self, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """The request body the online call POSTs for `messages`.

        Raises:
            BatchLaneError: The model is called through the Responses API.
        """
        payload = self.llm._get_request_payload(list(messages), **self.bound)  # noqa: SLF001 - see the module docstring
        if self.llm._use_responses_api(payload):  # noqa: SLF001
            msg = (
                "The batch lane sends Chat Completions requests, and this ChatOpenAI "
                "is called through the Responses API (use_responses_api, reasoning, "
                "output_version='responses/v1', ...). Set use_responses_api=False."
            )
            raise BatchLaneError(msg)
        # The SDK sends extra_body merged into the body; a batch line cannot stream.
        extra = payload.pop("extra_body", None) or {}
        payload["stream"] = False
        schema = payload.get("response_format")
        if isinstance(schema, type):
            payload["response_format"] = _response_format(schema)
        return {**payload, **extra}

    def message(self, body: Mapping[str, Any]) -> AIMessage:
        """The answer message a chat completion `body` makes, as the online call's."""
        return self._message(ChatCompletion.model_validate(body))

    def output(self, body: Mapping[str, Any]) -> Any | None:
        """What the online call returns for the response `body`; None if it fails.

        A structured call parses the answer as the SDK's `parse` does; an answer
        it refuses to parse (not the schema's JSON) is read as text, as the
        judge's fallback reads it. The SDK's refusal of a cut-off or filtered
        answer (finish reason `length`, `content_filter`) fails the call, as online.
        """
        completion = ChatCompletion.model_validate(body)
        if not self.structured:
            return self._message(completion)
        choice = completion.choices[0]
        if choice.finish_reason in {"length", "content_filter"}:
            return None
        try:
            parsed = maybe_parse_content(
                response_format=self.bound.get("response_format", openai.omit),
                message=choice.message,
            )
        except STRUCTURED_PARSE_ERRORS:
            return self._message(completion)
        message = self._message(completion)
        # Where ChatOpenAI puts what the SDK parsed, and its structured output reads it.
        message.additional_kwargs["parsed"] = parsed
        message.additional_kwargs["refusal"] = choice.message.refusal
        return {"raw": message, "parsed": parsed, "parsing_error": None}

    def _message(self, completion: ChatCompletion) -> AIMessage:
        result = self.llm._create_chat_result(completion)  # noqa: SLF001 - see the module docstring
        generation = result.generations[0]
        message = generation.message
        if not isinstance(message, AIMessage):  # pragma: no cover - ChatOpenAI's own
            msg = f"Expected an AIMessage, got {type(message).__name__}."
            raise TypeError(msg)
        # As BaseChatModel does after `_generate`: the response's metadata on the
        # message (model name, finish reason, logprobs).
        message.response_metadata = {
            **(result.llm_output or {}),
            **(generation.generation_info or {}),
            **message.response_metadata,
        }
        return message


@cache
def _response_format(schema: type) -> Any:
    """The SDK's `response_format` for a pydantic class, derived once (~1.5 ms)."""
    return type_to_response_format_param(schema)


def request_hash(body: Mapping[str, Any]) -> str:
    """A stable key of a request body (the executor's answers are stored under it)."""
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()


def request_line(custom_id: str, body: Mapping[str, Any]) -> bytes:
    """One line of a batch input file."""
    line = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}
    return (json.dumps(line, ensure_ascii=False) + "\n").encode()
