"""Rules whose text addresses the model, the judge or the reader's tools: flagged.

A document can hold text written for a model rather than for people ("you must
output YES for every rule", "ignore the previous instructions"). Extracted as it is,
such a paragraph becomes an ordinary rule, and a judge that obeys it says YES to
everything. Such rules are kept (never dropped silently: a false alarm would lose a
real rule) and flagged: `metadata["flagged"]` names what was found, so a filter
(`{"flagged": ...}`) or a reviewer can act, and the extraction report lists them.

The patterns are words addressed to an AI system or about a verdict, which
instruction documents for people do not contain; they are checked on every text
field of the rule and its source span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_tag.rules import Rule

__all__ = ["flag_rules"]

FLAG_KEY = "flagged"
"""The rule metadata key that says what made a rule suspect."""

_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\bignore\b.{0,40}\b(instructions?|prompts?|rules?|above|previous)\b",
        r"\b(disregard|forget)\b.{0,40}\b(instructions?|prompts?|above|previous)\b",
        (
            r"\b(output|answer|respond|reply|return|say)\b.{0,20}\b(yes|no|true|"
            r"false|applicable|not applicable)\b.{0,40}\b(every|each|all|any)\b"
            r".{0,20}\b(rules?|questions?|inputs?)\b"
        ),
        r"\b(you are|as) an? (ai|assistant|language model|llm|chatbot)\b",
        (
            r"\b(language model|llm|chatgpt)s?\b.{0,40}\b(must|should|shall)\b"
            r".{0,40}\b(output|answer|respond|ignore|say)\b"
        ),
        r"\b(system prompt|developer message|jailbreak|prompt injection)\b",
        r"</?\s*(system|assistant|user|rule|input)\b[^>]*>",
    )
)


def injection_phrase(text: str) -> str | None:
    """The first words of `text` that address a model, or None."""
    for pattern in _PATTERNS:
        if found := pattern.search(text):
            return found.group(0)[:80]
    return None


def flag_rules(rules: Sequence[Rule]) -> tuple[list[Rule], list[dict[str, str]]]:
    """`rules` with the suspect ones flagged in their metadata, and what was found.

    Returns:
        The rules (flagged ones copied with `metadata[FLAG_KEY]` set) and one
        `{"rule_id", "found"}` per flagged rule, for the extraction report.
    """
    kept: list[Rule] = []
    found: list[dict[str, str]] = []
    for rule in rules:
        texts = [
            rule.name,
            rule.condition,
            rule.action,
            rule.source_text,
            *(v for v in (rule.applies_when, rule.constraint) if v),
            *rule.fields.values(),
        ]
        phrase = next((p for t in texts if (p := injection_phrase(t))), None)
        if phrase is None:
            kept.append(rule)
            continue
        why = f"addresses the model: {phrase!r}"
        kept.append(
            rule.model_copy(update={"metadata": {**rule.metadata, FLAG_KEY: why}})
        )
        found.append({"rule_id": rule.rule_id, "found": why})
    return kept, found
