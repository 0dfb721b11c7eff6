"""Stage 2: pairwise applicability matching.

One LLM judgment per (input, rule): does the input satisfy the rule's condition? The
judge sees the rule's id, name, condition and tags (or the fields its rule-schema
profile names), never the action, and answers at temperature 0.

A judgment that fails after its retries is never silently a NO: the judge either
raises `JudgmentError` or, under `on_error="not_applicable"`, returns a verdict whose
`error` is set and warns with `UnreliableMatchWarning`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import hashlib
import json
import logging
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast, runtime_checkable

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableSerializable,
    ensure_config,
)
from langchain_core.runnables.config import ContextThreadPoolExecutor
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
)

from langchain_tag._text import (
    answer_text,
    batches,
    check_text,
    describe_error,
    digest,
)
from langchain_tag.cache import InMemoryVerdictCache, VerdictCache
from langchain_tag.matching import prompts
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.parsing import (
    REFUSAL,
    ParsedVerdict,
    parse_batch,
    parse_verdict,
    score_from_logprobs,
)
from langchain_tag.matching.profiles import (
    CONDITION_PROFILE,
    ApplicableOutput,
    RuleSchemaProfile,
    YesNoOutput,
)
from langchain_tag.models import (
    ONE_ATTEMPT,
    STRUCTURED_PARSE_ERRORS,
    CallRetry,
    is_rate_limit,
    model_identity,
    structured_model,
    with_settings,
)
from langchain_tag.rules import Rule


class Verdict(BaseModel):
    """The outcome of judging one rule against one input."""

    model_config = ConfigDict(frozen=True)

    rule_id: str
    applies: bool
    score: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="P(YES) / (P(YES) + P(NO)) from the model's logprobs, if any.",
    )
    reason: str | None = None
    error: str | None = Field(
        default=None,
        description="Why the judgment failed; `applies` is then False by policy only.",
    )
    cached: bool = False
    decided_by: str | None = Field(
        default=None,
        description="The stage of a `CascadeJudge` that decided (`cheap` or "
        "`strong`); None for a single judge.",
    )

    @property
    def failed(self) -> bool:
        """True if the judgment failed and `applies` was decided by the error policy."""
        return self.error is not None

    @property
    def relevance(self) -> float:
        """What ranks applicable rules: the score, or 1.0 for an unscored verdict."""
        return 1.0 if self.score is None else self.score


def check_selection(k: object, threshold: object) -> None:
    """Refuse a `k` or `score_threshold` that `select_applicable` cannot honour.

    Checked before any judgment, so a bad option costs no model call.

    Raises:
        ValueError: `k` is not None or an int >= 0, or `threshold` is not None or a
            number in [0, 1].
    """
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        msg = f"k must be None or an integer >= 0, got {k!r}."
        raise ValueError(msg)
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0.0 <= threshold <= 1.0
    ):
        msg = f"score_threshold must be None or a number in [0, 1], got {threshold!r}."
        raise ValueError(msg)


def select_applicable(
    verdicts: Sequence[Verdict],
    order: Sequence[str],
    *,
    k: int | None = None,
    threshold: float | None = None,
) -> list[Verdict]:
    """The applicable verdicts to return, best first.

    Ranked by relevance, then by the rules' `order` (rulebook order); those below
    `threshold`, of rules not in `order`, and past the first `k` are left out.
    """
    position = {rule_id: i for i, rule_id in enumerate(order)}
    kept = [
        v
        for v in verdicts
        if v.applies
        and v.rule_id in position
        and (threshold is None or v.relevance >= threshold)
    ]
    kept.sort(key=lambda v: (-v.relevance, position[v.rule_id]))
    return kept if k is None else kept[:k]


class JudgmentError(RuntimeError):
    """A judgment failed after its retries under `on_error="raise"`.

    `transient` tells whether the last error was one worth retrying later (a rate
    limit, a timeout): an outer retry, such as a LangGraph node's, may try again.
    """

    def __init__(self, rule_id: str, error: str, *, transient: bool = False) -> None:
        """Record which rule's judgment failed and why."""
        self.rule_id = rule_id
        self.error = error
        self.transient = transient
        super().__init__(
            f"Judging rule {rule_id!r} failed: {error}. Nothing was assumed about it; "
            "retry later, or set on_error='not_applicable' to continue with such "
            "rules flagged as unjudged."
        )


@runtime_checkable
class VerdictSink(Protocol):
    """Where a judge appends each judgment it makes (a `VerdictLog`)."""

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        """Append one judgment."""

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        """Async `record`."""


EXPLORED = "tag_explored"
"""Run-config metadata: the rule ids a fan-out judges as shadow judgments."""
EXPLORE_RATE = "tag_explore_rate"
"""Run-config metadata: the rate at which those rules were drawn."""


class UnreliableMatchWarning(UserWarning):
    """Some judgments failed and were treated as not applicable by policy."""


JudgeInput = tuple[str, Rule] | Mapping[str, Any]
"""`(input, rule)` or `{"input": ..., "rule": ...}`."""


def _unpack(request: JudgeInput) -> tuple[str, Rule]:
    text: object
    rule: object
    if isinstance(request, tuple) and len(request) == 2:  # noqa: PLR2004
        text, rule = request
    elif isinstance(request, Mapping) and {"input", "rule"} <= request.keys():
        text, rule = request["input"], request["rule"]
    else:
        msg = "The judge takes (input, rule) or {'input': str, 'rule': Rule}."
        raise TypeError(msg)
    if not isinstance(text, str) or not isinstance(rule, Rule):
        msg = (
            "The judge takes a str input and a langchain_tag.Rule, got "
            f"{type(text).__name__} and {type(rule).__name__}."
        )
        raise TypeError(msg)
    return check_text(text, "The judged input"), rule


_MAX_THREADS = 64


@dataclass(frozen=True)
class _FanOut:
    """What the judgments of one fan-out share, seen from inside a judgment."""

    limiter: ConcurrencyLimiter
    failed: threading.Event | None = None
    """Sync fan-outs: set once a judgment failed for good (stop the others)."""


_FAN_OUT: contextvars.ContextVar[_FanOut | None] = contextvars.ContextVar(
    "tag_fan_out", default=None
)


class _Abandoned(Exception):  # noqa: N818 - never raised to callers
    """A judgment given up because another one of its fan-out failed for good."""


def _give_up_if_abandoned() -> None:
    fan_out = _FAN_OUT.get()
    if fan_out is not None and fan_out.failed is not None and fan_out.failed.is_set():
        raise _Abandoned


# Retry hooks. `tag_waited_until` on the retry state: the end of the pause this
# judgment has just slept through, so it waits only for a later one.
def _before_attempt(state: RetryCallState) -> None:
    _give_up_if_abandoned()
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        fan_out.limiter.wait_turn(getattr(state, "tag_waited_until", None))


async def _abefore_attempt(state: RetryCallState) -> None:
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        await fan_out.limiter.await_turn(getattr(state, "tag_waited_until", None))


def _succeeded() -> None:
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        fan_out.limiter.succeeded()


_RetryingT = TypeVar("_RetryingT", Retrying, AsyncRetrying)


def _wait(retry: CallRetry, state: RetryCallState) -> float:
    error = state.outcome.exception() if state.outcome is not None else None
    delay = retry.delay(state.attempt_number, error)
    fan_out = _FAN_OUT.get()
    if fan_out is not None:
        # This judgment sleeps `delay` now; before its next attempt it waits only
        # for what a pause of the fan-out adds beyond that.
        state.tag_waited_until = fan_out.limiter.back_off(  # type: ignore[attr-defined]
            delay, rate_limited=is_rate_limit(error)
        )
    return delay


logger = logging.getLogger(__name__)

_IGNORES_STRUCTURED_OUTPUT: set[str] = set()
"""Identities of the models found to answer structured-output requests in prose."""
_FALLBACK_LOCK = threading.Lock()


class BaseJudge(RunnableSerializable[JudgeInput, Verdict], ABC):
    """What every judge shares: one judgment per (input, rule), and the fan-outs.

    A subclass defines one judgment (`_judge`, `_ajudge`) and its cache key; this
    class runs it as a Runnable and fans it out over many rules of one input under a
    concurrency bound (`judge_rules`, `ajudge_rules`), which is what `TAGRetriever`
    and the query graph call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # The judgment bodies take (input, run_manager, config) so that `invoke` can run
    # them inside a run of the judge's own; the fan-outs call them directly and let
    # each model call be the rule's run, which costs a layer of callbacks less.
    @abstractmethod
    def _judge(
        self,
        request: JudgeInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        """Judge one pair."""

    @abstractmethod
    async def _ajudge(
        self,
        request: JudgeInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        """Judge one pair, asynchronously."""

    @abstractmethod
    def cache_key(self, text: str, rule: Rule) -> str:
        """A key that changes whenever the verdict on (`text`, `rule`) could."""

    @property
    @abstractmethod
    def final_llm(self) -> BaseChatModel:
        """The model whose verdicts are final (the executor's default model)."""

    def prefix_share(self, text: str, rules: Sequence[Rule]) -> float:
        """Share of prompt characters the judgments of `text` have in common."""
        del text, rules
        return 0.0

    @abstractmethod
    def with_call_retry(self, retry: CallRetry) -> BaseJudge:
        """This judge retrying by `retry` (a graph's, say) in place of its own."""

    def judge_pair(self, request: JudgeInput, config: RunnableConfig) -> Verdict:
        """Judge one pair without a run of the judge's own (as the fan-outs do)."""
        return self._judge(request, None, config)

    async def ajudge_pair(self, request: JudgeInput, config: RunnableConfig) -> Verdict:
        """Async `judge_pair`."""
        return await self._ajudge(request, None, config)

    def call_units(self, rules: Sequence[Rule]) -> list[Sequence[Rule]]:
        """The rules of each unit of work of a fan-out over `rules`, in order.

        Each unit holds one concurrency slot and is one model call at most: one
        rule per unit unless a judge judges several rules in one call.
        """
        return [[rule] for rule in rules]

    def _judge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        return [
            self.judge_pair((text, rule), _judgment_config(config, rule))
            for rule in unit
        ]

    async def _ajudge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        return [
            await self.ajudge_pair((text, rule), _judgment_config(config, rule))
            for rule in unit
        ]

    def invoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair."""
        verdict = self._call_with_config(self._judge, input, config, **kwargs)
        _warn_failures([verdict], 1)
        return verdict

    async def ainvoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair, asynchronously."""
        verdict = await self._acall_with_config(self._ajudge, input, config, **kwargs)
        _warn_failures([verdict], 1)
        return verdict

    def judge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
    ) -> list[Verdict]:
        """Judge every rule against `text` in worker threads, in rule order.

        Under `on_error="raise"` the first failure stops the fan-out: judgments not
        started are dropped, running ones make no further attempt, and the error
        propagates.

        Args:
            text: The input.
            rules: The rules to judge, one judgment each.
            config: Callbacks, tags and metadata for the judgments' runs.
            limiter: Caps judgments in progress; a shared limiter caps them across
                concurrent calls. Defaults to `config["max_concurrency"]`. A judgment
                holds its slot through its retries, so backing off also slows the
                pace against a rate-limited API.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))
        if not rules:
            return []

        failed = threading.Event()

        def judge_one(unit: Sequence[Rule]) -> list[Verdict]:
            with limiter.hold():
                # In this task's own copy of the context.
                _FAN_OUT.set(_FanOut(limiter, failed))
                _give_up_if_abandoned()
                try:
                    return self._judge_unit(text, unit, config)
                except _Abandoned:
                    raise
                except BaseException:
                    # Set here, before this worker takes the next queued rule.
                    failed.set()
                    raise

        units = self.call_units(rules)
        workers = min(len(units), limiter.bound or _MAX_THREADS)
        with ContextThreadPoolExecutor(max_workers=workers) as executor:
            futures = [executor.submit(judge_one, unit) for unit in units]
            try:
                # The first failure is raised when it happens, not when the
                # judgments before it in rule order are done.
                concurrent.futures.wait(
                    futures, return_when=concurrent.futures.FIRST_EXCEPTION
                )
                for future in futures:
                    if future.done() and future.exception() is not None:
                        future.result()
                verdicts = [v for future in futures for v in future.result()]
            except BaseException:
                # Queued judgments are dropped; running ones stop before their
                # next attempt, so leaving the pool waits for at most one call or
                # backoff pause each.
                failed.set()
                for future in futures:
                    future.cancel()
                raise
        _warn_failures(verdicts, len(rules))
        return verdicts

    async def ajudge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
    ) -> list[Verdict]:
        """Judge every rule against `text` concurrently, in rule order.

        See `judge_rules`. Under `on_error="raise"` the first failure cancels the
        judgments still waiting and propagates.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))

        async def judge_one(unit: Sequence[Rule]) -> list[Verdict]:
            # The slot is taken before any work, so queued judgments cost nothing.
            async with limiter.ahold():
                _FAN_OUT.set(_FanOut(limiter))  # each task runs in a context copy
                return await self._ajudge_unit(text, unit, config)

        tasks = [asyncio.ensure_future(judge_one(u)) for u in self.call_units(rules)]
        try:
            verdicts = [v for unit in await asyncio.gather(*tasks) for v in unit]
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        _warn_failures(verdicts, len(rules))
        return verdicts


class ApplicabilityJudge(BaseJudge):
    """A Runnable that judges whether an input satisfies one rule's condition.

    Works with any `BaseChatModel`: structured output where the model supports it,
    otherwise a lenient text parser. Each call is one model call (never several rules
    in one prompt), at temperature 0 unless told otherwise.

    Example:
        ```python
        from langchain_openai import ChatOpenAI
        from langchain_tag import ApplicabilityJudge, Rule

        judge = ApplicabilityJudge(llm=ChatOpenAI(model="gpt-4o-mini"))
        rule = Rule(
            rule_id="R-1",
            name="No wildcard imports",
            condition="A wildcard import (from <module> import *) is used",
            action="Replace the wildcard import with explicit imports",
        )
        judge.invoke(("from os import *", rule))
        # Verdict(rule_id='R-1', applies=True, ...)
        ```
    """

    llm: BaseChatModel
    """The chat model that judges."""
    profile: RuleSchemaProfile = CONDITION_PROFILE
    """What the judge sees of each rule and how it answers."""
    structured_output: Literal["auto", "always", "never"] = "auto"
    """`auto`: structured output when the model implements it, else text parsing."""
    temperature: float | None = 0.0
    """Set on a copy of the model when it has a `temperature` field; None leaves it."""
    logprobs: bool = False
    """Ask for logprobs (models with a `logprobs` field, e.g. ChatOpenAI) and score."""
    top_logprobs: int = 5
    retry: CallRetry | None = Field(default_factory=CallRetry)
    """Our retries, the one layer: the judge's copy of the model has its client's
    own retries (`max_retries`, as ChatOpenAI and ChatAnthropic have) turned off.
    None makes one attempt and leaves the model's client retries as they are."""
    on_error: Literal["raise", "not_applicable"] = "raise"
    """After retries: raise `JudgmentError`, or flag the verdict and treat it as NO."""
    cache: VerdictCache | None = Field(default_factory=InMemoryVerdictCache)
    """Where verdicts are remembered; None disables caching."""
    verdict_log: VerdictSink | None = None
    """Where every judgment made (not cache hits) is appended, to learn from (a
    `langchain_tag.matching.verdict_log.VerdictLog`); None keeps none."""
    log_source: str = "judge"
    """How the log marks this judge's verdicts (a cascade's stages and the
    relevance baseline mark theirs, so that training can leave them out)."""
    rules_per_call: int = Field(default=1, ge=1)
    """Rules judged in one model call. 1 is the method (one judgment per pair);
    more cuts calls and prompt tokens (the input is sent once per call), at a cost
    in quality to measure on your task (`tag eval ... --methods 'tag-b*'`). The
    action stays withheld; verdicts are cached per (input, rule) as always; a rule
    missing from, repeated in or unreadable in the answer is judged again alone.
    Batched verdicts carry no logprob score."""

    _text_model: BaseChatModel = PrivateAttr()
    _structured_model: Runnable[Any, Any] | None = PrivateAttr(default=None)
    _batch_structured_model: Runnable[Any, Any] | None = PrivateAttr(default=None)
    _key_prefix: str = PrivateAttr(default="")
    _identity: str = PrivateAttr(default="")

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        if self.rules_per_call > 1 and self.profile.batch_output_schema is None:
            msg = (
                f"Profile {self.profile.name!r} has no format for several rules per "
                "call; give it batch_output_instruction and batch_output_schema, or "
                "use rules_per_call=1."
            )
            raise ValueError(msg)
        if self.rules_per_call > 1 and self.logprobs:
            msg = "logprobs scores need rules_per_call=1 (one verdict per answer)."
            raise ValueError(msg)
        model = self._configured_model()
        self._identity = model_identity(model)
        self._key_prefix = json.dumps(
            [
                prompts.PROMPT_VERSION,
                self.profile.name,
                hashlib.sha256(
                    json.dumps(
                        [
                            self.profile.system_prompt,
                            self.profile.output_instruction,
                            self.profile.output_schema.__name__,
                        ]
                    ).encode()
                ).hexdigest(),
                self._identity,
                # Several rules per call is another prompt: its own verdicts.
                *(["batch"] if self.rules_per_call > 1 else []),
            ]
        )
        self._text_model = model
        self._structured_model = self._output_runnable(
            model, self.profile.output_schema
        )
        if self.profile.batch_output_schema is not None and self.rules_per_call > 1:
            self._batch_structured_model = self._output_runnable(
                model, self.profile.batch_output_schema
            )

    @property
    def final_llm(self) -> BaseChatModel:
        """The judging model."""
        return self.llm

    def with_call_retry(self, retry: CallRetry) -> ApplicabilityJudge:
        """A judge like this one (same model, cache, profile) retrying by `retry`."""
        return self.remade(retry=retry)

    def remade(self, **changes: Any) -> ApplicabilityJudge:
        """A judge like this one with `changes` to its fields, set up anew."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **changes})

    def _configured_model(self) -> BaseChatModel:
        logprobs = (
            {"logprobs": True, "top_logprobs": self.top_logprobs}
            if self.logprobs
            else {}
        )
        # Our retries are the one layer: the client's own would multiply them.
        client_retries = {"max_retries": 0} if self.retry is not None else {}
        model, unsupported = with_settings(
            self.llm, temperature=self.temperature, **logprobs, **client_retries
        )
        if "logprobs" in unsupported:
            msg = (
                f"logprobs=True needs a model with a 'logprobs' option; "
                f"{type(self.llm).__name__} has none. Use logprobs=False (verdicts "
                "then carry no score)."
            )
            raise ValueError(msg)
        return model

    def _output_runnable(
        self, model: BaseChatModel, schema: type[BaseModel]
    ) -> Runnable[Any, Any] | None:
        return structured_model(
            model,
            schema,
            self.structured_output,
            ignored=model_identity(model) in _IGNORES_STRUCTURED_OUTPUT,
        )

    def _falls_back(self, error: Exception) -> bool:
        """Whether a structured call's `error` means: read this model's text instead.

        Some OpenAI-compatible servers ignore `response_format` and answer in prose,
        which the SDK's schema parsing refuses before our lenient parser could read
        it. Under `structured_output="auto"` that model is judged from its text from
        then on (remembered per model, for every judge).
        """
        if self.structured_output != "auto" or not isinstance(
            error, STRUCTURED_PARSE_ERRORS
        ):
            return False
        with _FALLBACK_LOCK:
            first = self._identity not in _IGNORES_STRUCTURED_OUTPUT
            _IGNORES_STRUCTURED_OUTPUT.add(self._identity)
        if first:
            logger.warning(
                "%s answered a structured-output request with text the schema could "
                "not parse (%s); judging it with the text parser from now on.",
                type(self._text_model).__name__,
                describe_error(error)[:200],
            )
        self._structured_model = self._batch_structured_model = None
        return True

    def _invoke(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        structured = self._batch_structured_model if batch else self._structured_model
        if structured is not None:
            try:
                return structured.invoke(messages, config)
            except Exception as error:
                if not self._falls_back(error):
                    raise
        return self._text_model.invoke(messages, config)

    async def _ainvoke(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        structured = self._batch_structured_model if batch else self._structured_model
        if structured is not None:
            try:
                return await structured.ainvoke(messages, config)
            except Exception as error:
                if not self._falls_back(error):
                    raise
        return await self._text_model.ainvoke(messages, config)

    # -- prompt -----------------------------------------------------------------------

    question: ClassVar[str] = prompts.JUDGE_QUESTION
    """The user message's opening line: what to decide about the rule."""

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The (label, value) pairs of `rule` in the prompt: the profile's, no action.

        Prompt, cache key and prefix share all follow this; only the relevance
        baseline (`langchain_tag.baselines.RelevanceJudge`) adds the action.
        """
        return self.profile.judged_fields(rule)

    def messages(self, text: str, rule: Rule) -> list[BaseMessage]:
        """The exact messages that judge `rule` against `text` (no action in them)."""
        return [
            SystemMessage(self.profile.system_prompt),
            HumanMessage(
                prompts.render_judge_user_message(
                    text,
                    self.judged_fields(rule),
                    self.profile.output_instruction,
                    self.question,
                )
            ),
        ]

    def prefix_share(self, text: str, rules: Sequence[Rule]) -> float:
        """Share of prompt characters that all judgments of `text` have in common.

        The system prompt and the input come before the rule, so this prefix is what a
        provider's prefix cache can reuse across the M judgments of one input. It is
        counted up to the end of the input block, a lower bound.
        """
        if not rules:
            return 0.0
        shared = len(self.profile.system_prompt) + len(
            prompts.render_judge_input(text, self.question)
        )
        rule_parts = sum(
            len(
                prompts.render_judge_rule(
                    self.judged_fields(rule), self.profile.output_instruction
                )
            )
            for rule in rules
        )
        return shared / (shared + rule_parts / len(rules))

    def cache_key(self, text: str, rule: Rule) -> str:
        """Key of a verdict: input, judged rule fields, profile, prompt and model."""
        payload = json.dumps([self._key_prefix, digest(text), self.judged_fields(rule)])
        return hashlib.sha256(payload.encode()).hexdigest()

    # -- one judgment -----------------------------------------------------------------

    def _from_output(self, rule: Rule, output: Any) -> Verdict:
        # A structured call gives {"raw", "parsed", ...}; a text call the message.
        structured = isinstance(output, Mapping)
        raw: BaseMessage = output["raw"] if structured else output
        parsed = output.get("parsed") if structured else None
        if isinstance(parsed, YesNoOutput):
            decision = ParsedVerdict(applies=parsed.verdict == "YES", reason=None)
        elif isinstance(parsed, ApplicableOutput):
            decision = ParsedVerdict(parsed.applicable, parsed.reason or None)
        else:
            answer = answer_text(raw)
            parsed_text = parse_verdict(answer, schema=self.profile.output_schema)
            if parsed_text is None:
                # Deterministic at temperature 0, so not retried.
                return self._failed(rule, _unreadable(answer))
            decision = parsed_text
        score = score_from_logprobs(raw) if self.logprobs else None
        return Verdict(
            rule_id=rule.rule_id,
            applies=decision.applies,
            score=score,
            reason=decision.reason,
        )

    def _read(self, rule: Rule, output: Any) -> Verdict:
        # Whatever shape the output has, a failure to read it is a failed judgment.
        try:
            return self._from_output(rule, output)
        except JudgmentError:
            raise
        except Exception as error:  # noqa: BLE001 - reported through the policy
            return self._failed(rule, f"unreadable judge output ({error!r})")

    def _failed(self, rule: Rule, error: str, *, transient: bool = False) -> Verdict:
        if self.on_error == "raise":
            raise JudgmentError(rule.rule_id, error, transient=transient)
        return Verdict(rule_id=rule.rule_id, applies=False, error=error)

    def _retrying(self, retrying: type[_RetryingT]) -> _RetryingT:
        """Our retries: the one layer (the model's client retries are off).

        Before each attempt a judgment waits out the fan-out's shared pause (after
        a rate limit, all wait; under on_error="raise" a sibling's failure ends
        the fan-out); a wait the provider asks for (`Retry-After`) is honoured.
        """
        retry = self.retry or ONE_ATTEMPT
        return retry.retrying(
            retrying,
            wait=functools.partial(_wait, retry),
            before=_abefore_attempt if retrying is AsyncRetrying else _before_attempt,
        )

    def _given_up(
        self, rule: Rule, error: Exception, retrying: Retrying | AsyncRetrying
    ) -> Verdict:
        attempts = retrying.statistics.get("attempt_number", 1)
        return self._failed(
            rule,
            f"{describe_error(error)} (after {attempts} attempt(s))",
            transient=(self.retry or ONE_ATTEMPT).is_transient(error),
        )

    def _log_fields(self, rule: Rule, config: RunnableConfig) -> dict[str, Any]:
        metadata = config.get("metadata") or {}
        explored = rule.rule_id in metadata.get(EXPLORED, ())
        return {
            "model": self._identity,
            "prompt_version": prompts.PROMPT_VERSION,
            "profile": self.profile.name,
            "source": self.log_source,
            "explore": metadata.get(EXPLORE_RATE) if explored else None,
        }

    def _logged(
        self, text: str, rule: Rule, verdict: Verdict, config: RunnableConfig
    ) -> Verdict:
        if self.verdict_log is not None:
            self.verdict_log.record(
                text, rule, verdict, **self._log_fields(rule, config)
            )
        return verdict

    async def _alogged(
        self, text: str, rule: Rule, verdict: Verdict, config: RunnableConfig
    ) -> Verdict:
        if self.verdict_log is not None:
            await self.verdict_log.arecord(
                text, rule, verdict, **self._log_fields(rule, config)
            )
        return verdict

    def _cached(self, hit: str | None, rule: Rule) -> Verdict | None:
        if hit is None:
            return None
        return Verdict.model_validate_json(hit).model_copy(
            update={"cached": True, "rule_id": rule.rule_id}
        )

    def _judge(
        self,
        request: JudgeInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = _unpack(request)
        key = self.cache_key(text, rule) if self.cache is not None else ""
        if self.cache is not None and (
            hit := self._cached(self.cache.lookup(key), rule)
        ):
            return hit
        retrying = self._retrying(Retrying)
        try:
            output = retrying(
                self._invoke, self.messages(text, rule), config, batch=False
            )
        except _Abandoned:
            raise
        except Exception as error:  # noqa: BLE001 - every failure is reported
            return self._logged(
                text, rule, self._given_up(rule, error, retrying), config
            )
        _succeeded()
        verdict = self._read(rule, output)
        if self.cache is not None and not verdict.failed:
            self.cache.update(key, verdict.model_dump_json())
        return self._logged(text, rule, verdict, config)

    async def _ajudge(
        self,
        request: JudgeInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = _unpack(request)
        key = self.cache_key(text, rule) if self.cache is not None else ""
        if self.cache is not None and (
            hit := self._cached(await self.cache.alookup(key), rule)
        ):
            return hit
        retrying = self._retrying(AsyncRetrying)
        try:
            output: Any = await retrying(
                self._ainvoke, self.messages(text, rule), config, batch=False
            )
        except Exception as error:  # noqa: BLE001 - every failure is reported
            failed = self._given_up(rule, error, retrying)
            return await self._alogged(text, rule, failed, config)
        _succeeded()
        verdict = self._read(rule, output)
        if self.cache is not None and not verdict.failed:
            await self.cache.aupdate(key, verdict.model_dump_json())
        return await self._alogged(text, rule, verdict, config)

    # -- several rules per call -------------------------------------------------------

    def call_units(self, rules: Sequence[Rule]) -> list[Sequence[Rule]]:
        """`rules_per_call` rules per unit."""
        return list(batches(rules, self.rules_per_call))

    def batch_messages(self, text: str, rules: Sequence[Rule]) -> list[BaseMessage]:
        """The messages that judge several `rules` against `text` in one call."""
        fields = [
            [
                *(
                    []
                    if "rule_id" in self.profile.rule_fields
                    else [("rule_id", r.rule_id)]
                ),
                *self.judged_fields(r),
            ]
            for r in rules
        ]
        return [
            SystemMessage(self.profile.batch_system_prompt),
            HumanMessage(
                prompts.render_judge_batch_message(
                    text, fields, str(self.profile.batch_output_instruction)
                )
            ),
        ]

    def _judge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        if len(unit) == 1:
            return super()._judge_unit(text, unit, config)
        check_text(text, "The judged input")
        cache, keys = self.cache, {r.rule_id: self.cache_key(text, r) for r in unit}
        known = {
            rule.rule_id: hit
            for rule in unit
            if cache is not None
            and (hit := self._cached(cache.lookup(keys[rule.rule_id]), rule))
        }
        asked = [rule for rule in unit if rule.rule_id not in known]
        if len(asked) > 1:
            retrying = self._retrying(Retrying)
            try:
                output = retrying(
                    self._invoke,
                    self.batch_messages(text, asked),
                    _judgment_config(config, *asked),
                    batch=True,
                )
            except _Abandoned:
                raise
            except Exception as error:  # noqa: BLE001 - every failure is reported
                return [
                    known.get(r.rule_id)
                    or self._logged(text, r, self._given_up(r, error, retrying), config)
                    for r in unit
                ]
            _succeeded()
            for rule, verdict in self._read_batch(asked, output):
                known[rule.rule_id] = self._logged(text, rule, verdict, config)
                if cache is not None:
                    cache.update(keys[rule.rule_id], verdict.model_dump_json())
        # A rule the answer left out, repeated or garbled is judged again alone.
        return [
            known.get(rule.rule_id)
            or self.judge_pair((text, rule), _judgment_config(config, rule))
            for rule in unit
        ]

    async def _ajudge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        if len(unit) == 1:
            return await super()._ajudge_unit(text, unit, config)
        check_text(text, "The judged input")
        cache, keys = self.cache, {r.rule_id: self.cache_key(text, r) for r in unit}
        known = {}
        for rule in unit:
            if cache is not None and (
                hit := self._cached(await cache.alookup(keys[rule.rule_id]), rule)
            ):
                known[rule.rule_id] = hit
        asked = [rule for rule in unit if rule.rule_id not in known]
        if len(asked) > 1:
            retrying = self._retrying(AsyncRetrying)
            try:
                output: Any = await retrying(
                    self._ainvoke,
                    self.batch_messages(text, asked),
                    _judgment_config(config, *asked),
                    batch=True,
                )
            except Exception as error:  # noqa: BLE001 - every failure is reported
                failures = {
                    r.rule_id: self._given_up(r, error, retrying)
                    for r in unit
                    if r.rule_id not in known
                }
                for rule in unit:
                    if rule.rule_id in failures:
                        await self._alogged(text, rule, failures[rule.rule_id], config)
                return [known.get(r.rule_id) or failures[r.rule_id] for r in unit]
            _succeeded()
            for rule, verdict in self._read_batch(asked, output):
                known[rule.rule_id] = await self._alogged(text, rule, verdict, config)
                if cache is not None:
                    await cache.aupdate(keys[rule.rule_id], verdict.model_dump_json())
        return [
            known.get(rule.rule_id)
            or await self.ajudge_pair((text, rule), _judgment_config(config, rule))
            for rule in unit
        ]

    def _read_batch(
        self, rules: Sequence[Rule], output: Any
    ) -> list[tuple[Rule, Verdict]]:
        """The verdicts an answer on several rules gives; only the clear ones.

        A rule the answer does not name, names twice, or decides in a format that
        was not asked for gets no verdict here (it is judged again alone).
        """
        schema = self.profile.output_schema
        try:
            if isinstance(output, Mapping):  # structured: {"raw", "parsed", ...}
                parsed = output.get("parsed")
                decided = parse_batch(
                    parsed if parsed is not None else output["raw"].text,
                    schema=schema,
                )
            else:
                decided = parse_batch(output.text, schema=schema)
        except Exception:  # noqa: BLE001 - an unreadable answer decides nothing
            return []
        verdicts = []
        for rule in rules:
            decisions = decided.get(rule.rule_id, [])
            if len(decisions) == 1:
                verdicts.append(
                    (
                        rule,
                        Verdict(
                            rule_id=rule.rule_id,
                            applies=decisions[0].applies,
                            reason=decisions[0].reason,
                        ),
                    )
                )
        return verdicts


def _judgment_config(config: RunnableConfig, *rules: Rule) -> RunnableConfig:
    # One model run per call, named after its rules, so a trace reads like the
    # fan-out.
    ids = [rule.rule_id for rule in rules]
    named = {"tag_rule_id": ids[0]} if len(ids) == 1 else {"tag_rule_ids": ids}
    child = cast(
        "RunnableConfig",
        {
            **config,
            "run_name": "judge:" + "+".join(ids),
            "metadata": {**config.get("metadata", {}), **named},
        },
    )
    child.pop("run_id", None)
    return child


def _unreadable(answer: str) -> str:
    """Why an answer gave no verdict, for the failed verdict's `error`."""
    kind = (
        " (empty)"
        if not answer.strip()
        else " (a refusal)"
        if REFUSAL.search(answer)
        else ""
    )
    return f"unparseable judge output{kind} {answer[:200]!r}"


def _warn_failures(verdicts: Sequence[Verdict], total: int) -> None:
    failed = [v.rule_id for v in verdicts if v.failed]
    if failed:
        shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")  # noqa: PLR2004
        warnings.warn(
            f"{len(failed)} of {total} judgments failed and were treated as not "
            f"applicable (on_error='not_applicable'): {shown}. Their verdicts carry "
            "the error.",
            UnreliableMatchWarning,
            stacklevel=3,
        )
