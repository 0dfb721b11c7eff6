"""`DecisionJudge`: TAG's judgment as one `Noul` per rule, many rules per request.

Through the real `OpenAIClassifier` over HTTP to the fake Decisions API, and through
the fake decision model directly. The fakes answer by backtick-quoted condition
fragments (`condition_holds`): stand-ins, not models.
"""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.decisions import ClassifierResponse, NoulAnswer
from langchain_core.exceptions import ModelRefusalError
from langchain_core.messages import HumanMessage
from langchain_openai.decisions import OpenAIClassifier

from langchain_tag import TAGRetriever
from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.engine import MatchEngine, MatchOptions
from langchain_tag.errors import JudgmentError, UnreliableMatchWarning
from langchain_tag.learning.verdict_log import open_verdict_log
from langchain_tag.matching.decision import (
    DecisionJudge,
    decision_criteria,
    question_names,
)
from langchain_tag.matching.judge import ApplicabilityJudge
from langchain_tag.matching.profiles import NBA_PROFILE
from langchain_tag.models import CallRetry
from langchain_tag.rules import Rule, Rulebook
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from langchain_tag.testing.decisions import (
    FakeDecisionsServer,
    RuleAwareFakeDecisionModel,
)
from langchain_tag.testing.server import Refusal
from langchain_tag.testing.stores import CountingStore

pytestmark = [
    pytest.mark.usefixtures("loopback"),  # the fake API, on 127.0.0.1
    pytest.mark.filterwarnings("ignore:The class `OpenAIClassifier` is in beta"),
]

RULES = trigger_rulebook(250)
TEXT = "This input carries trigger-003, trigger-201 and trigger-249."
MATCHED = ["R-003", "R-201", "R-249"]
QUICK = CallRetry(max_attempts=3, initial_delay=0.0, jitter=0.0)
AT_ONCE = Refusal(
    headers={"retry-after": "0", "retry-after-ms": "1"}, code="rate_limit_exceeded"
)


@pytest.fixture
def server() -> Iterator[FakeDecisionsServer]:
    with FakeDecisionsServer() as running:
        yield running


def classifier(server: FakeDecisionsServer) -> OpenAIClassifier:
    return OpenAIClassifier(
        model="gpt-6-luna", base_url=server.base_url, api_key="test"
    )


def _actions(rulebook: Rulebook) -> list[str]:
    return [rule.action for rule in rulebook.rules]


# --- one request per input per chunk, through the real client ---------------------


@pytest.mark.parametrize("use_async", [False, True])
def test_a_250_rule_rulebook_is_two_requests_with_probabilities_as_scores(
    server: FakeDecisionsServer, *, use_async: bool
) -> None:
    retriever = TAGRetriever(rulebook=RULES, llm=classifier(server), cache=None)
    assert isinstance(retriever.judge, DecisionJudge)
    result = asyncio.run(retriever.amatch(TEXT)) if use_async else retriever.match(TEXT)
    assert [d.id for d in result.documents] == MATCHED
    assert server.request_count == math.ceil(250 / 200)
    asked = [q["name"] for body in server.requests for q in body["questions"]]
    assert sorted(asked) == sorted(r.rule_id for r in RULES.rules)
    assert sorted(len(body["questions"]) for body in server.requests) == [50, 200]
    by_rule = {v.rule_id: v for v in result.verdicts}
    assert by_rule["R-003"].score == pytest.approx(0.93)
    assert by_rule["R-004"].score == pytest.approx(0.04)
    assert not by_rule["R-004"].applies
    assert [d.metadata["score"] for d in result.documents] == [0.93] * 3
    # The action is withheld from every request; the input is the state, once.
    for body in server.requests:
        assert body["input"] == TEXT
        assert not any(action in str(body) for action in _actions(RULES))
    assert result.usage is not None
    assert result.usage.calls == 2
    assert result.usage.output_tokens == 0


def test_questions_per_request_chunks_concurrently_under_the_bound(
    server: FakeDecisionsServer,
) -> None:
    retriever = TAGRetriever(
        rulebook=RULES,
        llm=classifier(server),
        questions_per_request=32,
        max_concurrency=3,
        cache=None,
    )
    result = retriever.match(TEXT)
    assert [d.id for d in result.documents] == MATCHED
    assert server.request_count == math.ceil(250 / 32)
    assert max(len(body["questions"]) for body in server.requests) == 32


def test_the_questions_carry_the_profile_s_judge_side_fields_only() -> None:
    rule = Rule(
        rule_id="NBA-1",
        name="Mid-level exception",
        condition="A team signs a player with the `mid-level exception`",
        action="Check the MLE amount against the apron",
        applies_when="A team uses the `mid-level exception`",
        constraint="At most the MLE amount",
        violation_check="Salary above the MLE",
        does_not_apply_to="Minimum contracts",
    )
    judge = DecisionJudge(model=RuleAwareFakeDecisionModel(), profile=NBA_PROFILE)
    question = judge.question(rule)
    assert "applies_when: A team uses the `mid-level exception`" in str(
        question.instructions
    )
    assert rule.action not in str(question.instructions)
    assert question.criteria == decision_criteria(NBA_PROFILE)
    assert "topic" not in str(question.criteria.false)  # the constraint profile's own
    verdict = judge.invoke(("We sign him with the mid-level exception.", rule))
    assert verdict.applies


# --- failures are never a silent NO ------------------------------------------------


def test_a_refused_question_keeps_the_other_answers() -> None:
    refusing = RuleAwareFakeDecisionModel(
        refuse=lambda _state, fields: fields.get("rule_id") == "R-201"
    )
    with FakeDecisionsServer(refusing) as server:
        retriever = TAGRetriever(
            rulebook=RULES,
            llm=classifier(server),
            on_error="not_applicable",
            cache=None,
        )
        with pytest.warns(UnreliableMatchWarning, match="R-201") as caught:
            result = retriever.match(TEXT)
    assert [d.id for d in result.documents] == ["R-003", "R-249"]
    assert result.failed_rule_ids == ["R-201"]
    failed = next(v for v in result.verdicts if v.rule_id == "R-201")
    assert failed.error is not None
    assert "refused" in failed.error
    assert caught[0].message.rule_ids == ("R-201",)  # type: ignore[union-attr]
    # OpenAIClassifier drops a refused request's answers: the rest are asked again.
    names = [{q["name"] for q in body["questions"]} for body in server.requests]
    assert len(names) == 3
    refused = next(asked for asked in names if "R-201" in asked)
    assert refused - {"R-201"} in names


def test_a_refusal_under_raise_names_the_rule_and_keeps_the_paid_answers() -> None:
    refusing = RuleAwareFakeDecisionModel(
        refuse=lambda _state, fields: fields.get("rule_id") == "R-003"
    )
    cache = CountingStore(InMemoryVerdictCache())
    judge = DecisionJudge(model=refusing, cache=cache, retry=QUICK)
    rules = RULES.rules[:10]
    with pytest.raises(JudgmentError, match="R-003") as raised:
        judge.judge_rules(TEXT, rules)
    assert raised.value.rule_id == "R-003"
    assert raised.value.unreadable
    # The nine answered rules were paid for: cached, not asked again.
    refusing_calls = refusing.calls
    judge_again = DecisionJudge(model=RuleAwareFakeDecisionModel(), cache=cache)
    verdicts = judge_again.judge_rules(TEXT, rules)
    assert sum(v.cached for v in verdicts) == 9
    assert refusing.calls == refusing_calls


def test_a_refusal_the_model_does_not_name_is_found_by_halving() -> None:
    class Unnamed(RuleAwareFakeDecisionModel):
        def _classify(self, state: Any, questions: Any) -> ClassifierResponse:
            try:
                return super()._classify(state, questions)
            except ModelRefusalError:  # the same refusal, names withheld
                msg = "The model refused to answer some questions."
                raise ModelRefusalError(msg) from None

    model = Unnamed(refuse=lambda _s, fields: fields.get("rule_id") == "R-005")
    judge = DecisionJudge(model=model, cache=None, on_error="not_applicable")
    with pytest.warns(UnreliableMatchWarning):
        verdicts = judge.judge_rules(TEXT, RULES.rules[:8])
    assert [v.rule_id for v in verdicts if v.failed] == ["R-005"]
    assert [v.rule_id for v in verdicts if v.applies] == ["R-003"]
    # 8, then 4 + 4, 2 + 2, 1 + 1 down the refused half: seven requests.
    assert model.calls == 7


def test_missing_or_extra_answers_fail_those_rules() -> None:
    class Sloppy(RuleAwareFakeDecisionModel):
        def _classify(self, state: Any, questions: Any) -> ClassifierResponse:
            answered = super()._classify(state, questions)
            answers = dict(answered.answers)
            answers.pop("R-001", None)
            return answered.model_copy(update={"answers": answers})

    judge = DecisionJudge(model=Sloppy(), cache=None, on_error="not_applicable")
    with pytest.warns(UnreliableMatchWarning):
        verdicts = judge.judge_rules(TEXT, RULES.rules[:4])
    assert [v.rule_id for v in verdicts if v.failed] == ["R-001"]
    assert [v.rule_id for v in verdicts if v.applies] == ["R-003"]

    class Extra(RuleAwareFakeDecisionModel):
        def _classify(self, state: Any, questions: Any) -> ClassifierResponse:
            answered = super()._classify(state, questions)
            answers = {**answered.answers, "R-999": NoulAnswer(type="noul", noul=1.0)}
            return answered.model_copy(update={"answers": answers})

    judge = DecisionJudge(model=Extra(), cache=None, on_error="raise")
    with pytest.raises(JudgmentError, match="not asked"):
        judge.judge_rules(TEXT, RULES.rules[:4])


def test_a_dropped_answer_over_http_fails_the_request_s_rules() -> None:
    with FakeDecisionsServer(drop_answers=lambda _body: {"R-002"}) as server:
        judge = DecisionJudge(
            model=classifier(server), cache=None, on_error="not_applicable"
        )
        with pytest.warns(UnreliableMatchWarning):
            verdicts = judge.judge_rules(TEXT, RULES.rules[:5])
    # OpenAIClassifier refuses the whole response: none of its answers is trusted.
    assert all(v.failed for v in verdicts)
    assert not any(v.applies for v in verdicts)


def test_a_rate_limit_is_retried_by_the_one_retry_layer() -> None:
    with FakeDecisionsServer(rate_limited=1, rate_limit=AT_ONCE) as server:
        judge = DecisionJudge(model=classifier(server), cache=None, retry=QUICK)
        assert judge._model.max_retries == 0  # type: ignore[attr-defined]
        verdicts = judge.judge_rules(TEXT, RULES.rules[:5])
    assert [v.rule_id for v in verdicts if v.applies] == ["R-003"]
    assert server.request_count == 2


def test_a_request_above_the_provider_s_limit_fails_clearly() -> None:
    with FakeDecisionsServer(max_questions=10) as server:
        judge = DecisionJudge(model=classifier(server), cache=None, retry=QUICK)
        with pytest.raises(JudgmentError, match="at most 10 questions"):
            judge.judge_rules(TEXT, RULES.rules[:20])
        # A 400 is not transient: asked once.
        assert server.request_count == 1
        fitted = judge.model_copy(update={"questions_per_request": 10})
        fitted = DecisionJudge(
            model=classifier(server), cache=None, questions_per_request=10
        )
        verdicts = fitted.judge_rules(TEXT, RULES.rules[:20])
    assert [v.rule_id for v in verdicts if v.applies] == ["R-003"]


# --- names, keys, thresholds ------------------------------------------------------


def test_question_names_are_safe_unique_and_map_back() -> None:
    rules = [
        Rule(rule_id=rule_id, name="n", condition="c `x`", action="a")
        for rule_id in ("R-1", "§ 4.2 (a)", "§ 4.2 (b)", "x" * 80)
    ]
    names = question_names(rules)
    assert names["R-1"] == "R-1"
    assert len(set(names.values())) == 4
    assert all(
        len(n) <= 64 and n.replace("-", "").replace("_", "").isalnum()
        for n in names.values()
    )
    judge = DecisionJudge(model=RuleAwareFakeDecisionModel(), cache=None)
    verdicts = judge.judge_rules("has x", rules)
    assert [v.rule_id for v in verdicts] == [r.rule_id for r in rules]
    assert all(v.applies for v in verdicts)


def test_decision_and_chat_verdicts_never_share_a_key() -> None:
    rule = RULES.rules[0]
    chat = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    decision = DecisionJudge(model=RuleAwareFakeDecisionModel())
    lower = DecisionJudge(model=RuleAwareFakeDecisionModel(), decision_threshold=0.2)
    keys = {j.cache_key(TEXT, rule) for j in (chat, decision, lower)}
    assert len(keys) == 3


def test_the_threshold_decides_applies_and_the_score_ranks() -> None:
    model = RuleAwareFakeDecisionModel(yes_probability=0.7, no_probability=0.3)
    strict = DecisionJudge(model=model, decision_threshold=0.8, cache=None)
    assert not any(v.applies for v in strict.judge_rules(TEXT, RULES.rules[:5]))
    loose = DecisionJudge(model=model, decision_threshold=0.25, cache=None)
    assert all(v.applies for v in loose.judge_rules(TEXT, RULES.rules[:5]))
    engine = MatchEngine(DecisionJudge(model=model, cache=None))
    result = engine.match(TEXT, RULES.rules[:10], MatchOptions(score_threshold=0.75))
    assert result.documents == []
    assert "score_threshold=0.75" in (result.reason or "")


# --- the engine: one cache read, the same results as the chat backend -------------


@pytest.mark.parametrize("use_async", [False, True])
def test_a_cached_query_is_one_lookup_and_no_request(
    server: FakeDecisionsServer, *, use_async: bool
) -> None:
    cache = CountingStore(InMemoryVerdictCache())
    retriever = TAGRetriever(rulebook=RULES, llm=classifier(server), cache=cache)

    def match() -> Any:
        return (
            asyncio.run(retriever.amatch(TEXT)) if use_async else retriever.match(TEXT)
        )

    first = match()
    assert cache.calls["mget"] == 1
    assert server.request_count == 2
    cache.calls.clear()
    again = match()
    assert cache.calls["mget"] == 1  # one lookup for all 250 rules
    assert server.request_count == 2  # no model call
    assert [d.id for d in again.documents] == [d.id for d in first.documents]
    assert all(v.cached for v in again.verdicts)
    assert again.usage is not None
    assert again.usage.calls == 0


@pytest.mark.parametrize("use_async", [False, True])
def test_the_chat_and_decision_backends_give_identical_results(
    *, use_async: bool
) -> None:
    rules = trigger_rulebook(12).rules
    chat = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), logprobs=True, cache=None)
    # The decision fake answers what the chat fake's logprobs say: 0.9 / 0.1.
    decision = DecisionJudge(
        model=RuleAwareFakeDecisionModel(yes_probability=0.9, no_probability=1 - 0.9),
        cache=None,
    )
    options = MatchOptions(k=2, score_threshold=0.5)
    texts = ["trigger-001 and trigger-007 and trigger-011", "nothing here", " "]
    for text in texts:
        results = []
        for judge in (chat, decision):
            engine = MatchEngine(judge)
            results.append(
                asyncio.run(engine.amatch(text, rules, options))
                if use_async
                else engine.match(text, rules, options)
            )
        kept = ("documents", "verdicts", "failed_rule_ids", "reason", "candidates")
        same = [r.model_dump(include=set(kept)) for r in results]
        assert same[0] == same[1]


def test_the_verdict_log_tells_decision_verdicts_apart(tmp_path: Any) -> None:
    log = open_verdict_log(tmp_path / "log.sqlite")
    judge = DecisionJudge(model=RuleAwareFakeDecisionModel(), verdict_log=log)
    judge.judge_rules(TEXT, RULES.rules[:3])
    judge.judge_rules(TEXT, RULES.rules[:3])  # cached: not logged again
    log.flush()
    records = list(log.records())
    assert len(records) == 3
    assert {r.prompt_version for r in records} == {"decision-v1"}
    assert all("fake-decisions" in (r.model or "") for r in records)


def test_the_state_is_the_input_text_only() -> None:
    model = RuleAwareFakeDecisionModel()
    judge = DecisionJudge(model=model, cache=None)
    judge.judge_rules(TEXT, RULES.rules[:3])
    ((state, names),) = model.requests
    assert state == TEXT
    assert names == ["R-000", "R-001", "R-002"]
    with pytest.raises(TypeError):
        model.invoke({"state": [HumanMessage("x")], "questions": {}})


def test_no_warning_escapes_a_clean_run() -> None:
    judge = DecisionJudge(model=RuleAwareFakeDecisionModel(), cache=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        judge.judge_rules(TEXT, RULES.rules[:5])
