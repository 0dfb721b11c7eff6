"""The fake judges of `langchain_tag.testing` (`testing/judges.py`) themselves."""

from __future__ import annotations

import json

from langchain_core.messages import AIMessage

from langchain_tag.matching import NBA_PROFILE, ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook


def test_judged_messages_are_one_answer_each() -> None:
    # The fake answers a single-rule prompt with one verdict, never a batch.
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    rule = trigger_rulebook(1).rules[0]
    answer = judge.llm.invoke(judge.messages("trigger-000", rule))
    assert isinstance(answer, AIMessage)
    assert '"verdicts"' not in answer.text


def test_the_fake_gives_a_reason_first_only_when_asked() -> None:
    rule = trigger_rulebook(1).rules[0]
    llm = RuleAwareFakeChatModel()
    plain = ApplicabilityJudge(llm=llm)
    # Unchanged without a rationale: the verdict alone, or `applicable` first.
    assert llm.invoke(plain.messages("trigger-000", rule)).text == '{"verdict": "YES"}'
    nba = ApplicabilityJudge(llm=llm, profile=NBA_PROFILE)
    assert llm.invoke(nba.messages("x", rule)).text == (
        '{"applicable": false, "reason": "no decisive fact"}'
    )
    reasoned = ApplicabilityJudge(llm=llm, rationale=True)
    answer = json.loads(llm.invoke(reasoned.messages("trigger-000", rule)).text)
    assert list(answer.items()) == [
        ("reason", "the input shows the condition"),
        ("verdict", "YES"),
    ]
    batch = ApplicabilityJudge(llm=llm, profile=NBA_PROFILE, rules_per_call=2)
    rules = trigger_rulebook(2).rules
    reasoned_batch = batch.remade(rationale=True)
    (entry, _) = json.loads(llm.invoke(batch.batch_messages("x", rules)).text)[
        "verdicts"
    ]
    assert list(entry) == ["rule_id", "applicable", "reason"]
    (entry, _) = json.loads(llm.invoke(reasoned_batch.batch_messages("x", rules)).text)[
        "verdicts"
    ]
    assert list(entry) == ["rule_id", "reason", "applicable"]
