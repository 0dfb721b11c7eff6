"""Request economy: one retry layer, a shared backoff, several rules per call."""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_openai import ChatOpenAI

from langchain_tag import ApplicabilityJudge, JudgmentError, Rulebook, query_graph
from langchain_tag.matching import RuleSchemaProfile, constraint_profile
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.profiles import YesNoOutput
from langchain_tag.matching.prompts import read_judge_batch
from langchain_tag.models import CallRetry
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.testing import (
    FakeClock,
    RuleAwareFakeChatModel,
    TransientFakeError,
    trigger_rulebook,
)

QUERY = "from os import *\nsquare = lambda x: x * x\nif x == None:\n    pass\n"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(
        "langchain_tag.matching.limiter.time",
        SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep),
    )
    return fake


# --- Retry-After ---------------------------------------------------------------------


class HTTPError(Exception):
    """An SDK-like error: a status code and the response's headers."""

    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.response = SimpleNamespace(headers=headers)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # ms is more precise
        ({"retry-after": "600"}, 30.0),  # cut to max_delay
    ],
)
def test_the_providers_retry_after_sets_the_wait(
    headers: dict[str, str], expected: float
) -> None:
    policy = CallRetry(initial_delay=7.0, jitter=0.0)
    assert policy.delay(1, HTTPError(429, headers)) == expected
    assert policy.delay(1, HTTPError(429, {})) == 7.0  # nothing asked: backoff
    assert policy.delay(1, ValueError("no response")) == 7.0


def test_retry_after_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 < CallRetry().delay(1, HTTPError(503, {"retry-after": when})) <= 5.0


def test_the_judge_turns_the_clients_own_retries_off() -> None:
    llm = ChatOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", model="m")
    assert llm.root_client.max_retries == 2
    judge = ApplicabilityJudge(llm=llm)
    assert isinstance(judge._text_model, ChatOpenAI)
    assert judge._text_model.root_client.max_retries == 0
    assert llm.root_client.max_retries == 2  # the caller's model is untouched
    untouched = ApplicabilityJudge(llm=llm, retry=None)
    assert isinstance(untouched._text_model, ChatOpenAI)
    assert untouched._text_model.root_client.max_retries == 2


# --- the shared backoff --------------------------------------------------------------


def test_a_rate_limit_pauses_everyone_and_halves_the_calls_in_flight(
    clock: FakeClock,
) -> None:
    limiter = ConcurrencyLimiter(8)
    until = limiter.back_off(2.0, rate_limited=True)
    assert until == limiter.resume_at == 2.0
    assert limiter.allowed == 4
    limiter.wait_turn()  # another caller: waits out the pause
    assert clock.sleeps == [2.0]
    limiter.wait_turn(after=until)  # the caller that slept through it: no more
    assert clock.sleeps == [2.0]
    limiter.back_off(1.0, rate_limited=True)
    limiter.back_off(1.0, rate_limited=True)
    limiter.back_off(1.0, rate_limited=True)
    assert limiter.allowed == 1  # never below one
    # Additive increase: back to the bound after enough successes, never above.
    for _ in range(100):
        limiter.succeeded()
    assert limiter.allowed == 8


def test_other_errors_pause_nobody(clock: FakeClock) -> None:
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(2.0, rate_limited=False)
    limiter.wait_turn()
    assert clock.sleeps == []
    assert limiter.allowed == 4


def test_a_lowered_bound_holds_for_threads_and_event_loops() -> None:
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(0.0, rate_limited=True)  # allowed: 2
    model = RuleAwareFakeChatModel(latency=0.05)
    judge = ApplicabilityJudge(llm=model, cache=None)
    rules = trigger_rulebook(8).rules
    judge.judge_rules("trigger-001", rules, limiter=limiter)
    # Two at first, one more only after rounds of successes (2 -> 2.5 -> 2.9 ...).
    assert 2 <= model.peak_in_flight <= 3
    assert limiter.allowed == 4  # grown back, never past the bound
    model.reset()
    limiter = ConcurrencyLimiter(4)
    limiter.back_off(0.0, rate_limited=True)
    asyncio.run(judge.ajudge_rules("trigger-001", rules, limiter=limiter))
    assert 2 <= model.peak_in_flight <= 3


class RateLimitedOnce(RuleAwareFakeChatModel):
    """Refuses the first call of rule R-000 with a 429 asking for 5 s."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        prompt = "\n".join(str(m.content) for m in messages)
        with self._lock:
            first = "rule_id: R-000" in prompt and not getattr(self, "_refused", False)
            if first:
                object.__setattr__(self, "_refused", True)
        if first:
            raise HTTPError(429, {"retry-after": "5"})
        return super()._generate(messages, *args, **kwargs)


def test_one_429_makes_the_whole_fan_out_wait(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge_sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", judge_sleeps.append)  # tenacity's own waits
    model = RateLimitedOnce()
    judge = ApplicabilityJudge(llm=model, cache=None)
    limiter = ConcurrencyLimiter(1)  # one at a time: the order is known
    verdicts = judge.judge_rules(
        "trigger-001", trigger_rulebook(3).rules, limiter=limiter
    )
    assert [v.applies for v in verdicts] == [False, True, False]
    assert judge_sleeps == [5.0]  # R-000's own retry waited what was asked
    # started after the 429: each waited the pause out first (on
    # the limiter's clock, which R-000's own wait did not advance).
    assert clock.sleeps == [5.0]
    assert model.calls == 3  # the refused call never reached the fake


# --- several rules per call ----------------------------------------------------------


@pytest.mark.parametrize("per_call", [5, 10])
def test_batched_verdicts_equal_one_rule_per_call(
    per_call: int, pep8_rulebook: Rulebook
) -> None:
    rules = pep8_rulebook.rules
    one = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None)
    model = RuleAwareFakeChatModel()
    batched = ApplicabilityJudge(llm=model, rules_per_call=per_call, cache=None)
    expected = one.judge_rules(QUERY, rules)
    assert any(v.applies for v in expected)
    assert batched.judge_rules(QUERY, rules) == expected
    assert model.calls == math.ceil(len(rules) / per_call)
    model.reset()
    assert asyncio.run(batched.ajudge_rules(QUERY, rules)) == expected
    assert model.calls == math.ceil(len(rules) / per_call)


def test_batched_constraint_profile_gives_reasons() -> None:
    rules = trigger_rulebook(4).rules
    model = RuleAwareFakeChatModel()
    judge = ApplicabilityJudge(
        llm=model, profile=constraint_profile(), rules_per_call=4, cache=None
    )
    verdicts = judge.judge_rules("trigger-002", rules)
    assert [v.applies for v in verdicts] == [False, False, True, False]
    assert all(v.reason for v in verdicts)
    assert model.calls == 1


def test_the_action_is_withheld_in_a_batch() -> None:
    rules = trigger_rulebook(3).rules
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), rules_per_call=3)
    user = str(judge.batch_messages("x", rules)[1].content)
    read = read_judge_batch(user)
    assert read is not None
    assert [r["rule_id"] for r in read[1]] == ["R-000", "R-001", "R-002"]
    assert not any("Do thing" in user for _ in rules)
    assert all("action" not in fields for fields in read[1])


class MangledBatches(RuleAwareFakeChatModel):
    """Answers batches with one id missing, one twice, one unknown, one garbled."""

    def _answer_batch(self, prompt: str, text: str, rules: Sequence[Any]) -> str:
        ids = [r["rule_id"] for r in rules]
        return (
            '{"verdicts": ['
            f'{{"rule_id": "{ids[1]}", "verdict": "YES"}}, '
            f'{{"rule_id": "{ids[1]}", "verdict": "NO"}}, '
            f'{{"rule_id": "{ids[2]}", "verdict": "maybe"}}, '
            f'{{"rule_id": "{ids[3]}", "verdict": "NO"}}, '
            '{"rule_id": "R-999", "verdict": "YES"}]}'
        )


def test_a_malformed_batch_answer_falls_back_rule_by_rule() -> None:
    rules = trigger_rulebook(4).rules
    model = MangledBatches()
    judge = ApplicabilityJudge(llm=model, rules_per_call=4, cache=None)
    verdicts = judge.judge_rules("trigger-000 trigger-001 trigger-003", rules)
    # R-003's NO came from the batch (wrong, but readable); R-000 (missing),
    # R-001 (twice) and R-002 (garbled) were judged again alone, correctly.
    assert [v.applies for v in verdicts] == [True, True, False, False]
    assert model.calls == 1 + 3
    singles = [p for p in model.prompts if '"verdicts"' not in p]
    assert [read_judge_batch(p)[1][0]["rule_id"] for p in singles] == [  # type: ignore[index]
        "R-000",
        "R-001",
        "R-002",
    ]


class ProseOnly(RuleAwareFakeChatModel):
    def _answer_batch(self, prompt: str, text: str, rules: Sequence[Any]) -> str:
        return "I looked at the rules and most do not apply."


def test_an_unreadable_batch_answer_judges_every_rule_alone() -> None:
    rules = trigger_rulebook(3).rules
    model = ProseOnly()
    judge = ApplicabilityJudge(llm=model, rules_per_call=3, cache=None)
    verdicts = judge.judge_rules("trigger-002", rules)
    assert [v.applies for v in verdicts] == [False, False, True]
    assert not any(v.failed for v in verdicts)
    assert model.calls == 1 + 3


def test_batched_verdicts_are_cached_per_pair() -> None:
    rules = trigger_rulebook(6).rules
    model = RuleAwareFakeChatModel()
    judge = ApplicabilityJudge(llm=model, rules_per_call=3)
    first = judge.judge_rules("trigger-004", rules)
    assert model.calls == 2
    again = judge.judge_rules("trigger-004", rules)
    assert model.calls == 2
    assert all(v.cached for v in again)
    assert [v.applies for v in again] == [v.applies for v in first]
    # A batch of which only one rule is new makes a single-rule call.
    more = [*rules, *trigger_rulebook(7).rules[6:]]
    judge.judge_rules("trigger-004", more)
    assert model.calls == 3
    assert '"verdicts"' not in model.prompts[-1]


def test_batches_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValueError, match="logprobs scores need rules_per_call=1"):
        ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(logprobs=True), rules_per_call=5, logprobs=True
        )
    bare = RuleSchemaProfile(
        name="bare",
        system_prompt="Judge.",
        output_instruction="YES or NO.",
        rule_fields=("rule_id", "condition"),
        output_schema=YesNoOutput,
    )
    with pytest.raises(ValueError, match="no format for several rules per call"):
        ApplicabilityJudge(llm=RuleAwareFakeChatModel(), profile=bare, rules_per_call=2)


# --- the query graph under a server's dict context ----------------------------------


def test_the_graph_refuses_a_bad_k_in_a_dict_context(
    monkeypatch: pytest.MonkeyPatch, pep8_rulebook: Rulebook
) -> None:
    monkeypatch.setattr(query_graph, "_environment_model", RuleAwareFakeChatModel)
    with pytest.raises(ValueError, match="k must be None or an integer >= 0"):
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
            context=cast("QueryContext", {"k": -1}),  # as a server passes it
        )


def test_judged_messages_are_one_answer_each() -> None:
    # The fake answers a single-rule prompt with one verdict, never a batch.
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    rule = trigger_rulebook(1).rules[0]
    answer = judge.llm.invoke(judge.messages("trigger-000", rule))
    assert isinstance(answer, AIMessage)
    assert '"verdicts"' not in answer.text


def test_the_graph_retries_a_given_judge_once_not_twice(
    pep8_rulebook: Rulebook,
) -> None:
    # A judge passed in the context keeps its model but retries by the graph's
    # policy only: no node retry on top of the judge's (4 x 10 attempts before).
    rule_id = pep8_rulebook.rules[0].rule_id
    model = RuleAwareFakeChatModel(faults={rule_id: [TransientFakeError()] * 20})
    given = ApplicabilityJudge(
        llm=model, retry=CallRetry(max_attempts=10, initial_delay=0.0)
    )
    graph = build_query_graph(retry=CallRetry(max_attempts=3, initial_delay=0.0))
    with pytest.raises(JudgmentError, match="after 3 attempt"):
        graph.invoke(
            {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
            context=QueryContext(judge=given),
        )
    attempts = [p for p in model.prompts if f"rule_id: {rule_id}\n" in p]
    assert len(attempts) == 3
    assert given.retry is not None
    assert given.retry.max_attempts == 10  # the caller's judge is not changed
