"""A server that ignores `response_format`: the judge reads its prose instead.

Some OpenAI-compatible servers answer a structured-output request in plain text;
the SDK's schema parsing then refuses an answer our text parser reads fine. An
answer that is JSON, but off the schema, is no such sign: structured output stays.
"""

from __future__ import annotations

import logging
import warnings

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_openai import ChatOpenAI

from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.models import CallRetry
from langchain_tag.testing import FakeOpenAIServer, trigger_rulebook


def test_auto_structured_output_falls_back_to_text_once_per_judge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: the SDK's schema parsing raised on the prose answer, so every
    # judgment failed although "YES, ..." is perfectly readable.
    rules = trigger_rulebook(3).rules
    answers = ["YES, the input contains it."] * 10
    with FakeOpenAIServer(FakeListChatModel(responses=answers)) as server:
        llm = ChatOpenAI(
            base_url=server.base_url, api_key="unused", model="prose", max_retries=0
        )
        judge = ApplicabilityJudge(llm=llm)
        with caplog.at_level(logging.WARNING, logger="langchain_tag.models"):
            verdicts = [judge.invoke(("trigger-000", rule)) for rule in rules]
        assert [v.applies for v in verdicts] == [True, True, True]
        assert not any(v.failed for v in verdicts)
        # One structured attempt, then text only: 2 + 1 + 1 requests.
        formats = [r.get("response_format", {}).get("type") for r in server.requests]
        assert formats == ["json_schema", None, None, None]
        fallbacks = [r for r in caplog.records if "text parser" in r.getMessage()]
        assert len(fallbacks) == 1

        # Remembered by that judge (and those remade from it), not process-wide:
        # a new judge on the model tries structured output again.
        judge.with_call_retry(judge.retry or CallRetry()).invoke(("x", rules[0]))
        assert server.requests[-1].get("response_format") is None
        ApplicabilityJudge(llm=llm).invoke(("trigger-000", rules[0]))
        formats = [r.get("response_format", {}).get("type") for r in server.requests]
        assert formats[4:] == [None, "json_schema", None]

        # "always" means always: no fallback, the failure is reported.
        strict = ApplicabilityJudge(
            llm=llm, structured_output="always", on_error="not_applicable"
        )
        with pytest.warns(UserWarning, match="judgments failed"):
            assert strict.invoke(("trigger-000", rules[1])).failed


@pytest.mark.parametrize(
    "answer", ['{"verdict": "MAYBE"}', '{"verdict": "YES", "reason": "trunc']
)
def test_an_off_schema_json_answer_leaves_structured_output_on(answer: str) -> None:
    # Before: one such answer switched structured output off for the model in
    # every judge of the process.
    rules = trigger_rulebook(2).rules
    answers = [answer, answer, '{"verdict": "YES"}']
    with FakeOpenAIServer(FakeListChatModel(responses=answers)) as server:
        llm = ChatOpenAI(
            base_url=server.base_url, api_key="unused", model="json", max_retries=0
        )
        judge = ApplicabilityJudge(llm=llm, on_error="not_applicable")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            first = judge.invoke(("trigger-000", rules[0]))
        assert judge.invoke(("trigger-001", rules[1])).applies
        formats = [r.get("response_format", {}).get("type") for r in server.requests]
    assert formats[0] == formats[-1] == "json_schema"
    if "MAYBE" in answer:
        # The SDK keeps no text of valid JSON: asked again as text, still MAYBE.
        assert first.failed
        assert formats == ["json_schema", None, "json_schema"]
    else:
        # Truncated JSON comes back whole in the SDK's error: read as it is.
        assert first.applies
        assert formats == ["json_schema", "json_schema"]
