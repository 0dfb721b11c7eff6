"""Shadow judging: keep judging a few of the pairs a prefilter skips.

A learned prefilter skips the rules it predicts the judge would answer NO for. A
small share of those skipped pairs (`explore`) is judged anyway, so that labels keep
flowing for the skipped rules (no feedback loop) and the prefilter's recall can be
estimated live: `explore_pairs` draws them, reproducibly; `estimate_recall` turns
what they found into a recall estimate with a Wilson interval; `RetrainPolicy` says
when enough new verdicts call for training again. No numpy: `TAGRetriever` uses
these on every retrieval.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RecallEstimate", "RetrainPolicy", "estimate_recall", "explore_pairs"]


def explore_pairs(
    skipped: Iterable[str], key: str, *, rate: float = 0.05, seed: int = 0
) -> list[str]:
    """The skipped rules to judge anyway for one input (shadow judging).

    Each (input, rule) pair is explored with probability `rate`, decided by a hash
    of `seed`, `key` and the rule id: reproducible, independent of the other rules
    and of the order they come in.

    Args:
        skipped: The rule ids the prefilter skipped for the input.
        key: Identifies the input, e.g. its SHA-256 digest.
        rate: The share of skipped pairs to judge, in [0, 1].
        seed: Changes which pairs are drawn.

    Returns:
        The explored rule ids, in the order given.

    Raises:
        ValueError: `rate` is outside [0, 1].
    """
    if not 0.0 <= rate <= 1.0:
        msg = f"rate must be in [0, 1], got {rate!r}"
        raise ValueError(msg)
    explored = []
    for rule_id in skipped:
        draw = hashlib.sha256(f"{seed}\x00{key}\x00{rule_id}".encode()).digest()
        if int.from_bytes(draw[:8], "big") / 2.0**64 < rate:
            explored.append(rule_id)
    return explored


class RecallEstimate(BaseModel):
    """The prefilter's recall of YES verdicts, estimated from shadow judgments."""

    model_config = ConfigDict(frozen=True)

    kept_yes: int = Field(ge=0, description="YES verdicts of the judged rules.")
    shadow_yes: int = Field(ge=0, description="YES verdicts of explored skipped pairs.")
    explore: float = Field(gt=0.0, le=1.0)
    confidence: float
    estimate: float = Field(description="kept / (kept + shadow / explore).")
    low: float
    high: float


def estimate_recall(
    kept_yes: int, shadow_yes: int, explore: float, *, confidence: float = 0.95
) -> RecallEstimate:
    """Recall of the prefilter, with a Wilson interval, from shadow judging.

    Skipped pairs are explored at rate `explore`, so the `shadow_yes` YES verdicts
    found among them stand for `shadow_yes / explore` missed ones. The interval is
    Wilson's for a proportion over the explored scale: the kept YES verdicts thinned
    at the same rate (`explore * kept_yes` of them) against the shadow ones; for a
    small rate it is close to the exact Poisson interval of the misses.

    Args:
        kept_yes: YES verdicts of the rules the prefilter let through.
        shadow_yes: YES verdicts among the explored skipped pairs.
        explore: The exploration rate, in (0, 1].
        confidence: The interval's coverage, in (0, 1).

    Returns:
        The estimate; with nothing found yet it is 1 within [0, 1].

    Raises:
        ValueError: A count is negative, or `explore` or `confidence` is outside
            its range.
    """
    if kept_yes < 0 or shadow_yes < 0:
        msg = f"counts must be >= 0, got {kept_yes} and {shadow_yes}"
        raise ValueError(msg)
    if not 0.0 < explore <= 1.0 or not 0.0 < confidence < 1.0:
        msg = (
            f"need 0 < explore <= 1 and 0 < confidence < 1, got {explore}, {confidence}"
        )
        raise ValueError(msg)
    kept = explore * kept_yes
    n = kept + shadow_yes
    if n == 0:
        return RecallEstimate(
            kept_yes=kept_yes,
            shadow_yes=shadow_yes,
            explore=explore,
            confidence=confidence,
            estimate=1.0,
            low=0.0,
            high=1.0,
        )
    p = kept / n
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    spread = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return RecallEstimate(
        kept_yes=kept_yes,
        shadow_yes=shadow_yes,
        explore=explore,
        confidence=confidence,
        estimate=p,
        low=max(0.0, centre - spread),
        high=min(1.0, centre + spread),
    )


class RetrainPolicy(BaseModel):
    """Train again once `every` new verdicts have been logged since the last time.

    Positions are the verdict log's (`VerdictLog.position()`), which only grow,
    so the policy holds across processes sharing one log and across pruning.
    """

    model_config = ConfigDict(frozen=True)

    every: int = Field(default=200, ge=1)

    def due(self, position: int, trained_at: int | None = None) -> bool:
        """Whether to train now, at log `position`, last trained at `trained_at`.

        Never trained (`trained_at` None): due once `every` verdicts are logged.
        """
        return position - (trained_at or 0) >= self.every
