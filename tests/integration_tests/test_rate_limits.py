"""One retry layer against a real HTTP client: requests per judgment under 429s.

A loopback OpenAI-compatible server answers every request with HTTP 429 (or the
first few of each rule), a rate limit or the flex tier's "resource unavailable";
`ChatOpenAI` from the environment, as a new user has it. Before: the judge's 4
attempts ran on top of the SDK's 2 retries, 12 requests per judgment, and
`Retry-After` was not read.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from langchain_tag import TAGRetriever
from langchain_tag.errors import JudgmentError
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.prompts import read_judge_message
from langchain_tag.models import FLEX_TIMEOUT, CallRetry, default_chat_model
from langchain_tag.testing import (
    FakeOpenAIServer,
    Refusal,
    RuleAwareFakeChatModel,
    trigger_rulebook,
)

QUERY = "trigger-000 trigger-003"


def _rule_of(request: dict[str, Any]) -> str:
    text = "\n".join(str(m.get("content")) for m in request["messages"])
    parsed = read_judge_message(text)
    return parsed[1]["rule_id"] if parsed else ""


def test_a_persistent_429_costs_exactly_the_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FakeOpenAIServer(
        RuleAwareFakeChatModel(), refuse=lambda _: Refusal()
    ) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("TAG_MODEL", "fake")
        retriever = TAGRetriever(rulebook=trigger_rulebook(5))
        with pytest.raises(JudgmentError, match="after 4 attempt"):
            retriever.invoke(QUERY)
        per_rule = Counter(_rule_of(r) for r in server.requests)
    # Under on_error="raise" the first failure stops the fan-out, so rules not
    # started send nothing; no rule sends more than its 4 attempts.
    assert per_rule
    assert max(per_rule.values()) == CallRetry().max_attempts
    assert sum(per_rule.values()) <= 5 * CallRetry().max_attempts


def test_every_judgment_sends_at_most_its_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FakeOpenAIServer(
        RuleAwareFakeChatModel(), refuse=lambda _: Refusal()
    ) as server:
        llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="fake")
        judge = ApplicabilityJudge(
            llm=llm, on_error="not_applicable", retry=CallRetry(max_attempts=3)
        )
        with pytest.warns(UserWarning, match="5 of 5 judgments failed"):
            verdicts = judge.judge_rules(QUERY, trigger_rulebook(5).rules)
        assert all(v.failed and "after 3 attempt(s)" in str(v.error) for v in verdicts)
        assert Counter(_rule_of(r) for r in server.requests) == {
            f"R-00{i}": 3 for i in range(5)
        }


def test_retry_none_leaves_the_clients_retries() -> None:
    with FakeOpenAIServer(
        RuleAwareFakeChatModel(), refuse=lambda _: Refusal()
    ) as server:
        llm = ChatOpenAI(
            base_url=server.base_url, api_key="unused", model="fake", max_retries=1
        )
        judge = ApplicabilityJudge(llm=llm, retry=None, on_error="not_applicable")
        with pytest.warns(UserWarning, match="judgments failed"):
            judge.invoke((QUERY, trigger_rulebook(1).rules[0]))
        assert len(server.requests) == 2  # the SDK's one try and its one retry


def test_retry_after_is_honoured() -> None:
    seen: dict[str, list[float]] = {}
    lock = threading.Lock()

    def first_two_refused(request: dict[str, Any]) -> Refusal | None:
        with lock:
            times = seen.setdefault(_rule_of(request), [])
            times.append(time.monotonic())
            return (
                Refusal(headers={"retry-after-ms": "300"}) if len(times) <= 2 else None
            )

    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=first_two_refused) as server:
        llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="fake")
        # Its own backoff would wait 10 s: the provider's 0.3 s wins.
        judge = ApplicabilityJudge(llm=llm, retry=CallRetry(initial_delay=10.0))
        verdict = judge.invoke((QUERY, trigger_rulebook(1).rules[0]))
    assert verdict.applies
    (times,) = seen.values()
    waits = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(waits) == 2
    assert all(0.3 <= wait < 5.0 for wait in waits), waits


def test_a_storm_shorter_than_the_budget_delays_the_judgment() -> None:
    # Before: the 4 attempts ran out inside the storm. Now the provider's waits
    # are waited out for up to `CallRetry.rate_limit_wait` seconds.
    refused = itertools.count()

    def storm(request: dict[str, Any]) -> Refusal | None:
        del request
        if next(refused) < 6:
            return Refusal(headers={"retry-after-ms": "10"})
        return None

    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=storm) as server:
        llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="fake")
        verdict = ApplicabilityJudge(llm=llm).invoke(
            (QUERY, trigger_rulebook(1).rules[0])
        )
        assert verdict.applies
        assert len(server.requests) == 7


def test_the_flex_tier_through_the_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the OpenAI SDK makes of the flex tier's 429 "resource unavailable" is
    # told from a rate limit: no shared pause, no lowered bound; the refused
    # judgments back off on their own and come through.
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def short_of_capacity(request: dict[str, Any]) -> Refusal | None:
        with lock:
            seen[_rule_of(request)] += 1
            first_two = seen[_rule_of(request)] <= 2
        return Refusal.resource_unavailable() if first_two else None

    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=short_of_capacity) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("TAG_MODEL", "fake")
        llm = default_chat_model(service_tier="flex")
        assert getattr(llm, "request_timeout", None) == FLEX_TIMEOUT
        fast = CallRetry(initial_delay=0.01, jitter=0.0, max_attempts=2)
        judge = ApplicabilityJudge(llm=llm, retry=fast, cache=None)
        limiter = ConcurrencyLimiter(4)
        rules = trigger_rulebook(4).rules
        verdicts = judge.judge_rules(QUERY, rules, limiter=limiter)
        assert [v.applies for v in verdicts] == [True, False, False, True]
        assert {r.get("service_tier") for r in srv.requests} == {"flex"}
        assert seen == {rule.rule_id: 3 for rule in rules}
        assert (limiter.allowed, limiter.resume_at) == (4, 0.0)
        # Past `capacity_wait`, a judgment fails as a shortage of capacity.
        seen.clear()
        patient = CallRetry(initial_delay=0.01, jitter=0.0, capacity_wait=0.015)
        with pytest.raises(JudgmentError, match="short of capacity") as raised:
            judge.remade(retry=patient).invoke((QUERY, rules[0]))
        assert raised.value.kind == "capacity"
        assert "RateLimitError" in raised.value.error
