"""The extraction report: what each phase did, what was dropped and why, and the cost.

It is stored in `Rulebook.diagnostics` and printed by `tag extract`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from langchain_tag.extraction.phases import unreadable_problem


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
    candidate_pairs: int = Field(
        default=0,
        description="Distinct rule pairs sharing a tag: phase 4's candidates.",
    )
    pairs_compared: int = Field(
        description="Candidate pairs that met in a phase-4 call: all of them at or "
        "under `max_pairs`; over it, the `max_pairs` most similar, and any other "
        "pair of the same call."
    )
    pairs_skipped: int = Field(
        default=0, description="Candidate pairs not compared because of `max_pairs`."
    )
    max_pairs: int | None = Field(
        default=None, description="The run's cap on phase-4 pairs; None: none."
    )
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
    flagged: list[dict[str, str]] = Field(
        default_factory=list,
        description="Rules kept but flagged because their text addresses the model "
        "(`extraction._flags`): rule_id and what was found.",
    )

    @model_validator(mode="before")
    @classmethod
    def _candidates_of_uncapped_runs(cls, data: Any) -> Any:
        # Reports written before the cap compared every candidate pair.
        if isinstance(data, dict) and "candidate_pairs" not in data:
            return {**data, "candidate_pairs": data.get("pairs_compared", 0)}
        return data

    @property
    def faithfulness(self) -> float:
        """Share of rules whose source text was found in their document.

        1.0 when no rule was checked; `format` then says "n/a".
        """
        checked = self.faithful + len(self.unfaithful_removed)
        return 1.0 if checked == 0 else self.faithful / checked

    @property
    def coverage(self) -> float:
        """Share of normative spans covered by a surviving rule.

        1.0 when there was no span; `format` then says "n/a".
        """
        if self.coverage_spans == 0:
            return 1.0
        return 1 - len(self.uncovered_after_recovery) / self.coverage_spans

    @property
    def unreadable(self) -> dict[str, dict[str, int]]:
        """The model answers that could not be read, by phase and reason."""
        return {
            name: found
            for name, phase in self.phases.items()
            if (
                found := {
                    k: n for k, n in phase.problems.items() if unreadable_problem(k)
                }
            )
        }

    def format(self, *, stored: bool = False) -> str:
        """A plain-text summary for terminals and logs.

        Args:
            stored: The report is that of an earlier run, returned again without
                running (a finished extraction re-run): its counts are labelled
                as the stored run's, not this one's.
        """
        header = (
            f"{'phase':<12}{'made':>7}{'reused':>8}{'in tok':>9}{'out tok':>9}"
            f"{'items':>8}"
        )
        lines = [
            (
                f"{'Stored extraction' if stored else 'Extraction'} report "
                f"({self.domain}): {self.rules} rules from {self.documents} "
                f"document(s), {self.sections} section(s), {self.seconds:.1f} s"
                + (" when it ran" if stored else "")
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
        calls = (
            f"LLM calls{' when it ran' if stored else ''}: {made} made, {reused} "
            "reused (answer store or resumed run)"
            + ("; this run made none" if stored else "")
        )
        lines += [
            "",
            calls,
            (
                f"{self._pairs_line()}; {self.duplicates_merged} duplicates "
                f"merged; relations: {relations or 'none'}"
            ),
            self._faithfulness_line(),
            self._coverage_line(),
            self._independence_line(),
        ]
        lines += [
            f"warning: rule {f['rule_id']} {f['found']}; kept, flagged in its "
            "metadata: review it before judging with it"
            for f in self.flagged
        ]
        return "\n".join(lines)

    def _pairs_line(self) -> str:
        if not self.pairs_skipped:
            return (
                f"phase 4: {self.pairs_compared} of {self.pairs_possible} possible "
                "pairs compared (shared tags)"
            )
        # Over the cap, `max_pairs` pairs were chosen; the others met in their calls.
        extra = self.pairs_compared - (self.max_pairs or 0)
        return (
            f"phase 4: compared {self.pairs_compared:,} of {self.candidate_pairs:,} "
            f"rule pairs sharing a tag ({self.pairs_skipped:,} skipped by "
            f"max_pairs={self.max_pairs} (--max-pairs); the most similar kept"
            + (f", and {extra:,} more that shared their calls" if extra > 0 else "")
            + f"), of {self.pairs_possible:,} possible"
        )

    # A score over nothing is no score: "n/a", never a perfect 1.000.

    def _faithfulness_line(self) -> str:
        removed = len(self.unfaithful_removed)
        score = (
            "n/a (nothing to check, "
            if self.faithful + removed == 0
            else f"{self.faithfulness:.3f} ("
        )
        return f"faithfulness ({self.faithfulness_mode}): {score}{removed} removed)"

    def _coverage_line(self) -> str:
        still = len(self.uncovered_after_recovery)
        if self.coverage_spans == 0:
            return "coverage: n/a (no span to cover was found)"
        return (
            f"coverage: {self.coverage:.3f} ({self.uncovered_before_recovery} of "
            f"{self.coverage_spans} spans uncovered before re-extraction, "
            f"{self.recovered_rules} rules recovered, {still} still uncovered)"
        )

    def _independence_line(self) -> str:
        if self.rules == 0:
            return "independence: n/a (no rule)"
        shared = (
            f" (shared names: {', '.join(sorted(self.shared_names))})"
            if self.shared_names
            else ""
        )
        return f"independence: {self.independence:.3f}{shared}"
