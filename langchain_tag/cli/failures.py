"""One line for the judgments that failed during a `tag` command's run.

Under `on_error="not_applicable"` a judge warns with `UnreliableMatchWarning` each
time some of its judgments failed: once per rule or per input, each printed with a
Python source line. A command runs inside `failed_judgments`, which keeps those
warnings and, when the run ends, prints a single line to stderr: how many
judgments failed and which rules, as each warning says them (`rule_ids`). Other
warnings pass through unchanged.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from langchain_tag.errors import UnreliableMatchWarning

__all__ = ["FailedJudgments", "failed_judgments"]

SHOWN = 8
"""Rule ids named in the line; more are counted."""


class FailedJudgments:
    """The failed judgments that `UnreliableMatchWarning`s reported, summed."""

    def __init__(self) -> None:
        """Start with none."""
        self.count = 0
        self.rule_ids: dict[str, None] = {}  # a set that keeps the order
        self._lock = threading.Lock()  # judges warn from worker threads

    def add(self, warning: UnreliableMatchWarning) -> None:
        """Count the failed judgments and their rules that `warning` reports."""
        with self._lock:
            self.count += len(warning.rule_ids)
            self.rule_ids.update(dict.fromkeys(warning.rule_ids))

    def summary(self, command: str, option: str | None = None) -> str | None:
        """The line to print, or None when no judgment failed.

        Args:
            command: The `tag` subcommand, e.g. `run`.
            option: The command's option that made failures not applicable, shown
                in parentheses (e.g. `--on-error not_applicable`).
        """
        if not self.count:
            return None
        ids = list(self.rule_ids)
        named = ", ".join(ids[:SHOWN])
        if len(ids) > SHOWN:
            named += f" and {len(ids) - SHOWN} more"
        judgments = (
            "judgment failed and was"
            if self.count == 1
            else "judgments failed and were"
        )
        how = f" ({option})" if option else ""
        return (
            f"tag {command}: warning: {self.count} {judgments} treated as not "
            f"applicable{how}; rules: {named}."
        )


@contextmanager
def failed_judgments(
    command: str, option: str | None = None
) -> Iterator[FailedJudgments]:
    """Keep the run's `UnreliableMatchWarning`s; print one line for them at the end.

    The line goes to stderr when the block ends, also when it raises. Every
    warning is counted, repeats too (the default filter would show a repeated
    text once).

    Args:
        command: The `tag` subcommand, e.g. `run`.
        option: The command's option that made failures not applicable, if any.

    Yields:
        The failed judgments counted so far.
    """
    failed = FailedJudgments()
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(  # `warnings.showwarning`'s signature
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            # A warning that names no rule (raised with a message only, not by a
            # judge) is shown as it is: it cannot be counted.
            if isinstance(message, UnreliableMatchWarning) and message.rule_ids:
                failed.add(message)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", UnreliableMatchWarning)
        warnings.showwarning = show
        try:
            yield failed
        finally:
            line = failed.summary(command, option)
            if line is not None:
                print(line, file=sys.stderr, flush=True)  # noqa: T201
