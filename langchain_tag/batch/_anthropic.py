"""Anthropic's Message Batches as a `BatchProvider`, and `ChatAnthropic` calls in it.

A request's `params` are the Messages API body the online text call sends:
`model`, `max_tokens`, `system`, `messages` and the model's sampling settings
(`temperature`, `top_k`, `top_p`, `stop_sequences`, `model_kwargs`), built here
from the LangChain messages and the model's public fields, because
langchain-anthropic has no public builder of its request; `anthropic.types`'
`MessageCreateParamsNonStreaming` checks the body, and a test checks it against
what `ChatAnthropic` sends online. A judgment is sent as the judge's text call
(its prompt asks for the JSON answer, which the judge's text parser reads): the
structured call would be a forced tool, whose body only private methods build.
A model set up for what this body leaves out (extended thinking, betas, MCP
servers, ...) is refused.

A batch is created with its requests in one call (no file); it has no metadata
and names no input, so a record left without a batch by a killed process cannot
be matched to a listed batch: it is dropped after `adopt_grace` and its requests
done online (a batch created in the instant before the kill is then paid twice,
never lost). Imported only when a `ChatAnthropic` is used (the `anthropic` extra).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anthropic
from anthropic import NOT_GIVEN
from anthropic.types import Message
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from anthropic.types.messages import MessageBatch
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from pydantic import TypeAdapter

from langchain_tag.batch._providers import BATCH_DISCOUNT, BatchState, ResultLine
from langchain_tag.errors import BatchLaneError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from langchain_tag.batch._records import JobRecord, Lane
    from langchain_tag.execution import ActionOnlyExecutor
    from langchain_tag.matching import ApplicabilityJudge

PROVIDER: Final = "anthropic"
"""The provider column of this API's records and answers."""

_CLIENT_RETRIES = 2
"""The SDK's retries for batch calls when the model's client has none."""

_LEFT_OUT = (
    "thinking",
    "betas",
    "mcp_servers",
    "context_management",
    "container",
    "output_config",
    "reasoning_effort",
    "inference_geo",
    "user_profile_id",
)
"""`ChatAnthropic` fields that change the request beyond this module's body."""

_PARAMS: TypeAdapter[MessageCreateParamsNonStreaming] = TypeAdapter(
    MessageCreateParamsNonStreaming
)


def _anthropic_model(llm: BaseChatModel, owner: str) -> ChatAnthropic:
    if not isinstance(llm, ChatAnthropic):  # pragma: no cover - chosen by class
        from langchain_tag.batch._providers import unsupported  # noqa: PLC0415

        raise unsupported(llm, owner)
    left_out = [name for name in _LEFT_OUT if getattr(llm, name, None)]
    if left_out:
        msg = (
            "The Anthropic batch lane sends the model's text call (model, "
            "max_tokens, temperature, top_k, top_p, stop_sequences, model_kwargs); "
            f"this ChatAnthropic also sets {', '.join(left_out)}. Unset them, or "
            "judge online."
        )
        raise BatchLaneError(msg)
    return llm


def sdk_client(llm: BaseChatModel, owner: str) -> anthropic.Anthropic:
    """An Anthropic client like `llm`'s (its key, base URL, headers and timeout).

    A model built for `CallRetry` has its retries off (`max_retries=0`); its batch
    calls, which nothing else retries, get the SDK's default retries back.
    """
    model = _anthropic_model(llm, owner)
    timeout = model.default_request_timeout
    return anthropic.Anthropic(
        api_key=model.anthropic_api_key.get_secret_value(),
        base_url=model.anthropic_api_url,
        default_headers=dict(model.default_headers or {}),
        max_retries=model.max_retries or _CLIENT_RETRIES,
        # As ChatAnthropic: a timeout of 0 or less means the SDK's default.
        timeout=timeout if timeout is None or timeout > 0 else NOT_GIVEN,
    )


@dataclass(frozen=True)
class AnthropicCall:
    """A `ChatAnthropic` text call: its Messages API body and its answer read back."""

    llm: ChatAnthropic

    @classmethod
    def of_judge(cls, judge: ApplicabilityJudge) -> AnthropicCall:
        """The text call of one judgment (the configured model: temperature 0)."""
        return cls(_anthropic_model(judge.calls.llm, "judge"))

    @classmethod
    def of_executor(cls, executor: ActionOnlyExecutor) -> AnthropicCall:
        """The call `executor` makes."""
        return cls(_anthropic_model(executor.configured_llm, "executor"))

    @property
    def model(self) -> str:
        """The model every request names."""
        return self.llm.model

    @property
    def invocation_params(self) -> dict[str, Any]:
        """The body's settings (all but the messages)."""
        return self._settings()

    def _settings(self) -> dict[str, Any]:
        llm = self.llm
        settings: dict[str, Any] = {"model": llm.model, "max_tokens": llm.max_tokens}
        sampling = {"temperature": llm.temperature, "top_k": llm.top_k}
        sampling["top_p"] = llm.top_p
        settings.update({k: v for k, v in sampling.items() if v is not None})
        if llm.stop_sequences:
            settings["stop_sequences"] = list(llm.stop_sequences)
        return {**settings, **llm.model_kwargs}

    def body(self, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """The Messages API body the online text call sends for `messages`.

        Raises:
            BatchLaneError: A message is not text, or a system message follows
                another kind.
        """
        system: list[str] = []
        turns: list[dict[str, Any]] = []
        for message in messages:
            if not isinstance(message.content, str):
                msg = (
                    "The Anthropic batch lane sends text messages; a "
                    f"{type(message).__name__} has content of another kind."
                )
                raise BatchLaneError(msg)
            if isinstance(message, SystemMessage) and not turns:
                system.append(message.content)
            elif isinstance(message, HumanMessage | AIMessage):
                role = "user" if isinstance(message, HumanMessage) else "assistant"
                turns.append({"role": role, "content": message.content})
            else:
                msg = (
                    "The Anthropic batch lane sends system messages first, then user "
                    f"and assistant turns; got a {type(message).__name__} there."
                )
                raise BatchLaneError(msg)
        body: dict[str, Any] = {**self._settings(), "messages": turns}
        if system:
            body["system"] = "\n\n".join(system)
        _PARAMS.validate_python(body)  # the SDK's own type of a request
        return body

    def message(self, body: Mapping[str, Any]) -> AIMessage:
        """The answer message a Messages API response `body` makes."""
        answer = Message.model_validate(body)
        text = "".join(block.text for block in answer.content if block.type == "text")
        usage = answer.usage
        cache_read = usage.cache_read_input_tokens or 0
        cache_creation = usage.cache_creation_input_tokens or 0
        # As langchain-anthropic counts them: cached input is input too.
        input_tokens = usage.input_tokens + cache_read + cache_creation
        return AIMessage(
            content=text,
            id=answer.id,
            response_metadata={
                "id": answer.id,
                "model": answer.model,
                "model_name": answer.model,
                "model_provider": PROVIDER,
                "stop_reason": answer.stop_reason,
                "stop_sequence": answer.stop_sequence,
            },
            usage_metadata=UsageMetadata(
                input_tokens=input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=input_tokens + usage.output_tokens,
                input_token_details=InputTokenDetails(
                    cache_read=cache_read, cache_creation=cache_creation
                ),
            ),
        )

    def output(self, body: Mapping[str, Any]) -> AIMessage:
        """What the online text call returns: the message."""
        return self.message(body)


class AnthropicBatches:
    """Anthropic's Message Batches through `client`."""

    name = PROVIDER
    discount = BATCH_DISCOUNT
    finds_orphans = False

    def __init__(self, client: anthropic.Anthropic) -> None:
        """Work through `client` (its key, base URL and retries)."""
        self.client = client
        self.endpoint = str(client.base_url)
        self._staged: dict[str, list[bytes]] = {}
        """Requests staged by this object, until their batch is created."""
        self._refused: dict[str, BatchState] = {}
        """Batches refused at creation, by the id they are recorded under."""

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        line = {"custom_id": custom_id, "params": body}
        return (json.dumps(line, ensure_ascii=False) + "\n").encode()

    def stage(self, lane: Lane, lines: Sequence[tuple[str, bytes]]) -> tuple[str, int]:
        # Nothing to upload: the requests go with the create call.
        input_id = f"tag-{lane}-{uuid.uuid4().hex}"
        self._staged[input_id] = [line for _, line in lines]
        return input_id, int(time.time())

    def create(self, record: JobRecord, metadata: Mapping[str, str]) -> BatchState:
        del metadata  # a message batch has none
        lines = self._staged.pop(record.input_file_id, None)
        if lines is None:
            msg = (
                f"Job {record.input_file_id} was staged by another process; its "
                "requests are not here to create its batch."
            )
            raise BatchLaneError(msg)
        try:
            batch = self.client.messages.batches.create(
                requests=[json.loads(line) for line in lines]
            )
        except anthropic.BadRequestError as error:
            # Refused whole, as OpenAI refuses a batch at validation: said by the
            # lane as a failed batch (BatchFailedError), nothing run.
            refused = BatchState(
                id=f"refused-{record.input_file_id}",
                status="refused",
                ended=True,
                refusals=[f"{record.input_file_id}: {error.message}"],
                total=len(lines),
            )
            self._refused[refused.id] = refused
            return refused
        return _state(batch)

    def find(self, record: JobRecord) -> BatchState | None:
        del record  # a message batch names no input to find it by
        return None

    def retrieve(self, batch_id: str) -> BatchState:
        if batch_id in self._refused:
            return self._refused[batch_id]
        return _state(self.client.messages.batches.retrieve(batch_id))

    def results(self, state: BatchState) -> Iterator[ResultLine]:
        for line in self.client.messages.batches.results(state.id):
            result = line.result
            if result.type == "succeeded":
                answer = json.dumps(result.message.model_dump(mode="json"))
                yield ResultLine(line.custom_id, answer, "")
            elif result.type == "errored":
                yield ResultLine(line.custom_id, None, result.error.error.type)
            elif result.type == "canceled":
                yield ResultLine(line.custom_id, None, "batch_cancelled")
            else:
                yield ResultLine(line.custom_id, None, "batch_expired")

    def cancel(self, batch_id: str) -> None:
        self.client.messages.batches.cancel(batch_id)

    def is_unknown(self, error: Exception) -> bool:
        return isinstance(error, anthropic.NotFoundError)


def _state(batch: MessageBatch) -> BatchState:
    counts = batch.request_counts
    return BatchState(
        id=batch.id,
        status=batch.processing_status,
        ended=batch.processing_status == "ended",
        cancellable=batch.processing_status == "in_progress",
        completed=counts.succeeded,
        failed=counts.errored + counts.canceled + counts.expired,
        total=counts.processing
        + counts.succeeded
        + counts.errored
        + counts.canceled
        + counts.expired,
    )
