"""Training the learned prefilter: per-rule classifiers, then thresholds.

- **Features**: hashed word n-grams, TF-IDF weighted (`_features`), and a
  constant feature that carries the bias, regularised with the weights.
- **Per-rule classifier**: ridge regression on +-1 labels (scikit-learn's
  `RidgeCV`), whose leave-one-out (LOO) predictions are exact and nearly free
  (a logistic regression has no such LOO: 5-fold predictions for six strengths
  took 5.2 s per NBA training, the ridge 0.053 s);
  each rule's regularisation is picked from `alphas` by the LOO ranking quality
  (weighted ROC-AUC). The rules judged on the same inputs with the same weights
  are one multi-target fit: one decomposition for all of them.
- **Thresholds** (`_thresholds`): chosen on the LOO scores, for one recall target
  over all the rules.
- **Cold start**: a rule with fewer than `min_examples` verdicts, or one always
  answered YES, is always judged.
- **Skipped pairs** (`SkippedPair`) enter the threshold step, not the ridge.
- **Re-thresholding** (`rethresholded`): the model keeps every rule's skipping
  options, so another target is met without training (the same thresholds
  training at that target would choose).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from langchain_tag.learning._features import (
    FeatureHashing,
    HashedFeatures,
    hashed_rows,
    tf_idf_matrix,
)
from langchain_tag.learning._fit_records import FitReport, RuleFit, SkippedPair
from langchain_tag.learning._thresholds import (
    Candidate,
    Masses,
    Option,
    allocate,
    threshold_options,
)
from langchain_tag.rules import Rulebook

__all__ = ["FitSettings", "TrainedModel", "rethresholded", "train"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FitSettings:
    """The prefilter's training settings (its fields of the same names)."""

    hashing: FeatureHashing
    min_examples: int
    min_df: int
    max_inputs: int
    alphas: tuple[float, ...]


@dataclass(frozen=True)
class TrainedModel:
    """The trained state: features, and each skippable rule's weights and options.

    The rules with skipping options are the model's `rule_ids`; rule `j`'s options
    (threshold, expected miss, expected skip) are the rows
    `options[offsets[j]:offsets[j + 1]]`, row 0 keeping the rule, and `chosen[j]`
    is the one in use (0: always judged). Keeping every option lets another recall
    target be met without training (`rethresholded`).
    """

    hashing: FeatureHashing
    columns: npt.NDArray[np.int64]
    idf: Floats
    rule_ids: tuple[str, ...]
    rule_hashes: tuple[str, ...]
    weights: npt.NDArray[np.float32]
    bias: Floats
    options: Floats
    offsets: npt.NDArray[np.int64]
    chosen: npt.NDArray[np.int64]
    yes_rate_total: float | None
    """The YES verdicts per input the recall target is a share of; None: unknown
    (a version-1 file), the model cannot be re-thresholded."""
    trained_rules: Mapping[str, str]
    """Every rule trained over: id -> content hash."""
    report: FitReport

    @property
    def thresholds(self) -> Floats:
        """Each rule's threshold in use (-inf: never skipped)."""
        return np.asarray(self.options[self.offsets[:-1] + self.chosen, 0])


@dataclass
class _Collected:
    inputs: list[str | HashedFeatures]
    labels: dict[str, list[tuple[int, bool, float]]]
    """Rule id -> (input, applies, weight) of each labelled pair."""
    skipped: dict[str, list[tuple[int, float]]]
    """Rule id -> (input, P(YES | skipped)) of each skipped pair (`SkippedPair`)."""
    ignored: int

    def latest(self, max_inputs: int) -> _Collected:
        """Only the `max_inputs` most recent inputs and their pairs."""
        first = max(len(self.inputs) - max_inputs, 0)
        return _Collected(
            self.inputs[first:],
            {
                rule_id: [(i - first, y, w) for i, y, w in pairs if i >= first]
                for rule_id, pairs in self.labels.items()
            },
            {
                rule_id: [(i - first, q) for i, q in pairs if i >= first]
                for rule_id, pairs in self.skipped.items()
            },
            self.ignored,
        )


def _collect(examples: Iterable[Any], rule_ids: set[str]) -> _Collected:
    """Distinct inputs (in order of last use), each rule's labelled, skipped pairs."""
    position: dict[str | HashedFeatures, int] = {}
    pairs: dict[tuple[int, str], tuple[bool, float]] = {}
    skips: dict[tuple[int, str], float] = {}
    last_use: dict[int, int] = {}
    ignored = 0
    for order, example in enumerate(examples):
        if isinstance(example, SkippedPair):
            features, rule_id, skipped_yes = example
            if not 0.0 <= skipped_yes <= 1.0:
                msg = (
                    "A SkippedPair's skipped_yes is a probability, in [0, 1]; got "
                    f"{example!r:.200}."
                )
                raise ValueError(msg)
        else:
            # Unpacked by hand: a training set can hold millions of pairs.
            features, rule_id, applies, *rest = example
            weight = float(rest[0]) if rest else 1.0
            if not (weight > 0 and math.isfinite(weight)) or len(rest) > 1:
                msg = (
                    "Examples are (input, rule_id, applies) or (..., weight) with a "
                    f"positive weight; got {example!r:.200}."
                )
                raise ValueError(msg)
        if rule_id not in rule_ids:
            ignored += 1
            continue
        index = position.setdefault(features, len(position))
        last_use[index] = order
        if isinstance(example, SkippedPair):
            skips[index, rule_id] = float(skipped_yes)
            continue
        pairs.pop((index, rule_id), None)  # the last verdict on a pair wins
        pairs[index, rule_id] = (bool(applies), weight)
    # Inputs ordered by their last example, so `max_inputs` keeps the most recent.
    ranked = sorted(last_use, key=last_use.__getitem__)
    renumber = {old: new for new, old in enumerate(ranked)}
    inputs = list(position)
    labels: dict[str, list[tuple[int, bool, float]]] = {}
    for (index, rule_id), (applies, weight) in pairs.items():
        labels.setdefault(rule_id, []).append((renumber[index], applies, weight))
    skipped: dict[str, list[tuple[int, float]]] = {}
    for (index, rule_id), skipped_yes in skips.items():
        skipped.setdefault(rule_id, []).append((renumber[index], skipped_yes))
    return _Collected([inputs[old] for old in ranked], labels, skipped, ignored)


def train(
    settings: FitSettings,
    examples: Iterable[Any],
    rulebook: Rulebook,
    target_recall: float,
    internal_target: float,
) -> TrainedModel:
    """A model of `examples` over `rulebook`, its thresholds at `internal_target`.

    Raises:
        ValueError: A bad example (weight, `skipped_yes`), or hashed features
            under another scheme than `settings.hashing`.
        ImportError: scikit-learn (the `learned` extra) is not installed.
    """
    started = time.perf_counter()
    data = _collect(examples, {rule.rule_id for rule in rulebook.rules})
    data = data.latest(settings.max_inputs)
    inputs = data.inputs
    counts = hashed_rows(settings.hashing, inputs)
    columns, idf, matrix = tf_idf_matrix(counts, settings.min_df)
    from scipy import sparse  # type: ignore[import-untyped]  # noqa: PLC0415 - with sklearn

    augmented = sparse.hstack([matrix, np.ones((len(inputs), 1))]).tocsr()
    candidates: dict[str, Candidate] = {}
    to_learn: dict[bytes, list[tuple[str, Masses]]] = {}
    for rule in rulebook.rules:
        pairs = data.labels.get(rule.rule_id, [])
        candidate, masses = _screened(
            settings, rule.rule_id, pairs, data.skipped.get(rule.rule_id, [])
        )
        candidates[rule.rule_id] = candidate
        if masses is not None:
            rows = np.asarray([i for i, _, _ in pairs], dtype=np.int64)
            w = np.asarray([w for _, _, w in pairs], dtype=np.float64)
            to_learn.setdefault(rows.tobytes() + w.tobytes(), []).append(
                (rule.rule_id, masses)
            )
    for group in to_learn.values():
        labels = [data.labels[rule_id] for rule_id, _ in group]
        candidates.update(
            (c.rule_id, c) for c in _learned(settings, augmented, labels, group)
        )
    return _model(
        settings,
        rulebook,
        data,
        (columns, idf),
        list(candidates.values()),
        (target_recall, internal_target, started),
    )


def _screened(
    settings: FitSettings,
    rule_id: str,
    pairs: Sequence[tuple[int, bool, float]],
    skipped: Sequence[tuple[int, float]],
) -> tuple[Candidate, Masses | None]:
    """A rule's candidate without a classifier, and its masses if it needs one."""
    positives = sum(applies for _, applies, _ in pairs)
    fit = RuleFit(status="learned", examples=len(pairs), positives=positives)
    if len(pairs) < settings.min_examples:
        return Candidate(
            rule_id, fit.model_copy(update={"status": "little_history"}), []
        ), None
    masses = Masses.of(pairs, skipped)
    rate, imputed = masses.rate, len(masses.imputed_rows)
    if positives == len(pairs):
        always = fit.model_copy(update={"status": "always_applies"})
        return Candidate(rule_id, always, [], rate, imputed), None
    keep_all = Option(-math.inf, 0.0, 0.0)
    if positives == 0:
        # Skipping a rule that never applied misses all of its (rare) YES verdicts.
        skip_all = Option(math.inf, rate, 1.0 - rate)
        return Candidate(rule_id, fit, [keep_all, skip_all], rate, imputed), None
    return Candidate(rule_id, fit, [keep_all], rate, imputed), masses


def _learned(
    settings: FitSettings,
    augmented: Any,
    labels: Sequence[Sequence[tuple[int, bool, float]]],
    group: list[tuple[str, Masses]],
) -> list[Candidate]:
    """The rules of `group` (judged on the same inputs, same weights), learned.

    One multi-target `RidgeCV`: exact LOO predictions (weighted least squares
    leaving all of a pair's weight out), one decomposition for all the rules, and
    each rule's strength picked by the weighted AUC of its LOO predictions. The
    imputed pairs were not trained on: their plain scores are held out.
    """
    from sklearn.linear_model import (  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra
        RidgeCV,
    )

    rows = np.asarray([i for i, _, _ in labels[0]], dtype=np.int64)
    w = np.asarray([w for _, _, w in labels[0]], dtype=np.float64)
    targets = np.column_stack(
        [[1.0 if applies else -1.0 for _, applies, _ in pairs] for pairs in labels]
    )
    alphas = sorted(settings.alphas, reverse=True)  # ties: the simpler model
    ridge = RidgeCV(
        alphas=alphas,
        fit_intercept=False,  # the constant feature: a regularised bias
        scoring=functools.partial(_loo_auc, sample_weight=w),
        store_cv_results=True,  # the LOO predictions, with a scorer
        alpha_per_target=len(group) > 1,
    ).fit(augmented[rows], targets if len(group) > 1 else targets[:, 0], w)
    chosen = np.atleast_1d(ridge.alpha_)
    aucs = np.atleast_1d(ridge.best_score_)
    coefficients = np.atleast_2d(ridge.coef_)
    loo_all = ridge.cv_results_.reshape(len(rows), len(group), len(alphas))
    candidates = []
    for j, (rule_id, masses) in enumerate(group):
        alpha = float(chosen[j])
        primal = coefficients[j]
        scores = np.concatenate(
            [
                loo_all[:, j, alphas.index(alpha)],
                np.asarray(augmented[masses.imputed_rows] @ primal).ravel(),
            ]
        )
        pairs = labels[j]
        positives = sum(applies for _, applies, _ in pairs)
        candidates.append(
            Candidate(
                rule_id,
                RuleFit(
                    status="learned",
                    examples=len(pairs),
                    positives=positives,
                    alpha=alpha,
                    loo_auc=float(aucs[j]),
                ),
                [
                    Option(-math.inf, 0.0, 0.0),
                    *threshold_options(scores, masses.yes, masses.no, masses.rate),
                ],
                masses.rate,
                len(masses.imputed_rows),
                weights=primal[:-1],
                bias=float(primal[-1]),
            )
        )
    return candidates


def _loo_auc(estimator: Any, loo: Floats, y: Floats, sample_weight: Floats) -> float:
    """`RidgeCV`'s scorer: the weighted AUC of a target's LOO predictions."""
    return weighted_auc(estimator.predict(loo), y > 0, sample_weight)


def weighted_auc(scores: Floats, y: npt.NDArray[np.bool_], w: Floats) -> float:
    """ROC-AUC with example weights; ties count one half.

    What `sklearn.metrics.roc_auc_score(y, scores, sample_weight=w)` computes (the
    tests check they agree), hand-written because `RidgeCV` calls it once per rule
    and strength and it is faster: 15 us vs 1,407 us per call on 104 rows (NBA),
    22 us vs 1,473 us on 392 (ObliQA); as `RidgeCV`'s scorer, `roc_auc_score`
    made a training 0.44 s instead of 0.053 s (NBA), 2.8 s instead of 0.61 s
    (ObliQA), measured on the datasets of `benchmarks/bench_learned_prefilter.py`.
    """
    pos, neg = scores[y], scores[~y]
    pw, nw = w[y], w[~y]
    order = np.argsort(neg, kind="stable")
    neg, nw = neg[order], nw[order]
    cumulative = np.concatenate([[0.0], np.cumsum(nw)])
    below = cumulative[np.searchsorted(neg, pos, side="left")]
    tied = cumulative[np.searchsorted(neg, pos, side="right")] - below
    return float((pw * (below + 0.5 * tied)).sum() / (pw.sum() * nw.sum()))


def _model(
    settings: FitSettings,
    rulebook: Rulebook,
    data: _Collected,
    features: tuple[npt.NDArray[np.int64], Floats],
    rules: list[Candidate],
    targets: tuple[float, float, float],
) -> TrainedModel:
    """The model of the rules' candidates, thresholds at the internal target."""
    target_recall, internal_target, started = targets
    columns, idf = features
    candidates = [c for c in rules if c.options]
    hashes = {rule.rule_id: rule.content_hash() for rule in rulebook.rules}
    weights = np.zeros((len(columns), len(candidates)), dtype=np.float32)
    for j, candidate in enumerate(candidates):
        if candidate.weights is not None:
            weights[:, j] = candidate.weights
    report = FitReport(
        inputs=len(data.inputs),
        examples=sum(len(pairs) for pairs in data.labels.values()),
        ignored=data.ignored,
        skipped=sum(c.imputed for c in rules),
        target_recall=target_recall,
        internal_target=internal_target,
        expected_recall=1.0,
        expected_judged=float(len(rulebook.rules)),
        rules={c.rule_id: c.fit for c in rules},
        seconds=0.0,
    )
    offsets = np.cumsum([0, *(len(c.options) for c in candidates)], dtype=np.int64)
    model = TrainedModel(
        hashing=settings.hashing,
        columns=columns,
        idf=idf,
        rule_ids=tuple(c.rule_id for c in candidates),
        rule_hashes=tuple(hashes[c.rule_id] for c in candidates),
        weights=weights,
        bias=np.asarray([c.bias for c in candidates], dtype=np.float64),
        options=np.asarray(
            [(o.threshold, o.miss, o.skip) for c in candidates for o in c.options],
            dtype=np.float64,
        ).reshape(-1, 3),
        offsets=offsets,
        chosen=np.zeros(len(candidates), dtype=np.int64),
        yes_rate_total=sum(c.rate for c in rules if c.rate is not None),
        trained_rules=MappingProxyType(hashes),
        report=report,
    )
    model = rethresholded(model, target_recall, internal_target)
    seconds = time.perf_counter() - started
    return replace(model, report=model.report.model_copy(update={"seconds": seconds}))


def rethresholded(
    model: TrainedModel, target_recall: float, internal_target: float | None = None
) -> TrainedModel:
    """`model` with thresholds spending `1 - internal_target` of its YES verdicts.

    The misses allowed are spent where each buys the most skipped judgments (see
    `allocate`); the options do not depend on the target, so this chooses what
    training at that target would. `internal_target` None: `target_recall`.

    Raises:
        ValueError: The model keeps no YES rate (a version-1 file).
    """
    if model.yes_rate_total is None:
        msg = "this model keeps no YES rate: it cannot be re-thresholded"
        raise ValueError(msg)
    aim = target_recall if internal_target is None else internal_target
    candidates = [
        Candidate(
            rule_id,
            model.report.rules[rule_id],
            [
                Option(*row)
                for row in model.options[
                    model.offsets[j] : model.offsets[j + 1]
                ].tolist()
            ],
        )
        for j, rule_id in enumerate(model.rule_ids)
    ]
    spent = allocate(candidates, (1.0 - aim) * model.yes_rate_total)
    fits = dict(model.report.rules)
    for candidate in candidates:
        # Option 0 keeps the rule (threshold -inf), the last skips it always (+inf).
        option = candidate.options[candidate.chosen]
        finite = math.isfinite(option.threshold)
        status = (
            "no_gain" if not candidate.chosen else "learned" if finite else "skipped"
        )
        fits[candidate.rule_id] = candidate.fit.model_copy(
            update={
                "status": status,
                "threshold": option.threshold if finite else None,
                "expected_skip": option.skip,
                "expected_miss": option.miss,
            }
        )
    total = model.yes_rate_total
    report = model.report.model_copy(
        update={
            "target_recall": target_recall,
            "internal_target": aim,
            "expected_recall": 1.0 - spent / total if total else 1.0,
            "expected_judged": len(model.trained_rules)
            - sum(fit.expected_skip for fit in fits.values()),
            "rules": fits,
        }
    )
    chosen = np.asarray([c.chosen for c in candidates], dtype=np.int64)
    return replace(model, chosen=chosen, report=report)
