"""The verdict log's records: what it keeps of each judgment, and of each skip.

Pydantic models, as they cross the log's boundary: what `VerdictLog.append` takes,
`records` and `skips` give back, and `stats` reports. See `verdict_log` for the log.
"""

from __future__ import annotations

import time
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag._text import digest
from langchain_tag.learning.learned_prefilter import HashedFeatures
from langchain_tag.matching.judge import Verdict
from langchain_tag.rules import Rule

__all__ = [
    "DEFAULT_TRAINING_SOURCES",
    "LogRecord",
    "Retention",
    "RuleCounts",
    "SkipRecord",
    "VerdictLogStats",
    "VerdictRecord",
]

DEFAULT_TRAINING_SOURCES = ("judge", "cascade-cheap", "cascade-strong")
"""Sources whose verdicts are applicability verdicts. The relevance baseline's
judge sees the action and answers another question: not trained on by default."""


class _PairRecord(BaseModel):
    """What every record of the log holds: the (input, rule) pair it is about."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int | None = Field(default=None, description="Assigned by the log.")
    input_digest: str = Field(min_length=1, description="SHA-256 of the input.")
    text: str | None = Field(default=None, description="The input, if kept.")
    features: HashedFeatures | None = Field(
        default=None, description="The input's hashed features, if no text is kept."
    )
    rule_id: str = Field(min_length=1)
    rule_hash: str = Field(min_length=1, description="`Rule.content_hash()`.")


class VerdictRecord(_PairRecord):
    """One judgment as the log keeps it."""

    applies: bool
    score: float | None = None
    error: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    profile: str | None = None
    source: str = Field(default="judge", min_length=1)
    explore: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="For a shadow judgment of a pair the prefilter skipped: the "
        "exploration rate it was drawn at.",
    )
    created: float = Field(default_factory=time.time, description="Unix time.")
    reason: str | None = Field(
        default=None, description="The judge's reason for the verdict, if it gave one."
    )

    @classmethod
    def of(
        cls,
        text: str,
        rule: Rule,
        verdict: Verdict,
        *,
        model: str | None = None,
        prompt_version: str | None = None,
        profile: str | None = None,
        source: str = "judge",
        explore: float | None = None,
    ) -> VerdictRecord:
        """The record of `verdict` on (`text`, `rule`)."""
        return cls(
            input_digest=digest(text),
            text=text,
            rule_id=rule.rule_id,
            rule_hash=rule.content_hash(),
            applies=verdict.applies,
            score=verdict.score,
            error=verdict.error,
            model=model,
            prompt_version=prompt_version,
            profile=profile,
            source=source,
            explore=explore,
            reason=verdict.reason,
        )

    @property
    def weight(self) -> float:
        """How many judgments it stands for: `1 / explore` for a shadow one."""
        return 1.0 if self.explore is None else 1.0 / self.explore


class SkipRecord(_PairRecord):
    """A pair a learned prefilter skipped: a record without a verdict.

    Kept apart from the verdicts (see `verdict_log`): no reader of verdicts sees
    it. A skipped pair that was explored has a verdict too (with its `explore`).
    """

    skipped_yes: float = Field(
        ge=0.0,
        le=1.0,
        description="P(YES | skipped) the model in force predicted for the rule "
        "(`Screening.skipped_yes`).",
    )
    explore: float = Field(
        ge=0.0, le=1.0, description="The rate skipped pairs were explored at."
    )
    created: float = Field(default_factory=time.time, description="Unix time.")

    @classmethod
    def of(
        cls, text: str, rule: Rule, skipped_yes: float, *, explore: float
    ) -> SkipRecord:
        """The record of skipping `rule` for `text`."""
        return cls(
            input_digest=digest(text),
            text=text,
            rule_id=rule.rule_id,
            rule_hash=rule.content_hash(),
            skipped_yes=skipped_yes,
            explore=explore,
        )


LogRecord = VerdictRecord | SkipRecord
"""What the log writes: verdicts, and skip records."""


class Retention(BaseModel):
    """How much of the log to keep."""

    model_config = ConfigDict(frozen=True)

    max_rows: int | None = Field(default=None, ge=1)
    """Keep at most this many verdicts, the newest."""
    max_age: timedelta | None = None
    """Delete verdicts older than this."""
    prune_every: int = Field(default=1000, ge=1)
    """A writer prunes after appending this many rows."""


class RuleCounts(BaseModel):
    """A rule's verdicts in the log."""

    judged: int
    applies: int


class VerdictLogStats(BaseModel):
    """What a verdict log holds."""

    verdicts: int
    skipped: int = Field(default=0, description="Skip records (not verdicts).")
    inputs: int
    inputs_with_text: int
    inputs_hashed: int
    rules: int
    applies: int
    failed: int
    shadow: int
    oldest: float | None = Field(description="Unix time of the oldest verdict.")
    newest: float | None
    position: int = Field(description="The newest verdict's id (only grows).")
    by_source: dict[str, int]
    by_model: dict[str, int]
    per_rule: dict[str, RuleCounts]
