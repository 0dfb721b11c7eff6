"""Errors the `tag` commands report in one line, without a traceback."""

from __future__ import annotations

from langchain_tag.models import CallRetry


class CommandError(Exception):
    """A problem the user can fix; printed without a traceback."""


def model_failed(error: Exception) -> bool:
    """Whether `error` is the model provider failing, after the retries."""
    from langchain_tag.matching import JudgmentError  # noqa: PLC0415 - loads the judge

    return (
        isinstance(error, JudgmentError)
        or CallRetry().is_transient(error)
        or getattr(error, "status_code", None) is not None
    )
