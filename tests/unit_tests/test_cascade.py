"""CascadeJudge: confident cheap NOs are final, the rest goes to the strong judge."""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.errors import JudgmentError, UnreliableMatchWarning
from langchain_tag.matching import (
    ApplicabilityJudge,
    CascadeJudge,
    CascadeStats,
    Verdict,
)
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.testing import (
    CountingStore,
    NoisyJudgeFakeChatModel,
    RuleAwareFakeChatModel,
)

# Satisfies PEP8-IMPORT-WILDCARD and PEP8-NONE-IDENTITY; the other 7 rules are NOs.
QUERY = "from os import *\n\nif x == None:\n    pass\n"
MATCHED = ["PEP8-IMPORT-WILDCARD", "PEP8-NONE-IDENTITY"]
UNSURE = "PEP8-LAMBDA-ASSIGN"
"""A NO the cheap model is unsure of: P(YES) = 0.3."""


def cheap_model(
    make: Callable[..., RuleAwareFakeChatModel] = RuleAwareFakeChatModel,
    **kwargs: Any,
) -> RuleAwareFakeChatModel:
    """Right on every pair, P(answer) = 0.95, except 0.7 on `UNSURE`."""
    return make(
        logprobs=True, confidence=0.95, confidence_by_rule={UNSURE: 0.7}, **kwargs
    )


def cascade(
    cheap: RuleAwareFakeChatModel,
    strong: RuleAwareFakeChatModel,
    *,
    cheap_on_error: str = "raise",
    strong_on_error: str = "raise",
    **kwargs: Any,
) -> CascadeJudge:
    return CascadeJudge(
        cheap=ApplicabilityJudge(
            llm=cheap, logprobs=True, on_error=cheap_on_error, cache=None
        ),
        strong=ApplicabilityJudge(llm=strong, on_error=strong_on_error, cache=None),
        **kwargs,
    )


def judged_rule_ids(llm: RuleAwareFakeChatModel) -> set[str]:
    return {
        line.removeprefix("rule_id: ")
        for prompt in llm.prompts
        for line in prompt.splitlines()
        if line.startswith("rule_id: ")
    }


def by_rule(verdicts: list[Verdict]) -> dict[str, Verdict]:
    return {v.rule_id: v for v in verdicts}


def test_confident_nos_are_final_the_rest_is_escalated(
    pep8_rulebook: Rulebook,
) -> None:
    cheap, strong = cheap_model(), RuleAwareFakeChatModel()
    judge = cascade(cheap, strong)
    verdicts = by_rule(judge.judge_rules(QUERY, pep8_rulebook.rules))

    assert cheap.calls == 9
    # The two YESes and the unsure NO, and nothing else, reach the strong model.
    assert judged_rule_ids(strong) == {*MATCHED, UNSURE}
    assert strong.calls == 3
    for rule_id, verdict in verdicts.items():
        escalated = rule_id in {*MATCHED, UNSURE}
        assert verdict.decided_by == ("strong" if escalated else "cheap"), rule_id
        assert verdict.applies == (rule_id in MATCHED)
    assert verdicts["PEP8-BARE-EXCEPT"].score == pytest.approx(0.05)
    assert judge.stats == CascadeStats(
        cheap_calls=9, final_by_cheap=6, escalated_by={"yes": 2, "uncertain": 1}
    )
    assert judge.stats.escalated == judge.stats.strong_calls == 3
    assert judge.stats.strong_calls_saved == pytest.approx(6 / 9)


def test_the_strong_verdict_wins_over_a_cheap_yes(pep8_rulebook: Rulebook) -> None:
    # A cheap model that says YES to everything: all 9 pairs are escalated.
    cheap = NoisyJudgeFakeChatModel(
        logprobs=True, confidence=0.95, false_positive_rate=1.0
    )
    strong = RuleAwareFakeChatModel()
    judge = cascade(cheap, strong)
    verdicts = judge.judge_rules(QUERY, pep8_rulebook.rules)
    assert [v.rule_id for v in verdicts if v.applies] == MATCHED
    assert {v.decided_by for v in verdicts} == {"strong"}
    assert judge.stats.escalated_by == {"yes": 9}


@pytest.mark.parametrize(("threshold", "escalated"), [(0.29, 3), (0.31, 2), (0.04, 9)])
def test_the_threshold_decides_what_is_confident(
    pep8_rulebook: Rulebook, threshold: float, escalated: int
) -> None:
    judge = cascade(cheap_model(), RuleAwareFakeChatModel(), no_threshold=threshold)
    judge.judge_rules(QUERY, pep8_rulebook.rules)
    assert judge.stats.strong_calls == escalated


@pytest.mark.parametrize(
    ("unscored", "decided_by", "escalated_by"),
    [
        ("escalate", "strong", {"yes": 2, "uncertain": 1, "unscored": 1}),
        ("final", "cheap", {"yes": 2, "uncertain": 1}),
    ],
)
def test_unscored_nos_follow_the_policy(
    pep8_rulebook: Rulebook,
    unscored: str,
    decided_by: str,
    escalated_by: dict[str, int],
) -> None:
    # An answer without logprobs: a NO with no score.
    cheap = cheap_model(faults={"PEP8-BARE-EXCEPT": ['{"verdict": "NO"}']})
    judge = cascade(cheap, RuleAwareFakeChatModel(), unscored=unscored)
    verdicts = by_rule(judge.judge_rules(QUERY, pep8_rulebook.rules))
    assert verdicts["PEP8-BARE-EXCEPT"].decided_by == decided_by
    assert not verdicts["PEP8-BARE-EXCEPT"].applies
    assert judge.stats.escalated_by == escalated_by


@pytest.mark.parametrize("cheap_on_error", ["raise", "not_applicable"])
def test_failed_cheap_judgments_are_escalated_never_a_no(
    pep8_rulebook: Rulebook, cheap_on_error: str
) -> None:
    failing = "PEP8-NONE-IDENTITY"  # truly applicable: a silent NO would lose it
    cheap = cheap_model(faults={failing: [ValueError("boom")]})
    strong = RuleAwareFakeChatModel()
    judge = cascade(cheap, strong, cheap_on_error=cheap_on_error)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableMatchWarning)  # nothing is unjudged
        verdicts = by_rule(judge.judge_rules(QUERY, pep8_rulebook.rules))
    assert verdicts[failing].applies
    assert not verdicts[failing].failed
    assert verdicts[failing].decided_by == "strong"
    assert judge.stats.escalated_by == {"yes": 1, "uncertain": 1, "failed": 1}


def test_a_failed_strong_judgment_follows_the_strong_policy(
    pep8_rulebook: Rulebook,
) -> None:
    failing = "PEP8-IMPORT-WILDCARD"
    raising = cascade(
        cheap_model(), RuleAwareFakeChatModel(faults={failing: [ValueError("x")]})
    )
    with pytest.raises(JudgmentError, match=failing):
        raising.judge_rules(QUERY, pep8_rulebook.rules)

    flagging = cascade(
        cheap_model(),
        RuleAwareFakeChatModel(faults={failing: [ValueError("x")]}),
        strong_on_error="not_applicable",
    )
    with pytest.warns(UnreliableMatchWarning, match=failing):
        verdicts = by_rule(flagging.judge_rules(QUERY, pep8_rulebook.rules))
    assert verdicts[failing].failed
    assert verdicts[failing].decided_by == "strong"


async def test_async_judgments_decide_the_same(pep8_rulebook: Rulebook) -> None:
    sync_judge = cascade(cheap_model(), RuleAwareFakeChatModel())
    async_judge = cascade(cheap_model(), RuleAwareFakeChatModel())
    expected = sync_judge.judge_rules(QUERY, pep8_rulebook.rules)
    assert await async_judge.ajudge_rules(QUERY, pep8_rulebook.rules) == expected
    assert async_judge.stats == sync_judge.stats


async def test_single_pair_invoke(pep8_rulebook: Rulebook) -> None:
    judge = cascade(cheap_model(), RuleAwareFakeChatModel())
    rule = pep8_rulebook.rules[1]  # PEP8-IMPORT-WILDCARD
    assert judge.invoke((QUERY, rule)).decided_by == "strong"
    other = pep8_rulebook.rules[5]  # PEP8-BARE-EXCEPT
    assert (await judge.ainvoke((QUERY, other))).decided_by == "cheap"
    assert judge.stats.cheap_calls == 2
    judge.reset_stats()
    assert judge.stats == CascadeStats()


def test_stage_caches_count_as_calls(pep8_rulebook: Rulebook) -> None:
    cheap, strong = cheap_model(), RuleAwareFakeChatModel()
    judge = CascadeJudge(
        cheap=ApplicabilityJudge(llm=cheap, logprobs=True),
        strong=ApplicabilityJudge(llm=strong),
    )
    first = judge.judge_rules(QUERY, pep8_rulebook.rules)
    again = judge.judge_rules(QUERY, pep8_rulebook.rules)
    assert (cheap.calls, strong.calls) == (9, 3)  # the second run hit the caches
    assert all(v.cached for v in again)
    assert [v.decided_by for v in again] == [v.decided_by for v in first]
    assert judge.stats.cheap_calls == 18
    assert judge.stats.strong_calls == 6


class InFlight(BaseCallbackHandler):
    """Chat-model runs in progress across every model, their parents and names."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.parents: dict[uuid.UUID, uuid.UUID | None] = {}
        self.retriever_runs: list[uuid.UUID] = []
        self.chat_runs: dict[uuid.UUID, str] = {}
        self.stages: list[str] = []

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self.parents[run_id] = kwargs.get("parent_run_id")
        self.retriever_runs.append(run_id)

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.parents[run_id] = kwargs.get("parent_run_id")
            self.chat_runs[run_id] = kwargs.get("name") or ""
            self.stages.append(kwargs.get("metadata", {}).get("tag_judge_stage"))

    def on_llm_end(self, response: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        with self.lock:
            self.running -= 1

    def root_of(self, run_id: uuid.UUID) -> uuid.UUID:
        while (parent := self.parents.get(run_id)) is not None:
            run_id = parent
        return run_id


@pytest.mark.parametrize("use_async", [False, True])
def test_retriever_limit_bounds_both_stages_and_runs_nest(
    pep8_rulebook: Rulebook,
    overlapping: Callable[..., RuleAwareFakeChatModel],
    *,
    use_async: bool,
) -> None:
    # The cheap stage's calls wait until three are in flight: the bound is reached.
    cheap = cheap_model(functools.partial(overlapping, 3))
    strong = RuleAwareFakeChatModel()
    retriever = TAGRetriever(
        rulebook=pep8_rulebook, judge=cascade(cheap, strong), max_concurrency=3
    )
    handler = InFlight()
    queries = [QUERY, "x = 1", QUERY]
    config: RunnableConfig = {"callbacks": [handler]}
    if use_async:
        results = asyncio.run(retriever.abatch(queries, config))
    else:
        results = retriever.batch(queries, config)

    assert [[d.id for d in docs] for docs in results] == [MATCHED, [], MATCHED]
    assert (cheap.calls, strong.calls) == (27, 7)
    assert handler.peak == 3  # both models together, across the batch
    assert len(handler.chat_runs) == 34
    assert handler.stages.count("cheap") == 27
    assert handler.stages.count("strong") == 7
    assert {name.rsplit(":", 1)[-1] for name in handler.chat_runs.values()} == {
        "cheap",
        "strong",
    }
    assert "judge:PEP8-IMPORT-WILDCARD:strong" in handler.chat_runs.values()
    # Every model call of both stages belongs to one of the three retriever runs.
    assert len(handler.retriever_runs) == 3
    roots = {handler.root_of(run) for run in handler.chat_runs}
    assert roots == set(handler.retriever_runs)


def test_retriever_reports_which_stage_decided(pep8_rulebook: Rulebook) -> None:
    judge = cascade(cheap_model(), RuleAwareFakeChatModel())
    retriever = TAGRetriever.from_rulebook(pep8_rulebook, judge=judge)
    result = retriever.match(QUERY)
    assert [d.id for d in result.documents] == MATCHED
    decided = {v.rule_id: v.decided_by for v in result.verdicts}
    assert decided["PEP8-BARE-EXCEPT"] == "cheap"
    assert decided["PEP8-IMPORT-WILDCARD"] == "strong"
    assert result.prefix_share == judge.cheap.prefix_share(QUERY, pep8_rulebook.rules)


def test_query_graph_takes_a_cascade(pep8_rulebook: Rulebook) -> None:
    cheap, strong = cheap_model(), RuleAwareFakeChatModel()
    judge = cascade(cheap, strong)
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
        context=QueryContext(judge=judge),
    )
    assert [m["rule_id"] for m in output["matches"]] == MATCHED
    assert cheap.calls == 9
    # Three escalated judgments, then the executor (the strong judge's model).
    assert strong.calls == 4
    assert judge.stats.strong_calls == 3


def test_cache_key_covers_both_stages_and_the_settings(
    pep8_rulebook: Rulebook,
) -> None:
    rule = pep8_rulebook.rules[0]
    judge = cascade(cheap_model(), RuleAwareFakeChatModel())
    keys = {
        judge.cache_key(QUERY, rule),
        judge.cheap.cache_key(QUERY, rule),
        judge.strong.cache_key(QUERY, rule),
        cascade(cheap_model(), RuleAwareFakeChatModel(), no_threshold=0.2).cache_key(
            QUERY, rule
        ),
        cascade(cheap_model(), RuleAwareFakeChatModel(style="prose")).cache_key(
            QUERY, rule
        ),
    }
    assert len(keys) == 5
    assert judge.cache_key(QUERY, rule) == cascade(
        cheap_model(), RuleAwareFakeChatModel()
    ).cache_key(QUERY, rule)


def test_the_stages_own_the_single_judge_options() -> None:
    cheap = ApplicabilityJudge(llm=cheap_model(), logprobs=True)
    strong = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    with pytest.raises(ValueError, match="takes no logprobs, on_error: set them"):
        CascadeJudge(cheap=cheap, strong=strong, on_error="raise", logprobs=True)
    judge = CascadeJudge(cheap=cheap, strong=strong)
    assert judge.final_llm is strong.llm  # the executor's default model
    assert "cache" not in CascadeJudge.model_fields  # each stage caches its own


def test_a_cheap_judge_without_scores_needs_unscored_final() -> None:
    cheap = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    strong = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    with pytest.raises(ValueError, match=r"logprobs=False.*unscored='final'"):
        CascadeJudge(cheap=cheap, strong=strong)
    assert CascadeJudge(cheap=cheap, strong=strong, unscored="final").cheap is cheap


def test_verdicts_without_a_stage_still_load() -> None:
    verdict = Verdict.model_validate_json('{"rule_id": "R", "applies": true}')
    assert verdict.decided_by is None


def test_noisy_fake_errs_at_its_rates_repeatably() -> None:
    llm = NoisyJudgeFakeChatModel(
        truth=lambda text, fields: int(text) % 2 == 0,
        false_negative_rate=0.2,
        false_positive_rate=0.05,
        confidence=0.95,
        wrong_confidence=0.6,
    )
    fields = {"rule_id": "R"}
    answers = {n: llm._decide(str(n), fields) for n in range(4000)}
    positives = [answers[n] for n in range(0, 4000, 2)]
    negatives = [answers[n] for n in range(1, 4000, 2)]
    assert sum(not yes for yes, _ in positives) / 2000 == pytest.approx(0.2, abs=0.03)
    assert sum(yes for yes, _ in negatives) / 2000 == pytest.approx(0.05, abs=0.015)
    for n, (yes, confidence) in answers.items():
        right = yes == (n % 2 == 0)
        assert confidence == (0.95 if right else 0.6)
    again = NoisyJudgeFakeChatModel(
        truth=llm.truth, false_negative_rate=0.2, false_positive_rate=0.05
    )
    assert [again._decide(str(n), fields)[0] for n in range(100)] == [
        answers[n][0] for n in range(100)
    ]
    reseeded = llm.model_copy(update={"seed": 1})
    assert [reseeded._decide(str(n), fields)[0] for n in range(100)] != [
        answers[n][0] for n in range(100)
    ]


@pytest.mark.parametrize("use_async", [False, True])
def test_a_cached_query_is_two_lookups_and_no_call(
    pep8_rulebook: Rulebook, *, use_async: bool
) -> None:
    caches = (
        CountingStore(InMemoryVerdictCache()),
        CountingStore(InMemoryVerdictCache()),
    )
    cheap, strong = cheap_model(), RuleAwareFakeChatModel()
    judge = CascadeJudge(
        cheap=ApplicabilityJudge(llm=cheap, logprobs=True, cache=caches[0]),
        strong=ApplicabilityJudge(llm=strong, cache=caches[1]),
    )
    retriever = TAGRetriever(rulebook=pep8_rulebook, judge=judge)

    def match() -> Any:
        return (
            asyncio.run(retriever.amatch(QUERY))
            if use_async
            else retriever.match(QUERY)
        )

    first = match()
    calls = (len(cheap.prompts), len(strong.prompts))
    judge.reset_stats()
    for cache in caches:
        cache.calls.clear()
    again = match()
    assert [d.id for d in again.documents] == [d.id for d in first.documents]
    # The cheap stage's lookup, then the escalated pairs' in the strong stage's.
    assert [cache.calls["mget"] for cache in caches] == [1, 1]
    assert (len(cheap.prompts), len(strong.prompts)) == calls
    assert judge.stats.cheap_calls == len(pep8_rulebook.rules)
    assert {v.decided_by for v in again.verdicts} == {"cheap", "strong"}
