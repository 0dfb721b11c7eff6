"""Reading the judge's answer (`matching/parsing.py`): decisions and logprob scores."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from pydantic import BaseModel

from langchain_tag.matching.parsing import parse_verdict, score_from_logprobs
from langchain_tag.matching.profiles import (
    ReasonedApplicableOutput,
    ReasonedYesNoOutput,
    YesNoOutput,
)


def _lp(token: str, probability: float) -> dict[str, Any]:
    return {"token": token, "logprob": math.log(probability)}


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


# --- answers with a reason first (rationale=True) ---------------------------------


@pytest.mark.parametrize(
    ("answer", "schema", "applies"),
    [
        (
            '{"reason": "No wildcard import is used.", "verdict": "NO"}',
            ReasonedYesNoOutput,
            False,
        ),
        (
            '```json\n{"reason": "NO name is listed.", "verdict": "YES"}\n```',
            ReasonedYesNoOutput,
            True,
        ),
        (
            '{"reason": "A sign-and-trade is proposed.", "applicable": true}',
            ReasonedApplicableOutput,
            True,
        ),
    ],
)
def test_reasoned_answers_give_their_decision_and_reason(
    answer: str,
    schema: type[BaseModel],
    applies: bool,  # noqa: FBT001 - parametrized
) -> None:
    parsed = parse_verdict(answer, schema=schema)
    assert parsed is not None
    assert parsed.applies is applies
    assert parsed.reason is not None
    assert parsed.reason in answer


def test_a_long_reason_is_kept_whole() -> None:
    reason = "The input imports every name of os, so the condition holds. " * 50
    answer = json.dumps({"reason": reason, "verdict": "YES"})
    parsed = parse_verdict(answer, schema=ReasonedYesNoOutput)
    assert parsed == (True, reason.strip())


def test_an_answer_cut_before_its_verdict_is_no_decision() -> None:
    cut = '{"reason": "The input has NO wildcard import, only'
    assert parse_verdict(cut, schema=ReasonedYesNoOutput) is None
    # Without a reason asked for, a lone NO still decides, as it always did.
    assert parse_verdict(cut, schema=YesNoOutput) == (False, None)


def test_a_reason_written_out_in_prose_is_kept() -> None:
    answer = "**Reason:** the input uses `from os import *`.\n**Verdict:** YES"
    assert parse_verdict(answer, schema=ReasonedYesNoOutput) == (
        True,
        "the input uses `from os import *`.",
    )
    assert parse_verdict("verdict: NO\nreason: nothing matches") == (
        False,
        "nothing matches",
    )


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


def test_logprob_score_after_a_reason_reads_the_verdict_token() -> None:
    # The reason's "No" comes first; the verdict is the label after the key.
    message = _tokens_message(
        ('{"reason": "', []),
        ("No", [_lp("No", 0.99)]),
        (" import is starred", []),
        ('", "verdict": "', []),
        ("NO", [_lp("NO", 0.7), _lp("YES", 0.3)]),
        ('"}', []),
    )
    assert score_from_logprobs(message) == pytest.approx(0.0)  # the reason's "No"
    assert score_from_logprobs(message, after_key="verdict") == pytest.approx(0.3)
    # A prose answer: the label after the `Verdict:` line, not the reason's "no".
    prose = _tokens_message(
        ("Reason: There is ", []),
        ("no", [_lp("no", 0.99)]),
        (" doubt.\nVerdict: ", []),
        ("YES", [_lp("YES", 0.8), _lp("NO", 0.2)]),
    )
    assert score_from_logprobs(prose, after_key="verdict") == pytest.approx(0.8)
    # No such key: any label may be the reason's, so no score.
    plain = _tokens_message(("YES", [_lp("YES", 0.6), _lp("NO", 0.4)]))
    assert score_from_logprobs(plain, after_key="verdict") is None
    assert score_from_logprobs(plain) == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("text", "applies"),
    [
        ("Yes, the user mentions a refund, but it is recent.\nVerdict: NO", False),
        ("No explicit request, yet the input shows it.\nVerdict: YES", True),
    ],
)
def test_with_a_reason_first_the_keyed_verdict_decides(
    text: str, *, applies: bool
) -> None:
    parsed = parse_verdict(text, schema=ReasonedYesNoOutput)
    assert parsed is not None
    assert parsed.applies is applies


@pytest.mark.parametrize(
    "text",
    ["Yes, the input uses a wildcard import", "No", "Not applicable, since"],
)
def test_with_a_reason_first_a_leading_label_alone_decides_nothing(text: str) -> None:
    assert parse_verdict(text, schema=ReasonedYesNoOutput) is None
    assert parse_verdict(text, schema=ReasonedApplicableOutput) is None


def test_with_a_reason_first_an_applicable_line_decides() -> None:
    text = "Applicable-sounding, but no salary facts.\napplicable: false"
    parsed = parse_verdict(text, schema=ReasonedApplicableOutput)
    assert parsed is not None
    assert parsed.applies is False
