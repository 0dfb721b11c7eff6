"""Shadow judging: keep judging a few of the pairs a prefilter skips.

A learned prefilter skips the rules it predicts the judge would answer NO for. A
small share of those skipped pairs (`explore`) is judged anyway, so that labels keep
flowing for the skipped rules (no feedback loop) and the prefilter's recall can be
estimated live: `explore_pairs` draws them, reproducibly; `estimate_recall` turns
what they found into a recall estimate with a Wilson interval; `ShadowJudging`
holds one engine's shadow judging around a `LearnedPrefilter`: which candidates to
judge for an input, the skip records it leaves in the verdict log, and the recall
counts across retrievals. These run on every retrieval; this module imports no
numpy.

What is promised and what is estimated (see `RecallEstimate`): the promise is the
prefilter's `target_recall`, kept over the stream by its `Retrainer`; the estimate
is what the shadow judgments measured of it so far.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import threading
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag._text import digest

if TYPE_CHECKING:
    from langchain_tag.learning.learned_prefilter import LearnedPrefilter
    from langchain_tag.matching.judge import Verdict
    from langchain_tag.matching.verdicts import VerdictSink
    from langchain_tag.rules import Rule

__all__ = [
    "RecallEstimate",
    "ShadowJudging",
    "check_rate",
    "estimate_recall",
    "explore_pairs",
]


def check_rate(rate: float, name: str = "explore") -> None:
    """Refuse an exploration rate outside [0, 1], naming the option.

    Raises:
        ValueError: `rate` is outside [0, 1].
    """
    if not 0.0 <= rate <= 1.0:
        msg = f"{name} must be in [0, 1], got {rate!r}"
        raise ValueError(msg)


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
    check_rate(rate, "rate")
    explored = []
    for rule_id in skipped:
        draw = hashlib.sha256(f"{seed}\x00{key}\x00{rule_id}".encode()).digest()
        if int.from_bytes(draw[:8], "big") / 2.0**64 < rate:
            explored.append(rule_id)
    return explored


class RecallEstimate(BaseModel):
    """The prefilter's recall of YES verdicts so far, estimated from shadow judgments.

    **Promised** (`target_recall`, when the engine retrains the prefilter with the
    miss-budget controller, `Retrainer`'s default): over the retrievals after the
    first training (the warm-up, before it, judges every rule), the share of the
    judge's YES verdicts whose pair was judged, an explored YES counting as a miss,
    is at least `target_recall` in at least 95% of streams. That is a measured
    property, not a theorem: the controller is sized for it (`MissBudget.z`), and
    on RuleArena-NBA it held in 95-100% of random orders at each target measured
    (`benchmarks/bench_recall_promise.py`). Its conditions: the inputs come in
    an order that does not depend on the verdicts (exchangeable, as a random order
    is); the judge answers the same pair the same way; `explore` > 0 and the judge
    keeps a verdict log (with the skip records shadow judging writes); retraining
    runs (`retrain_every`) from a log holding the whole stream (retention prunes
    what the promise counts); and the controller's allowance for actual over
    predicted misses (`MissBudget.allowance`, chosen on NBA) holds on the corpus,
    which the shadow's YES verdicts correct only as they accumulate. A single `fit`
    (no retraining) promises nothing live: its `FitReport.expected_recall` is a
    leave-one-out estimate.

    **Estimated** (these fields): the recall the shadow judgments measured over
    the retrievals this engine observed since the prefilter was first trained. A
    small explore rate finds few misses, so the interval is wide: it describes,
    and cannot confirm, the promise.
    """

    model_config = ConfigDict(frozen=True)

    kept_yes: int = Field(ge=0, description="YES verdicts of the judged rules.")
    shadow_yes: int = Field(ge=0, description="YES verdicts of explored skipped pairs.")
    explore: float = Field(gt=0.0, le=1.0)
    confidence: float
    estimate: float = Field(
        description="kept / (kept + shadow / explore): the recall measured so far."
    )
    low: float = Field(description="Lower end of the Wilson interval.")
    high: float = Field(description="Upper end of the Wilson interval.")
    promised: float | None = Field(
        default=None,
        description="The recall promised (the prefilter's `target_recall`), under "
        "the conditions above; None without one.",
    )


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


class ShadowJudging:
    """Thread-safe per-engine state of shadow judging around a LearnedPrefilter.

    `partition` says which candidates a retrieval judges: the prefilter's kept ones,
    the skipped ones explored at rate `explore`, and every candidate the prefilter
    does not know; given a verdict log, it records the skipped pairs there
    (`VerdictLog.record_skipped`, written with the log's next write), which the
    retraining needs to keep the promise. `observe` adds a retrieval's YES verdicts
    to the running counts and gives the recall estimate. The counts accumulate
    across retrainings, so the interval narrows as the engine runs (it estimates
    the recall of the models that served those retrievals, together).

    Args:
        prefilter: The learned prefilter.
        explore: The share of skipped (input, rule) pairs judged anyway, in [0, 1].
        log: The judge's verdict log, to record the skipped pairs in; a sink
            without `record_skipped`, or None, records none.

    Raises:
        ValueError: `explore` is outside [0, 1].
    """

    def __init__(
        self,
        prefilter: LearnedPrefilter,
        *,
        explore: float = 0.05,
        log: VerdictSink | None = None,
    ) -> None:
        """Start with no counts."""
        check_rate(explore)
        self.prefilter = prefilter
        self.explore = explore
        self._record_skipped = getattr(log, "record_skipped", None)
        self._lock = threading.Lock()
        self._kept_yes = 0
        self._shadow_yes = 0

    def partition(
        self, query: str, candidates: Sequence[Rule], *, record: bool = True
    ) -> tuple[list[Rule], dict[str, float]]:
        """The candidates to judge, and the explored ones with their rate.

        Args:
            query: The input.
            candidates: The rules the retrieval may judge.
            record: Record the skipped pairs in the log; False for a plan that
                only looks ahead (an estimate, judging ahead of a retrieval that
                plans again), so that a retrieval's pairs are recorded once.

        Returns:
            The candidates to judge, in candidate order (the prefilter's kept ones,
            the explored skipped ones, and every candidate the prefilter does not
            know), and the explored ones as rule id -> exploration rate (a verdict
            log weighs their verdicts `1 / rate`).
        """
        if not candidates:
            return [], {}
        screen = getattr(self.prefilter, "screen", None)
        if callable(screen):  # a prefilter with `partition` only says no rates
            _, skipped, skipped_yes = screen(query, candidates)
        else:
            _, skipped = self.prefilter.partition(query, candidates)
            skipped_yes = {}
        explored = explore_pairs(skipped, digest(query), rate=self.explore)
        dropped = set(skipped).difference(explored)
        judged = [rule for rule in candidates if rule.rule_id not in dropped]
        if record and skipped_yes and callable(self._record_skipped):
            # A skipped rule is known and unchanged: its hash is the prefilter's.
            hashes = self.prefilter.known_rules
            self._record_skipped(
                query,
                [(r, hashes[r], rate) for r, rate in skipped_yes.items()],
                explore=self.explore,
            )
        return judged, dict.fromkeys(explored, self.explore)

    def observe(
        self, verdicts: Sequence[Verdict], explored: Collection[str]
    ) -> RecallEstimate | None:
        """Add one retrieval's YES verdicts, kept and shadow; the running estimate.

        Args:
            verdicts: The retrieval's verdicts.
            explored: The ids of the rules judged in the shadow (`partition`'s).

        Returns:
            The estimate over every retrieval observed since the prefilter was
            first trained; None while it is not trained, or without exploring.
        """
        if not self.explore or not getattr(self.prefilter, "fitted", False):
            return None
        shadow = set(explored)
        shadow_yes = sum(v.applies for v in verdicts if v.rule_id in shadow)
        kept_yes = sum(v.applies for v in verdicts if v.rule_id not in shadow)
        with self._lock:
            self._kept_yes += kept_yes
            self._shadow_yes += shadow_yes
            kept, found = self._kept_yes, self._shadow_yes
        estimate = estimate_recall(kept, found, self.explore)
        promised = getattr(self.prefilter, "target_recall", None)
        return estimate.model_copy(update={"promised": promised})

    @property
    def counts(self) -> tuple[int, int]:
        """The YES verdicts observed so far: (kept, shadow)."""
        with self._lock:
            return self._kept_yes, self._shadow_yes
