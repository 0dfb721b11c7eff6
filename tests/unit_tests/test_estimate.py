"""estimate_bulk: a bulk run's calls and tokens, counted without calling a model."""

from __future__ import annotations

import math
import sys

import pytest

from langchain_tag.estimate import estimate_bulk
from langchain_tag.matching import DecisionJudge
from langchain_tag.settings import MatchSettings
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from langchain_tag.testing.decisions import RuleAwareFakeDecisionModel
from langchain_tag.usage import TokenPrices, UsageCounter

RULES = trigger_rulebook(6).rules
TEXTS = ["input with trigger-000", "input with trigger-002 trigger-004", "nothing"]


def without_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count ~4 characters a token, as the fake decision model does."""
    monkeypatch.setitem(sys.modules, "tiktoken", None)


async def test_a_decision_judge_is_priced_as_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_tiktoken(monkeypatch)
    decisions = RuleAwareFakeDecisionModel()
    # Four questions a request: six rules take two requests per input.
    engine = MatchSettings(llm=decisions, questions_per_request=4).build_engine()
    prices = TokenPrices(input=0.15, output=0.60)
    found = estimate_bulk(engine, RULES, TEXTS, prices=prices)
    assert isinstance(engine.judge, DecisionJudge)
    assert found.judge_calls == len(TEXTS) * math.ceil(len(RULES) / 4)
    assert found.judgments == len(TEXTS) * len(RULES)
    counter = UsageCounter()
    for text in TEXTS:
        await engine.amatch(text, RULES, config=counter.watch())
    assert found.judge_calls == decisions.calls == counter.calls
    assert found.usage.input_tokens == counter.usage.input_tokens
    assert (found.usage.output_tokens, found.usage.cached_input_tokens) == (0, 0)
    assert found.dollars == pytest.approx((found.usage.input_tokens or 0) * 0.15 / 1e6)
    assert "decision requests: input tokens only" in " ".join(found.notes)
    # Every verdict is cached now: nothing left to ask.
    again = estimate_bulk(engine, RULES, TEXTS)
    assert (again.judge_calls, again.cached_verdicts) == (0, found.judgments)


def test_a_chat_judge_is_counted_call_by_call_as_its_run() -> None:
    model = RuleAwareFakeChatModel()
    engine = MatchSettings(llm=model, rules_per_call=4).build_engine()
    found = estimate_bulk(engine, RULES, [*TEXTS, TEXTS[0]])  # a repeat is free
    assert model.calls == 0
    for text in TEXTS:
        engine.match(text, RULES)
    assert found.judge_calls == model.calls == len(TEXTS) * math.ceil(len(RULES) / 4)
    assert found.judgments == (len(TEXTS) + 1) * len(RULES)
    assert found.usage.input_tokens
    assert found.usage.output_tokens
