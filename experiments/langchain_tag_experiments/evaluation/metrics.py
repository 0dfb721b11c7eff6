"""Evaluation metrics: rule selection, ranked retrieval, ROC-AUC and prefilter size.

Conventions, stated once:

- Selection (`selection_scores`): a ratio whose denominator is zero is 1.0 when
  both the predicted and the gold set are empty (nothing to find, nothing claimed)
  and 0.0 otherwise. F1 is 0.0 when precision and recall are both 0.
- Ranked lists: an id repeated in a ranking counts at its first position only.
  `recall_at_k` and `average_precision_at_k` need a non-empty gold set.
- MAP@k: average precision at k divides by min(|gold|, k), the most relevant items
  the top k can hold, so a perfect top k scores 1.0 (the usual MAP@10 of ObliQA).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Collection, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field


class SelectionScores(BaseModel):
    """Precision, recall and F1 of one selected set against a gold set."""

    model_config = ConfigDict(frozen=True)

    precision: float = Field(ge=0.0, le=1.0)
    recall: float = Field(ge=0.0, le=1.0)
    f1: float = Field(ge=0.0, le=1.0)
    true_positives: int = Field(ge=0)
    n_predicted: int = Field(ge=0)
    n_gold: int = Field(ge=0)


class AggregateScores(BaseModel):
    """Selection scores over many problems: macro averages and micro totals."""

    model_config = ConfigDict(frozen=True)

    n: int = Field(description="Number of problems.")
    macro_precision: float = Field(description="Mean of per-problem precision.")
    macro_recall: float = Field(description="Mean of per-problem recall.")
    macro_f1: float = Field(description="Mean of per-problem F1 (not F1 of means).")
    micro: SelectionScores = Field(description="Scores of the summed counts.")
    mean_predicted: float = Field(description="Mean number of selected items.")


def _ratio(numerator: int, denominator: int, *, both_empty: bool) -> float:
    if denominator:
        return numerator / denominator
    return 1.0 if both_empty else 0.0


def _scores(true_positives: int, n_predicted: int, n_gold: int) -> SelectionScores:
    both_empty = n_predicted == 0 and n_gold == 0
    precision = _ratio(true_positives, n_predicted, both_empty=both_empty)
    recall = _ratio(true_positives, n_gold, both_empty=both_empty)
    total = precision + recall
    return SelectionScores(
        precision=precision,
        recall=recall,
        f1=2 * precision * recall / total if total else 0.0,
        true_positives=true_positives,
        n_predicted=n_predicted,
        n_gold=n_gold,
    )


def selection_scores(
    predicted: Collection[str], gold: Collection[str]
) -> SelectionScores:
    """Precision, recall and F1 of the `predicted` ids against the `gold` ids.

    Both are treated as sets (repeats count once). See the module docstring for
    empty sets.
    """
    chosen, wanted = set(predicted), set(gold)
    return _scores(len(chosen & wanted), len(chosen), len(wanted))


def aggregate(scores: Sequence[SelectionScores]) -> AggregateScores:
    """Macro averages over problems and micro scores of the summed counts.

    Raises:
        ValueError: `scores` is empty.
    """
    if not scores:
        msg = "aggregate needs the scores of at least one problem"
        raise ValueError(msg)
    n = len(scores)
    return AggregateScores(
        n=n,
        macro_precision=math.fsum(s.precision for s in scores) / n,
        macro_recall=math.fsum(s.recall for s in scores) / n,
        macro_f1=math.fsum(s.f1 for s in scores) / n,
        micro=_scores(
            sum(s.true_positives for s in scores),
            sum(s.n_predicted for s in scores),
            sum(s.n_gold for s in scores),
        ),
        mean_predicted=sum(s.n_predicted for s in scores) / n,
    )


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values measured (not None); None when there are none."""
    found = [value for value in values if value is not None]
    return statistics.fmean(found) if found else None


def _top_k(ranked: Sequence[str], gold: Collection[str], k: int) -> list[str]:
    """The first k distinct ids of `ranked`, after checking the arguments."""
    if k < 1:
        msg = f"k must be at least 1, got {k}"
        raise ValueError(msg)
    if not gold:
        msg = "the gold set is empty; ranking metrics are undefined for it"
        raise ValueError(msg)
    return list(dict.fromkeys(ranked))[:k]


def recall_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """Share of the gold ids among the first k distinct ids of `ranked`.

    Raises:
        ValueError: `k` < 1 or `gold` is empty.
    """
    wanted = set(gold)
    return len(wanted.intersection(_top_k(ranked, wanted, k))) / len(wanted)


def average_precision_at_k(
    ranked: Sequence[str], gold: Collection[str], k: int
) -> float:
    """Average precision of the top k, divided by min(|gold|, k).

    The sum of precision@i over the ranks i <= k that hold a gold id, divided by
    min(|gold|, k); the mean of this over queries is MAP@k.

    Raises:
        ValueError: `k` < 1 or `gold` is empty.
    """
    wanted = set(gold)
    hits = 0
    total = 0.0
    for position, item in enumerate(_top_k(ranked, wanted, k), 1):
        if item in wanted:
            hits += 1
            total += hits / position
    return total / min(len(wanted), k)


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve: P(a positive outscores a negative), ties count 1/2.

    Computed as the Mann-Whitney U statistic over mid-ranks, in O(n log n).

    Returns:
        The AUC, or None when all labels are equal (the area is undefined).

    Raises:
        ValueError: `scores` and `labels` differ in length, or a score is NaN.
    """
    if len(scores) != len(labels):
        msg = f"{len(scores)} scores but {len(labels)} labels"
        raise ValueError(msg)
    if any(math.isnan(s) for s in scores):
        msg = "a score is NaN; ROC-AUC needs comparable scores"
        raise ValueError(msg)
    positives = sum(1 for label in labels if label)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    rank_sum = 0.0  # sum of the positives' 1-based mid-ranks
    start = 0  # how many scores rank below the tied group
    ranked = sorted(zip(scores, labels, strict=True), key=lambda pair: pair[0])
    for _, tied in itertools.groupby(ranked, key=lambda pair: pair[0]):
        group = [label for _, label in tied]
        rank_sum += (start + (len(group) - 1) / 2 + 1) * sum(map(bool, group))
        start += len(group)
    u = rank_sum - positives * (positives + 1) / 2
    return u / (positives * negatives)


def _gold_positions(
    rankings_with_gold: Iterable[tuple[Sequence[str], Collection[str]]],
) -> list[float]:
    """The 1-based rank of every gold (query, id) pair; inf if it was not ranked."""
    positions: list[float] = []
    for ranked, gold in rankings_with_gold:
        first: dict[str, int] = {}
        for position, item in enumerate(ranked, 1):
            first.setdefault(item, position)
        positions += [first.get(item, math.inf) for item in set(gold)]
    return positions


def n_for_recall(
    rankings_with_gold: Iterable[tuple[Sequence[str], Collection[str]]],
    target: float,
) -> int | None:
    """The smallest N such that keeping each query's top N keeps `target` of the gold.

    Over all gold (query, id) pairs pooled: the least N for which at least
    `target` of them rank within their query's top N, i.e. the prefilter size that
    reaches recall `target` of all gold pairs.

    Args:
        rankings_with_gold: Per query, its ranking and its gold ids.
        target: The share of gold pairs to keep, in (0, 1].

    Returns:
        N, or None if the rankings leave out too many gold ids to ever reach it.

    Raises:
        ValueError: `target` is outside (0, 1] or there are no gold pairs.
    """
    if not 0 < target <= 1:
        msg = f"target must be in (0, 1], got {target}"
        raise ValueError(msg)
    positions = sorted(_gold_positions(rankings_with_gold))
    if not positions:
        msg = "there are no gold (query, id) pairs"
        raise ValueError(msg)
    # The tolerance keeps e.g. 0.95 * 20 from rounding up to 20 pairs needed.
    needed = math.ceil(target * len(positions) - 1e-9)
    position = positions[needed - 1]
    return None if math.isinf(position) else int(position)
