"""The method's baselines as LangChain retrievers, for like-for-like evaluation.

Every baseline is a `BaseRetriever`, so an evaluation harness can run TAG and each
baseline through the same `invoke` / `ainvoke` / `batch` calls:

- `NoRetrieval` (M0): nothing.
- `AllRulesRetriever` (M1): every extracted rule.
- `chunk_retriever` (M2, standard RAG): the top-k chunks of the source documents by
  embedding similarity, in Chroma; `split_into_chunks` cuts the documents the way
  the method does (500 characters, 100 overlap).
- `RuleSimilarityRetriever` (rules + similarity): the top-k rules by embedding
  similarity of name, condition and action.
- `RelevanceReranker`: the controlled baseline, TAG's pairwise setup asking whether
  a rule is relevant, with the action shown.
- `ChunkApplicabilityRetriever` (chunks + applicability): TAG's judge over chunks.
- `llm_chain_filter_retriever`: LangChain's `LLMChainFilter` over chunks, the
  ecosystem's nearest peer of pairwise LLM filtering.

Rule-level documents have the shape of `TAGRetriever`'s (`id` and
`metadata["rule_id"]` are the rule id, the content is the action; see
`rule_document`). Chunk-level documents keep their source's metadata (`source`,
`start_index` and whatever the source document carried, such as a `passage_id`), so
they map back to passages. Ranked documents carry `metadata["relevance_score"]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import chromadb
from chromadb.api.collection_configuration import HNSWConfiguration
from chromadb.config import Settings
from langchain_chroma import Chroma
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from langchain_text_splitters import RecursiveCharacterTextSplitter
from pydantic import Field, PrivateAttr, field_validator

from langchain_tag._text import digest
from langchain_tag.engine import rule_document
from langchain_tag.matching import (
    CONDITION_PROFILE,
    ApplicabilityJudge,
    RuleSchemaProfile,
    prompts,
)
from langchain_tag.matching.store import sync_documents
from langchain_tag.models import default_chat_model, with_settings
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rule, Rulebook

if TYPE_CHECKING:
    from langchain_classic.retrievers import ContextualCompressionRetriever

__all__ = [
    "CHUNK_INDEX_HNSW",
    "RELEVANCE_PROFILE",
    "AllRulesRetriever",
    "ChunkApplicabilityRetriever",
    "ChunkRetriever",
    "NoRetrieval",
    "RelevanceJudge",
    "RelevanceReranker",
    "RuleSimilarityRetriever",
    "chunk_retriever",
    "llm_chain_filter_retriever",
    "rule_similarity_text",
    "split_into_chunks",
]

_CHROMA_SCALARS = (str, int, float, bool)
_WRITE_BATCH = 512


# --- M0 and M1 ----------------------------------------------------------------------


class NoRetrieval(BaseRetriever):
    """M0: retrieves nothing, so the executor works from the input alone."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return []

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return []


class AllRulesRetriever(BaseRetriever):
    """M1: every rule of the rulebook, in rulebook order, whatever the input."""

    rulebook: Rulebook
    """The rules to return."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [rule_document(rule) for rule in self.rulebook.rules]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self._get_relevant_documents(query, run_manager=run_manager.get_sync())


# --- M2: chunks by similarity -------------------------------------------------------


def split_into_chunks(
    documents: Iterable[Document], chunk_size: int = 500, chunk_overlap: int = 100
) -> list[Document]:
    """Cut documents into overlapping character chunks, as the method's M2 does.

    Uses LangChain's `RecursiveCharacterTextSplitter` (paragraphs, then lines, then
    words). Each chunk keeps a copy of its document's metadata and gets
    `start_index`, its character offset in the document. A document without
    `metadata["source"]` gets its `id` as source, so every chunk can be traced back
    (and `TAGRetriever.from_vectorstore` can reassemble them).

    Args:
        documents: The documents to cut.
        chunk_size: Characters per chunk at most.
        chunk_overlap: Characters shared by consecutive chunks.

    Returns:
        The chunks, document by document, in text order.

    Raises:
        ValueError: A document has neither `metadata["source"]` nor an `id`.
    """
    traced = []
    for position, document in enumerate(documents):
        if "source" in document.metadata:
            traced.append(document)
        elif document.id is not None:
            metadata = {**document.metadata, "source": document.id}
            traced.append(document.model_copy(update={"metadata": metadata}))
        else:
            msg = (
                f"Document {position} has neither metadata['source'] nor an id, so "
                "its chunks could not be traced back to it. Give it one, e.g. "
                "Document(page_content=..., metadata={'source': 'path/or/name'})."
            )
            raise ValueError(msg)
    splitter = RecursiveCharacterTextSplitter(
        chunk_size=chunk_size, chunk_overlap=chunk_overlap, add_start_index=True
    )
    return splitter.split_documents(traced)


class ChunkRetriever(BaseRetriever):
    """The `k` documents of a vector store most similar to the input (standard RAG).

    Documents come back as stored, with their metadata, plus
    `metadata["relevance_score"]` (the store's relevance score in [0, 1]; cosine
    similarity, negatives as 0, for stores built by `chunk_retriever`), best first;
    equal scores in id order, so that the same documents are found whatever order
    the store keeps them in.
    Build one over Chroma with `chunk_retriever`, or pass any LangChain vector
    store that implements relevance scores.
    """

    vectorstore: VectorStore
    """The store to search."""
    k: int = Field(default=10, ge=1)
    """How many documents to return (overridable per call: `invoke(q, k=5)`)."""

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        k = kwargs.get("k", self.k)
        search = self.vectorstore.similarity_search_with_relevance_scores
        fetch = 2 * k
        while (top := _top(search(query, k=fetch), k, fetch)) is None:
            fetch *= 2
        return top

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        k = kwargs.get("k", self.k)
        search = self.vectorstore.asimilarity_search_with_relevance_scores
        fetch = 2 * k
        while (top := _top(await search(query, k=fetch), k, fetch)) is None:
            fetch *= 2
        return top


def _top(
    found: Sequence[tuple[Document, float]], k: int, fetched: int
) -> list[Document] | None:
    """The best `k` of `found`, equal scores in id order; None: fetch more first.

    Stores order equal scores arbitrarily (a corpus repeats headings and boilerplate
    chunks), so which of them make the top `k` would change between builds. When
    the `k`-th score ties with the last one fetched, the tie may go on beyond it.
    """
    if len(found) == fetched > k and found[k - 1][1] <= found[-1][1]:
        return None
    ranked = sorted(found, key=lambda pair: (-pair[1], pair[0].id or ""))
    return _scored(ranked[:k])


CHUNK_INDEX_HNSW: HNSWConfiguration = {
    # Cosine distance, so relevance scores are cosine similarities whatever the
    # embeddings' scale.
    "space": "cosine",
    # Wide candidate lists make the search near exact at corpus sizes of a few
    # thousand chunks, for little time: builds then agree on the top k (ties are
    # broken by `ChunkRetriever`).
    "ef_construction": 400,
    "ef_search": 400,
}
"""HNSW settings of the collections `chunk_retriever` creates."""


def chunk_retriever(
    chunks: Sequence[Document],
    embeddings: Embeddings,
    k: int = 10,
    *,
    client: chromadb.api.ClientAPI | None = None,
    persist_directory: str | Path | None = None,
    collection_name: str | None = None,
) -> ChunkRetriever:
    """Index chunks in a Chroma collection and retrieve the top `k` by similarity.

    The collection is made to hold exactly `chunks`: chunks already stored (same id,
    text and metadata) are not embedded again, changed ones are re-embedded, and
    stored chunks not among them are deleted, so a persistent collection can be
    reused across runs. A chunk's id is its `id`, or else a hash of its metadata and
    text. Chroma keeps no None metadata values, so those keys come back absent.

    Args:
        chunks: The documents to index as they are, typically `split_into_chunks`
            output (or passages, for a corpus that comes pre-split).
        embeddings: Embeddings for chunks and queries. Always explicit: Chroma's
            default downloads a model. Use the same model whenever a persistent
            collection is reopened.
        k: How many chunks to return.
        client: Any chromadb client (e.g. `chromadb.HttpClient(...)` for a server).
        persist_directory: A directory for an embedded persistent Chroma database.
            Without it and without `client`, the database is in memory.
        collection_name: The collection (3-512 characters of `[a-zA-Z0-9._-]`);
            default: derived from the chunks' ids and the embeddings' class, so the
            same chunks and model find their collection again.

    Returns:
        A `ChunkRetriever` over the collection.

    Raises:
        ValueError: Both `client` and `persist_directory` were given, two chunks
            share an id, or a chunk's metadata holds a value Chroma cannot store.
    """
    if client is not None and persist_directory is not None:
        msg = "Pass either client= or persist_directory=, not both."
        raise ValueError(msg)
    ids = _chunk_ids(chunks)
    for chunk in chunks:
        _check_chroma_metadata(chunk)
    if client is None:
        settings = Settings(anonymized_telemetry=False)
        client = (
            chromadb.EphemeralClient(settings=settings)
            if persist_directory is None
            else chromadb.PersistentClient(
                path=str(persist_directory), settings=settings
            )
        )
    if collection_name is None:
        # The index settings are part of the name: a collection built with other
        # settings (they only apply at creation) is not reused.
        named = [type(embeddings).__qualname__, sorted(ids), CHUNK_INDEX_HNSW]
        collection_name = f"tag-chunks-{digest(json.dumps(named))[:24]}"
    store = Chroma(
        collection_name=collection_name,
        embedding_function=embeddings,
        client=client,
        collection_configuration={"hnsw": CHUNK_INDEX_HNSW},
        relevance_score_fn=_cosine_relevance,
    )
    sync_documents(
        store,
        [
            chunk.model_copy(update={"id": i})
            for i, chunk in zip(ids, chunks, strict=True)
        ],
        unchanged=lambda chunk, text, metadata: (text, metadata) == _as_stored(chunk),
        batch_size=_WRITE_BATCH,
    )
    return ChunkRetriever(vectorstore=store, k=k)


def _cosine_relevance(distance: float) -> float:
    # Cosine similarity, clamped to LangChain's [0, 1]: float rounding gives
    # 1.0000001 for a perfect match, and opposed vectors a negative similarity.
    return min(1.0, max(0.0, 1.0 - distance))


def _as_stored(chunk: Document) -> tuple[str, dict[str, Any]]:
    """A chunk's text and metadata as Chroma gives them back (no None values)."""
    metadata = {key: v for key, v in chunk.metadata.items() if v is not None}
    return chunk.page_content, metadata


def _chunk_ids(chunks: Sequence[Document]) -> list[str]:
    seen: dict[str, int] = {}  # id: position
    for position, chunk in enumerate(chunks):
        content = [chunk.metadata, chunk.page_content]
        chunk_id = chunk.id or digest(json.dumps(content, sort_keys=True, default=str))
        if chunk_id in seen:
            msg = (
                f"Chunks {seen[chunk_id]} and {position} have the same id "
                f"{chunk_id!r} (same id, or same text and metadata); pass each chunk "
                "once, with distinct ids."
            )
            raise ValueError(msg)
        seen[chunk_id] = position
    return list(seen)


def _check_chroma_metadata(chunk: Document) -> None:
    for key, value in chunk.metadata.items():
        if not _storable(value):
            msg = (
                f"Chunk {chunk.metadata.get('source')!r} at start_index "
                f"{chunk.metadata.get('start_index')!r}: metadata[{key!r}] = "
                f"{value!r:.60} cannot be stored in Chroma (only str, int, float, "
                "bool, None, or a non-empty list of values of one of those types). "
                "Flatten it or encode it as a JSON string."
            )
            raise ValueError(msg)


def _storable(value: object) -> bool:
    if value is None or isinstance(value, _CHROMA_SCALARS):
        return True
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, _CHROMA_SCALARS) for v in value)
        and len({type(v) for v in value}) == 1
    )


def _scored(found: Iterable[tuple[Document, float]]) -> list[Document]:
    return [
        Document(
            id=document.id,
            page_content=document.page_content,
            metadata={**document.metadata, "relevance_score": score},
        )
        for document, score in found
    ]


# --- Rules + similarity -------------------------------------------------------------


def rule_similarity_text(rule: Rule) -> str:
    """What the rules + similarity baseline embeds: name, condition and action.

    Unlike TAG's judge and its similarity prefilter, this baseline compares the
    input with the action too, as the method's description of it says.
    """
    return f"{rule.name}\n{rule.condition}\n{rule.action}"


class RuleSimilarityRetriever(BaseRetriever):
    """Rules + similarity: the `k` rules most similar to the input.

    Each rule's name, condition and action are embedded once, when the retriever
    is built; an input costs one query embedding. Documents have `TAGRetriever`'s
    shape plus `metadata["relevance_score"]`, the cosine similarity, best first.
    For the method's comparison set `k` to TAG's mean number of picks on the same
    data (the paper's runs picked about 14 to 33 rules).
    """

    rulebook: Rulebook
    """The rules to rank."""
    embeddings: Embeddings
    """Embeddings for rules and inputs."""
    k: int = Field(default=20, ge=1)
    """How many rules to return (overridable per call: `invoke(q, k=5)`)."""

    _store: InMemoryVectorStore = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        self._store = InMemoryVectorStore(self.embeddings)
        rules = self.rulebook.rules
        if rules:
            self._store.add_texts(
                [rule_similarity_text(rule) for rule in rules],
                ids=[rule.rule_id for rule in rules],
            )

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        search = self._store.similarity_search_with_score
        return self._as_rules(search(query, k=kwargs.get("k", self.k)))

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        search = self._store.asimilarity_search_with_score
        return self._as_rules(await search(query, k=kwargs.get("k", self.k)))

    def _as_rules(self, found: Iterable[tuple[Document, float]]) -> list[Document]:
        rules = self.rulebook.rules
        return [
            rule_document(
                rules[self.rulebook.position(str(hit.id))], relevance_score=score
            )
            for hit, score in found
        ]


# --- The relevance reranker (the controlled baseline) ------------------------------

# Only the question differs from TAG's judge; the rule fields stay TAG's, so the
# validator that keeps the action out still holds for the copy.
RELEVANCE_PROFILE = CONDITION_PROFILE.model_copy(
    update={"name": "relevance", "system_prompt": prompts.RELEVANCE_SYSTEM}
)
"""The relevance question, with TAG's rule fields and answer format. The action is
not a profile field (no profile may show it); `RelevanceJudge` adds it."""


class RelevanceJudge(ApplicabilityJudge):
    """Baseline only: asks whether a rule is relevant, showing its action.

    The method's controlled comparison for the judge: the same pairwise calls,
    retries, parsing, caching, failure policy and concurrency limit as
    `ApplicabilityJudge`, but the question is relevance ("plausibly useful") and
    the rule block ends with the rule's `action`, which TAG's judge never sees.
    Verdicts are cached under their own keys (the profile and the action differ).
    Never use it as TAG's matcher.
    """

    profile: RuleSchemaProfile = RELEVANCE_PROFILE
    """The relevance profile; the action is added whatever the profile."""
    log_source: str = "relevance"
    """Its verdicts in a verdict log are marked, never trained on."""
    question: ClassVar[str] = prompts.RELEVANCE_QUESTION

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The profile's fields of `rule`, then its action."""
        return [*self.profile.judged_fields(rule), ("action", rule.action)]


def _relevance_judge_from_llm(data: dict[str, Any]) -> ApplicabilityJudge:
    return RelevanceJudge(llm=data.get("llm") or default_chat_model())


class RelevanceReranker(TAGRetriever):
    """The relevance reranker: TAG's pairwise setup with a relevance question.

    One call per (input, rule), judged by a `RelevanceJudge` (which sees the
    action), returning the rules judged relevant with `TAGRetriever`'s documents,
    knobs (`k`, `score_threshold`, `max_concurrency`, `filter`, `prefilter`) and
    `match()`. With `logprobs=True` on the judge the rules are ranked by P(YES).
    """

    judge: ApplicabilityJudge = Field(default_factory=_relevance_judge_from_llm)
    """A `RelevanceJudge`; built from `llm` when not given."""

    @field_validator("judge")
    @classmethod
    def _relevance_only(cls, judge: ApplicabilityJudge) -> ApplicabilityJudge:
        if not isinstance(judge, RelevanceJudge):
            msg = (
                f"RelevanceReranker needs a RelevanceJudge, got "
                f"{type(judge).__name__}; for applicability use TAGRetriever."
            )
            raise TypeError(msg)
        return judge


# --- Chunks + applicability ---------------------------------------------------------


def _chunk_rule(position: int, chunk: Document) -> Rule:
    if not chunk.page_content.strip():
        msg = (
            f"Chunk {position} (source {chunk.metadata.get('source')!r}) is blank; "
            "there is nothing to judge. Drop blank chunks first."
        )
        raise ValueError(msg)
    # The passage is the condition the judge tests the input against; the action
    # is required by Rule but never shown to the judge.
    return Rule(
        rule_id=f"chunk-{position}",
        name=f"Passage {position + 1}",
        condition=chunk.page_content,
        action=chunk.page_content,
    )


class ChunkApplicabilityRetriever(BaseRetriever):
    """Chunks + applicability: TAG's judge over chunks instead of rules.

    Each chunk becomes a pseudo-rule whose condition is the chunk's text, and a
    `TAGRetriever` judges them, one call per chunk: does the input fall under what
    the passage regulates? The chunks judged applicable come back as they were
    (same id, content and metadata) plus `metadata["relevance_score"]`, ordered
    like TAG's results (score, then chunk order).
    """

    chunks: list[Document]
    """The chunks to judge (e.g. `split_into_chunks` output)."""
    llm: BaseChatModel | None = Field(default=None, exclude=True)
    """The judging chat model, when no `judge` is given (default: from the
    environment, see `default_chat_model`)."""
    judge: ApplicabilityJudge | None = None
    """The judge; TAG's `ApplicabilityJudge` built from `llm` when not given."""
    k: int | None = Field(default=None, ge=0)
    """Return at most this many chunks; None returns every applicable one."""
    max_concurrency: int | None = Field(default=8, ge=1)
    """In-flight judgments at most, across concurrent calls of this retriever."""

    _tag: TAGRetriever = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        rules = [_chunk_rule(i, chunk) for i, chunk in enumerate(self.chunks)]
        # TAGRetriever checks the choice: llm= or judge=, not both.
        chosen = {
            name: value
            for name, value in (("llm", self.llm), ("judge", self.judge))
            if value is not None
        }
        self._tag = TAGRetriever(
            rulebook=Rulebook(rules=rules),
            k=self.k,
            max_concurrency=self.max_concurrency,
            **chosen,
        )

    @property
    def tag_retriever(self) -> TAGRetriever:
        """The `TAGRetriever` over the chunks' pseudo-rules (ids `chunk-<n>`)."""
        return self._tag

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return self._as_chunks(self._tag.invoke(query, config, **kwargs))

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return self._as_chunks(await self._tag.ainvoke(query, config, **kwargs))

    def _as_chunks(self, matched: list[Document]) -> list[Document]:
        position = self._tag.rulebook.position
        return _scored(
            (self.chunks[position(str(doc.id))], doc.metadata["relevance_score"])
            for doc in matched
        )


# --- LangChain's LLMChainFilter -----------------------------------------------------


def llm_chain_filter_retriever(
    base_retriever: BaseRetriever,
    llm: BaseChatModel,
    *,
    max_concurrency: int | None = 8,
) -> ContextualCompressionRetriever:
    """LangChain's `LLMChainFilter` over a base retriever's documents.

    The ecosystem's nearest peer of TAG's pairwise judging: LangChain's own
    YES/NO relevance prompt, one call per retrieved document, dropping those
    answered NO. The model runs at temperature 0 (on a copy), as TAG's judge does,
    for a like-for-like comparison; callbacks reach every call through the
    compression retriever's run.

    Args:
        base_retriever: Supplies the candidates, e.g. `chunk_retriever(...)`.
        llm: The filtering chat model.
        max_concurrency: Filter calls in flight at most per retrieval.

    Returns:
        A `ContextualCompressionRetriever` (from `langchain-classic`).
    """
    # Imported here: langchain-classic's retrievers take over a second to import.
    from langchain_classic.retrievers import (  # noqa: PLC0415
        ContextualCompressionRetriever,
    )
    from langchain_classic.retrievers.document_compressors import (  # noqa: PLC0415
        LLMChainFilter,
    )

    model, _ = with_settings(llm, temperature=0.0)
    chain = LLMChainFilter.from_llm(model).llm_chain
    # The filter batches its calls with the config it is given, which sets no
    # limit; one bound onto the chain caps them.
    compressor = LLMChainFilter(
        llm_chain=chain.with_config(max_concurrency=max_concurrency)
    )
    return ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=base_retriever
    )
