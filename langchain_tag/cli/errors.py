"""Errors the `tag` commands report in one line, without a traceback.

Options are checked by argparse types that say which option is wrong and why.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_tag.errors import CommandError, JudgmentError

if TYPE_CHECKING:
    from langchain_tag.rules import Rulebook


def model_failed(error: Exception) -> bool:
    """Whether `error` is the model provider failing, after the retries."""
    from langchain_tag.models import CallRetry  # noqa: PLC0415 - loads langchain-core

    return (
        isinstance(error, JudgmentError)
        or CallRetry().is_transient(error)
        or getattr(error, "status_code", None) is not None
    )


def model_name(text: str) -> str:
    """An argparse type: a model name, never empty (that would be sent as '')."""
    if not text.strip():
        msg = "must name a model, got an empty name (leave --model out for $TAG_MODEL)"
        raise argparse.ArgumentTypeError(msg)
    return text


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            msg = f"must be an integer >= {minimum}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def number_in(
    low: float, high: float, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a number in [`low`, `high`], or (`low`, `high`] if `low_open`.

    The message names the range as written here, e.g. "must be a number in (0, 1],
    got '0'"; nan is in no range.
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        # nan fails every comparison, so it is refused as well.
        above = value > low if low_open else value >= low
        if not (above and value <= high):
            msg = f"must be a number in {interval}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


probability = number_in(0.0, 1.0)
"""An argparse type: a number in [0, 1]."""


def check_writable(path: Path, *, example: str, not_done: str) -> None:
    """Refuse an output path that cannot be written, before any work is done.

    Args:
        path: The `-o` path.
        example: A file name to suggest inside `path` when it is a directory.
        not_done: What the command did not do, for the message ("extracted").

    Raises:
        CommandError: `path` is a directory, or cannot be created or written.
    """
    problem = None
    if path.is_dir():
        problem = f"is a directory; name the file, e.g. {path / example}"
    else:
        parent = path.parent
        existing = next(p for p in (parent, *parent.parents) if p.exists())
        if not existing.is_dir():
            problem = f"cannot be created: {existing} is not a directory"
        else:
            try:
                with tempfile.NamedTemporaryFile(dir=existing, prefix=".tag-check-"):
                    pass
            except OSError as error:
                problem = f"cannot be written ({error.strerror}); choose another path"
    if problem is not None:
        msg = f"-o {path}: {problem}. Nothing was {not_done}."
        raise CommandError(msg)


def no_rules(path: str, rulebook: Rulebook) -> str:
    """Why a rulebook without rules is refused: how it was made, what to do."""
    sources = ", ".join(d.source or d.document_id for d in rulebook.documents)
    made = (
        f"`tag extract` wrote it from {sources} and kept no rule; its extraction "
        "report (the file's diagnostics) says why. Re-run `tag extract` on the "
        "documents that state your rules"
        if sources
        else f"Add rules to it, or extract them with `tag extract DOCUMENTS -o {path}`"
    )
    return f"{path}: the rulebook holds no rules, so there is nothing to match. {made}."
