"""Several rules judged in one call: what is read, cached, logged and judged again."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from langchain_tag import Rule, Rulebook
from langchain_tag.errors import UnreliableMatchWarning
from langchain_tag.matching import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    ApplicabilityJudge,
    RuleSchemaProfile,
    Verdict,
    constraint_profile,
)
from langchain_tag.matching._batched import read_batch
from langchain_tag.matching.profiles import (
    BatchReasonedYesNoOutput,
    ReasonedYesNoOutput,
    YesNoOutput,
)
from langchain_tag.matching.prompts import read_judge_batch
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

CODE_QUERY = "from os import *\nsquare = lambda x: x * x\nif x == None:\n    pass\n"


def make_rules(n: int) -> list[Rule]:
    return list(trigger_rulebook(n).rules)


class ListSink:
    """A verdict sink that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Verdict]] = []

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        self.records.append((rule.rule_id, verdict))

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        self.record(text, rule, verdict, **fields)


def _answer(*entries: tuple[str, str]) -> AIMessage:
    verdicts = [{"rule_id": rule_id, "verdict": v} for rule_id, v in entries]
    return AIMessage(json.dumps({"verdicts": verdicts}))


def test_only_clear_verdicts_are_read() -> None:
    rules = make_rules(4)
    answer = _answer(("R-000", "YES"), ("R-001", "NO"), ("R-001", "YES"))
    read = read_batch(CONDITION_PROFILE, rules, answer)
    # R-001 is named twice, R-002 and R-003 not at all: judged again alone.
    assert {rule_id: v.applies for rule_id, v in read.items()} == {"R-000": True}
    assert read_batch(CONDITION_PROFILE, rules, AIMessage("no idea")) == {}


async def _judge(judge: ApplicabilityJudge, text: str, mode: str) -> list[Verdict]:
    rules = make_rules(4)
    if mode == "sync":
        return judge.judge_rules(text, rules)
    return await judge.ajudge_rules(text, rules)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_batch_is_one_call_cached_per_rule_and_logged(mode: str) -> None:
    llm = RuleAwareFakeChatModel()
    sink = ListSink()
    judge = ApplicabilityJudge(llm=llm, rules_per_call=4, verdict_log=sink)
    first = await _judge(judge, "trigger-002", mode)
    assert llm.calls == 1
    assert [v.applies for v in first] == [False, False, True, False]
    assert [rule_id for rule_id, _ in sink.records] == [f"R-{i:03d}" for i in range(4)]
    again = await _judge(judge, "trigger-002", mode)
    assert llm.calls == 1  # every verdict from the cache, none logged again
    assert all(v.cached for v in again)
    assert len(sink.records) == 4


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failed_batch_call_fails_each_rule_once(mode: str) -> None:
    llm = RuleAwareFakeChatModel(faults={"R-000": [ValueError("boom")]})
    sink = ListSink()
    judge = ApplicabilityJudge(
        llm=llm,
        rules_per_call=4,
        verdict_log=sink,
        on_error="not_applicable",
        retry=None,
    )
    with pytest.warns(UnreliableMatchWarning, match="4 of 4"):
        verdicts = await _judge(judge, "trigger-002", mode)
    assert all(v.failed and "boom" in (v.error or "") for v in verdicts)
    assert [rule_id for rule_id, v in sink.records if v.failed] == [
        f"R-{i:03d}" for i in range(4)
    ]
    assert llm.calls == 1


@pytest.mark.parametrize("per_call", [5, 10])
def test_batched_verdicts_equal_one_rule_per_call(
    per_call: int, pep8_rulebook: Rulebook
) -> None:
    rules = pep8_rulebook.rules
    one = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None)
    model = RuleAwareFakeChatModel()
    batched = ApplicabilityJudge(llm=model, rules_per_call=per_call, cache=None)
    expected = one.judge_rules(CODE_QUERY, rules)
    assert any(v.applies for v in expected)
    assert batched.judge_rules(CODE_QUERY, rules) == expected
    assert model.calls == math.ceil(len(rules) / per_call)
    model.reset()
    assert asyncio.run(batched.ajudge_rules(CODE_QUERY, rules)) == expected
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


# --- a reason before each verdict (rationale=True) ---------------------------------

PINNED_TEXT = "from os import *\nprint('<input>')\n"
PINNED_RULES = [
    Rule(
        rule_id="R-1",
        name="No wildcard imports",
        condition="A wildcard import (`import *`) is used",
        action="Replace it",
        tags=("imports", "style"),
    ),
    Rule(
        rule_id="R-2",
        name="Line length",
        condition="A line is longer than `79` characters",
        action="Wrap it",
        applies_when="A line exceeds 79 chars",
        constraint="Max 79",
        violation_check="len(line) > 79",
        does_not_apply_to="URLs",
    ),
]
# Computed from the code before `rationale` existed (sha256 of the JSON below): a
# batch without it asks, costs and is keyed exactly as before.
PINNED = {
    "condition": (
        "91fbb6e15b7694b438de3549f5644259e3cc2f0f9a3cb73a3c129bf15e5ff6c7",
        "485728212ac96c302bed18567aa5aae856608452a111cc70d3b923876222b965",
        "cab891e3ed47508db6244995c889adb61e46c6c970831d1028d25724cab98dcd",
    ),
    "nba": (
        "08718cc096fb76ac318c55a0960660b4dc86b22ddfd5faaacb92b0fb335cbae1",
        "387a4a0b1aa06355303a11145f19d5ce18186f9190d4526f56cc63624c6e3af4",
        "f8cfbee850fe792de7b9da3b2c4b83a8e42c61184acb4b24e0c47aab36d719c1",
    ),
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("profile", [CONDITION_PROFILE, NBA_PROFILE])
def test_without_rationale_batches_are_unchanged(profile: RuleSchemaProfile) -> None:
    judge = ApplicabilityJudge(
        llm=RuleAwareFakeChatModel(), profile=profile, rules_per_call=2
    )
    messages, key, schemas = PINNED[profile.name]
    rendered = [
        [type(m).__name__, m.content]
        for m in judge.batch_messages(PINNED_TEXT, PINNED_RULES)
    ]
    assert _sha(json.dumps(rendered)) == messages
    assert judge.cache_key(PINNED_TEXT, PINNED_RULES[0]) == key
    dumped = [schema.model_json_schema() for schema in judge._schemas()]
    assert _sha(json.dumps(dumped, sort_keys=True)) == schemas


@pytest.mark.parametrize(
    ("profile", "decision"),
    [(CONDITION_PROFILE, '"verdict"'), (NBA_PROFILE, '"applicable"')],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_rationale_batches_give_a_reason_per_rule(
    profile: RuleSchemaProfile, decision: str, mode: str
) -> None:
    llm = RuleAwareFakeChatModel()
    sink = ListSink()
    judge = ApplicabilityJudge(
        llm=llm, profile=profile, rules_per_call=4, rationale=True, verdict_log=sink
    )
    verdicts = await _judge(judge, "trigger-002", mode)
    assert llm.calls == 1
    assert [v.applies for v in verdicts] == [False, False, True, False]
    assert [v.reason for v in verdicts] == ["no", "no", "the input shows it", "no"]
    assert [v.reason for _, v in sink.records] == [v.reason for v in verdicts]
    system, user = llm.prompts[0], llm.prompts[0].splitlines()[-1]
    assert -1 < user.index('"reason"') < user.index(decision)
    assert "several rules" in system  # the batch note, after the reasoned format
    plain = ApplicabilityJudge(llm=llm, profile=profile, rules_per_call=4)
    assert judge.cache_key("x", PINNED_RULES[0]) != plain.cache_key(
        "x", PINNED_RULES[0]
    )


def test_rationale_batch_schema_puts_the_reason_before_each_verdict() -> None:
    judge = ApplicabilityJudge(
        llm=RuleAwareFakeChatModel(), rules_per_call=2, rationale=True
    )
    single, batch = judge._schemas()
    assert (single, batch) == (ReasonedYesNoOutput, BatchReasonedYesNoOutput)
    entry = batch.model_json_schema()["$defs"]["ReasonedRuleYesNo"]
    assert list(entry["properties"]) == ["rule_id", "reason", "verdict"]
    assert set(entry["required"]) == {"rule_id", "reason", "verdict"}
    # A structured answer's reasons are read too.
    parsed = BatchReasonedYesNoOutput.model_validate(
        {
            "verdicts": [
                {"rule_id": "R-1", "reason": "It imports *.", "verdict": "YES"},
                {"rule_id": "R-2", "reason": "No long line.", "verdict": "NO"},
            ]
        }
    )
    read = read_batch(
        judge.asked_profile, PINNED_RULES, {"raw": AIMessage(""), "parsed": parsed}
    )
    assert {r: (v.applies, v.reason) for r, v in read.items()} == {
        "R-1": (True, "It imports *."),
        "R-2": (False, "No long line."),
    }
