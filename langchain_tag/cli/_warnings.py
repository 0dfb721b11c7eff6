"""One line for the judgments that failed during a `tag` command's run.

Under `on_error="not_applicable"` a judge warns with `UnreliableMatchWarning` each
time some of its judgments failed: once per rule or per input, each printed with a
Python source line. A command runs inside `failed_judgments`, which keeps those
warnings and, when the run ends, prints a single line to stderr: how many
judgments failed and which rules. Other warnings pass through unchanged.
"""

from __future__ import annotations

import re
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["FailedJudgments", "failed_judgments"]

SHOWN = 8
"""Rule ids named in the line; more are counted."""

_WARNED = re.compile(
    r"(?P<count>\d+) of \d+ judgments? failed\b.*?: (?P<ids>.*?)\. "
    r"Their verdicts carry the error",
    re.DOTALL,
)
"""`warn_failures`' message: the count of failed judgments and the rules (the
first ten, then " ...")."""

_CUT = " ..."


class FailedJudgments:
    """The failed judgments that `UnreliableMatchWarning`s reported, summed."""

    def __init__(self) -> None:
        """Start with none."""
        self.count = 0
        self.rule_ids: dict[str, None] = {}  # a set that keeps the order
        self.cut = False
        """Whether a warning named only some of its rules."""
        self._lock = threading.Lock()  # judges warn from worker threads

    def add(self, message: str) -> None:
        """Count the judgments and rules one warning's `message` reports."""
        found = _WARNED.search(message)
        with self._lock:
            if found is None:  # a message of another form: at least one failed
                self.count += 1
                self.cut = True
                return
            self.count += int(found["count"])
            ids = found["ids"]
            if ids.endswith(_CUT):
                ids, self.cut = ids.removesuffix(_CUT), True
            self.rule_ids.update(dict.fromkeys(i for i in ids.split(", ") if i))

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
        more = len(ids) - SHOWN
        if more > 0 and not self.cut:
            named += f" and {more} more"
        elif more > 0 or self.cut:
            named = (named + " and others") if named else "not named"
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
    # Imported here: `tag --help` loads no judge.
    from langchain_tag.matching import UnreliableMatchWarning  # noqa: PLC0415

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
            if issubclass(category, UnreliableMatchWarning):
                failed.add(str(message))
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
