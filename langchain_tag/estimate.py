"""What a bulk run would spend, counted without calling a model: `estimate_bulk`.

`tag run --inputs ... --estimate` prints it. The run's own code does the work on
stand-in models (`langchain_tag.metering`): each input is planned by the engine
itself, the pairs its verdict cache already holds are left out, and the rest are
judged by a copy of the judge on a stand-in model that answers NO to every rule
and bills what it is sent (the tokens of the messages the judge builds, the part a
provider's prompt cache would serve); the executor runs on one answering a typical
answer of its template. Nothing is written to the run's cache or log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from langchain_tag.engine import MatchEngine, MatchOptions
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.metering import (
    MeteringChatModel,
    MeteringDecisionModel,
    executor_answers,
    judge_answers,
    run_to_end,
    stand_in_judge,
)
from langchain_tag.rules import Rule
from langchain_tag.usage import (
    DEFAULT_CACHING,
    PromptCaching,
    TokenPrices,
    TokenUsage,
    UsageCounter,
    token_counter,
)

__all__ = ["BulkEstimate", "estimate_bulk"]


DECISION_MODEL = "tag-metering-decisions"
"""The stand-in decision model's name: its usage is told apart by it."""

DECISION_NOTE = (
    "decision requests: input tokens only (the input once, each question with its "
    "criteria), no output tokens; none counted as cached; their batch price "
    "assumes a batch discount the decision API may not offer"
)


# --- Bulk runs ------------------------------------------------------------------------


_BULK_CACHE_KEEP = 10_000
"""Prompts a bulk estimate's simulated prompt cache remembers (the most recent)."""


class BulkEstimate(BaseModel):
    """What a bulk run (`tag run --inputs`) would spend on the inputs left to do."""

    inputs: int = Field(description="Inputs estimated (those not written yet).")
    judge_calls: int = Field(
        description="Judge model calls, as the judge splits them (a decision "
        "model's: its requests)."
    )
    judgments: int = Field(description="(input, rule) pairs the run would judge.")
    cached_verdicts: int = Field(
        description="Of those pairs, the ones already in the judge's verdict cache: "
        "no call (an earlier or interrupted run paid for them)."
    )
    executor_calls: int = 0
    usage: TokenUsage = Field(description="Calls and estimated tokens.")
    dollars: float | None = Field(default=None, description="At list prices.")
    batch_dollars: float | None = Field(
        default=None, description="At batch prices (`--via batch`, or flex)."
    )
    token_counter: str = ""
    notes: list[str] = Field(default_factory=list)


def estimate_bulk(
    engine: MatchEngine,
    rules: Sequence[Rule],
    texts: Iterable[str],
    *,
    options: MatchOptions | None = None,
    executor: ActionOnlyExecutor | None = None,
    prices: TokenPrices | None = None,
    caching: PromptCaching | None = DEFAULT_CACHING,
    in_flight: int = 8,
) -> BulkEstimate:
    """What matching (and executing) `texts` would spend, calling no model.

    Each input is planned by the engine itself (filter, prefilter, the learned
    prefilter's partition and shadow draws, nothing recorded), so the pairs
    counted are the run's; pairs already in the judge's verdict cache cost
    nothing, and neither do pairs repeated across inputs when the judge caches.
    The rest are judged by the judge's own code on a stand-in model
    (`stand_in_judge`): its calls and input tokens are exact (first attempts
    succeeding); output tokens are a NO each. A decision model's requests are
    billed as the provider bills them: input tokens only, none cached. The
    executor's prompt is counted with every candidate rule's action, an upper
    bound: which rules match is known only after judging.
    """
    return run_to_end(
        _estimate(engine, rules, texts, options, executor, prices, caching, in_flight)
    )


async def _estimate(
    engine: MatchEngine,
    rules: Sequence[Rule],
    texts: Iterable[str],
    options: MatchOptions | None,
    executor: ActionOnlyExecutor | None,
    prices: TokenPrices | None,
    caching: PromptCaching | None,
    in_flight: int,
) -> BulkEstimate:
    counter = token_counter()

    def chat() -> MeteringChatModel:
        # Bounded: a provider keeps prefixes minutes, and a corpus's prompts would
        # not fit in memory (20,000 inputs x 9 rules held 560 MB unbounded).
        return MeteringChatModel(
            answer=judge_answers(lambda _text, _rule: False),
            counter=counter,
            caching=caching,
            in_flight=in_flight,
            keep=_BULK_CACHE_KEEP,
        )

    judge = engine.judge
    dry = MatchEngine(
        stand_in_judge(
            judge,
            chat,
            lambda: MeteringDecisionModel(
                model=DECISION_MODEL,
                decide=lambda _text, _rule: False,
                counter=counter,
            ),
        ),
        max_concurrency=in_flight,
    )
    dry_executor = (
        None
        if executor is None
        else ActionOnlyExecutor(
            llm=chat().answering(executor_answers(executor.template)),
            template=executor.template,
            temperature=executor.temperature,
        )
    )
    judging, executing = UsageCounter(), UsageCounter()
    inputs = pairs = stored = 0
    for text in texts:
        inputs += 1
        plan = engine.plan(text, rules, options, record=False)
        known = await judge.arecall(plan.query, plan.candidates)  # the run's cache
        pairs += len(plan.candidates)
        stored += len(known)
        todo = [rule for rule in plan.candidates if rule.rule_id not in known]
        if todo:
            with judging.counting():
                await dry.ajudge_rules(plan, rules=todo)
        if dry_executor is not None:
            await dry_executor.ainvoke(
                {"input": plan.query, "rules": plan.candidates},
                executing.watch(),
            )
    usage = judging.usage + executing.usage
    decided = DECISION_MODEL in judging.usage_metadata
    notes = [DECISION_NOTE] if decided else []
    if executor is not None:
        notes.append(
            "executor prompts counted with every candidate rule's action (an upper "
            "bound: the matches are known only after judging)"
        )
    if caching is not None:
        notes.append(
            f"cached input estimated: prefixes of {caching.min_tokens}+ tokens shared "
            f"with an earlier request, {in_flight} in flight"
        )
    return BulkEstimate(
        inputs=inputs,
        judge_calls=judging.calls,
        judgments=pairs,
        cached_verdicts=stored,
        executor_calls=executing.calls,
        usage=usage,
        dollars=None if prices is None else prices.cost(usage),
        batch_dollars=None if prices is None else prices.cost(usage, batch=True),
        token_counter=counter.name,
        notes=notes,
    )
