"""Deterministic fake chat models for testing code built on langchain-tag.

`RuleAwareFakeChatModel` plays the applicability judge from the prompt text alone: it
reads the input and the rule out of the judge's message and answers YES exactly when
a backtick-quoted fragment of the rule's condition occurs in the input. It is safe
under concurrency, can add latency, can return logprobs, counts its in-flight calls,
and can inject faults per rule. None of this is a language model; it exists so that
tests and benchmarks exercise the real code paths with known right answers.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

_INPUT = re.compile(r"<input>\n(.*)\n</input>", re.DOTALL)
_RULE = re.compile(r"<rule>\n(.*?)\n</rule>", re.DOTALL)
_FIELD = re.compile(r"^(\w+): (.*)$", re.MULTILINE)
_TRIGGER = re.compile(r"`([^`]+)`")

Fault = BaseException | str | None
"""An exception to raise, a text to answer instead, or None for a normal answer."""


class TransientFakeError(Exception):
    """A provider error with an HTTP status, as rate limits and overloads carry."""

    def __init__(self, message: str = "rate limited", status_code: int = 429) -> None:
        """Create an error carrying `status_code`."""
        super().__init__(message)
        self.status_code = status_code


def judge_fields(prompt: str) -> tuple[str, dict[str, str]] | None:
    """The input and the rule fields of a judge prompt, or None for other prompts."""
    found_input = _INPUT.search(prompt)
    found_rule = _RULE.search(prompt)
    if not found_input or not found_rule:
        return None
    return found_input.group(1), dict(_FIELD.findall(found_rule.group(1)))


def condition_holds(text: str, fields: Mapping[str, str]) -> bool:
    """The fake's ground truth: a backtick-quoted condition fragment is in the input."""
    condition = fields.get("condition") or fields.get("applies_when") or ""
    lowered = text.lower()
    return any(t.lower() in lowered for t in _TRIGGER.findall(condition))


class RuleAwareFakeChatModel(BaseChatModel):
    """A fake judge that answers from the prompt's content, deterministically.

    Judge prompts get a verdict in the requested format (`{"verdict": ...}` or
    `{"applicable": ..., "reason": ...}`), or prose when `style="prose"`. Any other
    prompt is echoed back after `answer_prefix`, so the model also stands in as an
    executor in chains and shows what it was given.
    """

    style: Literal["json", "prose"] = "json"
    latency: float = 0.0
    """Seconds each call takes (sleeps; async calls do not block the loop)."""
    logprobs: bool = False
    """Attach OpenAI-style logprobs (P(answer) = `confidence` at the verdict token),
    like ChatOpenAI's option of the same name."""
    top_logprobs: int | None = None
    confidence: float = 0.9
    confidence_by_rule: Mapping[str, float] = Field(default_factory=dict)
    """Per rule id, a confidence other than `confidence`."""
    faults: Mapping[str, Sequence[Fault]] = Field(default_factory=dict)
    """Per rule id: what its 1st, 2nd, ... call does instead of answering normally."""
    answer_prefix: str = "ANSWER:"

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _in_flight: int = PrivateAttr(default=0)
    _peak: int = PrivateAttr(default=0)
    _prompts: list[str] = PrivateAttr(default_factory=list)
    _calls_per_rule: defaultdict[str, int] = PrivateAttr(
        default_factory=lambda: defaultdict(int)
    )

    @property
    def _llm_type(self) -> str:
        return "rule-aware-fake"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"style": self.style, "confidence": self.confidence}

    @property
    def peak_in_flight(self) -> int:
        """The most calls that were ever running at once."""
        return self._peak

    @property
    def prompts(self) -> list[str]:
        """Every prompt received (all messages' text joined), in arrival order."""
        with self._lock:
            return list(self._prompts)

    @property
    def calls(self) -> int:
        """Number of calls received."""
        return len(self.prompts)

    def reset(self) -> None:
        """Forget recorded prompts, counters and the fault positions."""
        with self._lock:
            self._prompts.clear()
            self._calls_per_rule.clear()
            self._peak = 0

    def _enter(self, messages: Sequence[BaseMessage]) -> tuple[str, Fault]:
        prompt = "\n".join(str(m.content) for m in messages)
        parsed = judge_fields(prompt)
        rule_id = parsed[1].get("rule_id", "") if parsed else ""
        with self._lock:
            self._prompts.append(prompt)
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            position = self._calls_per_rule[rule_id]
            self._calls_per_rule[rule_id] += 1
        planned = self.faults.get(rule_id, ())
        return prompt, planned[position] if position < len(planned) else None

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _respond(self, prompt: str, fault: Fault) -> ChatResult:
        if isinstance(fault, BaseException):
            raise fault
        if isinstance(fault, str):
            return ChatResult(generations=[ChatGeneration(message=AIMessage(fault))])
        parsed = judge_fields(prompt)
        if parsed is None:
            message = AIMessage(f"{self.answer_prefix} {prompt}")
            return ChatResult(generations=[ChatGeneration(message=message)])
        text, fields = parsed
        holds = condition_holds(text, fields)
        if '"applicable"' in prompt:
            reason = "the input shows the condition" if holds else "no decisive fact"
            content = f'{{"applicable": {str(holds).lower()}, "reason": "{reason}"}}'
            token = str(holds).lower()
        elif self.style == "prose":
            content = (
                "Yes, the condition holds for this input."
                if holds
                else "No, the input does not satisfy the condition."
            )
            token = "Yes" if holds else "No"
        else:
            token = "YES" if holds else "NO"
            content = f'{{"verdict": "{token}"}}'
        metadata: dict[str, Any] = {}
        if self.logprobs:
            confidence = self.confidence_by_rule.get(
                fields.get("rule_id", ""), self.confidence
            )
            metadata["logprobs"] = {
                "content": _logprobs(token, holds=holds, confidence=confidence)
            }
        message = AIMessage(content, response_metadata=metadata)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            if self.latency:
                time.sleep(self.latency)
            return self._respond(prompt, fault)
        finally:
            self._leave()

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            return self._respond(prompt, fault)
        finally:
            self._leave()


def _logprobs(token: str, *, holds: bool, confidence: float) -> list[dict[str, Any]]:
    """OpenAI-style logprobs giving the answer `token` probability `confidence`."""
    other = {"YES": "NO", "NO": "YES", "Yes": "No", "No": "Yes"}.get(
        token, str(not holds).lower()
    )
    top = [
        {"token": token, "logprob": math.log(confidence)},
        {"token": other, "logprob": math.log(1 - confidence)},
    ]
    return [
        {"token": '{"', "logprob": 0.0, "top_logprobs": []},
        {"token": token, "logprob": top[0]["logprob"], "top_logprobs": top},
    ]
