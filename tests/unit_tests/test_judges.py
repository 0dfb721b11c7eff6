"""The fake judges of `langchain_tag.testing` (`testing/judges.py`) themselves."""

from __future__ import annotations

from langchain_core.messages import AIMessage

from langchain_tag import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook


def test_judged_messages_are_one_answer_each() -> None:
    # The fake answers a single-rule prompt with one verdict, never a batch.
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    rule = trigger_rulebook(1).rules[0]
    answer = judge.llm.invoke(judge.messages("trigger-000", rule))
    assert isinstance(answer, AIMessage)
    assert '"verdicts"' not in answer.text
