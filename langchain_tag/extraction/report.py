"""The extraction report: what each phase did, what was dropped and why, and the cost.

It is stored in `Rulebook.diagnostics` and printed by `tag extract`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class PhaseReport(BaseModel):
    """Counts for one phase."""

    calls: int = Field(default=0, description="LLM calls this run sent to the model.")
    stored_answers: int = Field(
        default=0,
        description="Answers reused instead: from the answer store, or from calls "
        "made before an interruption, by the run this one resumed.",
    )
    input_tokens: int = Field(default=0, description="Of the calls this run made.")
    output_tokens: int = Field(default=0, description="Of the calls this run made.")
    items_out: int = 0
    problems: dict[str, int] = Field(
        default_factory=dict,
        description="Validation events by reason: drops, repairs, malformed outputs.",
    )
    skipped: bool = False


class ExtractionReport(BaseModel):
    """Everything a user needs to judge an extraction run."""

    domain: str
    documents: int
    sections: int
    phases: dict[str, PhaseReport]
    pairs_compared: int = Field(description="Rule pairs sharing a tag (phase 4).")
    pairs_possible: int = Field(description="M(M-1)/2 over the rules entering phase 4.")
    duplicates_merged: int
    relations: dict[str, int]
    faithfulness_mode: str
    faithful: int
    unfaithful_removed: list[dict[str, Any]]
    coverage_spans: int
    uncovered_before_recovery: int
    recovered_rules: int
    uncovered_after_recovery: list[str]
    independence: float
    shared_names: dict[str, int]
    rules: int
    seconds: float

    @property
    def faithfulness(self) -> float:
        """Share of rules whose source text was found in their document."""
        checked = self.faithful + len(self.unfaithful_removed)
        return 1.0 if checked == 0 else self.faithful / checked

    @property
    def coverage(self) -> float:
        """Share of normative spans covered by a surviving rule."""
        if self.coverage_spans == 0:
            return 1.0
        return 1 - len(self.uncovered_after_recovery) / self.coverage_spans

    def format(self) -> str:
        """A plain-text summary for terminals and logs."""
        header = (
            f"{'phase':<12}{'made':>7}{'reused':>8}{'in tok':>9}{'out tok':>9}"
            f"{'items':>8}"
        )
        lines = [
            (
                f"Extraction report ({self.domain}): {self.rules} rules from "
                f"{self.documents} document(s), {self.sections} section(s), "
                f"{self.seconds:.1f} s"
            ),
            "",
            f"{header}  problems",
        ]
        for name, phase in self.phases.items():
            problems = ", ".join(f"{k}={v}" for k, v in sorted(phase.problems.items()))
            if phase.skipped:
                problems = "skipped" + (f"; {problems}" if problems else "")
            lines.append(
                f"{name:<12}{phase.calls:>7}{phase.stored_answers:>8}"
                f"{phase.input_tokens:>9}"
                f"{phase.output_tokens:>9}{phase.items_out:>8}  {problems or '-'}"
            )
        relations = ", ".join(f"{k}={v}" for k, v in sorted(self.relations.items()))
        made = sum(p.calls for p in self.phases.values())
        reused = sum(p.stored_answers for p in self.phases.values())
        lines += [
            "",
            f"LLM calls: {made} made, {reused} reused (answer store or resumed run)",
            (
                f"phase 4: {self.pairs_compared} of {self.pairs_possible} possible "
                f"pairs compared (shared tags); {self.duplicates_merged} duplicates "
                f"merged; relations: {relations or 'none'}"
            ),
            (
                f"faithfulness ({self.faithfulness_mode}): {self.faithfulness:.3f} "
                f"({len(self.unfaithful_removed)} removed)"
            ),
            (
                f"coverage: {self.coverage:.3f} ({self.uncovered_before_recovery} of "
                f"{self.coverage_spans} spans uncovered before re-extraction, "
                f"{self.recovered_rules} rules recovered, "
                f"{len(self.uncovered_after_recovery)} still uncovered)"
            ),
            f"independence: {self.independence:.3f}"
            + (
                f" (shared names: {', '.join(sorted(self.shared_names))})"
                if self.shared_names
                else ""
            ),
        ]
        return "\n".join(lines)
