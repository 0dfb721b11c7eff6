"""What a provider's batch API is to the lane: the seam between the two providers.

The lane (`_jobs`, `lane`) splits requests, records jobs, polls, stores answers
and reads them into verdicts and outputs the same way for every provider; what
differs is only the wire protocol, behind two small protocols:

- `ModelCall`: one kind of model call rendered as the provider's request body
  (exactly what the online call sends), and an answer body read back as the
  message (or structured output) the online call returns;
- `BatchProvider`: stage a set of requests, create a batch of them, find one
  created just before a kill, poll it, read its results, cancel it; and the
  provider's batch discount.

Two implementations: OpenAI's Files and Batch APIs (`_openai`, `_requests`) for
`ChatOpenAI`, and Anthropic's Message Batches (`_anthropic`) for `ChatAnthropic`,
the latter imported only when a `ChatAnthropic` is used (the `anthropic` extra).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import BaseModel, Field

from langchain_tag.errors import BatchLaneError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage

    from langchain_tag.batch._records import JobRecord, Lane
    from langchain_tag.execution import ActionOnlyExecutor
    from langchain_tag.matching import ApplicabilityJudge

BATCH_DISCOUNT = 0.5
"""The share both providers take off every token price in batch (half price)."""


class BatchState(BaseModel):
    """A batch as its provider reports it, in the lane's terms."""

    id: str
    status: str
    """The provider's own word (`in_progress`, `completed`, `ended`, ...): what the
    records table and the progress lines show."""
    ended: bool = False
    """Whether it is over: its results (answers and errors) can be read."""
    cancellable: bool = False
    """Whether a cancel request would change anything (running, not cancelling)."""
    refusals: list[str] = Field(default_factory=list)
    """Why it was refused at validation, one line each; empty unless it was (then
    nothing in it ran, and `ended` is True)."""
    completed: int = 0
    failed: int = 0
    total: int = 0
    outputs: list[str] = Field(default_factory=list)
    """Where its results are, in the provider's terms (OpenAI's output and error
    file ids)."""


class ResultLine(NamedTuple):
    """One request's outcome in a finished batch."""

    custom_id: str
    body: str | None
    """The provider's answer as JSON (what is stored and read), or None."""
    why: str
    """Why there is no answer (`batch_expired`, `batch_cancelled`, `HTTP 500`, an
    error type); empty with an answer."""


class ModelCall(Protocol):
    """One kind of model call of a judge or an executor, as a provider's request."""

    @property
    def llm(self) -> BaseChatModel:
        """The configured model the online call uses."""

    @property
    def model(self) -> str:
        """The model every request names (one model per batch)."""

    @property
    def invocation_params(self) -> dict[str, Any]:
        """The model's settings, as a traced run reports them."""

    def body(self, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """The request body the online call sends for `messages`."""

    def message(self, body: Mapping[str, Any]) -> AIMessage:
        """The answer message an answer `body` makes, as the online call's."""

    def output(self, body: Mapping[str, Any]) -> Any | None:
        """What the online call returns for the answer `body`; None if it fails."""


class BatchProvider(Protocol):
    """A provider's batch API: the wire protocol of the lane, nothing else."""

    name: str
    """The provider column of the lane's records and answers."""
    endpoint: str
    """The API's base URL: a record is collected through a client of the same."""
    discount: float
    """The share taken off every token price in batch."""
    finds_orphans: bool
    """Whether `find` can tell which listed batch a record without one became
    (else such a record left by another process is dropped after the grace, and
    its requests done online)."""

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        """One request as it counts against the batch's size limit."""

    def stage(self, lane: Lane, lines: Sequence[tuple[str, bytes]]) -> tuple[str, int]:
        """Make `lines` ready for a batch: the job's input id, and when (epoch s)."""

    def create(self, record: JobRecord, metadata: Mapping[str, str]) -> BatchState:
        """Create the batch of a record staged by this object.

        Raises:
            BatchLaneError: The record was staged elsewhere, and cannot be created
                from what this provider has (see `finds_orphans`).
        """

    def find(self, record: JobRecord) -> BatchState | None:
        """The batch created of `record`'s input, if the provider lists one."""

    def retrieve(self, batch_id: str) -> BatchState:
        """The batch's state now."""

    def results(self, state: BatchState) -> Iterator[ResultLine]:
        """The outcome of each request of an ended batch."""

    def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel the batch."""

    def is_unknown(self, error: Exception) -> bool:
        """Whether `error` says the provider knows no such batch."""


def _anthropic_class() -> type[BaseChatModel] | None:
    """`ChatAnthropic`, if langchain-anthropic is installed."""
    try:
        from langchain_anthropic import ChatAnthropic  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return ChatAnthropic


def _is_anthropic(llm: BaseChatModel) -> bool:
    chat_anthropic = _anthropic_class()
    return chat_anthropic is not None and isinstance(llm, chat_anthropic)


def unsupported(llm: BaseChatModel, owner: str) -> BatchLaneError:
    """The error for a model neither provider's batch API runs."""
    msg = (
        "The batch lane sends calls through OpenAI's Batch API or Anthropic's "
        f"Message Batches, so the {owner}'s model must be langchain_openai.ChatOpenAI "
        "or langchain_anthropic.ChatAnthropic (or a subclass); it is "
        f"{type(llm).__name__}. Judge online instead."
    )
    return BatchLaneError(msg)


def judge_call(judge: ApplicabilityJudge) -> ModelCall:
    """The call one judgment of `judge` makes, for its model's provider.

    Raises:
        BatchLaneError: The judge judges several rules per call, or its model is
            neither a `ChatOpenAI` nor a `ChatAnthropic`.
    """
    if judge.rules_per_call != 1:
        msg = (
            "The batch lane sends one request per (input, rule) pair; this judge "
            f"has rules_per_call={judge.rules_per_call}. Use rules_per_call=1."
        )
        raise BatchLaneError(msg)
    if _is_anthropic(judge.calls.llm):
        from langchain_tag.batch._anthropic import AnthropicCall  # noqa: PLC0415

        return AnthropicCall.of_judge(judge)
    from langchain_tag.batch._requests import ChatCall  # noqa: PLC0415

    return ChatCall.of_judge(judge)


def executor_call(executor: ActionOnlyExecutor) -> ModelCall:
    """The call `executor` makes (a text call), for its model's provider.

    Raises:
        BatchLaneError: The model is neither a `ChatOpenAI` nor a `ChatAnthropic`.
    """
    if _is_anthropic(executor.configured_llm):
        from langchain_tag.batch._anthropic import AnthropicCall  # noqa: PLC0415

        return AnthropicCall.of_executor(executor)
    from langchain_tag.batch._requests import ChatCall  # noqa: PLC0415

    return ChatCall.of_executor(executor)


def provider_for(llm: BaseChatModel, owner: str, client: Any = None) -> BatchProvider:
    """The batch API of `llm`'s provider, through `client` or the model's own.

    Raises:
        BatchLaneError: The model is neither a `ChatOpenAI` nor a `ChatAnthropic`.
    """
    if _is_anthropic(llm):
        from langchain_tag.batch._anthropic import AnthropicBatches, sdk_client  # noqa: PLC0415

        return AnthropicBatches(client or sdk_client(llm, owner))
    from langchain_tag.batch._openai import OpenAIBatches  # noqa: PLC0415
    from langchain_tag.batch._requests import sdk_client as openai_client  # noqa: PLC0415

    return OpenAIBatches(client or openai_client(llm, owner))


def provider_of_client(client: Any) -> BatchProvider:
    """The batch API `client` (an `openai.OpenAI` or `anthropic.Anthropic`) speaks.

    Raises:
        TypeError: `client` is neither.
    """
    import openai  # noqa: PLC0415

    from langchain_tag.batch._openai import OpenAIBatches  # noqa: PLC0415

    if isinstance(client, openai.OpenAI):
        return OpenAIBatches(client)
    try:
        import anthropic  # noqa: PLC0415 - optional
    except ImportError:
        anthropic = None  # type: ignore[assignment]
    if anthropic is not None and isinstance(client, anthropic.Anthropic):
        from langchain_tag.batch._anthropic import AnthropicBatches  # noqa: PLC0415

        return AnthropicBatches(client)
    msg = (
        "client must be an openai.OpenAI or an anthropic.Anthropic, got "
        f"{type(client).__name__}."
    )
    raise TypeError(msg)
