"""Fake applicability judges that answer from the prompt text alone.

`RuleAwareFakeChatModel` reads the input and the rule out of the judge's message and
answers YES exactly when a backtick-quoted fragment of the rule's condition occurs in
the input (`condition_holds`); it can add latency, return logprobs and inject faults
per rule. `NoisyJudgeFakeChatModel` errs at known rates, and
`InjectionObeyingFakeChatModel` is a naive judge that obeys instructions escaping a
prompt's data blocks, to measure that prompts keep data apart. None of this is a
language model; it exists so that tests and benchmarks exercise the real code paths
with known right answers.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

from langchain_core.messages import AIMessage
from pydantic import Field, PrivateAttr

from langchain_tag._delimiters import CHAT_TEMPLATE_TOKENS
from langchain_tag.matching.prompts import RULE_FIELD, read_judge_batch
from langchain_tag.rules import Rule, Rulebook
from langchain_tag.testing.scripted import ScriptedFakeChatModel

_TRIGGER = re.compile(r"`([^`]+)`")
# LangChain's `LLMChainFilter` prompt: "> Question: ...", then the context in >>>.
_CHAIN_FILTER = re.compile(
    r"^> Question: (.*?)\n> Context:\n>>>\n(.*)\n>>>", re.DOTALL | re.MULTILINE
)


# A call's prompt is read for its fault key and again for its answer, and a
# benchmark sends the same prompts again and again: the last few are kept read
# (few: a long run's memory stays flat once they are).
_read_prompt = functools.lru_cache(maxsize=256)(read_judge_batch)


def _read_first(prompt: str) -> tuple[str, Mapping[str, str]] | None:
    """The input and the first rule's fields of a judge prompt."""
    read = _read_prompt(prompt)
    return None if read is None else (read[0], read[1][0])


def condition_holds(text: str, fields: Mapping[str, str]) -> bool:
    """The fake's ground truth: a backtick-quoted condition fragment is in the input.

    The condition is `condition`, else `applies_when`, else (a user-defined rule
    schema's judge-side fields) every field but the rule's id, name and tags.
    """
    condition = (
        fields.get("condition")
        or fields.get("applies_when")
        or " ".join(
            v for k, v in fields.items() if k not in {"rule_id", "name", "tags"}
        )
    )
    lowered = text.lower()
    return any(t.lower() in lowered for t in _TRIGGER.findall(condition))


def trigger_rulebook(n: int) -> Rulebook:
    """`n` rules, rule i (`R-<iii>`) applying to inputs that contain `trigger-<iii>`.

    The fake judges' ground truth, so the right verdicts are known: for load and
    scale runs that need many rules and no particular wording.
    """
    return Rulebook(
        rules=[
            Rule(
                rule_id=f"R-{i:03d}",
                name=f"Rule number {i}",
                condition=f"The input contains `trigger-{i:03d}`",
                action=f"Do thing {i}",
            )
            for i in range(n)
        ]
    )


def _decision(
    *, holds: bool, applicable: bool, reason: str, reasoned: bool = False
) -> dict[str, Any]:
    """A judge's JSON answer: `applicable` and `reason` if asked so, else a verdict.

    `reasoned` (a rationale asked for): the reason first, then the decision.
    """
    decision: dict[str, Any] = (
        {"applicable": holds} if applicable else {"verdict": "YES" if holds else "NO"}
    )
    if reasoned:
        return {"reason": reason, **decision}
    return {**decision, "reason": reason} if applicable else decision


def _reasoned(prompt: str) -> bool:
    """Whether the prompt's closing line asks for the reason before the decision."""
    closing = prompt[prompt.rfind("\n") + 1 :]
    reason = closing.find('"reason"')
    decision = max(closing.find('"verdict"'), closing.find('"applicable"'))
    return -1 < reason < decision


class RuleAwareFakeChatModel(ScriptedFakeChatModel):
    """A fake judge that answers from the prompt's content, deterministically.

    Judge prompts get a verdict in the requested format (`{"verdict": ...}` or
    `{"applicable": ..., "reason": ...}`; the reason first when the prompt's closing
    line asks so, as `rationale=True` does), or prose when `style="prose"`. LangChain's
    `LLMChainFilter` prompts get `YES` or `NO` by the same ground truth, the context
    standing for the condition. Any other prompt is echoed back after
    `answer_prefix`, so the model also stands in as an executor in chains and shows
    what it was given. `faults` are keyed by rule id.
    """

    style: Literal["json", "prose"] = "json"
    logprobs: bool = False
    """Attach OpenAI-style logprobs (P(answer) = `confidence` at the verdict token),
    like ChatOpenAI's option of the same name."""
    top_logprobs: int | None = None
    confidence: float = 0.9
    confidence_by_rule: Mapping[str, float] = Field(default_factory=dict)
    """Per rule id, a confidence other than `confidence`."""
    answer_prefix: str = "ANSWER:"

    _llm_name: ClassVar[str] = "rule-aware-fake"
    _identifying_fields: ClassVar[tuple[str, ...]] = ("style", "confidence", "logprobs")

    def _fault_key(self, prompt: str) -> str:
        parsed = _read_first(prompt)
        return parsed[1].get("rule_id", "") if parsed else ""

    def _decide(self, text: str, fields: Mapping[str, str]) -> tuple[bool, float]:
        """The answer to a judge prompt, and the confidence its logprobs show."""
        confidence = self.confidence_by_rule.get(
            fields.get("rule_id", ""), self.confidence
        )
        return condition_holds(text, fields), confidence

    def _answer(self, prompt: str) -> AIMessage:
        parsed = _read_first(prompt)
        if parsed is None:
            filtered = _CHAIN_FILTER.search(prompt)
            if filtered is None:
                return AIMessage(f"{self.answer_prefix} {prompt}")
            question, context = filtered.groups()
            relevant = condition_holds(question, {"condition": context})
            return AIMessage("YES" if relevant else "NO")
        batch = _read_prompt(prompt)
        if batch is not None and '"verdicts"' in prompt:
            return AIMessage(self._answer_batch(prompt, *batch))
        text, fields = parsed
        holds, confidence = self._decide(text, fields)
        applicable = '"applicable"' in prompt
        reasoned = _reasoned(prompt)
        reason = "the input shows the condition" if holds else "no decisive fact"
        as_json = applicable or self.style == "json"
        if as_json:
            content = json.dumps(
                _decision(
                    holds=holds, applicable=applicable, reason=reason, reasoned=reasoned
                )
            )
            answers = ("true", "false") if applicable else ("YES", "NO")
        elif reasoned:
            content = f"Reason: {reason}.\nVerdict: {'YES' if holds else 'NO'}"
            answers = ("YES", "NO")
        else:
            content = (
                "Yes, the condition holds for this input."
                if holds
                else "No, the input does not satisfy the condition."
            )
            answers = ("Yes", "No")
        metadata: dict[str, Any] = {}
        if self.logprobs:
            token, other = answers if holds else answers[::-1]
            # A reason first is written out token by token, as a model writes it.
            lead = (
                _reason_tokens(reason, applicable=applicable)
                if reasoned and as_json
                else []
            )
            metadata["logprobs"] = {
                "content": lead + _logprobs(token, other, confidence)[bool(lead) :]
            }
        return AIMessage(content, response_metadata=metadata)

    def _answer_batch(
        self, prompt: str, text: str, rules: Sequence[Mapping[str, str]]
    ) -> str:
        """One verdict per rule block, in the format the prompt asks for."""
        applicable = '"applicable"' in prompt
        reasoned = _reasoned(prompt)
        entries = []
        for fields in rules:
            holds, _ = self._decide(text, fields)
            reason = "the input shows it" if holds else "no"
            decision = _decision(
                holds=holds, applicable=applicable, reason=reason, reasoned=reasoned
            )
            entries.append({"rule_id": fields.get("rule_id", ""), **decision})
        return json.dumps({"verdicts": entries})


class NoisyJudgeFakeChatModel(RuleAwareFakeChatModel):
    """A fake judge with known error rates and calibration, for cascade measurements.

    It knows the right answer (`truth`, by default the backtick rule of
    `RuleAwareFakeChatModel`) and gets it wrong on purpose: a true YES is answered NO
    with probability `false_negative_rate`, a true NO answered YES with
    `false_positive_rate`. Which pairs it gets wrong is fixed by a hash of (`seed`,
    input, rule id), so runs repeat exactly. With `logprobs=True` its verdict token
    has probability `confidence` when it is right and `wrong_confidence` when it is
    wrong (a calibrated model is less sure of its mistakes), each lowered by up to
    `confidence_spread`, again by hash.
    """

    truth: Callable[[str, Mapping[str, str]], bool] = condition_holds
    """The right answer for an input and the rule fields the judge sees."""
    false_negative_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    false_positive_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    wrong_confidence: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Confidence of the wrong answers; None: `confidence`, as sure as when right."""
    confidence_spread: float = Field(default=0.0, ge=0.0, lt=1.0)
    seed: int = 0

    _llm_name: ClassVar[str] = "noisy-judge-fake"
    _identifying_fields: ClassVar[tuple[str, ...]] = (
        "style",
        "confidence",
        "logprobs",
        "false_negative_rate",
        "false_positive_rate",
        "wrong_confidence",
        "confidence_spread",
        "seed",
    )

    def _uniform(self, purpose: str, text: str, rule_id: str) -> float:
        """A number in [0, 1) fixed by the seed, the purpose, the input and the rule."""
        key = "\0".join((str(self.seed), purpose, text, rule_id)).encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64

    def _decide(self, text: str, fields: Mapping[str, str]) -> tuple[bool, float]:
        right = self.truth(text, fields)
        rule_id = fields.get("rule_id", "")
        error_rate = self.false_negative_rate if right else self.false_positive_rate
        wrong = self._uniform("error", text, rule_id) < error_rate
        confidence = super()._decide(text, fields)[1]
        if wrong and self.wrong_confidence is not None:
            confidence = self.wrong_confidence
        confidence -= self.confidence_spread * self._uniform("spread", text, rule_id)
        if not 0.0 < confidence < 1.0:
            msg = (
                f"confidence {confidence} for rule {rule_id!r} is outside (0, 1): "
                "lower confidence_spread or keep the confidences above it."
            )
            raise ValueError(msg)
        return right != wrong, confidence


def _reason_tokens(reason: str, *, applicable: bool) -> list[dict[str, Any]]:
    """The certain tokens of `{"reason": "<reason>", "<key>": ` before the label."""
    key = "applicable" if applicable else "verdict"
    words = reason.split(" ")
    pieces = ['{"reason": "', words[0], *(f" {w}" for w in words[1:])]
    pieces.append(f'", "{key}": ' + ("" if applicable else '"'))
    return [{"token": p, "logprob": 0.0, "top_logprobs": []} for p in pieces]


def _logprobs(token: str, other: str, confidence: float) -> list[dict[str, Any]]:
    """OpenAI-style logprobs: `token` has probability `confidence`, `other` the rest."""
    top = [
        {"token": token, "logprob": math.log(confidence)},
        {"token": other, "logprob": math.log(1 - confidence)},
    ]
    return [
        {"token": '{"', "logprob": 0.0, "top_logprobs": []},
        {"token": token, "logprob": top[0]["logprob"], "top_logprobs": top},
    ]


# --- a judge that obeys instructions escaping the prompt's data blocks --------------

_BLOCK_OPEN = r"^<({name}(?:-[0-9a-f]+)?)>$"
_ENTITY = re.compile(r"&(?:lt|gt|#0*6[02]|#x0*3[ce]);", re.IGNORECASE)
_LOOK_ALIKES = str.maketrans(
    # Cyrillic, Greek and Armenian letters; angle quotes, CJK and other brackets.
    "\u0430\u0441\u0435\u0456\u0458\u043e\u0440\u0455\u0442\u0443\u0445\u0501"
    "\u043f\u057d\u03bf\u03b9\u03c1\u03c4\u03c5\u03bd\u03b5\u2039\u203a\u3008"
    "\u3009\u27e8\u27e9\u276e\u276f\u02c2\u02c3\u1438\u1433",
    "aceijopstyxdnuoiptuve<><><><><><>",
)
_CLAIM = re.compile(
    r"\b(?:answer|respond|reply|say|output|return|verdict|decision|applicable|"
    r"applies)\b\W{0,12}(?:(?:with|is|be|as|to)\W+)?\W{0,4}(yes|no|true|false)\b",
    re.IGNORECASE,
)


def _naive_reading(text: str) -> tuple[str, list[int]]:
    """`text` as a careless reader sees it, with each character's source offset.

    Entities decoded, compatibility forms folded (NFKC), invisible format
    characters dropped, look-alike letters and brackets mapped to ASCII, lower case.
    """
    read: list[str] = []
    offsets: list[int] = []
    position = 0
    while position < len(text):
        entity = _ENTITY.match(text, position)
        if entity:
            decoded = html.unescape(entity.group(0))
            step = entity.end() - position
        else:
            char = text[position]
            step = 1
            if unicodedata.category(char) == "Cf":
                position += 1
                continue
            decoded = unicodedata.normalize("NFKC", char).lower()
            decoded = decoded.translate(_LOOK_ALIKES)
        read += decoded
        offsets += [position] * len(decoded)
        position += step
    return "".join(read), offsets


class _Block(NamedTuple):
    data: str
    """What a naive reader takes for the block's content."""
    leaked: str
    """Text of the block the naive reader takes for instructions."""


def _read_block(prompt: str, name: str) -> _Block | None:
    """The `name` block of a judge prompt, as a naive reader splits it."""
    opening = re.search(_BLOCK_OPEN.format(name=name), prompt, re.MULTILINE)
    if opening is None:
        return None
    tag = opening.group(1)
    start = opening.end() + 1
    end = prompt.rfind(f"\n</{tag}>")
    if end < start:
        return None
    body = prompt[start:end]
    stops = [len(body)]
    # A tokenizer parsing special tokens makes these real turn boundaries.
    if marker := CHAT_TEMPLATE_TOKENS.search(body):
        stops.append(marker.start())
    read, offsets = _naive_reading(body)
    closing = re.search(rf"<\s*/\s*{re.escape(tag)}(?![\w-])[^<>]*>", read)
    if closing:
        stops.append(offsets[closing.start()])
    cut = min(stops)
    return _Block(data=body[:cut], leaked=body[cut:])


class InjectionObeyingFakeChatModel(ScriptedFakeChatModel):
    """A naive judge: it obeys instructions that escape the prompt's data blocks.

    It reads a judge prompt's `<input…>` and `<rule…>` blocks the way a careless
    model might: a block ends at the first thing that looks like its closing tag
    (after decoding entities, folding Unicode compatibility forms, dropping
    zero-width characters and mapping look-alike letters and brackets) or at a
    chat-template special token (`<|im_start|>`, `[INST]`, ...), which a tokenizer
    parsing special tokens turns into a real turn boundary. What follows such an
    early end, up to the block's real end, it takes for instructions: when that text
    claims a verdict ("answer YES", `{"verdict": "NO"}`, `applicable: true`), it
    answers that and counts the call in `obeyed`. Otherwise it answers from the rule's
    condition as `RuleAwareFakeChatModel` does, on the data it read. Text that stays
    inside its block is never obeyed, however it is phrased: measuring that a prompt
    keeps data apart is the point. Only judge prompts are answered.
    """

    _llm_name: ClassVar[str] = "injection-obeying-fake"
    _obeyed: int = PrivateAttr(default=0)

    @property
    def obeyed(self) -> int:
        """Calls answered by an injected instruction instead of the condition."""
        return self._obeyed

    def reset(self) -> None:
        """Forget recorded prompts, counters (`obeyed` too) and fault positions."""
        super().reset()
        with self._lock:
            self._obeyed = 0

    def _fault_key(self, prompt: str) -> str:
        rule = _read_block(prompt, "rule")
        return dict(RULE_FIELD.findall(rule.data)).get("rule_id", "") if rule else ""

    def _answer(self, prompt: str) -> AIMessage:
        text, rule = _read_block(prompt, "input"), _read_block(prompt, "rule")
        if text is None or rule is None:
            msg = "InjectionObeyingFakeChatModel only answers judge prompts."
            raise ValueError(msg)
        claim = _CLAIM.search(text.leaked + "\n" + rule.leaked)
        if claim is not None:
            with self._lock:
                self._obeyed += 1
            holds = claim.group(1).lower() in {"yes", "true"}
        else:
            holds = condition_holds(text.data, dict(RULE_FIELD.findall(rule.data)))
        # The answer format is the one the prompt's last line asks for.
        applicable = '"applicable"' in prompt[prompt.rfind("</rule") :]
        return AIMessage(
            json.dumps(_decision(holds=holds, applicable=applicable, reason="as read"))
        )
