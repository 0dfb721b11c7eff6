"""The dry runs' stand-in models: they answer from a policy and bill what is sent."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.execution import GENERIC_TEMPLATE, NBA_TEMPLATE
from langchain_tag.matching import (
    NBA_PROFILE,
    ApplicabilityJudge,
    CascadeJudge,
    DecisionJudge,
)
from langchain_tag.metering import (
    EXECUTOR_ANSWERS,
    JUDGE_NO_REASON,
    MeteringChatModel,
    MeteringDecisionModel,
    executor_answers,
    judge_answers,
    run_to_end,
    stand_in_judge,
)
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from langchain_tag.testing.decisions import RuleAwareFakeDecisionModel
from langchain_tag.usage import (
    PromptCaching,
    UsageCounter,
    decision_request_tokens,
    token_counter,
)

RULES = trigger_rulebook(4).rules
TEXT = "an input with trigger-001"
COUNTER = token_counter()


def only(rule_id: str) -> Callable[[str, str], bool]:
    """A policy: the rule `rule_id` applies, whatever the input."""
    return lambda _text, judged: judged == rule_id


def test_a_call_reports_what_a_provider_would_bill() -> None:
    model = MeteringChatModel(answer=lambda _messages: "fine", counter=COUNTER)
    messages = [SystemMessage("Be brief."), HumanMessage("Say something.")]
    counter = UsageCounter()
    answer = model.invoke(messages, counter.watch())
    assert answer.text == "fine"
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["input_tokens"] == COUNTER.messages(messages)
    assert answer.usage_metadata["output_tokens"] == COUNTER.count("fine")
    assert counter.calls == 1
    assert counter.usage.input_tokens == COUNTER.messages(messages)


def test_a_shared_prefix_is_read_from_the_simulated_cache_by_every_copy() -> None:
    caching = PromptCaching(min_tokens=16, block_tokens=8)
    model = MeteringChatModel(
        answer=lambda _messages: "a", counter=COUNTER, caching=caching
    )
    prefix = "The same long instructions, word for word, every time. " * 4
    first = model.invoke([HumanMessage(prefix + "One.")])
    # Another policy, the same model at the provider: it reads the prefix.
    again = model.answering(lambda _messages: "b").invoke(
        [HumanMessage(prefix + "Two")]
    )
    assert first.usage_metadata is not None
    assert again.usage_metadata is not None
    assert first.usage_metadata["input_token_details"]["cache_read"] == 0
    cached = again.usage_metadata["input_token_details"]["cache_read"]
    assert 16 <= cached <= again.usage_metadata["input_tokens"]
    assert cached % 8 == 0
    assert again.text == "b"


@pytest.mark.parametrize("profile", [None, NBA_PROFILE])
def test_a_judge_on_the_stand_in_decides_by_the_policy(profile: object) -> None:
    model = MeteringChatModel(answer=judge_answers(only("R-002")), counter=COUNTER)
    settings = {} if profile is None else {"profile": profile}
    judge = ApplicabilityJudge(llm=model, **settings)
    verdicts = judge.judge_rules(TEXT, RULES)
    assert [v.applies for v in verdicts] == [False, False, True, False]
    assert not any(v.failed for v in verdicts)
    if profile is NBA_PROFILE:
        assert verdicts[0].reason == JUDGE_NO_REASON


def test_a_batch_is_answered_rule_by_rule() -> None:
    model = MeteringChatModel(answer=judge_answers(only("R-003")), counter=COUNTER)
    judge = ApplicabilityJudge(llm=model, rules_per_call=4)
    counter = UsageCounter()
    verdicts = judge.judge_rules(TEXT, RULES, counter.watch())
    assert [v.applies for v in verdicts] == [False, False, False, True]
    assert counter.calls == 1
    messages = judge.batch_messages(TEXT, RULES)
    assert counter.usage.input_tokens == COUNTER.messages(messages)


def test_other_prompts_get_the_answer_given() -> None:
    answer = judge_answers(only("R-000"), otherwise="YES")
    assert answer([HumanMessage("> Question: a?\n> Context:\n>>>\nb\n>>>")]) == "YES"


async def test_a_decision_judge_on_the_stand_in_is_billed_its_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    counter = token_counter()
    model = MeteringDecisionModel(decide=only("R-001"), counter=counter)
    judge = DecisionJudge(model=model, questions_per_request=4)
    usage = UsageCounter()
    verdicts = await judge.ajudge_rules(TEXT, RULES, usage.watch())
    assert [v.applies for v in verdicts] == [False, True, False, False]
    questions = [judge.question(rule) for rule in RULES]
    assert usage.calls == 1
    assert usage.usage.input_tokens == decision_request_tokens(
        counter.count, TEXT, questions
    )
    assert (usage.usage.output_tokens, usage.usage.cached_input_tokens) == (0, 0)
    # The fake decision model counts ~4 characters a token too: the same bill.
    fake = RuleAwareFakeDecisionModel()
    billed = UsageCounter()
    await DecisionJudge(model=fake, questions_per_request=4).ajudge_rules(
        TEXT, RULES, billed.watch()
    )
    assert billed.usage.input_tokens == usage.usage.input_tokens


def test_the_executor_answers_its_templates_typical_answer() -> None:
    text = "Team A trades a player to Team B."
    nba = executor_answers(NBA_TEMPLATE)(NBA_TEMPLATE.messages(text, "(none)"))
    assert nba == EXECUTOR_ANSWERS["nba"]
    assert json.loads(nba)["answer"] is True
    # The generic answer is the input, read back from the template's own layout.
    echoed = executor_answers(GENERIC_TEMPLATE)(
        GENERIC_TEMPLATE.messages(text, "- do this")
    )
    assert echoed == text


def test_a_stand_in_judge_keeps_nothing_of_the_runs() -> None:
    cache = InMemoryVerdictCache()
    real = RuleAwareFakeChatModel(logprobs=True)
    cascade = CascadeJudge(
        cheap=ApplicabilityJudge(llm=real, logprobs=True, cache=cache),
        strong=ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=cache),
    )
    made: list[MeteringChatModel] = []

    def chat() -> MeteringChatModel:
        made.append(
            MeteringChatModel(answer=judge_answers(only("R-001")), counter=COUNTER)
        )
        return made[-1]

    dry = stand_in_judge(
        cascade, chat, lambda: MeteringDecisionModel(decide=only(""), counter=COUNTER)
    )
    assert isinstance(dry, CascadeJudge)
    verdicts = dry.judge_rules(TEXT, RULES)
    assert [v.applies for v in verdicts] == [False, True, False, False]
    assert len(made) == 2  # a model for each stage: each its own prompt cache
    assert real.calls == 0
    assert list(cache.yield_keys()) == []
    assert dry.cheap.cache is not cache


async def test_run_to_end_works_inside_a_running_loop() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return math.prod([6, 7])

    assert run_to_end(answer()) == 42
