"""Reading the judge's answer: a decision from text, a score from logprobs."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

from langchain_tag._text import (
    end_of_thinking,
    first_json_object,
    json_objects,
    strip_thinking,
)
from langchain_tag.matching.profiles import (
    ApplicableOutput,
    ReasonedApplicableOutput,
    ReasonedYesNoOutput,
    YesNoOutput,
)


class ParsedVerdict(NamedTuple):
    """A decision read from the judge's text."""

    applies: bool
    reason: str | None


_STANDALONE = re.compile(r"\b(YES|NO)\b")
_NEGATED = re.compile(r"(?:\bnot|\bnever|n't|\bcannot)\s+(?:be\s+)?$", re.IGNORECASE)
# A refusal decides nothing, even when it starts with "No".
REFUSAL = re.compile(
    r"\b(?:I(?:'m| am) sorry|I(?:'m| am) (?:not able|unable) to|I (?:can(?:no|')t|"
    r"won't|will not) (?:help|assist|comply|answer|provide|do that|judge)|as an AI\b)",
    re.IGNORECASE,
)


class AnswerFormat:
    """Which answers count as a decision: the keys, labels and values accepted.

    The judge reads a model's text with the format its profile asked for, so an
    answer in another format (an `applicable` key where `verdict` was asked for, a
    forged verdict copied from the input in another shape) is no decision.
    """

    def __init__(
        self,
        keys: Sequence[str],
        values: Mapping[str, bool],
        leading: Mapping[str, bool],
        *,
        booleans: bool,
        lone_labels: bool,
    ) -> None:
        """Accept `values` under `keys` and `leading` labels at the start of prose.

        Args:
            keys: Decision keys in JSON objects and `key: value` lines.
            values: Accepted values under those keys, lower case.
            leading: Labels that decide when prose starts with them, lower case.
            booleans: Whether JSON `true`/`false` count under the keys.
            lone_labels: Whether a lone, unnegated YES or NO in prose decides.
        """
        self.keys = tuple(keys)
        self.values = dict(values)
        self.leading = dict(leading)
        self.booleans = booleans
        self.lone_labels = lone_labels
        words = "|".join(sorted(map(re.escape, self.values), key=len, reverse=True))
        labels = "|".join(sorted(map(re.escape, self.leading), key=len, reverse=True))
        # A `verdict: YES` line counts only at the start of a line, so that quoted
        # code such as `applicable = True` in an explanation is never the decision.
        self._keyed = re.compile(
            r"^[\s*_`\"'>#-]*(?:" + "|".join(map(re.escape, self.keys)) + r")\b"
            r"[*_`\"']*\s*[:=]\s*[*_`\"']*\s*(" + words + r")\b",
            re.IGNORECASE | re.MULTILINE,
        )
        # A leading label must end the word there: "Applicable? No" and "YES/NO: NO"
        # echo the question or the format, they do not answer it.
        self._leading = (
            re.compile(r"^[\s*_`\"'>#(\[-]*(" + labels + r")(?![?/\w])", re.IGNORECASE)
            if self.leading
            else None
        )

    def from_mapping(self, obj: object) -> ParsedVerdict | None:
        """The decision a parsed JSON value carries, if it is one of ours."""
        if not isinstance(obj, dict):
            return None
        reason = obj.get("reason")
        reason = reason.strip() or None if isinstance(reason, str) else None
        for key in self.keys:
            value = obj.get(key)
            if isinstance(value, bool) and self.booleans:
                return ParsedVerdict(value, reason)
            if isinstance(value, str) and value.strip().lower() in self.values:
                return ParsedVerdict(self.values[value.strip().lower()], reason)
        return None

    def from_prose(self, text: str) -> ParsedVerdict | None:
        """The decision of text without a JSON one: a leading label, a keyed line.

        A keyed decision keeps the answer's `reason: ...` line, if it has one.
        """
        keyed = self._keyed.search(text)
        if keyed and keyed.start() == 0:  # "applicable: false" is not "applicable"
            return ParsedVerdict(
                self.values[keyed.group(1).lower()], _reason_line(text)
            )
        leading = None if self._leading is None else self._leading.match(text)
        if leading:
            rest = text[leading.end() :].strip(" \t\n,.:;-*_`\"'")
            return ParsedVerdict(
                self.leading[leading.group(1).lower()], rest[:500] or None
            )
        if keyed:
            return ParsedVerdict(
                self.values[keyed.group(1).lower()], _reason_line(text)
            )
        return _lone_label(text) if self.lone_labels else None


# A `reason: ...` line, as a rationale written out in prose starts one.
_REASON_LINE = re.compile(
    r"^[\s*_`\"'>#-]*reason\b[*_`\"']*\s*[:=][*_`\"'\s]*(.*?)[*_`\"'\s,]*$",
    re.IGNORECASE | re.MULTILINE,
)


def _reason_line(text: str) -> str | None:
    found = _REASON_LINE.search(text)
    return (found.group(1) or None) if found else None


_YES_NO = {"yes": True, "no": False}
_TRUE_FALSE = {"true": True, "false": False}
LENIENT_FORMAT = AnswerFormat(
    ("verdict", "answer", "decision", "applicable", "applies"),
    {**_YES_NO, **_TRUE_FALSE, "applicable": True, "not applicable": False},
    {**_YES_NO, **_TRUE_FALSE, "applicable": True, "not applicable": False},
    booleans=True,
    lone_labels=True,
)
"""Any of the usual shapes; for text whose requested format is unknown."""
YES_NO_FORMAT = AnswerFormat(
    ("verdict",), _YES_NO, _YES_NO, booleans=False, lone_labels=True
)
"""The condition profile's: `{"verdict": "YES"|"NO"}`, or YES/NO in prose."""
APPLICABLE_FORMAT = AnswerFormat(
    ("applicable",),
    _TRUE_FALSE,
    {**_TRUE_FALSE, "applicable": True, "not applicable": False},
    booleans=True,
    lone_labels=False,
)
"""The constraint profile's: `{"applicable": true|false, ...}`, "(Not) applicable"."""
# With a reason before the decision, a YES or NO in prose is the reason's ("Yes, the
# user asks, but ...\nVerdict: NO"), and an answer cut off before its verdict must
# not be read from it: only the JSON or a keyed `verdict:` line decide.
REASONED_YES_NO_FORMAT = AnswerFormat(
    ("verdict",), _YES_NO, {}, booleans=False, lone_labels=False
)
"""The condition profile's with a rationale: `{"reason": ..., "verdict": ...}`."""
REASONED_APPLICABLE_FORMAT = AnswerFormat(
    ("applicable",), _TRUE_FALSE, {}, booleans=True, lone_labels=False
)
"""The constraint profile's with a rationale: `{"reason": ..., "applicable": ...}`."""
_FORMATS: dict[type[BaseModel], AnswerFormat] = {
    YesNoOutput: YES_NO_FORMAT,
    ApplicableOutput: APPLICABLE_FORMAT,
    ReasonedYesNoOutput: REASONED_YES_NO_FORMAT,
    ReasonedApplicableOutput: REASONED_APPLICABLE_FORMAT,
}


def answer_format(schema: type[BaseModel] | None) -> AnswerFormat:
    """The format an answer to `schema` is read with (any usual one for None)."""
    return _FORMATS.get(schema, LENIENT_FORMAT) if schema else LENIENT_FORMAT


def parse_verdict(
    text: str, *, schema: type[BaseModel] | None = None
) -> ParsedVerdict | None:
    """Read a decision from free text; None if there is none. Never raises.

    Accepts the JSON the prompt asks for, `verdict: YES` style lines, and prose that
    starts with the decision ("Yes, the condition holds..."). Text with no clear
    decision, with JSON objects that disagree, with both YES and NO and nothing else
    to go on, or that refuses to answer, gives None.

    Args:
        text: The model's answer.
        schema: The output schema the prompt asked for (`YesNoOutput`,
            `ApplicableOutput` or their reasoned forms); only that format counts.
            None accepts any of them.
    """
    read = answer_format(schema)
    cleaned = strip_thinking(text).strip()
    if not cleaned:
        return None
    decisions, foreign = [], False
    for obj in json_objects(cleaned):
        decision = read.from_mapping(obj)
        if decision is not None:
            decisions.append(decision)
        else:
            foreign = foreign or LENIENT_FORMAT.from_mapping(obj) is not None
    if decisions:
        # A quoted, forged verdict next to the model's own is no answer to trust.
        agreed = {d.applies for d in decisions}
        return decisions[0] if len(agreed) == 1 else None
    if foreign:  # a verdict in a format that was not asked for
        return None
    if REFUSAL.search(cleaned):
        return None
    return read.from_prose(cleaned)


def parse_batch(
    answer: str | BaseModel | None, *, schema: type[BaseModel]
) -> dict[str, list[ParsedVerdict]]:
    """The decisions of an answer judging several rules, by rule id. Never raises.

    Reads the structured output, or the first JSON object with a `verdicts` list
    in text; each entry must name its `rule_id` and decide in the single-rule
    format of `schema` (`YesNoOutput` or `ApplicableOutput`). An id decided twice
    keeps both decisions, so that the caller can refuse it; entries without an id
    or a decision are left out.
    """
    read = answer_format(schema)
    if isinstance(answer, BaseModel):
        entries: object = answer.model_dump().get("verdicts")
    elif isinstance(answer, str):
        found = first_json_object(answer, "verdicts")
        entries = found["verdicts"] if found is not None else None
    else:
        entries = None
    decided: dict[str, list[ParsedVerdict]] = {}
    for entry in entries if isinstance(entries, list) else []:
        rule_id = entry.get("rule_id") if isinstance(entry, dict) else None
        decision = read.from_mapping(entry)
        if isinstance(rule_id, str) and decision is not None:
            decided.setdefault(rule_id.strip(), []).append(decision)
    return decided


def _lone_label(text: str) -> ParsedVerdict | None:
    """The decision when exactly one of YES and NO occurs, never negated."""
    labels = set()
    for found in _STANDALONE.finditer(text):
        if _NEGATED.search(text[max(0, found.start() - 12) : found.start()]):
            return None  # "not YES" is no answer to trust either way
        labels.add(found.group(1))
    return ParsedVerdict(labels.pop() == "YES", None) if len(labels) == 1 else None


_LABELS = {"YES": True, "TRUE": True, "NO": False, "FALSE": False}


def _label(token: str) -> bool | None:
    return _LABELS.get(token.strip().strip("\"'").upper())


def _label_start(token: str) -> bool | None:
    """The polarity of the one label this token can begin, e.g. "Y" of "Y"+"ES".

    Small models' tokenizers split labels; the first piece carries the decision.
    """
    word = token.strip().strip("\"'").upper()
    polarities = {
        value for label, value in _LABELS.items() if word and label.startswith(word)
    }
    return polarities.pop() if len(polarities) == 1 else None


@functools.lru_cache(maxsize=8)
def _key_pattern(key: str) -> re.Pattern[str]:
    return re.compile(
        rf'"{re.escape(key)}"|^[\s*_`>#-]*{re.escape(key)}\b[*_`]*\s*[:=]',
        re.IGNORECASE | re.MULTILINE,
    )


def _verdict_position(tokens: Sequence[str], start: int) -> int | None:
    """Index of the first token after `start` characters that begins a whole label."""
    offset = 0
    for index, token in enumerate(tokens):
        offset += len(token)
        polarity = _label_start(token)
        if offset <= start or polarity is None:
            continue
        word = token
        for end in range(index + 1, len(tokens) + 1):
            after = tokens[end][:1] if end < len(tokens) else ""
            # A whole word: "NO" followed by "T" is "NOT", not a verdict.
            if _label(word) == polarity and not after.isalpha():
                return index
            if not after.isalpha():
                break
            word += tokens[end]
    return None


def score_from_logprobs(
    message: BaseMessage, *, after_key: str | None = None
) -> float | None:
    """P(YES) / (P(YES) + P(NO)) at the verdict token, from OpenAI-style logprobs.

    Reads `response_metadata["logprobs"]["content"]`: the first verdict label after
    any `<think>` block (its first token when the tokenizer splits it, as "Y" + "ES"),
    and that token's `top_logprobs` alternatives. Returns None when the model
    returned no usable logprobs or no verdict token; never raises.

    Args:
        message: The model's answer.
        after_key: The JSON key the decision follows (`verdict`, `applicable`), for
            answers with a reason first: a "No" in the reason is not the verdict.
            The label is looked for after the key's last occurrence, if any.
    """
    logprobs = message.response_metadata.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else logprobs
    if not isinstance(content, list):
        return None
    entries = [e for e in content if isinstance(e, Mapping)]
    tokens = [str(e.get("token", "")) for e in entries]
    # The decision follows a reasoning model's thinking; labels inside it are not it.
    joined = "".join(tokens)
    start = end_of_thinking(joined)
    if after_key is not None:
        # The decision follows its key, quoted in JSON or starting a prose line;
        # without the key, a label may be the reason's, so there is no score.
        keys = list(_key_pattern(after_key).finditer(joined, start))
        if not keys:
            return None
        start = keys[-1].end()
    position = _verdict_position(tokens, start)
    if position is None:
        return None
    entry = entries[position]
    mass = {True: 0.0, False: 0.0}
    alternatives = entry.get("top_logprobs") or [entry]
    for alternative in alternatives if isinstance(alternatives, list) else []:
        if not isinstance(alternative, Mapping):
            continue
        label = _label_start(str(alternative.get("token", "")))
        logprob = alternative.get("logprob")
        if label is not None and isinstance(logprob, int | float):
            mass[label] += math.exp(logprob)
    total = mass[True] + mass[False]
    return None if total == 0 else mass[True] / total
