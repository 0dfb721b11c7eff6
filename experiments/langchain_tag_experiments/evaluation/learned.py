"""The learned prefilter evaluated honestly: k-fold over a task's inputs.

A `LearnedPrefilter` learns from past verdicts, so scoring it on the inputs it was
trained on would flatter it. Here the inputs are split into folds (`kfold_splits`:
5 folds, shuffled once, seed 0); each fold's inputs are selected for by a
prefilter trained on the other folds' verdicts only.

- `KFoldPrefilter`: one retriever over all the inputs, which hands each input to
  its own fold's trained prefilter (what `TAGRetriever(prefilter=...)` runs for the
  `tag+learned` and `oracle+learned` methods).
- `fit_kfold`: trains those prefilters from verdicts keyed by input text (the
  oracle's: the gold labels).
- `LearnedScorer`: the held-out margins as scores, for the mismatch diagnostic's
  "learned from verdicts" row.

`benchmarks/bench_learned_prefilter.py` uses the same split.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from pydantic import ConfigDict

from langchain_tag.learning.learned_prefilter import LearnedPrefilter
from langchain_tag.rules import Rulebook

__all__ = [
    "KFOLDS",
    "KFoldPrefilter",
    "LearnedScorer",
    "fit_kfold",
    "kfold_splits",
    "verdict_examples",
]

KFOLDS = 5
"""Folds of the inputs: each is selected for by a prefilter trained on the rest."""


def kfold_splits(
    n: int, folds: int = KFOLDS, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """(train, test) indices of each fold of `n` inputs, shuffled once by `seed`.

    Deterministic: the same `n`, `folds` and `seed` give the same split.

    Raises:
        ValueError: Fewer than two folds, or fewer inputs than folds.
    """
    if folds < 2 or n < folds:  # noqa: PLR2004 - k-fold needs two folds
        msg = f"k-fold needs at least 2 folds and as many inputs: {n} for {folds}"
        raise ValueError(msg)
    order = np.random.default_rng(seed).permutation(n)
    parts = [part.tolist() for part in np.array_split(order, folds)]
    return [
        ([i for j, part in enumerate(parts) if j != k for i in part], test)
        for k, test in enumerate(parts)
    ]


def verdict_examples(
    texts: Sequence[str],
    verdicts: Sequence[frozenset[str]],
    rule_ids: Sequence[str],
    inputs: Sequence[int],
) -> Iterator[tuple[str, str, bool]]:
    """A judge's verdict on every rule for each of `inputs`.

    Args:
        texts: The input texts.
        verdicts: For each input, the rule ids judged to apply (all others: NO).
        rule_ids: Every rule judged.
        inputs: Which inputs (indices into `texts`).
    """
    for i in inputs:
        for rule_id in rule_ids:
            yield texts[i], rule_id, rule_id in verdicts[i]


def fit_kfold(
    rulebook: Rulebook,
    verdicts: Mapping[str, frozenset[str]],
    *,
    target_recall: float = 0.95,
    folds: int = KFOLDS,
) -> KFoldPrefilter:
    """Train one prefilter per fold of the inputs on the other folds' verdicts.

    Args:
        rulebook: The rules judged.
        verdicts: Input text -> the rule ids judged to apply to it (each input
            judged against every rule); the folds split these texts.
        target_recall: Each prefilter's `target_recall`.
        folds: How many folds; as many as inputs when there are fewer (a run
            limited to a few inputs).

    Raises:
        ValueError: Fewer than two inputs.
    """
    texts = list(verdicts)
    labels = [verdicts[text] for text in texts]
    rule_ids = [rule.rule_id for rule in rulebook.rules]
    routes: dict[str, LearnedPrefilter] = {}
    for train, test in kfold_splits(len(texts), min(folds, len(texts))):
        prefilter = LearnedPrefilter(rulebook, target_recall=target_recall)
        prefilter.fit(verdict_examples(texts, labels, rule_ids, train))
        routes |= {texts[i]: prefilter for i in test}
    return KFoldPrefilter(rulebook=rulebook, routes=routes)


class KFoldPrefilter(BaseRetriever):
    """Each input's rules selected by its fold's prefilter (trained without it).

    A retriever like `LearnedPrefilter`, for `TAGRetriever(prefilter=...)`: the
    query must be one of the inputs the folds split (`routes`), else it raises.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rulebook: Rulebook
    routes: dict[str, LearnedPrefilter]
    """Input text -> the prefilter of its fold."""

    def prefilter_for(self, text: str) -> LearnedPrefilter:
        """The prefilter trained without `text`.

        Raises:
            KeyError: `text` is not one of the folds' inputs.
        """
        try:
            return self.routes[text]
        except KeyError:
            msg = (
                "the k-fold prefilter was trained for a fixed set of inputs; this "
                f"one is not among them: {text[:80]!r}"
            )
            raise KeyError(msg) from None

    def margins(self, text: str) -> dict[str, float]:
        """The held-out margin of every rule: always judged +inf, skipped -inf.

        A rule the fold's model has no classifier for is always judged (+inf); one
        it skips outright has margin -inf; the others score minus threshold.
        """
        known = self.prefilter_for(text).margins(text)
        return {
            rule.rule_id: known.get(rule.rule_id, float("inf"))
            for rule in self.rulebook.rules
        }

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return self.prefilter_for(query).invoke(query, config)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return await self.prefilter_for(query).ainvoke(query, config)


class LearnedScorer:
    """The held-out margins of a `KFoldPrefilter` as a `SimilarityScorer`.

    Ranks every rule for an input by its fold's margin (ties in rulebook order),
    so the diagnostic's recall@k and N are a learned prefilter's keeping k or N.
    """

    def __init__(self, prefilter: KFoldPrefilter) -> None:
        """Score with `prefilter`'s folds."""
        self.prefilter = prefilter

    def scores(self, query: str) -> dict[str, float]:
        """Every rule's held-out margin, in rulebook order."""
        return self.prefilter.margins(query)

    def rank(self, query: str) -> list[str]:
        """Every rule id, highest margin first."""
        scores = self.scores(query)
        return sorted(scores, key=lambda rule_id: -scores[rule_id])

    def __repr__(self) -> str:  # noqa: D105
        return f"LearnedScorer({len(self.prefilter.routes)} inputs)"
