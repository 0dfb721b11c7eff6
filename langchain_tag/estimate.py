"""What a run would spend, counted without calling a model.

`estimate_bulk` prices a bulk run (`tag run --inputs ... --estimate`): each input is
planned by the engine itself and each judge call rendered with the judge's own
prompt, its tokens counted (`token_counter`); the answers are a NO per judgment and
a typical answer per execution template (`EXECUTOR_ANSWERS`). The meter, the costs
and the answers are shared with the evaluation harness's estimate of its methods
(`langchain_tag_experiments.evaluation.estimate`), which walks more kinds of retrieval.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from langchain_tag.engine import MatchEngine, MatchOptions
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge, DecisionJudge
from langchain_tag.matching.profiles import RuleSchemaProfile
from langchain_tag.rules import Rule
from langchain_tag.usage import (
    DEFAULT_CACHING,
    PromptCaching,
    SimulatedPromptCache,
    TokenCounter,
    TokenPrices,
    TokenUsage,
    decision_request_tokens,
    token_counter,
)

__all__ = ["BulkEstimate", "estimate_bulk"]


# --- Answers, as their tokens are estimated -------------------------------------------

JUDGE_NO_REASON = "The scenario states no fact that meets the rule's condition."
"""The one-sentence reason of an estimated NO, for profiles that ask for one."""

_NBA_RATIONALE = (
    "Team A's payroll after the trade is $182,400,000, above the first apron of "
    "$178,132,000, so it may not take back more than 100% of the outgoing salary; "
    "Operation B brings in $14,200,000 for $11,000,000 out, which breaks that limit."
)
_NPOV_REASONING = (
    "Removed the loaded adjective and attributed the opinion to the source the "
    "sentence already names."
)
_CODE_BODY = """\
    result = []
    for index, value in enumerate(values):
        if value is not None and value > threshold:
            result.append(index)
    return result
"""

EXECUTOR_ANSWERS: dict[str, str] = {
    "nba": json.dumps(
        {
            "answer": True,
            "illegal_operation": "B",
            "problematic_team": "A",
            "rationale": _NBA_RATIONALE,
        }
    ),
    "npov": f"Applied rules: NPOV-001, NPOV-002\nReasoning: {_NPOV_REASONING}\n"
    "Rewrite: {input}",
    "code": "{input}\n" + _CODE_BODY,
    "generic": "{input}",
}
"""A typical answer per execution template (by `ExecutionTemplate.name`), its
`{input}` replaced by the executor's input: the executor's output tokens are this
answer's. NBA: the verdict with a two-sentence rationale; NPOV: two rules, a
sentence of reasoning and the sentence rewritten; code: the prompt's function
with a five-line body; other templates: the input returned as long as it came."""


def judge_no(profile: RuleSchemaProfile, rules: Sequence[Rule]) -> str:
    """A judge's NO to `rules` in the profile's format (a batch for several).

    The format's fields in its order: a rationale's reason comes first.
    """
    values = {"applicable": False, "verdict": "NO", "reason": JUDGE_NO_REASON}
    answer: dict[str, Any] = {
        name: values[name]
        for name in profile.output_schema.model_fields
        if name in values
    }
    if len(rules) == 1:
        return json.dumps(answer)
    return json.dumps({"verdicts": [{"rule_id": r.rule_id, **answer} for r in rules]})


def executor_answer(template: str, text: str) -> str:
    answer = EXECUTOR_ANSWERS.get(template, EXECUTOR_ANSWERS["generic"])
    return answer.replace("{input}", text)


# --- Counting requests ---------------------------------------------------------------


@dataclass
class Cost:
    """Calls and tokens, summed over inputs."""

    calls: int = 0
    """Model calls."""
    lookups: int = 0
    """Judgments the oracle answers: not calls (no tokens, no dollars)."""
    bounded_calls: int = 0
    """Of `calls`, those counted as an upper bound (the cascade's strong stage)."""
    input_tokens: int = 0
    cached_input_tokens: int = 0
    """Of `input_tokens`, those read from a provider's prompt cache."""
    output_tokens: int = 0
    decision_requests: int = 0
    """Of `calls` and `lookups`, decision requests (a decision model's, or the
    decision oracle's): input tokens only, none read from a prompt cache."""

    def add(self, other: Cost) -> None:
        for item in dataclasses.fields(self):
            name = item.name
            setattr(self, name, getattr(self, name) + getattr(other, name))


Role = Literal["judge", "cheap judge", "executor"]
"""The model a call goes to: each has its own prompt cache at the provider."""


class Meter:
    """Counts a method's requests: their tokens, and those a prompt cache serves.

    One simulated provider cache per model (the cascade's cheap judge is another
    model than its strong one); the grader is the judge model, as in the run.
    """

    def __init__(
        self,
        counter: TokenCounter,
        caching: PromptCaching | None,
        in_flight: int,
        keep: int | None = None,
    ) -> None:
        self.counter = counter
        self.caching = caching
        self.in_flight = in_flight
        self.keep = keep
        self.caches: dict[Role, SimulatedPromptCache] = {}

    def request(self, role: Role, messages: Sequence[BaseMessage], answer: str) -> Cost:
        """One call sending `messages` and answered `answer`."""
        cache = None
        if self.caching is not None:
            cache = self.caches.get(role)
            if cache is None:
                cache = self.caches[role] = SimulatedPromptCache(
                    self.caching,
                    self.counter.count,
                    in_flight=self.in_flight,
                    keep=self.keep,
                )
        usage = self.counter.request(messages, answer, cache)
        return Cost(
            calls=1,
            input_tokens=usage.input_tokens or 0,
            cached_input_tokens=usage.cached_input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
        )


def decision_cost(
    counter: TokenCounter,
    judge: DecisionJudge,
    text: str,
    rules: Sequence[Rule],
    ask: Callable[[Rule], bool],
    *,
    lookup: bool = False,
) -> Cost:
    """Requests and input tokens of `judge` asking the `rules` of `text` `ask` keeps.

    As the judge asks them: the rules not cached, in requests of
    `questions_per_request` (`call_units`), each billed for its input only: the
    text once and each question as sent (`decision_request_tokens`); no output
    tokens, none cached. With `lookup` (an evaluation's oracle) the requests are
    look-ups, their tokens counted as a decision model's.
    """
    cost = Cost()
    oracle = lookup
    for unit in judge.call_units([rule for rule in rules if ask(rule)]):
        cost.add(
            Cost(
                calls=0 if oracle else 1,
                lookups=1 if oracle else 0,
                input_tokens=decision_request_tokens(
                    counter.count, text, [judge.question(rule) for rule in unit]
                ),
                decision_requests=1,
            )
        )
    return cost


def judge_cost(
    meter: Meter,
    judge: ApplicabilityJudge,
    text: str,
    rules: Sequence[Rule],
    ask: Callable[[Rule], bool],
    *,
    bounded: bool = False,
    lookup: bool = False,
) -> Cost:
    """Calls and tokens of `judge` judging the `rules` of `text` that `ask` keeps.

    Split into calls as the judge splits them (`call_units`: `rules_per_call` at
    a time); a unit left with one rule to ask is judged alone, as `_judge_unit`
    does. Each answer is a NO (`judge_no`); with `lookup` (an evaluation's
    oracle) they are look-ups: no call, no tokens.
    """
    cost = Cost()
    oracle = lookup
    cheap = getattr(judge.llm, "role", "") == "cheap judge"
    role: Role = "cheap judge" if cheap else "judge"
    for unit in judge.call_units(rules):
        asked = [rule for rule in unit if ask(rule)]
        if not asked:
            continue
        if oracle:  # a look-up in the gold labels: no call, no tokens
            cost.lookups += 1
            continue
        cost.bounded_calls += bounded
        messages = (
            judge.messages(text, asked[0])
            if len(asked) == 1
            else judge.batch_messages(text, asked)
        )
        cost.add(meter.request(role, messages, judge_no(judge.asked_profile, asked)))
    return cost


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
    prefilter's partition and shadow draws), so the pairs counted are the run's;
    pairs already in the judge's verdict cache, and pairs repeated across inputs,
    cost nothing. Judge calls and their input tokens are exact (first attempts
    succeeding); output tokens are a NO each. A decision judge's requests
    (`DecisionJudge`) are counted as the provider bills them: input tokens only,
    none cached. The executor's prompt is counted with every candidate rule's
    action, an upper bound: which rules match is known only after judging.

    Raises:
        ValueError: The engine's judge is neither an `ApplicabilityJudge` nor a
            `DecisionJudge`.
    """
    judge = engine.judge
    if not isinstance(judge, ApplicabilityJudge | DecisionJudge):
        msg = (
            f"a bulk estimate walks an ApplicabilityJudge's calls or a "
            f"DecisionJudge's requests; a {type(judge).__name__} decides which "
            "calls it makes while judging."
        )
        raise ValueError(msg)  # noqa: TRY004 - an option the caller chose
    counter = token_counter()
    # Bounded: a provider keeps prefixes minutes, and a corpus's prompts would not
    # fit in memory (20,000 inputs x 9 rules held 560 MB unbounded).
    meter = Meter(counter, caching, in_flight, keep=_BULK_CACHE_KEEP)
    judged, execution = Cost(), Cost()
    seen: set[str] = set()
    inputs = pairs = stored_pairs = 0
    for text in texts:
        inputs += 1
        plan = engine.plan(text, rules, options, record=False)
        keys = {rule.rule_id: judge.cache_key(text, rule) for rule in plan.candidates}
        cache = judge.cache
        values = cache.mget(list(keys.values())) if cache is not None and keys else []
        # No cache (or no candidate): no values, nothing stored.
        stored = {
            key
            for key, value in zip(keys.values(), values, strict=False)
            if value is not None
        }
        pairs += len(keys)
        stored_pairs += len(stored)

        def ask(
            rule: Rule, keys: Mapping[str, str] = keys, stored: set[str] = stored
        ) -> bool:
            key = keys[rule.rule_id]
            if key in stored or key in seen:
                return False
            seen.add(key)
            return True

        judged.add(
            judge_cost(meter, judge, plan.query, plan.candidates, ask)
            if isinstance(judge, ApplicabilityJudge)
            else decision_cost(counter, judge, plan.query, plan.candidates, ask)
        )
        if executor is not None:
            execution.add(
                meter.request(
                    "executor",
                    executor.messages(plan.query, plan.candidates),
                    executor_answer(executor.template.name, plan.query),
                )
            )
    total = Cost()
    total.add(judged)
    total.add(execution)
    usage = TokenUsage(
        calls=total.calls,
        input_tokens=total.input_tokens,
        cached_input_tokens=total.cached_input_tokens,
        output_tokens=total.output_tokens,
    )
    notes = [DECISION_NOTE] if judged.decision_requests else []
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
        judge_calls=judged.calls,
        judgments=pairs,
        cached_verdicts=stored_pairs,
        executor_calls=execution.calls,
        usage=usage,
        dollars=None if prices is None else prices.cost(usage),
        batch_dollars=None if prices is None else prices.cost(usage, batch=True),
        token_counter=counter.name,
        notes=notes,
    )
