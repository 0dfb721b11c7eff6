"""The matching engine: TAG's online stage, written once, behind every face.

    check the input -> filter -> learned partition (+ shadow exploration)
        -> similarity prefilter -> judge fan-out -> selection (k, threshold)
        -> `MatchResult` (+ recall estimate) -> retraining from the verdict log

`TAGRetriever` (a `BaseRetriever`) runs `MatchEngine.match`; the query graph runs the
same steps as nodes (`plan`, one `match_rule` task per call unit, `execute`), so a
run in LangGraph Studio shows the fan-out; agent middleware calls `match` too. No
face selects, judges or ranks a rule on its own, so every option means the same in
each: `k`, `score_threshold` and `filter` per call (`MatchOptions`); the judge
(cache, verdict log, `rules_per_call` or `questions_per_request`, `on_error`), the
prefilter, `explore`, `retrain_every` and `max_concurrency` per engine, all declared
once in `settings.MatchSettings`, where every face builds its engine.

The judge's `VerdictMemory` is read once per query for every candidate (one `mget`);
only the misses are fanned out, and each backend writes its paid verdicts to the
cache and the log as it reads them (a cascade logs each stage's verdicts). The
engine reads the log back only to retrain.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import BaseModel, ConfigDict, Field

from langchain_tag._text import check_text
from langchain_tag.learning.retraining import Retrainer
from langchain_tag.learning.shadow import RecallEstimate, ShadowJudging, check_rate
from langchain_tag.matching import BaseJudge, Verdict
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.verdicts import warn_failures
from langchain_tag.rules import Rule
from langchain_tag.usage import TokenUsage, UsageCounter

if TYPE_CHECKING:
    from langchain_tag.batch import BatchProgress, BatchReport, BatchSettings

__all__ = [
    "MATCH_EVENT",
    "MatchEngine",
    "MatchOptions",
    "MatchPlan",
    "MatchResult",
    "RuleFilter",
    "rule_document",
    "select_applicable",
]

logger = logging.getLogger(__name__)

RuleFilter = Mapping[str, Any] | Callable[[Rule], bool]
"""Field -> accepted value(s), or a predicate. List fields match on any overlap."""

MATCH_EVENT = "tag_match"
"""Name of the custom event each retrieval dispatches with its `MatchResult` summary."""

_RULE_KEYS = frozenset(Rule.model_fields) | {"source_document_id"}


# --- options -------------------------------------------------------------------------


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


def check_filter(rule_filter: object, rules: Iterable[Rule]) -> None:
    """Refuse a mapping filter naming a key no rule has.

    A key must be a `Rule` field (`tags`, `name`, ...), `source_document_id`, or a
    key of some rule's `metadata`; any other key (`tag` for `tags`, say) would
    exclude every rule without a word.

    Raises:
        TypeError: The filter is neither a mapping nor a predicate.
        ValueError: A key is unknown; the message lists the known ones.
    """
    if rule_filter is None or callable(rule_filter):
        return
    if not isinstance(rule_filter, Mapping):
        msg = (
            "filter must be a mapping of field -> accepted value(s) or a predicate "
            f"on Rule, got {type(rule_filter).__name__}."
        )
        raise TypeError(msg)
    known = set(_RULE_KEYS)
    for rule in rules:
        known.update(rule.metadata)
    unknown = sorted(str(key) for key in rule_filter if key not in known)
    if unknown:
        msg = (
            f"Unknown filter key(s) {', '.join(map(repr, unknown))}: neither a Rule "
            f"field nor in any rule's metadata, so no rule would pass. Known keys: "
            f"{', '.join(sorted(known))}."
        )
        raise ValueError(msg)


def rule_passes(rule: Rule, rule_filter: RuleFilter | None) -> bool:
    """Whether `rule` passes a metadata filter.

    A mapping filter names Rule fields (`tags`, `source_document_id`, ...) or keys of
    `Rule.metadata`; each value is an accepted value or a list of them. For list fields
    such as `tags`, a rule passes when any of its values is accepted.
    """
    if rule_filter is None:
        return True
    if callable(rule_filter):
        return bool(rule_filter(rule))
    for key, expected in rule_filter.items():
        value = getattr(rule, key) if key in _RULE_KEYS else rule.metadata.get(key)
        accepted = (
            set(expected)
            if isinstance(expected, list | tuple | set | frozenset)
            else {expected}
        )
        values = set(value) if isinstance(value, list | tuple) else {value}
        if not values & accepted:
            return False
    return True


@dataclass(frozen=True)
class MatchOptions:
    """One retrieval's options, under the same names in every face.

    Checked when made, so a bad option costs no model call.
    """

    k: int | None = None
    """Return at most this many rules; None returns every applicable rule."""
    score_threshold: float | None = None
    """Drop applicable rules scoring below this (a rule without a score counts 1.0)."""
    filter: RuleFilter | None = None
    """Judge only rules passing this filter (see `rule_passes`)."""

    def __post_init__(self) -> None:
        """Refuse a `k` or `score_threshold` out of range."""
        check_selection(self.k, self.score_threshold)


# --- what a retrieval decided --------------------------------------------------------


class MatchPlan(BaseModel):
    """What a retrieval decided before any judgment: the rules to judge, and why.

    JSON-able (the query graph keeps it in its state between nodes).
    """

    model_config = ConfigDict(frozen=True)

    query: str
    candidates: list[Rule] = Field(description="The rules to judge, in rule order.")
    explored: dict[str, float] = Field(
        default_factory=dict,
        description="Candidates the learned prefilter skipped but that are judged "
        "anyway (shadow judging): rule id -> the rate they were drawn at.",
    )
    total_rules: int
    k: int | None = None
    score_threshold: float | None = None
    filter: str | None = Field(default=None, description="The filter, as text.")
    prefiltered: bool = False
    blank: bool = Field(
        default=False, description="The input is empty or blank: nothing is judged."
    )
    started: float = Field(description="time.time() when the retrieval started.")


class MatchResult(BaseModel):
    """Everything one retrieval decided, not only the documents it returned."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    query: str
    documents: list[Document]
    verdicts: list[Verdict] = Field(description="Every judged rule, in rulebook order.")
    total_rules: int
    candidates: int = Field(description="Rules judged after filter and prefilter.")
    failed_rule_ids: list[str]
    reason: str | None = Field(description="Why nothing was returned, when empty.")
    prefix_share: float = Field(
        description="Share of prompt characters common to all judgments of the query."
    )
    elapsed_seconds: float
    explored_rule_ids: list[str] = Field(
        default_factory=list,
        description="Rules the prefilter skipped but that were judged anyway "
        "(shadow judging); a YES among them is a miss of the prefilter, returned.",
    )
    recall_estimate: RecallEstimate | None = Field(
        default=None,
        description="The learned prefilter's recall of YES verdicts so far, as "
        "the shadow judgments measured it, with its interval: an estimate. What is "
        "promised (`promised`, the prefilter's `target_recall`, kept over the "
        "stream by retraining) and under which conditions is in `RecallEstimate`.",
    )
    usage: TokenUsage | None = Field(
        default=None,
        description="The judgments' model calls and tokens, cached input tokens "
        "included (verdicts from a cache cost none; tokens unknown when the model "
        "reports no usage); None when not counted.",
    )

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest, as dispatched in the `tag_match` event."""
        return {
            "query": self.query,
            "matched_rule_ids": [d.metadata["rule_id"] for d in self.documents],
            "total_rules": self.total_rules,
            "candidates": self.candidates,
            "applicable": sum(v.applies for v in self.verdicts),
            "cached": sum(v.cached for v in self.verdicts),
            "failed_rule_ids": self.failed_rule_ids,
            "empty_reason": self.reason,
            "prefix_share": round(self.prefix_share, 4),
            "elapsed_seconds": round(self.elapsed_seconds, 4),
            "explored_rule_ids": self.explored_rule_ids,
            "prefilter_misses": [
                v.rule_id
                for v in self.verdicts
                if v.applies and v.rule_id in self.explored_rule_ids
            ],
            "recall_estimate": (
                None
                if self.recall_estimate is None
                else self.recall_estimate.model_dump()
            ),
            "usage": None if self.usage is None else self.usage.model_dump(),
        }


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


def rule_document(rule: Rule, **extra: Any) -> Document:
    """The `Document` every rule-level retriever returns for a rule.

    `id` and `metadata["rule_id"]` are the rule id, `page_content` is the action
    (all an executor should see), and the metadata also carries the rule's name,
    condition, source text, tags and source offsets, for tracing and scoring.

    Args:
        rule: The rule.
        **extra: More metadata, such as the `relevance_score` that ranked it.
    """
    metadata: dict[str, Any] = {
        "rule_id": rule.rule_id,
        "name": rule.name,
        "condition": rule.condition,
        "source_text": rule.source_text,
        "tags": list(rule.tags),
        "source_document_id": rule.source_document_id,
        "source_start": None if rule.source is None else rule.source.start,
        "source_end": None if rule.source is None else rule.source.end,
        **extra,
    }
    return Document(id=rule.rule_id, page_content=rule.action, metadata=metadata)


# --- the engine ----------------------------------------------------------------------


class MatchEngine:
    """TAG's query path: one instance per judge and prefilter, shared by its faces.

    Thread- and task-safe: concurrent retrievals share the concurrency bound, the
    shadow-judging counts and the retrainer.

    Args:
        judge: Judges each (input, rule) pair; its cache, verdict log,
            `rules_per_call` and `on_error` apply in every face.
        prefilter: Shortlists candidate rules before judging: a retriever whose
            documents name rules by `metadata["rule_id"]` or `id`, or a learned
            prefilter (with `partition(text)`), whose skipped rules are explored at
            rate `explore`. None judges every rule, as in the paper.
        explore: With a learned prefilter: the share of skipped (input, rule) pairs
            judged anyway, which keeps its recall measured.
        retrain_every: With a learned prefilter and a judge keeping a verdict log:
            train again from the log once this many verdicts were logged since the
            last training, in a background thread.
        max_concurrency: Judgments in flight at most, across concurrent retrievals.
    """

    def __init__(
        self,
        judge: BaseJudge,
        *,
        prefilter: BaseRetriever | None = None,
        explore: float = 0.05,
        retrain_every: int | None = None,
        max_concurrency: int | None = 8,
    ) -> None:
        """Set the engine up; see the class docstring."""
        check_rate(explore)
        self.judge = judge
        self.prefilter = prefilter
        self.limiter = ConcurrencyLimiter(max_concurrency)
        learned = callable(getattr(prefilter, "partition", None))
        log = getattr(judge, "verdict_log", None)
        # The skipped pairs go to the judge's log: retraining keeps the recall
        # promise with them.
        self.shadow = (
            ShadowJudging(prefilter, explore=explore, log=log)  # type: ignore[arg-type]
            if learned
            else None
        )
        if retrain_every is not None and (
            not learned or not callable(getattr(prefilter, "fit", None)) or log is None
        ):
            msg = (
                "retrain_every needs a prefilter that learns (LearnedPrefilter) and "
                "a judge keeping a verdict_log to learn from."
            )
            raise ValueError(msg)
        self.retrainer = (
            None
            if retrain_every is None
            else Retrainer(
                prefilter,  # type: ignore[arg-type]
                log,  # type: ignore[arg-type]
                prefilter.rulebook,  # type: ignore[union-attr]
                every=retrain_every,
            )
        )
        self._warned_unscored = False

    # -- steps ------------------------------------------------------------------------

    def plan(
        self,
        query: object,
        rules: Sequence[Rule],
        options: MatchOptions | None = None,
        config: RunnableConfig | None = None,
        *,
        record: bool = True,
    ) -> MatchPlan:
        """Check the input, then filter and prefilter: the rules to judge.

        An empty or blank input is judged against no rule (it costs nothing): its
        result is empty, with the reason "the input is empty or blank".

        Args:
            query: The input.
            rules: The rules.
            options: `k`, `score_threshold` and `filter`.
            config: Callbacks and settings for the prefilter's run.
            record: With a learned prefilter and a verdict log, record the pairs it
                skipped (the retraining reads them); False for a plan that only
                looks ahead (`prejudge`, an estimate), since the retrieval records
                its own.
        """
        plan = self._filtered(query, rules, options)
        if not plan.candidates or self.prefilter is None:
            return plan
        if self.shadow is not None:  # a learned prefilter partitions
            return self._explored(plan, self.shadow, record=record)
        shortlist = self.prefilter.invoke(plan.query, config)
        return self._shortlisted(plan, shortlist)

    async def aplan(
        self,
        query: object,
        rules: Sequence[Rule],
        options: MatchOptions | None = None,
        config: RunnableConfig | None = None,
    ) -> MatchPlan:
        """Async `plan`: the prefilter runs without blocking the loop."""
        plan = self._filtered(query, rules, options)
        if not plan.candidates or self.prefilter is None:
            return plan
        if self.shadow is not None:  # a learned prefilter partitions
            return self._explored(plan, self.shadow)
        shortlist = await self.prefilter.ainvoke(plan.query, config)
        return self._shortlisted(plan, shortlist)

    def call_units(self, plan: MatchPlan) -> list[list[Rule]]:
        """The plan's candidates grouped by model call (one rule each by default)."""
        return [list(unit) for unit in self.judge.call_units(plan.candidates)]

    def recall(self, plan: MatchPlan) -> list[Verdict]:
        """The plan's candidates' cached verdicts, in rule order: one lookup.

        A face that judges a plan in several parts (the query graph's tasks) reads
        the cache once here, then judges only the others (`recalled=True`).
        """
        if not plan.candidates:
            return []
        known = self.judge.recall(plan.query, plan.candidates)
        return [known[r.rule_id] for r in plan.candidates if r.rule_id in known]

    async def arecall(self, plan: MatchPlan) -> list[Verdict]:
        """Async `recall`."""
        if not plan.candidates:
            return []
        known = await self.judge.arecall(plan.query, plan.candidates)
        return [known[r.rule_id] for r in plan.candidates if r.rule_id in known]

    def judge_rules(
        self,
        plan: MatchPlan,
        config: RunnableConfig | None = None,
        rules: Sequence[Rule] | None = None,
        *,
        recalled: bool = False,
    ) -> list[Verdict]:
        """Judge the plan's candidates (or `rules`, some of them) against its input.

        Under the engine's concurrency bound, narrowed by `config["max_concurrency"]`.
        The cache is read once for all of them (one `mget`) and only the others
        are judged; `recalled=True`: the caller has read it (`recall`).
        """
        return self.judge.judge_rules(
            plan.query,
            plan.candidates if rules is None else rules,
            config,
            limiter=self._limiter(config),
            explored=plan.explored,
            warn=False,  # once per retrieval, in `result`
            recalled=recalled,
        )

    async def ajudge_rules(
        self,
        plan: MatchPlan,
        config: RunnableConfig | None = None,
        rules: Sequence[Rule] | None = None,
        *,
        recalled: bool = False,
    ) -> list[Verdict]:
        """Async `judge_rules`."""
        return await self.judge.ajudge_rules(
            plan.query,
            plan.candidates if rules is None else rules,
            config,
            limiter=self._limiter(config),
            explored=plan.explored,
            warn=False,  # once per retrieval, in `result`
            recalled=recalled,
        )

    def result(
        self,
        plan: MatchPlan,
        verdicts: Sequence[Verdict],
        usage: TokenUsage | None = None,
    ) -> MatchResult:
        """Select (k, threshold), explain an empty result, count shadow judgments.

        `usage` is what the judgments cost (`MatchResult.usage`). The faces call
        `retrain_if_due` after it (`match` and `amatch` do).
        """
        order = [rule.rule_id for rule in plan.candidates]
        by_rule = {v.rule_id: v for v in verdicts}
        verdicts = [by_rule[rule_id] for rule_id in order if rule_id in by_rule]
        rules = {rule.rule_id: rule for rule in plan.candidates}
        kept = select_applicable(
            verdicts, order, k=plan.k, threshold=plan.score_threshold
        )
        failed = [v.rule_id for v in verdicts if v.failed]
        warn_failures(verdicts, len(verdicts))
        reason = None if kept else _empty_reason(plan, verdicts, failed)
        if reason is not None:
            logger.info(
                "TAG retrieval returned nothing for %r: %s", plan.query[:80], reason
            )
        self._warn_unscored(plan, verdicts)
        recall = (
            None
            if self.shadow is None
            else self.shadow.observe(verdicts, plan.explored)
        )
        return MatchResult(
            query=plan.query,
            documents=[_to_document(rules[v.rule_id], v) for v in kept],
            verdicts=verdicts,
            total_rules=plan.total_rules,
            candidates=len(plan.candidates),
            failed_rule_ids=failed,
            reason=reason,
            prefix_share=self.judge.prefix_share(plan.query, plan.candidates),
            elapsed_seconds=max(0.0, time.time() - plan.started),
            explored_rule_ids=list(plan.explored),
            recall_estimate=recall,
            usage=usage,
        )

    def match(
        self,
        query: object,
        rules: Sequence[Rule],
        options: MatchOptions | None = None,
        config: RunnableConfig | None = None,
    ) -> MatchResult:
        """Every step: plan, judge, result; the judgments' usage is counted."""
        plan = self.plan(query, rules, options, config)
        with UsageCounter().counting() as counter:
            verdicts = self.judge_rules(plan, config)
        result = self.result(plan, verdicts, counter.usage)
        self.retrain_if_due(rules)
        return result

    async def amatch(
        self,
        query: object,
        rules: Sequence[Rule],
        options: MatchOptions | None = None,
        config: RunnableConfig | None = None,
    ) -> MatchResult:
        """Async `match`."""
        plan = await self.aplan(query, rules, options, config)
        with UsageCounter().counting() as counter:
            verdicts = await self.ajudge_rules(plan, config)
        result = self.result(plan, verdicts, counter.usage)
        if self.retrainer is not None:  # reads the log: off the event loop
            await asyncio.to_thread(self.retrain_if_due, rules)
        return result

    def retrain_if_due(self, rules: Sequence[Rule]) -> None:
        """Start a retraining over `rules` in the background, if one is due.

        Never waits for the training (`Retrainer.poll`); only reads the verdict
        log's position.
        """
        if self.retrainer is not None:
            self.retrainer.poll(rules)

    def prejudge(
        self,
        inputs: Iterable[object],
        rules: Sequence[Rule],
        options: MatchOptions | None = None,
        *,
        via: Literal["batch", "online"] = "batch",
        config: RunnableConfig | None = None,
        settings: BatchSettings | None = None,
        progress: Callable[[BatchProgress], None] | None = None,
    ) -> BatchReport:
        """Judge now, into the judge's cache and log, what `match` would judge.

        Each input is planned as `match` plans it (filter, prefilter, the learned
        prefilter's partition and its shadow draws), so a later `match` of these
        inputs finds every verdict cached and makes no judgment call. For a job
        over a corpus: `via="batch"` sends the pairs through the OpenAI Batch API
        (`langchain_tag.batch.judge_in_batch`: about half the price, results
        within 24 hours, resumable by calling again); `via="online"` judges them
        now, each input's fan-out under the engine's concurrency bound.

        Nothing is selected or counted here (no `MatchResult`, no shadow counts):
        `match` does that when it reads the verdicts back.

        Args:
            inputs: The texts to judge.
            rules: The rules, as `match` takes them.
            options: The `filter` (and `k`, `score_threshold`, unused here).
            via: "batch" or "online".
            config: Callbacks, tags and metadata for the calls.
            settings: The batch lane's file limits, polling and `max_wait`.
            progress: Called with each poll of each batch.

        Returns:
            How each pair was answered: from the cache, a batch, or online.

        Raises:
            BatchLaneError: `via="batch"` with a judge the Batch API cannot run
                (not an `ApplicabilityJudge` on `ChatOpenAI`, or several rules per
                call).
            JudgmentError: An online judgment failed under `on_error="raise"`.
        """
        from langchain_tag import batch  # noqa: PLC0415 - loads the openai SDK

        if via not in ("batch", "online"):
            msg = f"via must be 'batch' or 'online', got {via!r}."
            raise ValueError(msg)
        plans = [
            self.plan(text, rules, options, config, record=False) for text in inputs
        ]
        if via == "batch":
            return batch.judge_in_batch(
                self.judge,
                [(plan.query, rule) for plan in plans for rule in plan.candidates],
                explored={
                    (plan.query, rule_id): rate
                    for plan in plans
                    for rule_id, rate in plan.explored.items()
                },
                settings=settings,
                progress=progress,
                config=config,
            )
        report = batch.BatchReport(requests=sum(len(p.candidates) for p in plans))
        for plan in plans:
            verdicts = self.judge_rules(plan, config)
            for verdict in verdicts:
                report.note(
                    plan.query, verdict.rule_id, "cache" if verdict.cached else "online"
                )
            report.cached += sum(v.cached for v in verdicts)
            report.online += sum(not v.cached for v in verdicts)
            report.failed += sum(v.failed for v in verdicts)
        return report

    # -- the parts --------------------------------------------------------------------

    def _filtered(
        self, query: object, rules: Sequence[Rule], options: MatchOptions | None
    ) -> MatchPlan:
        """The plan before any prefilter: the input checked, the filter applied."""
        options = options or MatchOptions()
        text = check_text(query, "The query")
        check_filter(options.filter, rules)
        blank = not text.strip()
        passed = [] if blank else [r for r in rules if rule_passes(r, options.filter)]
        return MatchPlan(
            query=text,
            candidates=passed,
            total_rules=len(rules),
            k=options.k,
            score_threshold=options.score_threshold,
            filter=None if options.filter is None else repr(options.filter),
            prefiltered=self.prefilter is not None,
            blank=blank,
            started=time.time(),
        )

    @staticmethod
    def _explored(
        plan: MatchPlan, shadow: ShadowJudging, *, record: bool = True
    ) -> MatchPlan:
        """The learned prefilter's partition, skipped rules drawn to explore."""
        judged, explored = shadow.partition(plan.query, plan.candidates, record=record)
        return plan.model_copy(update={"candidates": judged, "explored": explored})

    def _shortlisted(self, plan: MatchPlan, shortlist: Sequence[Document]) -> MatchPlan:
        """The candidates the similarity prefilter's shortlist names."""
        rules = plan.candidates
        wanted = {doc.metadata.get("rule_id") or doc.id for doc in shortlist}
        unknown = wanted - {rule.rule_id for rule in rules} - {None}
        if unknown:
            logger.warning(
                "The prefilter returned %d rule id(s) not among the candidate rules "
                "(rulebook and store out of sync, or filtered out): %s",
                len(unknown),
                sorted(map(str, unknown))[:10],
            )
        kept = [rule for rule in rules if rule.rule_id in wanted]
        return plan.model_copy(update={"candidates": kept})

    def _limiter(self, config: RunnableConfig | None) -> ConcurrencyLimiter:
        # The run config's `max_concurrency` (as `batch` passes it) bounds this
        # call's judgments too, within the engine's own bound.
        limit = ensure_config(config).get("max_concurrency")
        if limit is None or limit == self.limiter.bound:
            return self.limiter
        return ConcurrencyLimiter(limit, within=self.limiter)

    def _warn_unscored(self, plan: MatchPlan, verdicts: Sequence[Verdict]) -> None:
        threshold = plan.score_threshold
        if threshold is None or self._warned_unscored:
            return
        unscored = [v.rule_id for v in verdicts if v.applies and v.score is None]
        if unscored:
            self._warned_unscored = True
            warnings.warn(
                f"score_threshold={threshold} has no effect on verdicts without a "
                f"score ({len(unscored)} here, e.g. {unscored[0]!r}): they rank "
                "as 1.0. Scores come from logprobs: ApplicabilityJudge("
                "logprobs=True) with a model that returns them (e.g. ChatOpenAI).",
                UserWarning,
                stacklevel=3,
            )


def _to_document(rule: Rule, verdict: Verdict) -> Document:
    return rule_document(
        rule,
        relevance_score=verdict.relevance,
        score=verdict.score,
        reason=verdict.reason,
        cached=verdict.cached,
    )


def _empty_reason(
    plan: MatchPlan, verdicts: Sequence[Verdict], failed: Sequence[str]
) -> str:
    reason = _why_empty(plan, sum(v.applies for v in verdicts))
    if failed:
        reason += (
            f" ({len(failed)} judgment(s) failed and were treated as not applicable)"
        )
    return reason


def _why_empty(plan: MatchPlan, applicable: int) -> str:
    total, candidates = plan.total_rules, len(plan.candidates)
    reasons = (
        (total == 0, "the rulebook has no rules"),
        (plan.blank, "the input is empty or blank: nothing to judge"),
        (
            candidates == 0 and plan.filter is not None and not plan.prefiltered,
            f"the filter {plan.filter} excluded all {total} rules",
        ),
        (candidates == 0, "no rule passed the filter and the prefilter"),
        (
            applicable == 0,
            f"no rule's condition is satisfied by the input ({candidates} judged)",
        ),
        (plan.k == 0, "k=0"),
    )
    return next(
        (reason for holds, reason in reasons if holds),
        f"{applicable} rule(s) applied but none reached "
        f"score_threshold={plan.score_threshold}",
    )
