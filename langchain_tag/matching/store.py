"""A persistent index of a rulebook's rules in Chroma, for similarity prefiltering.

TAG judges every candidate rule with one LLM call. For large rulebooks a cheap
similarity shortlist in front of the judge keeps the cost bounded: `RuleStore` keeps
the rules of a rulebook embedded in a Chroma collection, re-embedding only rules
that changed, and `RuleStore.as_prefilter()` returns a retriever that plugs into
`TAGRetriever(prefilter=...)`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import chromadb
from chromadb.config import Settings
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever

from langchain_tag._text import batches
from langchain_tag.rules import Rule, Rulebook, rule_text

__all__ = [
    "RuleStore",
    "SyncReport",
    "sync_documents",
]

DEFAULT_PERSIST_DIRECTORY = Path(".langchain-tag") / "chroma"
"""Where the embedded Chroma database lives when neither a directory nor a client
is given (relative to the working directory)."""

TAG_KEY_PREFIX = "tag:"
"""Metadata key prefix of the per-tag booleans (`{"tag:imports": True}`)."""
USER_KEY_PREFIX = "meta:"
"""Metadata key prefix of the rule's own scalar `Rule.metadata` values."""

_SCALARS = (str, int, float, bool)


class SyncReport(NamedTuple):
    """What `RuleStore.sync` changed in the collection."""

    added: int
    """Rules new to the collection (embedded)."""
    updated: int
    """Rules whose content changed (re-embedded)."""
    removed: int
    """Rules no longer in the rulebook (deleted)."""
    unchanged: int
    """Rules already stored with the same content (not embedded)."""


def rule_metadata(rule: Rule, rulebook: Rulebook | None = None) -> dict[str, Any]:
    """The Chroma metadata stored with a rule.

    Chroma metadata values must be str, int, float or bool, so lists are joined,
    each tag also gets a boolean `tag:<tag>` key for `where` filters, and missing
    values are left out rather than stored as None.

    Args:
        rule: The rule.
        rulebook: Its rulebook, for rulebook-level information (domain).

    Returns:
        A flat metadata dict.
    """
    metadata: dict[str, Any] = {
        "rule_id": rule.rule_id,
        "name": rule.name,
        "tags": ",".join(rule.tags),
        "content_hash": rule.content_hash(),
    }
    for tag in rule.tags:
        metadata[TAG_KEY_PREFIX + tag] = True
    if rule.source_document_id is not None:
        metadata["source_document_id"] = rule.source_document_id
    if rule.lineage.normative_type is not None:
        metadata["normative_type"] = rule.lineage.normative_type
    if rulebook is not None and rulebook.domain:
        metadata["domain"] = rulebook.domain
    # Free-form user metadata is filterable too, where Chroma can hold the value;
    # the prefix keeps user keys from shadowing the ones above.
    for key, value in rule.metadata.items():
        if isinstance(value, _SCALARS):
            metadata[USER_KEY_PREFIX + key] = value
    # One hash of everything written, so `sync` compares records without relying
    # on Chroma returning every value (floats included) exactly as stored.
    record = json.dumps({"text": rule_text(rule), "metadata": metadata}, sort_keys=True)
    metadata["record_hash"] = hashlib.sha256(record.encode("utf-8")).hexdigest()
    return metadata


class RuleStore:
    """The rules of a rulebook, embedded and persisted in a Chroma collection.

    One document per rule: `id` is the rule id, the text is the rule's name and
    condition (and tags, see `rule_text`), and the metadata carries `rule_id`,
    `name`, `tags` (comma-joined), one `tag:<tag>: True` key per tag,
    `source_document_id`, the rule's `content_hash`, the rulebook's `domain` and a
    `record_hash` of all of it, which `sync` compares.

    Example:
        ```python
        store = RuleStore(persist_directory="rules-db")
        store.sync(Rulebook.load("pep8.rulebook.json"))
        retriever = TAGRetriever.from_rulebook(
            "pep8.rulebook.json", llm=llm, prefilter=store.as_prefilter(k=20)
        )
        ```

    Args:
        embedding: Embeddings for rules and queries; default `LocalMiniLMEmbeddings`
            (offline, needs the `local` extra). Use the same model every time a
            collection is opened: stored vectors are not re-embedded when it changes.
        collection_name: The Chroma collection (3-512 characters of
            `[a-zA-Z0-9._-]`).
        persist_directory: Directory of an embedded Chroma database; the default
            when no `client` is given is `.langchain-tag/chroma`.
        client: Any chromadb client instead (e.g. `chromadb.HttpClient(...)` for a
            Chroma server, or an `EphemeralClient` for tests).
        batch_size: Rules embedded and written per request during `sync`.

    Raises:
        ValueError: Both `persist_directory` and `client` were given.
    """

    def __init__(
        self,
        embedding: Embeddings | None = None,
        *,
        collection_name: str = "tag_rules",
        persist_directory: str | Path | None = None,
        client: chromadb.api.ClientAPI | None = None,
        batch_size: int = 256,
    ) -> None:
        """Open (or create) the collection."""
        if persist_directory is not None and client is not None:
            msg = "Pass either persist_directory= or client=, not both."
            raise ValueError(msg)
        if batch_size < 1:
            msg = f"batch_size must be at least 1, got {batch_size}"
            raise ValueError(msg)
        if embedding is None:
            # Imported here: sentence-transformers is an optional, heavy dependency.
            from langchain_tag.embeddings import (  # noqa: PLC0415
                LocalMiniLMEmbeddings,
            )

            embedding = LocalMiniLMEmbeddings()
        if client is None:
            directory = Path(persist_directory or DEFAULT_PERSIST_DIRECTORY)
            directory.mkdir(parents=True, exist_ok=True)
            client = chromadb.PersistentClient(
                path=str(directory), settings=Settings(anonymized_telemetry=False)
            )
        self.embedding = embedding
        self.collection_name = collection_name
        self.client = client
        self.batch_size = batch_size
        # Cosine distance makes scores comparable across embedding models, whether
        # or not they return unit vectors (it only applies to a new collection).
        self.vectorstore = Chroma(
            collection_name=collection_name,
            embedding_function=embedding,
            client=client,
            collection_configuration={"hnsw": {"space": "cosine"}},
        )

    def __repr__(self) -> str:
        """Name the collection, not the client internals."""
        return f"RuleStore(collection_name={self.collection_name!r})"

    # -- indexing ---------------------------------------------------------------------

    def sync(self, rulebook: Rulebook) -> SyncReport:
        """Make the collection hold exactly the rules of `rulebook`.

        Idempotent: a rule whose stored record (its content hash, rulebook-level
        metadata and embedded text, summed up in `record_hash`) is unchanged is
        neither embedded nor written, so syncing the same rulebook again costs one
        metadata read. Changed rules are re-embedded, new ones added, and rules
        missing from the rulebook deleted.

        Args:
            rulebook: The rules to index.

        Returns:
            How many rules were added, updated, removed and left unchanged.
        """
        # The record hash covers the rule's content hash and also the rulebook-level
        # info (domain) and the embedded text's layout.
        records = [
            Document(
                page_content=rule_text(rule),
                metadata=rule_metadata(rule, rulebook),
                id=rule.rule_id,
            )
            for rule in rulebook.rules
        ]
        return sync_documents(
            self.vectorstore,
            records,
            unchanged=lambda record, _, metadata: (
                metadata.get("record_hash") == record.metadata["record_hash"]
            ),
            batch_size=self.batch_size,
        )

    # -- reading ----------------------------------------------------------------------

    def get_rule_ids(self, where: dict[str, Any] | None = None) -> list[str]:
        """Ids of the stored rules, optionally those matching a Chroma `where` filter.

        Args:
            where: A Chroma metadata filter, e.g. `{"tag:imports": True}` or
                `{"$and": [{"tag:comparisons": True}, {"source_document_id": "x"}]}`.

        Returns:
            The matching rule ids, sorted.
        """
        # Chroma rejects an empty filter; an empty dict means "no filter" here.
        stored = self.vectorstore.get(where=where or None, include=[])
        return sorted(stored["ids"])

    def count(self) -> int:
        """Number of rules stored."""
        return len(self.vectorstore.get(include=[])["ids"])

    def as_prefilter(
        self, k: int = 20, where: dict[str, Any] | None = None
    ) -> BaseRetriever:
        """A retriever of the `k` rules most similar to the input.

        Its documents carry the rule id as `id` and `metadata["rule_id"]`, so it can
        be passed as `TAGRetriever(prefilter=...)` to shortlist the rules judged.
        Keep `k` generous: a rule the prefilter drops is never judged.

        Args:
            k: How many rules to return at most.
            where: A Chroma metadata filter restricting the rules searched.

        Returns:
            A LangChain retriever over this store.

        Raises:
            ValueError: `k` is less than 1.
        """
        if k < 1:
            msg = f"k must be at least 1, got {k}"
            raise ValueError(msg)
        search_kwargs: dict[str, Any] = {"k": k}
        if where:
            search_kwargs["filter"] = where
        return self.vectorstore.as_retriever(search_kwargs=search_kwargs)


def sync_documents(
    vectorstore: Chroma,
    documents: Sequence[Document],
    *,
    unchanged: Callable[[Document, str, dict[str, Any]], bool],
    batch_size: int,
) -> SyncReport:
    """Make a Chroma collection hold exactly `documents` (each with an `id`).

    Documents whose stored record is `unchanged(document, stored_text,
    stored_metadata)` are neither embedded nor written; changed ones are deleted and
    added again (Chroma's update merges metadata, which would keep stale keys), new
    ones added, and stored records not among `documents` deleted. Ours rather than
    `langchain_core.indexing.index`: the collection itself is the record, so a
    persistent or server collection needs no separate record manager database.
    """
    found = vectorstore.get(include=["documents", "metadatas"])
    stored = {
        record_id: (text or "", dict(metadata or {}))
        for record_id, text, metadata in zip(
            found["ids"], found["documents"], found["metadatas"], strict=True
        )
    }
    wanted = {str(document.id) for document in documents}
    added = [d for d in documents if d.id not in stored]
    updated = [
        d for d in documents if d.id in stored and not unchanged(d, *stored[str(d.id)])
    ]
    removed = [record_id for record_id in stored if record_id not in wanted]
    for batch in batches([*removed, *(str(d.id) for d in updated)], batch_size):
        vectorstore.delete(ids=list(batch))
    for batch in batches([*added, *updated], batch_size):
        vectorstore.add_documents(list(batch), ids=[str(d.id) for d in batch])
    return SyncReport(
        added=len(added),
        updated=len(updated),
        removed=len(removed),
        unchanged=len(documents) - len(added) - len(updated),
    )
