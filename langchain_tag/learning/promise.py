"""The recall promise kept live: a miss budget, spent over the stream.

A `LearnedPrefilter` promises `target_recall`: the share of the judge's YES verdicts
on the rules it may skip that it keeps. Live, each retraining learns from the
labels the judge actually gave (what the prefilter let through, plus the skipped
pairs shadow judging explored), and thresholds aimed at the target on those labels
keep less than it: the YES verdicts a model skipped are missing from the next
training set. `LearnedPrefilter.fit` puts the skipped pairs back as fractional YES
(`SkippedPair`); this module chooses, before each retraining, the recall the new
thresholds aim at (`FitReport.internal_target`) so that the stream's recall so far
plus the next window's reaches the target:

- `StreamCounts`: what the verdict log says of the stream so far
  (`VerdictLog.stream_counts`): YES verdicts kept, YES found in the shadow, and the
  misses the models in force predicted.
- `MissBudget`: the controller. It estimates the ratio of actual to predicted
  misses (`allowance`, bounded by what the shadow found), the misses the target
  allows by the end of the next window with a margin for chance (`z`,
  `overdispersion`), and so the predicted misses the next model may spend.

It is strict while few YES verdicts are known and relaxes as they accumulate. What
is promised, and under which conditions, is in `RecallEstimate`'s docs
(`langchain_tag.learning.shadow`). Imports no numpy; SciPy (with the `learned`
extra) for the chi-square quantiles, on first use.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MissBudget"]


class StreamCounts(BaseModel):
    """The stream so far, as the verdict log holds it (`VerdictLog.stream_counts`).

    An input is *screened* when a model skipped at least one rule for it (it has a
    skip record); the others are the *warm-up* (judged before the first model, or
    let wholly through: counting them as warm-up only makes the budget stricter).
    Each (input, rule) pair counts its last verdict.
    """

    model_config = ConfigDict(frozen=True)

    inputs: int = Field(ge=0, description="Distinct inputs judged or screened.")
    warm_inputs: int = Field(ge=0, description="Inputs not screened.")
    warm_yes: int = Field(ge=0, description="YES verdicts on inputs not screened.")
    kept_yes: int = Field(
        ge=0,
        description="YES verdicts of judged, not explored, pairs of screened "
        "inputs (`K`).",
    )
    shadow_yes: int = Field(
        ge=0, description="YES verdicts of explored skipped pairs (`S`)."
    )
    predicted_misses: float = Field(
        ge=0.0,
        description="The YES verdicts the models in force expected among the pairs "
        "they skipped, explored or not: the sum of their P(YES | skipped) (`P`).",
    )
    explored_misses: float = Field(
        ge=0.0,
        description="The shadow YES verdicts those predictions expect: each skipped "
        "pair's P(YES | skipped) times the rate it could be explored at (`eP`).",
    )
    recent_inputs: int = Field(
        default=0, ge=0, description="Distinct inputs with a verdict after `since`."
    )
    recent_verdicts: int = Field(
        default=0, ge=0, description="Verdicts logged after `since`."
    )


class BudgetPlan(BaseModel):
    """One decision of the controller, every step of it (`MissBudget.plan`)."""

    model_config = ConfigDict(frozen=True)

    ratio: float = Field(description="Actual over predicted misses assumed (beta).")
    yes_so_far: float = Field(
        description="YES verdicts of the screened inputs so far: kept plus the "
        "misses estimated (`K + beta P`)."
    )
    window_yes: float = Field(description="YES verdicts expected in the next window.")
    allowed_misses: float = Field(
        description="Misses the target allows by the end of the next window (`B`)."
    )
    expected_misses: float = Field(
        description="The most expected misses whose upper bound stays within "
        "`allowed_misses` (`X`)."
    )
    window_misses: float = Field(
        description="Predicted misses the next model may spend (`m`)."
    )
    internal_target: float = Field(
        description="The recall the next thresholds aim at: `1 - m / window_yes`, "
        "clipped."
    )


class MissBudget(BaseModel):
    """The miss-budget controller: the internal target of each retraining.

    With `K`, `S`, `P`, `eP` of `StreamCounts`, `c` = `allowance`, `phi` =
    `overdispersion`, `t` the target and `E` the inputs expected before the next
    retraining:

        beta = c, lowered to the 95% upper bound of S / eP (when P > 0), raised to
               its 95% lower bound (when S > 0): the chi-square bounds of a Poisson
               count
        Yhat = K + beta P                                  YES so far (screened)
        y    = (YES of the warm-up + Yhat) / inputs * E    YES in the next window
        B    = (1 - t)(Yhat + y)                           misses allowed by then
        X    = largest x with x + z sqrt(phi x) <= B       expected misses, margin
        m    = max(0, X / beta - P)                        predicted misses to spend
        t_int = clip(1 - m / y, 1 - floor (1 - t), max(t, ceiling))

    The defaults are those measured on RuleArena-NBA (`c` is the actual/predicted
    miss ratio the study found live, `phi` the per-order spread of recall);
    `benchmarks/bench_recall_promise.py` reports how they keep the target. Another
    corpus may need its ratio checked (the shadow bounds move beta towards it as
    shadow YES verdicts accumulate).
    """

    model_config = ConfigDict(frozen=True)

    allowance: float = Field(default=1.4, gt=0.0)
    """Assumed ratio of actual to predicted misses (`c`), before the shadow says."""
    overdispersion: float = Field(default=1.5, ge=1.0)
    """Variance of the misses over their mean (`phi`): they come in clusters."""
    z: float = Field(default=1.645, ge=0.0)
    """Normal quantile of the margin: 1.645 keeps the target in ~95% of streams."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Of the one-sided chi-square bounds on the shadow's ratio."""
    floor: float = Field(default=4.0, ge=1.0)
    """The internal target is at least `1 - floor (1 - t)`."""
    ceiling: float = Field(default=0.999, gt=0.0, le=1.0)
    """The internal target is at most this (or `t`, when higher)."""

    def ratio(self, counts: StreamCounts) -> float:
        """Actual over predicted misses (beta): `allowance`, unless the shadow says.

        The shadow's YES `S` is Poisson with mean `beta eP`; its one-sided bounds
        clip `allowance` from above (when it found few) and below (when many).
        """
        beta = self.allowance
        expected = counts.explored_misses
        if counts.predicted_misses <= 0 or expected <= 0:
            return beta
        from scipy.stats import chi2  # type: ignore[import-untyped]  # noqa: PLC0415 - the learned extra

        shadow = counts.shadow_yes
        beta = min(
            beta, float(chi2.ppf(self.confidence, 2 * shadow + 2)) / 2 / expected
        )
        if shadow > 0:
            low = float(chi2.ppf(1 - self.confidence, 2 * shadow)) / 2 / expected
            beta = max(beta, low)
        return beta

    def plan(self, counts: StreamCounts, target: float, window: float) -> BudgetPlan:
        """The internal target of the next training, with every step on the way.

        Args:
            counts: The stream so far (`VerdictLog.stream_counts`).
            target: The promised recall (`target_recall`), in (0, 1].
            window: Inputs expected before the training after this one.

        Raises:
            ValueError: `target` is not in (0, 1] or `window` is negative.
        """
        if not 0.0 < target <= 1.0 or window < 0 or not math.isfinite(window):
            msg = f"need 0 < target <= 1 and window >= 0, got {target} and {window}"
            raise ValueError(msg)
        beta = self.ratio(counts)
        so_far = counts.kept_yes + beta * counts.predicted_misses
        per_input = (counts.warm_yes + so_far) / counts.inputs if counts.inputs else 0.0
        window_yes = per_input * window
        allowed = (1.0 - target) * (so_far + window_yes)
        spread = self.z * self.z * self.overdispersion
        root = (-math.sqrt(spread) + math.sqrt(spread + 4.0 * allowed)) / 2.0
        expected = root * root
        spend = max(0.0, expected / beta - counts.predicted_misses)
        low = max(0.0, 1.0 - self.floor * (1.0 - target))
        high = max(target, self.ceiling)
        aim = 1.0 - spend / window_yes if window_yes > 0 else high
        return BudgetPlan(
            ratio=beta,
            yes_so_far=so_far,
            window_yes=window_yes,
            allowed_misses=allowed,
            expected_misses=expected,
            window_misses=spend,
            internal_target=min(high, max(low, aim)),
        )
