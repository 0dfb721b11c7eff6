"""Regression tests for bugs a review found in the judge, cache and limiter."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr

from langchain_tag import ApplicabilityJudge, Rule, Rulebook, TAGRetriever
from langchain_tag.matching import CONDITION_PROFILE, RuleSchemaProfile, prompts
from langchain_tag.matching.parsing import parse_verdict, score_from_logprobs
from langchain_tag.matching.profiles import YesNoOutput
from langchain_tag.testing import RuleAwareFakeChatModel

# Two distinct rules with the same condition and different actions: normal in a
# rulebook (one situation, two things to do about it).
SAME_CONDITION = "The input contains `wildcard`"
RULE_A = Rule(rule_id="A", name="Rule A", condition=SAME_CONDITION, action="Do A")
RULE_B = Rule(rule_id="B", name="Rule B", condition=SAME_CONDITION, action="Do B")

CONDITION_ONLY = RuleSchemaProfile(
    name="condition-only",
    system_prompt=prompts.JUDGE_SYSTEM,
    output_instruction=prompts.JUDGE_OUTPUT_INSTRUCTION,
    rule_fields=("condition",),
    output_schema=YesNoOutput,
)


def _lp(token: str, probability: float) -> dict[str, Any]:
    return {"token": token, "logprob": math.log(probability)}


# --- verdict cache -------------------------------------------------------------------


def test_cache_hit_keeps_the_judged_rules_id() -> None:
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), profile=CONDITION_ONLY)
    retriever = TAGRetriever(
        rulebook=Rulebook(rules=[RULE_A, RULE_B]), judge=judge, max_concurrency=1
    )
    result = retriever.match("from os import wildcard")
    assert [v.rule_id for v in result.verdicts] == ["A", "B"]
    assert [(d.id, d.page_content) for d in result.documents] == [
        ("A", "Do A"),
        ("B", "Do B"),
    ]


def test_cache_key_tells_endpoints_apart() -> None:
    rule = RULE_A
    keys = {
        ApplicabilityJudge(
            # No socket options: ChatOpenAI would otherwise probe a socket.
            llm=ChatOpenAI(
                model="local-model", base_url=url, api_key="x", http_socket_options=()
            )
        ).cache_key("from os import wildcard", rule)
        for url in ("http://127.0.0.1:8000/v1", "http://127.0.0.1:11434/v1")
    }
    assert len(keys) == 2


def test_cache_key_covers_the_output_instruction() -> None:
    variant = CONDITION_PROFILE.model_copy(
        update={"output_instruction": "Answer YES only if you are certain, else NO."}
    )
    llm = RuleAwareFakeChatModel()
    text = "from os import wildcard"
    default_key = ApplicabilityJudge(llm=llm).cache_key(text, RULE_A)
    variant_key = ApplicabilityJudge(llm=llm, profile=variant).cache_key(text, RULE_A)
    assert default_key != variant_key


# --- parsing the judge's answer ----------------------------------------------------


def test_leading_no_is_not_overridden_by_quoted_code() -> None:
    answer = "NO. The code only sets `applicable = True`; there is no wildcard import."
    parsed = parse_verdict(answer)
    assert parsed is not None
    assert parsed.applies is False


def test_negated_yes_is_not_a_yes() -> None:
    parsed = parse_verdict("The condition is not met, so the answer is not YES.")
    assert parsed is None or parsed.applies is False


@pytest.mark.parametrize(
    "answer",
    [
        "Applicable? No, the input has no wildcard import.",
        "YES/NO: NO",
    ],
)
def test_echoed_question_is_not_the_decision(answer: str) -> None:
    parsed = parse_verdict(answer)
    assert parsed is None or parsed.applies is False


# --- logprob scores ----------------------------------------------------------------


def test_logprob_score_ignores_the_thinking_block() -> None:
    message = AIMessage(
        '<think>No, wait: the input has `wildcard`.</think>{"verdict": "YES"}',
        response_metadata={
            "logprobs": {
                "content": [
                    {"token": "<think>", "logprob": 0.0, "top_logprobs": []},
                    {
                        "token": "No",
                        "logprob": math.log(0.9),
                        "top_logprobs": [_lp("No", 0.9), _lp("Yes", 0.1)],
                    },
                    {"token": "</think>", "logprob": 0.0, "top_logprobs": []},
                    {
                        "token": "YES",
                        "logprob": math.log(0.95),
                        "top_logprobs": [_lp("YES", 0.95), _lp("NO", 0.05)],
                    },
                ]
            }
        },
    )
    parsed = parse_verdict(str(message.content))
    assert parsed is not None
    assert parsed.applies is True
    assert score_from_logprobs(message) == pytest.approx(0.95)


def _tokens_message(*tokens: tuple[str, list[dict[str, Any]]]) -> AIMessage:
    return AIMessage(
        "".join(token for token, _ in tokens),
        response_metadata={
            "logprobs": {
                "content": [
                    {"token": token, "logprob": 0.0, "top_logprobs": alternatives}
                    for token, alternatives in tokens
                ]
            }
        },
    )


def test_logprob_score_reads_a_label_split_across_tokens() -> None:
    # SmolLM2's tokenizer writes "YES" as "Y" + "ES": the first piece decides.
    message = _tokens_message(
        ('{"verdict": "', []),
        ("Y", [_lp("Y", 0.7), _lp("N", 0.3)]),
        ("ES", []),
        ('"}', []),
    )
    assert score_from_logprobs(message) == pytest.approx(0.7)


def test_logprob_score_needs_a_whole_label_word() -> None:
    # "NO" + "T" is "NOT", and "T" + "he" is "The": neither is a verdict.
    message = _tokens_message(
        ("NO", [_lp("NO", 0.9)]), ("T", []), (" the", []), (" T", []), ("he", [])
    )
    assert score_from_logprobs(message) is None


class _OddLogprobsModel(RuleAwareFakeChatModel):
    """Answers YES with logprobs in a shape some OpenAI-compatible servers use."""

    odd_entry: dict[str, Any]

    def _answer(self, prompt: str) -> AIMessage:
        return AIMessage(
            '{"verdict": "YES"}',
            response_metadata={"logprobs": {"content": [self.odd_entry]}},
        )


@pytest.mark.parametrize(
    "entry",
    [
        {"token": "YES", "logprob": None, "top_logprobs": None},
        {"token": "YES", "logprob": -0.1, "top_logprobs": {"YES": -0.1, "NO": -2.4}},
    ],
    ids=["null-logprob", "dict-top-logprobs"],
)
def test_malformed_logprobs_do_not_escape_the_error_policy(
    entry: dict[str, Any],
) -> None:
    llm = _OddLogprobsModel(odd_entry=entry)
    judge = ApplicabilityJudge(
        llm=llm, logprobs=True, on_error="not_applicable", cache=None
    )
    verdict = judge.invoke(("from os import wildcard", RULE_A))
    assert verdict.rule_id == "A"


# --- concurrency limiter -----------------------------------------------------------


class _HeldAsyncModel(RuleAwareFakeChatModel):
    """Async calls wait for `release()`; sync calls answer at once."""

    _released: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            await self._released.wait()
            return self._respond(prompt, fault)
        finally:
            self._leave()


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10  # a hang guard, not a speed requirement
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.001)


async def test_limit_holds_across_sync_and_async_calls() -> None:
    rules = [
        Rule(
            rule_id=f"R{i}",
            name=f"Rule {i}",
            condition=f"The input contains `t{i}`",
            action=f"Do {i}",
        )
        for i in range(6)
    ]
    llm = _HeldAsyncModel()
    retriever = TAGRetriever(
        rulebook=Rulebook(rules=rules),
        judge=ApplicabilityJudge(llm=llm, cache=None),
        max_concurrency=2,
    )
    # The loop's judgments take both slots and hold them.
    in_loop = asyncio.ensure_future(retriever.ainvoke("t2 in the loop"))
    worker = threading.Thread(target=retriever.invoke, args=("t1 in threads",))
    try:
        await _until(lambda: llm.peak_in_flight == 2, "the loop holds both slots")
        worker.start()
        # The thread's judgments would reach the model now if the limit were not
        # shared; they wait for a slot instead.
        await asyncio.sleep(0.2)
        assert llm.calls == 2
        assert worker.is_alive()
    finally:
        llm.release()
        await in_loop
        if worker.is_alive():
            await asyncio.to_thread(worker.join)
    assert llm.calls == 12  # the thread's six ran after the loop's freed the slots
    assert llm.peak_in_flight == 2  # reached, and never more
