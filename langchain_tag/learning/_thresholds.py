"""Per-rule thresholds that keep one recall target over all the rules.

A rule is skipped for an input when its score is below the rule's threshold,
placed at one of the scores of the rule's YES mass (`threshold_options`). A
threshold above YES mass `k` of the rule's `p` misses a future YES verdict with
probability `(k + 1) / (p + 1)` (the conformal rank argument); times the rule's
YES rate, that is its expected misses per input. The misses `target_recall`
allows over all the rules' YES verdicts are spent where each buys the most skipped
judgments (`allocate`: greedy along each rule's concave hull of (misses, skips)),
so a rule that seldom applies may be skipped outright, and the expected recall of
the YES verdicts stays at the target.

A rule's pairs count as YES and NO mass (`Masses`): the verdicts by their weight,
and each skipped pair that no verdict labels as a fractional YES of mass
`(S + 10 q0) / (N + 10)`, where `q0` is the P(YES | skipped) the model in force
predicted for it and `S` / `N` are the rule's explored YES / explored skipped pairs.

scikit-learn has no counterpart: its calibration (`CalibratedClassifierCV`,
`precision_recall_curve`) sets one classifier's operating point, not a miss
budget shared across rules with a finite-sample guarantee.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from langchain_tag.learning._fit_records import RuleFit

__all__ = ["Candidate", "Masses", "Option", "allocate", "threshold_options"]

Floats = npt.NDArray[np.float64]

_PRIOR_PAIRS = 10.0
"""How many explored pairs the model's own P(YES | skipped) counts for, when a
skipped pair's YES mass is estimated (`Masses`): about two retrainings' worth of a
rule's explored pairs on NBA."""


@dataclass(frozen=True)
class Option:
    """Skip the rule below `threshold`: `miss` YES and `skip` judgments per input."""

    threshold: float
    miss: float
    skip: float


@dataclass
class Candidate:
    """A rule that may be skipped: its options, and the one the allocation chose.

    Option 0 keeps the rule (judged always); the others skip it below a threshold,
    in increasing order of threshold, the last one (infinite) for every input.
    `rate` is its YES verdicts per input (None: too little history to count).
    """

    rule_id: str
    fit: RuleFit
    options: list[Option]
    rate: float | None = None
    imputed: int = 0
    """Skipped pairs without a verdict in its threshold step."""
    weights: Floats | None = None
    bias: float = 0.0
    chosen: int = 0


@dataclass(frozen=True)
class Masses:
    """A rule's pairs as the threshold step counts them: YES and NO mass each.

    The labelled pairs first (a verdict on a pair that was skipped, an explored
    one, counts once: its unexplored siblings are among the imputed pairs; other
    verdicts count their weight), then the skipped pairs without a verdict, each a
    fractional YES of mass `q = (S + k q0) / (N + k)`: `q0` the model's P(YES |
    skipped) when it skipped the pair, `S` / `N` the rule's explored YES / explored
    pairs, `k` = `_PRIOR_PAIRS`. Without skipped pairs this is the weights.
    """

    yes: Floats
    no: Floats
    imputed_rows: npt.NDArray[np.int64]

    @classmethod
    def of(
        cls,
        pairs: Sequence[tuple[int, bool, float]],
        skipped: Sequence[tuple[int, float]],
    ) -> Masses:
        """The masses of a rule's labelled `pairs` and `skipped` pairs (by input)."""
        prior = dict(skipped)
        y = np.asarray([a for _, a, _ in pairs], dtype=np.float64)
        mass = np.asarray(
            [1.0 if i in prior else w for i, _, w in pairs], dtype=np.float64
        )
        explored = np.asarray([i in prior for i, _, _ in pairs], dtype=bool)
        labelled = {i for i, _, _ in pairs}
        rows = np.asarray([i for i, _ in skipped if i not in labelled], dtype=np.int64)
        q0 = np.asarray([q for i, q in skipped if i not in labelled], dtype=np.float64)
        q = (y[explored].sum() + _PRIOR_PAIRS * q0) / (explored.sum() + _PRIOR_PAIRS)
        return cls(
            np.concatenate([mass * y, q]), np.concatenate([mass * (1 - y), 1 - q]), rows
        )

    @property
    def rate(self) -> float:
        """The rule's YES share per input, pulled towards 1/2 by half an example."""
        return float((self.yes.sum() + 0.5) / (self.yes.sum() + self.no.sum() + 1.0))


def threshold_options(
    scores: Floats, yes: Floats, no: Floats, rate: float
) -> list[Option]:
    """Skipping below each score that carries YES mass, then skipping always.

    A threshold above YES mass `below` (of `total`) misses a new YES verdict with
    probability `(below + 1) / (total + 1)`: the conformal rank argument, the new
    verdict being exchangeable with the old ones; it skips the share of the NO mass
    below it.
    """
    order = np.argsort(scores, kind="stable")
    ranked = scores[order]
    yes_below = np.concatenate([[0.0], np.cumsum(yes[order])])
    no_below = np.concatenate([[0.0], np.cumsum(no[order])])
    total_yes, total_no = yes_below[-1], no_below[-1]
    thresholds = np.unique(scores[yes > 0])
    at = np.searchsorted(ranked, thresholds, side="left")
    return [
        Option(
            threshold,
            rate * (below + 1.0) / (total_yes + 1.0),
            (1.0 - rate) * skipped / total_no if total_no else 0.0,
        )
        for threshold, below, skipped in zip(
            [*thresholds.tolist(), math.inf],
            [*yes_below[at].tolist(), float(total_yes)],
            [*no_below[at].tolist(), float(total_no)],
            strict=True,
        )
    ]


def allocate(candidates: list[Candidate], budget: float) -> float:
    """Spend the allowed misses where they skip the most; returns what was spent.

    Each rule moves along the upper concave hull of its (miss, skip) options, the
    steepest step of any rule first, while the step fits in what is left.
    """

    def next_step(c: Candidate) -> tuple[float, int] | None:
        here = c.options[c.chosen]
        best: tuple[float, int] | None = None
        for index in range(c.chosen + 1, len(c.options)):
            there = c.options[index]
            gain, cost = there.skip - here.skip, there.miss - here.miss
            if gain <= 0:
                continue
            slope = gain / cost if cost > 0 else math.inf
            if best is None or slope > best[0]:
                best = (slope, index)
        return best

    heap: list[tuple[float, int, int]] = []
    for position, candidate in enumerate(candidates):
        step = next_step(candidate)
        if step is not None:
            heapq.heappush(heap, (-step[0], position, step[1]))
    spent = 0.0
    while heap:
        _, position, index = heapq.heappop(heap)
        candidate = candidates[position]
        cost = candidate.options[index].miss - candidate.options[candidate.chosen].miss
        if spent + cost > budget + 1e-12:
            continue  # this rule stops here; cheaper steps of others may still fit
        spent += cost
        candidate.chosen = index
        step = next_step(candidate)
        if step is not None:
            heapq.heappush(heap, (-step[0], position, step[1]))
    return spent
