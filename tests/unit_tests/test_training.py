"""Training: examples, windows, hashed inputs, the ridge's leave-one-out scores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse  # type: ignore[import-untyped]
from sklearn.linear_model import Ridge  # type: ignore[import-untyped]
from sklearn.metrics import roc_auc_score  # type: ignore[import-untyped]

from langchain_tag.learning._thresholds import Masses
from langchain_tag.learning._training import FitSettings, _learned, weighted_auc
from langchain_tag.learning.learned_prefilter import (
    FeatureHashing,
    LabelledExample,
    LearnedPrefilter,
    SkippedPair,
)
from tests.unit_tests.test_learned_prefilter import (
    RULE_IDS,
    RULES,
    examples,
    make_inputs,
    train_prefilter,
)


@pytest.fixture(scope="module")
def trained() -> LearnedPrefilter:
    return train_prefilter()


def test_the_last_verdict_on_a_pair_counts_and_unknown_rules_are_ignored() -> None:
    inputs = make_inputs(60, seed=5)
    flipped = [LabelledExample(text, "R-000", applies=True) for text, _ in inputs]
    unknown = [LabelledExample(text, "R-GONE", applies=True) for text, _ in inputs]
    prefilter = LearnedPrefilter(RULES)
    report = prefilter.fit([*flipped, *examples(inputs), *unknown])
    assert report.ignored == len(inputs)
    assert report.rules["R-000"].positives == sum("R-000" in g for _, g in inputs)


def test_examples_take_an_optional_weight_and_refuse_bad_ones() -> None:
    prefilter = LearnedPrefilter(RULES)
    report = prefilter.fit(
        [("text one", "R-000", False, 20.0), ("text two", "R-001", True)]
    )
    assert report.examples == 2
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive weight"):
            prefilter.fit([("text", "R-000", False, bad)])


def test_max_inputs_keeps_the_most_recent() -> None:
    inputs = make_inputs(50, seed=6)
    prefilter = LearnedPrefilter(RULES, max_inputs=20)
    report = prefilter.fit(examples(inputs))
    assert report.inputs == 20
    assert report.rules["R-000"].examples == 20


def test_training_on_hashed_features_equals_training_on_texts() -> None:
    inputs = make_inputs(120, seed=7)
    hashing = FeatureHashing()
    hashed = [
        LabelledExample(hashing.hash(e.input), e.rule_id, e.applies)  # type: ignore[arg-type]
        for e in examples(inputs)
    ]
    from_texts, from_features = LearnedPrefilter(RULES), LearnedPrefilter(RULES)
    from_texts.fit(examples(inputs))
    from_features.fit(hashed)
    for text, _ in make_inputs(30, seed=8):
        assert from_texts.margins(text) == pytest.approx(from_features.margins(text))


def test_features_hashed_under_another_scheme_are_refused() -> None:
    other = FeatureHashing(ngram_max=1).hash("alpha trigger-001")
    with pytest.raises(ValueError, match="scheme"):
        LearnedPrefilter(RULES).fit([(other, "R-001", True)])


def test_weighted_auc_is_sklearns() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 200))
        y = rng.random(n) < 0.3
        y[:2] = [True, False]
        scores = np.round(rng.normal(size=n) + y, 1)  # with ties
        weights = np.where(rng.random(n) < 0.2, 20.0, 1.0)
        assert weighted_auc(scores, y, weights) == pytest.approx(
            roc_auc_score(y, scores, sample_weight=weights)
        )


def test_weighted_auc_counts_ties_one_half() -> None:
    scores = np.asarray([0.1, 0.4, 0.4, 0.9])
    y = np.asarray([False, True, False, True])
    assert weighted_auc(scores, y, np.ones(4)) == pytest.approx(0.875)
    # A weight counts the example that many times.
    weights = np.asarray([1.0, 2.0, 1.0, 1.0])
    repeated = np.asarray([0.1, 0.4, 0.4, 0.4, 0.9])
    y_repeated = np.asarray([False, True, True, False, True])
    assert weighted_auc(scores, y, weights) == pytest.approx(
        weighted_auc(repeated, y_repeated, np.ones(5))
    )


def test_skipped_pairs_without_verdicts_make_the_thresholds_keep_more() -> None:
    """Before, the YES verdicts a model skipped were missing from its next training.

    Half of R-001's YES inputs were skipped and never judged: trained on the
    verdicts alone the rule looks rarer and is skipped more; given the skipped
    pairs, their YES mass comes back.
    """
    inputs = make_inputs(200, seed=5)
    verdicts, skipped = [], []
    hidden = 0
    for text, gold in inputs:
        for rule_id in RULE_IDS:
            if rule_id == "R-001" and (rule_id in gold) and hidden % 2 == 0:
                skipped.append(SkippedPair(text, rule_id, 0.3))
            else:
                verdicts.append(LabelledExample(text, rule_id, rule_id in gold))
            hidden += rule_id == "R-001" and rule_id in gold
    alone = LearnedPrefilter(RULES, target_recall=0.95).fit(verdicts)
    with_skips = LearnedPrefilter(RULES, target_recall=0.95)
    report = with_skips.fit([*verdicts, *skipped])
    assert report.skipped == len(skipped) > 10
    assert report.examples == alone.examples == len(verdicts)
    kept, lost = report.rules["R-001"], alone.rules["R-001"]
    assert kept.positives == lost.positives  # the ridge learns from verdicts only
    assert kept.expected_skip < lost.expected_skip
    assert kept.skipped_yes == pytest.approx(
        kept.expected_miss / (kept.expected_miss + kept.expected_skip)
    )
    with pytest.raises(ValueError, match="skipped_yes is a probability"):
        with_skips.fit([*verdicts, SkippedPair("text", "R-001", 1.5)])


def test_an_internal_target_sets_the_thresholds_not_the_promise(
    trained: LearnedPrefilter,
) -> None:
    data = examples(make_inputs(200, seed=1))
    strict = LearnedPrefilter(RULES, target_recall=0.95)
    report = strict.fit(data, internal_target=0.99)
    at_99 = LearnedPrefilter(RULES, target_recall=0.99)
    at_99.fit(data)
    assert (report.target_recall, report.internal_target) == (0.95, 0.99)
    assert strict.target_recall == 0.95
    assert at_99.report is not None
    assert report.rules == at_99.report.rules
    assert trained.report is not None
    assert trained.report.internal_target == 0.95  # without one: the target
    with pytest.raises(ValueError, match="internal_target"):
        strict.fit(data, internal_target=1.5)


def test_the_ridge_scores_each_pair_left_out_and_picks_by_auc() -> None:
    """Two rules judged on the same inputs, one pair weighing 20: one fit.

    Each threshold sits at a YES pair's leave-one-out score: the ridge refitted
    without that pair (all of its weight), as `Ridge` computes it; the strength
    is the one whose leave-one-out scores rank best (weighted AUC), the larger on
    ties; the weights are the ridge's on every pair at that strength.
    """
    rng = np.random.default_rng(3)
    n, d = 40, 6
    x = sparse.csr_matrix(
        np.hstack([rng.random((n, d)) * (rng.random((n, d)) < 0.5), np.ones((n, 1))])
    )
    w = np.ones(n)
    w[7] = 20.0
    settings = FitSettings(FeatureHashing(), 10, 2, 2000, (0.01, 1.0, 100.0))
    labels, group = [], []
    for rule, column in (("A", 0), ("B", 1)):
        y = x[:, column].toarray().ravel() + 0.3 * rng.random(n) > 0.5
        pairs = [(i, bool(y[i]), float(w[i])) for i in range(n)]
        labels.append(pairs)
        group.append((rule, Masses.of(pairs, [])))
    learned = _learned(settings, x, labels, group)
    for candidate, pairs in zip(learned, labels, strict=True):
        y = np.asarray([a for _, a, _ in pairs])
        target = np.where(y, 1.0, -1.0)
        dense = x.toarray()
        loo = {}
        for alpha in settings.alphas:
            ridge = Ridge(alpha=alpha, fit_intercept=False, solver="cholesky")
            out = [np.arange(n) != i for i in range(n)]
            loo[alpha] = np.asarray(
                [
                    ridge.fit(dense[o], target[o], w[o]).predict(dense[[i]])[0]
                    for i, o in enumerate(out)
                ]
            )
        aucs = {a: roc_auc_score(y, s, sample_weight=w) for a, s in loo.items()}
        best = max(sorted(aucs, reverse=True), key=aucs.__getitem__)
        assert candidate.fit.alpha == best
        assert candidate.fit.loo_auc == pytest.approx(aucs[best])
        thresholds = [o.threshold for o in candidate.options[1:-1]]
        assert thresholds == pytest.approx(np.unique(loo[best][y]).tolist())
        full = Ridge(alpha=best, fit_intercept=False, solver="cholesky")
        full.fit(dense, target, w)
        assert candidate.weights is not None
        assert [*candidate.weights, candidate.bias] == pytest.approx(full.coef_)
