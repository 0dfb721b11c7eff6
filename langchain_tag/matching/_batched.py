"""Several rules judged in one model call (`BatchingJudge.rules_per_call > 1`).

The input is sent once per call; the action stays withheld. Verdicts are cached
per (input, rule) as always; a rule the answer leaves out, names twice or decides
in a format that was not asked for is judged again alone. Batched verdicts carry no
logprob score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from langchain_tag._text import batches, check_text
from langchain_tag.errors import GaveUp
from langchain_tag.matching import prompts
from langchain_tag.matching._fanout import (
    acall,
    call,
    judgment_config,
    recalled,
    succeeded,
)
from langchain_tag.matching.parsing import parse_batch
from langchain_tag.matching.verdicts import Verdict

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from langchain_tag.matching.memory import VerdictMemory
    from langchain_tag.matching.profiles import RuleSchemaProfile
    from langchain_tag.models import CallRetry
    from langchain_tag.rules import Rule

__all__ = [
    "ajudge_unit",
    "batch_messages",
    "judge_unit",
    "units",
]


class BatchingJudge(Protocol):
    """What judging several rules in one call uses of a chat judge, publicly.

    `ApplicabilityJudge` is one; naming it here would make an import circle.
    """

    @property
    def memory(self) -> VerdictMemory | None:
        """Where verdicts are cached and logged."""

    @property
    def asked_profile(self) -> RuleSchemaProfile:
        """The profile as the model is asked."""

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """What the judge sees of `rule`."""

    @property
    def retry(self) -> CallRetry | None:
        """The judge's retry policy."""

    def call_model(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        """One model call, unread."""

    async def acall_model(
        self, messages: list[BaseMessage], config: RunnableConfig, *, batch: bool
    ) -> Any:
        """Async `call_model`."""

    def given_up(self, rule: Rule, failed: GaveUp) -> Verdict:
        """The failed verdict of a call that failed after its retries."""

    def judge_pair(self, request: tuple[str, Rule], config: RunnableConfig) -> Verdict:
        """Judge one pair alone."""

    async def ajudge_pair(
        self, request: tuple[str, Rule], config: RunnableConfig
    ) -> Verdict:
        """Async `judge_pair`."""


def units(rules: Sequence[Rule], per_call: int) -> list[Sequence[Rule]]:
    """The rules of each call of a fan-out: `per_call` rules per call, in order."""
    return list(batches(rules, per_call))


def batch_messages(
    judge: BatchingJudge, text: str, rules: Sequence[Rule]
) -> list[BaseMessage]:
    """The messages that judge several `rules` against `text` in one call."""
    profile = judge.asked_profile
    fields = [
        [
            *([] if "rule_id" in profile.rule_fields else [("rule_id", r.rule_id)]),
            *judge.judged_fields(r),
        ]
        for r in rules
    ]
    return [
        SystemMessage(profile.batch_system_prompt),
        HumanMessage(
            prompts.render_judge_batch_message(
                text, fields, str(profile.batch_output_instruction)
            )
        ),
    ]


def read_batch(
    profile: RuleSchemaProfile, rules: Sequence[Rule], output: Any
) -> dict[str, Verdict]:
    """The verdicts an answer on several rules gives, by rule id; only clear ones.

    A rule the answer does not name, names twice, or decides in a format that was
    not asked for gets no verdict here (it is judged again alone).
    """
    schema = profile.output_schema
    try:
        if isinstance(output, Mapping):  # structured: {"raw", "parsed", ...}
            parsed = output.get("parsed")
            answer = parsed if parsed is not None else output["raw"].text
        else:
            answer = output.text
        decided = parse_batch(answer, schema=schema)
    except Exception:  # noqa: BLE001 - an unreadable answer decides nothing
        return {}
    verdicts = {}
    for rule in rules:
        decisions = decided.get(rule.rule_id, [])
        if len(decisions) == 1:
            verdicts[rule.rule_id] = Verdict(
                rule_id=rule.rule_id,
                applies=decisions[0].applies,
                reason=decisions[0].reason,
            )
    return verdicts


def _given_up(
    judge: BatchingJudge, asked: Sequence[Rule], failed: GaveUp
) -> dict[str, Verdict]:
    # Under on_error="raise" the first rule's failure is raised.
    return {r.rule_id: judge.given_up(r, failed) for r in asked}


def _recall(
    judge: BatchingJudge, text: str, unit: Sequence[Rule]
) -> dict[str, Verdict]:
    memory = judge.memory
    return {} if memory is None or recalled() else memory.recall(text, unit)


async def _arecall(
    judge: BatchingJudge, text: str, unit: Sequence[Rule]
) -> dict[str, Verdict]:
    memory = judge.memory
    return {} if memory is None or recalled() else await memory.arecall(text, unit)


def judge_unit(
    judge: BatchingJudge, text: str, unit: Sequence[Rule], config: RunnableConfig
) -> list[Verdict]:
    """Judge `unit` against `text` in one call (cache hits and leftovers aside)."""
    check_text(text, "The judged input")
    known = _recall(judge, text, unit)
    asked = [rule for rule in unit if rule.rule_id not in known]
    if len(asked) > 1:
        try:
            output = call(
                judge.retry,
                judge.call_model,
                batch_messages(judge, text, asked),
                judgment_config(config, *asked),
                batch=True,
            )
        except GaveUp as failed:
            answered = _given_up(judge, asked, failed)
        else:
            answered = _read(judge, asked, output)
        rules, verdicts = _pairs(asked, answered)
        if judge.memory is not None:
            verdicts = judge.memory.settle(text, rules, verdicts)
        known.update((v.rule_id, v) for v in verdicts)
    # A rule the answer left out, repeated or garbled is judged again alone.
    return [
        known.get(rule.rule_id)
        or judge.judge_pair((text, rule), judgment_config(config, rule))
        for rule in unit
    ]


async def ajudge_unit(
    judge: BatchingJudge, text: str, unit: Sequence[Rule], config: RunnableConfig
) -> list[Verdict]:
    """Async `judge_unit`."""
    check_text(text, "The judged input")
    known = await _arecall(judge, text, unit)
    asked = [rule for rule in unit if rule.rule_id not in known]
    if len(asked) > 1:
        try:
            output: Any = await acall(
                judge.retry,
                judge.acall_model,
                batch_messages(judge, text, asked),
                judgment_config(config, *asked),
                batch=True,
            )
        except GaveUp as failed:
            answered = _given_up(judge, asked, failed)
        else:
            answered = _read(judge, asked, output)
        rules, verdicts = _pairs(asked, answered)
        if judge.memory is not None:
            verdicts = await judge.memory.asettle(text, rules, verdicts)
        known.update((v.rule_id, v) for v in verdicts)
    return [
        known.get(rule.rule_id)
        or await judge.ajudge_pair((text, rule), judgment_config(config, rule))
        for rule in unit
    ]


def _read(
    judge: BatchingJudge, asked: Sequence[Rule], output: Any
) -> dict[str, Verdict]:
    succeeded()
    return read_batch(judge.asked_profile, asked, output)


def _pairs(
    asked: Sequence[Rule], answered: Mapping[str, Verdict]
) -> tuple[list[Rule], list[Verdict]]:
    rules = [rule for rule in asked if rule.rule_id in answered]
    return rules, [answered[rule.rule_id] for rule in rules]
