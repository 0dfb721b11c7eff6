"""What a judgment gives: a `Verdict`, or a `JudgmentError`; and where it is logged."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag.errors import TAGError
from langchain_tag.rules import Rule

__all__ = [
    "JudgmentError",
    "UnreliableMatchWarning",
    "Verdict",
    "VerdictSink",
    "warn_failures",
]


class Verdict(BaseModel):
    """The outcome of judging one rule against one input."""

    model_config = ConfigDict(frozen=True)

    rule_id: str
    applies: bool
    score: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="P(YES) / (P(YES) + P(NO)) from the model's logprobs, if any.",
    )
    reason: str | None = Field(
        default=None,
        description="The judge's reason, when it gave one (a constraint profile, "
        "or `ApplicabilityJudge(rationale=True)`).",
    )
    error: str | None = Field(
        default=None,
        description="Why the judgment failed; `applies` is then False by policy only.",
    )
    cached: bool = False
    decided_by: str | None = Field(
        default=None,
        description="The stage of a `CascadeJudge` that decided (`cheap` or "
        "`strong`); None for a single judge.",
    )

    @property
    def failed(self) -> bool:
        """True if the judgment failed and `applies` was decided by the error policy."""
        return self.error is not None

    @property
    def relevance(self) -> float:
        """What ranks applicable rules: the score, or 1.0 for an unscored verdict."""
        return 1.0 if self.score is None else self.score


_UNREADABLE = ("unparseable judge output", "unreadable judge output")
"""How the judge's errors start when it got an answer it could not read."""


class JudgmentError(TAGError, RuntimeError):
    """A judgment failed after its retries under `on_error="raise"`.

    `transient` tells whether the last error was one worth retrying later (a rate
    limit, a timeout): an outer retry, such as a LangGraph node's, may try again.
    `unreadable` tells whether the judge's answer could not be read: at temperature
    0 asking again gives the same answer, so only another model helps. The message
    advises accordingly.
    """

    def __init__(self, rule_id: str, error: str, *, transient: bool = False) -> None:
        """Record which rule's judgment failed and why."""
        self.rule_id = rule_id
        self.error = error
        self.transient = transient
        self.unreadable = not transient and error.startswith(_UNREADABLE)
        if transient:
            advice = "the failure is transient (a rate limit or a timeout): retry later"
        elif self.unreadable:
            advice = (
                "the answer could not be read, and at temperature 0 asking again "
                "gives the same answer: use a stronger model"
            )
        else:
            advice = (
                "the error is not transient, so asking again fails the same way: "
                "fix its cause"
            )
        super().__init__(
            f"Judging rule {rule_id!r} failed: {error}. Nothing was assumed about "
            f"it; {advice}, or set on_error='not_applicable' to go on with such "
            "rules flagged as unjudged."
        )


@runtime_checkable
class VerdictSink(Protocol):
    """Where a judge appends each judgment it makes (a `VerdictLog`)."""

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        """Append one judgment."""

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        """Async `record`."""


class UnreliableMatchWarning(UserWarning):
    """Some judgments failed and were treated as not applicable by policy."""


def warn_failures(verdicts: Sequence[Verdict], total: int) -> None:
    """Warn (`UnreliableMatchWarning`) about the failed verdicts among `verdicts`."""
    failed = [v.rule_id for v in verdicts if v.failed]
    if failed:
        shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")  # noqa: PLR2004
        warnings.warn(
            f"{len(failed)} of {total} judgments failed and were treated as not "
            f"applicable (on_error='not_applicable'): {shown}. Their verdicts carry "
            "the error.",
            UnreliableMatchWarning,
            stacklevel=4,
        )
