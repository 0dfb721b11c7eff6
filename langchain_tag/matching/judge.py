"""Stage 2: pairwise applicability matching.

One LLM judgment per (input, rule): does the input satisfy the rule's condition? The
judge sees the rule's id, name, condition and tags (or the fields its rule-schema
profile names), never the action, and answers at temperature 0.

A judgment that fails after its retries is never silently a NO: the judge either
raises `JudgmentError` or, under `on_error="not_applicable"`, returns a verdict whose
`error` is set and warns with `UnreliableMatchWarning`.

The verdict types live in `verdicts`, the fan-out machinery in `_fanout`, judging
several rules in one call in `batched`; this module holds the judges.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig, RunnableSerializable, ensure_config
from langchain_core.stores import BaseStore
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from typing_extensions import Self

from langchain_tag._text import answer_text, check_text, digest
from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.errors import (
    Abandoned,
    FailureKind,
    GaveUp,
    JudgmentError,
    describe_error,
)
from langchain_tag.matching import _batched, _fanout, prompts
from langchain_tag.matching._fanout import judgment_config
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.memory import VerdictMemory
from langchain_tag.matching.parsing import (
    REFUSAL,
    answer_format,
    parse_verdict,
    score_from_logprobs,
)
from langchain_tag.matching.profiles import (
    CONDITION_PROFILE,
    RuleSchemaProfile,
)
from langchain_tag.matching.verdicts import (
    Verdict,
    VerdictSink,
    failure_kind,
    failure_reason,
    warn_failures,
)
from langchain_tag.models import (
    ONE_ATTEMPT,
    CallRetry,
    StructuredFallback,
    model_identity,
    with_settings,
)
from langchain_tag.rules import Rule

__all__ = [
    "ApplicabilityJudge",
    "BaseJudge",
    "JudgeInput",
    "Verdict",
    "VerdictSink",
]


JudgeInput = tuple[str, Rule] | Mapping[str, Any]
"""`(input, rule)` or `{"input": ..., "rule": ...}`."""


def unpack_request(request: JudgeInput) -> tuple[str, Rule]:
    """The input text and the rule of a judge's Runnable input, checked."""
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
    def final_llm(self) -> BaseChatModel | None:
        """The chat model whose verdicts are final (the executor's default).

        None for a judge that is no chat model (a decision model).
        """

    @property
    def identity(self) -> str:
        """The judging model's identity, as cache keys and manifests name it."""
        llm = self.final_llm
        return "" if llm is None else model_identity(llm)

    @property
    def memory(self) -> VerdictMemory | None:
        """Where this judge's verdicts are cached and logged; None for neither.

        The fan-outs read it once for all rules of an input (one `mget`) before
        any judgment, and judge only the rules it does not know.
        """
        return None

    def recall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """The cached verdicts of `rules` on `text`, by rule id: one lookup.

        What the fan-outs read before judging the rest; `memory`'s by default.
        """
        memory = self.memory
        return {} if memory is None else memory.recall(text, rules)

    async def arecall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """Async `recall`."""
        memory = self.memory
        return {} if memory is None else await memory.arecall(text, rules)

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
            self._judge((text, rule), None, judgment_config(config, rule))
            for rule in unit
        ]

    async def _ajudge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        # One rule a unit, unless a judge batches: no comprehension's frame then.
        if len(unit) == 1:
            return [
                await self._ajudge(
                    (text, unit[0]), None, judgment_config(config, unit[0])
                )
            ]
        return [
            await self._ajudge((text, rule), None, judgment_config(config, rule))
            for rule in unit
        ]

    def invoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair."""
        verdict = self._call_with_config(self._judge, input, config, **kwargs)
        warn_failures([verdict], 1)
        return verdict

    async def ainvoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair, asynchronously."""
        verdict = await self._acall_with_config(self._ajudge, input, config, **kwargs)
        warn_failures([verdict], 1)
        return verdict

    def judge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
        explored: Mapping[str, float] | None = None,
        warn: bool = True,
        recalled: bool = False,
    ) -> list[Verdict]:
        """Judge every rule against `text` in worker threads, in rule order.

        Under `on_error="raise"` the first failure stops the fan-out: judgments not
        started are dropped, running ones make no further attempt, and that
        failure's `JudgmentError` propagates.

        Args:
            text: The input.
            rules: The rules to judge, one judgment each.
            config: Callbacks, tags and metadata for the judgments' runs.
            limiter: Caps judgments in progress; a shared limiter caps them across
                concurrent calls. Defaults to `config["max_concurrency"]`. A judgment
                holds its slot through its retries, except while it waits out a
                rate limit: then it gives the slot back and queues again under the
                lowered bound, so after a pause only the calls allowed go out.
            explored: Rule id -> the exploration rate at which the rule was drawn
                for shadow judging; the verdict log marks those verdicts with it.
            warn: Emit `UnreliableMatchWarning` for failed verdicts; a caller that
                assembles one retrieval from several fan-outs (the query graph's
                tasks, through `MatchEngine`) warns once itself.
            recalled: The caller already read the cache for these rules (one
                lookup for a whole query); none is read here.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))
        if not rules:
            return []
        known = {} if recalled else self.recall(text, rules)
        misses = [rule for rule in rules if rule.rule_id not in known]
        if misses:
            judged = _fanout.in_threads(
                lambda unit: self._judge_unit(text, unit, config),
                self.call_units(misses),
                limiter,
                explored or {},
                # A judge with a memory of its own knows its misses are misses.
                recalled=self.memory is not None,
            )
            known.update((v.rule_id, v) for v in judged)
        verdicts = [known[rule.rule_id] for rule in rules]
        if warn:
            warn_failures(verdicts, len(rules))
        return verdicts

    async def ajudge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
        explored: Mapping[str, float] | None = None,
        warn: bool = True,
        recalled: bool = False,
    ) -> list[Verdict]:
        """Judge every rule against `text` concurrently, in rule order.

        See `judge_rules`. Under `on_error="raise"` the first failure cancels the
        judgments still waiting and propagates.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))
        if not rules:
            return []
        known = {} if recalled else await self.arecall(text, rules)
        misses = [rule for rule in rules if rule.rule_id not in known]
        if misses:
            judged = await _fanout.in_tasks(
                lambda unit: self._ajudge_unit(text, unit, config),
                self.call_units(misses),
                limiter,
                explored or {},
                # A judge with a memory of its own knows its misses are misses.
                recalled=self.memory is not None,
            )
            known.update((v.rule_id, v) for v in judged)
        verdicts = [known[rule.rule_id] for rule in rules]
        if warn:
            warn_failures(verdicts, len(rules))
        return verdicts


class ModelJudge(BaseJudge):
    """What a judge backed by one model shares.

    The rule's judge-side fields, the one retry layer, the failure policy, and its
    verdicts' cache and log. `ApplicabilityJudge` (a chat model) and
    `matching.decision.DecisionJudge` (a decision model) are the two; a subclass
    names its model (`_identity`) and the version of what it asks
    (`question_version`) for the log.
    """

    profile: RuleSchemaProfile = CONDITION_PROFILE
    """What the judge sees of each rule (never the action) and how it answers."""
    retry: CallRetry | None = Field(default_factory=CallRetry)
    """Our retries, the one layer: the judge's copy of the model has its client's
    own retries (`max_retries`, as ChatOpenAI, ChatAnthropic and OpenAIClassifier
    have) turned off. None makes one attempt and leaves the model's client
    retries as they are."""
    on_error: Literal["raise", "not_applicable"] = "raise"
    """After retries: raise `JudgmentError`, or flag the verdict and treat it as NO."""
    cache: BaseStore[str, str] | None = Field(default_factory=InMemoryVerdictCache)
    """Where verdicts are remembered (any `BaseStore[str, str]`: the in-memory
    LRU, `SQLiteVerdictCache`, a LangChain store); None disables caching."""
    verdict_log: VerdictSink | None = None
    """Where every judgment made (not cache hits) is appended, to learn from (a
    `VerdictLog` of `langchain_tag.learning`); None keeps none. Verdicts of rules a
    fan-out judges for exploration (`explored=`) are marked with their rate."""
    log_source: str = "judge"
    """How the log marks this judge's verdicts (a cascade's stages and the
    relevance baseline mark theirs, so that training can leave them out)."""

    _identity: str = PrivateAttr(default="")

    @property
    @abstractmethod
    def question_version(self) -> str:
        """The version of what the model is asked, as the log records it."""

    @property
    def memory(self) -> VerdictMemory | None:
        """The judge's `cache` and `verdict_log`, keyed and marked by this judge."""
        if self.cache is None and self.verdict_log is None:
            return None
        return VerdictMemory(
            self.cache, self.verdict_log, self.cache_key, self.log_fields
        )

    def log_fields(self, rule: Rule, explore: float | None = None) -> dict[str, Any]:
        """What the verdict log records with a verdict of this judge on `rule`."""
        return {
            "model": self._identity,
            "prompt_version": self.question_version,
            "profile": self.profile.name,
            "source": self.log_source,
            "explore": (
                _fanout.explore_rate(rule.rule_id) if explore is None else explore
            ),
        }

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The (label, value) pairs of `rule` the model sees: the profile's, no action.

        Prompt, cache key and prefix share all follow this; only the relevance
        baseline (`langchain_tag_experiments.baselines.RelevanceJudge`) adds the action.
        """
        return self.profile.judged_fields(rule)

    def remade(self, **changes: Any) -> Self:
        """A judge like this one with `changes` to its fields, set up anew."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **changes})

    def with_call_retry(self, retry: CallRetry) -> Self:
        """A judge like this one (same model, cache, profile) retrying by `retry`."""
        return self.remade(retry=retry)

    def failed(
        self,
        rule: Rule,
        error: str,
        kind: FailureKind = "permanent",
        reason: str | None = None,
    ) -> Verdict:
        """A failed judgment of `rule`, by `on_error`: flagged, or raised.

        Raises:
            JudgmentError: Under `on_error="raise"`.
        """
        if self.on_error == "raise":
            raise JudgmentError(rule.rule_id, error, kind=kind, reason=reason)
        return Verdict(rule_id=rule.rule_id, applies=False, error=error)

    def given_up(self, rule: Rule, failed: GaveUp) -> Verdict:
        """The failed verdict of a call that failed after its retries.

        Raises:
            Abandoned: The call was given up because another judgment of the
                fan-out failed.
            JudgmentError: Under `on_error="raise"`.
        """
        return self.failed(rule, *self.why(failed))

    def why(self, failed: GaveUp) -> tuple[str, FailureKind, str | None]:
        """What a failed verdict says of a call given up, its kind and reason.

        Raises:
            Abandoned: The call was given up because another judgment of the
                fan-out failed (nothing to say: the fan-out is stopping).
        """
        error = failed.error
        if isinstance(error, Abandoned):
            raise error
        return (
            f"{describe_error(error)} (after {failed.attempts} attempt(s))",
            failure_kind(error, self.retry or ONE_ATTEMPT),
            failure_reason(error),
        )


class ApplicabilityJudge(ModelJudge):
    """A Runnable that judges whether an input satisfies one rule's condition.

    Works with any `BaseChatModel`: structured output where the model supports it,
    otherwise a lenient text parser (`models.StructuredFallback`: a server found to
    ignore structured output is judged from its text by this judge from then on).
    Each call is one model call, at temperature 0 unless told otherwise; several
    rules in one call only with `rules_per_call` (`batched`).

    Example:
        ```python
        from langchain_openai import ChatOpenAI
        from langchain_tag import Rule
        from langchain_tag.matching import ApplicabilityJudge

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
    structured_output: Literal["auto", "always", "never"] = "auto"
    """`auto`: structured output when the model implements it, else text parsing."""
    temperature: float | None = 0.0
    """Set on a copy of the model when it has a `temperature` field; None leaves it."""
    logprobs: bool = False
    """Ask for logprobs (models with a `logprobs` field, e.g. ChatOpenAI) and score."""
    top_logprobs: int = 5
    rules_per_call: int = Field(default=1, ge=1)
    """Rules judged in one model call. 1 is the method (one judgment per pair);
    more cuts calls and prompt tokens (the input is sent once per call), at a cost
    in quality to measure on your task (`tag eval ... --methods 'tag-b*'`). The
    action stays withheld; verdicts are cached per (input, rule) as always; a rule
    missing from, repeated in or unreadable in the answer is judged again alone.
    Batched verdicts carry no logprob score."""
    rationale: bool = False
    """Ask for one short sentence of reason before each verdict (`Verdict.reason`,
    the documents' `reason` metadata, the verdict log). Its own prompts and cache
    keys; more output tokens. False keeps the profile's prompts exactly (the
    constraint profiles' reason then follows their decision, as it always has)."""

    _calls: StructuredFallback = PrivateAttr()
    _asked: RuleSchemaProfile = PrivateAttr(default=CONDITION_PROFILE)
    _key_prefix: str = PrivateAttr(default="")

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
        # What the model is asked: the profile, or its reasoned form.
        self._asked = self.profile.with_rationale() if self.rationale else self.profile
        asked = self._asked
        model = self._configured_model()
        self._identity = model_identity(model)
        self._key_prefix = json.dumps(
            [
                prompts.PROMPT_VERSION,
                asked.name,
                hashlib.sha256(
                    json.dumps(
                        [
                            asked.system_prompt,
                            asked.output_instruction,
                            asked.output_schema.__name__,
                        ]
                    ).encode()
                ).hexdigest(),
                self._identity,
                # Several rules per call is another prompt: its own verdicts.
                *(["batch"] if self.rules_per_call > 1 else []),
                # So are reasons first; nothing is added without them, so that the
                # keys of verdicts cached before rationale existed still match.
                *(["rationale", prompts.RATIONALE_VERSION] if self.rationale else []),
            ]
        )
        self._calls = StructuredFallback(model, self.structured_output, self._schemas())

    @property
    def asked_profile(self) -> RuleSchemaProfile:
        """The profile as the model is asked: `profile`, or its reasoned form."""
        return self._asked

    def _schemas(self) -> list[type[BaseModel]]:
        batch = self._asked.batch_output_schema
        return [
            self._asked.output_schema,
            *([batch] if batch is not None and self.rules_per_call > 1 else []),
        ]

    @property
    def final_llm(self) -> BaseChatModel:
        """The judging model."""
        return self.llm

    def remade(self, **changes: Any) -> Self:
        """A judge like this one with `changes` to its fields, set up anew.

        On the same model it remembers what this one learnt: a server that ignores
        structured output is judged from its text from the start.
        """
        judge = super().remade(**changes)
        if "llm" not in changes:
            judge._calls.remember(self._calls)  # noqa: SLF001 - same class
        return judge

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

    def call_model(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        """One model call, no retries (`_fanout.call` adds them); its output, unread."""
        return self._calls.invoke(messages, config, self._schema(batch=batch))

    async def acall_model(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        """Async `call_model`."""
        return await self._calls.ainvoke(messages, config, self._schema(batch=batch))

    def _schema(self, *, batch: bool) -> type[BaseModel]:
        schema = self._asked.batch_output_schema if batch else None
        return schema or self._asked.output_schema

    # -- prompt -----------------------------------------------------------------------

    question: ClassVar[str] = prompts.JUDGE_QUESTION
    """The user message's opening line: what to decide about the rule."""

    def messages(self, text: str, rule: Rule) -> list[BaseMessage]:
        """The exact messages that judge `rule` against `text` (no action in them)."""
        return [
            SystemMessage(self._asked.system_prompt),
            HumanMessage(
                prompts.render_judge_user_message(
                    text,
                    self.judged_fields(rule),
                    self._asked.output_instruction,
                    self.question,
                )
            ),
        ]

    @property
    def calls(self) -> StructuredFallback:
        """How a judgment calls its model, for rendering the same call elsewhere.

        `calls.llm` is the configured copy (temperature, logprobs, client retries
        off); `calls.structured(asked_profile.output_schema)` the structured call,
        or None when the judgment is a text call.
        """
        return self._calls

    def remember_answers(
        self,
        answers: Sequence[tuple[str, Rule, Any]],
        explored: Mapping[tuple[str, str], float] | None = None,
    ) -> list[Verdict | None]:
        """Read, cache and log answers to `messages(text, rule)` obtained elsewhere.

        For answers that did not come through `invoke` (OpenAI's Batch API, say):
        each `(text, rule, output)`, `output` being what the call returns (the
        structured mapping or the message), is read as a judgment reads its call's
        output, cached in one write and logged with the same fields. An answer that
        gives no verdict is None, neither cached nor logged: judge that pair again.

        Args:
            answers: `(text, rule, output)` per answer.
            explored: `(text, rule id)` -> the rate at which a learned prefilter's
                shadow judging drew the pair; the log marks those verdicts with it,
                as a fan-out's `explored` does.
        """
        explored = explored or {}
        read: list[Verdict | None] = []
        for _, rule, output in answers:
            try:
                verdict: Verdict | None = self.read(rule, output)
            except JudgmentError:
                verdict = None
            read.append(None if verdict is None or verdict.failed else verdict)
        if (memory := self.memory) is not None:
            memory.settle_pairs(
                [
                    (text, rule, verdict)
                    for (text, rule, _), verdict in zip(answers, read, strict=True)
                    if verdict is not None
                ],
                explored,
            )
        return read

    def prefix_share(self, text: str, rules: Sequence[Rule]) -> float:
        """Share of prompt characters that all judgments of `text` have in common.

        The system prompt and the input come before the rule, so this prefix is what a
        provider's prefix cache can reuse across the M judgments of one input. It is
        counted up to the end of the input block, a lower bound.
        """
        if not rules:
            return 0.0
        shared = len(self._asked.system_prompt) + len(
            prompts.render_judge_input(text, self.question)
        )
        rule_parts = sum(
            len(
                prompts.render_judge_rule(
                    self.judged_fields(rule), self._asked.output_instruction
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
        schema = self._asked.output_schema
        decision = (
            answer_format(schema).from_mapping(parsed.model_dump())
            if isinstance(parsed, BaseModel)
            else None
        )
        if decision is None:
            answer = answer_text(raw)
            decision = parse_verdict(answer, schema=schema)
            if decision is None:
                # Deterministic at temperature 0, so not retried.
                return self.failed(rule, _unreadable(answer), kind="unreadable")
        # With a reason first, the score is read after the decision's key.
        score_key = answer_format(schema).keys[0] if self.rationale else None
        score = score_from_logprobs(raw, after_key=score_key) if self.logprobs else None
        return Verdict(
            rule_id=rule.rule_id,
            applies=decision.applies,
            score=score,
            reason=decision.reason,
        )

    def read(self, rule: Rule, output: Any) -> Verdict:
        """The verdict of a call that went through; unreadable, a failed judgment.

        Only an answer that gives no verdict is unreadable (`_from_output` says
        so); an error while reading it is not the answer's fault, so it fails the
        judgment as a permanent error, through the policy like any other.
        """
        _fanout.succeeded()
        try:
            return self._from_output(rule, output)
        except JudgmentError:
            raise
        except Exception as error:  # noqa: BLE001 - reported through the policy
            return self.failed(
                rule, f"reading the judge's answer failed: {describe_error(error)}"
            )

    # -- the cache and the log ---------------------------------------------------------

    @property
    def question_version(self) -> str:
        """The judge prompt's version (and the rationale's, when asked)."""
        return (
            f"{prompts.PROMPT_VERSION}+{prompts.RATIONALE_VERSION}"
            if self.rationale
            else prompts.PROMPT_VERSION
        )

    def _recalled(self, text: str, rule: Rule) -> Verdict | None:
        memory = self.memory
        if memory is None or _fanout.recalled():
            return None
        return memory.recall(text, [rule]).get(rule.rule_id)

    async def _arecalled(self, text: str, rule: Rule) -> Verdict | None:
        memory = self.memory
        if memory is None or _fanout.recalled():
            return None
        return (await memory.arecall(text, [rule])).get(rule.rule_id)

    # -- the judgment: native async only where it awaits ------------------------------

    def _judge(
        self,
        request: JudgeInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = unpack_request(request)
        if (hit := self._recalled(text, rule)) is not None:
            return hit
        try:
            output = _fanout.call(
                self.retry,
                self._calls.invoke,
                self.messages(text, rule),
                config,
                self._schema(batch=False),
            )
        except GaveUp as failed:
            verdict = self.given_up(rule, failed)
        else:
            verdict = self.read(rule, output)
        memory = self.memory
        return verdict if memory is None else memory.settle(text, [rule], [verdict])[0]

    async def _ajudge(
        self,
        request: JudgeInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = unpack_request(request)
        if (hit := await self._arecalled(text, rule)) is not None:
            return hit
        try:
            output: Any = await _fanout.acall(
                self.retry,
                self._calls.ainvoke,
                self.messages(text, rule),
                config,
                self._schema(batch=False),
            )
        except GaveUp as failed:
            verdict = self.given_up(rule, failed)
        else:
            verdict = self.read(rule, output)
        memory = self.memory
        if memory is None:
            return verdict
        return (await memory.asettle(text, [rule], [verdict]))[0]

    # -- several rules per call (`batched`) -------------------------------------------

    def call_units(self, rules: Sequence[Rule]) -> list[Sequence[Rule]]:
        """`rules_per_call` rules per unit."""
        return _batched.units(rules, self.rules_per_call)

    def batch_messages(self, text: str, rules: Sequence[Rule]) -> list[BaseMessage]:
        """The messages that judge several `rules` against `text` in one call."""
        return _batched.batch_messages(self, text, rules)

    def _judge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        if len(unit) == 1:
            return [
                self._judge((text, unit[0]), None, judgment_config(config, unit[0]))
            ]
        return _batched.judge_unit(self, text, unit, config)

    async def _ajudge_unit(
        self, text: str, unit: Sequence[Rule], config: RunnableConfig
    ) -> list[Verdict]:
        if len(unit) == 1:
            return [
                await self._ajudge(
                    (text, unit[0]), None, judgment_config(config, unit[0])
                )
            ]
        return await _batched.ajudge_unit(self, text, unit, config)


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
