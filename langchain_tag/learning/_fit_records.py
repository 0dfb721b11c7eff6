"""What training takes and gives: judged and skipped pairs, and the fit report.

`LearnedPrefilter.fit` takes `LabelledExample`s (verdicts) and `SkippedPair`s (the
pairs a model skipped, not verdicts); it returns a `FitReport`, with a `RuleFit`
for each rule of the rulebook.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_tag.learning._features import HashedFeatures

__all__ = ["FitReport", "LabelledExample", "RuleFit", "RuleStatus", "SkippedPair"]


class LabelledExample(NamedTuple):
    """One judged pair: the input (text or hashed features), the rule, the verdict.

    `weight` counts the example that many times: a shadow judgment of a pair the
    prefilter skipped, explored at rate `e`, stands for `1 / e` such pairs.
    """

    input: str | HashedFeatures
    rule_id: str
    applies: bool
    weight: float = 1.0


class SkippedPair(NamedTuple):
    """A pair the prefilter skipped: the input, the rule, and what the model expected.

    Not a verdict. `skipped_yes` is the P(YES | skipped) the model in force predicted
    for the rule when it skipped it (`Screening.skipped_yes`). Given to `fit` with
    the verdicts, a skipped pair that no verdict labels enters the threshold step
    as a fractional YES; one that has a verdict (it was explored) marks that verdict
    as a skipped pair's, counted once rather than `weight` times (the skipped
    pairs it stood for are there themselves).
    """

    input: str | HashedFeatures
    rule_id: str
    skipped_yes: float


RuleStatus = Literal[
    "learned",
    "skipped",
    "little_history",
    "always_applies",
    "no_gain",
]


class RuleFit(BaseModel):
    """What training decided for one rule."""

    model_config = ConfigDict(frozen=True)

    status: RuleStatus = Field(
        description="`learned`: skipped when scored below `threshold`; "
        "`skipped`: skipped for every input, having applied too rarely to pay for "
        "its judgments (never, or far less than the target allows); `little_history`: "
        "fewer than `min_examples` verdicts, always judged; `always_applies`: "
        "always answered YES, always judged; `no_gain`: its model saves too little "
        "for the recall it would cost, always judged."
    )
    examples: int
    positives: int
    alpha: float | None = None
    loo_auc: float | None = Field(
        default=None, description="Leave-one-out ROC-AUC of the rule's classifier."
    )
    threshold: float | None = Field(
        default=None, description="Skip when the score is below this (learned only)."
    )
    expected_skip: float = Field(
        default=0.0, description="Expected share of inputs for which it is skipped."
    )
    expected_miss: float = Field(
        default=0.0,
        description="Expected YES verdicts per input lost by skipping it.",
    )

    @property
    def skipped_yes(self) -> float:
        """P(YES | skipped): the expected misses over the expected skips (0: never).

        What a skip record of this rule remembers (`SkippedPair.skipped_yes`).
        """
        skipped = self.expected_miss + self.expected_skip
        return self.expected_miss / skipped if skipped > 0 else 0.0


class FitReport(BaseModel):
    """What `LearnedPrefilter.fit` learned from, and what it expects of itself."""

    model_config = ConfigDict(frozen=True)

    inputs: int
    examples: int
    ignored: int = Field(description="Examples of rules not in the rulebook.")
    skipped: int = Field(
        default=0,
        description="Skipped pairs without a verdict, entered in the threshold step "
        "as fractional YES (`SkippedPair`).",
    )
    target_recall: float = Field(
        description="The recall promised: the share of the judge's YES verdicts to "
        "keep (the prefilter's `target_recall`)."
    )
    internal_target: float = Field(
        description="The recall the thresholds were chosen for: `target_recall`, "
        "or what the miss-budget controller set to keep it over the stream "
        "(`Retrainer`, `MissBudget`)."
    )
    expected_recall: float = Field(
        description="Expected share of YES verdicts kept at `internal_target` (LOO, "
        "conformal), over the rules with enough history."
    )
    expected_judged: float = Field(
        description="Expected rules judged per input, of the rulebook's."
    )
    rules: dict[str, RuleFit]
    seconds: float

    @model_validator(mode="before")
    @classmethod
    def _internal_target_of_older_files(cls, data: Any) -> Any:
        # Saved before the controller existed: the thresholds aimed at the target.
        if isinstance(data, dict) and "internal_target" not in data:
            return {**data, "internal_target": data.get("target_recall")}
        return data

    def count(self, status: RuleStatus) -> int:
        """How many rules training gave `status`."""
        return sum(fit.status == status for fit in self.rules.values())
