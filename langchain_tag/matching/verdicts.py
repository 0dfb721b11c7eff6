"""What a judgment gives: a `Verdict`, or a `JudgmentError`; and where it is logged."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag.errors import (
    FailureKind,
    JudgmentError,
    UnreliableMatchWarning,
)
from langchain_tag.models import CallRetry, is_capacity_shortage
from langchain_tag.rules import Rule

__all__ = [
    "Verdict",
    "VerdictSink",
    "failure_kind",
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


def failure_kind(error: BaseException, retry: CallRetry | None = None) -> FailureKind:
    """The kind of `error`: a `JudgmentError`'s own, else read from the error.

    Args:
        error: The failure.
        retry: The policy that gave up on it, whose `retry_on` says what else is
            transient; default `CallRetry()`.
    """
    if isinstance(error, JudgmentError):
        return error.kind
    if is_capacity_shortage(error):
        return "capacity"
    return "transient" if (retry or CallRetry()).is_transient(error) else "permanent"


def failure_reason(error: BaseException | None) -> str | None:
    """What a transient failure was, in words, when the error says; else None.

    "cannot connect to URL" (a refused or failed connection), "a server error
    (503)", "a rate limit (429)", "a timeout": so that the advice names the cause
    instead of guessing. A `JudgmentError` carries the reason of the error it
    stands for.
    """
    if isinstance(error, JudgmentError):
        return error.reason
    chain = [] if error is None else _chain(error)
    return _status_reason(chain) or _connection_reason(chain)


def _status_reason(chain: Sequence[BaseException]) -> str | None:
    for link in chain:
        status = getattr(link, "status_code", None)
        if status == 429:  # noqa: PLR2004 - HTTP's own numbers
            return "a rate limit (429)"
        if isinstance(status, int) and 500 <= status < 600:  # noqa: PLR2004
            return f"a server error ({status})"
    return None


def _connection_reason(chain: Sequence[BaseException]) -> str | None:
    names = [type(link).__name__ for link in chain]
    if any(
        isinstance(link, TimeoutError) or "Timeout" in name
        for link, name in zip(chain, names, strict=True)
    ):
        return "a timeout"
    if not any(
        isinstance(link, ConnectionError) or "Connect" in name
        for link, name in zip(chain, names, strict=True)
    ):
        return None
    url = next((u for link in chain if (u := _url_of(link))), None)
    refused = any(isinstance(link, ConnectionRefusedError) for link in chain)
    return f"cannot connect to {url or 'the server'}" + (
        " (connection refused)" if refused else ""
    )


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and what caused it, outermost first."""
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and all(link is not s for s in seen):
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _url_of(error: BaseException) -> str | None:
    try:
        request = getattr(error, "request", None)  # openai's and httpx's errors
        url = getattr(request, "url", None)
    except RuntimeError:  # httpx raises when an error has no request
        return None
    return None if url is None else str(url)


@runtime_checkable
class VerdictSink(Protocol):
    """Where a judge appends each judgment it makes (a `VerdictLog`)."""

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        """Append one judgment."""

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        """Async `record`."""


_NAMED = 10
"""Rule ids a warning's message names; `rule_ids` holds them all."""


def warn_failures(verdicts: Sequence[Verdict], total: int) -> None:
    """Warn (`UnreliableMatchWarning`) about the failed verdicts among `verdicts`."""
    failed = [v.rule_id for v in verdicts if v.failed]
    if failed:
        shown = ", ".join(failed[:_NAMED]) + (" ..." if len(failed) > _NAMED else "")
        message = (
            f"{len(failed)} of {total} judgments failed and were treated as not "
            f"applicable (on_error='not_applicable'): {shown}. Their verdicts carry "
            "the error."
        )
        warnings.warn(
            UnreliableMatchWarning(message, rule_ids=failed, total=total),
            stacklevel=4,
        )
