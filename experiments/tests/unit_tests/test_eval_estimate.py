"""`tag eval --estimate`: calls and tokens worked out without calling a model.

The estimate is checked against runs of the same methods under deterministic
fakes: the calls they receive, and the input tokens they report (each fake counts
the messages it is sent with the estimate's own counter, as a provider counts
what it bills; the fake decision model counts ~4 characters a token, so its runs
are compared with the estimate's counter without tiktoken). A tiny in-memory task
runs on a fresh clone; the NBA test runs on the real data when it is present.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_tag_experiments.evaluation.estimate import (
    JUDGE_NO_REASON,
    MethodEstimate,
    estimate_methods,
    estimate_table,
    token_counter,
)
from langchain_tag_experiments.evaluation.methods import (
    Family,
    Method,
    MethodContext,
    select_methods,
    standard_methods,
)
from langchain_tag_experiments.evaluation.runner import EvalResult, aevaluate
from langchain_tag_experiments.evaluation.tasks import (
    EvalItem,
    EvalTask,
    ItemOutcome,
    UnitKind,
    load_task,
)

from langchain_tag import Rule, Rulebook
from langchain_tag.execution import NBA_TEMPLATE
from langchain_tag.matching import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    ApplicabilityJudge,
    RuleSchemaProfile,
)
from langchain_tag.matching.decision import DecisionJudge
from langchain_tag.matching.prompts import read_judge_message
from langchain_tag.testing import (
    HashingFakeEmbeddings,
    RuleAwareFakeChatModel,
    ScriptedFakeChatModel,
)
from langchain_tag.testing.decisions import RuleAwareFakeDecisionModel
from langchain_tag.usage import PromptCaching, TokenPrices

COUNTER = token_counter()


def metered(messages: Sequence[BaseMessage], result: ChatResult) -> ChatResult:
    """`result` with the usage a provider reports: tokens by the estimate's counter."""
    message = result.generations[0].message
    if isinstance(message, AIMessage):
        input_tokens = COUNTER.messages(messages)
        output_tokens = COUNTER.count(message.text)
        message.usage_metadata = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        message.response_metadata["model_name"] = "metered-fake"
    return result


class Metered(ScriptedFakeChatModel):
    """Reports the usage of each call, as `metered` counts it."""

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return metered(messages, super()._generate(messages, stop, run_manager))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return metered(messages, await super()._agenerate(messages, stop, run_manager))


class MeteredJudge(Metered, RuleAwareFakeChatModel):
    """The rule-aware fake judge (YES when a backticked fragment is in the input)."""


class MeteredExecutor(Metered):
    """An NBA executor fake: a verdict that depends on the guidance it was given."""

    def _fault_key(self, prompt: str) -> str:
        return ""

    def _answer(self, prompt: str) -> AIMessage:
        if read_judge_message(prompt) is not None:
            msg = "the executor fake was sent a judge prompt"
            raise AssertionError(msg)
        guided = "<guidance>\n(none)\n</guidance>" not in prompt
        verdict = {
            "answer": guided,
            "illegal_operation": "A" if guided else None,
            "problematic_team": "B" if guided else None,
            "rationale": f"{prompt.count('[')} guidance items read.",
        }
        return AIMessage(json.dumps(verdict))


# --- A tiny task, in memory --------------------------------------------------------

WORDS = ("sign-and-trade", "mid-level", "rookie", "bird", "minimum", "draft pick")
RULEBOOK = Rulebook.from_rules(
    [
        Rule(
            rule_id=f"R-{n}",
            name=f"{word} rule",
            condition=f"The scenario involves `{word}`",
            action=f"Check the {word} limits.",
            tags=("salary",),
        )
        for n, word in enumerate(WORDS, 1)
    ]
)
TEXTS: tuple[tuple[str, set[str]], ...] = (
    ("Team A makes a sign-and-trade with a rookie.", {"R-1", "R-3"}),
    ("Team B uses the mid-level exception on a player with bird rights.", {"R-2"}),
    ("Team C signs a minimum contract and trades a draft pick.", {"R-5", "R-6"}),
    ("Team D waives a veteran before the deadline.", set()),
)


@dataclass(eq=False, repr=False)
class TinyTask(EvalTask):
    """NBA-shaped: the NBA template; graded by the grading model if `graded`."""

    name = "nba"
    template = NBA_TEMPLATE

    graded: bool = field(default=False, kw_only=True)

    def grading_prompts(self, item: EvalItem) -> list[list[BaseMessage]]:
        if not self.graded or self.grading_model is None:
            return []
        return [[HumanMessage(f"Grade the verdict on: {item.text}")]]

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        for prompt in self.grading_prompts(item):
            assert self.grading_model is not None
            await self.grading_model.ainvoke(prompt, config)
        return {}

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        return {}, []


def tiny_task(texts: Sequence[tuple[str, set[str]]] = TEXTS, **kw: Any) -> TinyTask:
    document = "\n\n".join(
        f"Article {n}. A team using the {word} rule must follow it. " * 4
        for n, word in enumerate(WORDS, 1)
    )
    return TinyTask(
        [
            EvalItem(f"p{n}", text, frozenset(gold), None, task_input=f"{text}\n\nCap.")
            for n, (text, gold) in enumerate(texts)
        ],
        rulebook=RULEBOOK,
        documents=[Document(document, metadata={"source": "cba"})],
        **kw,
    )


def methods_of(task: EvalTask, patterns: Sequence[str]) -> list[Method]:
    rules = len(task.rulebook.rules) if task.rulebook else None
    return select_methods(standard_methods(task.name, rules), patterns)


def estimate(
    task: EvalTask, patterns: Sequence[str], **options: Any
) -> list[MethodEstimate]:
    settings: dict[str, Any] = {
        "judge": True,
        "cheap_judge": True,
        "executor": True,
        "embeddings": HashingFakeEmbeddings(),
    } | options
    return estimate_methods(task, methods_of(task, patterns), **settings)


async def run(
    task: EvalTask, patterns: Sequence[str], *, executor: bool, **options: Any
) -> list[EvalResult]:
    return await aevaluate(
        task,
        methods=patterns,
        judge_model=MeteredJudge(),
        cheap_judge_model=MeteredJudge(logprobs=True, confidence=0.95),
        executor_model=MeteredExecutor() if executor else None,
        embeddings=HashingFakeEmbeddings(),
        **options,
    )


EXACT_PROMPTS: frozenset[Family] = frozenset(
    {"none", "all", "similarity", "prefilter", "oracle"}
)
"""Families whose executor prompts the estimate knows exactly (no model selects)."""


def check(
    results: Sequence[EvalResult],
    estimates: Sequence[MethodEstimate],
    *,
    exact_tokens: frozenset[Family],
) -> None:
    """The estimate's calls equal the run's; its input tokens too where exact."""
    assert [e.method for e in estimates] == [r.method for r in results]
    for result, found in zip(results, estimates, strict=True):
        assert (found.method, found.status) == (result.method, result.status)
        if result.status == "skipped":
            continue
        assert result.failures == 0, result.first_error
        assert found.n == result.n
        assert found.executor_calls == result.executor_calls, found.method
        assert found.grader_calls == result.grader_calls, found.method
        # The oracle's judgments are look-ups, in both, not calls.
        assert found.oracle_lookups == result.oracle_lookups, found.method
        made = result.llm_calls - result.executor_calls
        if result.family == "cascade":
            # The strong stage is counted for every pair: an upper bound.
            assert not found.exact_calls
            assert found.judge_calls >= made
            assert (found.input_tokens or 0) >= (result.input_tokens or 0)
            continue
        # Grader calls are a bound (a grader may skip an answer); here all are made.
        assert found.exact_calls or found.grader_calls, found.notes
        assert found.judge_calls == made, found.method
        assert found.calls == result.llm_calls + result.grader_calls
        if result.family in exact_tokens:
            assert found.input_tokens == (result.input_tokens or 0), found.method


# --- The estimate against fake runs -----------------------------------------------

TINY_METHODS = (
    "m0-*",
    "m1-*",
    "m2-chunks-k5",
    "rules-sim",
    "prefilter-*",
    "tag",
    "tag+*",
    "tag-b5",
    "tag-cascade",
    "relevance-reranker",
    "chunks+applicability",
    "llm-chain-filter-*",
    "oracle*",
)


async def test_estimate_equals_a_fake_run_with_an_executor() -> None:
    task = tiny_task()
    results = await run(task, TINY_METHODS, executor=True, rules_sim_k=3)
    found = estimate(task, TINY_METHODS, rules_sim_k=3)
    assert all(r.status == "ok" for r in results)
    check(results, found, exact_tokens=EXACT_PROMPTS)
    by_name = {e.method: e for e in found}
    assert by_name["tag"].judge_calls == len(TEXTS) * len(RULEBOOK)
    # Five rules in one call, then the sixth alone.
    assert by_name["tag-b5"].judge_calls == len(TEXTS) * 2
    assert "oracle look-ups" in " ".join(by_name["oracle"].notes)
    assert (by_name["oracle"].judge_calls, by_name["oracle"].oracle_lookups) == (
        0,
        len(TEXTS) * len(RULEBOOK),
    )
    assert "gold rules" in " ".join(by_name["tag"].notes)


async def test_judge_tokens_equal_a_fake_run_without_an_executor() -> None:
    task = tiny_task()
    judged = ("tag*", "relevance-reranker", "chunks+applicability", "llm-chain-*")
    results = await run(task, judged, executor=False)
    found = estimate(task, judged, executor=False)
    families: frozenset[Family] = frozenset(
        {"tag", "reranker", "applicability", "llm-filter"}
    )
    check(results, found, exact_tokens=families)
    assert all(e.executor_calls == 0 for e in found)


async def test_grader_calls_are_counted_when_the_executor_runs() -> None:
    task = tiny_task(graded=True)
    results = await run(task, ["m0-*", "tag"], executor=True)
    found = estimate(task, ["m0-*", "tag"])
    check(results, found, exact_tokens=frozenset())
    assert [e.grader_calls for e in found] == [len(TEXTS)] * 2
    # Without an executor nothing is graded; without a judge model no grader.
    assert estimate(task, ["m0-*"], executor=False)[0].grader_calls == 0
    assert estimate(task, ["m0-*"], judge=False)[0].grader_calls == 0


async def test_repeated_inputs_hit_the_verdict_cache() -> None:
    texts = [*TEXTS[:2], TEXTS[0]]
    task = tiny_task(texts)
    # One input at a time, so the repeat finds its verdicts cached.
    results = await run(task, ["tag"], executor=False, max_concurrency=1)
    [found] = estimate(task, ["tag"], executor=False)
    assert found.judge_calls == results[0].llm_calls == 2 * len(RULEBOOK)
    assert not found.exact_calls
    assert "cached" in " ".join(found.notes)


@pytest.mark.requires_data
async def test_estimate_equals_a_fake_run_on_nba(data_dir: Any) -> None:
    task = load_task("nba", data_dir).limited(4)
    patterns = (
        "m0-*",
        "m1-*",
        "m2-chunks-k5",
        "rules-sim",
        "prefilter-*",
        "tag",
        "tag+*",
        "tag-b5",
        "tag-cascade",
        "relevance-reranker",
        "llm-chain-filter-*",
        "oracle*",
    )
    results = await run(task, patterns, executor=True, rules_sim_k=10)
    check(results, estimate(task, patterns, rules_sim_k=10), exact_tokens=EXACT_PROMPTS)
    judged = ("tag", "tag-b5", "relevance-reranker", "llm-chain-filter-*")
    results = await run(task, judged, executor=False)
    found = estimate(task, judged, executor=False)
    check(results, found, exact_tokens=frozenset({"tag", "reranker", "llm-filter"}))
    assert found[0].judge_calls == 4 * len(task.rulebook or ())


DECIDED = ("tag-decision", "oracle-decision")


def without_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count ~4 characters a token, as the fake decision model does."""
    monkeypatch.setitem(sys.modules, "tiktoken", None)


@pytest.mark.requires_data
async def test_decision_estimate_equals_a_fake_run_on_nba(
    data_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = load_task("nba", data_dir).limited(4)
    decisions = RuleAwareFakeDecisionModel()
    results = await run(
        task, [*DECIDED, "oracle"], executor=True, decision_model=decisions
    )
    found = estimate(task, [*DECIDED, "oracle"], decision=True)
    # The oracle's and the executor's tokens are both counted by COUNTER.
    check(results, found, exact_tokens=frozenset({"oracle"}))
    by_name = {e.method: e for e in found}
    # An input's 55 rules in one request: one request (or look-up) per problem.
    assert by_name["tag-decision"].judge_calls == decisions.calls == 4
    assert by_name["oracle-decision"].oracle_lookups == 4
    assert by_name["oracle"].oracle_lookups == 4 * len(task.rulebook or ())
    # The same picks, so the same executor prompts; the decision oracle adds the
    # tokens of its requests, the chat oracle none.
    assert by_name["oracle-decision"].executor_calls == by_name["oracle"].executor_calls
    assert by_name["oracle-decision"].input_tokens > by_name["oracle"].input_tokens
    without_tiktoken(monkeypatch)
    results = await run(
        task, DECIDED, executor=False, decision_model=RuleAwareFakeDecisionModel()
    )
    found = estimate(task, DECIDED, executor=False, decision=True)
    check(results, found, exact_tokens=frozenset({"tag", "oracle"}))
    assert [e.input_tokens for e in found] == [r.input_tokens for r in results]
    assert all(e.output_tokens == e.cached_input_tokens == 0 for e in found)


async def test_decision_estimate_equals_a_fake_decision_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_tiktoken(monkeypatch)
    task = tiny_task()
    decisions = RuleAwareFakeDecisionModel()
    results = await run(task, DECIDED, executor=False, decision_model=decisions)
    found = estimate(task, DECIDED, executor=False, decision=True)
    check(results, found, exact_tokens=frozenset({"tag", "oracle"}))
    tag, oracle = found
    # One request per input: its six rules are six questions of one request.
    assert tag.judge_calls == decisions.calls == len(TEXTS)
    assert [len(names) for _, names in decisions.requests] == [len(RULEBOOK)] * 4
    assert (oracle.judge_calls, oracle.oracle_lookups) == (0, len(TEXTS))
    # What both reported: the fake's count of what it was sent, and the oracle's
    # count of what it would have been sent, the same requests.
    assert tag.input_tokens == oracle.input_tokens == results[0].input_tokens
    assert tag.input_tokens == results[1].input_tokens
    assert (tag.output_tokens, tag.cached_input_tokens) == (0, 0)
    assert "decision requests: input tokens only" in " ".join(tag.notes)
    assert "what a decision model would be sent" in " ".join(oracle.notes)


def test_a_decision_request_costs_its_input_once_and_each_question() -> None:
    task = tiny_task(TEXTS[:1])
    [found] = estimate(task, ["tag-decision"], executor=False, decision=True)
    judge = DecisionJudge(model=RuleAwareFakeDecisionModel())
    expected = COUNTER.count(task.items[0].text)
    for rule in RULEBOOK.rules:
        # As OpenAIClassifier sends a Noul: its criteria appended as text.
        question = judge.question(rule)
        assert question.criteria is not None
        expected += COUNTER.count(
            f"{question.instructions}\n\nAnswer true if: {question.criteria.true}"
            f"\nAnswer false if: {question.criteria.false}"
        )
    assert (found.judge_calls, found.calls) == (1, 1)
    assert found.input_tokens == expected
    assert (found.output_tokens, found.cached_input_tokens) == (0, 0)
    prices = TokenPrices(input=0.15, output=0.60)
    [priced] = estimate(
        task, ["tag-decision"], executor=False, decision=True, prices=prices
    )
    assert priced.dollars == pytest.approx(expected * 0.15 / 1e6)


def test_without_a_decision_model_tag_decision_is_skipped() -> None:
    found = {e.method: e for e in estimate(tiny_task(), DECIDED)}
    assert found["tag-decision"].status == "skipped"
    assert "pass --decision-model NAME" in (found["tag-decision"].skip_reason or "")
    # The oracle needs no model: it is estimated all the same.
    assert found["oracle-decision"].status == "ok"


# --- Pieces -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "no"),
    [
        (CONDITION_PROFILE, {"verdict": "NO"}),
        (NBA_PROFILE, {"applicable": False, "reason": JUDGE_NO_REASON}),
    ],
)
def test_one_judge_call_costs_its_rendered_messages(
    profile: RuleSchemaProfile, no: dict[str, Any]
) -> None:
    rule = RULEBOOK.rules[0]
    task = tiny_task([("Team A makes a sign-and-trade.", set())], profile=profile)
    task.rulebook = Rulebook.from_rules([rule])
    [found] = estimate(task, ["tag"], executor=False)
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), profile=profile)
    messages = judge.messages(task.items[0].text, rule)
    assert found.judge_calls == found.calls == 1
    assert found.input_tokens == COUNTER.messages(messages)
    assert COUNTER.messages(messages) == (
        sum(COUNTER.count(m.text) + 3 for m in messages) + 3
    )
    assert found.output_tokens == COUNTER.count(json.dumps(no))
    assert found.token_counter == COUNTER.name


class AsksTheJudge(BaseRetriever):
    """A retriever no estimate was written for: it asks the judge model itself."""

    context: MethodContext

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.context.judge().invoke(query, {"callbacks": run_manager.get_child()})
        return []


def test_a_method_no_estimate_knows_is_estimated_by_running_it() -> None:
    # No walker to teach: the method runs on the stand-ins, its calls counted.
    method = Method("mystery", "tag", "rules", lambda c: AsksTheJudge(context=c))
    [found] = estimate_methods(
        tiny_task(),
        [method],
        judge=True,
        cheap_judge=False,
        executor=False,
        embeddings=HashingFakeEmbeddings(),
    )
    assert found.status == "ok"
    assert found.judge_calls == found.calls == len(TEXTS)
    assert found.input_tokens == sum(
        COUNTER.messages([HumanMessage(text)]) for text, _ in TEXTS
    )


def test_dollars_follow_the_prices_list_and_batch() -> None:
    task = tiny_task()
    [free] = estimate(task, ["tag"])
    assert (free.dollars, free.batch_dollars) == (None, None)
    prices = TokenPrices(input=2.5, cached_input=1.25, output=10.0)
    [priced] = estimate(task, ["tag"], prices=prices, caching=SHORT_PREFIXES)
    fresh = priced.input_tokens - priced.cached_input_tokens
    assert priced.cached_input_tokens > 0
    assert priced.dollars == pytest.approx(
        (fresh * 2.5 + priced.cached_input_tokens * 1.25 + priced.output_tokens * 10)
        / 1e6
    )
    assert priced.dollars == prices.cost(priced.usage)
    assert priced.dollars is not None
    assert priced.batch_dollars == pytest.approx(priced.dollars / 2)


def test_oracle_judging_costs_nothing() -> None:
    task = tiny_task()
    prices = TokenPrices(input=1.0, output=1.0)
    [oracle] = estimate(task, ["oracle"], executor=False, prices=prices)
    # Before: the look-ups were counted as judge calls (free ones).
    assert (oracle.judge_calls, oracle.calls) == (0, 0)
    assert oracle.oracle_lookups == len(TEXTS) * len(RULEBOOK)
    assert (oracle.input_tokens, oracle.output_tokens, oracle.dollars) == (0, 0, 0.0)
    assert oracle.batch_dollars == 0.0


# --- Cached input tokens ------------------------------------------------------------

SHORT_PREFIXES = PromptCaching(min_tokens=32, block_tokens=16)
"""A provider caching short prefixes: the tiny task's prompts are cached."""


def test_short_prompts_are_not_cached_by_default() -> None:
    # The tiny task's prompts are far below OpenAI's 1,024 tokens.
    [found] = estimate(tiny_task(), ["tag"], executor=False)
    assert found.input_tokens > 0
    assert found.cached_input_tokens == 0


def common_prefix(left: str, right: str) -> str:
    size = next(
        (i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b),
        min(len(left), len(right)),
    )
    return left[:size]


def test_an_inputs_judgments_read_their_shared_prefix() -> None:
    task = tiny_task()
    [one] = estimate(
        task, ["tag"], executor=False, caching=SHORT_PREFIXES, max_concurrency=1
    )
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    prompts = [
        [judge.messages(item.text, rule) for rule in RULEBOOK.rules]
        for item in task.items
    ]
    assert one.input_tokens == sum(COUNTER.messages(m) for p in prompts for m in p)
    # One call at a time: every judgment after an input's first reads the
    # instructions and the input (what its prompts share before the rule), in
    # 16-token steps (one step less for the tokenizer's seams).
    later = len(RULEBOOK) - 1
    system = COUNTER.count(prompts[0][0][0].text)
    least = 0
    for first, second, *_ in prompts:
        before_rule = common_prefix(first[1].text, second[1].text)
        least += later * ((system + COUNTER.count(before_rule)) // 16 - 1) * 16
    assert least <= one.cached_input_tokens < one.input_tokens
    assert one.cached_input_tokens > len(TEXTS) * later * system  # not only these
    # Calls in flight cannot read each other: with all of an input's judgments
    # in flight at once, only prefixes sent before (the instructions) are read.
    [wave] = estimate(
        task,
        ["tag"],
        executor=False,
        caching=SHORT_PREFIXES,
        max_concurrency=len(RULEBOOK),
    )
    assert 0 < wave.cached_input_tokens < one.cached_input_tokens
    [none] = estimate(task, ["tag"], executor=False, caching=None)
    assert none.cached_input_tokens == 0


def test_methods_without_their_models_are_skipped_with_the_reason() -> None:
    found = {
        e.method: e
        for e in estimate(
            tiny_task(), ["m0-*", "tag", "tag-cascade"], judge=False, cheap_judge=False
        )
    }
    assert found["m0-no-retrieval"].status == "ok"
    for name in ("tag", "tag-cascade"):
        assert found[name].status == "skipped"
        assert "needs a judge model" in (found[name].skip_reason or "")
        assert (found[name].calls, found[name].input_tokens) == (0, 0)
    [cascade] = estimate(tiny_task(), ["tag-cascade"], cheap_judge=False)
    assert "cheap judge" in (cascade.skip_reason or "")


def test_rules_sim_takes_the_estimated_tag_picks() -> None:
    found = estimate(tiny_task(), ["tag", "rules-sim"])
    # TAG's estimated picks are the gold rules: 5 over 4 inputs.
    assert "k=1," in found[1].notes[0]


class UnlabelledTask(TinyTask):
    """Without gold labels: what a judge picks is unknown before judging."""

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        return None


def test_without_gold_the_executor_prompts_are_an_upper_bound() -> None:
    task = UnlabelledTask(
        tiny_task().items, rulebook=RULEBOOK, documents=tiny_task().documents
    )
    found = {
        e.method: e for e in estimate(task, ["m1-*", "tag", "rules-sim", "oracle"])
    }
    # Every candidate stands for TAG's picks: M1's prompts plus the judging.
    assert "upper bound" in " ".join(found["tag"].notes)
    assert found["tag"].input_tokens > found["m1-all-rules"].input_tokens
    assert "unknown before judging" in " ".join(found["rules-sim"].notes)
    assert found["oracle"].status == "skipped"


def test_the_table_totals_and_names_its_counter() -> None:
    prices = TokenPrices(input=1.0, cached_input=0.25, output=2.0)
    found = estimate(
        tiny_task(),
        ["m0-*", "tag", "tag-cascade"],
        prices=prices,
        caching=SHORT_PREFIXES,
    )
    found += estimate(tiny_task(), ["tag"], judge=False)
    table = estimate_table(found, prices=prices, caching=SHORT_PREFIXES)
    lines = table.splitlines()
    assert lines[0].startswith("| method | calls | judge calls |")
    assert (
        "| input tokens | cached input | output tokens | USD | USD batch |"
        in (lines[0])
    )
    total = next(line for line in lines if line.startswith("| **total**"))
    calls = sum(e.calls for e in found if e.status == "ok")
    assert f"≤ {calls:,}" in total  # the cascade's bound makes it one
    cached = sum(e.cached_input_tokens for e in found)
    batch = sum(e.batch_dollars or 0 for e in found)
    assert f"| {cached:,} |" in total
    assert f"${batch:.4f}" in total
    assert "3 of 4 methods estimated" in total
    assert "skipped: needs a judge model" in table
    assert COUNTER.name in table
    assert "upper bound" in table
    assert "in 16-token steps once that prefix reaches 32 tokens" in table
    assert "$0.25 per million cached input tokens" in table
    assert "batch: every price less 50%" in table


def test_tokens_are_approximated_without_tiktoken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    counter = token_counter()
    assert counter.name.startswith("~4 characters per token")
    assert counter.count("a" * 9) == 3
    [found] = estimate(tiny_task(), ["m0-*"])
    assert found.token_counter == counter.name
