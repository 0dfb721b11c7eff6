"""Evaluation metrics and the mismatch diagnostic, against hand-computed values."""

from __future__ import annotations

import random

import pytest
from langchain_tag_experiments import evaluation
from langchain_tag_experiments.evaluation import (
    aggregate,
    average_precision_at_k,
    mismatch_diagnostic,
    n_for_recall,
    recall_at_k,
    roc_auc,
    selection_scores,
)

from langchain_tag.matching.prefilters import BM25Scorer, rank_by_score

# --- rule selection -----------------------------------------------------------------


def test_selection_scores_by_hand() -> None:
    scores = selection_scores({"a", "b", "c"}, {"b", "c", "d", "e"})
    assert scores.precision == pytest.approx(2 / 3)
    assert scores.recall == pytest.approx(1 / 2)
    assert scores.f1 == pytest.approx(4 / 7)
    assert (scores.true_positives, scores.n_predicted, scores.n_gold) == (2, 3, 4)


def test_repeated_ids_count_once() -> None:
    scores = selection_scores(["a", "a"], ["a"])
    assert (scores.precision, scores.recall, scores.f1) == (1.0, 1.0, 1.0)
    assert scores.n_predicted == 1


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        (set(), set(), (1.0, 1.0, 1.0)),  # nothing to find, nothing claimed
        (set(), {"a"}, (0.0, 0.0, 0.0)),
        ({"a"}, set(), (0.0, 0.0, 0.0)),
        ({"a"}, {"b"}, (0.0, 0.0, 0.0)),
    ],
)
def test_empty_set_conventions(
    predicted: set[str], gold: set[str], expected: tuple[float, float, float]
) -> None:
    scores = selection_scores(predicted, gold)
    assert (scores.precision, scores.recall, scores.f1) == expected


def test_aggregate_macro_and_micro_by_hand() -> None:
    total = aggregate(
        [
            selection_scores({"a", "b", "c"}, {"b", "c", "d", "e"}),  # P 2/3, R 1/2
            selection_scores({"x"}, {"x"}),  # perfect
        ]
    )
    assert total.n == 2
    assert total.macro_precision == pytest.approx(5 / 6)
    assert total.macro_recall == pytest.approx(3 / 4)
    assert total.macro_f1 == pytest.approx((4 / 7 + 1) / 2)
    # Micro: 3 hits of 4 predicted and 5 gold.
    assert total.micro.precision == pytest.approx(3 / 4)
    assert total.micro.recall == pytest.approx(3 / 5)
    assert total.micro.f1 == pytest.approx(2 / 3)
    assert total.mean_predicted == 2.0


def test_aggregate_needs_scores() -> None:
    with pytest.raises(ValueError, match="at least one"):
        aggregate([])


# --- ranked retrieval ---------------------------------------------------------------


def test_recall_at_k_by_hand_ignoring_repeats() -> None:
    ranked = ["a", "b", "a", "c", "d"]
    assert recall_at_k(ranked, {"c", "e"}, 3) == 0.5  # top 3 distinct: a, b, c
    assert recall_at_k(ranked, {"c", "e"}, 2) == 0.0
    assert recall_at_k(ranked, {"a"}, 100) == 1.0


def test_average_precision_divides_by_min_of_gold_and_k() -> None:
    ranked = ["x", "g1", "y", "g2"]
    gold = {"g1", "g2", "g3"}
    # Hits at ranks 2 and 4: (1/2 + 2/4) / min(3, 4).
    assert average_precision_at_k(ranked, gold, 4) == pytest.approx(1 / 3)
    # Only the hit at rank 2 is in the top 2: (1/2) / min(3, 2).
    assert average_precision_at_k(ranked, gold, 2) == pytest.approx(1 / 4)
    # A top k full of gold is perfect even when more gold exists.
    assert average_precision_at_k(["g1", "g2"], gold, 2) == 1.0
    assert average_precision_at_k(["x", "x", "g1"], {"g1"}, 2) == 0.5


@pytest.mark.parametrize("metric", [recall_at_k, average_precision_at_k])
def test_ranking_metrics_reject_bad_arguments(metric: object) -> None:
    assert callable(metric)
    with pytest.raises(ValueError, match="gold set is empty"):
        metric(["a"], set(), 1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        metric(["a"], {"a"}, 0)


# --- ROC-AUC ------------------------------------------------------------------------


def test_roc_auc_by_hand() -> None:
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    # Ties count one half: (0.5 + 1 + 0 + 0.5) / 4.
    assert roc_auc([1, 1, 0, 0], [True, False, True, False]) == 0.5
    assert roc_auc([0.5, 0.5, 0.2], [True, False, False]) == 0.75
    assert roc_auc([3, 2, 1], [True, True, False]) == 1.0
    assert roc_auc([1, 2, 3], [True, True, False]) == 0.0


def test_roc_auc_is_undefined_with_one_class() -> None:
    assert roc_auc([0.1, 0.9], [True, True]) is None
    assert roc_auc([], []) is None


def test_roc_auc_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="2 scores but 1 labels"):
        roc_auc([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([float("nan"), 0.2], [True, False])


def test_roc_auc_agrees_with_scipy_mann_whitney() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)  # noqa: S311 - test data, not cryptography
    for _ in range(20):
        n = rng.randint(5, 200)
        scores = [float(rng.randint(0, 10)) for _ in range(n)]  # many ties
        labels = [rng.random() < 0.3 for _ in range(n)]
        positives = [s for s, y in zip(scores, labels, strict=True) if y]
        negatives = [s for s, y in zip(scores, labels, strict=True) if not y]
        if not positives or not negatives:
            continue
        u = stats.mannwhitneyu(positives, negatives).statistic
        expected = u / (len(positives) * len(negatives))
        assert roc_auc(scores, labels) == pytest.approx(expected)


# --- prefilter size -----------------------------------------------------------------


RANKINGS = [(["a", "b", "c", "d"], {"b", "d"}), (["x", "y", "z"], {"x"})]
"""Gold pairs rank at 2 and 4 (first query) and 1 (second)."""


@pytest.mark.parametrize(
    ("target", "expected"), [(0.3, 1), (0.6, 2), (2 / 3, 2), (0.95, 4), (1.0, 4)]
)
def test_n_for_recall_by_hand(target: float, expected: int) -> None:
    assert n_for_recall(RANKINGS, target) == expected


def test_n_for_recall_does_not_round_up_exact_shares() -> None:
    # 95% of 20 pairs is 19 pairs, found within the top 19.
    rankings = [([f"u{i}" for i in range(1, 21)], {f"u{i}" for i in range(1, 21)})]
    assert n_for_recall(rankings, 0.95) == 19


def test_n_for_recall_is_none_when_gold_is_never_ranked() -> None:
    rankings = [(["a", "b"], {"a", "missing"})]
    assert n_for_recall(rankings, 1.0) is None
    assert n_for_recall(rankings, 0.5) == 1


def test_n_for_recall_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"target must be in \(0, 1\]"):
        n_for_recall(RANKINGS, 0.0)
    with pytest.raises(ValueError, match=r"target must be in \(0, 1\]"):
        n_for_recall(RANKINGS, 1.5)
    with pytest.raises(ValueError, match="no gold"):
        n_for_recall([], 0.9)


# --- the mismatch diagnostic --------------------------------------------------------


class TableScorer:
    """A similarity scorer reading fixed scores per query text."""

    def __init__(self, table: dict[str, dict[str, float]]) -> None:
        self.table = table

    def scores(self, query: str) -> dict[str, float]:
        return dict(self.table[query])

    def rank(self, query: str) -> list[str]:
        return rank_by_score(self.scores(query))


TABLE = {
    "t1": {"u1": 0.9, "u2": 0.5, "u3": 0.1, "u4": 0.0},
    "t2": {"u1": 0.8, "u2": 0.7, "u3": 0.2, "u4": 0.3},
}
QUERIES = [("q1", "t1"), ("q2", "t2")]
GOLD = {"q1": {"u1"}, "q2": {"u2", "u3"}}


def test_mismatch_diagnostic_by_hand() -> None:
    report = mismatch_diagnostic(QUERIES, GOLD, TableScorer(TABLE), ks=(1, 2, 4))
    assert (report.n_queries, report.units_total, report.gold_pairs) == (2, 4, 3)
    # Pooled: gold 0.9, 0.7, 0.2 beat 5, 4 and 2 of the 5 other pairs' scores.
    assert report.roc_auc_pooled == pytest.approx(11 / 15)
    # Per query: q1 ranks its gold first (1.0); q2's gold beat 1 of 4 pairs (0.25).
    assert report.roc_auc_mean_per_query == pytest.approx(0.625)
    assert report.recall_at_k == {1: 0.5, 2: 0.75, 4: 1.0}
    # Gold ranks 1, 2 and 4: keeping 95% or 99% of 3 pairs needs all of them.
    assert report.n_for_95_recall == report.n_for_99_recall == 4


def test_a_perfect_scorer_scores_one() -> None:
    table = {"t1": {"u1": 1.0, "u2": 0.0}, "t2": {"u1": 0.0, "u2": 1.0}}
    report = mismatch_diagnostic(
        QUERIES, {"q1": {"u1"}, "q2": {"u2"}}, TableScorer(table), ks=(1,)
    )
    assert report.roc_auc_pooled == report.roc_auc_mean_per_query == 1.0
    assert report.recall_at_k == {1: 1.0}
    assert report.n_for_95_recall == 1


def test_the_diagnostic_runs_on_a_real_scorer() -> None:
    items = [
        ("wildcard", "wildcard import from module import star"),
        ("bare-except", "bare except clause catches every exception"),
        ("lambda", "lambda assigned to a name"),
    ]
    queries = [("q1", "from os import * is a wildcard import"), ("q2", "except: pass")]
    gold = {"q1": {"wildcard"}, "q2": {"bare-except"}}
    report = mismatch_diagnostic(queries, gold, BM25Scorer(items), ks=(1, 3))
    assert report.units_total == 3
    assert report.recall_at_k[1] == 1.0
    assert report.roc_auc_mean_per_query == 1.0
    # BM25 scores of different queries are not on one scale: pooled, q2's gold
    # scores below a non-gold score of q1.
    assert report.roc_auc_pooled == 0.875


def test_the_diagnostic_rejects_inconsistent_labels() -> None:
    scorer = TableScorer(TABLE)
    with pytest.raises(ValueError, match="at least one query"):
        mismatch_diagnostic([], GOLD, scorer)
    with pytest.raises(ValueError, match="'q1' has no gold units"):
        mismatch_diagnostic(QUERIES, {"q2": {"u2"}}, scorer)
    with pytest.raises(ValueError, match=r"gold units \['u9'\] are not among the 4"):
        mismatch_diagnostic(QUERIES, {"q1": {"u9"}, "q2": {"u1"}}, scorer)
    uneven = TableScorer({"t1": TABLE["t1"], "t2": {"u1": 0.1, "u2": 0.2}})
    with pytest.raises(ValueError, match="scored over 2 units, earlier queries over 4"):
        mismatch_diagnostic(QUERIES, {"q1": {"u1"}, "q2": {"u2"}}, uneven)


def test_every_public_name_resolves() -> None:
    for name in evaluation.__all__:
        assert getattr(evaluation, name) is not None, name
