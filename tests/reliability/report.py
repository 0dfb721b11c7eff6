"""What the reliability suites measured, as the tables of the issue's closing note.

Each test adds rows as it asserts; the conftest prints the tables at the end of the
run, so every number in them comes from a test that passed or failed on it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class FaultRow:
    """One injected fault and what came of it."""

    stage: str
    fault: str
    injected: int
    """Faulty answers or errors the fake produced."""
    retried: int
    """Model calls made again because of them."""
    user_sees: str
    flagged: str
    lost: int
    """Completed work missing at the end (after the documented resume, if any)."""


@dataclass(frozen=True)
class HostileRow:
    """One family of hostile inputs and how many changed a verdict."""

    family: str
    tried: int
    changed: int
    obeyed: int
    """Judgments where the naive fake saw an instruction outside the data."""


@dataclass(frozen=True)
class HostileDocumentRow:
    """One hostile document given to extraction."""

    family: str
    invented: int
    """Spans and rules the obeying fake invented."""
    dropped: int
    """Of those, dropped by phase 1 (not in the section) or phase 5 (unfaithful)."""
    kept_verbatim: int
    """Invented rules kept because the document spells out their source text."""


@dataclass
class ReliabilityReport:
    """Rows added by the suites, printed as Markdown tables."""

    faults: list[FaultRow] = field(default_factory=list)
    hostile: list[HostileRow] = field(default_factory=list)
    documents: list[HostileDocumentRow] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def empty(self) -> bool:
        """Whether nothing was recorded (the suites did not run)."""
        return not (self.faults or self.hostile or self.documents or self.figures)

    def add_fault(self, row: FaultRow) -> None:
        """Record an injected fault."""
        with self._lock:
            self.faults.append(row)

    def add_hostile(self, row: HostileRow) -> None:
        """Record a family of hostile inputs."""
        with self._lock:
            self.hostile.append(row)

    def add_document(self, row: HostileDocumentRow) -> None:
        """Record a hostile document."""
        with self._lock:
            self.documents.append(row)

    def add_figure(self, name: str, value: str) -> None:
        """Record a measured figure (bad files, load)."""
        with self._lock:
            self.figures[name] = value

    def markdown(self) -> str:
        """The tables, in Markdown."""
        lines: list[str] = []
        if self.faults:
            faults = sorted(self.faults, key=lambda r: (r.stage, r.fault))
            lines += _table(
                (
                    "stage",
                    "fault",
                    "injected",
                    "retried",
                    "what the user sees",
                    "flagged",
                    "data lost",
                ),
                [
                    (
                        r.stage,
                        r.fault,
                        r.injected,
                        r.retried,
                        r.user_sees,
                        r.flagged,
                        r.lost,
                    )
                    for r in faults
                ],
            )
            lines.append(
                f"faults injected: {sum(r.injected for r in faults)} in {len(faults)} "
                f"cases; retried calls: {sum(r.retried for r in faults)}; data lost: "
                f"{sum(r.lost for r in faults)}\n"
            )
        if self.hostile:
            hostile = sorted(self.hostile, key=lambda r: r.family)
            lines += _table(
                ("hostile family", "tried", "verdicts changed", "obeyed (naive fake)"),
                [(r.family, r.tried, r.changed, r.obeyed) for r in hostile],
            )
            lines.append(
                f"hostile inputs tried: {sum(r.tried for r in hostile)}; verdicts "
                f"changed: {sum(r.changed for r in hostile)}\n"
            )
        if self.documents:
            lines += _table(
                (
                    "hostile document",
                    "invented by the obeying fake",
                    "dropped",
                    "kept (source verbatim in the document)",
                ),
                [
                    (r.family, r.invented, r.dropped, r.kept_verbatim)
                    for r in sorted(self.documents, key=lambda r: r.family)
                ],
            )
        lines += [f"- {name}: {value}" for name, value in sorted(self.figures.items())]
        return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    """A Markdown table, then a blank line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return [*lines, ""]


REPORT_KEY = pytest.StashKey[ReliabilityReport]()
