"""`NPOVFakeChatModel`: every role of the NPOV evaluation, answered from known pairs.

It judges rules like `RuleAwareFakeChatModel`, with quoted example words of a
condition ('legendary', 'so-called', as the curated NPOV rulebook writes them) as
its triggers too; it rewrites a sentence into its known neutral version when the
executor is given any guidance, and copies it unchanged otherwise (as the NPOV
template asks for NONE); and it grades a rewrite as the VFR judge would: fixed iff
the rewrite differs from the original. Not a language model: it makes the harness's
NPOV path run end to end with answers a test can predict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from langchain_core.messages import AIMessage
from pydantic import Field

from langchain_tag.testing.judges import RuleAwareFakeChatModel

__all__ = ["NPOVFakeChatModel"]

_QUOTED = re.compile(r"'([^']+)'")
_GUIDANCE_ITEM = re.compile(r"^\[[^\]\n]+\] ", re.MULTILINE)
_VFR_BLOCK = re.compile(r"{name}:\n<([^>\n]+)>\n(.*?)\n</\1>", re.DOTALL)


def _vfr_block(prompt: str, heading: str) -> str | None:
    pattern = _VFR_BLOCK.pattern.replace("{name}", re.escape(heading))
    found = re.search(pattern, prompt, re.DOTALL)
    return None if found is None else found.group(2)


class NPOVFakeChatModel(RuleAwareFakeChatModel):
    """Judge, NPOV executor and VFR judge at once, deterministic.

    Attributes:
        neutral: Biased sentence -> its neutral version (the executor's rewrite).
    """

    neutral: Mapping[str, str] = Field(default_factory=dict)

    def _decide(self, text: str, fields: Mapping[str, str]) -> tuple[bool, float]:
        holds, confidence = super()._decide(text, fields)
        condition = fields.get("condition") or fields.get("applies_when") or ""
        words = set(text.lower().split())
        quoted = any(w.lower() in words for w in _QUOTED.findall(condition))
        return holds or quoted, confidence

    def _answer(self, prompt: str) -> AIMessage:
        if "Rewrite:" in prompt and "Applied rules:" in prompt:
            return AIMessage(self._rewrite(prompt))
        original = _vfr_block(prompt, "The original sentence")
        rewrite = _vfr_block(prompt, "The rewrite to grade")
        if original is not None and rewrite is not None:
            fixed = original.split() != rewrite.split()
            scores = {"Rem": 4 if fixed else 1, "Pres": 5, "Tone": 4, "Flu": 5}
            return AIMessage(json.dumps({"VFR": fixed, **scores}))
        return super()._answer(prompt)

    def _rewrite(self, prompt: str) -> str:
        sentence = next((s for s in self.neutral if s in prompt), None)
        items = _GUIDANCE_ITEM.findall(prompt)
        if sentence is None or not items:
            copied = sentence or ""
            return f"Applied rules: NONE\nReasoning: No guidance.\nRewrite: {copied}"
        applied = items[0].strip("[] ")
        return (
            f"Applied rules: {applied}\nReasoning: Removed the loaded wording.\n"
            f"Rewrite: {self.neutral[sentence]}"
        )
