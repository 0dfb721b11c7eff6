"""The mismatch diagnostic: how well does similarity predict applicability?

TAG's premise is that the rules an input needs are not the ones most similar to it.
On a labelled set (queries with their gold units) this measures how far a
similarity scorer gets anyway: ROC-AUC of its scores as a classifier of gold
(query, unit) pairs, recall of its top k, and the prefilter size N that keeps 95%
and 99% of the gold pairs. An AUC near 0.5 means similarity says nothing about
applicability; a small N95 means a similarity prefilter in front of the judge is
cheap to make safe.

`diagnose` runs it for the prefilters' scorers on a task's inputs and gold rules,
and, as the `learned` scorer ("learned from verdicts"), for a `LearnedPrefilter`
trained k-fold on the gold labels: each input's rules ranked by the margins of the
prefilter trained on the other folds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from langchain_tag.matching import prefilters
from langchain_tag.matching.prefilters import SimilarityScorer, rank_by_score
from langchain_tag_experiments.evaluation.embedding_cache import shared_embeddings
from langchain_tag_experiments.evaluation.learned import LearnedScorer, fit_kfold
from langchain_tag_experiments.evaluation.methods import (
    PREFILTER_KINDS,
    Scorer,
    prefilter_sizes,
)
from langchain_tag_experiments.evaluation.metrics import (
    mean,
    n_for_recall,
    recall_at_k,
    roc_auc,
)
from langchain_tag_experiments.evaluation.tasks import EvalTask, TaskName

__all__ = [
    "DIAGNOSTIC_KS",
    "DiagnosticResult",
    "MismatchReport",
    "diagnose",
    "mismatch_diagnostic",
]


class MismatchReport(BaseModel):
    """Similarity-vs-applicability figures of one scorer on one labelled set."""

    model_config = ConfigDict(frozen=True)

    n_queries: int
    units_total: int = Field(description="Units scored per query.")
    gold_pairs: int = Field(description="Gold (query, unit) pairs.")
    roc_auc_pooled: float | None = Field(
        description="AUC over all (query, unit) pairs pooled, raw scores compared "
        "across queries."
    )
    roc_auc_mean_per_query: float | None = Field(
        description="Mean over queries of each query's AUC over its units (queries "
        "whose gold is every unit have none and are left out)."
    )
    recall_at_k: dict[int, float] = Field(
        description="Mean over queries of recall of the top k."
    )
    n_for_95_recall: int | None = Field(
        description="Smallest top-N keeping 95% of gold pairs; None if unreachable."
    )
    n_for_99_recall: int | None = Field(
        description="Smallest top-N keeping 99% of gold pairs; None if unreachable."
    )


def mismatch_diagnostic(
    queries: Sequence[tuple[str, str]],
    gold: Mapping[str, set[str]],
    scorer: SimilarityScorer,
    ks: Sequence[int] = (5, 10, 20, 40),
) -> MismatchReport:
    """Measure how well `scorer`'s similarity predicts the gold units of queries.

    Each query's units are ranked as `SimilarityPrefilter` ranks them (by score,
    ties in item order), so recall@k and N are what a prefilter keeping k or N
    items would keep.

    Args:
        queries: `(query_id, text)` pairs.
        gold: Query id -> its gold unit ids (at least one each).
        scorer: Scores every unit for a query (see `langchain_tag.matching.prefilters`).
        ks: The cut-offs for recall@k.

    Raises:
        ValueError: No queries, a query without gold units, a gold unit the scorer
            does not score, or queries scored over different numbers of units.
    """
    if not queries:
        msg = "the mismatch diagnostic needs at least one query"
        raise ValueError(msg)
    pooled_scores: list[float] = []
    pooled_labels: list[bool] = []
    per_query_auc: list[float] = []
    recalls: dict[int, list[float]] = {k: [] for k in ks}
    rankings: list[tuple[list[str], set[str]]] = []
    units_total: int | None = None
    for query_id, text in queries:
        wanted = gold.get(query_id)
        if not wanted:
            msg = f"query {query_id!r} has no gold units; give each query at least one"
            raise ValueError(msg)
        scores = scorer.scores(text)
        unknown = sorted(wanted - scores.keys())
        if unknown:
            msg = (
                f"query {query_id!r}: gold units {unknown[:5]} are not among the "
                f"{len(scores)} units the scorer scores; score the same units the "
                "gold refers to"
            )
            raise ValueError(msg)
        if units_total is not None and len(scores) != units_total:
            msg = (
                f"query {query_id!r} was scored over {len(scores)} units, earlier "
                f"queries over {units_total}; the scorer must score every unit"
            )
            raise ValueError(msg)
        units_total = len(scores)
        labels = [unit in wanted for unit in scores]
        pooled_scores += scores.values()
        pooled_labels += labels
        auc = roc_auc(list(scores.values()), labels)
        if auc is not None:
            per_query_auc.append(auc)
        ranked = rank_by_score(scores)
        rankings.append((ranked, wanted))
        for k in ks:
            recalls[k].append(recall_at_k(ranked, wanted, k))
    return MismatchReport(
        n_queries=len(queries),
        units_total=units_total or 0,
        gold_pairs=sum(pooled_labels),
        roc_auc_pooled=roc_auc(pooled_scores, pooled_labels),
        roc_auc_mean_per_query=mean(per_query_auc),
        recall_at_k={k: statistics.fmean(values) for k, values in recalls.items()},
        n_for_95_recall=n_for_recall(rankings, 0.95),
        n_for_99_recall=n_for_recall(rankings, 0.99),
    )


class DiagnosticResult(BaseModel):
    """How well one similarity scorer predicts the gold rules of a task's inputs."""

    task: TaskName
    scorer: Scorer
    """A similarity scorer, or `learned`: the learned prefilter's held-out margins."""
    report: MismatchReport


DIAGNOSTIC_KS: Mapping[TaskName, tuple[int, ...]] = {
    "nba": (5, 10, 20, 40),
    "obliqa": (10, 25, 50, 100),
    "humaneval": (10, 20, 40),
}
"""The recall@k columns per task; a custom task's are its prefilter sizes."""


def diagnose(
    task: EvalTask,
    embeddings: Embeddings | None = None,
    scorers: Iterable[Scorer] = PREFILTER_KINDS,
) -> list[DiagnosticResult]:
    """The mismatch diagnostic of the prefilters' scorers on the task's gold labels.

    For each scorer (dense, BM25, hybrid, as the prefilters rank rules): ROC-AUC of
    similarity as a predictor of gold (input, rule) pairs, recall of the top k, and
    the N a prefilter needs to keep 95% and 99% of the gold pairs. With `learned`
    among `scorers`, the same for a `LearnedPrefilter` trained k-fold on the gold
    labels (`fit_kfold`), each input's rules ranked by its fold's margins. Empty
    for a task without a rulebook or gold rule labels.
    """
    gold = task.gold_rules()
    if task.rulebook is None or gold is None:
        return []
    items = prefilters.rule_items(task.rulebook)
    wanted_kinds = set(scorers)
    bm25 = prefilters.BM25Scorer(items)
    built: dict[Scorer, SimilarityScorer] = {"bm25": bm25}
    if wanted_kinds & {"dense", "hybrid"}:
        dense = prefilters.DenseScorer(items, shared_embeddings(embeddings))
        built |= {"dense": dense, "hybrid": prefilters.HybridScorer(dense, bm25)}
    if len(task.items) < 2:  # noqa: PLR2004 - k-fold needs a fold to train on
        wanted_kinds.discard("learned")
    if "learned" in wanted_kinds:
        built["learned"] = LearnedScorer(
            fit_kfold(task.rulebook, task.oracle_gold() or {})
        )
    order: tuple[Scorer, ...] = (*PREFILTER_KINDS, "learned")
    queries = [(item.id, item.text) for item in task.items if gold[item.id]]
    wanted = {item_id: set(rule_ids) for item_id, rule_ids in gold.items()}
    return [
        DiagnosticResult(
            task=task.name,
            scorer=kind,
            report=mismatch_diagnostic(
                queries,
                wanted,
                built[kind],
                DIAGNOSTIC_KS.get(task.name)
                or prefilter_sizes(task.name, len(task.rulebook.rules)),
            ),
        )
        for kind in order
        if kind in wanted_kinds
    ]
